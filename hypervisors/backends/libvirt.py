"""The libvirt/KVM backend: any URI libvirt accepts (`qemu+ssh://root@node-01/system`,
`qemu+tls://...`, `qemu:///system`, the test driver's `test+unix:///default?socket=...`).

Domains are read from and written to libvirt's XML (the stdlib's ElementTree, parsed through
defusedxml since the text comes over the network). vGPUs are libvirt node devices: a GPU's
`mdev_types` capability lists its types, a `mdev` child device is one instance. On Ampere and
newer GPUs in the mdev layout the types hang on the GPU's SR-IOV virtual functions, which
libvirt links to their physical function: every count is reported against the physical GPU.

Creating and removing instances goes through libvirt's node-device API where the host's libvirt
can (mdevctl behind it); libvirt's test driver cannot (it creates only fibre-channel vHBAs, and
its destroy of an mdev reports success without removing it), and no libvirt writes the SR-IOV
layout of vGPU 17+. There the `DeviceManager` given at open (the host agent's device action)
does it, and its view of the host's types and instances is the one reported.

Guest CPU and memory (`guest_counters`) come from the host, with no agent in the guest: each
vCPU's run time, the time it waited for a host CPU where the host's kernel counts it, and the
guest's memory use as its virtio balloon driver reports it. A guest without the driver, or whose
`<memballoon>` has no `<stats period='...'/>` (QEMU then asks the guest nothing), reports no use.

Credentials come by reference (`secret_ref`, a name in HYPERVISOR_SECRETS_DIR): an SSH private
key for +ssh URIs, a folder of TLS material for +tls, otherwise a password file answered through
libvirt's authentication callback. Secret contents are never logged nor put in a message.
"""

from __future__ import annotations

import contextlib
import io
import logging
import time
import uuid as uuidlib
import xml.etree.ElementTree as ET  # noqa: S405 - building and writing only; parsing goes through defusedxml
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import parse_qsl, urlencode, urlsplit

import libvirt
from defusedxml.ElementTree import fromstring as parse_xml
from defusedxml.ElementTree import iterparse

from fleet.pci import InvalidPciBusId, normalize_pci_bus_id
from hypervisors.backends.base import (
    Backend,
    ConnectionCheck,
    DeviceBusy,
    DeviceKind,
    DeviceManager,
    Domain,
    DomainNotFound,
    DomainSpec,
    GuestCounters,
    HypervisorError,
    NoInstanceAvailable,
    PowerState,
    ShutdownTimeout,
    Unreachable,
    VgpuDevice,
    VgpuType,
)
from hypervisors.backends.credentials import read_password, secret_path
from hypervisors.backends.credentials import shown as _shown

log = logging.getLogger(__name__)

NVIDIA_VENDOR_ID = 0x10DE
#: How often shutdown() looks whether the guest has powered off.
SHUTDOWN_POLL_S = 0.25
SSH_TRANSPORTS = ("ssh", "libssh", "libssh2")

NO_DEVICE_ACTION = (
    "libvirt on {host} cannot create or remove vGPU devices (its node-device API does not support it "
    "here). Configure the host agent's device action for this host, so the dashboard creates and "
    "removes vGPUs through the agent."
)

_STATES = {
    libvirt.VIR_DOMAIN_RUNNING: PowerState.RUNNING,
    libvirt.VIR_DOMAIN_SHUTOFF: PowerState.SHUT_OFF,
    libvirt.VIR_DOMAIN_PAUSED: PowerState.PAUSED,
}

# A link that broke or was never made: the admin must look at the network, the daemon or the
# credentials, not at the domain.
_UNREACHABLE_CODES = {
    libvirt.VIR_ERR_NO_CONNECT,
    libvirt.VIR_ERR_INVALID_CONN,
    libvirt.VIR_ERR_AUTH_FAILED,
    libvirt.VIR_ERR_AUTH_CANCELLED,
    libvirt.VIR_ERR_AUTH_UNAVAILABLE,
    libvirt.VIR_ERR_RPC,
}
_UNREACHABLE_SOURCES = {libvirt.VIR_FROM_RPC, libvirt.VIR_FROM_REMOTE, libvirt.VIR_FROM_SSH, libvirt.VIR_FROM_LIBSSH}


def _quiet_libvirt(_ctx: object, error: tuple) -> None:
    """libvirt prints every error to stderr unless a handler is set; each one also raises
    libvirtError, which the backend turns into a message, so a debug line is enough."""
    log.debug("libvirt: %s", error[2] if len(error) > 2 else error)


libvirt.registerErrorHandler(_quiet_libvirt, None)


# Credentials ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Password:
    """A password read from a secret file, and the user name the URI gives (if any)."""

    username: str
    password: str = field(repr=False)


def connection_uri(uri: str, secret: Path | None) -> str:
    """`uri` with what libvirt needs to use the secret: `keyfile=` (an SSH private key) for the
    SSH transports, `pkipath=` (a folder of TLS material) for +tls; an option already in the URI
    wins. SSH never prompts (`no_tty=1`); host keys are still checked (no `no_verify`)."""
    parts = urlsplit(uri)
    transport = parts.scheme.partition("+")[2].lower()
    query = parse_qsl(parts.query, keep_blank_values=True)
    names = {name for name, _ in query}
    if transport in SSH_TRANSPORTS:
        if secret is not None and "keyfile" not in names:
            query.append(("keyfile", str(secret)))
        if "no_tty" not in names:
            query.append(("no_tty", "1"))
    elif transport == "tls" and secret is not None and "pkipath" not in names:
        query.append(("pkipath", str(secret)))
    # Not urlunsplit: it writes qemu:///system as qemu:/system.
    return uri.partition("?")[0] + (f"?{urlencode(query, safe='/:')}" if query else "")


def _password_auth(secret: _Password | None) -> list:
    """openAuth's credential list: the password file answers the passphrase prompts, the URI's
    user name the user name prompt. Without a password every prompt is refused at once, so a
    worker never waits on a terminal that is not there."""

    def answer(credentials: list, _data: object) -> int:
        for cred in credentials:
            if secret is None:
                return -1
            if cred[0] == libvirt.VIR_CRED_AUTHNAME:
                cred[4] = secret.username or cred[3] or ""
            elif cred[0] in (libvirt.VIR_CRED_PASSPHRASE, libvirt.VIR_CRED_NOECHOPROMPT):
                cred[4] = secret.password
            else:
                return -1
        return 0

    kinds = [libvirt.VIR_CRED_AUTHNAME, libvirt.VIR_CRED_PASSPHRASE, libvirt.VIR_CRED_NOECHOPROMPT]
    return [kinds, answer, None]


def _version(number: int) -> str:
    return f"{number // 1_000_000}.{number // 1000 % 1000}.{number % 1000}"


# XML -----------------------------------------------------------------------------------------


def _parse(text: str) -> ET.Element:
    return parse_xml(text)


def _to_text(root: ET.Element, source: str) -> str:
    """`root` as XML text, keeping the namespace prefixes of `source` (metadata, qemu:commandline)
    so the definition still reads as the admin wrote it."""
    for _event, (prefix, uri) in iterparse(io.StringIO(source), events=("start-ns",)):
        # A prefix like ns0 is ElementTree's own: it picks another for that namespace.
        with contextlib.suppress(ValueError):
            if prefix:
                ET.register_namespace(prefix, uri)
    return ET.tostring(root, encoding="unicode")


def _int(text: str | None) -> int:
    """libvirt writes PCI address parts in hex (`0x3b`) in domains and in decimal in node devices."""
    value = (text or "0").strip()
    return int(value, 16) if value.lower().startswith("0x") else int(value)


def _pci_id(element: ET.Element | None) -> str:
    """The bus id of an `<address domain bus slot function>` element or a node device's `pci`
    capability (child elements), in fleet.pci form; "" when it has none."""
    if element is None:
        return ""
    parts = []
    for name in ("domain", "bus", "slot", "function"):
        value = element.get(name)
        if value is None:
            child = element.find(name)
            value = child.text if child is not None else None
        if value is None:
            return ""
        parts.append(_int(value))
    domain, bus, slot, function = parts
    try:
        return normalize_pci_bus_id(f"{domain:x}:{bus:02x}:{slot:02x}.{function:x}")
    except InvalidPciBusId:
        return ""


def _node_device_name(bus_id: str) -> str:
    """libvirt's node device name for a PCI address: `pci_0000_3b_00_4`."""
    domain, bus, rest = bus_id.split(":")
    slot, function = rest.split(".")
    return f"pci_{int(domain, 16):04x}_{bus.lower()}_{slot.lower()}_{function}"


def _memory_mib(element: ET.Element | None) -> int:
    if element is None or not (element.text or "").strip():
        return 0
    factors = {"b": 1, "bytes": 1, "k": 1024, "kib": 1024, "kb": 1000, "m": 1024**2, "mib": 1024**2,
               "mb": 1000**2, "g": 1024**3, "gib": 1024**3, "gb": 1000**3, "t": 1024**4, "tib": 1024**4,
               "tb": 1000**4}
    factor = factors.get((element.get("unit") or "KiB").lower(), 1024)
    return int(element.text.strip()) * factor // 1024**2


@dataclass
class _Gpu:
    """What libvirt knows of one PCI function that offers vGPU types (a GPU, or one of its VFs)."""

    bus_id: str
    physical_bus_id: str  # the GPU itself: the function's own id, or its physical function's
    node_name: str
    types: dict[str, tuple[str, int]]  # type id -> (name, available instances)


def _pci_capability(root: ET.Element) -> ET.Element | None:
    return root.find("./capability[@type='pci']")


def _physical_function(pci: ET.Element) -> str:
    return _pci_id(pci.find("./capability[@type='phys_function']/address"))


def _is_nvidia(pci: ET.Element) -> bool:
    vendor = pci.find("vendor")
    return vendor is not None and _int(vendor.get("id")) == NVIDIA_VENDOR_ID


def _mdev_hostdev(device: VgpuDevice) -> ET.Element:
    hostdev = ET.Element("hostdev", mode="subsystem", type="mdev", managed="no", model="vfio-pci")
    ET.SubElement(ET.SubElement(hostdev, "source"), "address", uuid=device.id)
    return hostdev


def _vf_hostdev(device: VgpuDevice) -> ET.Element:
    bus_id = normalize_pci_bus_id(device.id)
    domain, bus, rest = bus_id.split(":")
    slot, function = rest.split(".")
    hostdev = ET.Element("hostdev", mode="subsystem", type="pci", managed="yes")
    ET.SubElement(ET.SubElement(hostdev, "source"), "address", domain=f"0x{int(domain, 16):04x}",
                  bus=f"0x{bus.lower()}", slot=f"0x{slot.lower()}", function=f"0x{function}")
    return hostdev


def _hostdev_key(hostdev: ET.Element) -> tuple[str, str] | None:
    """(kind, id) of a vGPU host device element, or None for any other host device."""
    if hostdev.get("mode", "subsystem") != "subsystem":
        return None
    address = hostdev.find("./source/address")
    if address is None:
        return None
    if hostdev.get("type") == "mdev":
        return DeviceKind.MDEV, (address.get("uuid") or "").lower()
    if hostdev.get("type") == "pci":
        bus_id = _pci_id(address)
        return (DeviceKind.VF, bus_id) if bus_id else None
    return None


def _set_vcpus(root: ET.Element, vcpus: int) -> None:
    vcpu = root.find("vcpu")
    if vcpu is None:
        vcpu = ET.SubElement(root, "vcpu", placement="static")
    vcpu.text = str(vcpus)
    vcpu.attrib.pop("current", None)  # every vCPU online at boot, as the approved size says
    vcpus_element = root.find("vcpus")  # per-vCPU settings name vCPUs that may no longer exist
    if vcpus_element is not None:
        root.remove(vcpus_element)
    topology = root.find("./cpu/topology")
    if topology is not None:
        threads = int(topology.get("threads", "1")) or 1
        per_socket = int(topology.get("dies", "1")) * int(topology.get("cores", "1")) * threads
        if per_socket and vcpus % per_socket == 0:
            topology.set("sockets", str(vcpus // per_socket))
        else:  # the old shape does not divide the new count: one socket, keeping SMT where it can
            threads = threads if vcpus % threads == 0 else 1
            topology.attrib.update(sockets="1", dies="1", cores=str(vcpus // threads), threads=str(threads))


def _set_memory(root: ET.Element, ram_mib: int) -> None:
    for name in ("memory", "currentMemory"):
        element = root.find(name)
        if element is None:
            element = ET.SubElement(root, name)
        element.attrib.clear()
        element.set("unit", "KiB")
        element.text = str(ram_mib * 1024)


# Guest statistics ----------------------------------------------------------------------------

#: Bulk statistics asked of every running domain in one round trip (a QEMU host answers all
#: three; the test driver only the state, and the rest is then read domain by domain).
_GUEST_STATS = libvirt.VIR_DOMAIN_STATS_STATE | libvirt.VIR_DOMAIN_STATS_VCPU | libvirt.VIR_DOMAIN_STATS_BALLOON
# A domain that stopped or was undefined between the listing and the read: no longer running.
_GONE_CODES = {libvirt.VIR_ERR_NO_DOMAIN, libvirt.VIR_ERR_OPERATION_INVALID}


def _kib_to_mib(kib: int) -> int:
    return int(kib) // 1024


def guest_memory(stats: dict) -> tuple[int | None, int | None]:
    """(used MiB, available MiB) of the guest from balloon statistics in KiB, named as
    `virDomainMemoryStats` names them (`available`, `usable`, `unused`, `actual`, ...). The guest's
    balloon driver alone reports `available` (the memory it sees) and what of it is free; without
    the driver only the host's figures (`actual`, `rss`) are there, and the guest's use is not
    known: (None, None), never 0. `usable` (what the guest could use without swapping, page cache
    counted as free) is preferred to `unused` (free pages only), which would count the cache as used."""
    available = stats.get("available")
    if available is None:
        return None, None
    free = stats.get("usable", stats.get("unused"))
    if free is None:
        return None, _kib_to_mib(available)
    return max(0, _kib_to_mib(int(available) - int(free))), _kib_to_mib(available)


def bulk_vcpu_times(stats: dict) -> tuple[int, ...] | None:
    """Each vCPU's cumulative run time (ns) from a bulk statistics record (`vcpu.N.time`), in vCPU
    order; None when the record has no VCPU group (a driver that does not offer it)."""
    times = {}
    for key, value in stats.items():
        parts = key.split(".")
        if len(parts) == 3 and parts[0] == "vcpu" and parts[2] == "time" and parts[1].isdigit():
            times[int(parts[1])] = int(value)
    return tuple(times[index] for index in sorted(times)) or None


def bulk_steal_ns(stats: dict) -> int | None:
    """The time (ns) the domain's vCPUs waited for a host CPU, all vCPUs together: per vCPU its
    `vcpu.N.delay` (the run-queue delay the guest sees as steal time), or `vcpu.N.wait` on a host
    that reports only that. The two are the same wait read from two kernel files, so they are not
    added up. None when the host reports neither (schedstats off, an older libvirt, the test driver)."""
    waits: dict[int, tuple[int | None, int | None]] = {}
    for key, value in stats.items():
        parts = key.split(".")
        if len(parts) == 3 and parts[0] == "vcpu" and parts[1].isdigit() and parts[2] in ("delay", "wait"):
            delay, wait = waits.get(int(parts[1]), (None, None))
            waits[int(parts[1])] = (int(value), wait) if parts[2] == "delay" else (delay, int(value))
    if not waits:
        return None
    return sum(delay if delay is not None else wait for delay, wait in waits.values())


# The backend ---------------------------------------------------------------------------------


class LibvirtBackend:
    """One open libvirt connection to one host (see the module docstring)."""

    def __init__(self, conn: libvirt.virConnect, uri: str, devices: DeviceManager | None = None):
        self._conn = conn
        self._uri = uri
        self._devices = devices

    @classmethod
    def open(cls, uri: str, *, secret_ref: str = "", devices: DeviceManager | None = None) -> LibvirtBackend:
        """Connect to `uri` with the credentials `secret_ref` names; Unreachable when the host,
        its daemon or its credentials fail (the message says which, never a secret)."""
        secret = secret_path(secret_ref, uri) if secret_ref else None
        transport = urlsplit(uri).scheme.partition("+")[2].lower()
        password = None
        if secret is not None and transport not in (*SSH_TRANSPORTS, "tls"):
            password = _Password(username=urlsplit(uri).username or "",
                                 password=read_password(secret, secret_ref, uri))
        try:
            conn = libvirt.openAuth(connection_uri(uri, secret), _password_auth(password), 0)
        except libvirt.libvirtError as exc:
            raise Unreachable(f"Could not connect to {_shown(uri)}: {exc.get_error_message()}") from None
        return cls(conn, uri, devices)

    # Connection ------------------------------------------------------------------------------

    @property
    def _host(self) -> str:
        return urlsplit(self._uri).hostname or _shown(self._uri)

    def _error(self, exc: libvirt.libvirtError, action: str) -> HypervisorError:
        """Our error for a libvirt one, its message naming the host and what was being done."""
        message = f"libvirt on {self._host} could not {action}: {exc.get_error_message()}"
        code, source = exc.get_error_code(), exc.get_error_domain()
        if code == libvirt.VIR_ERR_NO_DOMAIN:
            return DomainNotFound(message)
        if code in _UNREACHABLE_CODES or source in _UNREACHABLE_SOURCES:
            return Unreachable(f"Lost the connection to {_shown(self._uri)} while trying to {action}: "
                               f"{exc.get_error_message()}")
        return HypervisorError(message)

    def check(self) -> ConnectionCheck:
        try:
            library = _version(self._conn.getLibVersion())
            kind = self._conn.getType()
            hostname = self._conn.getHostname()
            driver = _version(self._conn.getVersion())
        except libvirt.libvirtError as exc:
            return ConnectionCheck(ok=False, message=str(self._error(exc, "answer a check")))
        return ConnectionCheck(
            ok=True, message=f"Connected to libvirt {library} ({kind}) on {hostname}",
            hypervisor_version=library, hostname=hostname,
            details={"hypervisor_type": kind, "driver_version": driver, "uri": _shown(self._uri)},
        )

    def close(self) -> None:
        with contextlib.suppress(libvirt.libvirtError):  # already broken: nothing left to release
            self._conn.close()

    # Domains ---------------------------------------------------------------------------------

    def _lookup(self, uuid: str) -> libvirt.virDomain:
        try:
            return self._conn.lookupByUUIDString(uuid)
        except libvirt.libvirtError as exc:
            if exc.get_error_code() == libvirt.VIR_ERR_NO_DOMAIN:
                raise DomainNotFound(f"There is no domain {uuid} on {self._host}.") from None
            raise self._error(exc, f"look up domain {uuid}") from None

    def _domain(self, dom: libvirt.virDomain, known: dict[str, VgpuDevice] | None = None) -> Domain:
        xml = dom.XMLDesc(0)
        root = _parse(xml)
        vcpu = root.find("vcpu")
        vcpus = int((vcpu.get("current") or vcpu.text or "0").strip()) if vcpu is not None else 0
        state = _STATES.get(dom.state()[0], PowerState.OTHER)
        known = self._known_devices() if known is None else known
        vgpus = []
        for hostdev in root.findall("./devices/hostdev"):
            key = _hostdev_key(hostdev)
            if key is None:
                continue
            kind, device_id = key
            device = known.get(device_id)
            if device is None and kind == DeviceKind.VF and self._is_other_pci_device(device_id):
                continue  # a passthrough NIC or a whole GPU, not a vGPU
            vgpus.append(device or VgpuDevice(kind=kind, id=device_id, gpu_bus_id=""))
        return Domain(uuid=dom.UUIDString().lower(), name=dom.name(), vcpus=vcpus,
                      ram_mib=_memory_mib(root.find("memory")), state=state, vgpus=tuple(vgpus))

    def list_domains(self) -> list[Domain]:
        known = self._known_devices()
        domains = []
        try:
            for dom in self._conn.listAllDomains(0):
                try:
                    domains.append(self._domain(dom, known))
                except libvirt.libvirtError as exc:
                    if exc.get_error_code() != libvirt.VIR_ERR_NO_DOMAIN:
                        raise
                    # undefined between the listing and the read: no longer one of the host's
        except libvirt.libvirtError as exc:
            raise self._error(exc, "list its domains") from None
        return sorted(domains, key=lambda d: (d.name, d.uuid))

    def domain(self, uuid: str) -> Domain:
        dom = self._lookup(uuid)
        try:
            return self._domain(dom)
        except libvirt.libvirtError as exc:
            raise self._error(exc, f"read domain {uuid}") from None

    def shutdown(self, uuid: str, timeout_s: float) -> None:
        dom = self._lookup(uuid)
        deadline = time.monotonic() + max(timeout_s, 0.0)
        try:
            if dom.state()[0] == libvirt.VIR_DOMAIN_SHUTOFF:
                return
            try:
                dom.shutdown()  # ACPI power button: the guest shuts down cleanly, or ignores it
            except libvirt.libvirtError as exc:
                # It may have powered off between the look and the request.
                if dom.state()[0] == libvirt.VIR_DOMAIN_SHUTOFF:
                    return
                raise self._error(exc, f"shut down {dom.name()}") from None
            while True:
                if dom.state()[0] == libvirt.VIR_DOMAIN_SHUTOFF:
                    return
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    break
                time.sleep(min(SHUTDOWN_POLL_S, remaining))
        except libvirt.libvirtError as exc:
            raise self._error(exc, f"shut down {uuid}") from None
        raise ShutdownTimeout(f"{dom.name()} on {self._host} did not power off within {timeout_s:g} s after "
                              "the shutdown request; it is left running.")

    def start(self, uuid: str) -> None:
        dom = self._lookup(uuid)
        try:
            if dom.isActive():
                return
            dom.create()
        except libvirt.libvirtError as exc:
            raise self._error(exc, f"start {dom.name()}") from None

    def redefine(self, uuid: str, spec: DomainSpec) -> None:
        if spec.vcpus < 1 or spec.ram_mib < 1:
            raise HypervisorError(f"A domain needs at least one vCPU and some RAM (asked: {spec.vcpus} vCPUs, "
                                  f"{spec.ram_mib} MiB).")
        source = self.definition(uuid)
        root = _parse(source)
        _set_vcpus(root, spec.vcpus)
        _set_memory(root, spec.ram_mib)
        devices = root.find("devices")
        if devices is None:
            devices = ET.SubElement(root, "devices")
        wanted = {(d.kind, self._device_key(d)): d for d in spec.vgpus}
        kept = set()
        for hostdev in devices.findall("hostdev"):
            key = _hostdev_key(hostdev)
            if key is None or (key[0] == DeviceKind.VF and self._is_other_pci_device(key[1])):
                continue
            if key in wanted and key not in kept:
                kept.add(key)  # unchanged: its guest address and options stay as they were
            else:
                devices.remove(hostdev)
        for key, device in wanted.items():
            if key not in kept:
                devices.append(_mdev_hostdev(device) if device.kind == DeviceKind.MDEV else _vf_hostdev(device))
        self._define(_to_text(root, source), f"redefine domain {uuid}")

    @staticmethod
    def _device_key(device: VgpuDevice) -> str:
        if device.kind == DeviceKind.MDEV:
            return device.id.lower()
        try:
            return normalize_pci_bus_id(device.id)
        except InvalidPciBusId:
            raise HypervisorError(f"{device.id!r} is not the PCI address of a virtual function.") from None

    def _define(self, xml: str, action: str) -> None:
        try:
            self._conn.defineXML(xml)
        except libvirt.libvirtError as exc:
            raise self._error(exc, action) from None

    def definition(self, uuid: str) -> str:
        dom = self._lookup(uuid)
        try:
            # SECURE: a rollback or a move must keep the console password, not drop it.
            return dom.XMLDesc(libvirt.VIR_DOMAIN_XML_INACTIVE | libvirt.VIR_DOMAIN_XML_SECURE)
        except libvirt.libvirtError as exc:
            raise self._error(exc, f"read the definition of {dom.name()}") from None

    def restore(self, uuid: str, saved: str) -> None:
        saved_uuid = (_parse(saved).findtext("uuid") or "").strip().lower()
        if saved_uuid != uuid.lower():
            raise HypervisorError(f"The saved definition belongs to domain {saved_uuid or '(no UUID)'}, "
                                  f"not {uuid}; nothing was restored.")
        self._define(saved, f"restore the definition of {uuid}")

    def move_to(self, uuid: str, target: Backend) -> None:
        if not isinstance(target, LibvirtBackend):
            raise HypervisorError(f"A domain on {self._host} can only be moved to another libvirt host.")
        dom = self._lookup(uuid)
        try:
            if dom.isActive():
                raise HypervisorError(f"{dom.name()} is running on {self._host}: shut it down before moving it.")
        except libvirt.libvirtError as exc:
            raise self._error(exc, f"read the state of {uuid}") from None
        xml = self.definition(uuid)
        try:
            there = target._conn.lookupByUUIDString(uuid)
        except libvirt.libvirtError as exc:
            if exc.get_error_code() != libvirt.VIR_ERR_NO_DOMAIN:
                raise target._error(exc, f"look up domain {uuid}") from None
            there = None
        if there is not None and there.isActive():
            raise HypervisorError(f"{dom.name()} already runs on {target._host}; it was not moved.")
        target._define(xml, f"define {dom.name()} (moved from {self._host})")
        try:
            self._undefine(dom)
        except HypervisorError:
            if there is None:  # leave one definition only: the source's, as before the move
                try:
                    target._undefine(target._conn.lookupByUUIDString(uuid))
                except (HypervisorError, libvirt.libvirtError):
                    log.warning("Domain %s is now defined on both %s and %s", uuid, self._host, target._host)
            raise

    def _undefine(self, dom: libvirt.virDomain) -> None:
        flags = libvirt.VIR_DOMAIN_UNDEFINE_MANAGED_SAVE | libvirt.VIR_DOMAIN_UNDEFINE_SNAPSHOTS_METADATA
        try:
            # KEEP_NVRAM: a UEFI guest's variables stay on disk for the target to use.
            dom.undefineFlags(flags | libvirt.VIR_DOMAIN_UNDEFINE_KEEP_NVRAM)
        except libvirt.libvirtError as exc:
            if exc.get_error_code() != libvirt.VIR_ERR_INVALID_ARG:  # a driver without NVRAM (test)
                raise self._error(exc, f"undefine {dom.name()}") from None
            try:
                dom.undefineFlags(flags)
            except libvirt.libvirtError as again:
                raise self._error(again, f"undefine {dom.name()}") from None

    # Guest statistics ------------------------------------------------------------------------

    def guest_counters(self) -> list[GuestCounters]:
        """Every running domain's CPU and memory counters, by UUID: one bulk statistics call, and
        a domain-by-domain read of what the host's driver leaves out of it."""
        read_at_ns = time.time_ns()
        try:
            try:
                records = self._conn.getAllDomainStats(_GUEST_STATS, libvirt.VIR_CONNECT_GET_ALL_DOMAINS_STATS_RUNNING)
            except libvirt.libvirtError as exc:
                if exc.get_error_code() != libvirt.VIR_ERR_NO_SUPPORT:
                    raise
                records = [(dom, {}) for dom in self._conn.listAllDomains(libvirt.VIR_CONNECT_LIST_DOMAINS_RUNNING)]
        except libvirt.libvirtError as exc:
            raise self._error(exc, "read the CPU and memory statistics of its running domains") from None
        counters = []
        for dom, stats in records:
            try:
                counters.append(self._guest_counters(dom, stats, read_at_ns))
            except libvirt.libvirtError as exc:
                if exc.get_error_code() in _GONE_CODES:
                    continue
                raise self._error(exc, f"read the CPU and memory statistics of {dom.name()}") from None
        return sorted(counters, key=lambda c: c.uuid)

    @staticmethod
    def _guest_counters(dom: libvirt.virDomain, stats: dict, read_at_ns: int) -> GuestCounters:
        vcpu_ns = bulk_vcpu_times(stats)
        if vcpu_ns is None:
            vcpu_ns = tuple(int(info[2]) for info in dom.vcpus()[0])
        if "balloon.current" in stats:  # the BALLOON group answered, with or without the guest's driver
            memory = {key.removeprefix("balloon."): value for key, value in stats.items()
                      if key.startswith("balloon.")}
            current_kib = memory["current"]
        else:
            memory = dom.memoryStats()
            current_kib = memory.get("actual") or dom.info()[2]
        used_mib, available_mib = guest_memory(memory)
        return GuestCounters(uuid=dom.UUIDString().lower(), read_at_ns=read_at_ns,
                             vcpus=int(stats.get("vcpu.current") or len(vcpu_ns)), ram_mib=_kib_to_mib(current_kib),
                             vcpu_ns=vcpu_ns, steal_ns=bulk_steal_ns(stats), ram_used_mib=used_mib,
                             ram_available_mib=available_mib)

    # vGPU devices ----------------------------------------------------------------------------

    @property
    def _libvirt_manages_devices(self) -> bool:
        """Whether libvirt's node-device API can create and remove mdevs on this connection."""
        try:
            return self._conn.getType().upper() != "TEST"
        except libvirt.libvirtError as exc:
            raise self._error(exc, "say which driver it runs") from None

    def _node_xml(self, device: libvirt.virNodeDevice) -> ET.Element:
        return _parse(device.XMLDesc(0))

    def _gpus(self) -> list[_Gpu]:
        """Every NVIDIA PCI function with vGPU types, from libvirt's node devices."""
        try:
            found = self._conn.listAllDevices(libvirt.VIR_CONNECT_LIST_NODE_DEVICES_CAP_MDEV_TYPES)
            gpus = []
            for device in found:
                root = self._node_xml(device)
                pci = _pci_capability(root)
                if pci is None or not _is_nvidia(pci):
                    continue
                bus_id = _pci_id(pci)
                types = {}
                for item in pci.findall("./capability[@type='mdev_types']/type"):
                    types[item.get("id", "")] = ((item.findtext("name") or item.get("id", "")).strip(),
                                                 _int(item.findtext("availableInstances")))
                gpus.append(_Gpu(bus_id=bus_id, physical_bus_id=_physical_function(pci) or bus_id,
                                 node_name=device.name(), types=types))
        except libvirt.libvirtError as exc:
            raise self._error(exc, "list its vGPU-capable GPUs") from None
        return gpus

    def _libvirt_vgpu_types(self) -> list[VgpuType]:
        """Types per physical GPU: a GPU whose types hang on its VFs offers their sum."""
        totals: dict[tuple[str, str], tuple[str, int]] = {}
        for gpu in self._gpus():
            for type_id, (name, available) in gpu.types.items():
                key = (gpu.physical_bus_id, type_id)
                totals[key] = (name, totals.get(key, (name, 0))[1] + max(available, 0))
        return sorted((VgpuType(gpu_bus_id=bus, type_id=type_id, name=name, available=available)
                       for (bus, type_id), (name, available) in totals.items()),
                      key=lambda t: (t.gpu_bus_id, t.name, t.type_id))

    def _libvirt_vgpu_devices(self) -> list[VgpuDevice]:
        gpus = {gpu.node_name: gpu for gpu in self._gpus()}
        devices = []
        try:
            for device in self._conn.listAllDevices(libvirt.VIR_CONNECT_LIST_NODE_DEVICES_CAP_MDEV):
                root = self._node_xml(device)
                mdev = root.find("./capability[@type='mdev']")
                gpu = gpus.get((root.findtext("parent") or "").strip())
                if mdev is None or gpu is None:
                    continue  # another vendor's mediated device (Intel GVT-g, s390 AP)
                type_id = mdev.find("type").get("id", "") if mdev.find("type") is not None else ""
                uuid = (mdev.findtext("uuid") or "").strip().lower()
                devices.append(VgpuDevice(kind=DeviceKind.MDEV, id=uuid, gpu_bus_id=gpu.physical_bus_id,
                                          type_name=gpu.types.get(type_id, ("", 0))[0]))
        except libvirt.libvirtError as exc:
            raise self._error(exc, "list its vGPU devices") from None
        return sorted(devices, key=lambda d: (d.gpu_bus_id, d.id))

    def _known_devices(self) -> dict[str, VgpuDevice]:
        """Every vGPU instance of the host by id, to give a domain's host devices their GPU and
        type; the device manager's view where there is one."""
        return {device.id: device for device in self.vgpu_devices()}

    def _is_other_pci_device(self, bus_id: str) -> bool:
        """Whether libvirt knows the PCI device `bus_id` as something other than an NVIDIA
        virtual function (a NIC, a whole GPU in passthrough). Unknown devices count as VFs."""
        try:
            root = self._node_xml(self._conn.nodeDeviceLookupByName(_node_device_name(bus_id)))
        except libvirt.libvirtError as exc:
            if exc.get_error_code() == libvirt.VIR_ERR_NO_NODE_DEVICE:
                return False
            raise self._error(exc, f"read PCI device {bus_id}") from None
        pci = _pci_capability(root)
        return pci is None or not _is_nvidia(pci) or not _physical_function(pci)

    def vgpu_types(self) -> list[VgpuType]:
        if self._devices is not None:
            return self._devices.vgpu_types()
        return self._libvirt_vgpu_types()

    def vgpu_devices(self) -> list[VgpuDevice]:
        if self._devices is not None:
            return self._devices.vgpu_devices()
        return self._libvirt_vgpu_devices()

    def create_vgpu(self, gpu_bus_id: str, type_name: str, *, device_id: str = "") -> VgpuDevice:
        try:
            bus_id = normalize_pci_bus_id(gpu_bus_id)
        except InvalidPciBusId as exc:
            raise HypervisorError(str(exc)) from None
        if self._libvirt_manages_devices:
            functions = [gpu for gpu in self._gpus() if gpu.physical_bus_id == bus_id]
            if functions or self._devices is None:
                return self._create_mdev(bus_id, type_name, functions, device_id)
        if self._devices is not None:
            return self._devices.create_vgpu(bus_id, type_name, device_id=device_id)
        raise HypervisorError(NO_DEVICE_ACTION.format(host=self._host))

    def _create_mdev(self, bus_id: str, type_name: str, functions: list[_Gpu], device_id: str = "") -> VgpuDevice:
        """One mdev of the type named `type_name` on the GPU (on the first of its VFs that can take
        one), through nodeDeviceCreateXML; with the UUID `device_id` when one is given."""
        if not functions:
            raise NoInstanceAvailable(f"libvirt on {self._host} knows no vGPU-capable GPU at {bus_id}.")
        offered = {name for gpu in functions for name, _ in gpu.types.values()}
        for gpu in functions:
            for type_id, (name, available) in gpu.types.items():
                if type_name not in (name, type_id) or available < 1:
                    continue
                new_uuid = str(uuidlib.UUID(device_id)) if device_id else str(uuidlib.uuid4())
                xml = (f"<device><parent>{gpu.node_name}</parent><capability type='mdev'>"
                       f"<type id='{type_id}'/><uuid>{new_uuid}</uuid></capability></device>")
                try:
                    self._conn.nodeDeviceCreateXML(xml, 0)
                except libvirt.libvirtError as exc:
                    raise self._error(exc, f"create a {name} vGPU on {bus_id}") from None
                return VgpuDevice(kind=DeviceKind.MDEV, id=new_uuid, gpu_bus_id=bus_id, type_name=name)
        if type_name in offered:
            raise NoInstanceAvailable(f"The GPU {bus_id} on {self._host} cannot take another {type_name} vGPU now.")
        raise NoInstanceAvailable(f"The GPU {bus_id} on {self._host} offers no vGPU type named {type_name!r} "
                                  f"(it offers: {', '.join(sorted(offered)) or 'none'}).")

    def remove_vgpu(self, device: VgpuDevice) -> None:
        key = (device.kind, self._device_key(device))
        try:
            for dom in self._conn.listAllDomains(libvirt.VIR_CONNECT_LIST_DOMAINS_ACTIVE):
                if any(_hostdev_key(h) == key for h in _parse(dom.XMLDesc(0)).findall("./devices/hostdev")):
                    raise DeviceBusy(f"The vGPU {device.id} is in use by {dom.name()}, which is running on "
                                     f"{self._host}; shut it down first.")
        except libvirt.libvirtError as exc:
            raise self._error(exc, "list its running domains") from None
        # Removed by libvirt, or unknown to it with no device manager to ask: gone already.
        if (self._libvirt_manages_devices and device.kind == DeviceKind.MDEV
                and (self._destroy_mdev(key[1]) or self._devices is None)):
            return
        if self._devices is not None:
            self._devices.remove_vgpu(device)
            return
        raise HypervisorError(NO_DEVICE_ACTION.format(host=self._host))

    def _destroy_mdev(self, uuid: str) -> bool:
        """Remove the mdev through libvirt; False when libvirt knows no such device."""
        try:
            for node in self._conn.listAllDevices(libvirt.VIR_CONNECT_LIST_NODE_DEVICES_CAP_MDEV):
                if (self._node_xml(node).findtext("./capability[@type='mdev']/uuid") or "").strip().lower() == uuid:
                    node.destroy()
                    return True
        except libvirt.libvirtError as exc:
            if exc.get_error_code() == libvirt.VIR_ERR_NO_NODE_DEVICE:
                return True  # gone meanwhile: what was asked
            raise self._error(exc, f"remove the vGPU {uuid}") from None
        return False

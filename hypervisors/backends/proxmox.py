"""The Proxmox VE backend, on proxmoxer: one node of a Proxmox VE cluster, through the cluster's API.

URI: `proxmox://USER@REALM@SERVER[:PORT]/?node=NODE` (port 8006 by default), e.g.
`proxmox://root@pam@pve1:8006/`. The secret (`hypervisor_secret_ref`) holds the user's password,
or, when the user names an API token (`proxmox://root@pam!dashboard@pve1/`), the token's secret.
`node` may be left out where the server's own name is the node's, or the cluster has one node;
`insecure=1` skips the certificate check (a lab), `cafile=/path/ca.pem` trusts that CA instead of
the system's (HYPERVISOR_CA_FILE sets one for every link).

What Proxmox VE calls things here:
- a domain is a QEMU VM of the node (templates are not domains); its UUID is the SMBIOS UUID
  (`smbios1: uuid=...`), which QEMU hands the guest and NVML reports;
- a vGPU is a `hostpciN` entry with `mdev=<type>` ("0000:3b:00.0,mdev=nvidia-222"). It lives in
  the VM's configuration: Proxmox VE creates the mediated device when the VM starts and removes it
  when it stops, with a UUID of its own making (`generate_mdev_uuid`: the slot N and the VM id,
  "00000000-0000-0000-0000-000000000101"), which is the device's id here, as the agent reads it.
  On GPUs in NVIDIA's SR-IOV layout (vGPU 17 and later) the entry names a virtual function
  ("0000:3b:00.4,mdev=nvidia-1024") and the VF's address is the device's id. `create_vgpu`
  therefore only checks that the GPU can take the type now and names the device; `redefine`
  writes the entry; the UUID is known once it has;
- the node's vGPU types are the mdev types of its NVIDIA GPUs (`hardware/pci/<id>/mdev`), with the
  names the driver gives them ("GRID T4-4Q"), which the catalog's profiles match. In the SR-IOV
  layout the physical function lists none and each free VF lists what the GPU can take now, each
  with "available: 1" (a VF holding a vGPU lists nothing), so a type's available count is the
  catalog's count of that size per GPU less the vGPUs present, and at most the free VFs;
- a cold move is the API's offline migration to another node of the same cluster;
- a guest's CPU and memory (`guest_counters`) are what pvestatd and QEMU report in the node's VM
  listing (`full=1`): the share of its vCPUs the VM used, and, when the guest runs the VirtIO
  balloon driver, the memory it uses. Proxmox VE reports neither each vCPU's share nor steal
  time through its API.

Every failure becomes a HypervisorError whose message says what was being done and why, in the
words an admin acts on (DNS, refused, TLS, credentials, permissions, the task's exit status).
"""

from __future__ import annotations

import contextlib
import functools
import json
import logging
import math
import re
import time
import uuid as uuidlib
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from urllib.parse import unquote

import requests
from proxmoxer import AuthenticationError, ProxmoxAPI, ResourceException

from fleet.catalog import CATALOG, profiles_of
from fleet.pci import InvalidPciBusId, normalize_pci_bus_id
from hypervisors import matching
from hypervisors.backends import in_definition, reach
from hypervisors.backends.base import (
    Backend,
    ConnectionCheck,
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
from hypervisors.backends.credentials import read_password, secret_path, shown

log = logging.getLogger(__name__)

SCHEME = "proxmox"
DEFAULT_PORT = 8006
#: How long one API call may take.
CALL_TIMEOUT_S = 60.0
#: How long a Proxmox VE task (start, configuration, migration) may run before the backend gives up on it.
TASK_TIMEOUT_S = 600.0
TASK_POLL_S = 0.2
MIB = 1024 * 1024
SHUTDOWN_POLL_S = 0.25
MAX_HOSTPCI = 16
#: What the product asks of the user on the node's VMs, by Proxmox VE's privilege names.
PRIVILEGES = ("VM.Audit", "VM.PowerMgmt", "VM.Config.HWType", "VM.Config.CPU", "VM.Config.Memory", "VM.Migrate",
              "Sys.Audit")
#: The user Proxmox VE lets set raw PCI devices (hostpci without a resource mapping).
ROOT = "root@pam"
#: Ids for VMs without an SMBIOS UUID (derived from the VM id, stable across reads).
_DERIVED_IDS = uuidlib.UUID("6c1d2f2e-94a0-4a57-8f43-5a3f2b7e9c10")
_HOSTPCI = re.compile(r"hostpci(\d+)")
_PCI = re.compile(r"(?:(?P<domain>[0-9a-f]{4,8}):)?(?P<bus>[0-9a-f]{2}):(?P<device>[0-9a-f]{2})\.(?P<fn>[0-7])",
                  re.IGNORECASE)
_UPID = re.compile(r"UPID:(?P<node>[^:]+):")


def mdev_uuid(vmid: int, index: int) -> str:
    """The UUID Proxmox VE gives the mediated device of the VM's `hostpci<index>` at start."""
    return f"{index:08d}-0000-0000-0000-{vmid:012d}"


def pve_pci(bus_id: str) -> str:
    """A PCI address as Proxmox VE writes it: "00000000:3B:00.0" -> "0000:3b:00.0"."""
    match = _PCI.fullmatch(bus_id.strip())
    if match is None:
        raise HypervisorError(f"{bus_id!r} is not a PCI address.")
    domain = int(match["domain"] or "0", 16)
    return f"{domain:04x}:{match['bus'].lower()}:{match['device'].lower()}.{match['fn']}"


def _bus_id(pci: str) -> str:
    try:
        return normalize_pci_bus_id(pve_pci(pci))
    except (HypervisorError, InvalidPciBusId):
        return pci


def _gpu_of(pci: str) -> str:
    """The physical GPU of a function: NVIDIA's virtual functions sit on their GPU's bus, which
    answers as function 0 of device 0 ("0000:3b:00.4" -> "00000000:3B:00.0")."""
    match = _PCI.fullmatch(pci.strip())
    if match is None:
        return pci
    return _bus_id(f"{match['domain'] or '0000'}:{match['bus']}:00.0")


def _is_virtual_function(pci: str) -> bool:
    return _bus_id(pci) != _gpu_of(pci)


@functools.lru_cache(maxsize=256)
def _most_per_gpu(type_name: str) -> int | None:
    """How many vGPUs of this size one GPU holds by NVIDIA's rule (the catalog's count of one
    size per GPU), or None for a type the catalog lacks."""
    for model in CATALOG:
        for profile in profiles_of(model):
            if matching.match_profile(type_name, [profile.name]):
                return profile.max_per_gpu
    return None


def _options(value: str) -> tuple[str, dict[str, str]]:
    """A property string ("0000:3b:00.0,mdev=nvidia-222,pcie=1") as its default value and its options."""
    first, options = "", {}
    for part in str(value).split(","):
        key, sep, rest = part.partition("=")
        if sep:
            options[key.strip()] = rest.strip()
        elif not first:
            first = part.strip()
    if not first:
        first = options.get("host", "")
    return first, options


def _memory_mib(config: dict) -> int:
    """The VM's RAM: `memory` is a number, or (Proxmox VE 8.2+) a property string with `current=`."""
    value, options = _options(str(config.get("memory", "512")))
    with contextlib.suppress(ValueError):
        return int(options.get("current") or value)
    return 0


def _vcpus(config: dict) -> int:
    if config.get("vcpus"):
        return int(config["vcpus"])
    return int(config.get("cores") or 1) * int(config.get("sockets") or 1)


def _smbios_uuid(config: dict, vmid: int) -> str:
    _, options = _options(str(config.get("smbios1", "")))
    if options.get("uuid"):
        return options["uuid"].lower()
    return str(uuidlib.uuid5(_DERIVED_IDS, str(vmid)))


# The link ----------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Target:
    """What a proxmox:// URI names."""

    server: str
    port: int
    user: str  # "root@pam", without a token name
    token: str = ""  # the API token's name, when the secret is a token's
    node: str = ""
    insecure: bool = False
    cafile: str = ""

    @property
    def where(self) -> str:
        return f"{self.server}:{self.port}"

    @property
    def login(self) -> str:
        return f"{self.user}!{self.token}" if self.token else self.user


def parse_uri(uri: str) -> Target:
    read = reach.split_uri(uri, scheme=SCHEME, default_port=DEFAULT_PORT, kind="Proxmox VE",
                           usage="proxmox://root@pam@NODE:8006/")
    user, _, token = unquote(read.parts.username or "").partition("!")
    if "@" not in user:
        raise HypervisorError(f"{shown(uri)} names no user with its realm: proxmox://root@pam@NODE:8006/ "
                              "(the password, or the API token's secret, comes from the secret reference).")
    return Target(server=read.parts.hostname, port=read.port, user=user, token=token,
                  node=read.query.get("node", ""), insecure=read.insecure, cafile=read.cafile)


def _types(offers: dict[tuple[str, str], dict]) -> list[VgpuType]:
    """The vGPU types of `ProxmoxBackend._offers`, by GPU and name."""
    types = [VgpuType(gpu_bus_id=gpu, type_id=type_id, name=offer["name"], available=offer["available"])
             for (gpu, type_id), offer in offers.items()]
    return sorted(types, key=lambda t: (t.gpu_bus_id, t.name))


def _reason(exc: ResourceException) -> str:
    """What Proxmox VE said: the reason it puts in the status line, and the parameters it refused."""
    text = str(getattr(exc, "content", "") or "").strip() or str(exc)
    errors = getattr(exc, "errors", None)
    if isinstance(errors, dict) and errors:
        text += " (" + "; ".join(f"{key}: {str(value).strip()}" for key, value in sorted(errors.items())) + ")"
    return text


def _api(target: Target, secret: str) -> ProxmoxAPI:
    verify: bool | str = False if target.insecure else (target.cafile or True)
    common = {"port": target.port, "verify_ssl": verify, "timeout": CALL_TIMEOUT_S}
    if target.token:
        return ProxmoxAPI(target.server, user=target.user, token_name=target.token, token_value=secret, **common)
    return ProxmoxAPI(target.server, user=target.user, password=secret, **common)


class ProxmoxBackend(in_definition.DevicesInDefinition):
    """One link to one node of a Proxmox VE cluster (see the module docstring)."""

    def __init__(self, api: ProxmoxAPI, uri: str, target: Target, secret: str, node: str, nodes: list[str]):
        self._api = api
        self._uri = uri
        self._target = target
        self._secret = secret
        self._node = self._where_name = node
        self._nodes = nodes
        self._shutdowns: dict[int, str] = {}  # VM id -> the shutdown task still running
        self._vmids: dict[str, int] = {}  # SMBIOS UUID -> VM id, as last found on this node
        self._names: dict[str, str] | None = None  # vGPU type id -> name (`_type_names`)
        # (VM id, QEMU pid) -> (SMBIOS UUID, has a balloon device): what a running VM started with.
        self._started: dict[tuple[int, int], tuple[str, bool]] = {}

    @classmethod
    def open(cls, uri: str, *, secret_ref: str = "", devices: DeviceManager | None = None) -> ProxmoxBackend:
        """Sign in to the Proxmox VE API `uri` names with the secret `secret_ref` names; Unreachable
        saying what is wrong (DNS, refused, TLS, credentials, no such node). `devices` is not used:
        Proxmox VE makes a VM's vGPUs itself, at start."""
        target = parse_uri(uri)
        if not secret_ref:
            what = "API token's secret" if target.token else "password"
            raise Unreachable(f"{shown(uri)} needs a {what}: put it in a file in the secrets folder and name "
                              "that file as the host's secret reference.")
        secret = read_password(secret_path(secret_ref, uri), secret_ref, uri)
        context = reach.ssl_context(target.where, insecure=target.insecure, cafile=target.cafile)
        reach.probe(target.server, target.port, context, service="Proxmox VE's API", default_port=DEFAULT_PORT)
        try:
            api = _api(target, secret)
            nodes = sorted(row["node"] for row in api.nodes.get())
        except AuthenticationError:
            raise Unreachable(f"Proxmox VE at {target.where} refused the credentials of {target.login}: check the "
                              f"user and realm in the URI and the password in {secret_ref!r}.") from None
        except ResourceException as exc:
            if exc.status_code == 401:
                raise Unreachable(f"Proxmox VE at {target.where} refused the API token {target.login}: check the "
                                  f"token's name in the URI and its secret in {secret_ref!r}.") from None
            raise Unreachable(f"Proxmox VE at {target.where} refused to list its nodes: {_reason(exc)}.") from None
        except requests.RequestException as exc:
            raise Unreachable(f"{target.where} does not answer as Proxmox VE's API does: {exc}") from None
        node = cls._pick_node(target, nodes)
        return cls(api, uri, target, secret, node, nodes)

    @staticmethod
    def _pick_node(target: Target, nodes: list[str]) -> str:
        listed = ", ".join(nodes) or "none"
        if target.node:
            if target.node not in nodes:
                raise Unreachable(f"The Proxmox VE cluster at {target.where} has no node {target.node!r} (it has: "
                                  f"{listed}); fix node= in the URI.")
            return target.node
        short = target.server.split(".")[0]
        if short in nodes:
            return short
        if len(nodes) == 1:
            return nodes[0]
        raise Unreachable(f"The Proxmox VE cluster at {target.where} has {len(nodes)} nodes ({listed}): name one "
                          "with node= in the URI.")

    # Calls ---------------------------------------------------------------------------------------

    def _call(self, action: str, request: Callable[[ProxmoxAPI], object]):
        """One API request; a ticket that has expired (Proxmox VE's last two hours) is renewed once
        by signing in again. Failures become our errors, naming `action`."""
        try:
            try:
                return request(self._api)
            except ResourceException as exc:
                if exc.status_code != 401 or self._target.token:
                    raise
                self._api = _api(self._target, self._secret)  # signs in again
                return request(self._api)
        except Exception as exc:  # noqa: BLE001 - proxmoxer's and requests' errors, said in words
            raise self._error(exc, action) from None

    def _error(self, exc: BaseException, action: str) -> HypervisorError:
        where = f"Proxmox VE ({self._target.where})"
        if isinstance(exc, HypervisorError):
            return exc
        if isinstance(exc, AuthenticationError):
            return Unreachable(f"{where} no longer accepts the credentials of {self._target.login} (trying to "
                               f"{action}): check the secret.")
        if isinstance(exc, ResourceException):
            reason = _reason(exc)
            if exc.status_code == 401:
                return Unreachable(f"{where} refused the credentials of {self._target.login} while trying to "
                                   f"{action}: {reason}.")
            if exc.status_code == 403:
                return HypervisorError(f"{self._target.login} may not {action} on {where}: {reason}.")
            if "does not exist" in reason and "onfiguration file" in reason:
                return DomainNotFound(f"{where} could not {action}: the VM is gone ({reason}).")
            return HypervisorError(f"{where} could not {action}: {reason}.")
        if isinstance(exc, requests.exceptions.SSLError):
            return Unreachable(f"TLS with {where} failed while trying to {action}: {exc}")
        if isinstance(exc, (requests.RequestException, OSError)):
            return Unreachable(f"Lost the connection to {where} while trying to {action}: {exc}")
        return HypervisorError(f"{where} could not {action}: {type(exc).__name__}: {exc}")

    def _vms(self):
        return self._api.nodes(self._node).qemu

    def check(self) -> ConnectionCheck:
        try:
            version = self._call("answer a check", lambda api: api.version.get())
            granted = self._call("read the user's privileges", lambda api: api.access.permissions.get())
            pci = self._gpu_functions()
        except HypervisorError as exc:
            return ConnectionCheck(ok=False, message=str(exc))
        privileges: set[str] = set()
        for path in ("/", "/vms", f"/nodes/{self._node}"):
            privileges |= {name for name, on in (granted or {}).get(path, {}).items() if on}
        missing = [name for name in PRIVILEGES if name not in privileges]
        gpus = sorted({_gpu_of(row["id"]) for row in pci})
        release = f"Proxmox VE {version.get('version', '?')}"
        details = {"version": version.get("version", ""), "node": self._node, "nodes": self._nodes,
                   "uri": shown(self._uri), "nvidia_gpus": len(gpus)}
        if missing:
            return ConnectionCheck(
                ok=False, hypervisor_version=version.get("version", ""), hostname=self._node, details=details,
                message=(f"Connected to {release} as {self._target.login}, but it lacks the "
                         f"privilege{'s' if len(missing) > 1 else ''} {', '.join(missing)} on the node's VMs: "
                         "grant them (a role such as PVEVMAdmin with Sys.Audit) for the product's operations."))
        root = "" if self._target.login == ROOT else (
            f" Note: Proxmox VE lets only {ROOT} itself (not an API token) set raw PCI devices, so resizing a "
            f"VM's vGPU needs {ROOT}'s password, or the VM's vGPUs in a resource mapping.")
        return ConnectionCheck(
            ok=True, hypervisor_version=version.get("version", ""), hostname=self._node, details=details,
            message=(f"Connected to {release} as {self._target.login}: node {self._node} of "
                     f"{len(self._nodes)} node(s), {len(gpus)} NVIDIA GPU(s) with vGPU types.{root}"))

    def close(self) -> None:
        """Nothing to release: each call is a request of its own (a ticket expires by itself)."""

    # Reading -------------------------------------------------------------------------------------

    def _gpu_functions(self) -> list[dict]:
        """The node's NVIDIA functions that offer vGPU types: GPUs (mdev layout) or their virtual functions."""
        rows = self._call(f"list the PCI devices of {self._node}",
                          lambda api: api.nodes(self._node).hardware.pci.get())
        return [row for row in rows or [] if str(row.get("vendor", "")).lower() == "0x10de"
                and str(row.get("class", "")).startswith("0x03") and int(row.get("mdev") or 0)]

    def _mdev_types(self, pci: str) -> list[dict]:
        return self._call(f"read the vGPU types of {pci} on {self._node}",
                          lambda api: api.nodes(self._node).hardware.pci(pci).mdev.get()) or []

    def _type_names(self, wanted: Iterable[str] = ()) -> dict[str, str]:
        """Type id -> the driver's name of it ("nvidia-222" -> "GRID T4-1Q"), over the node's GPUs;
        read once per link (the names change only with the host's driver), unlike availability,
        and read again when a type `wanted` (by id or name) is not among them: in the SR-IOV
        layout a GPU lists only the sizes it has room for now, so a link opened while it held
        one size has not seen the others' names."""
        known = self._names
        if known is None or any(w not in known and w not in known.values() for w in wanted):
            self._names = {**(known or {}), **self._read_type_names()}
        return self._names

    def _read_type_names(self) -> dict[str, str]:
        names: dict[str, str] = {}
        named: set[str] = set()
        for row in self._gpu_functions():
            gpu = _gpu_of(row["id"])
            if gpu in named and _is_virtual_function(row["id"]):
                continue  # a GPU's free virtual functions offer the same types
            entries = self._mdev_types(row["id"])
            if entries:
                # A VF that holds a vGPU lists nothing: the GPU's next VF is read instead.
                named.add(gpu)
            for entry in entries:
                names.setdefault(entry["type"], entry.get("name") or entry["type"])
        return names

    def _rows(self) -> list[dict]:
        return self._call(f"list the VMs of {self._node}", lambda api: api.nodes(self._node).qemu.get()) or []

    def _config(self, vmid: int) -> dict:
        return self._call(f"read the configuration of VM {vmid}",
                          lambda api: api.nodes(self._node).qemu(vmid).config.get()) or {}

    def _status(self, vmid: int) -> dict:
        return self._call(f"read the state of VM {vmid}",
                          lambda api: api.nodes(self._node).qemu(vmid).status.current.get()) or {}

    @staticmethod
    def _state(status: dict) -> str:
        if status.get("status") == "stopped":
            return PowerState.SHUT_OFF
        if status.get("status") == "running":
            return PowerState.PAUSED if status.get("qmpstatus") in ("paused", "suspended") else PowerState.RUNNING
        return PowerState.OTHER

    @staticmethod
    def _entries(config: dict) -> list[tuple[int, str, dict[str, str]]]:
        """The VM's vGPU entries: (slot, PCI address, options), in slot order."""
        found = []
        for key, value in config.items():
            slot = _HOSTPCI.fullmatch(key)
            if slot is None:
                continue
            address, options = _options(str(value))
            if options.get("mdev"):
                found.append((int(slot[1]), address, options))
        return sorted(found)

    def _devices(self, vmid: int, config: dict, names: dict[str, str]) -> list[VgpuDevice]:
        devices = []
        for slot, address, options in self._entries(config):
            if options.get("mapping") or not _PCI.fullmatch(address):
                # A cluster resource mapping: the node's mapping says which GPU it is, at start.
                devices.append(VgpuDevice(kind=DeviceKind.MDEV, id=mdev_uuid(vmid, slot), gpu_bus_id="",
                                          type_name=names.get(options["mdev"], options["mdev"])))
            elif _is_virtual_function(address):
                devices.append(VgpuDevice(kind=DeviceKind.VF, id=_bus_id(address), gpu_bus_id=_gpu_of(address),
                                          type_name=names.get(options["mdev"], options["mdev"])))
            else:
                devices.append(VgpuDevice(kind=DeviceKind.MDEV, id=mdev_uuid(vmid, slot), gpu_bus_id=_bus_id(address),
                                          type_name=names.get(options["mdev"], options["mdev"])))
        return devices

    def _domain(self, row: dict, config: dict, names: dict[str, str]) -> Domain:
        vmid = int(row["vmid"])
        return Domain(uuid=_smbios_uuid(config, vmid), name=str(config.get("name") or row.get("name") or vmid),
                      vcpus=_vcpus(config), ram_mib=_memory_mib(config), state=self._state(row),
                      vgpus=tuple(self._devices(vmid, config, names)))

    def _read_all(self) -> list[tuple[dict, dict]]:
        """(status row, configuration) of every VM of the node, templates left out."""
        found = []
        for row in self._rows():
            if int(row.get("template") or 0):
                continue
            config = self._config(int(row["vmid"]))
            if not int(config.get("template") or 0):
                found.append((row, config))
        return found

    def list_domains(self) -> list[Domain]:
        found = self._read_all()
        names = self._type_names(options["mdev"] for _, config in found for _, _, options in self._entries(config))
        domains = [self._domain(row, config, names) for row, config in found]
        return sorted(domains, key=lambda d: (d.name, d.uuid))

    def _lookup(self, uuid: str) -> tuple[int, dict]:
        """The VM id and configuration of the node's VM with that SMBIOS UUID, or DomainNotFound.
        The API finds VMs by id only: the id found last time is read first, and the node's VMs
        are read through only when it no longer answers with that UUID (moved, or renumbered)."""
        wanted = uuid.lower()
        known = self._vmids.get(wanted)
        if known is not None:
            with contextlib.suppress(HypervisorError):
                config = self._config(known)
                if _smbios_uuid(config, known) == wanted and not int(config.get("template") or 0):
                    return known, config
        for row, config in self._read_all():
            if _smbios_uuid(config, int(row["vmid"])) == wanted:
                self._vmids[wanted] = int(row["vmid"])
                return int(row["vmid"]), config
        raise DomainNotFound(f"There is no VM {uuid} on node {self._node}.")

    def domain(self, uuid: str) -> Domain:
        vmid, config = self._lookup(uuid)
        status = self._status(vmid)
        names = self._type_names(options["mdev"] for _, _, options in self._entries(config))
        return self._domain({**status, "vmid": vmid}, config, names)

    # Tasks and power -----------------------------------------------------------------------------

    # Guest figures -----------------------------------------------------------------------------

    def _started_with(self, vmid: int, pid: int) -> tuple[str, bool]:
        """The SMBIOS UUID of a running VM and whether it has a balloon device (`balloon: 0` takes
        it away), from its configuration, read once per start: both take effect only at a start,
        and each start runs a new QEMU process (its pid)."""
        key = (vmid, pid)
        if key not in self._started:
            config = self._config(vmid)
            self._started[key] = (_smbios_uuid(config, vmid), str(config.get("balloon", "")).strip() != "0")
        return self._started[key]

    def guest_counters(self) -> list[GuestCounters]:
        """The CPU and memory of every running VM of the node, from one call, the node's VM
        listing with `full=1` (a VM's configuration is read too the first time it is seen
        running, for its SMBIOS UUID):

        - vcpu_pct: `cpu`, the fraction of its vCPUs the VM used since the API's worker last
          looked (pvestatd and the API read it every 10 s or so);
        - ram_used_mib: the guest's total_mem - free_mem from `ballooninfo`, which QEMU's balloon
          device gives only while the guest runs the VirtIO balloon driver; otherwise None,
          never 0. The listing's `mem` is not used without it: that is the QEMU process's
          resident memory, which grows to all of the guest's RAM and never shrinks;
        - vcpu_max_pct and steal_pct: None. Proxmox VE's API reports neither a share per vCPU nor
          the time vCPUs waited for a host CPU (its `pressurecpusome` is the whole VM's cgroup
          pressure, which is not steal).

        A running VM whose listing carries no `ballooninfo` but that has a balloon device is
        asked for its status/current, which reads the balloon device itself."""
        action = f"read the guest figures of the VMs of {self._node}"
        rows = self._call(action, lambda api: api.nodes(self._node).qemu.get(full=1)) or []
        read_at_ns = time.time_ns()
        found = []
        for row in rows:
            if row.get("status") != "running" or int(row.get("template") or 0):
                continue
            vmid = int(row["vmid"])
            try:
                uuid, has_balloon = self._started_with(vmid, int(row.get("pid") or 0))
                info = row.get("ballooninfo")
                if info is None and has_balloon:
                    info = self._status(vmid).get("ballooninfo")
            except DomainNotFound:
                continue  # removed since the listing
            info = info or {}
            total, free = info.get("total_mem"), info.get("free_mem")
            known = total is not None and free is not None
            cpu = row.get("cpu")
            found.append(GuestCounters(
                uuid=uuid, read_at_ns=read_at_ns, vcpus=int(row.get("cpus") or 0),
                ram_mib=int(row.get("maxmem") or 0) // MIB,
                ram_used_mib=max(0, int(total) - int(free)) // MIB if known else None,
                ram_available_mib=int(total) // MIB if known else None,
                vcpu_pct=round(min(100.0, max(0.0, float(cpu)) * 100), 2) if cpu is not None else None))
        return sorted(found, key=lambda c: c.uuid)

    def _task_status(self, upid: str, action: str) -> dict:
        """A task's status as its node reports it (the node is named in the UPID)."""
        node = (_UPID.match(upid) or {"node": self._node})["node"]
        return self._call(action, lambda api: api.nodes(node).tasks(upid).status.get()) or {}

    def _wait(self, upid: object, action: str) -> None:
        """Wait for a task (its UPID); its exit status other than OK, or its running past
        TASK_TIMEOUT_S, is a HypervisorError."""
        if not isinstance(upid, str) or not upid.startswith("UPID:"):
            return  # done already: the API answered without a task
        deadline = time.monotonic() + TASK_TIMEOUT_S
        while True:
            status = self._task_status(upid, action)
            if status.get("status") == "stopped":
                exit_status = str(status.get("exitstatus", ""))
                if exit_status == "OK" or exit_status.startswith("WARNINGS"):
                    return
                raise HypervisorError(f"Proxmox VE ({self._target.where}) could not {action}: the task failed: "
                                      f"{exit_status or 'no reason given'}.")
            if time.monotonic() >= deadline:
                raise HypervisorError(f"Proxmox VE ({self._target.where}) did not {action} within "
                                      f"{TASK_TIMEOUT_S:g} s (task {upid} is still running).")
            time.sleep(TASK_POLL_S)

    def shutdown(self, uuid: str, timeout_s: float) -> None:
        vmid, config = self._lookup(uuid)
        name = config.get("name") or vmid
        deadline = time.monotonic() + max(timeout_s, 0.0)
        if self._state(self._status(vmid)) == PowerState.SHUT_OFF:
            return
        upid = self._shutdowns.get(vmid)
        if upid is None or self._task_ended(upid):
            # ACPI power button, or the guest agent where the VM has it; Proxmox VE gives up after `timeout`.
            upid = self._call(f"shut down {name}", lambda api: api.nodes(self._node).qemu(vmid).status.shutdown.post(
                timeout=max(1, math.ceil(timeout_s)), forceStop=0))
            self._shutdowns[vmid] = str(upid)
        while True:
            if self._state(self._status(vmid)) == PowerState.SHUT_OFF:
                self._shutdowns.pop(vmid, None)
                return
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                break
            time.sleep(min(SHUTDOWN_POLL_S, remaining))
        raise ShutdownTimeout(f"{name} on {self._node} did not power off within {timeout_s:g} s after the shutdown "
                              "request; it is left running.")

    def _task_ended(self, upid: str) -> bool:
        with contextlib.suppress(HypervisorError):
            return self._task_status(upid, "read a task").get("status") != "running"
        return True

    def start(self, uuid: str) -> None:
        vmid, config = self._lookup(uuid)
        name = config.get("name") or vmid
        if self._state(self._status(vmid)) == PowerState.RUNNING:
            return
        upid = self._call(f"start {name}", lambda api: api.nodes(self._node).qemu(vmid).status.start.post())
        try:
            self._wait(upid, f"start {name}")
        except HypervisorError as exc:
            # mdev layout: "... has no available instances of ..."; SR-IOV: "vgpu type 'N' not available for ...".
            if "no available instances" in str(exc) or re.search(r"vgpu type '[^']*' not available", str(exc)):
                raise NoInstanceAvailable(str(exc)) from None
            raise

    # vGPU types ------------------------------------------------------------------------------------

    def _offers(self) -> dict[tuple[str, str], dict]:
        """(GPU, type id) -> {"name", "available", "functions"}: what each GPU offers, over its
        functions (one in the mdev layout; its free virtual functions in the SR-IOV one)."""
        offers: dict[tuple[str, str], dict] = {}
        silent: dict[str, int] = {}  # GPU -> its virtual functions that list no type
        for row in self._gpu_functions():
            gpu = _gpu_of(row["id"])
            entries = self._mdev_types(row["id"])
            if not entries and _is_virtual_function(row["id"]):
                silent[gpu] = silent.get(gpu, 0) + 1
            for entry in entries:
                offer = offers.setdefault((gpu, entry["type"]), {"name": entry.get("name") or entry["type"],
                                                                 "available": 0, "functions": []})
                available = int(entry.get("available") or 0)
                offer["available"] += available
                if available:
                    offer["functions"].append(row["id"])
        for (gpu, _), offer in offers.items():
            # Each free VF lists a type the GPU has room for with "available: 1", so the sum counts
            # free VFs, not room. The room is NVIDIA's count of that size per GPU less the vGPUs
            # present: while the GPU offers a type, a VF that lists nothing is one holding a vGPU.
            most = _most_per_gpu(offer["name"])
            if most is not None and any(_is_virtual_function(pci) for pci in offer["functions"]):
                offer["available"] = max(0, min(offer["available"], most - silent.get(gpu, 0)))
        return offers

    def vgpu_types(self) -> list[VgpuType]:
        return _types(self._offers())

    def create_vgpu(self, gpu_bus_id: str, type_name: str, *, device_id: str = "") -> VgpuDevice:
        """Proxmox VE makes a vGPU when the VM that holds it starts: this checks that the GPU can
        take one of the type now and names the device, which `redefine` then writes into the VM."""
        bus = in_definition.gpu_bus_id(gpu_bus_id)
        offers = self._offers()
        match = in_definition.offered_type(
            _types(offers), bus, type_name, where=self._node,
            no_gpu=f"Node {self._node} has no NVIDIA GPU with vGPU types at {bus}.")
        offer = offers[(bus, match.type_id)]
        virtual = [pci for pci in offer["functions"] if _is_virtual_function(pci)]
        if virtual:
            held = {d.id for d in self.vgpu_devices() if d.kind == DeviceKind.VF}
            free = [pci for pci in virtual if _bus_id(pci) not in held]
            if not free:
                raise NoInstanceAvailable(f"Every virtual function of the GPU {bus} on {self._node} is in a VM's "
                                          "configuration already.")
            return VgpuDevice(kind=DeviceKind.VF, id=_bus_id(free[0]), gpu_bus_id=bus, type_name=offer["name"])
        new_id = str(uuidlib.UUID(device_id)) if device_id else str(uuidlib.uuid4())
        return VgpuDevice(kind=DeviceKind.MDEV, id=new_id, gpu_bus_id=bus, type_name=offer["name"])

    # Definitions -----------------------------------------------------------------------------------

    def _write(self, vmid: int, name: object, changes: dict, delete: list[str], digest: str) -> None:
        params = {key: value for key, value in changes.items()}
        if delete:
            params["delete"] = ",".join(delete)
        if digest:
            params["digest"] = digest  # refused if someone changed the VM since it was read
        action = f"reconfigure {name}"
        upid = self._call(action, lambda api: api.nodes(self._node).qemu(vmid).config.post(**params))
        self._wait(upid, action)

    def redefine(self, uuid: str, spec: DomainSpec) -> None:
        in_definition.check_spec(spec)
        vmid, config = self._lookup(uuid)
        name = config.get("name") or vmid
        names = self._type_names([d.type_name for d in spec.vgpus])
        current = {device.id.lower(): (slot, device) for (slot, _, _), device in
                   zip(self._entries(config), self._devices(vmid, config, names), strict=True)}
        wanted = {d.id.lower(): d for d in spec.vgpus}
        removed = [slot for device_id, (slot, _) in current.items() if device_id not in wanted]
        added = [d for device_id, d in wanted.items() if device_id not in current]
        running = self._state(self._status(vmid)) != PowerState.SHUT_OFF
        if (removed or added) and running:
            raise HypervisorError(f"{name} is running on {self._node}: Proxmox VE changes its vGPU devices only "
                                  "while it is stopped.")
        ids = {offer_name: type_id for type_id, offer_name in names.items()}
        taken = {int(m[1]) for key in config if (m := _HOSTPCI.fullmatch(key))} - set(removed)
        free = [slot for slot in range(MAX_HOSTPCI) if slot not in taken]
        if len(added) > len(free):
            raise HypervisorError(f"{name} has no free PCI slot for another vGPU (Proxmox VE allows {MAX_HOSTPCI}).")
        pcie = ",pcie=1" if "q35" in str(config.get("machine", "")) else ""
        changes: dict[str, object] = {}
        for slot, device in zip(free, added, strict=False):
            type_id = ids.get(device.type_name) or device.type_name
            address = device.id if device.kind == DeviceKind.VF else device.gpu_bus_id
            changes[f"hostpci{slot}"] = f"{pve_pci(address)},mdev={type_id}{pcie}"
        sockets = int(config.get("sockets") or 1)
        if spec.vcpus % sockets:
            sockets = 1  # the old shape does not divide the new count
        changes.update(sockets=sockets, cores=spec.vcpus // sockets, memory=spec.ram_mib)
        # Proxmox VE refuses to set and delete one key in one change: a slot given a new vGPU is just set.
        delete = [f"hostpci{slot}" for slot in removed if f"hostpci{slot}" not in changes]
        if config.get("vcpus"):
            delete.append("vcpus")  # every core runs: the count is the one asked for
        balloon = config.get("balloon")
        if balloon not in (None, "") and int(balloon) > spec.ram_mib:
            changes["balloon"] = spec.ram_mib  # Proxmox VE refuses a balloon target above the RAM
        self._write(vmid, name, changes, delete, str(config.get("digest", "")))

    def definition(self, uuid: str) -> str:
        vmid, config = self._lookup(uuid)
        kept = {key: config[key] for key in ("name", "cores", "sockets", "vcpus", "memory", "balloon") if key in config}
        kept.update({key: value for key, value in config.items() if _HOSTPCI.fullmatch(key)})
        return json.dumps({"uuid": _smbios_uuid(config, vmid), "vmid": vmid, "config": kept}, sort_keys=True)

    def restore(self, uuid: str, saved: str) -> None:
        data = in_definition.saved_definition(uuid, saved)
        if not isinstance(data.get("config"), dict):
            raise HypervisorError(f"The saved definition of {uuid} holds no Proxmox VE configuration; nothing was "
                                  "restored.")
        kept = data["config"]
        vmid, config = self._lookup(uuid)
        restorable = [key for key in config if _HOSTPCI.fullmatch(key)] + ["vcpus", "balloon"]
        delete = [key for key in restorable if key in config and key not in kept]
        changes = {key: value for key, value in kept.items() if key != "name" and config.get(key) != value}
        if changes or delete:
            self._write(vmid, config.get("name") or vmid, changes, delete, str(config.get("digest", "")))

    def move_to(self, uuid: str, target: Backend) -> None:
        if not isinstance(target, ProxmoxBackend) or target._node not in self._nodes:
            raise HypervisorError(f"A VM on {self._node} can only be moved to another node of the same Proxmox VE "
                                  f"cluster ({', '.join(self._nodes)}).")
        vmid, config = self._lookup(uuid)
        name = config.get("name") or vmid
        if self._state(self._status(vmid)) != PowerState.SHUT_OFF:
            raise HypervisorError(f"{name} is running on {self._node}: shut it down before moving it.")
        action = f"move {name} to {target._node}"
        upid = self._call(action, lambda api: api.nodes(self._node).qemu(vmid).migrate.post(target=target._node,
                                                                                             online=0))
        self._wait(upid, action)

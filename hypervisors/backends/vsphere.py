"""The VMware vSphere backend, on pyvmomi: one ESXi host, reached through its vCenter (or the host
itself).

URI: `vsphere://USER@VCENTER[:PORT]/?datacenter=DC&host=ESXI` (port 443 by default). `datacenter`
and `host` may be left out where there is only one; `insecure=1` skips the certificate check (a
lab), `cafile=/path/ca.pem` trusts that CA instead of the system's (HYPERVISOR_CA_FILE sets one
for every vSphere link). The password comes from `hypervisor_secret_ref`, as for libvirt.

What vSphere calls things here:
- a domain is a VM registered on the host (templates are not domains); its UUID is the BIOS
  UUID (`config.uuid`), which the guest and NVML see;
- a vGPU is a VirtualPCIPassthrough device whose backing is VmiopBackingInfo(vgpu="grid_t4-4q"):
  it lives in the VM's configuration, not on the host, and ESXi picks its physical GPU at power
  on (graphicsInfo lists the running VMs of each GPU). `create_vgpu` therefore only checks that
  the GPU can take the type and names the device; `redefine` adds it to the VM. The device's id
  and the GPU placement chose for it are kept in the VM's advanced settings
  (`vgpudash.vgpu.<device key> = "<id> <gpu>"`), so a device keeps its id across reads; a device
  added by hand gets an id derived from the VM and its device key;
- the host's vGPU types are `config.sharedPassthruGpuTypes` ("grid_t4-4q", "nvidia_l40s-12q"),
  named here as the driver does ("GRID T4-4Q", "NVIDIA L40S-12Q") so the catalog's profiles
  match them; how many more a GPU takes is worked out from its memory (graphicsInfo) and the
  vGPUs of the VMs it runs, as vSphere admits time-sliced vGPUs: one size per GPU unless the
  host runs it in mixed-size mode;
- a guest's CPU and memory (`guest_counters`) are what ESXi measures from outside the guest: the
  quick stats vCenter refreshes every 20 s (CPU used in MHz against the VM's entitlement of
  vCPUs x the host's core clock; active guest memory, trusted only while VMware Tools run) and
  the performance manager's last real-time sample (each vCPU's MHz, and the ready time its vCPUs
  spent waiting for a host CPU).

Every failure becomes a HypervisorError whose message says what was being done and why, in the
words an admin acts on (DNS, refused, TLS, credentials, permissions, the task's fault).
"""

from __future__ import annotations

import contextlib
import json
import logging
import re
import time
import uuid as uuidlib
from collections.abc import Iterable
from dataclasses import dataclass
from http.client import HTTPException
from urllib.parse import unquote

from pyVim import connect
from pyVmomi import vim, vmodl

from fleet.pci import InvalidPciBusId, normalize_pci_bus_id
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
    PowerState,
    ShutdownTimeout,
    Unreachable,
    VgpuDevice,
    VgpuType,
)
from hypervisors.backends.credentials import read_password, secret_path, shown

log = logging.getLogger(__name__)

SCHEME = "vsphere"
DEFAULT_PORT = 443
#: How long each SOAP call may take (connecting: `reach.CONNECT_TIMEOUT_S`).
CALL_TIMEOUT_S = 60.0
#: How long a vSphere task (power on, reconfigure, relocate) may run before the backend gives up on it.
TASK_TIMEOUT_S = 600.0
TASK_POLL_S = 0.2
SHUTDOWN_POLL_S = 0.25
EXTRA_PREFIX = "vgpudash.vgpu."
#: The privileges the product uses: reading, power, reconfiguring the vGPU devices, CPU, memory
#: and advanced settings, and a cold move.
PRIVILEGES = (
    "VirtualMachine.Interact.PowerOn", "VirtualMachine.Interact.PowerOff",
    "VirtualMachine.Config.AddRemoveDevice", "VirtualMachine.Config.CPUCount", "VirtualMachine.Config.Memory",
    "VirtualMachine.Config.AdvancedConfig", "Resource.ColdMigrate",
)
#: Ids derived for vGPU devices the product did not add (VM UUID and device key): stable across reads.
_DERIVED_IDS = uuidlib.UUID("2f0b8c52-6d0e-4c1e-9a57-7c1f3f0c9e21")
_TYPE = re.compile(r"(?P<vendor>[a-z]+)_(?P<profile>[a-z0-9]+(?:-[a-z0-9]+)+)", re.IGNORECASE)
_FB_GIB = re.compile(r"-(?P<gib>\d+)[a-z]$", re.IGNORECASE)

_STATES = {"poweredOn": PowerState.RUNNING, "poweredOff": PowerState.SHUT_OFF, "suspended": PowerState.PAUSED}
_VM_PATHS = ["name", "runtime.host", "runtime.powerState", "config.uuid", "config.template", "config.hardware.numCPU",
             "config.hardware.numCoresPerSocket", "config.hardware.memoryMB", "config.hardware.device",
             "config.extraConfig"]
_GUEST_PATHS = ["runtime.host", "runtime.powerState", "config.uuid", "config.template", "config.hardware.numCPU",
                "config.hardware.memoryMB", "summary.quickStats.overallCpuUsage",
                "summary.quickStats.guestMemoryUsage", "guest.toolsRunningStatus"]
#: The real-time statistics' sample interval, s (vSphere's fixed 20 s).
REALTIME_INTERVAL_S = 20
#: The performance counters `guest_counters` reads (group.name.rollup, as vSphere names them).
USAGE_MHZ_COUNTER = "cpu.usagemhz.average"
READY_COUNTER = "cpu.ready.summation"


# Names -------------------------------------------------------------------------------------------


def type_name(vsphere_type: str) -> str:
    """The driver's name of a vSphere vGPU type: "grid_t4-4q" -> "GRID T4-4Q",
    "nvidia_l40s-12q" -> "NVIDIA L40S-12Q"; a name of another shape is kept as it is."""
    match = _TYPE.fullmatch(vsphere_type.strip())
    if match is None:
        return vsphere_type
    return f"{match['vendor'].upper()} {match['profile'].upper()}"


def vsphere_type(name: str) -> str:
    """The inverse of `type_name`: "GRID T4-4Q" -> "grid_t4-4q"."""
    vendor, _, profile = name.strip().partition(" ")
    return f"{vendor.lower()}_{profile.lower()}" if profile else name.strip()


def framebuffer_gib(vsphere_type: str) -> int:
    """The frame buffer a type gives its VM, from its name ("grid_t4-4q": 4; "grid_a100-4-20c": 20); 0 unknown."""
    match = _FB_GIB.search(vsphere_type.strip())
    return int(match["gib"]) if match else 0


def _percent(part: float, whole: float) -> float | None:
    """`part` of `whole` in %, at most 100 (a turbo clock can lift usage past the nominal); None
    when there is no whole to measure against."""
    if whole <= 0 or part < 0:
        return None
    return round(min(100.0, 100.0 * part / whole), 2)


def _bus_id(pci_id: str) -> str:
    try:
        return normalize_pci_bus_id(pci_id)
    except InvalidPciBusId:
        return pci_id


# The link ----------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Target:
    """What a vsphere:// URI names."""

    server: str
    port: int
    user: str
    datacenter: str = ""
    host: str = ""
    insecure: bool = False
    cafile: str = ""

    @property
    def where(self) -> str:
        return f"{self.server}:{self.port}"


def parse_uri(uri: str) -> Target:
    read = reach.split_uri(uri, scheme=SCHEME, default_port=DEFAULT_PORT, kind="vSphere",
                           usage="vsphere://USER@VCENTER/?datacenter=DC&host=ESXI")
    if not read.parts.username:
        raise HypervisorError(f"{shown(uri)} names no user: vsphere://administrator@vsphere.local@VCENTER/... "
                              "(the password comes from the secret reference).")
    return Target(server=read.parts.hostname, port=read.port, user=unquote(read.parts.username),
                  datacenter=read.query.get("datacenter", ""), host=read.query.get("host", ""),
                  insecure=read.insecure, cafile=read.cafile)


def _fault_text(fault: BaseException) -> str:
    message = getattr(fault, "msg", "") or ""
    name = type(fault).__name__.rpartition(".")[2]
    return f"{name}: {message}" if message else name


def _pick(named: dict, wanted: str, *, place: str, what: str, param: str):
    """The object called `wanted` among `named` (object -> name), or the only one when none is
    wanted; Unreachable listing the names there are otherwise."""
    listed = ", ".join(sorted(named.values())) or "none"
    if wanted:
        match = next((obj for obj, name in named.items() if name == wanted), None)
        if match is None:
            raise Unreachable(f"{place} has no {what} {wanted!r} (it has: {listed}); fix {param}= in the URI.")
        return match
    if len(named) != 1:
        raise Unreachable(f"{place} has {len(named)} {what}s ({listed}): name one with {param}= in the URI.")
    return next(iter(named))


def _find_datacenter(content, target: Target) -> vim.Datacenter:
    named = {e: e.name for e in content.rootFolder.childEntity if isinstance(e, vim.Datacenter)}
    return _pick(named, target.datacenter, place=target.where, what="datacenter", param="datacenter")


def _find_host(content, datacenter: vim.Datacenter, target: Target) -> vim.HostSystem:
    view = content.viewManager.CreateContainerView(datacenter.hostFolder, [vim.HostSystem], True)
    try:
        named = {host: host.name for host in view.view}
    finally:
        with contextlib.suppress(vmodl.MethodFault, OSError):
            view.Destroy()
    return _pick(named, target.host, place=f"Datacenter {datacenter.name} on {target.where}", what="host",
                 param="host")


def _login_method(user: str, password: str):
    """What the session stub calls to log in, at first and whenever the session has expired (pyvmomi's
    own asks for the current session first, which a server may refuse without one)."""

    def login(stub) -> None:
        vim.ServiceInstance("ServiceInstance", stub).content.sessionManager.Login(user, password)

    return login


def _log_out(si) -> None:
    with contextlib.suppress(Exception):  # already broken or logged out: nothing left to release
        si.content.sessionManager.Logout()
    with contextlib.suppress(Exception):
        si._stub.DropConnections()


class VsphereBackend(in_definition.DevicesInDefinition):
    """One link to one ESXi host through vCenter (see the module docstring)."""

    def __init__(self, si: vim.ServiceInstance, uri: str, target: Target, datacenter: vim.Datacenter,
                 host: vim.HostSystem):
        self._si = si
        self._content = si.RetrieveContent()  # the service's managers: the same for the whole session
        self._uri = uri
        self._target = target
        self._datacenter = datacenter
        self._host_mo = host
        self._host_name = self._where_name = host.name
        self._host_cpu_mhz: int | None = None  # read once: a vCPU's full share in guest_counters
        self._counter_keys: dict[str, int] | None = None  # the performance counters' keys, read once

    @classmethod
    def open(cls, uri: str, *, secret_ref: str = "", devices: DeviceManager | None = None) -> VsphereBackend:
        """Log in to the vCenter `uri` names with the password `secret_ref` names; Unreachable
        saying what is wrong (DNS, refused, TLS, credentials, no such datacenter or host).
        `devices` is not used: vSphere makes a VM's vGPUs itself, at power on."""
        target = parse_uri(uri)
        if not secret_ref:
            raise Unreachable(f"{shown(uri)} needs a password: put it in a file in the secrets folder and name "
                              "that file as the host's secret reference.")
        password = read_password(secret_path(secret_ref, uri), secret_ref, uri)
        context = reach.ssl_context(target.where, insecure=target.insecure, cafile=target.cafile)
        reach.probe(target.server, target.port, context, service="vCenter", default_port=DEFAULT_PORT)
        try:
            stub = connect.SmartStubAdapter(host=target.server, port=target.port, sslContext=context,
                                            httpConnectionTimeout=CALL_TIMEOUT_S)
            login = _login_method(target.user, password)
            # Logs in again by itself when the session expires (vCenter ends idle ones after 30 min).
            session = connect.VimSessionOrientedStub(stub, login, retryDelay=0.2, retryCount=2)
            si = vim.ServiceInstance("ServiceInstance", session)
            content = si.RetrieveContent()
            content.sessionManager.currentSession  # noqa: B018 - the first call logs in
        except vim.fault.InvalidLogin:
            raise Unreachable(f"vCenter at {target.where} refused the credentials of {target.user}: check the user "
                              f"name in the URI and the password in {secret_ref!r}.") from None
        except vim.fault.NoPermission as exc:
            raise Unreachable(f"{target.user} may not sign in to {target.where} (no permission: "
                              f"{getattr(exc, 'privilegeId', '') or 'System.View'}).") from None
        except vmodl.MethodFault as exc:
            raise Unreachable(f"{target.where} refused the login: {_fault_text(exc)}.") from None
        except (OSError, Exception) as exc:  # noqa: BLE001 - pyvmomi raises bare Exception for "not a VIM server"
            raise Unreachable(f"{target.where} does not answer as vCenter or ESXi does: {exc}") from None
        try:
            datacenter = _find_datacenter(content, target)
            host = _find_host(content, datacenter, target)
        except HypervisorError:
            _log_out(si)
            raise
        except Exception as exc:  # noqa: BLE001
            _log_out(si)
            raise Unreachable(f"Could not read the inventory of {target.where}: {exc}") from None
        return cls(si, uri, target, datacenter, host)

    # Connection ------------------------------------------------------------------------------

    def _error(self, exc: BaseException, action: str) -> HypervisorError:
        """Our error for a pyvmomi one, naming the host and what was being done."""
        where = f"vSphere ({self._target.where})"
        if isinstance(exc, HypervisorError):
            return exc
        if isinstance(exc, vim.fault.NoPermission):
            return HypervisorError(f"{self._target.user} may not {action} on {where}: the role lacks the privilege "
                                   f"{getattr(exc, 'privilegeId', '') or '(unnamed)'}.")
        if isinstance(exc, vmodl.fault.ManagedObjectNotFound):
            return DomainNotFound(f"{where} could not {action}: the object is gone ({_fault_text(exc)}).")
        if isinstance(exc, vmodl.MethodFault):
            return HypervisorError(f"{where} could not {action}: {_fault_text(exc)}.")
        if isinstance(exc, (OSError, HTTPException)):
            return Unreachable(f"Lost the connection to {where} while trying to {action}: {exc}")
        return HypervisorError(f"{where} could not {action}: {type(exc).__name__}: {exc}")

    def check(self) -> ConnectionCheck:
        try:
            content = self._content
            about = content.about
            session = content.sessionManager.currentSession
            granted = content.authorizationManager.HasPrivilegeOnEntity(
                entity=self._host_mo, sessionId=session.key, privId=list(PRIVILEGES))
            gpus = [g for g in self._graphics() if g.vendorName and "nvidia" in g.vendorName.lower()]
        except Exception as exc:  # noqa: BLE001 - check() never raises
            return ConnectionCheck(ok=False, message=str(self._error(exc, "answer a check")))
        missing = [priv for priv, ok in zip(PRIVILEGES, granted or [], strict=False) if not ok]
        details = {"api_type": about.apiType, "api_version": about.apiVersion, "datacenter": self._datacenter.name,
                   "host": self._host_name, "uri": shown(self._uri), "nvidia_gpus": len(gpus)}
        if missing:
            return ConnectionCheck(
                ok=False, hypervisor_version=about.version, hostname=self._host_name, details=details,
                message=(f"Connected to {about.fullName} as {self._target.user}, but its role lacks the "
                         f"privileges {', '.join(missing)} on {self._host_name}: grant them (or a role that has "
                         "them) for the product's operations."))
        return ConnectionCheck(
            ok=True, hypervisor_version=about.version, hostname=self._host_name, details=details,
            message=(f"Connected to {about.fullName} as {self._target.user}: host {self._host_name} in "
                     f"datacenter {self._datacenter.name}, {len(gpus)} NVIDIA GPU(s) in shared direct mode"))

    def close(self) -> None:
        _log_out(self._si)

    # Reading ---------------------------------------------------------------------------------

    def _properties(self, objects: Iterable, kind: type, paths: list[str]) -> list[tuple[object, dict]]:
        """(object, {path: value}) of each object, in one round trip."""
        objects = list(objects)
        if not objects:
            return []
        collector = vmodl.query.PropertyCollector
        spec = collector.FilterSpec(objectSet=[collector.ObjectSpec(obj=o, skip=False) for o in objects],
                                    propSet=[collector.PropertySpec(type=kind, pathSet=paths)])
        found = self._content.propertyCollector.RetrieveContents([spec]) or []
        return [(item.obj, {p.name: p.val for p in item.propSet}) for item in found]

    def _host_config(self) -> tuple[list, list[str]]:
        """The host's GPUs (graphicsInfo) and the vGPU types it offers, in one round trip."""
        rows = self._properties([self._host_mo], vim.HostSystem,
                                ["config.graphicsInfo", "config.sharedPassthruGpuTypes"])
        props = rows[0][1] if rows else {}
        return list(props.get("config.graphicsInfo") or []), list(props.get("config.sharedPassthruGpuTypes") or [])

    def _graphics(self) -> list:
        return self._host_config()[0]

    def _offered(self) -> list[str]:
        return self._host_config()[1]

    def _datacenter_vm_rows(self, paths: list[str] = _VM_PATHS) -> list[tuple[object, dict]]:
        """Every VM of the datacenter with its properties `paths`, in one round trip (through a
        container view)."""
        view = self._content.viewManager.CreateContainerView(self._datacenter.vmFolder, [vim.VirtualMachine], True)
        try:
            collector = vmodl.query.PropertyCollector
            traversal = collector.TraversalSpec(name="view", path="view", skip=False, type=vim.view.ContainerView)
            spec = collector.FilterSpec(objectSet=[collector.ObjectSpec(obj=view, skip=True, selectSet=[traversal])],
                                        propSet=[collector.PropertySpec(type=vim.VirtualMachine, pathSet=paths)])
            found = self._content.propertyCollector.RetrieveContents([spec]) or []
        finally:
            with contextlib.suppress(vmodl.MethodFault, OSError):
                view.Destroy()
        return [(item.obj, {p.name: p.val for p in item.propSet}) for item in found]

    def _vm_rows(self, vms: Iterable | None = None) -> list[tuple[object, dict]]:
        """The VMs `vms` (default: those the host runs, by their runtime.host), templates left out."""
        if vms is None:
            rows = [(vm, props) for vm, props in self._datacenter_vm_rows()
                    if getattr(props.get("runtime.host"), "_moId", None) == self._host_mo._moId]
        else:
            rows = self._properties(vms, vim.VirtualMachine, _VM_PATHS)
        return [(vm, props) for vm, props in rows if props.get("config.uuid") and not props.get("config.template")]

    @staticmethod
    def _extra(props: dict) -> dict[str, str]:
        """The VM's advanced settings, the last value of a key winning, empty values left out."""
        values: dict[str, str] = {}
        for option in props.get("config.extraConfig") or []:
            values[option.key] = "" if option.value is None else str(option.value)
        return {key: value for key, value in values.items() if value}

    @staticmethod
    def _vgpu_devices(props: dict) -> list:
        return [d for d in props.get("config.hardware.device") or []
                if isinstance(d, vim.vm.device.VirtualPCIPassthrough)
                and isinstance(d.backing, vim.vm.device.VirtualPCIPassthrough.VmiopBackingInfo)]

    def _placements(self) -> dict[str, list[str]]:
        """Per VM (managed object id), the GPUs graphicsInfo lists it on (running VMs)."""
        placed: dict[str, list[str]] = {}
        for gpu in self._graphics():
            for vm in gpu.vm or []:
                placed.setdefault(vm._moId, []).append(_bus_id(gpu.pciId))
        return placed

    def _devices_of(self, vm, props: dict, placements: dict[str, list[str]]) -> list[VgpuDevice]:
        uuid = props["config.uuid"].lower()
        extra = self._extra(props)
        on_gpus = list(placements.get(vm._moId, [])) if props.get("runtime.powerState") == "poweredOn" else []
        devices = []
        for device in sorted(self._vgpu_devices(props), key=lambda d: d.key):
            recorded_id, _, recorded_gpu = extra.get(f"{EXTRA_PREFIX}{device.key}", "").partition(" ")
            device_id = recorded_id or str(uuidlib.uuid5(_DERIVED_IDS, f"{uuid}/{device.key}"))
            if recorded_gpu and recorded_gpu in on_gpus:
                gpu = recorded_gpu
            elif on_gpus:
                gpu = on_gpus[0]
            else:
                gpu = recorded_gpu
            if gpu in on_gpus:
                on_gpus.remove(gpu)
            devices.append(VgpuDevice(kind=DeviceKind.VMIOP, id=device_id.lower(), gpu_bus_id=gpu,
                                      type_name=type_name(device.backing.vgpu or "")))
        return devices

    def _domain(self, vm, props: dict, placements: dict[str, list[str]]) -> Domain:
        return Domain(uuid=props["config.uuid"].lower(), name=props.get("name", ""),
                      vcpus=int(props.get("config.hardware.numCPU") or 0),
                      ram_mib=int(props.get("config.hardware.memoryMB") or 0),
                      state=_STATES.get(str(props.get("runtime.powerState")), PowerState.OTHER),
                      vgpus=tuple(self._devices_of(vm, props, placements)))

    def list_domains(self) -> list[Domain]:
        try:
            placements = self._placements()
            domains = [self._domain(vm, props, placements) for vm, props in self._vm_rows()]
        except Exception as exc:  # noqa: BLE001 - pyvmomi's faults and the network's errors, said in words
            raise self._error(exc, f"list the VMs of {self._host_name}") from None
        return sorted(domains, key=lambda d: (d.name, d.uuid))

    def _lookup(self, uuid: str) -> tuple[object, dict]:
        try:
            vm = self._content.searchIndex.FindByUuid(datacenter=self._datacenter, uuid=uuid, vmSearch=True,
                                                      instanceUuid=False)
            rows = self._vm_rows([vm]) if vm is not None else []
        except Exception as exc:  # noqa: BLE001
            raise self._error(exc, f"look up VM {uuid}") from None
        if not rows or getattr(rows[0][1].get("runtime.host"), "_moId", None) != self._host_mo._moId:
            raise DomainNotFound(f"There is no VM {uuid} on {self._host_name}.")
        return rows[0]

    def domain(self, uuid: str) -> Domain:
        vm, props = self._lookup(uuid)
        try:
            return self._domain(vm, props, self._placements())
        except Exception as exc:  # noqa: BLE001
            raise self._error(exc, f"read VM {uuid}") from None

    # Guest figures -----------------------------------------------------------------------------

    def _cpu_mhz(self) -> int:
        """The host's core clock (summary.hardware.cpuMhz): what one vCPU busy all the time uses."""
        if self._host_cpu_mhz is None:
            rows = self._properties([self._host_mo], vim.HostSystem, ["summary.hardware.cpuMhz"])
            self._host_cpu_mhz = int((rows[0][1] if rows else {}).get("summary.hardware.cpuMhz") or 0)
        return self._host_cpu_mhz

    def _counters(self) -> dict[str, int]:
        """The keys of the performance counters `guest_counters` reads, by name: each vCenter
        numbers its counters itself, so they are looked up by name, once per link."""
        if self._counter_keys is None:
            wanted = {USAGE_MHZ_COUNTER, READY_COUNTER}
            keys = {}
            for info in self._content.perfManager.perfCounter or []:
                name = f"{info.groupInfo.key}.{info.nameInfo.key}.{info.rollupType}"
                if name in wanted:
                    keys[name] = info.key
            self._counter_keys = keys
        return self._counter_keys

    def _realtime(self, vms: list[tuple[object, int]]) -> dict[str, tuple[list[int], int | None, int]]:
        """Per VM (managed object id): the last real-time sample of each vCPU's MHz, its vCPUs'
        ready time (ms, all together) and the sample's length (s), in one QueryPerf call for the
        VMs `vms` (VM, vCPUs). A VM without a sample yet (just powered on) is left out."""
        keys = self._counters()
        usage, ready = keys.get(USAGE_MHZ_COUNTER), keys.get(READY_COUNTER)
        specs = []
        for vm, vcpus in vms:
            metrics = [vim.PerformanceManager.MetricId(counterId=usage, instance=str(index))
                       for index in range(vcpus)] if usage is not None else []
            if ready is not None:
                metrics.append(vim.PerformanceManager.MetricId(counterId=ready, instance=""))
            if metrics:
                specs.append(vim.PerformanceManager.QuerySpec(entity=vm, metricId=metrics,
                                                              intervalId=REALTIME_INTERVAL_S, maxSample=1))
        if not specs:
            return {}
        samples = {}
        for entity in self._content.perfManager.QueryPerf(querySpec=specs) or []:
            if not entity.sampleInfo:
                continue
            interval_s = int(entity.sampleInfo[-1].interval or REALTIME_INTERVAL_S)
            vcpu_mhz, ready_ms = [], None
            for series in entity.value or []:
                value = series.value[-1] if series.value else -1
                if value < 0:
                    continue  # vSphere's -1: no value in this sample
                if series.id.counterId == usage and series.id.instance:
                    vcpu_mhz.append(int(value))
                elif series.id.counterId == ready and not series.id.instance:
                    ready_ms = int(value)
            samples[entity.entity._moId] = (vcpu_mhz, ready_ms, interval_s)
        return samples

    def guest_counters(self) -> list[GuestCounters]:
        """The CPU and memory of every powered-on VM of the host, as ESXi sees them from outside
        the guest: the VM's properties in one PropertyCollector round trip, then one QueryPerf.

        - vcpu_pct: quickStats.overallCpuUsage (MHz) of the VM's entitlement, its vCPUs x the
          host's core clock (the quick stats cover the last 20 s);
        - vcpu_max_pct: the busiest vCPU's MHz (real-time counter cpu.usagemhz.average, one
          instance per vCPU) of the core clock;
        - steal_pct: ready time (cpu.ready.summation, ms over the 20 s sample, all vCPUs
          together) of the sample's length x vCPUs: time the vCPUs were ready to run but waited
          for a host CPU;
        - ram_used_mib: quickStats.guestMemoryUsage, the guest's active memory (MB) ESXi
          estimates, only while VMware Tools run in the guest (guest.toolsRunningStatus); without
          them the memory is unknown (None), never 0. Active memory is what the guest touched
          lately, less than what it has in use, so it reads low rather than high.

        A figure the host does not give (no quick stats yet, no real-time sample, the
        performance manager refusing the query) is None; the others are still given."""
        action = f"read the guest figures of the VMs of {self._host_name}"
        try:
            mhz = self._cpu_mhz()
            rows = [(vm, props) for vm, props in self._datacenter_vm_rows(_GUEST_PATHS)
                    if getattr(props.get("runtime.host"), "_moId", None) == self._host_mo._moId
                    and props.get("runtime.powerState") == "poweredOn"
                    and props.get("config.uuid") and not props.get("config.template")]
        except Exception as exc:  # noqa: BLE001
            raise self._error(exc, action) from None
        read_at_ns = time.time_ns()
        vcpus_of = {vm._moId: int(props.get("config.hardware.numCPU") or 0) for vm, props in rows}
        try:
            samples = self._realtime([(vm, vcpus_of[vm._moId]) for vm, _ in rows])
        except (vmodl.MethodFault, OSError, HTTPException) as exc:
            # The quick stats still say the most; the busiest vCPU and ready time wait for the next reading.
            log.warning("%s gave no real-time CPU samples for %s: %s", self._target.where, self._host_name,
                        _fault_text(exc) if isinstance(exc, vmodl.MethodFault) else exc)
            samples = {}
        except Exception as exc:  # noqa: BLE001
            raise self._error(exc, action) from None
        found = []
        for vm, props in rows:
            vcpus = vcpus_of[vm._moId]
            used_mhz = props.get("summary.quickStats.overallCpuUsage")
            vcpu_pct = _percent(used_mhz, vcpus * mhz) if used_mhz is not None else None
            vcpu_mhz, ready_ms, interval_s = samples.get(vm._moId, ([], None, REALTIME_INTERVAL_S))
            vcpu_max_pct = _percent(max(vcpu_mhz), mhz) if vcpu_mhz else None
            steal_pct = _percent(ready_ms, interval_s * 1000 * vcpus) if ready_ms is not None else None
            tools = props.get("guest.toolsRunningStatus") == "guestToolsRunning"
            active_mb = props.get("summary.quickStats.guestMemoryUsage")
            found.append(GuestCounters(
                uuid=props["config.uuid"].lower(), read_at_ns=read_at_ns, vcpus=vcpus,
                ram_mib=int(props.get("config.hardware.memoryMB") or 0),
                ram_used_mib=int(active_mb) if tools and active_mb is not None else None,
                vcpu_pct=vcpu_pct, vcpu_max_pct=vcpu_max_pct, steal_pct=steal_pct))
        return sorted(found, key=lambda c: c.uuid)

    # Power -----------------------------------------------------------------------------------

    def _wait(self, task, action: str) -> None:
        """Wait for a vSphere task; its fault, or its running past TASK_TIMEOUT_S, is a HypervisorError."""
        deadline = time.monotonic() + TASK_TIMEOUT_S
        try:
            while True:
                info = task.info
                if info.state == vim.TaskInfo.State.success:
                    return
                if info.state == vim.TaskInfo.State.error:
                    fault = info.error
                    raise HypervisorError(f"vSphere ({self._target.where}) could not {action}: the task failed with "
                                          f"{_fault_text(fault) if fault is not None else 'no reason given'}.")
                if time.monotonic() >= deadline:
                    raise HypervisorError(f"vSphere ({self._target.where}) did not {action} within "
                                          f"{TASK_TIMEOUT_S:g} s (task {task._moId} is still {info.state}).")
                time.sleep(TASK_POLL_S)
        except HypervisorError:
            raise
        except Exception as exc:  # noqa: BLE001
            raise self._error(exc, action) from None

    def _state(self, vm) -> str:
        return str(self._properties([vm], vim.VirtualMachine, ["runtime.powerState"])[0][1]["runtime.powerState"])

    def shutdown(self, uuid: str, timeout_s: float) -> None:
        vm, props = self._lookup(uuid)
        name = props.get("name", uuid)
        deadline = time.monotonic() + max(timeout_s, 0.0)
        try:
            if self._state(vm) == "poweredOff":
                return
            try:
                vm.ShutdownGuest()  # VMware Tools ask the guest OS to shut down cleanly
            except vim.fault.ToolsUnavailable:
                raise ShutdownTimeout(f"{name} on {self._host_name} has no running VMware Tools, so its guest cannot "
                                      "be asked to shut down; it is left running.") from None
            except vim.fault.InvalidPowerState:
                if self._state(vm) == "poweredOff":
                    return
                raise
            while True:
                if self._state(vm) == "poweredOff":
                    return
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    break
                time.sleep(min(SHUTDOWN_POLL_S, remaining))
        except HypervisorError:
            raise
        except Exception as exc:  # noqa: BLE001
            raise self._error(exc, f"shut down {name}") from None
        raise ShutdownTimeout(f"{name} on {self._host_name} did not power off within {timeout_s:g} s after the "
                              "shutdown request; it is left running.")

    def start(self, uuid: str) -> None:
        vm, props = self._lookup(uuid)
        name = props.get("name", uuid)
        try:
            if self._state(vm) == "poweredOn":
                return
            task = vm.PowerOnVM_Task()
        except Exception as exc:  # noqa: BLE001
            raise self._error(exc, f"start {name}") from None
        self._wait(task, f"start {name}")

    # vGPU types --------------------------------------------------------------------------------

    def vgpu_types(self) -> list[VgpuType]:
        try:
            graphics, offered = self._host_config()
            gpus = [g for g in graphics if (g.vendorName or "").lower().startswith("nvidia")
                    and g.graphicsType in ("sharedDirect", "shared")]
            used = self._used_by_gpu()
        except Exception as exc:  # noqa: BLE001
            raise self._error(exc, f"read the vGPU types of {self._host_name}") from None
        types = []
        for gpu in gpus:
            bus = _bus_id(gpu.pciId)
            own = [t for t in offered if self._fits_model(t, gpu.deviceName or "")] or offered
            total_gib = (gpu.memorySizeInKB or 0) // (1024 * 1024)
            held = used.get(bus, [])
            mixed = getattr(gpu, "vgpuMode", "") == "mixedSize"
            for vtype in own:
                fb = framebuffer_gib(vtype)
                if not fb:
                    available = 0
                elif held and not mixed and any(t != vtype for t in held):
                    available = 0  # time-sliced vGPU: one size per GPU
                else:
                    available = max(0, (total_gib - sum(framebuffer_gib(t) for t in held)) // fb)
                types.append(VgpuType(gpu_bus_id=bus, type_id=vtype, name=type_name(vtype), available=available))
        return sorted(types, key=lambda t: (t.gpu_bus_id, framebuffer_gib(t.type_id), t.name))

    @staticmethod
    def _fits_model(vtype: str, device_name: str) -> bool:
        """Whether a type ("grid_t4-4q") is of the GPU named `device_name` ("TU104GL [Tesla T4]")."""
        match = _TYPE.fullmatch(vtype)
        if match is None:
            return False
        model = match["profile"].split("-")[0].lower()
        return model in re.findall(r"[a-z0-9]+", device_name.lower())

    def _used_by_gpu(self) -> dict[str, list[str]]:
        """Per GPU, the vSphere types of the vGPUs running on it (graphicsInfo lists their VMs)."""
        placements = self._placements()
        listed = {}
        for gpu in self._graphics():
            for vm in gpu.vm or []:
                listed[vm._moId] = vm
        used: dict[str, list[str]] = {}
        for vm, props in self._vm_rows(listed.values()):
            if props.get("runtime.powerState") != "poweredOn":
                continue  # a VM that is off holds no GPU: ESXi places its vGPU again at power on
            for device in self._devices_of(vm, props, placements):
                if device.gpu_bus_id:
                    used.setdefault(device.gpu_bus_id, []).append(vsphere_type(device.type_name))
        return used

    def create_vgpu(self, gpu_bus_id: str, type_name: str, *, device_id: str = "") -> VgpuDevice:
        """vSphere makes a vGPU when the VM that holds it powers on: this checks that the GPU can
        take one of the type now and names the device, which `redefine` then adds to the VM."""
        bus = in_definition.gpu_bus_id(gpu_bus_id)
        match = in_definition.offered_type(
            self.vgpu_types(), bus, type_name, where=self._host_name,
            no_gpu=f"{self._host_name} has no vGPU-capable GPU at {bus} (graphicsInfo lists none in shared direct "
                   "mode).")
        new_id = str(uuidlib.UUID(device_id)) if device_id else str(uuidlib.uuid4())
        return VgpuDevice(kind=DeviceKind.VMIOP, id=new_id, gpu_bus_id=bus, type_name=match.name)

    # Definitions -------------------------------------------------------------------------------

    def _reconfigure(self, vm, spec: vim.vm.ConfigSpec, action: str) -> None:
        try:
            task = vm.ReconfigVM_Task(spec=spec)
        except Exception as exc:  # noqa: BLE001
            raise self._error(exc, action) from None
        self._wait(task, action)

    def redefine(self, uuid: str, spec: DomainSpec) -> None:
        in_definition.check_spec(spec)
        vm, props = self._lookup(uuid)
        name = props.get("name", uuid)
        current = {d.id: (raw, d) for raw, d in zip(sorted(self._vgpu_devices(props), key=lambda d: d.key),
                                                    self._devices_of(vm, props, {}), strict=True)}
        wanted = {d.id.lower(): d for d in spec.vgpus}
        removed = [raw for device_id, (raw, _) in current.items() if device_id not in wanted]
        added = [d for device_id, d in wanted.items() if device_id not in current]
        if (removed or added) and props.get("runtime.powerState") != "poweredOff":
            raise HypervisorError(f"{name} is running on {self._host_name}: vSphere changes its vGPU devices only "
                                  "while it is powered off.")
        offered = {type_name(t): t for t in self._offered()}
        changes = [vim.vm.device.VirtualDeviceSpec(operation=vim.vm.device.VirtualDeviceSpec.Operation.remove,
                                                   device=raw) for raw in removed]
        for index, device in enumerate(added):
            vtype = offered.get(device.type_name) or vsphere_type(device.type_name)
            backing = vim.vm.device.VirtualPCIPassthrough.VmiopBackingInfo(vgpu=vtype)
            changes.append(vim.vm.device.VirtualDeviceSpec(
                operation=vim.vm.device.VirtualDeviceSpec.Operation.add,
                device=vim.vm.device.VirtualPCIPassthrough(key=-(100 + index), backing=backing)))
        config = vim.vm.ConfigSpec(numCPUs=spec.vcpus, memoryMB=spec.ram_mib, deviceChange=changes)
        cores = int(props.get("config.hardware.numCoresPerSocket") or 1)
        if spec.vcpus % cores:
            config.numCoresPerSocket = 1  # the old shape does not divide the new count
        if spec.vgpus:
            config.memoryReservationLockedToMax = True  # vSphere powers on a vGPU VM only with all its RAM reserved
        # Settings of devices that are going away are cleared in the same change.
        extra = self._extra(props)
        kept = {raw.key for device_id, (raw, _) in current.items() if device_id in wanted}
        config.extraConfig = [vim.option.OptionValue(key=f"{EXTRA_PREFIX}{raw.key}", value="")
                              for raw in removed if f"{EXTRA_PREFIX}{raw.key}" in extra]
        self._reconfigure(vm, config, f"reconfigure {name}")
        if not added:
            return
        # The keys vSphere gave the new devices are known only now: their ids are recorded after.
        vm, props = self._lookup(uuid)
        fresh = [raw for raw in sorted(self._vgpu_devices(props), key=lambda d: d.key) if raw.key not in kept]
        options = []
        pending = list(added)
        for raw in fresh:
            device = next((d for d in pending if vsphere_type(d.type_name) == raw.backing.vgpu
                           or offered.get(d.type_name) == raw.backing.vgpu), None)
            if device is None:
                continue
            pending.remove(device)
            options.append(vim.option.OptionValue(key=f"{EXTRA_PREFIX}{raw.key}",
                                                  value=f"{device.id} {device.gpu_bus_id}".strip()))
        if options:
            self._reconfigure(vm, vim.vm.ConfigSpec(extraConfig=options), f"record the vGPU devices of {name}")

    def definition(self, uuid: str) -> str:
        vm, props = self._lookup(uuid)
        devices = self._devices_of(vm, props, {})
        return json.dumps({
            "uuid": props["config.uuid"].lower(), "name": props.get("name", ""),
            "vcpus": int(props.get("config.hardware.numCPU") or 0),
            "ram_mib": int(props.get("config.hardware.memoryMB") or 0),
            "vgpus": [{"id": d.id, "gpu_bus_id": d.gpu_bus_id, "type_name": d.type_name} for d in devices],
        }, sort_keys=True)

    def restore(self, uuid: str, saved: str) -> None:
        data = in_definition.saved_definition(uuid, saved)
        vgpus = tuple(VgpuDevice(kind=DeviceKind.VMIOP, id=row["id"], gpu_bus_id=row.get("gpu_bus_id", ""),
                                 type_name=row.get("type_name", "")) for row in data.get("vgpus", []))
        self.redefine(uuid, DomainSpec(vcpus=int(data["vcpus"]), ram_mib=int(data["ram_mib"]), vgpus=vgpus))

    def move_to(self, uuid: str, target: Backend) -> None:
        if not isinstance(target, VsphereBackend) or target._target.where != self._target.where:
            raise HypervisorError(f"A VM on {self._host_name} can only be moved to another host of the same vCenter "
                                  f"({self._target.where}).")
        vm, props = self._lookup(uuid)
        name = props.get("name", uuid)
        if props.get("runtime.powerState") != "poweredOff":
            raise HypervisorError(f"{name} is running on {self._host_name}: shut it down before moving it.")
        try:
            # The target's own session names its host; this session's objects are the same ones.
            host = vim.HostSystem(target._host_mo._moId, self._si._stub)
            pool = host.parent.resourcePool
            task = vm.RelocateVM_Task(spec=vim.vm.RelocateSpec(host=host, pool=pool))
        except Exception as exc:  # noqa: BLE001
            raise self._error(exc, f"move {name} to {target._host_name}") from None
        self._wait(task, f"move {name} to {target._host_name}")

"""Three-way drift: what the inventory believes, what each host's hypervisor said when it was last
read, and what the agents read lately, compared per VM and GPU. Pure: no ORM.

`find_drift(snapshot)` takes plain rows (`Snapshot`, built by `hypervisors.drift_queries` in a
fixed number of queries) and answers one `Drift` per disagreement, worded for the IT admin who
acts on it, with the three views side by side and what to do. Why three views and not two: the
third one tells which of the other two is wrong. A vGPU the hypervisor has on GPU X and the
inventory on GPU Y is an out-of-date inventory when the agent reads it on X, and an old read of
the hypervisor when the agent reads it on Y. Where the agent reports a vGPU's mdev UUID
(`Vgpu.reported_device_id`), devices are compared by id as well: the driver's word on which
device runs.

The hypervisor's view is its last successful read (`SyncReport`), never a live call: a page
must not wait on a host. A read older than an operation that changed the VM is not compared
(the admin is asked to read again); the agent's readings from before that operation ended are
left out too, so a VM that just moved is not reported on its old GPU. A VM that an operation is
changing (pending or running) is reported as such and nothing else: its views differ on purpose.

Licence state is not compared: neither the inventory nor telemetry records it (the agent does
not report NVML's vGPU licence status, and no model stores it).
"""

from __future__ import annotations

import uuid as uuid_lib
from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, field
from datetime import datetime


class Severity:
    CRITICAL = "critical"  # the inventory's capacity is wrong: placement may promise what is taken
    WARNING = "warning"  # an artist may be affected, or a view cannot be trusted
    INFO = "info"  # bookkeeping, or nothing to judge yet

    ORDER = (CRITICAL, WARNING, INFO)
    CHOICES = ((CRITICAL, "Critical"), (WARNING, "Warning"), (INFO, "Info"))


class Kind:
    UNKNOWN_VM = "unknown_vm"
    UNKNOWN_DEVICE = "unknown_device"
    MISSING_DEVICE = "missing_device"
    GPU_MISMATCH = "gpu_mismatch"
    PROFILE_MISMATCH = "profile_mismatch"
    DEVICE_ID = "device_id"
    MISSING_DOMAIN = "missing_domain"
    ELSEWHERE = "elsewhere"
    AGENT_OLD_GPU = "agent_old_gpu"
    AGENT_OTHER_HOST = "agent_other_host"
    AGENT_DEVICE = "agent_device"
    AGENT_SILENT = "agent_silent"
    IN_OPERATION = "in_operation"
    STALE_READ = "stale_read"
    UNREAD = "hypervisor_unread"

    CHOICES = (
        (UNKNOWN_VM, "VM unknown to the inventory"),
        (UNKNOWN_DEVICE, "vGPU unknown to the inventory"),
        (MISSING_DEVICE, "vGPU missing on the hypervisor"),
        (GPU_MISMATCH, "vGPU on another GPU"),
        (PROFILE_MISMATCH, "vGPU of another profile"),
        (DEVICE_ID, "device id not recorded"),
        (MISSING_DOMAIN, "VM missing on the hypervisor"),
        (ELSEWHERE, "VM on another host"),
        (AGENT_OLD_GPU, "agent reports another GPU"),
        (AGENT_OTHER_HOST, "agent reports another host"),
        (AGENT_DEVICE, "agent reports another device"),
        (AGENT_SILENT, "no telemetry"),
        (IN_OPERATION, "being changed by an operation"),
        (STALE_READ, "hypervisor read before the last change"),
        (UNREAD, "hypervisor not read"),
    )
    LABELS = dict(CHOICES)


class Do:
    """What the admin does about a drift (`Action.code`)."""

    SYNC_AND_APPLY = "sync_and_apply"  # read the hypervisor and apply its diff (host page)
    SYNC = "sync"  # read the hypervisor again: the last read is old
    CHECK_AGENT = "check_agent"
    FIX_HYPERVISOR = "fix_hypervisor"  # the inventory is right: change the domain by hand
    FIX_INVENTORY = "fix_inventory"  # the hypervisor is right: correct the inventory
    FOLLOW_OPERATION = "follow_operation"


# Input ------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class HostRow:
    """A host, its hypervisor link and its last read. `read_at`: the last successful read (None:
    never read); `read_error`: why the newest read failed ("" when it did not)."""

    id: int
    name: str
    linked: bool
    read_at: datetime | None = None
    read_error: str = ""
    has_agent: bool = False  # an enabled agent is bound to the host


@dataclass(frozen=True)
class GpuRow:
    id: int
    host_id: int
    bus_id: str  # fleet.pci form, as the hypervisor's devices name their GPU


@dataclass(frozen=True)
class VgpuRow:
    """An inventory vGPU. `reported_device_id`: the mdev UUID the host agent last reported for it
    ("" where none was), `reported_device_at` when that value last changed."""

    id: int
    gpu_id: int
    profile: str
    device_id: str = ""
    reported_device_id: str = ""
    reported_device_at: datetime | None = None


@dataclass(frozen=True)
class VmRow:
    id: int
    uuid: str  # lower case, with dashes
    name: str
    host_id: int | None
    vgpus: tuple[VgpuRow, ...] = ()
    guest_agent: bool = False  # an enabled in-guest agent pushes this VM's readings


@dataclass(frozen=True)
class DeviceRow:
    """A vGPU device of a domain, as the last read found it."""

    device_id: str
    gpu_bus_id: str
    profile: str | None  # the catalog profile its type matched; None: none matched
    type_name: str = ""


@dataclass(frozen=True)
class DomainRow:
    host_id: int
    uuid: str
    name: str
    state: str  # hypervisors.backends.base.PowerState
    devices: tuple[DeviceRow, ...] = ()


@dataclass(frozen=True)
class Reading:
    """The agent read a vGPU of the VM on the GPU lately; `last_seen` is the newest reading."""

    vm_id: int
    gpu_id: int
    last_seen: datetime


@dataclass(frozen=True)
class OperationRow:
    """An operation that is under way (status pending or running, `finished_at` None) or ended
    recently; `host_ids` are the hosts it works on (source and target)."""

    id: int
    vm_id: int
    status: str
    finished_at: datetime | None
    host_ids: tuple[int, ...] = ()

    @property
    def active(self) -> bool:
        return self.finished_at is None and self.status in ("pending", "running")


@dataclass(frozen=True)
class Snapshot:
    now: datetime
    window_s: float  # how far back a reading counts as "lately"
    hosts: tuple[HostRow, ...]
    gpus: tuple[GpuRow, ...]
    vms: tuple[VmRow, ...]
    domains: tuple[DomainRow, ...] = ()
    readings: tuple[Reading, ...] = ()
    gpus_reporting: frozenset[int] = frozenset()  # GPUs with a GPU sample in the window
    operations: tuple[OperationRow, ...] = ()


# Output -----------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Action:
    code: str  # Do
    text: str
    host_id: int | None = None  # whose page the admin goes to (sync, agents)
    operation_id: int | None = None


@dataclass(frozen=True)
class Drift:
    """One disagreement between the views, about one VM (and one of its GPUs where it is about a
    vGPU), or about a host's hypervisor as a whole (`vm_id` None, `kind` hypervisor_unread)."""

    kind: str
    severity: str
    message: str
    action: Action
    host_id: int | None
    host_name: str
    inventory: str
    hypervisor: str
    telemetry: str
    vm_id: int | None = None
    vm_name: str = ""
    vm_uuid: str = ""
    gpu_id: int | None = None
    gpu_bus_id: str = ""
    other_host_id: int | None = None  # the second host of a VM found on two
    other_host_name: str = ""

    @property
    def kind_label(self) -> str:
        return Kind.LABELS[self.kind]

    def as_dict(self) -> dict:
        return {**asdict(self), "kind_label": self.kind_label}


@dataclass(frozen=True)
class KindCount:
    kind: str
    label: str
    vms: int
    gpus: int
    items: int


def drifting(items: Iterable[Drift]) -> tuple[int, int]:
    """How many distinct VMs and GPUs drift, leaving out VMs an operation is changing (on purpose)."""
    items = [item for item in items if item.kind != Kind.IN_OPERATION]
    vms = {item.vm_id if item.vm_id is not None else item.vm_uuid for item in items if item.vm_id or item.vm_uuid}
    return len(vms), len({item.gpu_id for item in items if item.gpu_id is not None})


def counts(items: Iterable[Drift]) -> list[KindCount]:
    """Per kind (in `Kind.CHOICES` order, kinds with no item left out): the distinct VMs (an
    unknown domain counted by its UUID) and GPUs it concerns, and how many items."""
    vms: dict[str, set] = defaultdict(set)
    gpus: dict[str, set] = defaultdict(set)
    found: dict[str, int] = defaultdict(int)
    for item in items:
        found[item.kind] += 1
        if item.vm_id is not None or item.vm_uuid:
            vms[item.kind].add(item.vm_id if item.vm_id is not None else item.vm_uuid)
        if item.gpu_id is not None:
            gpus[item.kind].add(item.gpu_id)
    return [KindCount(kind, label, len(vms[kind]), len(gpus[kind]), found[kind])
            for kind, label in Kind.CHOICES if found[kind]]


# The comparison ---------------------------------------------------------------------------------


def _ago(now: datetime, moment: datetime) -> str:
    seconds = max(0, int((now - moment).total_seconds()))
    if seconds < 120:
        return f"{seconds} s ago"
    if seconds < 7200:
        return f"{seconds // 60} min ago"
    return f"{seconds // 3600} h ago"


@dataclass
class _World:
    """The snapshot indexed for lookups."""

    snapshot: Snapshot
    hosts: dict[int, HostRow] = field(default_factory=dict)
    gpus: dict[int, GpuRow] = field(default_factory=dict)
    gpu_by_bus: dict[tuple[int, str], int] = field(default_factory=dict)
    readings: dict[int, list[Reading]] = field(default_factory=dict)
    active: dict[int, OperationRow] = field(default_factory=dict)
    finished: dict[int, OperationRow] = field(default_factory=dict)

    @classmethod
    def of(cls, snapshot: Snapshot) -> _World:
        world = cls(snapshot)
        world.hosts = {host.id: host for host in snapshot.hosts}
        world.gpus = {gpu.id: gpu for gpu in snapshot.gpus}
        world.gpu_by_bus = {(gpu.host_id, gpu.bus_id): gpu.id for gpu in snapshot.gpus}
        for reading in sorted(snapshot.readings, key=lambda r: (r.vm_id, -r.last_seen.timestamp(), r.gpu_id)):
            world.readings.setdefault(reading.vm_id, []).append(reading)
        for op in sorted(snapshot.operations, key=lambda o: o.id):
            if op.active:
                world.active.setdefault(op.vm_id, op)
            elif op.finished_at is not None:
                last = world.finished.get(op.vm_id)
                if last is None or op.finished_at > last.finished_at:
                    world.finished[op.vm_id] = op
        return world

    def host_name(self, host_id: int | None) -> str:
        return self.hosts[host_id].name if host_id in self.hosts else ""

    def gpu_words(self, gpu_id: int | None, bus_id: str = "", host_id: int | None = None) -> str:
        if gpu_id in self.gpus:
            gpu = self.gpus[gpu_id]
            return f"GPU {gpu.bus_id} of {self.host_name(gpu.host_id)}"
        return f"GPU {bus_id or '(unnamed)'} of {self.host_name(host_id)}, which the inventory does not list"

    def read(self, host_id: int | None) -> HostRow | None:
        """The host when its hypervisor was read successfully, else None."""
        host = self.hosts.get(host_id)
        return host if host is not None and host.linked and host.read_at is not None else None


def _match_domains(vms: Sequence[VmRow], domains: Sequence[DomainRow]):
    """Domains per VM id (by UUID, then by a name no other domain's UUID took), and the domains
    that match no VM."""
    by_uuid = {vm.uuid.lower(): vm for vm in vms}
    by_name = {vm.name: vm for vm in vms}
    matched: dict[int, list[DomainRow]] = defaultdict(list)
    left = []
    for domain in domains:
        vm = by_uuid.get(domain.uuid.lower())
        if vm is not None:
            matched[vm.id].append(domain)
        else:
            left.append(domain)
    unknown = []
    for domain in left:
        vm = by_name.get(domain.name)
        if vm is not None and not any(d.uuid.lower() == vm.uuid.lower() for d in matched[vm.id]):
            matched[vm.id].append(domain)
        else:
            unknown.append(domain)
    return matched, unknown


def _devices_words(world: _World, domain: DomainRow) -> str:
    parts = [f"{d.profile or d.type_name or 'vGPU of unknown type'} on "
             f"{d.gpu_bus_id or 'the GPU the hypervisor picks at start'}" for d in domain.devices]
    return f"{domain.state.replace('_', ' ')}, " + (", ".join(parts) if parts else "no vGPU")


def _inventory_words(world: _World, vm: VmRow) -> str:
    if vm.host_id is None:
        return "on no host" + (f", {len(vm.vgpus)} vGPU(s)" if vm.vgpus else "")
    parts = [f"{v.profile} on {world.gpus[v.gpu_id].bus_id}" for v in vm.vgpus if v.gpu_id in world.gpus]
    return f"{world.host_name(vm.host_id)}: " + (", ".join(parts) if parts else "no vGPU")


@dataclass
class _Vm:
    """What is known of one VM while it is compared."""

    world: _World
    vm: VmRow
    domains: list[DomainRow]
    readings: list[Reading]
    stale_by: OperationRow | None
    views: dict[str, str] = field(default_factory=dict)
    items: list[Drift] = field(default_factory=list)
    # Inventory vGPU id -> the device of the hypervisor's last read it was paired with.
    paired: dict[int, DeviceRow] = field(default_factory=dict)

    @property
    def host_id(self) -> int | None:
        return self.vm.host_id

    def add(self, kind: str, severity: str, message: str, action: Action, *, gpu_id: int | None = None,
            bus_id: str = "", host_id: int | None = None, other_host_id: int | None = None) -> None:
        host_id = host_id if host_id is not None else self.vm.host_id
        if gpu_id in self.world.gpus and not bus_id:
            bus_id = self.world.gpus[gpu_id].bus_id
        self.items.append(Drift(
            kind=kind, severity=severity, message=message, action=action, host_id=host_id,
            host_name=self.world.host_name(host_id), vm_id=self.vm.id, vm_name=self.vm.name, vm_uuid=self.vm.uuid,
            gpu_id=gpu_id, gpu_bus_id=bus_id, other_host_id=other_host_id,
            other_host_name=self.world.host_name(other_host_id) if other_host_id is not None else "",
            **self.views))


def _hypervisor_words(world: _World, vm: VmRow, domains: list[DomainRow], stale_by: OperationRow | None) -> str:
    host = world.hosts.get(vm.host_id)
    found = [f"{world.host_name(d.host_id)} (read {_ago(world.snapshot.now, world.hosts[d.host_id].read_at)}): "
             f"{_devices_words(world, d)}" for d in domains]
    if stale_by is not None:
        return "; ".join(found + [f"read before operation #{stale_by.id} ended: not compared"])
    if found:
        return "; ".join(found)
    if host is None:
        return "unknown: the VM is on no host"
    if not host.linked:
        return f"unknown: {host.name} is not linked to its hypervisor"
    if host.read_at is None:
        return f"unknown: {host.name}'s hypervisor was never read"
    return f"{host.name} (read {_ago(world.snapshot.now, host.read_at)}): no such domain"


def _telemetry_words(world: _World, vm: VmRow, readings: list[Reading]) -> str:
    if readings:
        return ", ".join(f"vGPU on {world.gpu_words(r.gpu_id)} ({_ago(world.snapshot.now, r.last_seen)})"
                         for r in readings)
    window = f"{int(world.snapshot.window_s)} s"
    host = world.hosts.get(vm.host_id)
    if vm.guest_agent or (host is not None and host.has_agent):
        return f"no reading in the last {window}"
    if host is None:
        return "no reading; the VM is on no host"
    return f"no agent on {host.name}"


def _pair(vgpus: Sequence[VgpuRow], devices: Sequence[DeviceRow], gpu_of):
    """Pair the inventory's vGPUs with the domain's devices: by device id, then by GPU and
    profile, then by GPU, then what is left in order (a vGPU that changed GPU). Returns (pairs,
    devices left, vGPUs left)."""
    left_v, left_d = list(vgpus), list(devices)
    pairs = []
    rules = (
        lambda v, d: bool(v.device_id) and v.device_id.lower() == d.device_id.lower(),
        lambda v, d: v.gpu_id == gpu_of(d) and v.profile == d.profile,
        lambda v, d: not d.gpu_bus_id and v.profile == d.profile,  # the hypervisor picks its GPU at start
        lambda v, d: v.gpu_id == gpu_of(d),
    )
    for rule in rules:
        for vgpu in list(left_v):
            device = next((d for d in left_d if rule(vgpu, d)), None)
            if device is not None:
                pairs.append((vgpu, device))
                left_v.remove(vgpu)
                left_d.remove(device)
    while left_v and left_d:
        pairs.append((left_v.pop(0), left_d.pop(0)))
    return pairs, left_d, left_v


def _sync(host_id: int | None, text: str = "Sync and apply on the host page") -> Action:
    return Action(Do.SYNC_AND_APPLY, text, host_id=host_id)


def _compare_devices(c: _Vm, domain: DomainRow, seen: set[int]) -> set[int]:
    """Items of a domain on the VM's own host against its inventory vGPUs; returns the GPUs the
    hypervisor has a device of the VM on."""
    world, vm = c.world, c.vm
    gpu_of = lambda d: world.gpu_by_bus.get((domain.host_id, d.gpu_bus_id))  # noqa: E731
    pairs, devices, vgpus = _pair(vm.vgpus, domain.devices, gpu_of)
    c.paired = {vgpu.id: device for vgpu, device in pairs}
    on_hypervisor = {g for g in (gpu_of(d) for d in domain.devices) if g is not None}
    running = domain.state == "running"
    for vgpu, device in pairs:
        # A device on no GPU yet (a vSphere VM that is off, a Proxmox VE resource mapping) is placed
        # by the hypervisor at start: the inventory's GPU is as good as any of its model.
        where = gpu_of(device) if device.gpu_bus_id else vgpu.gpu_id
        if where != vgpu.gpu_id:
            hyp, inv = world.gpu_words(where, device.gpu_bus_id, domain.host_id), world.gpu_words(vgpu.gpu_id)
            if where in seen and vgpu.gpu_id not in seen:
                why, action = ("The agent reads it on the hypervisor's GPU: the inventory is out of date.",
                               Action(Do.FIX_INVENTORY, "Correct the inventory (move the vGPU to the GPU the "
                                                        "hypervisor uses)", host_id=vm.host_id))
            elif vgpu.gpu_id in seen and where not in seen:
                why, action = ("The agent reads it on the inventory's GPU: the hypervisor's read may be old.",
                               Action(Do.SYNC, "Read the hypervisor again (Compare on the host page)",
                                      host_id=vm.host_id))
            else:
                why, action = ("", Action(Do.FIX_HYPERVISOR, "Find out which GPU is right, then move the vGPU on "
                                                             "the hypervisor or correct the inventory",
                                          host_id=vm.host_id))
            c.add(Kind.GPU_MISMATCH, Severity.CRITICAL,
                  f"The hypervisor has {vm.name}'s {device.profile or device.type_name or 'vGPU'} on {hyp}; the "
                  f"inventory has it on {inv}. {why}".strip(), action, gpu_id=vgpu.gpu_id)
        elif device.profile != vgpu.profile:
            c.add(Kind.PROFILE_MISMATCH, Severity.WARNING,
                  f"{vm.name}'s vGPU on {world.gpu_words(where)} is a {device.profile or device.type_name or '?'} on "
                  f"the hypervisor and a {vgpu.profile} in the inventory: the frame buffer the inventory counts "
                  "is not what the VM has.",
                  Action(Do.FIX_HYPERVISOR, "Recreate the device with the inventory's profile, or file a resize "
                                            "request to record the hypervisor's", host_id=vm.host_id),
                  gpu_id=vgpu.gpu_id)
        elif vgpu.device_id.lower() != device.device_id.lower():
            c.add(Kind.DEVICE_ID, Severity.INFO,
                  f"The inventory does not record the device of {vm.name}'s vGPU on {world.gpu_words(where)} "
                  f"({device.device_id}); operations need it to find the device.",
                  _sync(vm.host_id), gpu_id=vgpu.gpu_id)
    for device in devices:
        where = gpu_of(device)
        agent = " The agent reads it too." if where in seen else ""
        c.add(Kind.UNKNOWN_DEVICE, Severity.CRITICAL,
              f"{vm.name}'s domain holds a {device.profile or device.type_name or 'vGPU'} (device {device.device_id}) "
              f"on {world.gpu_words(where, device.gpu_bus_id, domain.host_id)}, which the inventory does not "
              f"record: that GPU's room is counted as free.{agent}",
              Action(Do.FIX_INVENTORY, "File a resize request to record the vGPU, or remove the device from the "
                                       "domain", host_id=domain.host_id),
              gpu_id=where, bus_id=device.gpu_bus_id)
    for vgpu in vgpus:
        if vgpu.gpu_id in seen:
            message = (f"The inventory gives {vm.name} a {vgpu.profile} on {world.gpu_words(vgpu.gpu_id)}; the "
                       "hypervisor's domain had no device for it when read, but the agent reads it: the read "
                       "may be old.")
            action, severity = Action(Do.SYNC, "Read the hypervisor again", host_id=vm.host_id), Severity.INFO
        else:
            message = (f"The inventory gives {vm.name} a {vgpu.profile} on {world.gpu_words(vgpu.gpu_id)}, but its "
                       "domain on the hypervisor has no device for it"
                       + (": the VM runs without that vGPU." if running else "."))
            action = Action(Do.FIX_HYPERVISOR, "Attach the vGPU to the domain, or release it in the inventory",
                            host_id=vm.host_id)
            severity = Severity.CRITICAL if running else Severity.WARNING
        c.add(Kind.MISSING_DEVICE, severity, message, action, gpu_id=vgpu.gpu_id)
    return on_hypervisor


def _compare_vm(world: _World, vm: VmRow, domains: list[DomainRow]) -> list[Drift]:
    snapshot = world.snapshot
    finished = world.finished.get(vm.id)
    readings = [r for r in world.readings.get(vm.id, ())
                if finished is None or r.last_seen > finished.finished_at]
    involved = {vm.host_id, *(d.host_id for d in domains), *(finished.host_ids if finished else ())}
    stale_by = None
    if finished is not None and any(world.read(h) is not None and world.read(h).read_at < finished.finished_at
                                    for h in involved):
        stale_by = finished
    c = _Vm(world, vm, domains, readings, stale_by)
    c.views = {"inventory": _inventory_words(world, vm),
               "hypervisor": _hypervisor_words(world, vm, domains, stale_by),
               "telemetry": _telemetry_words(world, vm, readings)}
    seen = {r.gpu_id for r in readings}
    read_at = {r.gpu_id: r.last_seen for r in readings}
    inventory_gpus = {v.gpu_id for v in vm.vgpus}
    explained = set(inventory_gpus)
    own = next((d for d in domains if d.host_id == vm.host_id), None)
    hypervisor_known = False

    if stale_by is not None:
        c.add(Kind.STALE_READ, Severity.INFO,
              f"Operation #{stale_by.id} changed {vm.name} after the hypervisor was last read: the hypervisor's "
              "view is not compared until it is read again.",
              Action(Do.SYNC, "Read the hypervisor again (Compare on the host page)",
                     host_id=vm.host_id, operation_id=stale_by.id))
    else:
        for domain in domains:
            if domain.host_id == vm.host_id:
                continue
            other = world.host_name(domain.host_id)
            agent = any(world.gpus[g].host_id == domain.host_id for g in seen if g in world.gpus)
            if vm.host_id is None:
                message = f"The inventory has {vm.name} on no host; the hypervisor of {other} has its domain"
            else:
                message = (f"The inventory has {vm.name} on {world.host_name(vm.host_id)}; the hypervisor of "
                           f"{other} has its domain")
            message += f" ({domain.state.replace('_', ' ')})." + (" The agent reads it there too." if agent else "")
            c.add(Kind.ELSEWHERE, Severity.CRITICAL if domain.devices or vm.vgpus else Severity.WARNING, message,
                  Action(Do.FIX_INVENTORY, f"Find out where {vm.name} runs, then move it in the inventory or on "
                                           "the hypervisors", host_id=domain.host_id),
                  host_id=domain.host_id, other_host_id=vm.host_id)
            explained |= {g for g in seen if g in world.gpus and world.gpus[g].host_id == domain.host_id}
            hypervisor_known = True
        if own is not None:
            explained |= _compare_devices(c, own, seen)
            hypervisor_known = True
        elif world.read(vm.host_id) is not None:
            hypervisor_known = True
            if not any(d.host_id != vm.host_id for d in domains):
                agent = " The agent still reads it." if seen else ""
                c.add(Kind.MISSING_DOMAIN, Severity.WARNING,
                      f"The inventory has {vm.name} on {world.host_name(vm.host_id)}, whose hypervisor has no such "
                      f"domain: it was deleted, renamed or moved by hand.{agent}",
                      Action(Do.FIX_INVENTORY, "Find the VM; re-create its domain, or delete it from the "
                                               "inventory", host_id=vm.host_id))

    for gpu_id in sorted(seen - explained):
        gpu = world.gpus.get(gpu_id)
        if gpu is None:
            continue
        when = _ago(snapshot.now, read_at[gpu_id])
        if gpu.host_id != vm.host_id:
            c.add(Kind.AGENT_OTHER_HOST, Severity.WARNING,
                  f"The agent reports {vm.name} on {world.gpu_words(gpu_id)} ({when}); the inventory places it on "
                  f"{world.host_name(vm.host_id) or 'no host'}.",
                  Action(Do.CHECK_AGENT, f"Check the agent of {world.host_name(gpu.host_id)} and where {vm.name} "
                                         "really runs", host_id=gpu.host_id),
                  gpu_id=gpu_id, other_host_id=gpu.host_id)
        else:
            believed = "the inventory and the hypervisor have" if own is not None and stale_by is None \
                else "the inventory has"
            where = ", ".join(world.gpus[g].bus_id for g in sorted(inventory_gpus) if g in world.gpus) or "no GPU"
            c.add(Kind.AGENT_OLD_GPU, Severity.WARNING,
                  f"The agent still reports {vm.name} on {world.gpu_words(gpu_id)} ({when}); {believed} it on "
                  f"{where}.",
                  Action(Do.CHECK_AGENT, f"Check the agent of {world.host_name(gpu.host_id)}: restart it if it "
                                         "keeps reading the old device", host_id=gpu.host_id),
                  gpu_id=gpu_id)

    _agent_device(c, seen, finished)
    _silent(c, own if hypervisor_known and stale_by is None else None, seen)
    return c.items


def _is_uuid(text: str) -> bool:
    try:
        uuid_lib.UUID(text)
    except ValueError:
        return False
    return True


def _agent_device(c: _Vm, seen: set[int], finished: OperationRow | None) -> None:
    """The agent reads a vGPU of the VM, on its inventory GPU, as another mdev than the device the
    hypervisor's last read (where compared) and the inventory name. The mdev UUID comes from the
    driver, so the agent is right about what runs now: the device was recreated by hand, or the
    record is old, and an operation on the vGPU would look for a device that is not there.

    Not compared: a vGPU the agent does not read lately (its report may be old), an expected
    device that is no mdev (an SR-IOV VF address, vGPU 17+: the agent reports no mdev there), and
    a report older than an operation that ended since (the operation may have replaced the device;
    the next hypervisor read settles it)."""
    world, vm = c.world, c.vm
    for vgpu in vm.vgpus:
        reported = vgpu.reported_device_id.lower()
        if not reported or vgpu.gpu_id not in seen:
            continue
        if finished is not None and (vgpu.reported_device_at is None
                                     or vgpu.reported_device_at < finished.finished_at):
            continue
        device = c.paired.get(vgpu.id)
        on_hypervisor = device.device_id.lower() if device is not None else ""
        recorded = vgpu.device_id.lower()
        expected = on_hypervisor or recorded
        if not expected or not _is_uuid(expected) or reported in (on_hypervisor, recorded):
            continue
        where = world.gpu_words(vgpu.gpu_id)
        if on_hypervisor:
            also = "" if recorded == on_hypervisor else (
                f" and the inventory {recorded}" if recorded else " and the inventory none")
            message = (f"The agent reads {vm.name}'s {vgpu.profile} on {where} as device {reported}; the "
                       f"hypervisor's last read has {on_hypervisor}{also}: the device was recreated since, or the "
                       "read is old.")
            action = Action(Do.SYNC, "Read the hypervisor again (Compare on the host page), then apply its device "
                                     "ids", host_id=vm.host_id)
        else:
            message = (f"The agent reads {vm.name}'s {vgpu.profile} on {where} as device {reported}; the "
                       f"inventory records {recorded}: an operation on this vGPU would look for a device that is "
                       "not there.")
            host = world.hosts.get(vm.host_id)
            action = (_sync(vm.host_id, "Sync and apply on the host page: it records the devices the hypervisor "
                                        "has")
                      if host is not None and host.linked else
                      Action(Do.FIX_INVENTORY, "Link the host to its hypervisor and sync it, so the inventory "
                                               "records the device that exists", host_id=vm.host_id))
        c.add(Kind.AGENT_DEVICE, Severity.WARNING, message, action, gpu_id=vgpu.gpu_id)


def _silent(c: _Vm, domain: DomainRow | None, seen: set[int]) -> None:
    """The VM runs with a vGPU (as the hypervisor last saw it) and a source of its readings
    exists, but nothing was read of it lately."""
    world, vm = c.world, c.vm
    host = world.hosts.get(vm.host_id)
    if domain is None or domain.state != "running" or host is None:
        return
    if not (host.has_agent or vm.guest_agent):
        return
    expected = {g for g in (world.gpu_by_bus.get((domain.host_id, d.gpu_bus_id)) for d in domain.devices)
                if g is not None}
    missing = sorted(expected - seen)
    # Readings on other GPUs than the hypervisor's are another item's (a vGPU on another GPU).
    if not missing or len(seen) >= len(expected):
        return
    window = f"{int(world.snapshot.window_s)} s"
    host_gpus = {gpu.id for gpu in world.snapshot.gpus if gpu.host_id == host.id}
    if not host_gpus & world.snapshot.gpus_reporting and not vm.guest_agent:
        message = (f"{vm.name} runs with a vGPU, but the agent of {host.name} has reported nothing for "
                   f"{window}: the host's GPUs go unwatched.")
    elif expected & seen:
        message = (f"The agent reads {len(expected & seen)} of {vm.name}'s {len(expected)} vGPUs; nothing of the "
                   f"one on {world.gpu_words(missing[0])} in {window}.")
    else:
        message = (f"{vm.name} runs with a vGPU, but no reading of it came in {window} while the host's GPUs are "
                   "read: check the vGPU driver and licence in the guest.")
    c.add(Kind.AGENT_SILENT, Severity.WARNING, message,
          Action(Do.CHECK_AGENT, f"Check the agent of {host.name}", host_id=host.id), gpu_id=missing[0])


def _unknown_domain(world: _World, domain: DomainRow) -> Drift:
    host = world.hosts[domain.host_id]
    devices = _devices_words(world, domain)
    gpu_id = next((world.gpu_by_bus.get((domain.host_id, d.gpu_bus_id)) for d in domain.devices), None)
    holds = " and holds GPU room the inventory counts as free" if domain.devices else ""
    return Drift(
        kind=Kind.UNKNOWN_VM, severity=Severity.CRITICAL if domain.devices else Severity.WARNING,
        message=f"The hypervisor of {host.name} has a domain {domain.name} ({devices}) that the inventory does "
                f"not know{holds}.",
        action=_sync(host.id, "Sync and apply on the host page: it creates the VM and places its vGPUs"),
        host_id=host.id, host_name=host.name, vm_uuid=domain.uuid, vm_name=domain.name,
        gpu_id=gpu_id, gpu_bus_id=domain.devices[0].gpu_bus_id if domain.devices else "",
        inventory="not in the inventory",
        hypervisor=f"{host.name} (read {_ago(world.snapshot.now, host.read_at)}): {devices}",
        telemetry="not recorded (readings are kept for inventory VMs only)")


def _unread(world: _World, host: HostRow) -> Drift | None:
    if not host.linked or (host.read_at is not None and not host.read_error):
        return None
    if host.read_at is None:
        message = (f"{host.name} is linked to its hypervisor but was never read: its VMs are compared with the "
                   "agent only.")
        hypervisor = "never read"
    else:
        message = (f"The last read of {host.name}'s hypervisor failed ({host.read_error}); its VMs are compared "
                   f"with the read of {_ago(world.snapshot.now, host.read_at)}.")
        hypervisor = f"last read failed: {host.read_error}"
    return Drift(kind=Kind.UNREAD, severity=Severity.INFO if host.read_at is None else Severity.WARNING,
                 message=message, action=Action(Do.SYNC, "Check the link and read it (host page)", host_id=host.id),
                 host_id=host.id, host_name=host.name, inventory="—", hypervisor=hypervisor, telemetry="—")


def _in_operation(world: _World, vm: VmRow, op: OperationRow) -> Drift:
    return Drift(
        kind=Kind.IN_OPERATION, severity=Severity.INFO,
        message=f"{vm.name} is being changed by operation #{op.id} ({op.status}): its views differ until it ends.",
        action=Action(Do.FOLLOW_OPERATION, f"Follow operation #{op.id}", host_id=vm.host_id, operation_id=op.id),
        host_id=vm.host_id, host_name=world.host_name(vm.host_id), vm_id=vm.id, vm_name=vm.name, vm_uuid=vm.uuid,
        inventory=_inventory_words(world, vm), hypervisor=f"being changed by operation #{op.id}",
        telemetry=f"being changed by operation #{op.id}")


def find_drift(snapshot: Snapshot) -> list[Drift]:
    """Every disagreement of the snapshot's three views, most severe first, then by host and VM."""
    world = _World.of(snapshot)
    # A domain only counts from a host whose hypervisor was read.
    domains = [d for d in snapshot.domains if world.read(d.host_id) is not None]
    matched, unknown = _match_domains(snapshot.vms, domains)
    items: list[Drift] = [item for host in snapshot.hosts if (item := _unread(world, host)) is not None]
    items += [_unknown_domain(world, domain) for domain in unknown]
    for vm in snapshot.vms:
        op = world.active.get(vm.id)
        if op is not None:
            items.append(_in_operation(world, vm, op))
        else:
            items += _compare_vm(world, vm, matched.get(vm.id, []))
    rank = {severity: index for index, severity in enumerate(Severity.ORDER)}
    items.sort(key=lambda i: (rank[i.severity], i.host_name, i.vm_name, i.kind, i.gpu_bus_id))
    return items


def select(items: Iterable[Drift], *, kinds: Iterable[str] = (), host_id: int | None = None,
           severity: str = "") -> list[Drift]:
    """The items of those kinds (any when empty), about that host (on either side), of that severity."""
    kinds = set(kinds)
    return [item for item in items
            if (not kinds or item.kind in kinds)
            and (host_id is None or host_id in (item.host_id, item.other_host_id))
            and (not severity or item.severity == severity)]

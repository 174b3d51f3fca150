"""What a host's hypervisor runs against what the inventory says it runs. Pure: no ORM.

`diff_host(domains, inventory)` turns the hypervisor's domains (`backends.base.Domain`) and a
snapshot of the inventory (`HostInventory`, built by `hypervisors.services`) into one entry
per VM, as JSON-ready dicts that a `SyncReport` stores and the page and the API show as they
are. A domain is matched to an inventory VM by UUID, then by name. Entry kinds:

- "same": in step;
- "new": a domain the inventory does not know (applying creates the VM);
- "gone": a VM the inventory places on this host that the hypervisor does not have (never
  deleted by sync: the admin decides);
- "changed": vCPUs, RAM, name or UUID differ, or its vGPUs do (count, type vs profile, GPU,
  device ids);
- "elsewhere": the inventory places the VM on another host (left to the admin).

Applying an entry changes only what `appliable_fields` and `device_ids` name; differences of
vGPU count, type or GPU are listed in `vgpu_notes` for the admin, since changing them means
placing or removing vGPUs, which is an operation's work, not a sync's.

The agent's readings (`TelemetryVgpu`: which GPUs a VM's vGPUs were read on lately) are joined
where the inventory knows the VM. Telemetry stores (VM, GPU, time) per reading; where the agent
also reports the vGPU's mdev UUID (kept on the inventory vGPU, `Vgpu.reported_device_id`), the
join is by device id, which tells a device recreated on the same GPU from the one the hypervisor
has: a reported device the domain does not hold, or holds on another GPU, is noted. Without a
device id (older agents, SR-IOV vGPUs) the join is by VM and GPU: a vGPU read on a GPU where the
hypervisor has no device of the VM is noted.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from hypervisors.backends.base import Domain, VgpuDevice
from hypervisors.matching import match_profile

MIB_PER_GIB = 1024


class Kind:
    SAME = "same"
    NEW = "new"
    GONE = "gone"
    CHANGED = "changed"
    ELSEWHERE = "elsewhere"

    ALL = (NEW, CHANGED, GONE, ELSEWHERE, SAME)


@dataclass(frozen=True)
class InventoryVgpu:
    id: int
    profile: str
    gpu_bus_id: str
    device_id: str = ""


@dataclass(frozen=True)
class InventoryVm:
    id: int
    uuid: str  # lower case, with dashes
    name: str
    vcpus: int
    ram_gib: int
    host: str | None  # the inventory's host name; None: on no host
    vgpus: tuple[InventoryVgpu, ...] = ()


@dataclass(frozen=True)
class TelemetryVgpu:
    gpu_bus_id: str
    last_seen: str  # ISO 8601
    # The mdev UUIDs the agent reports for the VM's vGPUs on that GPU; empty: it reports none.
    device_ids: tuple[str, ...] = ()


@dataclass(frozen=True)
class HostInventory:
    """The inventory as sync needs it for one host.

    `vms`: the VMs the inventory places on the host, and every other VM whose UUID or name one
    of the host's domains carries. `gpu_profiles`: per PCI bus id of the host's GPUs, the
    profile names of its model (a device's type is matched against these). `telemetry`: per VM
    UUID, the GPUs its vGPUs were read on lately.
    """

    name: str
    vms: tuple[InventoryVm, ...]
    gpu_profiles: dict[str, tuple[str, ...]] = field(default_factory=dict)
    telemetry: dict[str, tuple[TelemetryVgpu, ...]] = field(default_factory=dict)


def _unplaced(device: VgpuDevice) -> bool:
    """A vGPU on no GPU yet: a vSphere VM's that is off (ESXi picks its GPU at power on), or a
    Proxmox VE VM's through a cluster resource mapping (the node picks one of the mapping's GPUs at
    start). Any GPU of the right model agrees with the inventory."""
    return not device.gpu_bus_id


def ram_gib_of(ram_mib: int) -> int:
    """The inventory's GiB for a domain's MiB: rounded up, so a VM is never recorded with less
    RAM than it has."""
    return max(1, math.ceil(ram_mib / MIB_PER_GIB))


def _device_json(device: VgpuDevice, profile: str | None) -> dict:
    return {"device_id": device.id, "kind": device.kind, "gpu_bus_id": device.gpu_bus_id,
            "type_name": device.type_name, "profile": profile}


def _profile_of(device: VgpuDevice, inventory: HostInventory) -> tuple[str | None, str]:
    """(matched profile or None, why not) of a device, against the profiles of its GPU's model;
    a device on no GPU yet (vSphere places a VM's vGPU when the VM starts), against those of
    every GPU model of the host."""
    if _unplaced(device):
        profiles = tuple(sorted({name for names in inventory.gpu_profiles.values() for name in names}))
    else:
        profiles = inventory.gpu_profiles.get(device.gpu_bus_id)
    if profiles is None:
        where = device.gpu_bus_id or "a GPU the host does not name"
        return None, f"vGPU {device.id} is on {where}, which the inventory does not list on {inventory.name}"
    profile = match_profile(device.type_name, profiles)
    if profile is None:
        return None, (f"vGPU {device.id} is of type {device.type_name or '(unknown)'}, which matches no profile "
                      f"of the GPU {device.gpu_bus_id}'s model in the catalog")
    return profile, ""


def _pair_vgpus(devices: Sequence[VgpuDevice], vgpus: Sequence[InventoryVgpu], inventory: HostInventory):
    """Pair a domain's devices with the VM's inventory vGPUs: by device id, then by GPU and profile.
    Returns (rows, notes, device ids to record)."""
    profiles = {device.id: _profile_of(device, inventory) for device in devices}
    left_devices, left_vgpus = list(devices), list(vgpus)
    pairs: list[tuple[VgpuDevice, InventoryVgpu]] = []
    for vgpu in list(left_vgpus):
        device = next((d for d in left_devices if vgpu.device_id and d.id == vgpu.device_id.lower()), None)
        if device is not None:
            pairs.append((device, vgpu))
            left_devices.remove(device)
            left_vgpus.remove(vgpu)
    for vgpu in list(left_vgpus):
        device = next((d for d in left_devices
                       if (d.gpu_bus_id == vgpu.gpu_bus_id or _unplaced(d)) and profiles[d.id][0] == vgpu.profile),
                      None)
        if device is not None:
            pairs.append((device, vgpu))
            left_devices.remove(device)
            left_vgpus.remove(vgpu)

    rows, notes, device_ids = [], [], []
    if len(devices) != len(vgpus):
        notes.append(f"{len(vgpus)} vGPU(s) in the inventory, {len(devices)} on the hypervisor")
    for device, vgpu in pairs:
        profile, why = profiles[device.id]
        rows.append({**_device_json(device, profile), "vgpu_id": vgpu.id, "inventory_profile": vgpu.profile,
                     "inventory_gpu_bus_id": vgpu.gpu_bus_id, "inventory_device_id": vgpu.device_id})
        if profile is None:
            notes.append(why)
        elif profile != vgpu.profile:
            notes.append(f"vGPU {device.id} is a {profile} on the hypervisor, a {vgpu.profile} in the inventory")
        if device.gpu_bus_id != vgpu.gpu_bus_id and not _unplaced(device):
            notes.append(f"vGPU {device.id} is on GPU {device.gpu_bus_id} on the hypervisor, "
                         f"{vgpu.gpu_bus_id} in the inventory")
        if vgpu.device_id.lower() != device.id:
            device_ids.append({"vgpu_id": vgpu.id, "device_id": device.id, "was": vgpu.device_id})
    for device in left_devices:
        profile, why = profiles[device.id]
        rows.append({**_device_json(device, profile), "vgpu_id": None, "inventory_profile": None,
                     "inventory_gpu_bus_id": None, "inventory_device_id": None})
        notes.append(why or f"vGPU {device.id} ({profile} on GPU {device.gpu_bus_id}) is not in the inventory")
    for vgpu in left_vgpus:
        rows.append({"device_id": None, "kind": None, "gpu_bus_id": None, "type_name": None, "profile": None,
                     "vgpu_id": vgpu.id, "inventory_profile": vgpu.profile, "inventory_gpu_bus_id": vgpu.gpu_bus_id,
                     "inventory_device_id": vgpu.device_id})
        notes.append(f"the inventory's {vgpu.profile} on GPU {vgpu.gpu_bus_id} has no device on the hypervisor")
    return rows, notes, device_ids


def _telemetry_notes(readings: Iterable[TelemetryVgpu], devices: Sequence[VgpuDevice]) -> list[str]:
    """Readings that disagree with the domain's devices: by device id where the agent reports one,
    else by GPU."""
    on_host = {device.gpu_bus_id for device in devices}
    by_id = {device.id.lower(): device for device in devices}
    notes = []
    for reading in readings:
        if not reading.device_ids:
            if reading.gpu_bus_id not in on_host:
                notes.append(f"the agent read a vGPU of this VM on GPU {reading.gpu_bus_id} at {reading.last_seen}, "
                             "where the hypervisor has none of its devices")
            continue
        for device_id in reading.device_ids:
            device = by_id.get(device_id.lower())
            if device is None:
                notes.append(f"the agent read device {device_id} of this VM on GPU {reading.gpu_bus_id} at "
                             f"{reading.last_seen}, which the domain does not hold on the hypervisor")
            elif device.gpu_bus_id != reading.gpu_bus_id:
                notes.append(f"the agent read device {device_id} on GPU {reading.gpu_bus_id} at {reading.last_seen}; "
                             f"the hypervisor has it on GPU {device.gpu_bus_id}")
    return notes


def _entry(kind: str, domain: Domain | None, vm: InventoryVm | None) -> dict:
    return {
        "kind": kind, "uuid": domain.uuid if domain else vm.uuid, "name": domain.name if domain else vm.name,
        "state": domain.state if domain else None, "vm_id": vm.id if vm else None,
        "inventory_host": vm.host if vm else None,
        "vcpus": domain.vcpus if domain else None, "ram_mib": domain.ram_mib if domain else None,
        "changes": [], "vgpus": [], "vgpu_notes": [], "device_ids": [], "notes": [], "telemetry": [],
        "appliable": False,
    }


def _compare(domain: Domain, vm: InventoryVm, inventory: HostInventory) -> dict:
    if vm.host is not None and vm.host != inventory.name:
        entry = _entry(Kind.ELSEWHERE, domain, vm)
        entry["notes"].append(f"the inventory has {vm.name} on {vm.host}; move it there or here by hand")
        return entry
    entry = _entry(Kind.CHANGED, domain, vm)
    wanted = {"uuid": (vm.uuid, domain.uuid), "name": (vm.name, domain.name), "vcpus": (vm.vcpus, domain.vcpus),
              "ram_gib": (vm.ram_gib, ram_gib_of(domain.ram_mib))}
    entry["changes"] = [{"field": name, "inventory": old, "hypervisor": new}
                        for name, (old, new) in wanted.items() if old != new]
    rows, notes, device_ids = _pair_vgpus(domain.vgpus, vm.vgpus, inventory)
    entry.update(vgpus=rows, vgpu_notes=notes, device_ids=device_ids)
    readings = inventory.telemetry.get(vm.uuid, ())
    entry["telemetry"] = [{"gpu_bus_id": r.gpu_bus_id, "last_seen": r.last_seen, "device_ids": list(r.device_ids)}
                          for r in readings]
    entry["vgpu_notes"] += _telemetry_notes(readings, domain.vgpus)
    if vm.host is None:
        entry["notes"].append(f"the inventory has {vm.name} on no host (it holds no vGPU there)")
    if not (entry["changes"] or entry["vgpu_notes"] or entry["device_ids"] or entry["notes"]):
        entry["kind"] = Kind.SAME
    entry["appliable"] = bool(entry["changes"] or entry["device_ids"])
    return entry


def _new(domain: Domain, inventory: HostInventory) -> dict:
    entry = _entry(Kind.NEW, domain, None)
    for device in domain.vgpus:
        profile, why = _profile_of(device, inventory)
        entry["vgpus"].append({**_device_json(device, profile), "vgpu_id": None, "inventory_profile": None,
                               "inventory_gpu_bus_id": None, "inventory_device_id": None})
        if why:
            entry["vgpu_notes"].append(why)
    entry["changes"] = [{"field": "ram_gib", "inventory": None, "hypervisor": ram_gib_of(domain.ram_mib)}]
    entry["appliable"] = True
    return entry


def diff_host(domains: Iterable[Domain], inventory: HostInventory) -> dict:
    """The diff of one host as {"entries": [...], "summary": {kind: count}}: entries ordered by
    kind (new, changed, gone, elsewhere, same), then name."""
    by_uuid = {vm.uuid: vm for vm in inventory.vms}
    by_name = {vm.name: vm for vm in inventory.vms}
    domains = list(domains)
    # UUIDs first, for every domain, then names for the rest: a domain matched by name never
    # takes the VM whose UUID another domain carries.
    pairs = {domain.uuid: by_uuid.get(domain.uuid.lower()) for domain in domains}
    matched = {vm.id for vm in pairs.values() if vm is not None}
    for domain in domains:
        candidate = by_name.get(domain.name) if pairs[domain.uuid] is None else None
        if candidate is not None and candidate.id not in matched:
            pairs[domain.uuid] = candidate
            matched.add(candidate.id)
    entries = [_compare(d, pairs[d.uuid], inventory) if pairs[d.uuid] else _new(d, inventory) for d in domains]
    for vm in inventory.vms:
        if vm.host == inventory.name and vm.id not in matched:
            entry = _entry(Kind.GONE, None, vm)
            entry["notes"].append("the hypervisor has no such domain; the VM is kept in the inventory until an "
                                  "admin deletes it")
            entries.append(entry)
    order = {kind: index for index, kind in enumerate(Kind.ALL)}
    entries.sort(key=lambda e: (order[e["kind"]], e["name"], e["uuid"]))
    summary = {kind: sum(1 for e in entries if e["kind"] == kind) for kind in Kind.ALL}
    return {"entries": entries, "summary": summary}

"""What the backends share whose vGPUs live in a VM's definition and are made by the hypervisor
when the VM starts (VMware vSphere, Proxmox VE), rather than existing on the host by themselves
(libvirt's mediated devices): a vGPU is removed by taking it out of the VM that holds it, and a
saved definition is checked before it is put back."""

from __future__ import annotations

import json
from collections.abc import Iterable

from fleet.pci import InvalidPciBusId, normalize_pci_bus_id
from hypervisors.backends.base import (
    DeviceBusy,
    DomainSpec,
    HypervisorError,
    NoInstanceAvailable,
    PowerState,
    VgpuDevice,
    VgpuType,
)


class DevicesInDefinition:
    """`vgpu_devices` and `remove_vgpu` for such a backend, from its `list_domains` and `redefine`;
    `_where_name` names the host in messages."""

    _where_name: str

    def vgpu_devices(self) -> list[VgpuDevice]:
        return sorted((d for domain in self.list_domains() for d in domain.vgpus), key=lambda d: (d.gpu_bus_id, d.id))

    def remove_vgpu(self, device: VgpuDevice) -> None:
        """A vGPU goes with the VM definition that holds it: a device still held by a VM is taken
        out of it (DeviceBusy while that VM runs); one no VM holds is gone already."""
        for domain in self.list_domains():
            if any(d.id == device.id for d in domain.vgpus):
                if domain.state != PowerState.SHUT_OFF:
                    raise DeviceBusy(f"The vGPU {device.id} is in use by {domain.name}, which is running on "
                                     f"{self._where_name}; shut it down first.")
                kept = tuple(d for d in domain.vgpus if d.id != device.id)
                self.redefine(domain.uuid, DomainSpec(vcpus=domain.vcpus, ram_mib=domain.ram_mib, vgpus=kept))


def check_spec(spec: DomainSpec) -> None:
    if spec.vcpus < 1 or spec.ram_mib < 1:
        raise HypervisorError(f"A VM needs at least one vCPU and some RAM (asked: {spec.vcpus} vCPUs, "
                              f"{spec.ram_mib} MiB).")


def gpu_bus_id(text: str) -> str:
    """A GPU's address in the fleet's form, or HypervisorError saying why it is not one."""
    try:
        return normalize_pci_bus_id(text)
    except InvalidPciBusId as exc:
        raise HypervisorError(str(exc)) from None


def offered_type(types: Iterable[VgpuType], bus: str, type_name: str, *, where: str, no_gpu: str) -> VgpuType:
    """The type the GPU at `bus` offers under `type_name` (its name or the host's id) with room for
    one more vGPU now: what `create_vgpu` checks before naming a device the hypervisor makes when
    the VM starts. NoInstanceAvailable saying which is missing: the GPU (`no_gpu`), the type, or
    the room; `where` names the host."""
    offered = [t for t in types if t.gpu_bus_id == bus]
    if not offered:
        raise NoInstanceAvailable(no_gpu)
    match = next((t for t in offered if type_name in (t.name, t.type_id)), None)
    if match is None:
        names = ", ".join(sorted(t.name for t in offered))
        raise NoInstanceAvailable(f"The GPU {bus} on {where} offers no vGPU type named {type_name!r} "
                                  f"(it offers: {names}).")
    if match.available < 1:
        raise NoInstanceAvailable(f"The GPU {bus} on {where} cannot take another {match.name} vGPU now.")
    return match


def saved_definition(uuid: str, saved: str) -> dict:
    """The data of a definition this backend saved (`definition`) for the VM `uuid`; HypervisorError
    when it is not one, or is another VM's: nothing is restored then."""
    try:
        data = json.loads(saved)
        saved_uuid = str(data.get("uuid", "")).lower()
    except (ValueError, AttributeError):
        raise HypervisorError(f"The saved definition of {uuid} is not one this backend wrote; nothing was "
                              "restored.") from None
    if saved_uuid != uuid.lower():
        raise HypervisorError(f"The saved definition belongs to VM {saved_uuid or '(no UUID)'}, not {uuid}; "
                              "nothing was restored.")
    return data

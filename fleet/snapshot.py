"""The fleet as plain data, for the code that reasons about many placements at once.

`FleetSnapshot` holds every host, GPU, VM and profile as `fleet.placement` dataclasses, so the
answer to "where does this resize fit" (`fleet.fit`, asked by the request queue, the API and
approval), the right-sizing suggestions and the optimizer ask the same rules the inventory
services ask (`placement.check_placement`) without touching the database.
`fleet.queries.fleet_snapshot()` builds one from the database in a fixed number of queries.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field

from fleet import placement


@dataclass(frozen=True)
class FleetSnapshot:
    """Hosts, GPUs, VMs and the profile catalog at one moment.

    `hosts[h].allocated_vcpus / allocated_ram_gib` count every VM recorded on host h, which is
    what `placement.check_placement` expects for a VM coming from elsewhere (a VM already on the
    host is not checked against its capacity again). `gpus[g].vgpus` and `vms[v].vgpus` describe
    the same vGPUs from both sides. Passthrough GPUs are included (placement refuses them).
    """

    hosts: dict[int, placement.HostState]
    gpus: dict[int, placement.GpuState]
    vms: dict[int, placement.VmState]
    profiles: dict[int, placement.ProfileSpec]
    models: dict[str, placement.GpuModelSpec] = field(default_factory=dict)

    def gpus_in_use(self) -> int:
        """GPUs holding at least one vGPU: the figure the optimizer minimises."""
        return sum(1 for gpu in self.gpus.values() if gpu.vgpus)

    def vm_profile(self, vm_id: int) -> placement.ProfileSpec | None:
        """The profile of a VM's vGPUs (all of one VM's vGPUs share board and series; the first
        one's profile stands for the VM), or None for a VM without vGPU."""
        vm = self.vms[vm_id]
        return vm.vgpus[0].profile if vm.vgpus else None

    def profiles_for(self, gpu_model: str, series: str) -> list[placement.ProfileSpec]:
        """The profiles of one board and series, smallest frame buffer first."""
        return sorted(
            (p for p in self.profiles.values() if p.gpu_model == gpu_model and p.series == series),
            key=lambda p: (p.fb_mib, p.id),
        )

    def fingerprint(self) -> str:
        """A digest of every placement (VM, GPU, profile, slot), host capacity and VM size, so
        a plan computed from this snapshot can tell whether the fleet changed before it is
        applied."""
        digest = hashlib.sha256()
        for gpu_id in sorted(self.gpus):
            gpu = self.gpus[gpu_id]
            digest.update(f"g{gpu_id}:{gpu.host_id}:{gpu.mode}:{gpu.size_mode}|".encode())
            for v in sorted(gpu.vgpus, key=lambda v: (v.placement_id or 0, v.vm_id)):
                digest.update(f"{v.vm_id}:{v.profile.id}:{v.placement_id}|".encode())
        for host_id in sorted(self.hosts):
            h = self.hosts[host_id]
            digest.update(f"h{host_id}:{h.cpu_threads}:{h.ram_gib}:{h.vcpu_overcommit}:{h.ram_overcommit}|".encode())
        for vm_id in sorted(self.vms):
            vm = self.vms[vm_id]
            digest.update(f"v{vm_id}:{vm.host_id}:{vm.vcpus}:{vm.ram_gib}|".encode())
        return digest.hexdigest()

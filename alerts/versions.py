"""The versions page: each host's NVIDIA driver and vGPU manager, each VM's guest driver, and
the combinations that break something.

Two flags, from NVIDIA's vGPU release notes:
- a guest driver from a newer branch than its host's vGPU manager is not supported (the guest
  may fail to load or get no licence); an older guest branch is supported within the release's
  compatibility window, so only "newer" is flagged;
- hosts of one GPU model on different versions: a VM moved between them (cold or live) is
  refused by the hypervisor, so the placement optimizer's moves across them cannot run.
"""

from __future__ import annotations

import re
from collections import defaultdict
from dataclasses import dataclass, field

from fleet.models import Gpu
from telemetry.models import HostDriverState, VgpuHealthState

_BRANCH = re.compile(r"^\s*(\d+)")


def branch(version: str | None) -> int | None:
    """The driver branch of a version string ("580.95.05" -> 580), or None."""
    match = _BRANCH.match(version or "")
    return int(match.group(1)) if match else None


@dataclass
class HostRow:
    host_id: int
    host_name: str
    gpu_models: list[str]
    driver_version: str | None
    vgpu_manager_version: str | None
    reported: bool
    differs: bool = False


@dataclass
class GuestRow:
    vm_id: int
    vm_name: str
    host_id: int
    host_name: str
    guest_driver_version: str | None
    host_driver_version: str | None
    newer_than_host: bool


@dataclass
class Report:
    hosts: list[HostRow] = field(default_factory=list)
    guests: list[GuestRow] = field(default_factory=list)
    mismatched_models: dict[str, list[str]] = field(default_factory=dict)

    @property
    def unsupported_guests(self) -> int:
        return sum(1 for g in self.guests if g.newer_than_host)


def report() -> Report:
    states = {row.host_id: row for row in HostDriverState.objects.select_related("host")}
    models: dict[int, set[str]] = defaultdict(set)
    names: dict[int, str] = {}
    for host_id, host_name, model in Gpu.objects.values_list("host_id", "host__name", "gpu_model__name"):
        models[host_id].add(model)
        names[host_id] = host_name
    for host_id, state in states.items():
        names.setdefault(host_id, state.host.name)
    hosts = []
    for host_id, name in sorted(names.items(), key=lambda item: item[1]):
        state = states.get(host_id)
        hosts.append(HostRow(host_id=host_id, host_name=name, gpu_models=sorted(models[host_id]),
                             driver_version=state.driver_version if state else None,
                             vgpu_manager_version=state.vgpu_manager_version if state else None,
                             reported=state is not None))
    by_model: dict[str, dict[tuple, list[HostRow]]] = defaultdict(lambda: defaultdict(list))
    for row in hosts:
        if row.reported:
            for model in row.gpu_models:
                by_model[model][(row.driver_version, row.vgpu_manager_version)].append(row)
    mismatched = {}
    for model, groups in by_model.items():
        if len(groups) > 1:
            mismatched[model] = sorted(r.host_name for rows in groups.values() for r in rows)
            for rows in groups.values():
                for r in rows:
                    r.differs = True
    guests = []
    for vm_id, vm_name, host_id, host_name, guest in VgpuHealthState.objects.filter(
            guest_driver_version__isnull=False).values_list(
            "vm_id", "vm__name", "gpu__host_id", "gpu__host__name", "guest_driver_version").order_by("vm__name"):
        state = states.get(host_id)
        host_driver = state.driver_version if state else None
        guest_branch, host_branch = branch(guest), branch(host_driver)
        guests.append(GuestRow(vm_id=vm_id, vm_name=vm_name, host_id=host_id, host_name=host_name,
                               guest_driver_version=guest, host_driver_version=host_driver,
                               newer_than_host=guest_branch is not None and host_branch is not None
                               and guest_branch > host_branch))
    return Report(hosts=hosts, guests=guests, mismatched_models=mismatched)

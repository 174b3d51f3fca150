"""Fleets built in memory for the optimizer's tests and bench/placement.py: NVIDIA's real catalog
(fleet/catalog.py), hosts, GPUs and VMs placed through `placement.check_placement`, so every
fleet built here is one the inventory could hold. No database."""

from __future__ import annotations

from dataclasses import replace

from fleet import placement
from fleet.catalog import CATALOG, profiles_of
from fleet.snapshot import FleetSnapshot


def catalog() -> tuple[dict[str, placement.GpuModelSpec], dict[int, placement.ProfileSpec]]:
    """Every catalog model and profile as placement specs; profile ids numbered in catalog order."""
    models, profiles = {}, {}
    for model in CATALOG:
        models[model.name] = placement.GpuModelSpec(
            name=model.name, fb_mib=model.fb_gib * 1024, mixed_size_capable=model.mixed_size_capable,
            multi_vgpu_full_only=model.multi_vgpu_full_only,
        )
        for p in profiles_of(model):
            pid = len(profiles) + 1
            profiles[pid] = placement.ProfileSpec(
                id=pid, name=p.name, gpu_model=model.name, series=p.series, fb_mib=p.fb_mib,
                max_per_gpu=p.max_per_gpu, max_per_gpu_mixed=p.max_per_gpu_mixed, max_per_vm=p.max_per_vm,
            )
    return models, profiles


MODELS, PROFILES = catalog()
PROFILE_BY_NAME = {p.name: p for p in PROFILES.values()}


def profile(name: str) -> placement.ProfileSpec:
    return PROFILE_BY_NAME[name]


class FleetBuilder:
    """Builds a FleetSnapshot step by step; `place` refuses what placement refuses."""

    def __init__(self):
        self.hosts: dict[int, placement.HostState] = {}
        self.gpus: dict[int, placement.GpuState] = {}
        self.vms: dict[int, placement.VmState] = {}
        self._next = 0

    def _id(self) -> int:
        self._next += 1
        return self._next

    def host(self, cpu_threads: int = 72, ram_gib: int = 768, vcpu_overcommit: float = 1.0,
             ram_overcommit: float = 1.0) -> int:
        host_id = self._id()
        self.hosts[host_id] = placement.HostState(
            id=host_id, name=f"host-{host_id}", cpu_threads=cpu_threads, ram_gib=ram_gib,
            vcpu_overcommit=vcpu_overcommit, ram_overcommit=ram_overcommit,
        )
        return host_id

    def gpu(self, host_id: int, model: str = "Quadro RTX 6000", size_mode: str = "equal", mode: str = "vgpu") -> int:
        gpu_id = self._id()
        self.gpus[gpu_id] = placement.GpuState(
            id=gpu_id, label=f"gpu-{gpu_id}", host_id=host_id, model=MODELS[model], mode=mode, size_mode=size_mode,
        )
        return gpu_id

    def vm(self, vcpus: int = 8, ram_gib: int = 32, host_id: int | None = None) -> int:
        vm_id = self._id()
        self.vms[vm_id] = placement.VmState(id=vm_id, name=f"vm-{vm_id}", vcpus=vcpus, ram_gib=ram_gib,
                                            host_id=host_id)
        if host_id is not None:
            self._claim(host_id, vcpus, ram_gib)
        return vm_id

    def _claim(self, host_id: int, vcpus: int, ram_gib: int) -> None:
        host = self.hosts[host_id]
        self.hosts[host_id] = replace(host, allocated_vcpus=host.allocated_vcpus + vcpus,
                                      allocated_ram_gib=host.allocated_ram_gib + ram_gib)

    def check(self, vm_id: int, gpu_id: int, profile_name: str) -> placement.Decision:
        gpu, vm = self.gpus[gpu_id], self.vms[vm_id]
        return placement.check_placement(gpu, profile(profile_name), vm, self.hosts[gpu.host_id])

    def place(self, vm_id: int, gpu_id: int, profile_name: str) -> int:
        """Place a vGPU as `fleet.services.place_vgpu` would; returns its placement ID."""
        decision = self.check(vm_id, gpu_id, profile_name).raise_if_refused()
        gpu, vm = self.gpus[gpu_id], self.vms[vm_id]
        spec = profile(profile_name)
        self.gpus[gpu_id] = replace(gpu, vgpus=gpu.vgpus + (placement.PlacedVgpu(spec, vm_id, decision.placement_id),))
        if vm.host_id != gpu.host_id:
            if vm.host_id is not None:
                self._claim(vm.host_id, -vm.vcpus, -vm.ram_gib)
            self._claim(gpu.host_id, vm.vcpus, vm.ram_gib)
        self.vms[vm_id] = replace(vm, host_id=gpu.host_id,
                                  vgpus=vm.vgpus + (placement.VmVgpu(spec, gpu_id, gpu.host_id),))
        return decision.placement_id

    def remove(self, vm_id: int) -> None:
        """Remove every vGPU of a VM; it leaves its host, as `fleet.services.remove_vgpu` does."""
        vm = self.vms[vm_id]
        for v in vm.vgpus:
            gpu = self.gpus[v.gpu_id]
            self.gpus[v.gpu_id] = replace(gpu, vgpus=tuple(p for p in gpu.vgpus if p.vm_id != vm_id))
        if vm.host_id is not None and vm.vgpus:
            self._claim(vm.host_id, -vm.vcpus, -vm.ram_gib)
            vm = replace(vm, host_id=None)
        self.vms[vm_id] = replace(vm, vgpus=())

    @classmethod
    def from_snapshot(cls, snapshot: FleetSnapshot) -> FleetBuilder:
        builder = cls()
        builder.hosts, builder.gpus, builder.vms = dict(snapshot.hosts), dict(snapshot.gpus), dict(snapshot.vms)
        builder._next = max([0, *snapshot.hosts, *snapshot.gpus, *snapshot.vms])
        return builder

    def snapshot(self) -> FleetSnapshot:
        used = {p.gpu_model for g in self.gpus.values() for p in (v.profile for v in g.vgpus)}
        used |= {g.model.name for g in self.gpus.values()}
        return FleetSnapshot(
            hosts=dict(self.hosts), gpus=dict(self.gpus), vms=dict(self.vms), profiles=dict(PROFILES),
            models={name: MODELS[name] for name in used},
        )


def apply_plan(snapshot: FleetSnapshot, plan) -> FleetBuilder:
    """The fleet after applying `plan` as `sizing.optimizer_runs.apply_run` does: every vGPU of
    the moved VMs removed, then the moved VMs' assignments placed in order, each through
    placement (which refuses what breaks a rule) at the first free slot."""
    builder = FleetBuilder.from_snapshot(snapshot)
    moved = {m.vm_id for m in plan.moves}
    for vm_id in sorted(moved):
        builder.remove(vm_id)
    by_id = {p.id: p for p in PROFILES.values()}
    for a in plan.assignments:
        if a.vm_id in moved:
            builder.place(a.vm_id, a.gpu_id, by_id[a.profile_id].name)
    return builder


def layout_of(gpus) -> dict[int, list[tuple[int, int, int]]]:
    """vm_id -> sorted (gpu_id, profile_id, placement_id) of a fleet's vGPUs (GpuState values)."""
    result: dict[int, list] = {}
    for gpu in gpus:
        for v in gpu.vgpus:
            result.setdefault(v.vm_id, []).append((gpu.id, v.profile.id, v.placement_id))
    return {vm_id: sorted(items) for vm_id, items in result.items()}


def plan_layout(plan) -> dict[int, list[tuple[int, int, int]]]:
    """vm_id -> sorted (gpu_id, profile_id, placement_id) of a plan's assignments."""
    result: dict[int, list] = {}
    for a in plan.assignments:
        result.setdefault(a.vm_id, []).append((a.gpu_id, a.profile_id, a.placement_id))
    return {vm_id: sorted(items) for vm_id, items in result.items()}


SMALL_MODELS = ("Quadro RTX 6000", "NVIDIA L40S", "NVIDIA A16", "NVIDIA A40")


def random_fleet(rng, *, hosts: tuple[int, int] = (1, 4), gpus_per_host: tuple[int, int] = (1, 4),
                 vms: tuple[int, int] = (0, 18), changes: tuple[int, int] = (0, 3), models=SMALL_MODELS,
                 mixed_share: float = 0.3, equal_only: bool = False):
    """A small random fleet and random pending changes, for property tests: hosts with tight
    vCPU and RAM, GPUs of several models (some L40S and A40 in mixed-size mode, some in
    passthrough), VMs with one to four vGPUs placed at random GPUs (a fragmented layout), VMs
    without vGPU, and changes that resize, grow, shrink or remove. `rng` is a random.Random."""
    from sizing.optimizer import Change

    builder = FleetBuilder()
    for _ in range(rng.randint(*hosts)):
        host_id = builder.host(cpu_threads=rng.choice([16, 24, 32, 48, 72]), ram_gib=rng.choice([64, 128, 256, 512]),
                               vcpu_overcommit=rng.choice([1.0, 1.0, 1.5, 2.0]))
        host_models = [rng.choice(models)] if rng.random() < 0.7 else list(models)
        for _ in range(rng.randint(*gpus_per_host)):
            model = rng.choice(host_models)
            size_mode = "mixed" if (MODELS[model].mixed_size_capable and not equal_only
                                    and rng.random() < mixed_share) else "equal"
            mode = "passthrough" if rng.random() < 0.05 else "vgpu"
            builder.gpu(host_id, model, size_mode, mode)
    present = sorted({g.model.name for g in builder.gpus.values()})
    vm_ids = []
    for _ in range(rng.randint(*vms)):
        vm_id = builder.vm(vcpus=rng.choice([2, 4, 8, 12, 16]), ram_gib=rng.choice([8, 16, 32, 64]))
        vm_ids.append(vm_id)
        model = rng.choice(present)
        spec, count = _random_profile(rng, model)
        gpu_ids = [g.id for g in builder.gpus.values() if g.model.name == model]
        rng.shuffle(gpu_ids)
        for gpu_id in gpu_ids:
            host_id = builder.gpus[gpu_id].host_id
            on_host = [g for g in gpu_ids if builder.gpus[g].host_id == host_id]
            placed = 0
            for _ in range(count):
                target = next((g for g in [gpu_id, *on_host] if builder.check(vm_id, g, spec.name).ok), None)
                if target is None:
                    break
                builder.place(vm_id, target, spec.name)
                placed += 1
            if placed == count:
                break
            builder.remove(vm_id)
    wanted = []
    for vm_id in rng.sample(vm_ids, min(len(vm_ids), rng.randint(*changes))):
        vm = builder.vms[vm_id]
        if vm.vgpus and rng.random() < 0.15:
            wanted.append(Change(vm_id, None, 0, f"remove:{vm_id}"))
            continue
        model = vm.vgpus[0].profile.gpu_model if vm.vgpus else rng.choice(present)
        spec, count = _random_profile(rng, model)
        wanted.append(Change(vm_id, spec.id, count, f"resize-request:{vm_id}"))
    return builder.snapshot(), wanted


def _random_profile(rng, model: str) -> tuple[placement.ProfileSpec, int]:
    """A profile of `model` and a vGPU count a VM may hold (several only of a full-GPU profile
    on Turing boards, as NVIDIA allows there)."""
    choices = [p for p in PROFILES.values() if p.gpu_model == model and p.series == "Q"]
    spec = rng.choice(choices)
    count = 1
    if rng.random() < 0.2:
        count = rng.randint(2, 3)
        if MODELS[model].multi_vgpu_full_only:
            spec = max(choices, key=lambda p: p.fb_mib)
    return spec, count

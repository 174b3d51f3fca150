"""A mutable working copy of the fleet's vGPU layout, for the placement optimizer.

Every vGPU the optimizer puts anywhere goes through `fleet.placement.check_placement` on this
layout's current state, the one authority on what fits; cheap pre-filters (`might_fit`) only
skip GPUs the check would refuse anyway. Every change is journaled, so a tentative step (say,
draining a GPU) is undone whole when one of its VMs finds no room.

How a plan is applied decides how the layout tracks placement IDs. Applying removes every vGPU
of each VM that moves, then places them again one by one through `fleet.services.place_vgpu`,
which takes the first free placement ID. The vGPUs of VMs that do not move keep theirs. So a
GPU holds two kinds of vGPU: those of VMs still where they were (at their real placement IDs)
and *arrivals*, the vGPUs of moved VMs, in the order they will be placed. On a mixed-size GPU
a slot depends on that order (free memory that is not an aligned free span is unusable), so
the layout keeps arrivals exactly where applying would put them, re-deriving them whenever the
GPU changes (`arrange_mixed`). On an equal-size GPU a placement ID is only a label; the plan gives
them out when it is assembled.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field, replace
from fractions import Fraction

from fleet import placement
from fleet.placement import GpuState, HostState, PlacedVgpu, ProfileSpec, VmState, VmVgpu
from fleet.snapshot import FleetSnapshot

Arrival = tuple[int, ProfileSpec]  # (vm_id, profile) of a vGPU placed again when the plan is applied

#: The code of the violation a drained GPU answers with: nothing may be placed on it.
DRAINED = "plan_drained"


@dataclass(eq=False)
class WorkGpu:
    """A GPU of the working layout: what it holds now and which of those vGPUs are arrivals."""

    id: int
    label: str
    host_id: int
    model: placement.GpuModelSpec
    mode: str
    size_mode: str
    order: tuple[int, int]  # (host id, GPU id): "first" GPU for first-fit
    vgpus: list[PlacedVgpu] = field(default_factory=list)
    arrivals: list[Arrival] = field(default_factory=list)
    fb_used: int = 0
    units_used: int = 0  # mixed-size grid units taken (placement.PLACEMENT_GRID per GPU)
    closed: bool = False  # being drained: it keeps what stays on it and takes nothing new
    _state: GpuState | None = None
    _open_keys: tuple[tuple[str, int], ...] = ()

    @property
    def usable(self) -> bool:
        return self.mode == "vgpu" and not self.closed

    @property
    def mixed(self) -> bool:
        return self.size_mode == "mixed"

    @property
    def count(self) -> int:
        return len(self.vgpus)

    def state(self) -> GpuState:
        """This GPU as placement's dataclass (cached until the GPU changes)."""
        if self._state is None:
            self._state = GpuState(
                id=self.id, label=self.label, host_id=self.host_id, model=self.model, mode=self.mode,
                size_mode=self.size_mode, vgpus=tuple(self.vgpus),
            )
        return self._state

    def state_with(self, vgpus: Iterable[PlacedVgpu]) -> GpuState:
        """This GPU as placement's dataclass holding `vgpus` instead of what it holds."""
        return GpuState(id=self.id, label=self.label, host_id=self.host_id, model=self.model, mode=self.mode,
                        size_mode=self.size_mode, vgpus=tuple(vgpus))

    def fill(self) -> float:
        """Share of the GPU in use, each vGPU counted as 1/(its profile's equal-size maximum): the
        measure of the lower bound, so a mixed-size GPU full of small spans reads as partly used."""
        return sum(1.0 / v.profile.max_per_gpu for v in self.vgpus)


@dataclass(eq=False)
class WorkHost:
    id: int
    name: str
    cpu_threads: int
    ram_gib: int
    vcpu_overcommit: float
    ram_overcommit: float
    vcpu_capacity: int
    ram_capacity_gib: int
    gpu_ids: list[int] = field(default_factory=list)
    allocated_vcpus: int = 0
    allocated_ram_gib: int = 0
    multi_vgpu_same_gpu: bool = False
    _state: HostState | None = None

    def state(self) -> HostState:
        if self._state is None:
            self._state = HostState(
                id=self.id, name=self.name, cpu_threads=self.cpu_threads, ram_gib=self.ram_gib,
                vcpu_overcommit=self.vcpu_overcommit, ram_overcommit=self.ram_overcommit,
                allocated_vcpus=self.allocated_vcpus, allocated_ram_gib=self.allocated_ram_gib,
                multi_vgpu_same_gpu=self.multi_vgpu_same_gpu,
            )
        return self._state

    def has_room(self, vcpus: int, ram_gib: int) -> bool:
        return (self.allocated_vcpus + vcpus <= self.vcpu_capacity
                and self.allocated_ram_gib + ram_gib <= self.ram_capacity_gib)


@dataclass(eq=False)
class WorkVm:
    """A VM of the working layout. `host_id` is the host whose capacity it claims (placement's
    rule: a VM sits on the host of its vGPUs, and leaves it with its last one); `moved` says
    its vGPUs are placed again when the plan is applied."""

    id: int
    name: str
    vcpus: int
    ram_gib: int
    host_id: int | None
    vgpus: list[tuple[int, ProfileSpec]] = field(default_factory=list)  # (gpu_id, profile)
    moved: bool = False


def arrange_mixed(empty: GpuState, staying: list[PlacedVgpu], arrivals: list[Arrival]) -> tuple[
        list[PlacedVgpu], list[Arrival]] | None:
    """Where placing `arrivals` one by one at the first free slot (as `fleet.services.place_vgpu`
    does) puts them on a mixed-size GPU beside the vGPUs `staying` at their placement IDs: the
    GPU's vGPUs and the order of arrivals that gets them all placed, or None if no order does.

    `empty` is the GPU without vGPUs. Tries the arrivals' own order, then largest span first
    (with spans that are aligned powers of two this places whatever fits at all, except where a
    profile may not use the last slots, as A40-1Q uses 30 of 32), then searches the orders."""
    if not arrivals:
        return list(staying), []
    for order in (list(arrivals), sorted(arrivals, key=lambda a: (-placement.mixed_span_units(a[1]), a[1].id, a[0]))):
        placed = _place_in_order(empty, staying, order)
        if placed is not None:
            return placed, order
    order = _search_order(empty, staying, arrivals)
    if order is None:
        return None
    return _place_in_order(empty, staying, order), order


def _place_in_order(empty: GpuState, staying: list[PlacedVgpu], order: list[Arrival]) -> list[PlacedVgpu] | None:
    placed = list(staying)
    for vm_id, profile in order:
        decision = placement.check_gpu_fit(replace(empty, vgpus=tuple(placed)), profile)
        if not decision.ok:
            return None
        placed.append(PlacedVgpu(profile, vm_id, decision.placement_id))
    return placed


def _search_order(empty: GpuState, staying: list[PlacedVgpu], arrivals: list[Arrival]) -> list[Arrival] | None:
    """An order of `arrivals` that first-free placement gets all onto the GPU, by depth-first
    search over which profile goes next (vGPUs of one profile are interchangeable), or None."""
    by_profile: dict[int, list[Arrival]] = {}
    for arrival in arrivals:
        by_profile.setdefault(arrival[1].id, []).append(arrival)
    kinds = sorted(by_profile, key=lambda pid: -placement.mixed_span_units(by_profile[pid][0][1]))
    dead: set[tuple] = set()

    def search(placed: list[PlacedVgpu], left: tuple[int, ...]) -> list[int] | None:
        if not any(left):
            return []
        key = (tuple(sorted((v.placement_id, v.profile.id) for v in placed)), left)
        if key in dead:
            return None
        for i, pid in enumerate(kinds):
            if not left[i]:
                continue
            profile = by_profile[pid][0][1]
            decision = placement.check_gpu_fit(replace(empty, vgpus=tuple(placed)), profile)
            if decision.ok:
                rest = search(placed + [PlacedVgpu(profile, 0, decision.placement_id)],
                              left[:i] + (left[i] - 1,) + left[i + 1:])
                if rest is not None:
                    return [pid, *rest]
        dead.add(key)
        return None

    picks = search(list(staying), tuple(len(by_profile[pid]) for pid in kinds))
    if picks is None:
        return None
    queues = {pid: list(items) for pid, items in by_profile.items()}
    return [queues[pid].pop(0) for pid in picks]


class Layout:
    """The fleet's GPUs, hosts and VMs as mutable records, with indexes of where room is.

    `open_equal[(model, fb_mib)]`: equal-size GPUs holding vGPUs of that size with room for one
    more; `open_mixed[model]`: mixed-size GPUs holding vGPUs, not full; `empty[model]`: vGPU-mode
    GPUs holding nothing. Insertion-ordered dicts used as sets (deterministic iteration).

    `closed`: GPUs being drained. They keep the vGPUs that stay on them but are in no index and
    refuse every vGPU (`check`), so no step of the search puts anything there.
    """

    def __init__(self, snapshot: FleetSnapshot, *, empty: bool = False, closed: frozenset[int] = frozenset()):
        self.snapshot = snapshot
        self.journal: list[Callable[[], None]] = []
        self.hosts: dict[int, WorkHost] = {}
        for h in sorted(snapshot.hosts.values(), key=lambda h: h.id):
            self.hosts[h.id] = WorkHost(
                id=h.id, name=h.name, cpu_threads=h.cpu_threads, ram_gib=h.ram_gib,
                vcpu_overcommit=h.vcpu_overcommit, ram_overcommit=h.ram_overcommit,
                vcpu_capacity=h.vcpu_capacity, ram_capacity_gib=h.ram_capacity_gib,
                multi_vgpu_same_gpu=h.multi_vgpu_same_gpu,
            )
        self.gpus: dict[int, WorkGpu] = {}
        for g in sorted(snapshot.gpus.values(), key=lambda g: (g.host_id, g.id)):
            self.gpus[g.id] = WorkGpu(
                id=g.id, label=g.label, host_id=g.host_id, model=g.model, mode=g.mode, size_mode=g.size_mode,
                order=(g.host_id, g.id), closed=g.id in closed,
            )
            if g.host_id in self.hosts:
                self.hosts[g.host_id].gpu_ids.append(g.id)
        self.gpus_by_model: dict[str, list[int]] = {}
        for gpu in self.gpus.values():
            if gpu.usable:
                self.gpus_by_model.setdefault(gpu.model.name, []).append(gpu.id)
        self.open_equal: dict[tuple[str, int], dict[int, None]] = {}
        self.open_mixed: dict[str, dict[int, None]] = {}
        self.empty: dict[str, dict[int, None]] = {}
        self.vms: dict[int, WorkVm] = {}
        for v in sorted(snapshot.vms.values(), key=lambda v: v.id):
            holds = bool(v.vgpus) and not empty
            vm = WorkVm(id=v.id, name=v.name, vcpus=v.vcpus, ram_gib=v.ram_gib,
                        host_id=v.host_id if (holds or not v.vgpus) else None, moved=bool(v.vgpus) and empty)
            if holds:
                vm.vgpus = [(x.gpu_id, x.profile) for x in v.vgpus]
            self.vms[v.id] = vm
            if vm.host_id is not None and vm.host_id in self.hosts:
                host = self.hosts[vm.host_id]
                host.allocated_vcpus += vm.vcpus
                host.allocated_ram_gib += vm.ram_gib
        for gpu in self.gpus.values():
            if not empty:
                gpu.vgpus = list(snapshot.gpus[gpu.id].vgpus)
                gpu.fb_used = sum(v.profile.fb_mib for v in gpu.vgpus)
                if gpu.mixed:
                    gpu.units_used = sum(placement.mixed_span_units(v.profile) for v in gpu.vgpus)
            self._index(gpu)

    # --- journal -------------------------------------------------------------------------

    def mark(self) -> int:
        return len(self.journal)

    def rollback(self, mark: int) -> None:
        """Undo every change made since `mark`."""
        while len(self.journal) > mark:
            self.journal.pop()()

    def commit(self) -> None:
        """Forget the journal (the changes stay): nothing before now can be undone."""
        self.journal.clear()

    # --- indexes -------------------------------------------------------------------------

    def _index(self, gpu: WorkGpu) -> None:
        if not gpu.usable:
            return
        name = gpu.model.name
        self.empty.setdefault(name, {}).pop(gpu.id, None)
        self.open_mixed.setdefault(name, {}).pop(gpu.id, None)
        for key in gpu._open_keys:
            self.open_equal.get(key, {}).pop(gpu.id, None)
        gpu._open_keys = ()
        if not gpu.vgpus:
            self.empty[name][gpu.id] = None
        elif gpu.mixed:
            if gpu.units_used < placement.PLACEMENT_GRID:
                self.open_mixed[name][gpu.id] = None
        else:
            first = gpu.vgpus[0].profile
            if len(gpu.vgpus) < max(v.profile.max_per_gpu for v in gpu.vgpus):
                key = (name, first.fb_mib)
                self.open_equal.setdefault(key, {})[gpu.id] = None
                gpu._open_keys = (key,)

    # --- low-level setters (journaled) -----------------------------------------------------

    def _set_gpu(self, gpu: WorkGpu, vgpus: list[PlacedVgpu], arrivals: list[Arrival]) -> None:
        old = (gpu.vgpus, gpu.arrivals, gpu.fb_used, gpu.units_used)

        def undo() -> None:
            gpu.vgpus, gpu.arrivals, gpu.fb_used, gpu.units_used = old
            gpu._state = None
            self._index(gpu)

        self.journal.append(undo)
        gpu.vgpus, gpu.arrivals = vgpus, arrivals
        gpu.fb_used = sum(v.profile.fb_mib for v in vgpus)
        gpu.units_used = sum(placement.mixed_span_units(v.profile) for v in vgpus) if gpu.mixed else 0
        gpu._state = None
        self._index(gpu)

    def _set_vm(self, vm: WorkVm, host_id: int | None, vgpus: list[tuple[int, ProfileSpec]], moved: bool) -> None:
        old = (vm.host_id, vm.vgpus, vm.moved)

        def undo() -> None:
            self._claim(vm, vm.host_id, -1)
            vm.host_id, vm.vgpus, vm.moved = old
            self._claim(vm, vm.host_id, +1)

        self.journal.append(undo)
        if host_id != vm.host_id:
            self._claim(vm, vm.host_id, -1)
            self._claim(vm, host_id, +1)
        vm.host_id, vm.vgpus, vm.moved = host_id, vgpus, moved

    def _claim(self, vm: WorkVm, host_id: int | None, sign: int) -> None:
        if host_id is None or host_id not in self.hosts:
            return
        host = self.hosts[host_id]
        host.allocated_vcpus += sign * vm.vcpus
        host.allocated_ram_gib += sign * vm.ram_gib
        host._state = None

    # --- arrangement of mixed-size GPUs -----------------------------------------------------

    def _rebuild(self, gpu: WorkGpu, staying: list[PlacedVgpu], arrivals: list[Arrival]) -> bool:
        """Set the GPU's content: `staying` vGPUs where they are plus `arrivals` (re-derived slots
        on a mixed-size GPU). False, changing nothing, where no order places them all."""
        if gpu.mixed:
            arranged = arrange_mixed(gpu.state_with(()), staying, arrivals)
            if arranged is None:
                return False
            vgpus, arrivals = arranged
        else:
            vgpus = staying + [PlacedVgpu(p, vm_id, None) for vm_id, p in arrivals]
        self._set_gpu(gpu, vgpus, list(arrivals))
        return True

    def _split(self, gpu: WorkGpu) -> tuple[list[PlacedVgpu], list[Arrival]]:
        """The GPU's vGPUs of VMs that do not move, and its arrivals."""
        staying = [v for v in gpu.vgpus if not self.vms[v.vm_id].moved]
        return staying, list(gpu.arrivals)

    def _mark_moved(self, vm: WorkVm) -> bool:
        """Make `vm` a VM that moves: its vGPUs still in place become arrivals where they are
        (applying removes them all and places them again). False, changing nothing, if a
        mixed-size GPU cannot arrange them."""
        if vm.moved:
            return True
        mark = self.mark()
        self._set_vm(vm, vm.host_id, vm.vgpus, True)
        for gpu_id in dict.fromkeys(g for g, _ in vm.vgpus):
            gpu = self.gpus[gpu_id]
            staying = [v for v in gpu.vgpus if v.vm_id != vm.id and not self.vms[v.vm_id].moved]
            arrivals = list(gpu.arrivals) + [(vm.id, v.profile) for v in gpu.vgpus if v.vm_id == vm.id]
            if not self._rebuild(gpu, staying, arrivals):
                self.rollback(mark)
                return False
        return True

    # --- operations ------------------------------------------------------------------------

    def vm_state(self, vm: WorkVm) -> VmState:
        return VmState(
            id=vm.id, name=vm.name, vcpus=vm.vcpus, ram_gib=vm.ram_gib, host_id=vm.host_id,
            vgpus=tuple(VmVgpu(p, g, self.gpus[g].host_id) for g, p in vm.vgpus),
        )

    def might_fit(self, vm: WorkVm, gpu: WorkGpu, profile: ProfileSpec) -> bool:
        """A cheap necessary condition of `check_placement` (model, size, count, frame buffer,
        host capacity), to skip GPUs without asking placement."""
        if not gpu.usable or gpu.model.name != profile.gpu_model or profile.fb_mib > gpu.model.fb_mib - gpu.fb_used:
            return False
        if gpu.mixed:
            if not profile.max_per_gpu_mixed or gpu.units_used + placement.mixed_span_units(profile) > \
                    placement.PLACEMENT_GRID:
                return False
        elif gpu.vgpus and (gpu.vgpus[0].profile.fb_mib != profile.fb_mib or len(gpu.vgpus) >= profile.max_per_gpu):
            return False
        if vm.host_id != gpu.host_id:
            if vm.vgpus:
                return False
            host = self.hosts.get(gpu.host_id)
            if host is None or not host.has_room(vm.vcpus, vm.ram_gib):
                return False
        return True

    def check(self, vm: WorkVm, gpu: WorkGpu, profile: ProfileSpec) -> placement.Decision:
        """placement.check_placement of one more vGPU of `profile` for `vm` on `gpu`, now (a
        closed GPU refuses it)."""
        if gpu.closed:
            return placement.Decision(violations=[placement.Violation(
                DRAINED, f"GPU {gpu.label} is being drained: nothing may be placed on it")])
        return placement.check_placement(gpu.state(), profile, self.vm_state(vm), self.hosts[gpu.host_id].state())

    def add(self, vm: WorkVm, gpu: WorkGpu, profile: ProfileSpec) -> placement.Decision:
        """Place one vGPU of `profile` for `vm` on `gpu` if placement allows it (and, on a
        mixed-size GPU, applying the plan can put it there); returns placement's decision."""
        decision = self.check(vm, gpu, profile)
        if not decision.ok:
            return decision
        mark = self.mark()
        if not self._mark_moved(vm):
            decision.violations.append(placement.Violation(
                placement.Rule.PLACEMENT_SLOT, f"VM {vm.name}'s vGPUs cannot be placed again in order"))
            return decision
        staying, arrivals = self._split(gpu)
        if not self._rebuild(gpu, staying, arrivals + [(vm.id, profile)]):
            self.rollback(mark)
            decision.violations.append(placement.Violation(
                placement.Rule.PLACEMENT_SLOT,
                f"GPU {gpu.label}: no order of placement puts {profile.name} beside the vGPUs arriving there"))
            decision.placement_id = None
            return decision
        self._set_vm(vm, gpu.host_id, vm.vgpus + [(gpu.id, profile)], True)
        return decision

    def remove(self, vm: WorkVm, gpu_ids: Iterable[int] | None = None) -> bool:
        """Take `vm`'s vGPUs off `gpu_ids` (all its GPUs when None). A VM left without vGPU
        leaves its host, as `fleet.services.remove_vgpu` does. False, changing nothing, when a
        mixed-size GPU cannot arrange what remains (see `arrange_mixed`)."""
        targets = set(g for g, _ in vm.vgpus) if gpu_ids is None else set(gpu_ids)
        if not targets:
            return True
        mark = self.mark()
        if not self._mark_moved(vm):
            return False
        for gpu_id in sorted(targets):
            gpu = self.gpus[gpu_id]
            staying, arrivals = self._split(gpu)
            arrivals = [a for a in arrivals if a[0] != vm.id]
            if not self._rebuild(gpu, staying, arrivals):
                self.rollback(mark)
                return False
        left = [(g, p) for g, p in vm.vgpus if g not in targets]
        self._set_vm(vm, vm.host_id if left else None, left, True)
        return True

    # --- queries ---------------------------------------------------------------------------

    def used_gpu_ids(self) -> set[int]:
        return {g.id for g in self.gpus.values() if g.vgpus}

    def gpus_in_use(self) -> int:
        return sum(1 for g in self.gpus.values() if g.vgpus)

    def mapping(self) -> dict[int, list[tuple[int, ProfileSpec]]]:
        """Where every VM's vGPUs are now: vm_id -> [(gpu_id, profile)]."""
        return {vm.id: list(vm.vgpus) for vm in self.vms.values()}


def gpu_lower_bound(snapshot: FleetSnapshot, profiles: Iterable[ProfileSpec]) -> int:
    """No layout of vGPUs of these `profiles` on the fleet's GPUs uses fewer GPUs than this (the
    argument is in `sizing.optimizer.lower_bound`)."""
    equal_gpus: Counter[str] = Counter()
    mixed_gpus: Counter[str] = Counter()
    model_fb: dict[str, int] = {}
    for gpu in snapshot.gpus.values():
        if gpu.mode == "vgpu":
            (mixed_gpus if gpu.size_mode == "mixed" else equal_gpus)[gpu.model.name] += 1
            model_fb[gpu.model.name] = gpu.model.fb_mib
    by_model: dict[str, Counter] = {}
    for profile in profiles:
        by_model.setdefault(profile.gpu_model, Counter())[profile] += 1
    total = 0
    for model, counts in by_model.items():
        sizes: dict[int, int] = Counter()
        caps: dict[int, int] = {}
        fb_mib = model_fb.get(model)
        for profile, n in counts.items():
            sizes[profile.fb_mib] += n
            cap = profile.max_per_gpu if fb_mib is None else min(profile.max_per_gpu, fb_mib // profile.fb_mib)
            caps[profile.fb_mib] = max(caps.get(profile.fb_mib, 0), cap)
        if not mixed_gpus[model]:
            if equal_gpus[model]:
                total += sum(-(-n // caps[s]) for s, n in sizes.items() if caps[s])
            continue
        placeable = Counter({p: n for p, n in counts.items()
                             if p.max_per_gpu_mixed or (equal_gpus[model] and caps[p.fb_mib])})
        total += max(_least_weight(placeable, caps, equal_gpus[model]), _fb_bound(placeable, fb_mib))
    return total


def _least_weight(counts: Counter, caps: dict[int, int], equal_gpus: int) -> int:
    """The fewest GPUs of a model with mixed-size GPUs that can hold `counts` (profile -> vGPUs),
    GPUs counted as weight: 1/cap(size) a vGPU on an equal-size GPU, span/32 on a mixed-size one
    (each GPU holds at most 1). Every vGPU would take its smaller weight, but the equal-size GPUs
    hold at most `equal_gpus` of weight: the least total is a fractional knapsack, the room on
    equal-size GPUs going first to the vGPUs that save the most span per unit of room."""
    total = Fraction(0)
    room = Fraction(equal_gpus)
    savers = []  # (saving per unit of equal-size room, equal-size weight of all of them)
    for profile, n in counts.items():
        equal = Fraction(1, caps[profile.fb_mib]) if equal_gpus and caps[profile.fb_mib] else None
        mixed = (Fraction(placement.mixed_span_units(profile), placement.PLACEMENT_GRID)
                 if profile.max_per_gpu_mixed else None)
        if mixed is None and equal is None:
            continue
        if mixed is None:
            total += n * equal
            room -= n * equal
        elif equal is None or mixed <= equal:
            total += n * mixed
        else:
            total += n * mixed
            savers.append(((mixed - equal) / equal, n * equal))
    room = max(room, Fraction(0))
    for saving, need in sorted(savers, key=lambda s: s[0], reverse=True):
        used = min(room, need)
        total -= used * saving
        room -= used
    return math.ceil(total)


def _fb_bound(counts: Counter, fb_mib: int | None) -> int:
    """GPUs needed for the frame buffer alone."""
    if not fb_mib:
        return 0
    return math.ceil(Fraction(sum(n * p.fb_mib for p, n in counts.items()), fb_mib))


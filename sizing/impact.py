"""What one resize would do to the fleet: does it fit where the VM is, or where must it go, and
how many GPUs does it free or cost.

Pure code over a `sizing.snapshot.FleetSnapshot`; every "does it fit" is asked of
`fleet.placement.check_placement`, the same rules the services apply when the resize is
approved. A resize is modelled as the VM giving up all its vGPUs and taking `vgpus` new ones of
the target profile, one per GPU (multi-vGPU is there to give a VM more GPUs, not several slices
of one), all on one host.

Which plan is reported, in order of preference:

1. **Fewest GPUs in use** afterwards (`gpus_delta`), the figure the fleet is run to keep low;
2. then **in place** (its own GPUs: no migration), then a move on its own host, then a move to
   another host (by host id);
3. within a host, GPUs already in use first, fullest first (packing the VM beside others keeps
   empty GPUs free for large profiles), then empty GPUs; ties by GPU id, so the answer is
   deterministic.

So a 12Q that can grow to a 24Q in place is reported in place, while a 24Q shrinking to a 12Q
that could join another 12Q is reported as a move that frees its GPU (`fits_in_place` still
says it would fit where it is).
"""

from __future__ import annotations

from collections import Counter, defaultdict
from dataclasses import dataclass, replace

from fleet import placement
from fleet.placement import GpuState, PlacedVgpu, ProfileSpec, VmState, VmVgpu
from sizing.snapshot import FleetSnapshot

SAME_GPU = "same_gpu"
MOVE = "move"
NOWHERE = "nowhere"


@dataclass(frozen=True)
class Impact:
    """Where a resize lands and what it costs.

    `fits`: SAME_GPU (on the VM's own GPUs; extra vGPUs of a grown VM on other GPUs of its
    host), MOVE or NOWHERE. `gpu_ids`: the GPUs the new vGPUs take, in placement order (empty
    for NOWHERE); `host_id` their host. `gpus_delta`: GPUs holding a vGPU after minus before
    (negative frees GPUs). `detail`: one sentence for people. `violations`: why the target does
    not fit in place (empty when it does): the placement rules its own GPU refused, so an
    admin sees the rule (e.g. the equal-size rule), or that its host has no other GPU for the
    vGPUs it gains. `fits_in_place`: whether it would fit on its own GPUs, even when a move
    that frees GPUs is reported instead.
    """

    fits: str
    gpu_ids: tuple[int, ...]
    host_id: int | None
    gpus_delta: int
    detail: str
    violations: tuple[str, ...] = ()
    fits_in_place: bool = False


@dataclass(frozen=True)
class _Plan:
    gpu_ids: tuple[int, ...]
    host_id: int
    gpus_delta: int
    newly_used: tuple[int, ...]


class ImpactCalculator:
    """Answers `impact(vm_id, profile, vgpus)` for many VMs of one snapshot.

    Indexes the GPUs by model and host once, so each call looks only at the GPUs of the target
    profile's model: a refresh over every VM of a 1,000-GPU fleet stays linear in the fleet.
    """

    def __init__(self, snapshot: FleetSnapshot):
        self.snapshot = snapshot
        self._by_model: dict[str, dict[int, list[int]]] = defaultdict(lambda: defaultdict(list))
        self._gpu_fit: dict[tuple[int, int], bool] = {}
        for gpu_id in sorted(snapshot.gpus):
            gpu = snapshot.gpus[gpu_id]
            self._by_model[gpu.model.name][gpu.host_id].append(gpu_id)

    def impact(self, vm_id: int, profile: ProfileSpec, vgpus: int | None = None) -> Impact:
        """Where `vgpus` vGPUs of `profile` (default: as many as the VM holds now, at least one)
        would go for VM `vm_id`, and how many GPUs that frees or costs (see the module)."""
        vm = self.snapshot.vms[vm_id]
        count = vgpus or len(vm.vgpus) or 1
        own = list(dict.fromkeys(v.gpu_id for v in vm.vgpus))
        # The fleet with the VM's vGPUs gone: only its own GPUs change.
        emptied = {gpu_id: _without_vm(self.snapshot.gpus[gpu_id], vm_id) for gpu_id in own}
        bare_vm = replace(vm, vgpus=())

        in_place, violations = self._in_place(bare_vm, own, emptied, profile, count)
        best = in_place
        # A move can only do better when the VM's leaving empties one of its GPUs, or when the
        # in-place plan needed GPUs that were empty.
        could_free = any(not gpu.vgpus for gpu in emptied.values())
        if in_place is None or could_free or in_place.newly_used:
            move = self._best_move(bare_vm, own, emptied, profile, count)
            if move is not None and (best is None or move.gpus_delta < best.gpus_delta):
                best = move
        if best is None:
            return Impact(
                fits=NOWHERE, gpu_ids=(), host_id=None, gpus_delta=0,
                detail=f"No GPU in the fleet has room for {count} x {profile.name}",
                violations=violations,
            )
        fits = SAME_GPU if best is in_place else MOVE
        return Impact(
            fits=fits, gpu_ids=best.gpu_ids, host_id=best.host_id, gpus_delta=best.gpus_delta,
            detail=self._detail(fits, best, own, emptied, in_place is not None),
            violations=violations, fits_in_place=in_place is not None,
        )

    # Plans ----------------------------------------------------------------------------------

    def _in_place(self, vm: VmState, own: list[int], emptied: dict[int, GpuState], profile: ProfileSpec,
                  count: int) -> tuple[_Plan | None, tuple[str, ...]]:
        """The VM's own GPUs take the new vGPUs (the first `count` of them when it shrinks);
        vGPUs beyond its GPU count go on other GPUs of its host. Returns the plan (None when it
        does not fit) and the violations on its own GPUs."""
        if not own:
            return None, ()
        state = dict(emptied)
        placed: list[int] = []
        vm_now = vm
        for gpu_id in own[:count]:
            decision = self._check(state[gpu_id], profile, vm_now)
            if not decision.ok:
                return None, tuple(str(v) for v in decision.violations)
            vm_now = self._place(state, gpu_id, profile, vm_now, decision.placement_id)
            placed.append(gpu_id)
        host_id = self.snapshot.gpus[own[0]].host_id
        if count > len(placed):
            extra = self._fill(state, host_id, profile, vm_now, count - len(placed), exclude=set(placed))
            if extra is None:
                missing = count - len(placed)
                return None, (f"Host {self.snapshot.hosts[host_id].name} has no other GPU with room for "
                              f"{missing} more {profile.name}",)
            placed.extend(extra)
        return self._plan(placed, host_id, own, emptied), ()

    def _best_move(self, vm: VmState, own: list[int], emptied: dict[int, GpuState], profile: ProfileSpec,
                   count: int) -> _Plan | None:
        """The best plan over all hosts holding GPUs of the profile's model: fewest GPUs in use,
        then the VM's own host, then host id. Stops at the first plan that takes no empty GPU,
        since no later host can do better."""
        hosts = sorted(self._by_model.get(profile.gpu_model, {}), key=lambda h: (h != vm.host_id, h))
        best = None
        for host_id in hosts:
            state = dict(emptied)
            placed = self._fill(state, host_id, profile, vm, count, exclude=set())
            if placed is None:
                continue
            plan = self._plan(placed, host_id, own, emptied)
            if best is None or plan.gpus_delta < best.gpus_delta:
                best = plan
            if not plan.newly_used:
                break
        return best

    def _fill(self, state: dict[int, GpuState], host_id: int, profile: ProfileSpec, vm: VmState, count: int,
              exclude: set[int]) -> list[int] | None:
        """`count` GPUs of `host_id` that take one vGPU each, GPUs in use first (fullest first),
        then empty ones; None when the host has too few. Updates `state` as it places."""
        host = self.snapshot.hosts[host_id]
        if vm.host_id != host_id and placement.check_vm_fits_host(vm.name, vm.vcpus, vm.ram_gib, host):
            return None
        candidates = [
            state.get(g) or self.snapshot.gpus[g]
            for g in self._by_model.get(profile.gpu_model, {}).get(host_id, ())
            if g not in exclude and (g in state or self._takes(g, profile))
        ]
        placed: list[int] = []
        for gpu in sorted(candidates, key=lambda g: (not g.vgpus, -g.used_fb_mib, g.id)):
            if len(placed) == count:
                break
            decision = self._check(state.get(gpu.id, gpu), profile, vm)
            if decision.ok:
                vm = self._place(state, gpu.id, profile, vm, decision.placement_id)
                placed.append(gpu.id)
        return placed if len(placed) == count else None

    def _takes(self, gpu_id: int, profile: ProfileSpec) -> bool:
        """Whether an untouched GPU of the snapshot takes one more `profile` by its own rules,
        remembered per GPU and profile: in a refresh over the whole fleet most GPUs are full or
        hold another size, and this turns them away without asking the rules again."""
        key = (gpu_id, profile.id)
        if key not in self._gpu_fit:
            self._gpu_fit[key] = placement.check_gpu_fit(self.snapshot.gpus[gpu_id], profile).ok
        return self._gpu_fit[key]

    def _check(self, gpu: GpuState, profile: ProfileSpec, vm: VmState) -> placement.Decision:
        return placement.check_placement(gpu, profile, vm, self.snapshot.hosts[gpu.host_id])

    def _place(self, state: dict[int, GpuState], gpu_id: int, profile: ProfileSpec, vm: VmState,
               placement_id: int | None) -> VmState:
        gpu = state.get(gpu_id, self.snapshot.gpus[gpu_id])
        state[gpu_id] = replace(gpu, vgpus=(*gpu.vgpus, PlacedVgpu(profile, vm.id, placement_id)))
        return replace(vm, vgpus=(*vm.vgpus, VmVgpu(profile, gpu_id, gpu.host_id)))

    def _plan(self, placed: list[int], host_id: int, own: list[int], emptied: dict[int, GpuState]) -> _Plan:
        """GPUs in use after minus before, counted over the GPUs the resize touches."""
        newly_used = tuple(g for g in placed if not (emptied.get(g) or self.snapshot.gpus[g]).vgpus)
        freed = [g for g in own if not emptied[g].vgpus and g not in placed]
        was_empty_before = [g for g in newly_used if g not in own]
        return _Plan(tuple(placed), host_id, len(was_empty_before) - len(freed), newly_used)

    # Words --------------------------------------------------------------------------------

    def _detail(self, fits: str, plan: _Plan, own: list[int], emptied: dict[int, GpuState],
                fits_in_place: bool) -> str:
        """One sentence: where the vGPUs go, why (when a move is chosen over a fit in place) and the
        GPUs freed or taken."""
        gpus = self.snapshot.gpus
        if fits == SAME_GPU:
            kept = [gpus[g].label for g in plan.gpu_ids if g in own]
            extra = [gpus[g].label for g in plan.gpu_ids if g not in own]
            text = f"Fits on its {_gpus(kept)}"
            if extra:
                text += f", the added vGPU{'s' if len(extra) > 1 else ''} on {_gpus(extra)} of the same host"
            return text + _delta_words(plan.gpus_delta)
        host = self.snapshot.hosts[plan.host_id].name
        targets = f"{_join([self._describe_target(g, emptied) for g in plan.gpu_ids])} on host {host}"
        if fits_in_place:
            mine = _gpus([gpus[g].label for g in own])
            return f"Fits on its {mine}, but a move to {targets}{_delta_words(plan.gpus_delta, lead=' ')}"
        return f"Needs a move to {targets}{_delta_words(plan.gpus_delta)}"

    def _describe_target(self, gpu_id: int, emptied: dict[int, GpuState]) -> str:
        gpu = emptied.get(gpu_id) or self.snapshot.gpus[gpu_id]
        if not gpu.vgpus:
            return f"GPU {gpu.label} (empty)"
        names = [name for name, _ in Counter(v.profile.name for v in gpu.vgpus).most_common()]
        return f"GPU {gpu.label} (holds {_join(names)} vGPUs with a free slot)"


def resize_impact(snapshot: FleetSnapshot, vm_id: int, profile: ProfileSpec, vgpus: int | None = None) -> Impact:
    """Where VM `vm_id` would hold `vgpus` vGPUs of `profile` and what that frees or costs; see
    `ImpactCalculator` to ask for many VMs of one snapshot."""
    return ImpactCalculator(snapshot).impact(vm_id, profile, vgpus)


def _without_vm(gpu: GpuState, vm_id: int) -> GpuState:
    return replace(gpu, vgpus=tuple(v for v in gpu.vgpus if v.vm_id != vm_id))


def _join(items: list[str]) -> str:
    return items[0] if len(items) == 1 else ", ".join(items[:-1]) + " and " + items[-1]


def _gpus(labels: list[str]) -> str:
    return f"GPU{'s' if len(labels) > 1 else ''} {_join(labels)}"


def _delta_words(delta: int, lead: str = "; ") -> str:
    if delta < 0:
        return f"{lead}frees {-delta} GPU{'s' if delta < -1 else ''}"
    if delta > 0:
        return f"{lead}takes {delta} more GPU{'s' if delta > 1 else ''}"
    return ""

"""Where a resize fits: the one answer the request queue, the API, the artist's form, approval
and the right-sizing suggestions all ask.

Pure code over a `fleet.snapshot.FleetSnapshot` (no ORM): every "does it fit" is asked of
`fleet.placement.check_placement`, the rules the services apply when the resize is written.
A resize is modelled as the VM giving up all its vGPUs and taking `vgpus` new ones of the
target profile, all on one host, each on a GPU of its own unless the host allows several of
one VM on one GPU (`HostState.multi_vgpu_same_gpu`; the placement rule `Rule.VM_SAME_GPU`
decides, this module only orders the questions).

Approval (`fleet.requests.approve`) takes a snapshot under its locks, asks `impact` and places
the vGPUs on exactly the GPUs it names, so what the queue says is what approval does.

Which plan is reported, in order of preference:

1. **On the VM's own host** (no host migration; a resize re-creates the VM's vGPUs anyway, so
   another GPU of its host costs the artist nothing more): the plan with the fewest GPUs in
   use afterwards (`gpus_delta`), **in place** on a tie (its own GPUs take the new vGPUs, the
   first `vgpus` of them when it shrinks; vGPUs it gains go on other GPUs of its host).
2. Else **another host**: the one where it takes the fewest GPUs in use afterwards, then by
   host id.

Within a host, GPUs already in use first, fullest first (packing the VM beside others keeps
empty GPUs free for large profiles), then empty GPUs; a GPU already holding one of the VM's
new vGPUs comes last (only tried where the host allows several on one GPU); ties by GPU id,
so the answer is deterministic.

A move to another host that would free more GPUs than staying is not chosen (a migration has a
cost the artist pays); it is reported beside the answer (`frees_by_moving`) for the admin, who
can plan it with the optimizer.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from dataclasses import dataclass, replace

from fleet import placement
from fleet.placement import GpuState, HostState, PlacedVgpu, ProfileSpec, VmState, VmVgpu
from fleet.snapshot import FleetSnapshot

SAME_GPU = "same_gpu"
MOVE = "move"
NOWHERE = "nowhere"

#: How many hosts' refusals a "fits nowhere" answer quotes (the best candidates first).
MAX_REFUSALS = 3


@dataclass(frozen=True)
class Impact:
    """Where a resize lands and what it costs.

    `fits`: SAME_GPU (on the VM's own GPUs; extra vGPUs of a grown VM on other GPUs of its
    host), MOVE or NOWHERE. `gpu_ids`: the GPUs the new vGPUs take, in placement order (empty
    for NOWHERE); `host_id` their host. `gpus_delta`: GPUs holding a vGPU after minus before
    (negative frees GPUs). `detail`: one sentence for people. `violations`: why the target does
    not fit in place (empty when it does): the placement rules its own GPU refused, so an
    admin sees the rule (e.g. the equal-size rule), or that its host has no other GPU for the
    vGPUs it gains. `refusals`: for NOWHERE, why each of the best candidate hosts refused, one
    sentence per host. `fits_in_place`: whether it fits on its own GPUs. `frees_by_moving`:
    how many more GPUs a move would free than the fit in place (0 when none would).
    """

    fits: str
    gpu_ids: tuple[int, ...]
    host_id: int | None
    gpus_delta: int
    detail: str
    violations: tuple[str, ...] = ()
    fits_in_place: bool = False
    refusals: tuple[str, ...] = ()
    frees_by_moving: int = 0


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
        home = self.snapshot.gpus[own[0]].host_id if own else vm.host_id

        in_place, violations = self._in_place(bare_vm, own, emptied, profile, count)
        # Another GPU of its host can only do better when the VM's leaving empties one of its
        # GPUs, or when the fit in place needed GPUs that were empty.
        could_free = any(not gpu.vgpus for gpu in emptied.values()) or in_place is None or in_place.newly_used
        home_plan, home_refusal = None, ""
        if home is not None and could_free and home in self._by_model.get(profile.gpu_model, {}):
            home_plan, home_refusal = self._fill(dict(emptied), home, profile, bare_vm, count)
            home_plan = self._plan(home_plan, home, own, emptied) if home_plan is not None else None
        mine = [plan for plan in (in_place, home_plan) if plan is not None]
        if mine:
            best = min(mine, key=lambda plan: (plan.gpus_delta, plan is not in_place))
            fits = SAME_GPU if best is in_place else MOVE
            frees = 0
            if could_free and any(not gpu.vgpus for gpu in emptied.values()):
                other, _ = self._best_move(bare_vm, home, emptied, profile, count, own)
                if other is not None and other.gpus_delta < best.gpus_delta:
                    frees = best.gpus_delta - other.gpus_delta
            return Impact(
                fits=fits, gpu_ids=best.gpu_ids, host_id=best.host_id, gpus_delta=best.gpus_delta,
                detail=self._detail(fits, best, own, emptied, in_place is not None, frees), violations=violations,
                fits_in_place=in_place is not None, frees_by_moving=frees,
            )
        move, refusals = self._best_move(bare_vm, home, emptied, profile, count, own)
        if move is None:
            return Impact(
                fits=NOWHERE, gpu_ids=(), host_id=None, gpus_delta=0,
                detail=f"No host has room for {count} x {profile.name}", violations=violations,
                refusals=tuple(([home_refusal] if home_refusal else []) + refusals)[:MAX_REFUSALS],
            )
        return Impact(
            fits=MOVE, gpu_ids=move.gpu_ids, host_id=move.host_id, gpus_delta=move.gpus_delta,
            detail=self._detail(MOVE, move, own, emptied, False, 0), violations=violations,
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
            missing = count - len(placed)
            extra, _ = self._fill(state, host_id, profile, vm_now, missing)
            if extra is None:
                return None, (f"Host {self.snapshot.hosts[host_id].name} has no other GPU with room for "
                              f"{missing} more {profile.name}",)
            placed.extend(extra)
        return self._plan(placed, host_id, own, emptied), ()

    def _best_move(self, vm: VmState, home: int | None, emptied: dict[int, GpuState], profile: ProfileSpec,
                   count: int, own: list[int]) -> tuple[_Plan | None, list[str]]:
        """The best host other than the VM's own: the fewest GPUs in use afterwards, then host id;
        with the refusal of every host tried, when none takes the vGPUs. Stops at the first host
        whose plan takes no empty GPU: no later host does better."""
        hosts = sorted(h for h in self._by_model.get(profile.gpu_model, {}) if h != home)
        best, refusals = None, []
        for host_id in hosts:
            placed, refusal = self._fill(dict(emptied), host_id, profile, vm, count)
            if placed is None:
                refusals.append(refusal)
                continue
            plan = self._plan(placed, host_id, own, emptied)
            if best is None or plan.gpus_delta < best.gpus_delta:
                best = plan
            if not plan.newly_used:
                break
        if not hosts and home not in self._by_model.get(profile.gpu_model, {}):
            refusals.append(f"No host has a GPU of model {profile.gpu_model}.")
        return best, refusals

    def _fill(self, state: dict[int, GpuState], host_id: int, profile: ProfileSpec, vm: VmState,
              count: int) -> tuple[list[int] | None, str]:
        """GPUs of `host_id` for `count` new vGPUs, one at a time, each on the first GPU in the
        module's order that placement accepts; (None, why) when the host cannot take them all.
        Updates `state` as it places."""
        host = self.snapshot.hosts[host_id]
        if vm.host_id != host_id:
            refused = placement.check_vm_fits_host(vm.name, vm.vcpus, vm.ram_gib, host)
            if refused:
                return None, f"On {host.name}: {'; '.join(str(v) for v in refused)}."
        candidates = [g for g in self._by_model.get(profile.gpu_model, {}).get(host_id, ())
                      if g in state or self._takes(g, profile)]
        placed: list[int] = []
        for _ in range(count):
            last_refusal = None
            for gpu_id in sorted(candidates, key=lambda g: self._order(state, g, vm.id)):
                decision = self._check(state.get(gpu_id, self.snapshot.gpus[gpu_id]), profile, vm)
                if decision.ok:
                    vm = self._place(state, gpu_id, profile, vm, decision.placement_id)
                    placed.append(gpu_id)
                    break
                last_refusal = decision.violations
            else:
                if last_refusal is None:  # every GPU turned away by its own rules: quote the last one's
                    gpu_id = self._by_model[profile.gpu_model][host_id][-1]
                    gpu = state.get(gpu_id) or self.snapshot.gpus[gpu_id]
                    last_refusal = placement.check_gpu_fit(gpu, profile).violations or None
                return None, self._refusal(host, profile, count, placed, last_refusal)
        return placed, ""

    def _order(self, state: dict[int, GpuState], gpu_id: int, vm_id: int) -> tuple:
        gpu = state.get(gpu_id) or self.snapshot.gpus[gpu_id]
        return any(v.vm_id == vm_id for v in gpu.vgpus), not gpu.vgpus, -gpu.used_fb_mib, gpu_id

    def _refusal(self, host: placement.HostState, profile: ProfileSpec, count: int, placed: list[int],
                 refused: list[placement.Violation] | None) -> str:
        """Why `host` cannot take `count` vGPUs of `profile`, having found room for `placed`:
        the rules the last GPU tried quoted, or how many distinct GPUs it lacks."""
        if not placed:
            why = ("; ".join(str(v) for v in refused) if refused else
                   f"every {profile.gpu_model} GPU is full or holds another size")
            return f"On {host.name}: {why}."
        if host.multi_vgpu_same_gpu:
            return f"On {host.name}: room for {len(placed)} of {count} x {profile.name} only."
        gpus = len(set(placed))
        return (f"On {host.name}: {count} x {profile.name} needs {count} GPUs with room, one for each vGPU "
                f"of the VM; {gpus} {'has' if gpus == 1 else 'have'} room.")

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
        newly_used = tuple(dict.fromkeys(g for g in placed if not (emptied.get(g) or self.snapshot.gpus[g]).vgpus))
        freed = [g for g in own if not emptied[g].vgpus and g not in placed]
        was_empty_before = [g for g in newly_used if g not in own]
        return _Plan(tuple(placed), host_id, len(was_empty_before) - len(freed), newly_used)

    # Words --------------------------------------------------------------------------------

    def _detail(self, fits: str, plan: _Plan, own: list[int], emptied: dict[int, GpuState], fits_in_place: bool,
                frees: int) -> str:
        """One sentence: where the vGPUs go, why (when a move is chosen over a fit in place), the
        GPUs freed or taken, and what a move to another host would free besides."""
        gpus = self.snapshot.gpus
        if fits == SAME_GPU:
            kept = list(dict.fromkeys(gpus[g].label for g in plan.gpu_ids if g in own))
            extra = list(dict.fromkeys(gpus[g].label for g in plan.gpu_ids if g not in own))
            text = f"Fits on its {_gpus(kept)}"
            if extra:
                added = len([g for g in plan.gpu_ids if g not in own])
                text += f", the added vGPU{'s' if added > 1 else ''} on {_gpus(extra)} of the same host"
            text += _delta_words(plan.gpus_delta)
        else:
            host = self.snapshot.hosts[plan.host_id].name
            targets = (f"{_join([self._describe_target(g, emptied) for g in dict.fromkeys(plan.gpu_ids)])} "
                       f"on host {host}")
            if fits_in_place:
                mine = _gpus([gpus[g].label for g in own])
                text = f"Fits on its {mine}, but a move to {targets}{_delta_words(plan.gpus_delta, lead=' ')}"
            else:
                text = f"Needs a move to {targets}{_delta_words(plan.gpus_delta)}"
        if frees:
            text += (f"; a move to another host would free {frees} more GPU{'s' if frees > 1 else ''} "
                     "(the optimizer can plan it)")
        return text

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


def resized(snapshot: FleetSnapshot, vm_id: int, vcpus: int, ram_gib: int) -> FleetSnapshot:
    """`snapshot` with VM `vm_id` at `vcpus` and `ram_gib`, its host's claims following: a resize
    that also changes the VM's vCPUs or RAM is judged by the size it will have, on any host."""
    vm = snapshot.vms[vm_id]
    if (vm.vcpus, vm.ram_gib) == (vcpus, ram_gib):
        return snapshot
    hosts = dict(snapshot.hosts)
    if vm.host_id in hosts:
        hosts[vm.host_id] = _claiming(hosts[vm.host_id], vm, vcpus, ram_gib)
    return replace(snapshot, hosts=hosts, vms={**snapshot.vms, vm_id: replace(vm, vcpus=vcpus, ram_gib=ram_gib)})


def _claiming(host: HostState, vm: VmState, vcpus: int, ram_gib: int) -> HostState:
    """`host` with VM `vm` (one of its VMs) claiming `vcpus` and `ram_gib` instead of its size now."""
    return replace(host, allocated_vcpus=host.allocated_vcpus - vm.vcpus + vcpus,
                   allocated_ram_gib=host.allocated_ram_gib - vm.ram_gib + ram_gib)


def size_refusals(snapshot: FleetSnapshot, vm_id: int, host_id: int, vcpus: int,
                  ram_gib: int) -> list[placement.Violation]:
    """Why host `host_id` cannot give VM `vm_id` `vcpus` and `ram_gib` beside its other VMs
    (empty when it can): `placement.check_vm_fits_host`, with the VM's own claim on the host
    left out (the snapshot counts every VM recorded on a host)."""
    vm, host = snapshot.vms[vm_id], snapshot.hosts[host_id]
    if vm.host_id == host_id:
        host = _claiming(host, vm, 0, 0)
    return placement.check_vm_fits_host(vm.name, vcpus, ram_gib, host)


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

"""The fleet placement optimizer: a plan that holds every vGPU (pending changes included) on
as few GPUs as the rules allow, moving as few VMs as it can.

Pure Python over a `FleetSnapshot`, no ORM: `sizing.tasks` runs it on a worker, and
`sizing.optimizer_runs` applies a plan an admin accepted. Every vGPU the plan places passed
`fleet.placement.check_placement` on the state the plan builds, the rules the inventory
enforces; `verify` replays a plan through those rules again and says what, if anything, a
plan breaks.

How a plan is found (`optimize`; the steps are in `sizing.consolidation`):

1. **Pending changes** first (resize requests, accepted suggestions): each VM named in one
   loses its vGPUs and gets the new ones, on its own GPUs where they still fit, else on its
   host, else on the fullest GPU with room. A change nothing can take stays out of the plan,
   in `unplaced` with the reason, and its VM keeps what it has (later steps try it again).
2. **Drains**: the least-filled GPUs are emptied one by one, each of their VMs moving into a
   free slot of a fuller GPU (same host first, then any host whose vCPU and RAM allow; a VM's
   vGPUs stay on one host). A drain is kept only if the GPU empties, so no VM moves for
   nothing. Passes repeat until none frees a GPU.
3. **Mixed-size GPUs re-packed**: their VMs go where equal-size GPUs hold them denser (an
   L40S-8Q takes 12 GB of a mixed-size GPU, 8 GB of an equal-size one), then drains again;
   kept only if GPUs are saved.
4. **Exchanges**: a few GPUs at a time are taken apart and their VMs packed again (seeded,
   so a fleet always gets the same plan), kept when GPUs are saved or a change left out
   finds room; then VMs moved for nothing go back to their own GPUs.
5. **First-fit decreasing** from scratch as a guard: if it leaves out fewer changes or needs
   fewer GPUs, its layout is taken instead, relabelled among identical hosts and identical
   GPUs of a host so that as many VMs as possible stay where they are.
6. The plan is **assembled** the way it will be applied (see `sizing.packing`): the vGPUs of
   VMs that stay, then those of moved VMs in the order that places them at the slots the plan
   says. Should that ever fail, the next candidate is taken, down to making only the changes
   (or nothing), so the plan returned passes `verify`.

Objective: fewest GPUs holding a vGPU, then fewest VMs moved.

**Draining GPUs** (`optimize(..., drained=...)`, for a GPU that is failing) is another
objective: empty those GPUs and disturb nothing else. Consolidating at the same time would move
VMs that are fine where they are (a drain would reshuffle the fleet to save GPUs), so a drain
plan only makes the changes, then moves each VM still on a drained GPU to the fullest GPU with
room (its own host first, then an empty GPU there, then other hosts; see
`sizing.consolidation.evacuate`); no other VM moves, and nothing is placed on a drained GPU. A
VM that finds no room stays where it is and is listed in `unplaced` with the reason; `verify`
refuses a plan that puts a vGPU on a drained GPU or leaves one there without saying so.
"""

from __future__ import annotations

import math
import random
import time
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass, field, replace

from fleet import placement
from fleet.placement import MAX_VGPUS_PER_VM, GpuState, PlacedVgpu, ProfileSpec, Violation, VmState, VmVgpu
from fleet.snapshot import FleetSnapshot
from sizing import consolidation as search
from sizing.packing import DRAINED, Arrival, Layout, arrange_mixed, gpu_lower_bound

ProgressCallback = Callable[[float, str], None]

CONSOLIDATION = "consolidation"
#: The reason of a move that takes a VM off a drained GPU (and the strategy of a drain plan).
DRAIN = "drain"


class PlanRule:
    """Codes of what `verify` finds wrong with a plan itself, beside `placement.Rule` codes."""

    CHANGE = "plan_change"  # a VM named in a change did not get what the change asks
    KEPT = "plan_kept"  # a VM not named in a change lost or changed its vGPUs
    MOVES = "plan_moves"  # the moves do not list exactly the VMs whose placement differs
    COUNTS = "plan_counts"  # GPU counts or freed / newly used GPUs do not match the layout
    UNKNOWN = "plan_unknown"  # an assignment names a VM, GPU or profile the fleet does not have
    DRAINED = DRAINED  # a vGPU put on a drained GPU, or left there without being listed unplaced


@dataclass(frozen=True)
class Change:
    """A pending change the plan must include: give VM `vm_id` `vgpus` vGPUs of `profile_id`
    (all its vGPUs; `vgpus=0` with `profile_id=None` removes them). `source` says where it
    comes from ("resize-request:12") and is the reason shown for the move it causes."""

    vm_id: int
    profile_id: int | None
    vgpus: int
    source: str = ""


@dataclass(frozen=True)
class Assignment:
    """One vGPU in the target layout: VM, GPU, profile and placement ID."""

    vm_id: int
    gpu_id: int
    profile_id: int
    placement_id: int


@dataclass(frozen=True)
class Move:
    """A VM whose vGPUs change GPU, slot or profile, or are created or removed."""

    vm_id: int
    vm_name: str
    from_gpu_ids: tuple[int, ...]
    to_gpu_ids: tuple[int, ...]
    from_host_id: int | None
    to_host_id: int | None
    from_profile_id: int | None
    to_profile_id: int | None
    reason: str


@dataclass(frozen=True)
class Plan:
    """A target layout of the whole fleet and how it differs from now.

    `assignments` lists every vGPU of the target layout: first those of VMs that do not move, at
    the placement IDs they have now, then those of the VMs in `moves`, in the order in which
    placing them (after removing every vGPU of those VMs) through `fleet.services.place_vgpu`,
    which takes the first free placement ID, puts each at the placement ID given here. Replayed
    in this order from an empty fleet, each passes `placement.check_placement`.

    `lower_bound`: no layout of the vGPUs this plan holds uses fewer GPUs (see `lower_bound`).
    `unplaced`: the changes left out, with why; their VMs keep what they have. `changes`: the
    changes the plan was asked to include (so `verify` can check them). `drained`: the GPUs the
    plan empties; a VM left on one is in `unplaced`, saying why.
    """

    assignments: tuple[Assignment, ...]
    moves: tuple[Move, ...]
    gpus_before: int
    gpus_after: int
    lower_bound: int
    freed_gpu_ids: tuple[int, ...]
    newly_used_gpu_ids: tuple[int, ...]
    unplaced: tuple[tuple[int, str], ...]
    seconds: float
    changes: tuple[Change, ...] = ()
    strategy: str = ""  # which candidate won: "consolidation", "first-fit decreasing", ...
    drained: tuple[int, ...] = ()

    def to_json(self) -> dict:
        """The plan as JSON-serialisable data (lists and numbers), for OptimizerRun.result."""
        return {
            "assignments": [asdict(a) for a in self.assignments],
            "moves": [{**asdict(m), "from_gpu_ids": list(m.from_gpu_ids), "to_gpu_ids": list(m.to_gpu_ids)}
                      for m in self.moves],
            "gpus_before": self.gpus_before,
            "gpus_after": self.gpus_after,
            "lower_bound": self.lower_bound,
            "freed_gpu_ids": list(self.freed_gpu_ids),
            "newly_used_gpu_ids": list(self.newly_used_gpu_ids),
            "unplaced": [[vm_id, reason] for vm_id, reason in self.unplaced],
            "seconds": round(self.seconds, 3),
            "changes": [asdict(c) for c in self.changes],
            "strategy": self.strategy,
            "drained": list(self.drained),
        }


# --- demand ------------------------------------------------------------------------------

@dataclass
class _Demand:
    """What the target layout must hold: per VM the profiles of its vGPUs, the changes that set
    them, and the changes refused before any search (unknown VM or profile, too many vGPUs)."""

    profiles: dict[int, list[ProfileSpec]]
    changes: dict[int, Change]
    refused: dict[int, str] = field(default_factory=dict)


def _demand(snapshot: FleetSnapshot, changes: Iterable[Change]) -> _Demand:
    """The profiles every VM should hold once `changes` are made (a later change of one VM
    replaces an earlier one), and the changes refused outright with the reason."""
    accepted: dict[int, Change] = {}
    refused: dict[int, str] = {}
    for change in changes:
        reason = _refusal(snapshot, change)
        accepted.pop(change.vm_id, None)
        refused.pop(change.vm_id, None)
        if reason:
            refused[change.vm_id] = reason
        else:
            accepted[change.vm_id] = change
    profiles = {}
    for vm in snapshot.vms.values():
        change = accepted.get(vm.id)
        if change is None:
            profiles[vm.id] = [v.profile for v in vm.vgpus]
        else:
            profiles[vm.id] = [snapshot.profiles[change.profile_id]] * change.vgpus if change.vgpus else []
    return _Demand(profiles=profiles, changes=accepted, refused=refused)


def _refusal(snapshot: FleetSnapshot, change: Change) -> str:
    if change.vm_id not in snapshot.vms:
        return f"VM #{change.vm_id} is not in the fleet"
    if change.vgpus < 0:
        return f"a VM cannot hold {change.vgpus} vGPUs"
    if change.vgpus == 0:
        return ""
    profile = snapshot.profiles.get(change.profile_id) if change.profile_id is not None else None
    if profile is None:
        return f"profile #{change.profile_id} is not in the catalog"
    limit = min(profile.max_per_vm, MAX_VGPUS_PER_VM)
    if change.vgpus > limit:
        return f"{profile.name} allows at most {limit} vGPU(s) per VM; the change asks for {change.vgpus}"
    return ""


# --- lower bound -------------------------------------------------------------------------

def lower_bound(snapshot: FleetSnapshot, changes: Iterable[Change] = ()) -> int:
    """No layout of the fleet's vGPUs, `changes` made, uses fewer GPUs than this.

    Per GPU model (a vGPU goes only on a GPU of its profile's model), over the GPUs of that
    model in vGPU mode:

    - equal-size GPUs only: a GPU holds vGPUs of one frame buffer size s, at most cap(s) of
      them (the profile's equal-size maximum, which NVIDIA sets at or below GPU fb / s), so
      the n(s) vGPUs of size s need at least ceil(n(s) / cap(s)) GPUs of their own, and the
      sizes add up;
    - with mixed-size GPUs, sizes may share a GPU. Give each vGPU a weight, the share of a GPU
      it takes: 1/cap(s) on an equal-size GPU, its aligned span (span units of 32) on a
      mixed-size one. A GPU of either mode holds weights summing to at most 1 (cap(s) vGPUs of
      one size; spans that do not overlap), so the GPUs in use are at least the total weight.
      Each vGPU would rather take its smaller weight, but the equal-size GPUs hold at most
      their number in weight: the least total weight is a fractional knapsack, the room on
      equal-size GPUs going first to the vGPUs whose span exceeds their equal-size share the
      most per unit of room (a relaxation of the real choice, so still a bound). And at least
      ceil(total frame buffer / GPU frame buffer).

    vGPUs no GPU of the fleet could take (no GPU of their model) are left out, as are the
    hosts' vCPU and RAM, which only a looser relaxation would need: the bound stays a bound.
    """
    demand = _demand(snapshot, changes)
    return gpu_lower_bound(snapshot, [p for profiles in demand.profiles.values() for p in profiles])


# --- progress ----------------------------------------------------------------------------

class _Progress:
    """Calls the caller's progress callback at most every `interval_s` (and always at a new
    stage), so a task writing progress to a database row is not flooded."""

    def __init__(self, callback: ProgressCallback | None, interval_s: float = 0.1):
        self.callback = callback
        self.interval_s = interval_s
        self.last_at = -math.inf
        self.stage = ""

    def __call__(self, fraction: float, stage: str) -> None:
        if self.callback is None:
            return
        now = time.monotonic()
        if stage != self.stage or now - self.last_at >= self.interval_s:
            self.stage, self.last_at = stage, now
            self.callback(max(0.0, min(1.0, fraction)), stage)


# --- step 4: assembly ----------------------------------------------------------------------

class _AssemblyError(Exception):
    """The target layout could not be replayed the way it will be applied."""


def _signature(pairs: Iterable[tuple[int, int]]) -> tuple:
    return tuple(sorted(pairs))


def _assemble(snapshot: FleetSnapshot, mapping: dict[int, list[tuple[int, ProfileSpec]]],
              arrival_order: dict[int, list[Arrival]], demand: _Demand, unplaced: dict[int, str],
              started: float, strategy: str, *, drained: frozenset[int] = frozenset(),
              reason: str = CONSOLIDATION) -> Plan:
    """The plan for a target `mapping` (vm_id -> [(gpu_id, profile)]): VMs whose GPUs or
    profiles differ are moved, in an order that replays through `placement.check_placement`
    from the fleet with their vGPUs removed (raises _AssemblyError if it does not)."""
    original = {vm.id: _signature((v.gpu_id, v.profile.id) for v in vm.vgpus) for vm in snapshot.vms.values()}
    moved = {vm_id for vm_id, vgpus in mapping.items() if _signature((g, p.id) for g, p in vgpus) != original[vm_id]}
    for _ in range(len(snapshot.gpus) + 1):
        arranged, failed = _arrange_all(snapshot, mapping, arrival_order, moved)
        if not failed:
            break
        # A mixed-size GPU where the VMs that stay block the arrivals' slots: move them too.
        moved |= {v.vm_id for gpu_id in failed for v in snapshot.gpus[gpu_id].vgpus}
    else:
        raise _AssemblyError("mixed-size GPUs could not be arranged")
    assignments, slots = _replay_apply(snapshot, mapping, arranged, moved)
    # VMs taken off a mixed-size GPU only to land on the same slots need not move at all.
    now = _slots_now(snapshot)
    same = {vm_id for vm_id in moved if mapping[vm_id] and _signature(
        (g, p.id, slots[(vm_id, i)]) for i, (g, p) in enumerate(mapping[vm_id])) == tuple(now[vm_id])}
    if same:
        try:
            kept = moved - same
            arranged_kept, failed = _arrange_all(snapshot, mapping, arrival_order, kept)
            if not failed:
                assignments, slots = _replay_apply(snapshot, mapping, arranged_kept, kept)
                moved = kept
        except _AssemblyError:
            pass
    used_before = {g.id for g in snapshot.gpus.values() if g.vgpus}
    used_after = {a.gpu_id for a in assignments}
    moves = []
    for vm_id in sorted(moved):
        vm = snapshot.vms[vm_id]
        target = mapping[vm_id]
        to_host = snapshot.gpus[target[0][0]].host_id if target else None
        change = demand.changes.get(vm_id)
        moves.append(Move(
            vm_id=vm_id, vm_name=vm.name,
            from_gpu_ids=tuple(sorted(v.gpu_id for v in vm.vgpus)),
            to_gpu_ids=tuple(sorted(g for g, _ in target)),
            from_host_id=vm.host_id if vm.vgpus else None, to_host_id=to_host,
            from_profile_id=vm.vgpus[0].profile.id if vm.vgpus else None,
            to_profile_id=target[0][1].id if target else None,
            reason=(change.source or "change") if change is not None and vm_id not in unplaced else reason,
        ))
    placed_profiles = [p for vgpus in mapping.values() for _, p in vgpus]
    refused = {**demand.refused, **unplaced}
    return Plan(
        assignments=tuple(assignments), moves=tuple(moves), gpus_before=len(used_before), gpus_after=len(used_after),
        lower_bound=gpu_lower_bound(snapshot, placed_profiles),
        freed_gpu_ids=tuple(sorted(used_before - used_after)),
        newly_used_gpu_ids=tuple(sorted(used_after - used_before)),
        unplaced=tuple(sorted(refused.items())), seconds=time.perf_counter() - started,
        changes=tuple(demand.changes.values()), strategy=strategy, drained=tuple(sorted(drained)),
    )


def _slots_now(snapshot: FleetSnapshot) -> dict[int, list[tuple[int, int, int | None]]]:
    """Every VM's vGPUs now as sorted (gpu_id, profile_id, placement_id)."""
    slots: dict[int, list[tuple[int, int, int | None]]] = {vm_id: [] for vm_id in snapshot.vms}
    for gpu in snapshot.gpus.values():
        for v in gpu.vgpus:
            slots.setdefault(v.vm_id, []).append((gpu.id, v.profile.id, v.placement_id))
    return {vm_id: sorted(s, key=lambda t: (t[0], t[1], -1 if t[2] is None else t[2])) for vm_id, s in slots.items()}


def _arrange_all(snapshot: FleetSnapshot, mapping: dict[int, list[tuple[int, ProfileSpec]]],
                 arrival_order: dict[int, list[Arrival]], moved: set[int]) -> tuple[
                     dict[int, list[Arrival]], list[int]]:
    """Per GPU, the arrivals (vGPUs of `moved` VMs) in the order to place them, and the
    mixed-size GPUs where no order places them beside the vGPUs that stay."""
    arrivals: dict[int, list[Arrival]] = {}
    for vm_id in sorted(moved):
        for gpu_id, profile in mapping[vm_id]:
            arrivals.setdefault(gpu_id, []).append((vm_id, profile))
    result: dict[int, list[Arrival]] = {}
    failed = []
    for gpu_id, items in sorted(arrivals.items()):
        hint = [a for a in arrival_order.get(gpu_id, []) if a in items]
        rest = Counter(items) - Counter(hint)
        ordered = hint + [a for a in items if rest[a] and not rest.subtract([a])]
        gpu = snapshot.gpus[gpu_id]
        if gpu.size_mode == "mixed":
            staying = [v for v in gpu.vgpus if v.vm_id not in moved]
            found = arrange_mixed(replace(gpu, vgpus=()), staying, ordered)
            if found is None:
                failed.append(gpu_id)
                continue
            ordered = found[1]
        result[gpu_id] = ordered
    return result, failed


def _replay_apply(snapshot: FleetSnapshot, mapping: dict[int, list[tuple[int, ProfileSpec]]],
                  arranged: dict[int, list[Arrival]], moved: set[int]) -> tuple[list[Assignment], dict]:
    """Apply the plan to a copy of the fleet the way `sizing.optimizer_runs` does: remove every
    vGPU of the moved VMs, then place the arrivals in order, each checked by placement and put
    at the first free slot. Returns the assignments (VMs that stay first) and each moved vGPU's
    slot ((vm_id, index in its mapping) -> placement ID)."""
    gpus = {g.id: replace(g, vgpus=tuple(v for v in g.vgpus if v.vm_id not in moved)) for g in snapshot.gpus.values()}
    claims = Counter()
    ram = Counter()
    vm_host: dict[int, int | None] = {}
    for vm in snapshot.vms.values():
        host_id = None if (vm.id in moved and vm.vgpus) else vm.host_id
        vm_host[vm.id] = host_id
        if host_id is not None:
            claims[host_id] += vm.vcpus
            ram[host_id] += vm.ram_gib
    assignments = [
        Assignment(vm_id=v.vm_id, gpu_id=gpu_id, profile_id=v.profile.id, placement_id=v.placement_id)
        for gpu_id in sorted(gpus) for v in sorted(gpus[gpu_id].vgpus, key=lambda v: (v.placement_id or 0, v.vm_id))
    ]
    placed_on_vm: dict[int, list[VmVgpu]] = {}
    slots: dict[tuple[int, int], int] = {}
    next_index: Counter = Counter()
    for gpu_id, items in arranged.items():
        for vm_id, profile in items:
            vm = snapshot.vms[vm_id]
            gpu = gpus[gpu_id]
            host = snapshot.hosts[gpu.host_id]
            host_state = replace(host, allocated_vcpus=claims[gpu.host_id], allocated_ram_gib=ram[gpu.host_id])
            vm_state = VmState(id=vm.id, name=vm.name, vcpus=vm.vcpus, ram_gib=vm.ram_gib, host_id=vm_host[vm_id],
                               vgpus=tuple(placed_on_vm.get(vm_id, ())))
            decision = placement.check_placement(gpu, profile, vm_state, host_state)
            if not decision.ok:
                raise _AssemblyError(f"{vm.name} on {gpu.label}: {decision.violations[0].message}")
            gpus[gpu_id] = replace(gpu, vgpus=gpu.vgpus + (PlacedVgpu(profile, vm_id, decision.placement_id),))
            placed_on_vm.setdefault(vm_id, []).append(VmVgpu(profile, gpu_id, gpu.host_id))
            if vm_host[vm_id] != gpu.host_id:
                if vm_host[vm_id] is not None:
                    claims[vm_host[vm_id]] -= vm.vcpus
                    ram[vm_host[vm_id]] -= vm.ram_gib
                vm_host[vm_id] = gpu.host_id
                claims[gpu.host_id] += vm.vcpus
                ram[gpu.host_id] += vm.ram_gib
            # Which of the VM's mapped vGPUs this is: the next one on this GPU with this profile.
            index = _nth(mapping[vm_id], gpu_id, profile, next_index[(vm_id, gpu_id, profile.id)])
            next_index[(vm_id, gpu_id, profile.id)] += 1
            slots[(vm_id, index)] = decision.placement_id
            assignments.append(Assignment(vm_id=vm_id, gpu_id=gpu_id, profile_id=profile.id,
                                          placement_id=decision.placement_id))
    return assignments, slots


def _nth(vgpus: list[tuple[int, ProfileSpec]], gpu_id: int, profile: ProfileSpec, n: int) -> int:
    seen = 0
    for index, (g, p) in enumerate(vgpus):
        if g == gpu_id and p.id == profile.id:
            if seen == n:
                return index
            seen += 1
    raise _AssemblyError("arrival not in the mapping")


# --- entry points --------------------------------------------------------------------------

def first_fit_decreasing(snapshot: FleetSnapshot, changes: Iterable[Change] = ()) -> Plan:
    """The textbook baseline: every vGPU placed again from an empty fleet, VMs by frame buffer
    largest first, each on the first host and GPU (in id order) that placement accepts. Moves
    nearly every VM; a VM it finds no room for is in `unplaced` (and then the plan loses it:
    it is a baseline to compare with, not a plan to apply)."""
    started = time.perf_counter()
    demand = _demand(snapshot, changes)
    layout, missed = search.ffd_layout(snapshot, demand.profiles)
    mapping = layout.mapping()
    arrivals = {g.id: list(g.arrivals) for g in layout.gpus.values()}
    try:
        return _assemble(snapshot, mapping, arrivals, demand, missed, started, "first-fit decreasing")
    except _AssemblyError:
        # A layout that does not replay (no order of first-free placement fits some mixed-size
        # GPU): the figures without the layout.
        used = layout.used_gpu_ids()
        before = {g.id for g in snapshot.gpus.values() if g.vgpus}
        return Plan(assignments=(), moves=(), gpus_before=len(before), gpus_after=len(used),
                    lower_bound=lower_bound(snapshot, changes), freed_gpu_ids=tuple(sorted(before - used)),
                    newly_used_gpu_ids=tuple(sorted(used - before)),
                    unplaced=tuple(sorted({**demand.refused, **missed}.items())),
                    seconds=time.perf_counter() - started, changes=tuple(demand.changes.values()),
                    strategy="first-fit decreasing")


def optimize(snapshot: FleetSnapshot, changes: Iterable[Change] = (), *, progress: ProgressCallback | None = None,
             time_limit_s: float = 10.0, drained: Iterable[int] = ()) -> Plan:
    """A plan that makes `changes`, satisfies every placement rule, uses as few GPUs as it can
    and, among those layouts, moves as few VMs as it can (see the module docstring).

    With `drained` GPU ids, the plan empties those GPUs instead, moving only their VMs (and
    those `changes` name), never onto a drained GPU: see `drain`.

    `progress(fraction, stage)` is called now and then (at most ~10 times a second).
    `time_limit_s` bounds the search; the plan found by then is returned.
    """
    drained = frozenset(drained)
    if drained:
        return drain(snapshot, drained, changes, progress=progress)
    started = time.perf_counter()
    # The search stops early enough to leave time for assembling the plan (a few percent).
    deadline = started + time_limit_s * 0.85
    report = _Progress(progress)
    report(0.0, "applying changes")
    demand = _demand(snapshot, changes)
    layout = Layout(snapshot)
    failed = search.apply_changes(layout, snapshot, demand.profiles, demand.changes)
    layout.commit()
    base = (layout.mapping(), {g.id: list(g.arrivals) for g in layout.gpus.values()})
    placed = _Demand(
        profiles={vm_id: ([v.profile for v in snapshot.vms[vm_id].vgpus] if vm_id in failed else p)
                  for vm_id, p in demand.profiles.items()},
        changes={vm_id: c for vm_id, c in demand.changes.items() if vm_id not in failed},
        refused=demand.refused,
    )

    report(0.05, "first-fit decreasing")
    # (unplaced changes, GPUs, rank, strategy, layout): fewest changes left out wins, then GPUs.
    candidates = []
    variants = [(placed.profiles, failed)]
    if failed:
        # First-fit decreasing may find room for a change the changes step could not.
        variants.append((demand.profiles, {}))
    for profiles, left_out in variants:
        ffd, missed = search.ffd_layout(snapshot, profiles)
        # A VM first-fit found no room for loses its vGPUs: acceptable only for a change giving
        # a VM without vGPU its first ones (the change is then left out).
        if all(vm_id in demand.changes and not snapshot.vms[vm_id].vgpus for vm_id in missed):
            candidates.append(({**left_out, **missed}, ffd.gpus_in_use(), 1, "first-fit decreasing", ffd))

    report(0.2, "consolidating")
    search.consolidate(layout, deadline, report, 0.2, 0.5)
    search.improve_mixed(layout, deadline, report, 0.5, 0.7)
    failed = search.retry_changes(layout, snapshot, demand.profiles, failed)
    # A fixed seed: the same fleet gets the same plan.
    made = search.ruin_and_recreate(layout, deadline, random.Random(0), report, 0.7, 0.9,
                                    pending={vm_id: demand.profiles[vm_id] for vm_id in failed})
    failed = {vm_id: reason for vm_id, reason in failed.items() if vm_id not in made}
    report(0.9, "keeping VMs in place")
    search.restore_moved(layout, snapshot, demand.changes, started + time_limit_s * 0.9)
    search.reduce_moves(layout, snapshot, demand.changes, started + time_limit_s * 0.92, random.Random(1))
    candidates.append((failed, layout.gpus_in_use(), 0, CONSOLIDATION, layout))

    report(0.95, "assembling the plan")
    candidates.sort(key=lambda c: (len(c[0]), c[1], c[2]))
    for unplaced, _gpus, _rank, strategy, work in candidates:
        # The search keeps each GPU's contents together but not always on the GPU they came
        # from: relabelling identical hosts and GPUs puts more VMs back where they are.
        labellings = [search.relabel(work, snapshot)]
        if work is layout:
            labellings.append((work.mapping(), {g.id: list(g.arrivals) for g in work.gpus.values()}))
        labellings += [(search.keep_in_place(mapping, snapshot), arrivals) for mapping, arrivals in labellings]
        plans = []
        for mapping, arrivals in labellings:
            try:
                plans.append(_assemble(snapshot, mapping, arrivals, demand, unplaced, started, strategy))
            except _AssemblyError:
                continue
        if plans:
            report(1.0, "done")
            return min(plans, key=lambda plan: len(plan.moves))
    try:
        plan = _assemble(snapshot, *base, demand, failed, started, "changes only")
    except _AssemblyError:
        nothing = {vm.id: [(v.gpu_id, v.profile) for v in vm.vgpus] for vm in snapshot.vms.values()}
        skipped = {vm_id: "the changes could not be arranged on the fleet" for vm_id in demand.changes}
        plan = _assemble(snapshot, nothing, {}, demand, skipped, started, "no change")
    report(1.0, "done")
    return plan


def drain(snapshot: FleetSnapshot, drained: Iterable[int], changes: Iterable[Change] = (), *,
          progress: ProgressCallback | None = None) -> Plan:
    """A plan that empties the GPUs `drained` (ids of GPUs failing or taken out of service): the
    `changes` made first, then every VM still on a drained GPU moved where the rules allow
    (`sizing.consolidation.evacuate`), no other VM moved, nothing placed on a drained GPU. A VM
    that finds no room keeps its place and is in `unplaced` with why, so the admin sees what is
    left on the GPU. No consolidation: a drain does not reshuffle the fleet."""
    started = time.perf_counter()
    drained = frozenset(g for g in drained if g in snapshot.gpus)
    report = _Progress(progress)
    report(0.0, "applying changes")
    demand = _demand(snapshot, changes)
    layout = Layout(snapshot, closed=drained)
    failed = search.apply_changes(layout, snapshot, demand.profiles, demand.changes)
    report(0.3, "draining")
    left = search.evacuate(layout, drained)
    unplaced = dict(failed)
    for vm_id, why in left.items():
        unplaced[vm_id] = "; ".join(filter(None, (failed.get(vm_id), f"it cannot leave the drained GPU: {why}")))
    report(0.9, "assembling the plan")
    arrivals = {g.id: list(g.arrivals) for g in layout.gpus.values()}
    try:
        plan = _assemble(snapshot, layout.mapping(), arrivals, demand, unplaced, started, DRAIN, drained=drained,
                         reason=DRAIN)
    except _AssemblyError as exc:
        nothing = {vm.id: [(v.gpu_id, v.profile) for v in vm.vgpus] for vm in snapshot.vms.values()}
        stuck = {v.vm_id for g in drained for v in snapshot.gpus[g].vgpus} | set(demand.changes)
        skipped = {vm_id: f"the moves could not be arranged on the fleet ({exc})" for vm_id in stuck}
        plan = _assemble(snapshot, nothing, {}, demand, skipped, started, "no change", drained=drained)
    report(1.0, "done")
    return plan


# --- verification --------------------------------------------------------------------------

def verify(snapshot: FleetSnapshot, plan: Plan) -> list[Violation]:
    """Everything wrong with `plan` for this fleet; an empty list when nothing is.

    Replays `plan.assignments` in order from an empty fleet through
    `placement.check_placement`, hosts' vCPU and RAM included (VMs without vGPU keep claiming
    their host). The VMs that stay must sit at their placement IDs of now, in a free and
    aligned slot; each vGPU of a moved VM must land at the slot the plan gives it, which is
    where applying the plan puts it. Host capacity is not held against VMs that stay (applying
    does not touch them; a host may be over capacity after an overcommit change), but it is
    against every VM that moves. Then: every VM named in a change the plan includes holds what
    it asked, every other VM kept its profiles and count, the moves list exactly the VMs whose
    placement differs, and the GPU counts match the layout. On the plan's drained GPUs, only
    the vGPUs of VMs that stay and are listed unplaced may remain.
    """
    violations: list[Violation] = []
    add = violations.append
    moved = {m.vm_id for m in plan.moves}
    unplaced = {vm_id for vm_id, _ in plan.unplaced}
    drained = set(plan.drained)
    gpus = {g.id: replace(g, vgpus=()) for g in snapshot.gpus.values()}
    claims, ram = Counter(), Counter()
    vm_host: dict[int, int | None] = {}
    for vm in snapshot.vms.values():
        vm_host[vm.id] = None if vm.vgpus else vm.host_id
        if vm_host[vm.id] is not None:
            claims[vm.host_id] += vm.vcpus
            ram[vm.host_id] += vm.ram_gib
    placed_on_vm: dict[int, list[VmVgpu]] = {}
    target: dict[int, list[tuple[int, int, int]]] = {}
    for a in plan.assignments:
        vm, gpu, profile = snapshot.vms.get(a.vm_id), gpus.get(a.gpu_id), snapshot.profiles.get(a.profile_id)
        if vm is None or gpu is None or profile is None:
            add(Violation(PlanRule.UNKNOWN, f"assignment {a} names a VM, GPU or profile the fleet does not have"))
            continue
        host = snapshot.hosts[gpu.host_id]
        host_state = replace(host, allocated_vcpus=claims[gpu.host_id], allocated_ram_gib=ram[gpu.host_id])
        vm_state = VmState(id=vm.id, name=vm.name, vcpus=vm.vcpus, ram_gib=vm.ram_gib, host_id=vm_host[vm.id],
                           vgpus=tuple(placed_on_vm.get(vm.id, ())))
        decision = placement.check_placement(gpu, profile, vm_state, host_state)
        found = decision.violations
        if vm.id not in moved:
            found = [v for v in found if v.rule not in (placement.Rule.HOST_VCPU, placement.Rule.HOST_RAM)]
        violations.extend(found)
        if not found:
            if vm.id in moved and decision.placement_id != a.placement_id:
                add(Violation(placement.Rule.PLACEMENT_SLOT,
                              f"applying the plan puts VM {vm.name}'s {profile.name} on GPU {gpu.label} at placement "
                              f"ID {decision.placement_id}; the plan says {a.placement_id}"))
            elif vm.id not in moved and not _slot_free(gpu, profile, a.placement_id):
                add(Violation(placement.Rule.PLACEMENT_SLOT,
                              f"VM {vm.name}'s {profile.name} cannot sit at placement ID {a.placement_id} on GPU "
                              f"{gpu.label}"))
        if gpu.id in drained and vm.id in moved:
            add(Violation(PlanRule.DRAINED, f"the plan puts VM {vm.name}'s {profile.name} on GPU {gpu.label}, which it "
                                            f"drains"))
        elif gpu.id in drained and vm.id not in unplaced:
            add(Violation(PlanRule.DRAINED, f"VM {vm.name} stays on GPU {gpu.label}, which the plan drains, and the "
                                            f"plan does not say why"))
        gpus[gpu.id] = replace(gpu, vgpus=gpu.vgpus + (PlacedVgpu(profile, vm.id, a.placement_id),))
        placed_on_vm.setdefault(vm.id, []).append(VmVgpu(profile, gpu.id, gpu.host_id))
        target.setdefault(vm.id, []).append((gpu.id, profile.id, a.placement_id))
        if vm_host[vm.id] != gpu.host_id:
            if vm_host[vm.id] is not None:
                claims[vm_host[vm.id]] -= vm.vcpus
                ram[vm_host[vm.id]] -= vm.ram_gib
            vm_host[vm.id] = gpu.host_id
            claims[gpu.host_id] += vm.vcpus
            ram[gpu.host_id] += vm.ram_gib

    changes = {c.vm_id: c for c in plan.changes if c.vm_id not in unplaced}
    differ = set()
    slots_now = _slots_now(snapshot)
    for vm in snapshot.vms.values():
        now = slots_now[vm.id]
        then = sorted(target.get(vm.id, []), key=lambda t: (t[0], t[1], -1 if t[2] is None else t[2]))
        if now != then:
            differ.add(vm.id)
        profiles = sorted(p for _, p, _ in then)
        change = changes.get(vm.id)
        if change is not None:
            if profiles != [change.profile_id] * change.vgpus:
                add(Violation(PlanRule.CHANGE, f"VM {vm.name} should hold {change.vgpus} x profile "
                                               f"#{change.profile_id} ({change.source or 'change'}); the plan gives "
                                               f"it {profiles}"))
        elif profiles != sorted(v.profile.id for v in vm.vgpus):
            add(Violation(PlanRule.KEPT, f"VM {vm.name} holds profiles {sorted(v.profile.id for v in vm.vgpus)}; "
                                         f"the plan gives it {profiles} without a change asking for it"))
    if differ != moved:
        add(Violation(PlanRule.MOVES, f"the moves list VMs {sorted(moved - differ)} that stay and leave out VMs "
                                      f"{sorted(differ - moved)} whose placement changes"))
    before = {g.id for g in snapshot.gpus.values() if g.vgpus}
    after = {a.gpu_id for a in plan.assignments}
    if (plan.gpus_before, plan.gpus_after) != (len(before), len(after)) or set(plan.freed_gpu_ids) != before - after \
            or set(plan.newly_used_gpu_ids) != after - before:
        add(Violation(PlanRule.COUNTS, f"the plan counts {plan.gpus_before} -> {plan.gpus_after} GPUs in use; its "
                                       f"layout has {len(before)} -> {len(after)}"))
    return violations


def _slot_free(gpu: GpuState, profile: ProfileSpec, placement_id: int | None) -> bool:
    """Whether a vGPU of `profile` may sit at `placement_id` on `gpu` beside what it holds."""
    if placement_id is None:
        return False
    if gpu.size_mode == "mixed":
        span = placement.mixed_span_units(profile)
        if placement_id not in placement.mixed_placement_ids(profile):
            return False
        return all(placement_id + span <= v.placement_id or placement_id >= v.placement_id + placement.mixed_span_units(
            v.profile) for v in gpu.vgpus if v.placement_id is not None)
    return 0 <= placement_id < profile.max_per_gpu and all(v.placement_id != placement_id for v in gpu.vgpus)

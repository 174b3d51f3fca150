"""How the placement optimizer searches: the moves it makes on a working `Layout`.

Every step places vGPUs only through `Layout.add`, that is through
`fleet.placement.check_placement`; the steps differ in what they try. `sizing.optimizer`
runs them in order and turns the layout found into a plan:

- `apply_changes`: the pending changes, each VM on its own GPUs where the new vGPUs fit;
- `consolidate`: drain the least-filled GPUs into fuller ones, a GPU at a time;
- `improve_mixed`: re-place the VMs of mixed-size GPUs where equal-size GPUs hold them denser;
- `ruin_and_recreate`: take a few GPUs apart at once and pack their VMs again (exchanges a
  drain cannot find), and make room for changes that found none;
- `restore_moved`: VMs the search moved for nothing go back to their own GPUs;
- `evacuate`: empty the GPUs an admin drains, moving only the VMs on them;
- `ffd_layout` and `relabel`: first-fit decreasing from an empty fleet, the baseline and guard.
"""

from __future__ import annotations

import heapq
import random
import time
from collections import Counter
from collections.abc import Callable, Iterable, Sequence

from fleet import placement
from fleet.placement import ProfileSpec
from fleet.snapshot import FleetSnapshot
from sizing.packing import Arrival, Layout, WorkGpu, WorkVm, gpu_lower_bound

Report = Callable[[float, str], None]  # progress: (fraction of the run, stage)


# --- placing VMs ---------------------------------------------------------------------------

def _free_share(gpu: WorkGpu) -> float:
    """Share of the GPU still free (0 full, 1 empty): to try the fullest GPUs first."""
    if gpu.mixed:
        return 1 - gpu.units_used / placement.PLACEMENT_GRID
    return 1 - gpu.fill()


def _try(layout: Layout, vm: WorkVm, gpu: WorkGpu, profile: ProfileSpec) -> bool:
    return layout.might_fit(vm, gpu, profile) and layout.add(vm, gpu, profile).ok


def _place_on_host(layout: Layout, vm: WorkVm, profiles: Sequence[ProfileSpec], host_id: int, *,
                   prefer: Sequence[int] = (), forbidden: frozenset[int] = frozenset(),
                   allow_empty: bool = True) -> bool:
    """Place `profiles` for `vm` on GPUs of one host, each on its preferred GPUs first, then
    the fullest GPU with room, then (if allowed) an empty one. False, changing nothing, if
    one of them finds no room."""
    mark = layout.mark()
    host = layout.hosts.get(host_id)
    if host is None:
        return False
    for profile in profiles:
        ranked = []
        for gpu_id in host.gpu_ids:
            gpu = layout.gpus[gpu_id]
            if gpu_id in forbidden or not gpu.usable or gpu.model.name != profile.gpu_model:
                continue
            if gpu_id in prefer:
                ranked.append((0, prefer.index(gpu_id), gpu.order))
            elif gpu.vgpus:
                ranked.append((1, _free_share(gpu), gpu.order))
            elif allow_empty:
                ranked.append((2, 0, gpu.order))
        for _tier, _rank, (_host_id, gpu_id) in sorted(ranked):
            if _try(layout, vm, layout.gpus[gpu_id], profile):
                break
        else:
            layout.rollback(mark)
            return False
    return True


def _open_gpus(layout: Layout, profile: ProfileSpec) -> list[WorkGpu]:
    """GPUs holding vGPUs that may have room for one more of `profile`."""
    model = profile.gpu_model
    ids = list(layout.open_equal.get((model, profile.fb_mib), ()))
    if profile.max_per_gpu_mixed:
        ids += list(layout.open_mixed.get(model, ()))
    return [layout.gpus[i] for i in ids]


def place_vm(layout: Layout, vm: WorkVm, profiles: Sequence[ProfileSpec], *, prefer: Sequence[int] = (),
             prefer_host: int | None = None, forbidden: frozenset[int] = frozenset(),
             allow_empty: bool = True) -> bool:
    """Place `profiles` (vGPUs of one board and series) for `vm`, best fit: its preferred GPUs,
    then its (preferred) host, then the fullest GPUs with room anywhere, then empty GPUs. All on
    one host: the VM's if it already holds vGPUs. False, changing nothing, if no host takes them."""
    if not profiles:
        return True
    if vm.vgpus:
        return _place_on_host(layout, vm, profiles, vm.host_id, prefer=prefer, forbidden=forbidden,
                              allow_empty=allow_empty)
    first = profiles[0]
    hosts: list[int] = []
    for gpu_id in prefer:
        if gpu_id in layout.gpus and layout.gpus[gpu_id].host_id not in hosts:
            hosts.append(layout.gpus[gpu_id].host_id)
    if prefer_host is not None and prefer_host not in hosts:
        hosts.append(prefer_host)
    for host_id in hosts:
        if _place_on_host(layout, vm, profiles, host_id, prefer=prefer, forbidden=forbidden,
                          allow_empty=allow_empty):
            return True
    tried = set(hosts)
    opened = sorted(_open_gpus(layout, first), key=lambda g: (_free_share(g), g.order))
    if len(profiles) == 1:
        for gpu in opened:
            if gpu.id not in forbidden and gpu.host_id not in tried and _try(layout, vm, gpu, first):
                return True
        if not allow_empty:
            return False
        for gpu_id in layout.empty.get(first.gpu_model, {}):
            gpu = layout.gpus[gpu_id]
            if gpu_id not in forbidden and gpu.host_id not in tried and _try(layout, vm, gpu, first):
                return True
        return False
    candidates = [g.host_id for g in opened]
    if allow_empty:
        candidates += [layout.gpus[i].host_id for i in layout.empty.get(first.gpu_model, {})]
    for host_id in dict.fromkeys(candidates):
        host = layout.hosts.get(host_id)
        if host_id in tried or host is None or not host.has_room(vm.vcpus, vm.ram_gib):
            continue
        tried.add(host_id)
        if _place_on_host(layout, vm, profiles, host_id, forbidden=forbidden, allow_empty=allow_empty):
            return True
    return False


def unplaced_reason(layout: Layout, vm: WorkVm, profiles: Sequence[ProfileSpec]) -> str:
    """Why `profiles` found no room for `vm`: what was looked for, then the rule that stopped
    it on the first host of the model (its vGPUs placed one by one on that host's GPUs, as far
    as they go, then undone), so a rule such as Turing's full-GPU-only multi-vGPU shows."""
    profile = profiles[0]
    wanted = f"{len(profiles)} x {profile.name} for VM {vm.name} ({vm.vcpus} vCPUs, {vm.ram_gib} GiB RAM)"
    gpu_ids = layout.gpus_by_model.get(profile.gpu_model, [])
    if not gpu_ids:
        return f"no {profile.gpu_model} GPU in vGPU mode can take {wanted}"
    host_id = vm.host_id if vm.vgpus else layout.gpus[gpu_ids[0]].host_id
    on_host = [g for g in gpu_ids if layout.gpus[g].host_id == host_id]
    mark = layout.mark()
    refusal = None
    for each in profiles:
        decisions = [layout.check(vm, layout.gpus[g], each) for g in on_host]
        fits = [g for g, d in zip(on_host, decisions, strict=True) if d.ok]
        if not fits:
            refusal = decisions[0].violations[0].message if decisions else None
            break
        layout.add(vm, layout.gpus[fits[0]], each)
    layout.rollback(mark)
    return f"no host has room for {wanted}" + (f" (e.g. {refusal})" if refusal else "")


# --- step 1: pending changes ---------------------------------------------------------------

def apply_changes(layout: Layout, snapshot: FleetSnapshot, profiles: dict[int, list[ProfileSpec]],
                  changed: Iterable[int]) -> dict[int, str]:
    """Give the VMs in `changed` their `profiles` on `layout`; returns the VMs whose change
    found no room, with why (those VMs keep what they have). Each changed VM goes back on its
    own GPUs where the new vGPUs fit, else its host, else the fullest GPU with room, else an
    empty one.

    All changed VMs lose their vGPUs first, as applying does, so a downsize frees room for an
    upsize. A change that finds no room is taken out and the rest redone, until all fit."""
    failed: dict[int, str] = {}
    mark = layout.mark()
    changed = list(changed)
    for _ in range(len(changed) + 1):
        layout.rollback(mark)
        todo = [layout.vms[vm_id] for vm_id in changed if vm_id not in failed]
        for vm in todo:
            if not layout.remove(vm):
                raise RuntimeError(f"could not take VM {vm.name}'s vGPUs off its GPUs")
        newly_failed = {}
        for vm in todo:
            wanted = profiles[vm.id]
            original = snapshot.vms[vm.id]
            prefer = [v.gpu_id for v in original.vgpus]
            if wanted and not place_vm(layout, vm, wanted, prefer=prefer, prefer_host=original.host_id):
                newly_failed[vm.id] = unplaced_reason(layout, vm, wanted)
        if not newly_failed:
            return failed
        failed.update(newly_failed)
    raise RuntimeError("pending changes did not settle")


def retry_changes(layout: Layout, snapshot: FleetSnapshot, profiles: dict[int, list[ProfileSpec]],
                  failed: dict[int, str]) -> dict[int, str]:
    """Try the changes that found no room again, on the layout as it is now (consolidation may
    have made room); returns those that still find none."""
    still = {}
    for vm_id, reason in failed.items():
        vm, original = layout.vms[vm_id], snapshot.vms[vm_id]
        mark = layout.mark()
        prefer = [v.gpu_id for v in original.vgpus]
        if layout.remove(vm) and place_vm(layout, vm, profiles[vm_id], prefer=prefer,
                                           prefer_host=original.host_id):
            layout.commit()
        else:
            layout.rollback(mark)
            still[vm_id] = reason
    return still


# --- step 2: consolidation -----------------------------------------------------------------

def _drain(layout: Layout, gpu: WorkGpu) -> bool:
    """Move every VM off `gpu` into room on other GPUs that already hold vGPUs; keeps the
    result and returns True only if the GPU ends empty."""
    mark = layout.mark()
    forbidden = frozenset({gpu.id})
    vm_ids = list(dict.fromkeys(v.vm_id for v in sorted(gpu.vgpus, key=lambda v: -v.profile.fb_mib)))
    for vm_id in vm_ids:
        vm = layout.vms[vm_id]
        here = [p for g, p in vm.vgpus if g == gpu.id]
        elsewhere = len(here) < len(vm.vgpus)
        step = layout.mark()
        host_id = vm.host_id
        moved = layout.remove(vm, [gpu.id]) and place_vm(
            layout, vm, here, prefer_host=host_id, forbidden=forbidden, allow_empty=False)
        if not moved and elsewhere:
            # The VM's other vGPUs pin it to its host: try moving it whole to another one.
            layout.rollback(step)
            profiles = [p for _, p in vm.vgpus]
            moved = layout.remove(vm) and place_vm(layout, vm, profiles, prefer_host=host_id, forbidden=forbidden,
                                                    allow_empty=False)
        if not moved:
            layout.rollback(mark)
            return False
    return True


def evacuate(layout: Layout, gpu_ids: Iterable[int]) -> dict[int, str]:
    """Move every VM off the GPUs `gpu_ids` (closed in `layout`, so nothing lands on them),
    moving no other VM; returns the VMs that found no room, with why (they stay where they are).

    The VMs go largest frame buffer first (the hardest to place, while room is widest). Each VM
    takes the vGPUs it has there to the fullest GPU with room on its own host, then to an empty
    one there; a VM of one vGPU may go to another host whose vCPU and RAM allow; a VM with vGPUs
    on other GPUs of its host moves whole to another host if its host has no room.
    """
    drained = set(gpu_ids)
    on_drained: dict[int, int] = Counter()
    for gpu_id in sorted(drained):
        for v in layout.gpus[gpu_id].vgpus:
            on_drained[v.vm_id] += v.profile.fb_mib
    left: dict[int, str] = {}
    for vm_id in sorted(on_drained, key=lambda i: (-on_drained[i], i)):
        vm = layout.vms[vm_id]
        here = [p for g, p in vm.vgpus if g in drained]
        mark = layout.mark()
        host_id = vm.host_id
        moved = layout.remove(vm, [g for g, _ in vm.vgpus if g in drained]) and place_vm(
            layout, vm, here, prefer_host=host_id)
        if not moved and len(here) < len(vm.vgpus):
            layout.rollback(mark)
            profiles = [p for _, p in vm.vgpus]
            moved = layout.remove(vm) and place_vm(layout, vm, profiles, prefer_host=host_id)
        if not moved:
            layout.rollback(mark)
            left[vm_id] = _evacuation_refusal(layout, vm, here, drained)
    return left


def _evacuation_refusal(layout: Layout, vm: WorkVm, profiles: Sequence[ProfileSpec], drained: set[int]) -> str:
    """Why `vm` found no room off the drained GPUs, asked with its vGPUs there taken off."""
    profile = profiles[0]
    if not layout.gpus_by_model.get(profile.gpu_model):
        return (f"no other {profile.gpu_model} GPU in vGPU mode can take {len(profiles)} x {profile.name} "
                f"for VM {vm.name}")
    mark = layout.mark()
    try:
        if layout.remove(vm, [g for g, _ in vm.vgpus if g in drained]):
            return unplaced_reason(layout, vm, profiles)
        return f"the vGPUs of VM {vm.name} left on a mixed-size GPU could not be arranged"
    finally:
        layout.rollback(mark)


def _room_for(layout: Layout, gpu: WorkGpu) -> bool:
    """Whether the other GPUs in use could, slots alone counted, take what `gpu` holds: a quick
    test that spares hopeless drains."""
    need: Counter = Counter((v.profile.gpu_model, v.profile.fb_mib) for v in gpu.vgpus)
    for (model, fb_mib), n in need.items():
        room = 0
        for other_id in layout.open_equal.get((model, fb_mib), ()):
            if other_id != gpu.id:
                other = layout.gpus[other_id]
                room += max(v.profile.max_per_gpu for v in other.vgpus) - other.count
        if room >= n:
            continue
        for other_id in layout.open_mixed.get(model, ()):
            if other_id != gpu.id:
                room += placement.PLACEMENT_GRID - layout.gpus[other_id].units_used
        if room < n:
            return False
    return True


def consolidate(layout: Layout, deadline: float, report: Report, start: float, end: float, *,
                commit: bool = True) -> None:
    """Drain the least-filled GPUs into fuller ones until a whole pass frees none (`commit`:
    forget the journal after each drain; False keeps it for the caller to roll back)."""
    passes = 0
    while time.perf_counter() < deadline:
        passes += 1
        used = [g for g in layout.gpus.values() if g.vgpus]
        used.sort(key=lambda g: (g.fill(), sum(1 for v in g.vgpus if not layout.vms[v.vm_id].moved), g.order))
        freed = 0
        for index, gpu in enumerate(used):
            if time.perf_counter() >= deadline:
                break
            report(start + (end - start) * min(0.99, (passes - 1 + index / len(used)) / (passes + 1)),
                   "consolidating")
            if gpu.vgpus and _room_for(layout, gpu) and _drain(layout, gpu):
                if commit:
                    layout.commit()
                freed += 1
        if not freed:
            return


def ruin_and_recreate(layout: Layout, deadline: float, rng: random.Random, report: Report,
                      start: float, end: float, pending: dict[int, list[ProfileSpec]] | None = None) -> set[int]:
    """Local search past what draining reaches: take every VM off a few GPUs at once (one of
    the least filled and others, mostly of its model or its host) and place them again,
    largest first, fullest GPU first, the emptied GPUs last; keep the result only if fewer GPUs
    hold vGPUs. Moving several VMs together finds the exchanges a drain cannot (a VM that fits
    a host only once another leaves it). While changes in `pending` (vm_id -> the profiles it
    asks) found no room, every other try also takes one of them along, and keeps the result
    if that change now fits, whatever the GPU count (a change made beats a GPU saved).

    Stops at the lower bound of what the layout holds (nothing better exists), after some
    tries in a row without a gain (200 to 1,000 on a small fleet, where a try can take most of
    it apart; 300 on a large one, where drains leave little to find and a try costs more; as
    many again for the pending changes), or at the deadline. Returns the pending changes it
    made."""
    in_use = layout.gpus_in_use()
    patience = min(1000, max(200, 20 * in_use)) if in_use <= 100 else 300
    # Changes for a model without a GPU in vGPU mode can never be made.
    pending = {vm_id: profiles for vm_id, profiles in (pending or {}).items()
               if all(p.gpu_model in layout.gpus_by_model for p in profiles)}
    made: set[int] = set()
    failures = pending_failures = 0

    def held_bound() -> int:
        return gpu_lower_bound(layout.snapshot, [p for vm in layout.vms.values() for _, p in vm.vgpus])

    floor = held_bound()
    used: list[WorkGpu] | None = None  # GPUs in use, their weights and per model: kept until a change
    while time.perf_counter() < deadline:
        try_pending = bool(pending) and pending_failures < patience and (
            rng.random() < 0.5 or failures >= patience or layout.gpus_in_use() <= floor)
        if not try_pending and (failures >= patience or layout.gpus_in_use() <= floor):
            break
        report(start + (end - start) * min(failures, patience) / patience, "searching exchanges")
        if used is None:
            used = [g for g in layout.gpus.values() if g.vgpus]
            weights = [1.5 - min(g.fill(), 1.0) for g in used]
            by_model: dict[str, list[int]] = {}
            for index, g in enumerate(used):
                by_model.setdefault(g.model.name, []).append(index)
        if not used:
            break
        extra = {}
        if try_pending:
            vm_id = rng.choice(sorted(pending))
            extra = {vm_id: pending[vm_id]}
        seed_index = rng.choices(range(len(used)), weights=weights)[0]
        seed_gpu = used[seed_index]
        if len(used) > 40:
            # A large fleet: the seed's model (its own host counted thrice).
            indexes = [i for i in by_model[seed_gpu.model.name] if i != seed_index]
            pool = [used[i] for i in indexes]
            pool_weights = [weights[i] * (3 if used[i].host_id == seed_gpu.host_id else 1) for i in indexes]
        else:
            # Mostly its model's GPUs and the other GPUs of hosts that have some (VMs of another
            # model compete for those hosts' vCPUs and RAM), its own host's most of all.
            hosts = {g.host_id for g in used if g.model.name == seed_gpu.model.name}
            pool = [g for g in used if g is not seed_gpu]
            pool_weights = [(1.5 - min(g.fill(), 1.0)) * (3 if g.host_id == seed_gpu.host_id else 1)
                            * (3 if g.model.name == seed_gpu.model.name or g.host_id in hosts else 0.2)
                            for g in pool]
        # Small fleets can afford taking most of them apart (a randomised restart); large ones
        # take a few GPUs at a time. Tries start small and grow with failures: a kept try
        # moves every VM it took apart, and a small one that works moves few.
        cap = min(4 if len(used) > 40 else len(used), 1 + (pending_failures if extra else failures) // 10)
        size = min(len(pool), rng.randint(0 if extra or not pool else 1, cap))
        ruined = {seed_gpu.id}
        while len(ruined) < size + 1:
            ruined.add(rng.choices(pool, weights=pool_weights)[0].id)
        if _recreate(layout, ruined, rng, extra):
            used = None
            if extra:
                made.update(extra)
                for vm_id in extra:
                    del pending[vm_id]
                pending_failures = 0
                floor = held_bound()
            failures = 0
        elif extra:
            pending_failures += 1
        else:
            failures += 1
    return made


def _recreate(layout: Layout, ruined: set[int], rng: random.Random,
              extra: dict[int, list[ProfileSpec]] | None = None) -> bool:
    """Take every VM off the `ruined` GPUs and place them again, with the VMs of `extra` given
    their new profiles; keep it (True) if all found room and, without `extra`, GPUs were saved."""
    extra = extra or {}
    before = layout.gpus_in_use()
    mark = layout.mark()
    vm_ids = list(dict.fromkeys([*extra, *(v.vm_id for g in sorted(ruined) for v in layout.gpus[g].vgpus)]))
    origin = {}
    for vm_id in vm_ids:
        vm = layout.vms[vm_id]
        profiles = extra.get(vm_id) or [p for _, p in vm.vgpus]
        origin[vm_id] = ([g for g, _ in vm.vgpus], vm.host_id, profiles)
        if not layout.remove(vm):
            layout.rollback(mark)
            return False
    # Largest first, give or take: a little noise lets repeated tries pack in other orders.
    vm_ids.sort(key=lambda v: (-sum(p.fb_mib for p in origin[v][2]) * (1 + 0.3 * rng.random()), rng.random()))
    ruined_order = sorted(ruined, key=lambda g: rng.random())
    noise = rng.choice((0.05, 0.05, 0.5))
    for vm_id in vm_ids:
        vm = layout.vms[vm_id]
        gpus, host_id, profiles = origin[vm_id]
        if len(profiles) > 1:
            placed = place_vm(layout, vm, profiles, prefer_host=host_id)
        else:
            profile = profiles[0]
            opened = sorted((g for g in _open_gpus(layout, profile)),
                            key=lambda g: (_free_share(g) + rng.random() * noise, g.order))
            empties = [layout.gpus[g] for g in ruined_order if not layout.gpus[g].vgpus]
            placed = any(_try(layout, vm, g, profile) for g in opened + empties)
            if not placed:
                placed = place_vm(layout, vm, profiles, prefer_host=host_id)
        if not placed:
            layout.rollback(mark)
            return False
    if extra or layout.gpus_in_use() < before:
        layout.commit()
        return True
    layout.rollback(mark)
    return False


class _NoRoom(Exception):
    """A tentative re-placement left a VM without room; the caller rolls it back."""


def improve_mixed(layout: Layout, deadline: float, report: Report, start: float, end: float) -> None:
    """Per model with mixed-size GPUs in use: `_rebuild_mixed`, then drains; kept only if the
    fleet ends on fewer GPUs."""
    models = sorted({g.model.name for g in layout.gpus.values() if g.usable and g.mixed and g.vgpus})
    for index, model in enumerate(models):
        if time.perf_counter() >= deadline:
            return
        report(start + (end - start) * index / len(models), "re-packing mixed-size GPUs")
        mark = layout.mark()
        before = layout.gpus_in_use()
        try:
            _rebuild_mixed(layout, model)
        except _NoRoom:
            layout.rollback(mark)
            continue
        consolidate(layout, deadline, report, start, start, commit=False)
        if layout.gpus_in_use() < before:
            layout.commit()
        else:
            layout.rollback(mark)


def _worth_equal_gpu(profile: ProfileSpec, count: int) -> bool:
    """Whether `count` vGPUs of `profile` take more room on mixed-size GPUs than one equal-size
    GPU: their aligned spans add up to more than a GPU (an 8Q spans 12 GB in mixed-size mode,
    so six 8Q fill 1.5 mixed-size GPUs, or one equal-size GPU)."""
    if not profile.max_per_gpu_mixed:
        return True
    k = min(count, profile.max_per_gpu)
    return k * placement.mixed_span_units(profile) > placement.PLACEMENT_GRID


def _rebuild_mixed(layout: Layout, model: str) -> None:
    """Re-place the VMs of `model`'s mixed-size GPUs: each size first into room on equal-size
    GPUs of that size, then onto empty equal-size GPUs where enough of one size would fill one
    more densely than mixed-size spans do, the rest back on mixed-size GPUs (their own first),
    largest span first. Mixed-size mode trades density for mixing sizes (L40S-8Q: 6 a GPU in
    equal-size mode, 4 in mixed), so a fleet grown at random holds many vGPUs there that an
    equal-size GPU would pack tighter; draining alone never opens that GPU."""
    sources = [g for g in layout.gpus.values() if g.usable and g.model.name == model and g.mixed and g.vgpus]
    vm_ids = list(dict.fromkeys(v.vm_id for g in sources for v in g.vgpus))
    origin: dict[int, tuple[list[int], int | None, list[ProfileSpec]]] = {}
    for vm_id in vm_ids:
        vm = layout.vms[vm_id]
        origin[vm_id] = ([g for g, _ in vm.vgpus], vm.host_id, [p for _, p in vm.vgpus])
        if not layout.remove(vm):
            raise _NoRoom(f"could not take VM {vm.name} off its GPUs")
    singles: dict[int, list[int]] = {}
    for vm_id in vm_ids:
        gpus, host_id, profiles = origin[vm_id]
        if len(profiles) > 1:
            if not place_vm(layout, layout.vms[vm_id], profiles, prefer=gpus, prefer_host=host_id):
                raise _NoRoom(f"no room left for VM {layout.vms[vm_id].name}")
        else:
            singles.setdefault(profiles[0].id, []).append(vm_id)
    by_profile = {pid: layout.snapshot.profiles[pid] for pid in singles}
    rest: list[int] = []
    for pid in sorted(singles, key=lambda pid: (-by_profile[pid].fb_mib, pid)):
        profile = by_profile[pid]
        waiting = singles[pid]
        # Room on equal-size GPUs of this size already in use, fullest first, own host first.
        for vm_id in list(waiting):
            vm, host_id = layout.vms[vm_id], origin[vm_id][1]
            opened = sorted(layout.open_equal.get((model, profile.fb_mib), ()),
                            key=lambda g: (layout.gpus[g].host_id != host_id, _free_share(layout.gpus[g])))
            if any(_try(layout, vm, layout.gpus[g], profile) for g in opened):
                waiting.remove(vm_id)
        while waiting and _worth_equal_gpu(profile, len(waiting)):
            if not _open_equal_gpu(layout, profile, waiting, origin):
                break
        rest += waiting
    rest.sort(key=lambda vm_id: (-placement.mixed_span_units(origin[vm_id][2][0]), vm_id))
    for vm_id in list(rest):
        gpus, _, profiles = origin[vm_id]
        if _try(layout, layout.vms[vm_id], layout.gpus[gpus[0]], profiles[0]):
            rest.remove(vm_id)
    for vm_id in rest:
        gpus, host_id, profiles = origin[vm_id]
        if not place_vm(layout, layout.vms[vm_id], profiles, prefer=gpus, prefer_host=host_id):
            raise _NoRoom(f"no room left for VM {layout.vms[vm_id].name}")


def _open_equal_gpu(layout: Layout, profile: ProfileSpec, waiting: list[int], origin: dict) -> bool:
    """Fill an empty equal-size GPU with vGPUs of `profile` for VMs in `waiting` (those of its
    host first), on the host most of them come from; True if it took enough to be worth it."""
    model = profile.gpu_model
    from_host = Counter(origin[vm_id][1] for vm_id in waiting)
    empties = [layout.gpus[g] for g in layout.empty.get(model, ()) if not layout.gpus[g].mixed]
    if not empties:
        return False
    empties.sort(key=lambda g: (-from_host[g.host_id], -(layout.hosts[g.host_id].vcpu_capacity
                                                            - layout.hosts[g.host_id].allocated_vcpus), g.order))
    for gpu in empties[:3]:
        mark = layout.mark()
        took = []
        for vm_id in sorted(waiting, key=lambda v: (origin[v][1] != gpu.host_id, v)):
            if len(took) == profile.max_per_gpu:
                break
            if _try(layout, layout.vms[vm_id], gpu, profile):
                took.append(vm_id)
        if _worth_equal_gpu(profile, len(took)):
            for vm_id in took:
                waiting.remove(vm_id)
            return True
        layout.rollback(mark)
    return False


# --- step 3: first-fit decreasing ----------------------------------------------------------

def _first_fit(layout: Layout, vm: WorkVm, profiles: Sequence[ProfileSpec], empty_from: dict[str, int]) -> bool:
    """Place `profiles` for `vm` on the first host (in host, GPU order) where they all fit, each
    on the first GPU of that host that takes it; one vGPU: the first GPU of the fleet."""
    first = profiles[0]
    model = first.gpu_model
    order = layout.gpus_by_model.get(model, [])

    def empties():
        index = empty_from.get(model, 0)
        while index < len(order) and layout.gpus[order[index]].vgpus:
            index += 1
        empty_from[model] = index
        for gpu_id in order[index:]:
            if not layout.gpus[gpu_id].vgpus:
                yield layout.gpus[gpu_id]

    opened = sorted(_open_gpus(layout, first), key=lambda g: g.order)
    if len(profiles) == 1:
        return any(_try(layout, vm, gpu, first) for gpu in heapq.merge(opened, empties(), key=lambda g: g.order))
    hosts = dict.fromkeys(layout.gpus[g].host_id for g in order)
    for host_id in hosts:
        host = layout.hosts[host_id]
        if not host.has_room(vm.vcpus, vm.ram_gib):
            continue
        mark = layout.mark()
        for profile in profiles:
            if not any(_try(layout, vm, layout.gpus[g], profile) for g in host.gpu_ids):
                layout.rollback(mark)
                empty_from[model] = 0
                break
        else:
            return True
    return False


def ffd_layout(snapshot: FleetSnapshot, profiles: dict[int, list[ProfileSpec]]) -> tuple[Layout, dict[int, str]]:
    """First-fit decreasing from an empty fleet: VMs by frame buffer, largest first, each on
    the first host and GPU where placement takes it. Returns the layout and the VMs it left out."""
    layout = Layout(snapshot, empty=True)
    empty_from: dict[str, int] = {}
    missed = {}
    items = sorted((vm_id for vm_id, p in profiles.items() if p),
                   key=lambda vm_id: (-sum(p.fb_mib for p in profiles[vm_id]), -len(profiles[vm_id]), vm_id))
    for vm_id in items:
        vm = layout.vms[vm_id]
        wanted = sorted(profiles[vm_id], key=lambda p: -p.fb_mib)
        if not _first_fit(layout, vm, wanted, empty_from):
            missed[vm_id] = "first-fit decreasing found no room: " + unplaced_reason(layout, vm, wanted)
        layout.commit()
    return layout, missed


def relabel(layout: Layout, snapshot: FleetSnapshot) -> tuple[dict[int, list[tuple[int, ProfileSpec]]],
            dict[int, list[Arrival]]]:
    """`layout`'s vGPUs moved between identical hosts, then between identical GPUs of a host,
    so that as many as possible sit where they are now. Identical: same GPUs (model, mode,
    size mode), same capacity, same VMs without vGPU claiming it; swapping their contents keeps
    every rule satisfied. Returns the relabelled mapping and order of arrivals per GPU."""
    original_host = {vm.id: vm.host_id for vm in snapshot.vms.values() if vm.vgpus}
    original_gpu: dict[tuple[int, int], int] = Counter()
    for vm in snapshot.vms.values():
        for v in vm.vgpus:
            original_gpu[(vm.id, v.gpu_id)] += 1

    def host_key(host_id: int):
        host = layout.hosts[host_id]
        gpus = tuple(sorted((g.model.name, g.mode, g.size_mode) for g in (layout.gpus[i] for i in host.gpu_ids)))
        return gpus, host.vcpu_capacity, host.ram_capacity_gib, host.allocated_vcpus - sum(
            layout.vms[v].vcpus for v in _vms_on(layout, host_id)), host.allocated_ram_gib - sum(
            layout.vms[v].ram_gib for v in _vms_on(layout, host_id))

    host_map: dict[int, int] = {}
    groups: dict[tuple, list[int]] = {}
    for host_id in layout.hosts:
        groups.setdefault(host_key(host_id), []).append(host_id)
    for members in groups.values():
        weights = []
        for content in members:
            stay = Counter(original_host.get(vm_id) for vm_id in _vms_on(layout, content))
            for target in members:
                if stay[target]:
                    weights.append((-stay[target], content, target))
        host_map.update(_greedy_match(members, weights))

    gpu_map: dict[int, int] = {}
    for content_host, target_host in host_map.items():
        content_gpus = layout.hosts[content_host].gpu_ids
        target_gpus = layout.hosts[target_host].gpu_ids
        by_kind: dict[tuple, tuple[list[int], list[int]]] = {}
        for gpu_id in content_gpus:
            g = layout.gpus[gpu_id]
            by_kind.setdefault((g.model.name, g.mode, g.size_mode), ([], []))[0].append(gpu_id)
        for gpu_id in target_gpus:
            g = layout.gpus[gpu_id]
            by_kind.setdefault((g.model.name, g.mode, g.size_mode), ([], []))[1].append(gpu_id)
        for contents, targets in by_kind.values():
            weights = []
            for content in contents:
                for target in targets:
                    w = sum(original_gpu[(v.vm_id, target)] > 0 for v in layout.gpus[content].vgpus)
                    if w:
                        weights.append((-w, content, target))
            gpu_map.update(_greedy_match_pairs(contents, targets, weights))
    mapping = {vm.id: [(gpu_map[g], p) for g, p in vm.vgpus] for vm in layout.vms.values()}
    arrivals = {gpu_map[g.id]: list(g.arrivals) for g in layout.gpus.values() if g.id in gpu_map}
    return mapping, arrivals


def _vms_on(layout: Layout, host_id: int) -> list[int]:
    return list(dict.fromkeys(v.vm_id for g in layout.hosts[host_id].gpu_ids for v in layout.gpus[g].vgpus))


def _greedy_match(members: list[int], weights: list[tuple[int, int, int]]) -> dict[int, int]:
    return _greedy_match_pairs(members, members, weights)


def _greedy_match_pairs(contents: list[int], targets: list[int], weights: list[tuple[int, int, int]]) -> dict[
                        int, int]:
    """A one-to-one map of `contents` onto `targets` (equal lengths), heaviest pairs first."""
    result: dict[int, int] = {}
    taken: set[int] = set()
    for _, content, target in sorted(weights):
        if content not in result and target not in taken:
            result[content] = target
            taken.add(target)
    free = [t for t in targets if t not in taken]
    for content in contents:
        if content not in result:
            result[content] = free.pop(0)
    return result


# --- fewer moves ---------------------------------------------------------------------------

def restore_moved(layout: Layout, snapshot: FleetSnapshot, changed: Iterable[int], deadline: float) -> int:
    """Put VMs the search moved back on their own GPUs where those still hold vGPUs and take
    them again, keeping each return that costs no GPU: the search judges GPUs only, so some
    VMs end up moved for nothing. Returns how many came back."""
    changed = set(changed)
    back = 0
    for vm in list(layout.vms.values()):
        if time.perf_counter() >= deadline:
            break
        original = snapshot.vms[vm.id]
        if not vm.moved or vm.id in changed or not original.vgpus:
            continue
        own = [v.gpu_id for v in original.vgpus]
        if sorted(g for g, _ in vm.vgpus) == sorted(own) or not all(layout.gpus[g].vgpus for g in own):
            continue
        before = layout.gpus_in_use()
        mark = layout.mark()
        ok = layout.remove(vm)
        for v in original.vgpus if ok else ():
            if not _try(layout, vm, layout.gpus[v.gpu_id], v.profile):
                ok = False
                break
        if ok and layout.gpus_in_use() <= before:
            layout.commit()
            back += 1
        else:
            layout.rollback(mark)
    return back


def keep_in_place(mapping: dict[int, list[tuple[int, ProfileSpec]]],
                  snapshot: FleetSnapshot) -> dict[int, list[tuple[int, ProfileSpec]]]:
    """`mapping` with interchangeable VMs swapped so that as many as possible keep their GPU,
    then their host.

    Single-vGPU VMs of one profile, vCPU count and RAM on equal-size GPUs are interchangeable:
    swapping two of them leaves every GPU's profiles and every host's vCPU and RAM claims as
    they were, so each rule still holds. The search judges GPUs only and may shuffle such VMs
    between GPUs it rebuilt; here each one first takes a slot of its own GPU, then a slot on
    its own host, then any slot left. Mixed-size GPUs and multi-vGPU VMs are left as they are
    (placement IDs and multi-GPU claims tie them to their slots)."""
    def swappable_gpu(gpu_id: int) -> bool:
        return snapshot.gpus[gpu_id].size_mode != "mixed"

    classes: dict[tuple, list[int]] = {}
    for vm_id, vgpus in mapping.items():
        if len(vgpus) == 1 and swappable_gpu(vgpus[0][0]):
            vm = snapshot.vms[vm_id]
            classes.setdefault((vgpus[0][1].id, vm.vcpus, vm.ram_gib), []).append(vm_id)
    result = dict(mapping)
    for members in classes.values():
        if len(members) < 2:
            continue
        profile = mapping[members[0]][0][1]
        slots = Counter(mapping[vm_id][0][0] for vm_id in members)
        left = sorted(members)
        for prefer in (lambda vm, g: g == vm.vgpus[0].gpu_id,
                       lambda vm, g: snapshot.gpus[g].host_id == vm.host_id):
            waiting = []
            for vm_id in left:
                vm = snapshot.vms[vm_id]
                target = next((g for g in sorted(slots) if slots[g] and vm.vgpus and prefer(vm, g)), None)
                if target is None:
                    waiting.append(vm_id)
                    continue
                result[vm_id] = [(target, profile)]
                slots[target] -= 1
            left = waiting
        for vm_id in left:
            target = next(g for g in sorted(slots) if slots[g])
            result[vm_id] = [(target, profile)]
            slots[target] -= 1
    return result


def _signature_now(vm: WorkVm) -> list[tuple[int, int]]:
    return sorted((g, p.id) for g, p in vm.vgpus)


def _signature_then(snapshot: FleetSnapshot, vm_id: int) -> list[tuple[int, int]]:
    return sorted((v.gpu_id, v.profile.id) for v in snapshot.vms[vm_id].vgpus)


def reduce_moves(layout: Layout, snapshot: FleetSnapshot, changed: Iterable[int], deadline: float,
                 rng: random.Random, patience: int = 200) -> int:
    """Fewer moves for the same GPUs: a VM the search moved is picked, its own GPUs and the ones
    it sits on now are taken apart, and their VMs placed again, each first on its own GPUs, then
    where it was, then anywhere. Kept when no more GPUs are used and fewer VMs sit elsewhere than
    they do now (VMs named in `changed` get new vGPUs anyway and do not count). The GPU search
    judges GPUs only; exchanges it kept for a GPU can leave a chain of VMs displaced that a
    smaller rearrangement avoids. Returns how many VMs came home."""
    changed = set(changed)

    def displaced(vm_id: int) -> bool:
        vm = layout.vms[vm_id]
        return vm_id not in changed and bool(vm.vgpus) and _signature_now(vm) != _signature_then(snapshot, vm_id)

    def on_equal_size_gpus(vm_id: int) -> bool:
        # On a mixed-size GPU the placement IDs count too: a VM put back on its own GPU at
        # other IDs still moves, which this comparison of GPUs would not see. Left alone.
        gpus = [v.gpu_id for v in snapshot.vms[vm_id].vgpus] + [g for g, _ in layout.vms[vm_id].vgpus]
        return not any(layout.gpus[g].mixed for g in gpus)

    away = {vm_id for vm_id in layout.vms if displaced(vm_id) and on_equal_size_gpus(vm_id)}
    came_home = failures = 0
    while away and failures < patience and time.perf_counter() < deadline:
        vm_id = rng.choice(sorted(away))
        own = [v.gpu_id for v in snapshot.vms[vm_id].vgpus]
        ruined = set(own) | {g for g, _ in layout.vms[vm_id].vgpus}
        if any(layout.gpus[g].mixed for g in ruined):
            away.discard(vm_id)
            continue
        vm_ids = list(dict.fromkeys(v.vm_id for g in sorted(ruined) for v in layout.gpus[g].vgpus))
        before_gpus = layout.gpus_in_use()
        before_away = sum(1 for v in vm_ids if v in away)
        mark = layout.mark()
        if _replace_home_first(layout, snapshot, vm_ids, changed) and layout.gpus_in_use() <= before_gpus:
            now_away = {v for v in vm_ids if displaced(v)}
            if len(now_away) < before_away:
                layout.commit()
                came_home += before_away - len(now_away)
                away = (away - set(vm_ids)) | {v for v in now_away if on_equal_size_gpus(v)}
                failures = 0
                continue
        layout.rollback(mark)
        failures += 1
    return came_home


def _replace_home_first(layout: Layout, snapshot: FleetSnapshot, vm_ids: list[int], changed: set[int]) -> bool:
    """Take `vm_ids` off their GPUs and place them again: VMs going home first (largest first),
    each on its own GPUs, else where it was, else anywhere. False if one finds no room."""
    where: dict[int, tuple[list[int], int | None, list[ProfileSpec]]] = {}
    for vm_id in vm_ids:
        vm = layout.vms[vm_id]
        where[vm_id] = ([g for g, _ in vm.vgpus], vm.host_id, [p for _, p in vm.vgpus])
        if not layout.remove(vm):
            return False

    def home(vm_id: int) -> list[int]:
        return [] if vm_id in changed else [v.gpu_id for v in snapshot.vms[vm_id].vgpus]

    order = sorted(vm_ids, key=lambda v: (not home(v), -sum(p.fb_mib for p in where[v][2]), v))
    for vm_id in order:
        vm = layout.vms[vm_id]
        gpus, host_id, profiles = where[vm_id]
        original = snapshot.vms[vm_id]
        if home(vm_id) and [p.id for p in profiles] == [v.profile.id for v in original.vgpus]:
            mark = layout.mark()
            if all(_try(layout, vm, layout.gpus[v.gpu_id], v.profile) for v in original.vgpus):
                continue
            layout.rollback(mark)
        if not place_vm(layout, vm, profiles, prefer=gpus, prefer_host=host_id):
            return False
    return True

"""The optimizer's GPU counts against the exact optimum of OR-Tools CP-SAT (sizing/tests/exact.py)
on small random fleets of equal-size GPUs with tight hosts, and its lower bound against the
same optimum."""

import random

import pytest

from sizing import optimizer
from sizing.tests.exact import exact_optimum, target_profiles
from sizing.tests.fleets import PROFILES, FleetBuilder, random_fleet

SEEDS = range(120)


def small_fleet(seed: int):
    return random_fleet(random.Random(seed), equal_only=True, vms=(4, 22), hosts=(1, 4))


def made_changes(plan, changes):
    left_out = {vm_id for vm_id, _ in plan.unplaced}
    return [c for c in changes if c.vm_id not in left_out]


@pytest.fixture(scope="module")
def solved():
    """Per seed: the fleet, the changes, the optimizer's plan and CP-SAT's optimum for the
    changes the plan makes."""
    results = {}
    for seed in SEEDS:
        snapshot, changes = small_fleet(seed)
        plan = optimizer.optimize(snapshot, changes)
        best = exact_optimum(snapshot, made_changes(plan, changes), size_cuts=True)
        results[seed] = (snapshot, changes, plan, best)
    return results


def test_the_optimizer_finds_the_optimum_of_small_fleets(solved):
    missed = {seed: (plan.gpus_after, best.gpus) for seed, (_, _, plan, best) in solved.items()
              if plan.gpus_after != best.gpus}

    assert all(best.proven for *_, best in solved.values())
    assert missed == {}


def test_cp_sat_layouts_pass_the_placement_rules(solved):
    """The exact model is no looser than placement: its optimum is a layout the fleet could hold
    (otherwise "the optimizer matches the optimum" would prove little)."""
    by_id = {p.id: p for p in PROFILES.values()}
    for snapshot, changes, plan, best in solved.values():
        builder = FleetBuilder.from_snapshot(snapshot)
        for vm_id in snapshot.vms:
            builder.remove(vm_id)
        wanted = target_profiles(snapshot, made_changes(plan, changes))
        for vm_id, gpu_ids in best.layout.items():
            for gpu_id, spec in zip(gpu_ids, sorted(wanted[vm_id], key=lambda p: p.id), strict=True):
                builder.place(vm_id, gpu_id, by_id[spec.id].name)
        assert sum(1 for g in builder.gpus.values() if g.vgpus) == best.gpus


def test_the_lower_bound_never_exceeds_the_optimum(solved):
    # Without the size cuts (they are the bound's own argument), so CP-SAT decides alone.
    checked = 0
    for snapshot, changes, plan, _ in list(solved.values())[:60]:
        best = exact_optimum(snapshot, made_changes(plan, changes))
        assert plan.lower_bound <= best.gpus
        checked += best.proven
    assert checked >= 50


def test_a_three_host_exchange_at_full_vcpu_capacity_is_within_one_gpu():
    """One of the rare fleets (4 in 1,000 of these) where the optimizer may stay one GPU above
    the optimum: three hosts of A16 at or near their vCPU capacity, where the optimum swaps the
    two 16Q VMs between hosts and regroups the 2Q and 4Q VMs around them, nine VMs moving at
    once. Every step of the search must keep every host within capacity on its own, and no
    short sequence of such steps leads there. The plan is still valid."""
    snapshot, changes = small_fleet(730)

    plan = optimizer.optimize(snapshot, changes)
    best = exact_optimum(snapshot, made_changes(plan, changes), size_cuts=True)

    assert optimizer.verify(snapshot, plan) == []
    assert best.proven
    assert best.gpus <= plan.gpus_after <= best.gpus + 1

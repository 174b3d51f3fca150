"""Properties of every plan the optimizer returns, on random small fleets: Quadro RTX 6000
(Turing: full-GPU-only multi-vGPU), L40S and A40 with some GPUs in mixed-size mode, A16, some
passthrough GPUs; hosts with tight vCPU and RAM; VMs with up to three vGPUs placed at random
(a fragmented layout); random pending changes (resize, grow, shrink, remove, a first vGPU)."""

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sizing import optimizer
from sizing.tests.fleets import apply_plan, layout_of, plan_layout, random_fleet

fleets = st.randoms(use_true_random=False).map(random_fleet)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(fleets)
def test_every_plan_passes_the_placement_rules_and_applies_as_planned(fleet):
    snapshot, changes = fleet

    plan = optimizer.optimize(snapshot, changes)

    assert optimizer.verify(snapshot, plan) == []
    # Applied the way the product applies it, the fleet ends exactly as the plan says.
    assert layout_of(apply_plan(snapshot, plan).gpus.values()) == plan_layout(plan)
    assert plan.gpus_after >= plan.lower_bound


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(fleets)
def test_without_changes_the_plan_never_uses_more_gpus_than_now(fleet):
    snapshot, _ = fleet

    plan = optimizer.optimize(snapshot)

    assert optimizer.verify(snapshot, plan) == []
    assert plan.unplaced == ()
    assert plan.gpus_after <= plan.gpus_before
    assert plan.lower_bound == optimizer.lower_bound(snapshot) <= plan.gpus_after


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(fleets)
def test_the_optimizer_never_uses_more_gpus_than_first_fit_decreasing(fleet):
    snapshot, changes = fleet

    plan = optimizer.optimize(snapshot, changes)
    baseline = optimizer.first_fit_decreasing(snapshot, changes)

    # Compared where the baseline is a plan at all (first fit may find no room for a VM, which
    # then loses its vGPUs): the optimizer leaves out no more changes, and with as many left
    # out it uses no more GPUs.
    if optimizer.verify(snapshot, baseline) == []:
        assert len(plan.unplaced) <= len(baseline.unplaced)
        if len(plan.unplaced) == len(baseline.unplaced):
            assert plan.gpus_after <= baseline.gpus_after

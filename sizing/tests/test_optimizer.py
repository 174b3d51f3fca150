"""The placement optimizer on small fleets checked by hand: what it frees, what it moves, what it
may not do (equal-size conflicts, aligned slots, multi-vGPU rules, host vCPU and RAM), pending
changes, the lower bound, and `verify` catching broken plans. No database."""

import json

import pytest

from fleet.placement import Rule
from sizing import optimizer
from sizing.optimizer import Change, PlanRule
from sizing.tests.fleets import FleetBuilder, apply_plan, layout_of, plan_layout, profile


def optimize_and_verify(snapshot, changes=()):
    plan = optimizer.optimize(snapshot, changes)
    assert optimizer.verify(snapshot, plan) == []
    assert layout_of(apply_plan(snapshot, plan).gpus.values()) == plan_layout(plan)
    return plan


def test_two_half_full_gpus_become_one_with_one_move():
    b = FleetBuilder()
    host = b.host()
    gpu_a, gpu_b = b.gpu(host), b.gpu(host)
    vm_a, vm_b = b.vm(), b.vm()
    b.place(vm_a, gpu_a, "RTX6000-12Q")
    b.place(vm_b, gpu_b, "RTX6000-12Q")
    snapshot = b.snapshot()

    plan = optimize_and_verify(snapshot)

    assert (plan.gpus_before, plan.gpus_after, plan.lower_bound) == (2, 1, 1)
    assert len(plan.moves) == 1
    move = plan.moves[0]
    assert move.reason == "consolidation"
    assert move.from_host_id == move.to_host_id == host
    assert set(plan.freed_gpu_ids) == set(move.from_gpu_ids)
    assert plan.newly_used_gpu_ids == ()
    # The VM that stays comes first, the moved one after it, at the slot applying gives it.
    assert [a.vm_id for a in plan.assignments][-1] == move.vm_id
    assert sorted(a.placement_id for a in plan.assignments) == [0, 1]


def test_a_fleet_already_packed_is_left_alone():
    b = FleetBuilder()
    host = b.host()
    gpu = b.gpu(host)
    for _ in range(2):
        b.place(b.vm(), gpu, "RTX6000-12Q")
    b.place(b.vm(), b.gpu(host), "RTX6000-24Q")
    snapshot = b.snapshot()

    plan = optimize_and_verify(snapshot)

    assert plan.moves == ()
    assert plan.gpus_after == plan.gpus_before == plan.lower_bound == 2


def test_equal_size_gpus_never_mix_sizes():
    b = FleetBuilder()
    host = b.host()
    b.place(b.vm(), b.gpu(host), "RTX6000-12Q")
    b.place(b.vm(), b.gpu(host), "RTX6000-6Q")
    snapshot = b.snapshot()

    plan = optimize_and_verify(snapshot)

    # 12 GB + 6 GB would fit 24 GB of frame buffer, but an equal-size GPU holds one size.
    assert plan.moves == ()
    assert plan.gpus_after == plan.lower_bound == 2


def test_mixed_size_gpus_share_one_gpu_between_sizes():
    b = FleetBuilder()
    host = b.host(cpu_threads=128, ram_gib=1024)
    big, small = b.vm(), b.vm()
    b.place(big, b.gpu(host, "NVIDIA L40S", "mixed"), "L40S-24Q")
    b.place(small, b.gpu(host, "NVIDIA L40S", "mixed"), "L40S-12Q")
    snapshot = b.snapshot()

    plan = optimize_and_verify(snapshot)

    assert (plan.gpus_after, plan.lower_bound, len(plan.moves)) == (1, 1, 1)


def test_the_same_vgpus_on_equal_size_l40s_need_two_gpus():
    b = FleetBuilder()
    host = b.host(cpu_threads=128, ram_gib=1024)
    b.place(b.vm(), b.gpu(host, "NVIDIA L40S"), "L40S-24Q")
    b.place(b.vm(), b.gpu(host, "NVIDIA L40S"), "L40S-12Q")
    snapshot = b.snapshot()

    plan = optimize_and_verify(snapshot)

    assert plan.moves == ()
    assert plan.gpus_after == plan.lower_bound == 2


def test_a_span_that_is_free_but_not_aligned_cannot_take_a_larger_vgpu():
    """Two L40S-8Q sit at placement IDs 0 and 16 of a mixed-size GPU (the one between them left):
    24 GB are free but no aligned 24 GB span, so the 24Q of the other GPU cannot simply move in.
    One GPU is enough, at two moves: the 8Qs to the other GPU's free half (IDs 16 and 24), or
    the 8Q at 16 re-placed so that the 24Q finds an aligned span; `verify` checks the slots."""
    b = FleetBuilder()
    host = b.host(cpu_threads=128, ram_gib=1024)
    gpu_a, gpu_b = b.gpu(host, "NVIDIA L40S", "mixed"), b.gpu(host, "NVIDIA L40S", "mixed")
    first, middle, last = b.vm(), b.vm(), b.vm()
    assert [b.place(vm, gpu_a, "L40S-8Q") for vm in (first, middle, last)] == [0, 8, 16]
    b.remove(middle)
    big = b.vm()
    b.place(big, gpu_b, "L40S-24Q")
    snapshot = b.snapshot()
    assert not b.check(big, gpu_a, "L40S-24Q").ok

    plan = optimize_and_verify(snapshot)

    assert plan.gpus_after == 1
    assert len(plan.moves) == 2
    slots = sorted((a.gpu_id, a.placement_id, a.vm_id) for a in plan.assignments)
    if plan.freed_gpu_ids == (gpu_a,):
        assert slots == sorted([(gpu_b, 0, big), (gpu_b, 16, first), (gpu_b, 24, last)]) or \
            slots == sorted([(gpu_b, 0, big), (gpu_b, 16, last), (gpu_b, 24, first)])
    else:
        assert plan.freed_gpu_ids == (gpu_b,)
        assert [(g, vm) for g, _, vm in slots] == [(gpu_a, first), (gpu_a, last), (gpu_a, big)]
        assert slots[0] == (gpu_a, 0, first)  # the 8Q that stays keeps its slot


def test_verify_refuses_a_vgpu_put_in_a_span_that_is_not_aligned():
    b = FleetBuilder()
    host = b.host(cpu_threads=128, ram_gib=1024)
    gpu_a, gpu_b = b.gpu(host, "NVIDIA L40S", "mixed"), b.gpu(host, "NVIDIA L40S", "mixed")
    first, middle, last = b.vm(), b.vm(), b.vm()
    for vm in (first, middle, last):
        b.place(vm, gpu_a, "L40S-8Q")
    b.remove(middle)
    big = b.vm()
    b.place(big, gpu_b, "L40S-24Q")
    snapshot = b.snapshot()
    big_24q = profile("L40S-24Q").id
    # A plan that packs the 24Q into the 24 GB left between and after the two 8Qs.
    broken = optimizer.Plan(
        assignments=(optimizer.Assignment(first, gpu_a, profile("L40S-8Q").id, 0),
                     optimizer.Assignment(last, gpu_a, profile("L40S-8Q").id, 16),
                     optimizer.Assignment(big, gpu_a, big_24q, 8)),
        moves=(optimizer.Move(big, "vm", (gpu_b,), (gpu_a,), host, host, big_24q, big_24q, "consolidation"),),
        gpus_before=2, gpus_after=1, lower_bound=1, freed_gpu_ids=(gpu_b,), newly_used_gpu_ids=(), unplaced=(),
        seconds=0.0,
    )

    violations = optimizer.verify(snapshot, broken)

    assert [v.rule for v in violations] == [Rule.PLACEMENT_SLOT]
    assert "no aligned span" in violations[0].message


def test_a_multi_vgpu_vm_keeps_its_vgpus_on_one_host():
    b = FleetBuilder()
    host_a, host_b = b.host(cpu_threads=128, ram_gib=1024), b.host(cpu_threads=128, ram_gib=1024)
    lighting = b.vm(vcpus=16, ram_gib=128)
    gpu_1, gpu_2 = b.gpu(host_a, "NVIDIA L40S"), b.gpu(host_a, "NVIDIA L40S")
    b.place(lighting, gpu_1, "L40S-24Q")
    b.place(lighting, gpu_2, "L40S-24Q")
    other = b.vm()
    b.place(other, b.gpu(host_b, "NVIDIA L40S"), "L40S-24Q")
    snapshot = b.snapshot()

    plan = optimize_and_verify(snapshot)

    assert plan.gpus_after == plan.lower_bound == 2
    hosts = {snapshot.gpus[a.gpu_id].host_id for a in plan.assignments if a.vm_id == lighting}
    assert len(hosts) == 1


def test_turing_multi_vgpu_change_to_partial_profiles_is_left_out_with_the_rule():
    b = FleetBuilder()
    host = b.host()
    lighting = b.vm(vcpus=16, ram_gib=64)
    for gpu in (b.gpu(host), b.gpu(host)):
        b.place(lighting, gpu, "RTX6000-24Q")
    b.gpu(host)
    snapshot = b.snapshot()

    plan = optimize_and_verify(snapshot, [Change(lighting, profile("RTX6000-12Q").id, 2, "resize-request:7")])

    assert [vm_id for vm_id, _ in plan.unplaced] == [lighting]
    assert "full-GPU profiles" in plan.unplaced[0][1]
    assert plan.moves == ()
    assert sorted(p for _, p, _ in plan_layout(plan)[lighting]) == [profile("RTX6000-24Q").id] * 2


@pytest.mark.parametrize(("overcommit", "gpus_after"), [(1.0, 2), (2.0, 1)])
def test_a_vm_moves_to_another_host_only_where_its_vcpus_fit(overcommit, gpus_after):
    b = FleetBuilder()
    host_a = b.host(cpu_threads=8, ram_gib=64, vcpu_overcommit=overcommit)
    host_b = b.host(cpu_threads=8, ram_gib=64, vcpu_overcommit=overcommit)
    b.place(b.vm(vcpus=8, ram_gib=16), b.gpu(host_a), "RTX6000-12Q")
    b.place(b.vm(vcpus=8, ram_gib=16), b.gpu(host_b), "RTX6000-12Q")
    snapshot = b.snapshot()

    plan = optimize_and_verify(snapshot)

    assert plan.gpus_after == gpus_after
    assert plan.lower_bound == 1  # the bound leaves hosts out
    if gpus_after == 1:
        assert plan.moves[0].from_host_id != plan.moves[0].to_host_id


def test_host_ram_blocks_a_move_too():
    b = FleetBuilder()
    host_a, host_b = b.host(cpu_threads=64, ram_gib=32), b.host(cpu_threads=64, ram_gib=32)
    b.place(b.vm(vcpus=4, ram_gib=24), b.gpu(host_a), "RTX6000-12Q")
    b.place(b.vm(vcpus=4, ram_gib=24), b.gpu(host_b), "RTX6000-12Q")
    snapshot = b.snapshot()

    plan = optimize_and_verify(snapshot)

    assert plan.moves == ()
    assert plan.gpus_after == 2


def test_an_upsize_goes_elsewhere_when_its_gpu_is_shared():
    b = FleetBuilder()
    host = b.host()
    gpu = b.gpu(host)
    spare = b.gpu(host)
    grows, neighbour = b.vm(), b.vm()
    b.place(grows, gpu, "RTX6000-12Q")
    b.place(neighbour, gpu, "RTX6000-12Q")
    snapshot = b.snapshot()

    plan = optimize_and_verify(snapshot, [Change(grows, profile("RTX6000-24Q").id, 1, "resize-request:3")])

    assert plan.unplaced == ()
    (move,) = plan.moves
    assert (move.vm_id, move.reason, move.to_gpu_ids) == (grows, "resize-request:3", (spare,))
    assert (move.from_profile_id, move.to_profile_id) == (profile("RTX6000-12Q").id, profile("RTX6000-24Q").id)
    assert plan.newly_used_gpu_ids == (spare,)


def test_a_downsize_makes_room_that_consolidation_uses():
    b = FleetBuilder()
    host = b.host()
    shrinks, other = b.vm(), b.vm()
    b.place(shrinks, b.gpu(host), "RTX6000-24Q")
    b.place(other, b.gpu(host), "RTX6000-12Q")
    snapshot = b.snapshot()

    plan = optimize_and_verify(snapshot, [Change(shrinks, profile("RTX6000-12Q").id, 1, "suggestion:9")])

    assert (plan.gpus_before, plan.gpus_after) == (2, 1)
    reasons = {m.vm_id: m.reason for m in plan.moves}
    assert reasons[shrinks] == "suggestion:9"


def test_removing_a_vms_vgpus_frees_its_gpu():
    b = FleetBuilder()
    host = b.host()
    leaving, staying = b.vm(), b.vm()
    gpu = b.gpu(host)
    b.place(leaving, gpu, "RTX6000-24Q")
    b.place(staying, b.gpu(host), "RTX6000-24Q")
    snapshot = b.snapshot()

    plan = optimize_and_verify(snapshot, [Change(leaving, None, 0, "remove:1")])

    assert plan.freed_gpu_ids == (gpu,)
    (move,) = plan.moves
    assert (move.to_gpu_ids, move.to_host_id, move.to_profile_id) == ((), None, None)


def test_changes_naming_what_the_fleet_lacks_are_left_out_with_a_reason():
    b = FleetBuilder()
    host = b.host()
    vm = b.vm()
    b.place(vm, b.gpu(host), "RTX6000-12Q")
    snapshot = b.snapshot()

    plan = optimize_and_verify(snapshot, [
        Change(9999, profile("RTX6000-12Q").id, 1, "resize-request:1"),
        Change(vm, 123456, 1, "resize-request:2"),
    ])

    reasons = dict(plan.unplaced)
    assert "not in the fleet" in reasons[9999]
    assert "not in the catalog" in reasons[vm]


def test_a_change_for_a_model_the_fleet_has_no_gpu_of_is_left_out():
    b = FleetBuilder()
    host = b.host()
    vm = b.vm()
    b.place(vm, b.gpu(host), "RTX6000-12Q")
    snapshot = b.snapshot()

    plan = optimize_and_verify(snapshot, [Change(vm, profile("L40S-12Q").id, 1, "resize-request:4")])

    assert "no NVIDIA L40S GPU" in dict(plan.unplaced)[vm]
    assert plan.moves == ()


def test_too_many_vgpus_per_vm_is_refused_before_searching():
    b = FleetBuilder()
    vm = b.vm()
    b.gpu(b.host())
    snapshot = b.snapshot()

    plan = optimize_and_verify(snapshot, [Change(vm, profile("RTX6000-24Q").id, 5, "resize-request:5")])

    assert "at most 4" in dict(plan.unplaced)[vm]


def test_passthrough_gpus_are_never_used():
    b = FleetBuilder()
    host = b.host()
    b.gpu(host, mode="passthrough")
    vm = b.vm()
    snapshot = b.snapshot()

    plan = optimize_and_verify(snapshot, [Change(vm, profile("RTX6000-12Q").id, 1, "resize-request:6")])

    assert [vm_id for vm_id, _ in plan.unplaced] == [vm]
    assert plan.assignments == ()


def test_a_new_vm_on_a_host_moves_its_claim_with_its_first_vgpu():
    """A VM recorded on a host without vGPU (its vCPUs counted there) that gets a vGPU on
    another host: the plan checks the new host's capacity, and replays cleanly."""
    b = FleetBuilder()
    full = b.host(cpu_threads=8, ram_gib=64)
    roomy = b.host(cpu_threads=64, ram_gib=256)
    b.place(b.vm(vcpus=8, ram_gib=16), b.gpu(full), "RTX6000-24Q")
    newcomer = b.vm(vcpus=8, ram_gib=16, host_id=roomy)
    target = b.gpu(roomy)
    snapshot = b.snapshot()

    plan = optimize_and_verify(snapshot, [Change(newcomer, profile("RTX6000-12Q").id, 1, "resize-request:8")])

    assert plan_layout(plan)[newcomer][0][0] == target


def test_lower_bound_counts_sizes_apart_on_equal_size_gpus():
    b = FleetBuilder()
    host = b.host(cpu_threads=256, ram_gib=4096)
    gpus = [b.gpu(host) for _ in range(6)]
    for gpu in gpus[:3]:
        b.place(b.vm(), gpu, "RTX6000-12Q")  # three 12Q: two GPUs
    b.place(b.vm(), gpus[3], "RTX6000-24Q")  # one 24Q: one GPU
    b.place(b.vm(), gpus[4], "RTX6000-2Q")  # one 2Q: a GPU of its own
    newcomer = b.vm()
    snapshot = b.snapshot()

    assert optimizer.lower_bound(snapshot) == 4
    assert optimizer.lower_bound(snapshot, [Change(newcomer, profile("RTX6000-12Q").id, 1)]) == 4
    assert optimizer.lower_bound(snapshot, [Change(newcomer, profile("RTX6000-12Q").id, 2)]) == 5


def test_lower_bound_lets_sizes_share_mixed_size_gpus():
    b = FleetBuilder()
    host = b.host(cpu_threads=256, ram_gib=4096)
    b.place(b.vm(), b.gpu(host, "NVIDIA L40S", "mixed"), "L40S-24Q")  # half a GPU
    b.place(b.vm(), b.gpu(host, "NVIDIA L40S"), "L40S-12Q")  # a quarter either way
    b.place(b.vm(), b.gpu(host, "NVIDIA L40S"), "L40S-8Q")  # a sixth (equal) or a quarter (mixed)
    snapshot = b.snapshot()

    assert optimizer.lower_bound(snapshot) == 1
    plan = optimize_and_verify(snapshot)
    # On a mixed-size GPU an 8Q takes a 12 GB span: 24 + 12 + 12 GB = one GPU exactly.
    assert plan.gpus_after == 1


def test_lower_bound_knows_when_equal_size_gpus_are_too_few():
    """Twelve L40S-8Q: six fit an equal-size GPU, four a mixed-size one (12 GB spans). With one
    equal-size GPU, six must go to mixed-size GPUs: three GPUs, not the two that twelve eighths
    of equal-size GPUs would suggest."""
    b = FleetBuilder()
    host = b.host(cpu_threads=256, ram_gib=4096)
    equal = b.gpu(host, "NVIDIA L40S")
    mixed = [b.gpu(host, "NVIDIA L40S", "mixed") for _ in range(3)]
    for index in range(12):
        b.place(b.vm(vcpus=4, ram_gib=16), equal if index < 6 else mixed[index % 3], "L40S-8Q")
    snapshot = b.snapshot()

    assert optimizer.lower_bound(snapshot) == 3
    plan = optimize_and_verify(snapshot)
    assert plan.gpus_after == 3


def test_first_fit_decreasing_packs_from_scratch_and_moves_most_vms():
    b = FleetBuilder()
    host = b.host(cpu_threads=256, ram_gib=4096)
    gpus = [b.gpu(host) for _ in range(4)]
    vms = [b.vm() for _ in range(4)]
    for vm, gpu in zip(vms, gpus, strict=True):
        b.place(vm, gpu, "RTX6000-12Q")
    snapshot = b.snapshot()

    baseline = optimizer.first_fit_decreasing(snapshot)
    plan = optimize_and_verify(snapshot)

    assert optimizer.verify(snapshot, baseline) == []
    assert baseline.gpus_after == plan.gpus_after == 2
    # First fit fills GPUs in id order: the first two GPUs; the optimizer keeps half the VMs put.
    assert {a.gpu_id for a in baseline.assignments} == set(gpus[:2])
    assert len(baseline.moves) == 3
    assert len(plan.moves) == 2


def test_plan_to_json_is_plain_data():
    b = FleetBuilder()
    host = b.host()
    vm_a, vm_b = b.vm(), b.vm()
    b.place(vm_a, b.gpu(host), "RTX6000-12Q")
    b.place(vm_b, b.gpu(host), "RTX6000-12Q")
    snapshot = b.snapshot()
    plan = optimizer.optimize(snapshot, [Change(vm_a, profile("RTX6000-12Q").id, 1, "resize-request:1")])

    data = json.loads(json.dumps(plan.to_json()))

    assert (data["gpus_before"], data["gpus_after"], data["lower_bound"]) == (2, 1, 1)
    assert data["moves"][0]["from_gpu_ids"] == list(plan.moves[0].from_gpu_ids)
    assert data["assignments"][0] == {"vm_id": plan.assignments[0].vm_id, "gpu_id": plan.assignments[0].gpu_id,
                                      "profile_id": plan.assignments[0].profile_id,
                                      "placement_id": plan.assignments[0].placement_id}
    assert data["changes"] == [{"vm_id": vm_a, "profile_id": profile("RTX6000-12Q").id, "vgpus": 1,
                                "source": "resize-request:1"}]


def test_progress_goes_forward_and_ends_done():
    b = FleetBuilder()
    host = b.host()
    for _ in range(3):
        b.place(b.vm(), b.gpu(host), "RTX6000-6Q")
    calls = []

    optimizer.optimize(b.snapshot(), progress=lambda fraction, stage: calls.append((fraction, stage)))

    fractions = [f for f, _ in calls]
    assert fractions == sorted(fractions)
    assert calls[0] == (0.0, "applying changes")
    assert calls[-1] == (1.0, "done")
    assert {"consolidating", "assembling the plan"} <= {stage for _, stage in calls}


def test_a_tiny_time_limit_still_gives_a_valid_plan():
    b = FleetBuilder()
    host = b.host(cpu_threads=256, ram_gib=4096)
    for _ in range(8):
        b.place(b.vm(), b.gpu(host), "RTX6000-4Q")
    snapshot = b.snapshot()

    plan = optimizer.optimize(snapshot, time_limit_s=0.0)

    assert optimizer.verify(snapshot, plan) == []
    assert plan.gpus_after <= plan.gpus_before


def test_the_same_fleet_gets_the_same_plan():
    b = FleetBuilder()
    host = b.host(cpu_threads=256, ram_gib=4096)
    for name in ("RTX6000-4Q", "RTX6000-4Q", "RTX6000-6Q", "RTX6000-12Q", "RTX6000-6Q", "RTX6000-4Q"):
        b.place(b.vm(), b.gpu(host), name)
    snapshot = b.snapshot()

    first, second = optimizer.optimize(snapshot), optimizer.optimize(snapshot)

    assert (first.assignments, first.moves) == (second.assignments, second.moves)


class TestVerifyCatchesBrokenPlans:
    @pytest.fixture
    def fleet(self):
        b = FleetBuilder()
        host = b.host()
        gpu_a, gpu_b = b.gpu(host), b.gpu(host)
        vm_a, vm_b = b.vm(), b.vm()
        b.place(vm_a, gpu_a, "RTX6000-12Q")
        b.place(vm_b, gpu_b, "RTX6000-12Q")
        snapshot = b.snapshot()
        return snapshot, optimizer.optimize(snapshot), gpu_a, gpu_b, vm_a, vm_b

    def test_a_vgpu_on_a_full_gpu(self, fleet):
        snapshot, plan, gpu_a, gpu_b, vm_a, vm_b = fleet
        extra = optimizer.Assignment(vm_a, plan.assignments[0].gpu_id, profile("RTX6000-12Q").id, 2)
        broken = optimizer.Plan(**{**plan.__dict__, "assignments": plan.assignments + (extra,)})

        rules = {v.rule for v in optimizer.verify(snapshot, broken)}

        assert Rule.MAX_PER_GPU in rules
        assert PlanRule.KEPT in rules  # vm_a now holds two vGPUs nobody asked for

    def test_a_vm_dropped(self, fleet):
        snapshot, plan, *_ = fleet
        broken = optimizer.Plan(**{**plan.__dict__, "assignments": plan.assignments[:1]})

        violations = optimizer.verify(snapshot, broken)

        assert [v.rule for v in violations] == [PlanRule.KEPT]
        assert "without a change asking for it" in violations[0].message

    def test_moves_that_do_not_match_the_layout(self, fleet):
        snapshot, plan, *_ = fleet
        broken = optimizer.Plan(**{**plan.__dict__, "moves": ()})

        assert PlanRule.MOVES in {v.rule for v in optimizer.verify(snapshot, broken)}

    def test_a_moved_vgpu_at_another_slot_than_applying_gives(self, fleet):
        snapshot, plan, *_ = fleet
        last = plan.assignments[-1]
        shifted = optimizer.Assignment(last.vm_id, last.gpu_id, last.profile_id, 1 - last.placement_id)
        broken = optimizer.Plan(**{**plan.__dict__, "assignments": plan.assignments[:-1] + (shifted,)})

        assert Rule.PLACEMENT_SLOT in {v.rule for v in optimizer.verify(snapshot, broken)}

    def test_a_change_not_made(self, fleet):
        snapshot, plan, gpu_a, gpu_b, vm_a, vm_b = fleet
        asked = Change(vm_a, profile("RTX6000-24Q").id, 1, "resize-request:1")
        broken = optimizer.Plan(**{**plan.__dict__, "changes": (asked,)})

        assert PlanRule.CHANGE in {v.rule for v in optimizer.verify(snapshot, broken)}

    def test_an_unknown_gpu(self, fleet):
        snapshot, plan, *_ = fleet
        stray = optimizer.Assignment(plan.assignments[0].vm_id, 424242, plan.assignments[0].profile_id, 0)
        broken = optimizer.Plan(**{**plan.__dict__, "assignments": (stray,) + plan.assignments[1:]})

        assert PlanRule.UNKNOWN in {v.rule for v in optimizer.verify(snapshot, broken)}

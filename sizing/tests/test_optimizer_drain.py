"""Draining GPUs with the placement optimizer: every VM off the drained GPU, nothing onto it, no
other VM moved, every placement rule kept, and a VM that finds no room named with the reason.
Small fleets checked by hand, then random fleets. No database."""

from dataclasses import replace

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sizing import optimizer
from sizing.optimizer import Change, PlanRule
from sizing.tests.fleets import FleetBuilder, apply_plan, layout_of, plan_layout, profile, random_fleet


def drain_and_verify(snapshot, drained, changes=()):
    plan = optimizer.optimize(snapshot, changes, drained=drained)
    assert optimizer.verify(snapshot, plan) == []
    assert layout_of(apply_plan(snapshot, plan).gpus.values()) == plan_layout(plan)
    return plan


def gpus_of(plan, vm_id) -> list[int]:
    return sorted(a.gpu_id for a in plan.assignments if a.vm_id == vm_id)


def test_the_drained_gpu_is_emptied_and_no_other_vm_moves():
    """Two half-full GPUs beside the failing full one: its two VMs take their free slots. The
    optimizer alone would put the half-full GPUs' VMs together; a drain leaves them be."""
    b = FleetBuilder()
    host = b.host()
    failing, half_a, half_b = b.gpu(host), b.gpu(host), b.gpu(host)
    leaving = [b.vm(), b.vm()]
    for vm in leaving:
        b.place(vm, failing, "RTX6000-12Q")
    staying = [b.vm(), b.vm()]
    b.place(staying[0], half_a, "RTX6000-12Q")
    b.place(staying[1], half_b, "RTX6000-12Q")
    snapshot = b.snapshot()
    assert {m.vm_id for m in optimizer.optimize(snapshot).moves} & set(staying), "consolidation would move them"

    plan = drain_and_verify(snapshot, [failing])

    assert sorted(m.vm_id for m in plan.moves) == leaving
    assert {m.reason for m in plan.moves} == {optimizer.DRAIN}
    assert sorted(gpus_of(plan, vm)[0] for vm in leaving) == [half_a, half_b]
    assert gpus_of(plan, staying[0]) == [half_a]
    assert gpus_of(plan, staying[1]) == [half_b]
    assert all(a.gpu_id != failing for a in plan.assignments)
    assert (plan.freed_gpu_ids, plan.newly_used_gpu_ids, plan.unplaced) == ((failing,), (), ())
    assert plan.drained == (failing,)
    assert plan.strategy == optimizer.DRAIN
    assert plan.to_json()["drained"] == [failing]


def test_a_drained_vm_goes_to_a_gpu_of_its_size_or_an_empty_one():
    """Equal-size GPUs hold one size: the 6Q skips the GPU of 12Qs with a free slot."""
    b = FleetBuilder()
    host = b.host()
    failing, twelves, empty = b.gpu(host), b.gpu(host), b.gpu(host)
    small = b.vm()
    b.place(small, failing, "RTX6000-6Q")
    b.place(b.vm(), twelves, "RTX6000-12Q")
    snapshot = b.snapshot()

    plan = drain_and_verify(snapshot, [failing])

    assert gpus_of(plan, small) == [empty]
    assert plan.newly_used_gpu_ids == (empty,)


def test_a_multi_vgpu_vm_keeps_its_other_vgpu_and_its_host():
    """Turing: several vGPUs per VM only of the full 24Q, on one host; the vGPU on the drained
    GPU goes to the host's spare GPU, the other stays put (the other host is left alone)."""
    b = FleetBuilder()
    host, other_host = b.host(), b.host()
    failing, kept, spare = b.gpu(host), b.gpu(host), b.gpu(host)
    lighting = b.vm(vcpus=16, ram_gib=64)
    b.place(lighting, failing, "RTX6000-24Q")
    b.place(lighting, kept, "RTX6000-24Q")
    b.gpu(other_host)
    snapshot = b.snapshot()

    plan = drain_and_verify(snapshot, [failing])

    (move,) = plan.moves
    assert (move.vm_id, move.from_host_id, move.to_host_id) == (lighting, host, host)
    assert gpus_of(plan, lighting) == sorted([kept, spare])


def test_a_vm_crosses_to_another_host_only_where_its_vcpus_and_ram_fit():
    b = FleetBuilder()
    home = b.host(cpu_threads=16, ram_gib=128)
    crowded = b.host(cpu_threads=8, ram_gib=128)
    roomy = b.host(cpu_threads=32, ram_gib=128)
    failing = b.gpu(home)
    vm = b.vm(vcpus=12, ram_gib=32)
    b.place(vm, failing, "RTX6000-12Q")
    b.gpu(crowded)
    target = b.gpu(roomy)
    snapshot = b.snapshot()

    plan = drain_and_verify(snapshot, [failing])

    (move,) = plan.moves
    assert (move.from_host_id, move.to_host_id, move.to_gpu_ids) == (home, roomy, (target,))


def test_a_vm_with_no_room_elsewhere_stays_and_the_plan_says_why():
    """The only other GPU holds 12Qs and is full for a 24Q: the 24Q cannot leave. The 12Q next
    to it on the drained GPU can (the other GPU has a slot), and does."""
    b = FleetBuilder()
    host = b.host()
    failing, other = b.gpu(host, "NVIDIA L40S"), b.gpu(host, "NVIDIA L40S")
    big = b.vm()
    b.place(big, failing, "L40S-24Q")
    b.place(b.vm(), other, "L40S-12Q")
    snapshot = b.snapshot()

    plan = drain_and_verify(snapshot, [failing])

    assert plan.moves == ()
    ((vm_id, reason),) = plan.unplaced
    assert vm_id == big
    assert reason.startswith("it cannot leave the drained GPU: no host has room for 1 x L40S-24Q for VM")
    assert "equal-size mode and holds 12288 MiB vGPUs" in reason
    assert gpus_of(plan, big) == [failing]
    assert plan.freed_gpu_ids == ()


def test_a_gpu_model_with_no_other_gpu_is_named_as_the_reason():
    b = FleetBuilder()
    host = b.host()
    failing = b.gpu(host, "NVIDIA A16")
    b.gpu(host)  # a Quadro RTX 6000: another model
    vm = b.vm()
    b.place(vm, failing, "A16-4Q")
    snapshot = b.snapshot()

    plan = drain_and_verify(snapshot, [failing])

    assert plan.unplaced == ((vm, f"it cannot leave the drained GPU: no other NVIDIA A16 GPU in vGPU mode can take "
                                  f"1 x A16-4Q for VM vm-{vm}"),)


def test_a_change_is_made_off_the_drained_gpu():
    """A pending downsize of a VM on the drained GPU lands elsewhere, never back on it."""
    b = FleetBuilder()
    host = b.host()
    failing, other = b.gpu(host), b.gpu(host)
    vm = b.vm()
    b.place(vm, failing, "RTX6000-24Q")
    b.place(b.vm(), other, "RTX6000-12Q")
    snapshot = b.snapshot()
    change = Change(vm, profile("RTX6000-12Q").id, 1, "resize-request:4")

    plan = drain_and_verify(snapshot, [failing], [change])

    (move,) = plan.moves
    assert (move.reason, move.to_gpu_ids, move.to_profile_id) == ("resize-request:4", (other,),
                                                                   profile("RTX6000-12Q").id)


def test_verify_refuses_a_vgpu_placed_on_a_drained_gpu():
    b = FleetBuilder()
    host = b.host()
    gpu_a, gpu_b = b.gpu(host), b.gpu(host)
    b.place(b.vm(), gpu_a, "RTX6000-12Q")
    b.place(b.vm(), gpu_b, "RTX6000-12Q")
    snapshot = b.snapshot()
    consolidation = optimizer.optimize(snapshot)
    (kept,) = set(snapshot.gpus) - set(consolidation.freed_gpu_ids)
    (move,) = consolidation.moves

    violations = optimizer.verify(snapshot, replace(consolidation, drained=(kept,)))

    # The VM moved onto it, and the VM staying on it without being listed unplaced.
    assert [v.rule for v in violations] == [PlanRule.DRAINED, PlanRule.DRAINED]
    assert any(f"VM vm-{move.vm_id}'s RTX6000-12Q on GPU gpu-{kept}, which it drains" in v.message
               for v in violations)
    assert any("the plan does not say why" in v.message for v in violations)


def test_verify_refuses_a_vm_left_on_a_drained_gpu_without_a_reason():
    b = FleetBuilder()
    host = b.host()
    failing, other = b.gpu(host, "NVIDIA L40S"), b.gpu(host, "NVIDIA L40S")
    b.place(b.vm(), failing, "L40S-24Q")
    b.place(b.vm(), other, "L40S-12Q")
    snapshot = b.snapshot()
    plan = drain_and_verify(snapshot, [failing])

    violations = optimizer.verify(snapshot, replace(plan, unplaced=()))

    assert [v.rule for v in violations] == [PlanRule.DRAINED]
    assert f"stays on GPU gpu-{failing}, which the plan drains, and the plan does not say why" in \
        violations[0].message


fleets = st.randoms(use_true_random=False).map(lambda rng: (random_fleet(rng), rng.random()))


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(fleets)
def test_every_drain_empties_the_gpu_or_names_what_stays_and_moves_nothing_else(fleet):
    (snapshot, _), pick = fleet
    used = sorted(g.id for g in snapshot.gpus.values() if g.vgpus)
    if not used:
        return
    drained = used[int(pick * len(used))]
    on_it = {v.vm_id for v in snapshot.gpus[drained].vgpus}

    plan = drain_and_verify(snapshot, [drained])

    stays = {a.vm_id for a in plan.assignments if a.gpu_id == drained}
    assert stays == {vm_id for vm_id, _ in plan.unplaced}
    assert {m.vm_id for m in plan.moves} | stays == on_it
    assert plan.gpus_after <= plan.gpus_before + len(on_it)

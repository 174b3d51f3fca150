"""What one resize does to the fleet, on small fleets built by hand, without a database.

Each fleet is built through fleet.placement (so it is one NVIDIA would run) and the expected
answer is the one an admin would work out on a whiteboard: "the 12Q beside another 12Q cannot
become a 24Q where it is; GPU 3 is empty, so it moves there and takes one more GPU".
"""

from __future__ import annotations

import dataclasses

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fleet.fit import MOVE, NOWHERE, SAME_GPU, ImpactCalculator, resize_impact
from fleet.placement import GpuState, HostState, PlacedVgpu, Rule, VmState, VmVgpu, check_placement
from fleet.snapshot import FleetSnapshot
from fleet.tests.test_placement import all_profile_names, model_spec, profile_spec


class Fleet:
    """A small fleet built the way the services build one: every vGPU through check_placement."""

    def __init__(self):
        self.hosts: dict[int, HostState] = {}
        self.gpus: dict[int, GpuState] = {}
        self.vms: dict[int, VmState] = {}

    def host(self, host_id: int, name: str, *, cpu_threads: int = 64, ram_gib: int = 512,
             same_gpu: bool = False) -> Fleet:
        self.hosts[host_id] = HostState(id=host_id, name=name, cpu_threads=cpu_threads, ram_gib=ram_gib,
                                        multi_vgpu_same_gpu=same_gpu)
        return self

    def gpu(self, gpu_id: int, host_id: int, code: str = "RTX6000", *, size_mode: str = "equal") -> Fleet:
        self.gpus[gpu_id] = GpuState(id=gpu_id, label=f"gpu{gpu_id}", host_id=host_id, model=model_spec(code),
                                     size_mode=size_mode)
        return self

    def place(self, vm_id: int, gpu_id: int, profile_name: str, *, vcpus: int = 8, ram_gib: int = 32) -> Fleet:
        vm = self.vms.setdefault(vm_id, VmState(id=vm_id, name=f"ws-{vm_id}", vcpus=vcpus, ram_gib=ram_gib))
        gpu, profile = self.gpus[gpu_id], profile_spec(profile_name)
        host = self.hosts[gpu.host_id]
        decision = check_placement(gpu, profile, vm, host)
        assert decision.ok, decision.violations
        placed = PlacedVgpu(profile, vm_id, decision.placement_id)
        self.gpus[gpu_id] = dataclasses.replace(gpu, vgpus=(*gpu.vgpus, placed))
        if vm.host_id != host.id:  # the VM's first vGPU: it now runs on this host and claims its share
            self.hosts[host.id] = dataclasses.replace(
                host, allocated_vcpus=host.allocated_vcpus + vm.vcpus,
                allocated_ram_gib=host.allocated_ram_gib + vm.ram_gib,
            )
        self.vms[vm_id] = dataclasses.replace(vm, host_id=host.id, vgpus=(*vm.vgpus, VmVgpu(profile, gpu_id, host.id)))
        return self

    def snapshot(self) -> FleetSnapshot:
        names = {n for code in ("RTX6000", "L40S") for n in all_profile_names(code)}
        profiles = {p.id: p for p in map(profile_spec, names)}
        return FleetSnapshot(hosts=dict(self.hosts), gpus=dict(self.gpus), vms=dict(self.vms), profiles=profiles)


def impact(fleet: Fleet, vm_id: int, profile_name: str, vgpus: int | None = None):
    return resize_impact(fleet.snapshot(), vm_id, profile_spec(profile_name), vgpus)


def test_a_lone_12q_grows_to_a_24q_in_place():
    fleet = Fleet().host(1, "a").gpu(1, 1).gpu(2, 1).place(10, 1, "RTX6000-12Q")
    result = impact(fleet, 10, "RTX6000-24Q")
    assert (result.fits, result.gpu_ids, result.host_id, result.gpus_delta) == (SAME_GPU, (1,), 1, 0)
    assert result.detail == "Fits on its GPU gpu1"
    assert result.violations == ()
    assert result.fits_in_place


def test_a_12q_beside_another_12q_moves_to_an_empty_gpu_for_a_24q():
    # GPU 2 holds a 24Q (a full GPU, no slot); GPU 3 is empty.
    fleet = (Fleet().host(1, "a").gpu(1, 1).gpu(2, 1).gpu(3, 1)
             .place(10, 1, "RTX6000-12Q").place(11, 1, "RTX6000-12Q").place(12, 2, "RTX6000-24Q"))
    result = impact(fleet, 10, "RTX6000-24Q")
    assert (result.fits, result.gpu_ids, result.gpus_delta) == (MOVE, (3,), 1)
    assert not result.fits_in_place
    assert result.violations == (
        "RTX6000-24Q needs 24576 MiB; GPU gpu1 has 12288 MiB free of 24576 MiB",
        "GPU gpu1 is in equal-size mode and holds 12288 MiB vGPUs; RTX6000-24Q has 24576 MiB",
    )
    assert result.detail == "Needs a move to GPU gpu3 (empty) on host a; takes 1 more GPU"


def test_a_24q_shrinking_to_12q_joins_another_12q_of_its_host_and_frees_its_gpu():
    fleet = (Fleet().host(1, "a").gpu(1, 1).gpu(2, 1)
             .place(10, 1, "RTX6000-24Q").place(11, 2, "RTX6000-12Q"))
    result = impact(fleet, 10, "RTX6000-12Q")
    assert (result.fits, result.gpu_ids, result.host_id, result.gpus_delta) == (MOVE, (2,), 1, -1)
    assert result.fits_in_place  # it would fit where it is, but that frees nothing
    assert result.detail == ("Fits on its GPU gpu1, but a move to GPU gpu2 (holds RTX6000-12Q vGPUs with a free "
                             "slot) on host a frees 1 GPU")


def test_a_vm_that_fits_on_its_host_is_not_moved_to_another_host_to_free_a_gpu():
    # Joining the 12Q on host b would free GPU 1, but that is a migration to another host: the
    # VM stays where it fits, and the admin is told what the move would free.
    fleet = (Fleet().host(1, "a").host(2, "b").gpu(1, 1).gpu(2, 2)
             .place(10, 1, "RTX6000-24Q").place(11, 2, "RTX6000-12Q"))
    result = impact(fleet, 10, "RTX6000-12Q")
    assert (result.fits, result.gpu_ids, result.host_id, result.gpus_delta) == (SAME_GPU, (1,), 1, 0)
    assert result.frees_by_moving == 1
    assert result.detail == ("Fits on its GPU gpu1; a move to another host would free 1 more GPU (the optimizer "
                             "can plan it)")


def test_a_move_goes_to_the_fullest_gpu_in_use():
    # An 8Q alone on GPU 1 shrinking to 4Q: GPU 2 holds three 4Q, GPU 3 one; both have slots.
    fleet = (Fleet().host(1, "a").gpu(1, 1).gpu(2, 1).gpu(3, 1).place(10, 1, "RTX6000-8Q")
             .place(11, 2, "RTX6000-4Q").place(12, 2, "RTX6000-4Q").place(13, 2, "RTX6000-4Q")
             .place(14, 3, "RTX6000-4Q"))
    result = impact(fleet, 10, "RTX6000-4Q")
    assert (result.fits, result.gpu_ids, result.gpus_delta) == (MOVE, (2,), -1)


def test_a_move_stays_on_its_host_before_another_host_as_good():
    # GPU 1 holds the VM's 12Q and another 12Q: a 24Q does not fit in place. GPU 2 of its own
    # host and GPU 3 of host c are both empty: the move stays on its host (no migration).
    fleet = (Fleet().host(1, "a").host(3, "c").gpu(1, 1).gpu(2, 1).gpu(3, 3)
             .place(10, 1, "RTX6000-12Q").place(11, 1, "RTX6000-12Q"))
    result = impact(fleet, 10, "RTX6000-24Q")
    assert (result.fits, result.gpu_ids, result.host_id) == (MOVE, (2,), 1)


def test_no_room_anywhere_says_so_and_why_not_in_place():
    fleet = (Fleet().host(1, "a").gpu(1, 1).gpu(2, 1)
             .place(10, 1, "RTX6000-12Q").place(11, 1, "RTX6000-12Q").place(12, 2, "RTX6000-24Q"))
    result = impact(fleet, 10, "RTX6000-24Q")
    assert (result.fits, result.gpu_ids, result.host_id, result.gpus_delta) == (NOWHERE, (), None, 0)
    assert result.detail == "No host has room for 1 x RTX6000-24Q"
    assert any("equal-size mode" in v for v in result.violations)
    assert result.refusals == ("On a: RTX6000-24Q needs 24576 MiB; GPU gpu1 has 12288 MiB free of 24576 MiB; GPU gpu1 "
                               "is in equal-size mode and holds 12288 MiB vGPUs; RTX6000-24Q has 24576 MiB.",)


def test_a_host_without_vcpus_left_is_passed_over_for_one_with_room():
    # Host b (id 2, tried before host c) has an empty GPU but no vCPUs left for a 16-vCPU VM.
    fleet = (Fleet().host(1, "a").host(2, "b", cpu_threads=16).host(3, "c")
             .gpu(1, 1).gpu(2, 2).gpu(3, 2).gpu(4, 3)
             .place(10, 1, "RTX6000-12Q", vcpus=16).place(11, 1, "RTX6000-12Q").place(20, 2, "RTX6000-24Q", vcpus=8))
    snapshot = fleet.snapshot()
    leaving = dataclasses.replace(snapshot.vms[10], vgpus=())
    refusal = check_placement(snapshot.gpus[3], profile_spec("RTX6000-24Q"), leaving, snapshot.hosts[2])
    assert [v.rule for v in refusal.violations] == [Rule.HOST_VCPU]
    result = resize_impact(snapshot, 10, profile_spec("RTX6000-24Q"))
    assert (result.fits, result.gpu_ids, result.host_id) == (MOVE, (4,), 3)
    assert result.detail == "Needs a move to GPU gpu4 (empty) on host c; takes 1 more GPU"


def test_a_multi_vgpu_vm_grows_by_one_whole_gpu_beside_its_own():
    fleet = (Fleet().host(1, "a").gpu(1, 1).gpu(2, 1).gpu(3, 1).gpu(4, 1)
             .place(10, 1, "RTX6000-24Q").place(10, 2, "RTX6000-24Q"))
    result = impact(fleet, 10, "RTX6000-24Q", vgpus=3)
    assert (result.fits, result.gpu_ids, result.gpus_delta) == (SAME_GPU, (1, 2, 3), 1)
    assert result.detail == "Fits on its GPUs gpu1 and gpu2, the added vGPU on GPU gpu3 of the same host; " \
                            "takes 1 more GPU"


def test_a_vm_that_would_grow_past_its_hosts_gpus_is_told_why():
    # Host a's other GPU holds another VM's 24Q; host b has two empty GPUs, and one VM's vGPUs
    # share a host, so the whole VM moves there.
    fleet = (Fleet().host(1, "a").host(2, "b").gpu(1, 1).gpu(2, 1).gpu(3, 2).gpu(4, 2)
             .place(10, 1, "RTX6000-24Q").place(11, 2, "RTX6000-24Q"))
    result = impact(fleet, 10, "RTX6000-24Q", vgpus=2)
    assert (result.fits, result.gpu_ids, result.host_id, result.gpus_delta) == (MOVE, (3, 4), 2, 1)
    assert result.violations == ("Host a has no other GPU with room for 1 more RTX6000-24Q",)
    crowded = fleet.place(12, 3, "RTX6000-24Q")
    result = impact(crowded, 10, "RTX6000-24Q", vgpus=2)
    assert result.fits == NOWHERE
    assert result.violations == ("Host a has no other GPU with room for 1 more RTX6000-24Q",)


def test_a_multi_vgpu_vm_dropping_a_vgpu_frees_a_gpu():
    fleet = (Fleet().host(1, "a").gpu(1, 1).gpu(2, 1)
             .place(10, 1, "RTX6000-24Q").place(10, 2, "RTX6000-24Q"))
    result = impact(fleet, 10, "RTX6000-24Q", vgpus=1)
    assert (result.fits, result.gpu_ids, result.gpus_delta) == (SAME_GPU, (1,), -1)


def test_a_quadro_multi_vgpu_vm_cannot_take_partial_profiles_anywhere():
    fleet = (Fleet().host(1, "a").gpu(1, 1).gpu(2, 1).gpu(3, 1)
             .place(10, 1, "RTX6000-24Q").place(10, 2, "RTX6000-24Q"))
    result = impact(fleet, 10, "RTX6000-12Q")
    assert result.fits == NOWHERE
    assert result.detail == "No host has room for 2 x RTX6000-12Q"
    assert any("may only use full-GPU profiles" in v for v in result.violations)


def test_a_mixed_size_gpu_takes_a_different_size_in_place_where_equal_size_cannot():
    # L40S in mixed-size mode: a 24Q at placement 0, an 8Q beside it can become a 16Q in place.
    mixed = Fleet().host(1, "a").gpu(1, 1, "L40S", size_mode="mixed").gpu(2, 1, "L40S")
    mixed.place(11, 1, "L40S-24Q").place(10, 1, "L40S-8Q")
    assert impact(mixed, 10, "L40S-16Q").fits == SAME_GPU
    equal = Fleet().host(1, "a").gpu(1, 1, "L40S").gpu(2, 1, "L40S")
    equal.place(11, 1, "L40S-8Q").place(10, 1, "L40S-8Q")
    result = impact(equal, 10, "L40S-16Q")
    assert (result.fits, result.gpu_ids, result.gpus_delta) == (MOVE, (2,), 1)


def test_the_calculator_answers_many_vms_like_single_calls():
    fleet = (Fleet().host(1, "a").host(2, "b").gpu(1, 1).gpu(2, 1).gpu(3, 2)
             .place(10, 1, "RTX6000-12Q").place(11, 1, "RTX6000-12Q").place(12, 3, "RTX6000-24Q"))
    snapshot = fleet.snapshot()
    calculator = ImpactCalculator(snapshot)
    for vm_id in (10, 11, 12):
        for name in ("RTX6000-6Q", "RTX6000-12Q", "RTX6000-24Q"):
            assert calculator.impact(vm_id, profile_spec(name)) == resize_impact(snapshot, vm_id, profile_spec(name))


# Several vGPUs of one VM: a GPU of its own for each, unless the host allows sharing ----------


def _l40s_host(gpus: int, *, same_gpu: bool = False) -> Fleet:
    fleet = Fleet().host(1, "a", same_gpu=same_gpu)
    for gpu_id in range(1, gpus + 1):
        fleet.gpu(gpu_id, 1, "L40S")
    return fleet.place(10, 1, "L40S-12Q")


def test_two_and_four_vgpus_each_take_a_gpu_of_their_own():
    assert impact(_l40s_host(2), 10, "L40S-12Q", vgpus=2).gpu_ids == (1, 2)
    result = impact(_l40s_host(4), 10, "L40S-12Q", vgpus=4)
    assert (result.fits, result.gpu_ids, result.gpus_delta) == (SAME_GPU, (1, 2, 3, 4), 3)


def test_a_host_without_enough_distinct_gpus_refuses_and_says_why():
    result = impact(_l40s_host(1), 10, "L40S-12Q", vgpus=2)
    assert result.fits == NOWHERE
    assert result.refusals == ("On a: 2 x L40S-12Q needs 2 GPUs with room, one for each vGPU of the VM; "
                               "1 has room.",)
    result = impact(_l40s_host(3), 10, "L40S-12Q", vgpus=4)
    assert result.fits == NOWHERE
    assert result.refusals == ("On a: 4 x L40S-12Q needs 4 GPUs with room, one for each vGPU of the VM; "
                               "3 have room.",)


def test_a_host_that_allows_sharing_stacks_only_what_distinct_gpus_cannot_take():
    assert impact(_l40s_host(1, same_gpu=True), 10, "L40S-12Q", vgpus=2).gpu_ids == (1, 1)
    assert impact(_l40s_host(3, same_gpu=True), 10, "L40S-12Q", vgpus=4).gpu_ids == (1, 2, 3, 1)
    assert impact(_l40s_host(4, same_gpu=True), 10, "L40S-12Q", vgpus=4).gpu_ids == (1, 2, 3, 4)


# Property: every plan it reports is one fleet.placement accepts ----------------------------

PROFILE_NAMES = ("RTX6000-4Q", "RTX6000-6Q", "RTX6000-8Q", "RTX6000-12Q", "RTX6000-24Q",
                 "L40S-4Q", "L40S-8Q", "L40S-12Q", "L40S-16Q", "L40S-24Q", "L40S-48Q")


@st.composite
def fleets(draw):
    """Two or three hosts of random capacity, up to six GPUs of two models (some mixed-size), and
    VMs placed at random wherever fleet.placement accepts them."""
    fleet = Fleet()
    for host_id in range(1, draw(st.integers(2, 3)) + 1):
        fleet.host(host_id, f"h{host_id}", cpu_threads=draw(st.sampled_from([16, 32, 96])),
                   ram_gib=draw(st.sampled_from([64, 128, 512])), same_gpu=draw(st.booleans()))
    for gpu_id in range(1, draw(st.integers(2, 6)) + 1):
        code = draw(st.sampled_from(["RTX6000", "L40S"]))
        size_mode = draw(st.sampled_from(["equal", "mixed"])) if code == "L40S" else "equal"
        fleet.gpu(gpu_id, draw(st.sampled_from(sorted(fleet.hosts))), code, size_mode=size_mode)
    for _ in range(draw(st.integers(1, 12))):
        vm_id = draw(st.integers(1, 6))
        gpu = fleet.gpus[draw(st.sampled_from(sorted(fleet.gpus)))]
        name = draw(st.sampled_from([n for n in PROFILE_NAMES if profile_spec(n).gpu_model == gpu.model.name]))
        vm = fleet.vms.get(vm_id) or VmState(id=vm_id, name=f"ws-{vm_id}", vcpus=draw(st.sampled_from([4, 8, 16])),
                                             ram_gib=draw(st.sampled_from([16, 32, 64])))
        fleet.vms[vm_id] = vm
        if check_placement(gpu, profile_spec(name), vm, fleet.hosts[gpu.host_id]).ok:
            fleet.place(vm_id, gpu.id, name)
    return fleet


def replay(snapshot: FleetSnapshot, vm_id: int, profile, gpu_ids) -> dict[int, GpuState]:
    """Remove the VM's vGPUs and place the new ones where the impact says, asking check_placement
    each time as the services would; returns the GPUs afterwards."""
    gpus = {g: dataclasses.replace(s, vgpus=tuple(v for v in s.vgpus if v.vm_id != vm_id))
            for g, s in snapshot.gpus.items()}
    vm = dataclasses.replace(snapshot.vms[vm_id], vgpus=())
    for gpu_id in gpu_ids:
        gpu = gpus[gpu_id]
        decision = check_placement(gpu, profile, vm, snapshot.hosts[gpu.host_id])
        assert decision.ok, decision.violations
        gpus[gpu_id] = dataclasses.replace(gpu, vgpus=(*gpu.vgpus, PlacedVgpu(profile, vm_id, decision.placement_id)))
        vm = dataclasses.replace(vm, vgpus=(*vm.vgpus, VmVgpu(profile, gpu_id, gpu.host_id)))
    return gpus


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(fleet=fleets(), data=st.data())
def test_every_reported_plan_passes_placement_and_counts_gpus_right(fleet, data):
    snapshot = fleet.snapshot()
    with_vgpus = sorted(vm_id for vm_id, vm in snapshot.vms.items() if vm.vgpus)
    if not with_vgpus:
        return
    vm_id = data.draw(st.sampled_from(with_vgpus))
    profile = profile_spec(data.draw(st.sampled_from(PROFILE_NAMES)))
    vgpus = data.draw(st.sampled_from([None, 1, 2, 3]))
    result = resize_impact(snapshot, vm_id, profile, vgpus)
    count = vgpus or len(snapshot.vms[vm_id].vgpus)

    if result.fits == NOWHERE:
        assert result.gpu_ids == ()
        assert result.gpus_delta == 0
        if count == 1:  # one vGPU: no single GPU of the fleet may accept it
            emptied = replay(snapshot, vm_id, profile, ())
            vm = dataclasses.replace(snapshot.vms[vm_id], vgpus=())
            assert not any(check_placement(g, profile, vm, snapshot.hosts[g.host_id]).ok for g in emptied.values())
        return

    assert len(result.gpu_ids) == count
    if not snapshot.hosts[result.host_id].multi_vgpu_same_gpu:
        assert len(set(result.gpu_ids)) == count  # each vGPU of the VM on a GPU of its own
    assert {snapshot.gpus[g].host_id for g in result.gpu_ids} == {result.host_id}
    after = replay(snapshot, vm_id, profile, result.gpu_ids)
    assert result.gpus_delta == sum(1 for g in after.values() if g.vgpus) - snapshot.gpus_in_use()
    own = list(dict.fromkeys(v.gpu_id for v in snapshot.vms[vm_id].vgpus))
    home = snapshot.gpus[own[0]].host_id
    if result.fits == SAME_GPU:
        assert list(result.gpu_ids[:len(own)]) == own[:count]
    if count == 1:
        # One vGPU, searched exhaustively: on its own host when a GPU there takes it (the fewest
        # GPUs in use, its own GPU on a tie), else on the host whose GPU adds the fewest.
        emptied = replay(snapshot, vm_id, profile, ())
        vm = dataclasses.replace(snapshot.vms[vm_id], vgpus=())
        takers = [gpu for gpu in emptied.values() if check_placement(gpu, profile, vm, snapshot.hosts[gpu.host_id]).ok]

        def in_use_after(gpu) -> int:
            return sum(1 for g in replay(snapshot, vm_id, profile, (gpu.id,)).values() if g.vgpus)

        mine = [gpu for gpu in takers if gpu.host_id == home]
        best = min(in_use_after(gpu) for gpu in (mine or takers))
        assert result.gpus_delta == best - snapshot.gpus_in_use()
        if mine:
            assert result.host_id == home
            if any(gpu.id == own[0] and in_use_after(gpu) == best for gpu in mine):
                assert result.fits == SAME_GPU

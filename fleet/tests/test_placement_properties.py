"""Random sequences of placements and removals never break the fleet's invariants.

A hypothesis state machine plays an admin who places and removes vGPUs and switches size
modes on a small fleet, applying only what fleet.placement accepts, the way fleet.services
does. After every step the fleet must still be one NVIDIA would run: if a rule let a
placement through that it should have refused, an invariant below breaks and hypothesis
shrinks the sequence to the few steps that show it.
"""

from __future__ import annotations

import dataclasses
from collections import Counter, defaultdict

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from fleet import placement
from fleet.placement import (
    MAX_VGPUS_PER_VM,
    PLACEMENT_GRID,
    GpuState,
    HostState,
    PlacedVgpu,
    VmState,
    VmVgpu,
    check_gpu_change,
    check_placement,
    mixed_placement_ids,
    mixed_span_units,
)
from fleet.tests.test_placement import all_profile_names, gpu, profile_spec

# Host 1 is small on purpose, so that vCPU and RAM refusals happen often. Host 2 lets a VM's
# vGPUs share a GPU (Host.multi_vgpu_same_gpu); host 1 gives each a GPU of its own.
HOSTS = {
    1: HostState(id=1, name="h1", cpu_threads=16, ram_gib=96, vcpu_overcommit=1.5),
    2: HostState(id=2, name="h2", cpu_threads=24, ram_gib=128, ram_overcommit=1.25, multi_vgpu_same_gpu=True),
}
GPUS = (
    gpu("L40S", gpu_id=1, host_id=1, size_mode="mixed"),
    gpu("L40S", gpu_id=2, host_id=1),
    gpu("RTX6000", gpu_id=3, host_id=1),
    gpu("RTX6000", gpu_id=4, host_id=1),
    gpu("A16", gpu_id=5, host_id=2),
    gpu("A16", gpu_id=6, host_id=2, size_mode="mixed"),
    gpu("T4", gpu_id=7, host_id=2),
    gpu("RTX6000", gpu_id=8, host_id=2, mode="passthrough"),
    gpu("L40S", gpu_id=9, host_id=2),  # a board both hosts have: VMs could straddle them
)
VMS = {  # id: (vcpus, ram_gib)
    1: (4, 16), 2: (8, 32), 3: (8, 48), 4: (12, 24), 5: (4, 64), 6: (16, 16),
}
PROFILES = tuple(
    profile_spec(name) for code in ("L40S", "RTX6000", "A16", "T4") for name in all_profile_names(code)
)
KNOWN_RULES = {value for name, value in vars(placement.Rule).items() if name.isupper()}


@dataclasses.dataclass(frozen=True)
class Placed:
    gpu_id: int
    vm_id: int
    profile: placement.ProfileSpec
    placement_id: int


class FleetMachine(RuleBasedStateMachine):
    """The fleet as fleet.services keeps it: vGPU rows, and each VM on the host of its vGPUs."""

    def __init__(self):
        super().__init__()
        self.gpus = {g.id: g for g in GPUS}
        self.placed: list[Placed] = []

    # The states fleet.services would load from the database.

    def gpu_state(self, gpu_id: int) -> GpuState:
        vgpus = tuple(PlacedVgpu(p.profile, p.vm_id, p.placement_id) for p in self.placed if p.gpu_id == gpu_id)
        return dataclasses.replace(self.gpus[gpu_id], vgpus=vgpus)

    def vm_host(self, vm_id: int) -> int | None:
        hosts = {self.gpus[p.gpu_id].host_id for p in self.placed if p.vm_id == vm_id}
        return next(iter(hosts)) if hosts else None

    def vm_state(self, vm_id: int) -> VmState:
        vcpus, ram_gib = VMS[vm_id]
        vgpus = tuple(
            VmVgpu(p.profile, p.gpu_id, self.gpus[p.gpu_id].host_id) for p in self.placed if p.vm_id == vm_id
        )
        return VmState(id=vm_id, name=f"ws-{vm_id}", vcpus=vcpus, ram_gib=ram_gib,
                       host_id=self.vm_host(vm_id), vgpus=vgpus)

    def host_state(self, host_id: int, exclude_vm_id: int | None = None) -> HostState:
        on_host = [vm_id for vm_id in VMS if vm_id != exclude_vm_id and self.vm_host(vm_id) == host_id]
        return dataclasses.replace(
            HOSTS[host_id],
            allocated_vcpus=sum(VMS[v][0] for v in on_host), allocated_ram_gib=sum(VMS[v][1] for v in on_host),
        )

    # What the admin does.

    @rule(
        gpu_id=st.sampled_from([g.id for g in GPUS]),
        vm_id=st.sampled_from(sorted(VMS)),
        data=st.data(),
    )
    def place(self, gpu_id, vm_id, data):
        state = self.gpu_state(gpu_id)
        own_model = [p for p in PROFILES if p.gpu_model == state.model.name]
        # Mostly the GPU's own profiles, so that GPUs fill up; sometimes any, to exercise refusals.
        profile = data.draw(st.one_of(st.sampled_from(own_model), st.sampled_from(PROFILES)) if own_model
                            else st.sampled_from(PROFILES), label="profile")
        self.try_place(gpu_id, vm_id, profile)

    def try_place(self, gpu_id: int, vm_id: int, profile: placement.ProfileSpec) -> bool:
        """Ask the rules, as fleet.services.place_vgpu does, and keep the vGPU if they accept it."""
        state = self.gpu_state(gpu_id)
        decision = check_placement(
            state, profile, self.vm_state(vm_id), self.host_state(state.host_id, exclude_vm_id=vm_id),
        )
        if decision.ok:
            assert decision.placement_id is not None
            self.placed.append(Placed(gpu_id, vm_id, profile, decision.placement_id))
            return True
        assert decision.placement_id is None
        assert {v.rule for v in decision.violations} <= KNOWN_RULES
        assert all(v.message for v in decision.violations)
        return False

    @precondition(lambda self: self.placed)
    @rule(data=st.data())
    def remove(self, data):
        self.placed.remove(data.draw(st.sampled_from(self.placed), label="removed"))

    @rule(gpu_id=st.sampled_from([g.id for g in GPUS]), size_mode=st.sampled_from(["equal", "mixed"]))
    def switch_size_mode(self, gpu_id, size_mode):
        state = self.gpu_state(gpu_id)
        violations = check_gpu_change(state, state.mode, size_mode)
        if not violations:
            self.gpus[gpu_id] = dataclasses.replace(self.gpus[gpu_id], size_mode=size_mode)
        else:
            assert state.vgpus or not state.model.mixed_size_capable

    # What must hold after every step.

    @invariant()
    def frame_buffer_within_gpu(self):
        for gpu_id in self.gpus:
            state = self.gpu_state(gpu_id)
            assert state.used_fb_mib <= state.model.fb_mib, state

    @invariant()
    def passthrough_gpus_hold_nothing(self):
        for gpu_id, state in self.gpus.items():
            if state.mode == "passthrough":
                assert not self.gpu_state(gpu_id).vgpus

    @invariant()
    def profiles_belong_to_their_gpu_model(self):
        for p in self.placed:
            assert p.profile.gpu_model == self.gpus[p.gpu_id].model.name

    @invariant()
    def equal_size_gpus_hold_one_size(self):
        for gpu_id in self.gpus:
            state = self.gpu_state(gpu_id)
            if state.size_mode == "equal":
                assert len({v.profile.fb_mib for v in state.vgpus}) <= 1, state

    @invariant()
    def counts_within_max(self):
        for gpu_id in self.gpus:
            state = self.gpu_state(gpu_id)
            counts = Counter(v.profile for v in state.vgpus)
            for profile, count in counts.items():
                if state.size_mode == "mixed":
                    assert profile.max_per_gpu_mixed is not None
                    assert count <= profile.max_per_gpu_mixed, (profile.name, count)
                else:
                    # In equal-size mode every vGPU has this size: the type's max bounds them all.
                    assert len(state.vgpus) <= profile.max_per_gpu, (profile.name, len(state.vgpus))

    @invariant()
    def mixed_spans_aligned_and_disjoint(self):
        for gpu_id in self.gpus:
            state = self.gpu_state(gpu_id)
            if state.size_mode != "mixed":
                continue
            used = [0] * PLACEMENT_GRID
            for v in state.vgpus:
                span = mixed_span_units(v.profile)
                assert v.placement_id in mixed_placement_ids(v.profile), (v.profile.name, v.placement_id)
                assert v.placement_id % span == 0
                assert v.placement_id + span <= PLACEMENT_GRID
                for unit in range(v.placement_id, v.placement_id + span):
                    used[unit] += 1
            assert max(used) <= 1, state

    @invariant()
    def placement_ids_unique_per_gpu(self):
        for gpu_id in self.gpus:
            ids = [v.placement_id for v in self.gpu_state(gpu_id).vgpus]
            assert len(ids) == len(set(ids)), (gpu_id, ids)

    @invariant()
    def vm_multi_vgpu_rules(self):
        by_vm = defaultdict(list)
        for p in self.placed:
            by_vm[p.vm_id].append(p)
        for vm_id, held in by_vm.items():
            assert len(held) <= MAX_VGPUS_PER_VM
            assert len(held) <= min(p.profile.max_per_vm for p in held), vm_id
            assert len({self.gpus[p.gpu_id].host_id for p in held}) == 1, vm_id
            if not HOSTS[self.gpus[held[0].gpu_id].host_id].multi_vgpu_same_gpu:
                assert len({p.gpu_id for p in held}) == len(held), vm_id
            assert len({(p.profile.gpu_model, p.profile.series) for p in held}) == 1, vm_id
            model = self.gpus[held[0].gpu_id].model
            if len(held) > 1 and model.multi_vgpu_full_only:
                assert all(p.profile.fb_mib == model.fb_mib for p in held), vm_id

    @invariant()
    def hosts_within_capacity(self):
        for host_id in HOSTS:
            host = self.host_state(host_id)
            assert host.allocated_vcpus <= host.vcpu_capacity, host
            assert host.allocated_ram_gib <= host.ram_capacity_gib, host


FleetMachine.TestCase.settings = settings(
    max_examples=200, stateful_step_count=40, deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
TestFleetInvariants = FleetMachine.TestCase


INVARIANTS = (
    "frame_buffer_within_gpu", "passthrough_gpus_hold_nothing", "profiles_belong_to_their_gpu_model",
    "equal_size_gpus_hold_one_size", "counts_within_max", "mixed_spans_aligned_and_disjoint",
    "placement_ids_unique_per_gpu", "vm_multi_vgpu_rules", "hosts_within_capacity",
)


def test_machine_fills_the_fleet_within_the_invariants():
    """The machine really places vGPUs (the invariants are not checked on an empty fleet only)."""
    machine = FleetMachine()
    l40s_8q, rtx_24q = profile_spec("L40S-8Q"), profile_spec("RTX6000-24Q")
    # Host 1 gives each vGPU of a VM a GPU of its own; host 2 lets them share one, up to the
    # profile's four per VM.
    assert [machine.try_place(1, 1, l40s_8q) for _ in range(2)] == [True, False]
    assert [machine.try_place(9, 5, l40s_8q) for _ in range(5)] == [True, True, True, True, False]
    assert machine.try_place(3, 2, rtx_24q)
    assert machine.try_place(4, 2, rtx_24q)
    assert len(machine.placed) == 7
    for name in INVARIANTS:
        getattr(machine, name)()


@pytest.mark.parametrize(("bad", "caught_by"), [
    ([Placed(1, 1, profile_spec("L40S-24Q"), 0), Placed(1, 2, profile_spec("L40S-8Q"), 8)],
     "mixed_spans_aligned_and_disjoint"),
    ([Placed(2, 1, profile_spec("L40S-24Q"), 0), Placed(2, 2, profile_spec("L40S-8Q"), 1)],
     "equal_size_gpus_hold_one_size"),
    ([Placed(3, 1, profile_spec("RTX6000-24Q"), 0), Placed(7, 1, profile_spec("T4-16Q"), 0)],
     "vm_multi_vgpu_rules"),
    ([Placed(1, vm_id, profile_spec("L40S-1Q"), 2 * vm_id) for vm_id in (2, 3, 4)], "hosts_within_capacity"),
    ([Placed(3, 1, profile_spec("RTX6000-12Q"), 0), Placed(3, 2, profile_spec("RTX6000-12Q"), 0)],
     "placement_ids_unique_per_gpu"),
    ([Placed(8, 1, profile_spec("RTX6000-24Q"), 0)], "passthrough_gpus_hold_nothing"),
    ([Placed(2, 1, profile_spec("L40S-12Q"), 0), Placed(2, 1, profile_spec("L40S-12Q"), 1)],
     "vm_multi_vgpu_rules"),
])
def test_invariants_catch_a_fleet_the_rules_should_have_refused(bad, caught_by):
    """Each kind of bad fleet trips its invariant, so a rule that lets one through fails the property."""
    machine = FleetMachine()
    machine.placed = list(bad)
    with pytest.raises(AssertionError):
        getattr(machine, caught_by)()

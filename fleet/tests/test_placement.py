"""The placement rules of fleet.placement, tested without a database.

States are built from the dataclasses directly, with NVIDIA's figures taken from
fleet.catalog (which imports no ORM), so a wrong rule shows up as a wrong answer to a
question an admin would ask: "does a 12Q still fit on this RTX 6000?".
"""

from __future__ import annotations

import dataclasses

import pytest

from fleet.catalog import CATALOG, GIB, profiles_of
from fleet.placement import (
    MAX_VGPUS_PER_VM,
    PLACEMENT_GRID,
    Decision,
    GpuModelSpec,
    GpuState,
    HostState,
    PlacedVgpu,
    PlacementError,
    ProfileSpec,
    Rule,
    VmState,
    VmVgpu,
    check_gpu_change,
    check_host_capacity,
    check_placement,
    check_vm_fits_host,
    mixed_placement_ids,
    mixed_span_units,
)

# Builders shared with test_placement_properties.py ---------------------------------------

_MODELS = {model.code: model for model in CATALOG}
_PROFILES = {p.name: (model, p) for model in CATALOG for p in profiles_of(model)}
_PROFILE_IDS = {name: index for index, name in enumerate(sorted(_PROFILES), start=1)}

BIG_HOST = HostState(id=1, name="big-host", cpu_threads=4096, ram_gib=65536)


def model_spec(code: str) -> GpuModelSpec:
    """The placement spec of a catalog model, by board code ("RTX6000", "L40S", "T4")."""
    model = _MODELS[code]
    return GpuModelSpec(
        name=model.name, fb_mib=model.fb_gib * GIB,
        mixed_size_capable=model.mixed_size_capable, multi_vgpu_full_only=model.multi_vgpu_full_only,
    )


def profile_spec(name: str) -> ProfileSpec:
    """The placement spec of a catalog profile, by name ("RTX6000-12Q"); ids are stable per name."""
    model, profile = _PROFILES[name]
    return ProfileSpec(
        id=_PROFILE_IDS[name], name=profile.name, gpu_model=model.name, series=profile.series,
        fb_mib=profile.fb_mib, max_per_gpu=profile.max_per_gpu,
        max_per_gpu_mixed=profile.max_per_gpu_mixed, max_per_vm=profile.max_per_vm,
    )


def all_profile_names(code: str) -> list[str]:
    return [p.name for p in profiles_of(_MODELS[code])]


def gpu(code: str = "RTX6000", *, gpu_id: int = 1, host_id: int = 1, mode: str = "vgpu",
        size_mode: str = "equal", label: str | None = None) -> GpuState:
    return GpuState(
        id=gpu_id, label=label or f"gpu{gpu_id}", host_id=host_id, model=model_spec(code),
        mode=mode, size_mode=size_mode,
    )


def vm(vm_id: int = 1, *, vcpus: int = 8, ram_gib: int = 32, host_id: int | None = None,
       vgpus: tuple[VmVgpu, ...] = ()) -> VmState:
    return VmState(id=vm_id, name=f"ws-{vm_id}", vcpus=vcpus, ram_gib=ram_gib, host_id=host_id, vgpus=vgpus)


def decide(state: GpuState, name: str, vm_state: VmState | None = None, host: HostState = BIG_HOST) -> Decision:
    return check_placement(state, profile_spec(name), vm_state or vm(), host)


def add(state: GpuState, name: str, vm_id: int = 100) -> GpuState:
    """`state` with one more vGPU of `name`, where the rules place it (fails the test if refused)."""
    decision = decide(state, name, vm(vm_id))
    assert decision.ok, decision.violations
    placed = PlacedVgpu(profile_spec(name), vm_id, decision.placement_id)
    return dataclasses.replace(state, vgpus=(*state.vgpus, placed))


def remove_at(state: GpuState, placement_id: int) -> GpuState:
    return dataclasses.replace(state, vgpus=tuple(v for v in state.vgpus if v.placement_id != placement_id))


def fill(state: GpuState, name: str) -> GpuState:
    """Place `name` on `state` until the rules refuse; returns the full GPU."""
    for vm_id in range(1, 200):
        decision = decide(state, name, vm(vm_id))
        if not decision.ok:
            return state
        state = dataclasses.replace(
            state, vgpus=(*state.vgpus, PlacedVgpu(profile_spec(name), vm_id, decision.placement_id)),
        )
    raise AssertionError(f"{name} never refused")


def rules(decision_or_violations) -> set[str]:
    violations = getattr(decision_or_violations, "violations", decision_or_violations)
    return {v.rule for v in violations}


def messages(decision_or_violations) -> str:
    violations = getattr(decision_or_violations, "violations", decision_or_violations)
    return " | ".join(v.message for v in violations)


# Profile belongs to the GPU's model -------------------------------------------------------

def test_profile_of_the_gpu_model_is_accepted():
    decision = decide(gpu("RTX6000"), "RTX6000-12Q")
    assert decision.ok
    assert decision.placement_id == 0


def test_profile_of_another_model_is_refused():
    decision = decide(gpu("RTX6000", label="0000:3B:00.0"), "L40S-12Q")
    assert rules(decision) == {Rule.PROFILE_MODEL}
    assert "L40S-12Q is a NVIDIA L40S profile" in messages(decision)
    assert "GPU 0000:3B:00.0 is a Quadro RTX 6000" in messages(decision)
    assert decision.placement_id is None


# Passthrough --------------------------------------------------------------------------------

def test_passthrough_gpu_takes_no_vgpu():
    decision = decide(gpu("L40S", mode="passthrough", label="0000:86:00.0"), "L40S-48Q")
    assert rules(decision) == {Rule.PASSTHROUGH}
    assert "GPU 0000:86:00.0 is in passthrough mode" in messages(decision)


def test_same_gpu_in_vgpu_mode_takes_the_vgpu():
    assert decide(gpu("L40S", mode="vgpu"), "L40S-48Q").ok


# Equal-size mode ----------------------------------------------------------------------------

def test_equal_size_accepts_another_series_of_the_same_size():
    """NVIDIA lets A40-2B sit beside A40-2Q: equal-size mode is about frame buffer, not series."""
    state = add(gpu("A40"), "A40-2Q")
    decision = decide(state, "A40-2B")
    assert decision.ok
    assert decision.placement_id == 1


def test_equal_size_refuses_another_size():
    state = add(gpu("A40", label="gpu-a40"), "A40-2Q")
    decision = decide(state, "A40-4Q")
    assert rules(decision) == {Rule.EQUAL_SIZE}
    assert "GPU gpu-a40 is in equal-size mode and holds 2048 MiB vGPUs" in messages(decision)
    assert "A40-4Q has 4096 MiB" in messages(decision)


def test_equal_size_takes_any_size_again_once_emptied():
    state = remove_at(add(gpu("A40"), "A40-2Q"), 0)
    assert decide(state, "A40-24Q").ok


def test_full_equal_size_gpu_offers_nothing():
    """vgpu-facts 2: "a full GPU lists nothing creatable"."""
    state = fill(gpu("RTX6000"), "RTX6000-8Q")
    refused = [name for name in all_profile_names("RTX6000") if not decide(state, name).ok]
    assert refused == all_profile_names("RTX6000")


# Mixed-size mode -----------------------------------------------------------------------------

def test_mixed_size_accepts_different_sizes():
    state = add(add(gpu("L40S", size_mode="mixed"), "L40S-24Q"), "L40S-8Q")
    state = add(state, "L40S-4Q")
    assert sorted(v.profile.name for v in state.vgpus) == ["L40S-24Q", "L40S-4Q", "L40S-8Q"]
    assert state.used_fb_mib == 36 * GIB


def test_mixed_size_refuses_profile_without_mixed_count():
    """A type NVIDIA offers only in equal-size mode (no mixed column) cannot go on a mixed GPU."""
    equal_only = ProfileSpec(
        id=9001, name="L40S-48A", gpu_model="NVIDIA L40S", series="A", fb_mib=48 * GIB,
        max_per_gpu=1, max_per_gpu_mixed=None, max_per_vm=1,
    )
    mixed = gpu("L40S", size_mode="mixed", label="gpu-l40s")
    decision = check_placement(mixed, equal_only, vm(), BIG_HOST)
    assert rules(decision) == {Rule.MIXED_SIZE_PROFILE}
    assert "L40S-48A is not offered in mixed-size mode" in messages(decision)
    assert check_placement(gpu("L40S"), equal_only, vm(), BIG_HOST).ok


def test_mixed_size_max_count_is_the_mixed_figure():
    """L40S-8Q: 6 per GPU equal-size, 4 mixed-size, although 16 GiB stay free."""
    state = gpu("L40S", size_mode="mixed", label="gpu-l40s")
    for _ in range(4):
        state = add(state, "L40S-8Q")
    decision = decide(state, "L40S-8Q")
    assert rules(decision) == {Rule.MAX_PER_GPU}
    assert "L40S-8Q allows 4 per GPU in mixed-size mode" in messages(decision)
    assert "GPU gpu-l40s already has 4" in messages(decision)
    assert state.free_fb_mib == 16 * GIB
    # The same GPU in equal-size mode takes a fifth and a sixth.
    equal = fill(gpu("L40S"), "L40S-8Q")
    assert len(equal.vgpus) == 6


def test_mixed_size_places_at_aligned_grid_offsets():
    """An 8Q on a 48 GB board sits in a 12 GiB aligned span: offsets 0, 8, 16, 24 of 32 units."""
    state = gpu("L40S", size_mode="mixed")
    for _ in range(4):
        state = add(state, "L40S-8Q")
    assert [v.placement_id for v in state.vgpus] == [0, 8, 16, 24]


def test_mixed_size_fragmentation_refuses_24q_with_24_gib_free():
    """Free memory that is not one aligned span is unusable: two 12Q at offsets 0 and 16 leave
    24 GiB free, in two 12 GiB holes, and a 24Q needs offset 0 or 16."""
    state = gpu("L40S", size_mode="mixed", label="gpu-l40s")
    for _ in range(3):
        state = add(state, "L40S-12Q")
    state = remove_at(state, 8)
    assert sorted(v.placement_id for v in state.vgpus) == [0, 16]
    assert state.free_fb_mib == 24 * GIB

    decision = decide(state, "L40S-24Q")
    assert rules(decision) == {Rule.PLACEMENT_SLOT}
    assert "L40S-24Q needs an aligned span of 24576 MiB" in messages(decision)
    assert "GPU gpu-l40s has 24576 MiB free but no aligned span" in messages(decision)
    # A 12Q still fits in either hole.
    assert decide(state, "L40S-12Q").placement_id == 8


def test_mixed_size_24q_fits_when_the_free_24_gib_are_aligned():
    state = gpu("L40S", size_mode="mixed")
    for _ in range(3):
        state = add(state, "L40S-12Q")
    state = remove_at(state, 16)  # 12Q at 0 and 8: units 16-32 are one aligned 24 GiB span
    decision = decide(state, "L40S-24Q")
    assert decision.ok
    assert decision.placement_id == 16


def test_mixed_size_spans_of_small_vgpus_block_larger_slots():
    """Four 8Q take every 12 GiB span: 16 GiB are free, yet not even a 12Q fits."""
    state = gpu("L40S", size_mode="mixed")
    for _ in range(4):
        state = add(state, "L40S-8Q")
    decision = decide(state, "L40S-12Q")
    assert rules(decision) == {Rule.PLACEMENT_SLOT}
    assert "16384 MiB free" in messages(decision)


def test_span_geometry_matches_mixed_counts():
    assert mixed_span_units(profile_spec("L40S-8Q")) == 8
    assert mixed_placement_ids(profile_spec("L40S-8Q")) == [0, 8, 16, 24]
    assert mixed_placement_ids(profile_spec("A40-1Q")) == list(range(30))
    assert mixed_placement_ids(profile_spec("L40S-48Q")) == [0]
    assert mixed_span_units(profile_spec("L40S-48Q")) == PLACEMENT_GRID


# Size mode and mode changes ------------------------------------------------------------------

@pytest.mark.parametrize("code", ["T4", "RTX6000", "RTX8000"])
def test_mixed_size_refused_on_models_without_it(code):
    violations = check_gpu_change(gpu(code), "vgpu", "mixed")
    assert rules(violations) == {Rule.SIZE_MODE_UNSUPPORTED}
    assert f"{model_spec(code).name} does not support mixed-size mode" in messages(violations)


@pytest.mark.parametrize("code", ["L40S", "A40", "A10", "A16"])
def test_mixed_size_accepted_on_empty_capable_gpu(code):
    assert check_gpu_change(gpu(code), "vgpu", "mixed") == []


def test_model_change_keeps_mixed_only_where_supported():
    state = gpu("L40S", size_mode="mixed")
    assert rules(check_gpu_change(state, "vgpu", "mixed", model=model_spec("T4"))) == {Rule.SIZE_MODE_UNSUPPORTED}
    assert check_gpu_change(state, "vgpu", "equal", model=model_spec("T4")) == []


@pytest.mark.parametrize(("change", "words"), [
    ({"mode": "passthrough", "size_mode": "equal"}, "its mode can change"),
    ({"mode": "vgpu", "size_mode": "mixed"}, "its size mode can change"),
    ({"mode": "vgpu", "size_mode": "equal", "model": "L40"}, "its model can change"),
    ({"mode": "vgpu", "size_mode": "equal", "host_id": 2}, "its host can change"),
])
def test_gpu_change_refused_while_busy_and_accepted_when_empty(change, words):
    change = dict(change)
    model = model_spec(change.pop("model")) if "model" in change else None
    empty = gpu("L40S", label="gpu-l40s")
    busy = add(empty, "L40S-12Q")

    violations = check_gpu_change(busy, model=model, **change)
    assert rules(violations) == {Rule.GPU_BUSY}
    assert "GPU gpu-l40s holds 1 vGPU(s)" in messages(violations)
    assert words in messages(violations)
    assert check_gpu_change(empty, model=model, **change) == []


def test_unchanged_busy_gpu_may_be_saved():
    """Saving a busy GPU with the same mode, size mode, model and host (e.g. a new UUID) is fine."""
    busy = add(gpu("L40S"), "L40S-12Q")
    assert check_gpu_change(busy, "vgpu", "equal", model=model_spec("L40S"), host_id=1) == []


# Frame buffer --------------------------------------------------------------------------------

def test_frame_buffer_refusal_names_the_numbers():
    state = add(add(gpu("RTX6000", label="gpu-rtx"), "RTX6000-8Q"), "RTX6000-8Q")
    assert state.free_fb_mib == 8192
    decision = decide(state, "RTX6000-12Q")
    assert Rule.FRAME_BUFFER in rules(decision)
    assert "RTX6000-12Q needs 12288 MiB" in messages(decision)
    assert "8192 MiB free" in messages(decision)
    assert "of 24576 MiB" in messages(decision)
    # Equal-size mode refuses it for its size as well: the admin sees both reasons at once.
    assert rules(decision) == {Rule.FRAME_BUFFER, Rule.EQUAL_SIZE}


def test_frame_buffer_alone_refuses_in_mixed_mode():
    """Two 16Q on an L40S in mixed mode leave 16 GiB: a 24Q has a count to spare but no memory."""
    state = add(add(gpu("L40S", size_mode="mixed"), "L40S-16Q"), "L40S-16Q")
    decision = decide(state, "L40S-24Q")
    assert rules(decision) == {Rule.FRAME_BUFFER}
    assert "L40S-24Q needs 24576 MiB" in messages(decision)
    assert "16384 MiB free of 49152 MiB" in messages(decision)


def test_frame_buffer_accepts_exactly_full():
    state = add(add(gpu("RTX6000"), "RTX6000-12Q"), "RTX6000-12Q")
    assert state.used_fb_mib == state.model.fb_mib


# Per-profile max count -----------------------------------------------------------------------

def test_max_per_gpu_refuses_before_memory_runs_out():
    """RTX8000-1Q: 32 per GPU although 48 GiB would hold 48."""
    state = gpu("RTX8000", label="gpu-rtx8000")
    for _ in range(31):
        state = add(state, "RTX8000-1Q")
    assert decide(state, "RTX8000-1Q").ok
    state = add(state, "RTX8000-1Q")
    decision = decide(state, "RTX8000-1Q")
    assert rules(decision) == {Rule.MAX_PER_GPU}
    assert "RTX8000-1Q allows 32 per GPU; GPU gpu-rtx8000 already has 32" in messages(decision)
    assert state.free_fb_mib == 16 * GIB


def _catalog_profiles(mixed: bool) -> list[str]:
    return [
        name for name, (_, p) in sorted(_PROFILES.items())
        if not mixed or p.max_per_gpu_mixed is not None
    ]


@pytest.mark.parametrize("name", _catalog_profiles(mixed=False))
def test_filling_equal_size_gpu_reaches_max_per_gpu(name):
    """NVIDIA's equal-size maximum of every catalog profile is reachable and not exceeded."""
    model, profile = _PROFILES[name]
    full = fill(gpu(model.code), name)
    assert len(full.vgpus) == profile.max_per_gpu
    assert sorted(v.placement_id for v in full.vgpus) == list(range(profile.max_per_gpu))
    assert full.used_fb_mib <= full.model.fb_mib


@pytest.mark.parametrize("name", _catalog_profiles(mixed=True))
def test_filling_mixed_size_gpu_reaches_max_per_gpu_mixed(name):
    model, profile = _PROFILES[name]
    full = fill(gpu(model.code, size_mode="mixed"), name)
    assert len(full.vgpus) == profile.max_per_gpu_mixed
    span = mixed_span_units(profile_spec(name))
    starts = sorted(v.placement_id for v in full.vgpus)
    assert all(start % span == 0 and start + span <= PLACEMENT_GRID for start in starts)
    assert len(set(starts)) == len(starts)
    assert full.used_fb_mib <= full.model.fb_mib


# Several vGPUs in one VM ---------------------------------------------------------------------

def _vm_with(*names: str, host_id: int = 1, vm_id: int = 1, gpu_id: int = 50) -> VmState:
    vgpus = tuple(VmVgpu(profile_spec(n), gpu_id=gpu_id + i, host_id=host_id) for i, n in enumerate(names))
    return vm(vm_id, host_id=host_id, vgpus=vgpus)


def test_vm_may_hold_four_vgpus_but_not_five():
    four = _vm_with("L40S-12Q", "L40S-12Q", "L40S-12Q")
    assert decide(gpu("L40S"), "L40S-12Q", four).ok
    five = _vm_with("L40S-12Q", "L40S-12Q", "L40S-12Q", "L40S-12Q")
    decision = decide(gpu("L40S"), "L40S-12Q", five)
    assert rules(decision) == {Rule.VM_MAX_VGPUS}
    assert f"VM ws-1 has 4 vGPU(s); at most {MAX_VGPUS_PER_VM} per VM" in messages(decision)


def test_b_series_vm_holds_one_vgpu():
    """vPC (B) VMs are not multi-vGPU: a second A16-2B is refused, a second A16-2Q is not."""
    decision = decide(gpu("A16"), "A16-2B", _vm_with("A16-2B"))
    assert rules(decision) == {Rule.VM_MAX_VGPUS}
    assert "at most 1 per VM" in messages(decision)
    assert decide(gpu("A16"), "A16-2B").ok
    assert decide(gpu("A16"), "A16-2Q", _vm_with("A16-2Q")).ok


def test_vm_vgpus_stay_on_one_host():
    holder = _vm_with("L40S-12Q", host_id=1)
    assert decide(gpu("L40S", host_id=1), "L40S-12Q", holder).ok
    decision = decide(gpu("L40S", host_id=2), "L40S-12Q", holder)
    assert rules(decision) == {Rule.VM_HOST}
    assert "VM ws-1 runs on another host" in messages(decision)


def test_a_vms_vgpus_take_distinct_gpus_unless_the_host_allows_sharing():
    holder = _vm_with("L40S-12Q", gpu_id=1)
    decision = decide(gpu("L40S", gpu_id=1), "L40S-12Q", holder)
    assert rules(decision) == {Rule.VM_SAME_GPU}
    assert "VM ws-1 already holds a vGPU on GPU gpu1; host big-host puts each vGPU of a VM on a GPU of its own" \
        in messages(decision)
    assert decide(gpu("L40S", gpu_id=2), "L40S-12Q", holder).ok
    sharing = dataclasses.replace(BIG_HOST, multi_vgpu_same_gpu=True)
    assert decide(gpu("L40S", gpu_id=1), "L40S-12Q", holder, sharing).ok


def test_vm_vgpus_share_board_and_series():
    holder = _vm_with("L40S-12Q")
    assert decide(gpu("L40S"), "L40S-24Q", holder).ok  # sizes may differ on non-Turing boards

    other_series = decide(gpu("L40S"), "L40S-2B", holder)
    assert Rule.VM_BOARD_SERIES in rules(other_series)
    assert "VM ws-1 holds L40S-12Q" in messages(other_series)
    assert "(L40S-2B is NVIDIA L40S, series B)" in messages(other_series)

    other_board = decide(gpu("L40"), "L40-12Q", holder)
    assert rules(other_board) == {Rule.VM_BOARD_SERIES}
    assert "(L40-12Q is NVIDIA L40, series Q)" in messages(other_board)


def test_turing_multi_vgpu_combines_full_gpu_profiles():
    """Two RTX6000-24Q on two GPUs: the SEED guide's lighting and rendering setup."""
    assert decide(gpu("RTX6000", gpu_id=2), "RTX6000-24Q", _vm_with("RTX6000-24Q")).ok
    assert decide(gpu("RTX8000", gpu_id=2), "RTX8000-48Q", _vm_with("RTX8000-48Q", "RTX8000-48Q")).ok
    assert decide(gpu("T4", gpu_id=2), "T4-16Q", _vm_with("T4-16Q")).ok


@pytest.mark.parametrize(("held", "added", "smaller"), [
    ("RTX6000-12Q", "RTX6000-12Q", "RTX6000-12Q"),
    ("RTX6000-12Q", "RTX6000-24Q", "RTX6000-12Q"),
    ("RTX6000-24Q", "RTX6000-12Q", "RTX6000-12Q"),
    ("T4-8Q", "T4-16Q", "T4-8Q"),
])
def test_turing_multi_vgpu_refuses_partial_profiles(held, added, smaller):
    decision = decide(gpu(added.split("-")[0], gpu_id=2), added, _vm_with(held))
    assert rules(decision) == {Rule.MULTI_VGPU_FULL_ONLY}
    assert "a VM with several vGPUs may only use full-GPU profiles" in messages(decision)
    assert f"{smaller} is smaller" in messages(decision)


def test_partial_profiles_combine_on_boards_without_the_turing_limit():
    assert decide(gpu("L40S", gpu_id=2), "L40S-12Q", _vm_with("L40S-12Q")).ok


def test_single_partial_vgpu_is_fine_on_turing():
    assert decide(gpu("RTX6000"), "RTX6000-12Q").ok


def test_every_violation_is_reported_at_once():
    """The admin fixes everything in one go: memory, size, host and board all refused together."""
    state = add(add(gpu("RTX6000", host_id=2), "RTX6000-8Q"), "RTX6000-8Q")
    decision = decide(state, "RTX6000-12Q", _vm_with("L40S-12Q", host_id=1))
    assert rules(decision) == {
        Rule.FRAME_BUFFER, Rule.EQUAL_SIZE, Rule.VM_HOST, Rule.VM_BOARD_SERIES, Rule.MULTI_VGPU_FULL_ONLY,
    }
    assert decision.placement_id is None
    with pytest.raises(PlacementError) as refused:
        decision.raise_if_refused()
    assert set(refused.value.rules) == rules(decision)
    assert "RTX6000-12Q needs 12288 MiB" in str(refused.value)


# Host vCPU and RAM capacity ------------------------------------------------------------------

def _host(threads=16, ram=128, vcpus_used=0, ram_used=0, vcpu_oc=1.0, ram_oc=1.0) -> HostState:
    return HostState(
        id=1, name="h1", cpu_threads=threads, ram_gib=ram, vcpu_overcommit=vcpu_oc, ram_overcommit=ram_oc,
        allocated_vcpus=vcpus_used, allocated_ram_gib=ram_used,
    )


def test_host_vcpus_accepted_up_to_capacity_refused_above():
    host = _host(threads=16, vcpus_used=8)
    assert decide(gpu(), "RTX6000-12Q", vm(vcpus=8), host).ok
    decision = decide(gpu(), "RTX6000-12Q", vm(vcpus=9), host)
    assert rules(decision) == {Rule.HOST_VCPU}
    assert "VM ws-1 needs 9 vCPUs; host h1 has 8 of 16 vCPUs free (16 threads x 1 overcommit)" in messages(decision)


def test_vcpu_overcommit_doubles_capacity():
    host = _host(threads=16, vcpus_used=8, vcpu_oc=2.0)
    assert host.vcpu_capacity == 32
    assert decide(gpu(), "RTX6000-12Q", vm(vcpus=24), host).ok
    decision = decide(gpu(), "RTX6000-12Q", vm(vcpus=25), host)
    assert rules(decision) == {Rule.HOST_VCPU}
    assert "has 24 of 32 vCPUs free (16 threads x 2 overcommit)" in messages(decision)


def test_host_ram_accepted_up_to_capacity_refused_above():
    host = _host(ram=128, ram_used=96)
    assert decide(gpu(), "RTX6000-12Q", vm(ram_gib=32), host).ok
    decision = decide(gpu(), "RTX6000-12Q", vm(ram_gib=33), host)
    assert rules(decision) == {Rule.HOST_RAM}
    assert "VM ws-1 needs 33 GiB RAM; host h1 has 32 of 128 GiB free (128 GiB x 1 overcommit)" in messages(decision)


def test_ram_overcommit_doubles_capacity():
    host = _host(ram=128, ram_used=96, ram_oc=2.0)
    assert decide(gpu(), "RTX6000-12Q", vm(ram_gib=160), host).ok
    assert rules(decide(gpu(), "RTX6000-12Q", vm(ram_gib=161), host)) == {Rule.HOST_RAM}


def test_host_vcpu_and_ram_refused_together():
    violations = check_vm_fits_host("ws-9", 20, 200, _host(threads=16, ram=128))
    assert rules(violations) == {Rule.HOST_VCPU, Rule.HOST_RAM}
    assert "has 16 of 16 vCPUs free" in messages(violations)
    assert "has 128 of 128 GiB free" in messages(violations)


def test_fractional_overcommit_capacity_is_not_rounded_down_by_float_error():
    """45 threads x 1.4 is 63 vCPUs; in binary floating point the product is 62.99999999999999."""
    host = _host(threads=45, vcpu_oc=1.4, ram=45, ram_oc=1.4)
    assert host.vcpu_capacity == 63
    assert host.ram_capacity_gib == 63
    assert decide(gpu(), "RTX6000-12Q", vm(vcpus=63, ram_gib=63), host).ok
    assert _host(threads=72, vcpu_oc=1.1).vcpu_capacity == 79  # 79.2: partial vCPUs do not count


def test_vm_already_on_the_host_is_not_charged_twice():
    """A second vGPU for a VM that already runs on the host claims no more vCPUs or RAM."""
    full = _host(threads=16, vcpus_used=16)
    holder = _vm_with("L40S-12Q", host_id=1)
    assert decide(gpu("L40S", gpu_id=2), "L40S-12Q", holder, full).ok


def test_vm_recorded_on_another_host_is_checked_against_the_new_host():
    """A VM without vGPUs but still recorded on host 2 moves to host 1 with its first vGPU, so
    host 1 must have room for it."""
    full = _host(threads=16, vcpus_used=16)
    stray = vm(vcpus=8, host_id=2)
    decision = decide(gpu("L40S", host_id=1), "L40S-12Q", stray, full)
    assert rules(decision) == {Rule.HOST_VCPU}


def test_host_capacity_shrink_refused_below_claims():
    host = _host(threads=32, ram=256, vcpus_used=24, ram_used=192)
    assert check_host_capacity(host, 24, 192, 1.0, 1.0) == []
    violations = check_host_capacity(host, 23, 191, 1.0, 1.0)
    assert rules(violations) == {Rule.HOST_VCPU, Rule.HOST_RAM}
    assert "Host h1 runs VMs with 24 vCPUs; 23 vCPUs (23 threads x 1 overcommit) would not hold them" in (
        messages(violations)
    )
    assert "Host h1 runs VMs with 192 GiB RAM; 191 GiB (191 GiB x 1 overcommit) would not hold them" in (
        messages(violations)
    )


def test_host_capacity_shrink_compensated_by_overcommit():
    host = _host(threads=32, ram=256, vcpus_used=24, ram_used=192)
    assert check_host_capacity(host, 12, 96, 2.0, 2.0) == []
    assert rules(check_host_capacity(host, 12, 96, 1.5, 2.0)) == {Rule.HOST_VCPU}

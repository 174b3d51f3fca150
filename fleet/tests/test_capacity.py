"""fleet.capacity, tested without a database: "where could a new vGPU go?" must give the answers
placement itself gives. Every count here is checked against `placement.check_placement` by
placing vGPUs one after another on the same GPU until it refuses (test_placement's `fill`)."""

from __future__ import annotations

import pytest

from fleet.capacity import (
    FULL_GPU,
    IN_USE,
    QUARTER_GPU,
    common_profiles,
    fleet_room,
    frame_buffer,
    profile_room,
    profile_usage,
    room_on_gpu,
)
from fleet.catalog import GIB
from fleet.placement import Rule
from fleet.tests.test_placement import add, all_profile_names, fill, gpu, profile_spec, remove_at


def placed_by_placement(state, name: str) -> int:
    """How many more vGPUs of `name` check_placement accepts on `state`, one after another."""
    return len(fill(state, name).vgpus) - len(state.vgpus)


def a40_with_two_12q(**kwargs):
    state = gpu("A40", **kwargs)
    return add(add(state, "A40-12Q", vm_id=1), "A40-12Q", vm_id=2)


def catalog(*codes: str):
    return [profile_spec(name) for code in codes for name in all_profile_names(code)]


# Room on one GPU ------------------------------------------------------------------------------


def test_a40_with_two_12q_takes_two_more_12q():
    state = a40_with_two_12q()
    room = room_on_gpu(state, profile_spec("A40-12Q"))
    assert room.count == 2 == placed_by_placement(state, "A40-12Q")
    assert room.refusal == Rule.FRAME_BUFFER  # the first rule the fifth 12Q breaks
    assert room.free_fb_mib == 24 * GIB


def test_equal_size_gpu_takes_no_other_size():
    """An equal-size GPU holding 12Q has 24 GiB free, yet neither a 24Q nor an 8Q goes there."""
    state = a40_with_two_12q()
    for name in ("A40-24Q", "A40-8Q"):
        room = room_on_gpu(state, profile_spec(name))
        assert room.count == 0 == placed_by_placement(state, name)
        assert room.refusal == Rule.EQUAL_SIZE


def test_full_gpu_takes_none():
    state = fill(gpu("A40"), "A40-12Q")
    room = room_on_gpu(state, profile_spec("A40-12Q"))
    assert room.count == 0
    assert room.refusal in {Rule.MAX_PER_GPU, Rule.FRAME_BUFFER}


def test_passthrough_gpu_takes_none():
    room = room_on_gpu(gpu("A40", mode="passthrough"), profile_spec("A40-12Q"))
    assert room.count == 0
    assert room.refusal == Rule.PASSTHROUGH


def test_mixed_size_free_memory_without_an_aligned_span_takes_no_24q():
    """12Q at offsets 0 and 16 leave 24 GiB free in two holes: no 24Q, but two more 12Q."""
    state = gpu("L40S", size_mode="mixed")
    for _ in range(3):
        state = add(state, "L40S-12Q")
    state = remove_at(state, 8)
    assert state.free_fb_mib == 24 * GIB

    room_24q = room_on_gpu(state, profile_spec("L40S-24Q"))
    assert room_24q.count == 0 == placed_by_placement(state, "L40S-24Q")
    assert room_24q.refusal == Rule.PLACEMENT_SLOT
    assert room_on_gpu(state, profile_spec("L40S-12Q")).count == 2 == placed_by_placement(state, "L40S-12Q")


def test_mixed_size_mixes_sizes_in_aligned_spans():
    """A mixed-size L40S with one 24Q: one more 24Q, or two 12Q, or four 4Q... each by its span."""
    state = add(gpu("L40S", size_mode="mixed"), "L40S-24Q")
    expected = {"L40S-24Q": 1, "L40S-12Q": 2, "L40S-8Q": 2, "L40S-48Q": 0}
    for name, count in expected.items():
        assert room_on_gpu(state, profile_spec(name)).count == count == placed_by_placement(state, name), name


@pytest.mark.parametrize(("code", "size_mode"), [
    ("RTX6000", "equal"), ("T4", "equal"), ("L40S", "equal"), ("L40S", "mixed"), ("A40", "equal"),
    ("A40", "mixed"), ("A16", "equal"), ("A16", "mixed"),
])
@pytest.mark.parametrize("prefill", [None, "smallest", "largest-but-one"])
def test_room_always_equals_what_placement_accepts(code, size_mode, prefill):
    """For every profile of a model, on an empty GPU and on GPUs already holding vGPUs, in both size
    modes: the count is exactly what check_placement lets through one after another."""
    names = all_profile_names(code)
    state = gpu(code, size_mode=size_mode)
    if prefill:
        usable = [n for n in names if size_mode == "equal" or profile_spec(n).max_per_gpu_mixed]
        chosen = min(usable, key=lambda n: profile_spec(n).fb_mib) if prefill == "smallest" else sorted(
            usable, key=lambda n: -profile_spec(n).fb_mib)[1]
        state = add(state, chosen)
    for name in names:
        assert room_on_gpu(state, profile_spec(name)).count == placed_by_placement(state, name), name


# Room across the fleet ----------------------------------------------------------------------


def test_profile_room_ranks_gpus_by_room_and_says_why_the_others_take_none():
    gpus = [
        a40_with_two_12q(gpu_id=1, host_id=1),                    # 2 more 12Q
        gpu("A40", gpu_id=2, host_id=1),                          # empty: 4
        fill(gpu("A40", gpu_id=3, host_id=2), "A40-12Q"),         # full
        gpu("A40", gpu_id=4, host_id=2, mode="passthrough"),
        add(gpu("A40", gpu_id=5, host_id=2), "A40-8Q"),           # other size
        gpu("L40S", gpu_id=6, host_id=2),                         # another model: not counted
    ]
    room = profile_room(gpus, profile_spec("A40-12Q"))
    assert [(r.gpu.id, r.count) for r in room.candidates] == [(2, 4), (1, 2)]
    assert room.total == 6
    assert room.gpu_count == 5
    assert dict(room.refusals) == {Rule.FRAME_BUFFER: 1, Rule.PASSTHROUGH: 1, Rule.EQUAL_SIZE: 1}


def test_the_fleet_wide_room_equals_the_room_of_each_gpu_alone():
    """fleet_room and profile_usage simulate each kind of GPU once and share the answer among the
    GPUs alike: every GPU must still get exactly what room_on_gpu says of it alone."""
    gpus = [
        a40_with_two_12q(gpu_id=1, host_id=1), a40_with_two_12q(gpu_id=2, host_id=2),
        gpu("A40", gpu_id=3, host_id=1), gpu("A40", gpu_id=4, host_id=3),
        add(gpu("A40", gpu_id=5, host_id=2), "A40-8Q"),
        add(gpu("A40", gpu_id=6, host_id=3, size_mode="mixed"), "A40-8Q"),
        gpu("A40", gpu_id=7, host_id=2, mode="passthrough"),
        add(gpu("L40S", gpu_id=8, host_id=4, size_mode="mixed"), "L40S-12Q"), gpu("L40S", gpu_id=9, host_id=4),
    ]
    for room in fleet_room(gpus, catalog("A40", "L40S")):
        counts = {r.gpu.id: r.count for r in room.candidates}
        for state in gpus:
            if state.model.name == room.profile.gpu_model:
                alone = room_on_gpu(state, room.profile).count
                assert counts.get(state.id, 0) == alone, (room.profile.name, state.id)
    for usage in profile_usage(gpus):
        assert usage.free_slots == sum(room_on_gpu(g, usage.profile).count for g in gpus if g.id in usage.gpu_ids)


def test_candidates_with_equal_room_prefer_more_free_frame_buffer():
    """Mixed-size L40S GPUs with a 24Q: the most 8Q first, then, at equal room, the most frame buffer free."""
    light, with_8q, with_12q = (add(gpu("L40S", gpu_id=i, size_mode="mixed"), "L40S-24Q") for i in (1, 2, 3))
    with_8q, with_12q = add(with_8q, "L40S-8Q"), add(with_12q, "L40S-12Q")
    room = profile_room([with_12q, with_8q, light], profile_spec("L40S-8Q"))
    assert [(r.gpu.id, r.count, r.free_fb_mib) for r in room.candidates] == [
        (1, 2, 24 * GIB), (2, 1, 16 * GIB), (3, 1, 12 * GIB),
    ]
    room_24q = profile_room([with_12q, with_8q, light], profile_spec("L40S-24Q"))
    assert [(r.gpu.id, r.count) for r in room_24q.candidates] == [(1, 1)]
    assert dict(room_24q.refusals) == {Rule.FRAME_BUFFER: 2}


def test_common_profiles_are_those_in_use_plus_full_and_quarter_gpu_q_profiles():
    gpus = [
        add(gpu("A40", gpu_id=1), "A40-12Q"),
        add(gpu("L40S", gpu_id=2, size_mode="mixed"), "L40S-8Q"),
        gpu("RTX6000", gpu_id=3, mode="passthrough"),  # a model only in passthrough: nothing of it
    ]
    chosen = common_profiles(gpus, catalog("A40", "L40S", "RTX6000"))
    assert [(p.name, reasons) for p, reasons in chosen] == [
        ("A40-48Q", (FULL_GPU,)),
        ("A40-12Q", (IN_USE, QUARTER_GPU)),
        ("L40S-48Q", (FULL_GPU,)),
        ("L40S-12Q", (QUARTER_GPU,)),
        ("L40S-8Q", (IN_USE,)),
    ]


def test_common_profiles_of_a_24_gib_board_and_a_compute_only_board():
    """A quarter of 24 GiB is the 6Q; a board without Q profiles (A100) adds only what is in use."""
    a100 = gpu("A100D", gpu_id=2)
    chosen = common_profiles([gpu("RTX6000", gpu_id=1), a100], catalog("RTX6000", "A100D"))
    assert [p.name for p, _ in chosen] == ["RTX6000-24Q", "RTX6000-6Q"]


def test_fleet_room_answers_for_each_common_profile():
    gpus = [a40_with_two_12q(gpu_id=1), gpu("A40", gpu_id=2, mode="passthrough")]
    rooms = {room.profile.name: room for room in fleet_room(gpus, catalog("A40"))}
    assert rooms.keys() == {"A40-48Q", "A40-12Q"}
    assert rooms["A40-12Q"].total == 2
    assert rooms["A40-48Q"].total == 0
    assert dict(rooms["A40-48Q"].refusals) == {Rule.FRAME_BUFFER: 1, Rule.PASSTHROUGH: 1}


def test_fleet_room_of_no_gpus_is_empty():
    assert fleet_room([], catalog("A40")) == []


# Slots in use and frame buffer --------------------------------------------------------------


def test_profile_usage_counts_vgpus_gpus_frame_buffer_and_free_slots():
    gpus = [
        a40_with_two_12q(gpu_id=1),
        add(gpu("A40", gpu_id=2), "A40-12Q", vm_id=3),
        add(add(gpu("L40S", gpu_id=3, size_mode="mixed"), "L40S-24Q", vm_id=4), "L40S-8Q", vm_id=5),
        gpu("A40", gpu_id=4),  # empty: not "running" any profile
    ]
    rows = {row.profile.name: row for row in profile_usage(gpus)}
    assert list(rows) == ["A40-12Q", "L40S-24Q", "L40S-8Q"]
    a40 = rows["A40-12Q"]
    assert (a40.vgpu_count, a40.gpu_count, a40.fb_mib, a40.fb_gib, a40.free_slots) == (3, 2, 36 * GIB, 36.0, 2 + 3)
    assert a40.model_name == "NVIDIA A40"
    assert (rows["L40S-24Q"].vgpu_count, rows["L40S-24Q"].free_slots) == (1, 0)  # the 8Q sits in the other half
    assert rows["L40S-8Q"].free_slots == 1


def test_frame_buffer_counts_vgpu_mode_gpus_only():
    gpus = [a40_with_two_12q(gpu_id=1), gpu("A40", gpu_id=2), gpu("A40", gpu_id=3, mode="passthrough")]
    fb = frame_buffer(gpus)
    assert (fb.allocated_mib, fb.physical_mib) == (24 * GIB, 96 * GIB)
    assert (fb.allocated_gib, fb.physical_gib, fb.percent) == (24.0, 96.0, 25.0)
    assert frame_buffer([gpu("A40", mode="passthrough")]).percent is None

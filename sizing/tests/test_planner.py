"""The density planner (sizing.planner), tested without a database on NVIDIA's own figures.

Hand-checked cases first (the sizing guide's server, packing, equal- and mixed-size, multi-vGPU,
vCPU and RAM limits, lower bounds, profiles across boards), then a property: every plan the
planner returns replays, vGPU by vGPU in the order it was made, through
fleet.placement.check_placement, the rules the inventory enforces.
"""

from __future__ import annotations

import dataclasses
from collections import Counter, defaultdict

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fleet.catalog import GIB
from fleet.placement import GpuState, PlacedVgpu, Rule, VmState, VmVgpu, check_placement
from fleet.tests.test_placement import all_profile_names, model_spec, profile_spec
from sizing.planner import (
    BALANCED_FILL,
    FIRST_FIT_DECREASING,
    RULE_NO_PROFILE,
    RULE_VM_GPUS,
    ArtistDemand,
    DensityPlan,
    ServerSpec,
    board_profile,
    lower_bounds,
    plan_density,
    profile_for,
)
from sizing.presets import DEFAULT_PRESETS

BOARDS = ("RTX6000", "RTX8000", "L40S", "A40", "A10", "A16", "T4")
CATALOG_SPECS = [profile_spec(name) for code in BOARDS for name in all_profile_names(code)]


def server(code: str = "RTX6000", gpus: int = 3, cpu_threads: int = 72, ram_gib: int = 384, **kwargs) -> ServerSpec:
    """The sizing guide's server by default: 3 x Quadro RTX 6000, 2 x Xeon Gold 6154 (72 threads)."""
    return ServerSpec(model_spec(code), gpus, cpu_threads, ram_gib, **kwargs)


def demand(profile: str, count: int = 1, *, vgpus: int = 1, vcpus: int = 8, ram_gib: int = 32,
           label: str | None = None, workflow: str | None = None) -> ArtistDemand:
    return ArtistDemand(label or profile, workflow, profile_spec(profile), vgpus, vcpus, ram_gib, count)


def preset(workflow: str, spec: ServerSpec, count: int = 1) -> ArtistDemand:
    """A workflow's seeded preset translated to the server's board, as the planner page does."""
    fb_mib, vgpus, vcpus, ram_gib, _ = DEFAULT_PRESETS[workflow]
    profile, note = board_profile(fb_mib, "Q", spec.gpu_model, CATALOG_SPECS)
    return ArtistDemand(workflow.title(), workflow, profile, vgpus, vcpus, ram_gib, count, note)


def gpu_contents(plan: DensityPlan) -> list[list[list[tuple[str, str]]]]:
    """server -> GPU -> [(profile, label)] by slot: the layout as the page draws it."""
    return [[[(v.profile.name, v.label) for v in gpu.vgpus] for gpu in srv.gpus] for srv in plan.layout]


# The sizing guide ----------------------------------------------------------------------------


@pytest.mark.parametrize("half_gpu_workflow", ["shading", "texturing"])
def test_the_sizing_guides_four_artists_share_one_three_gpu_server(half_gpu_workflow):
    spec = server(ram_gib=384)
    workflows = ["modeling", half_gpu_workflow, "animation", "lighting"]

    plan = plan_density(spec, [preset(w, spec) for w in workflows])

    assert plan.servers == 1
    assert plan.unplaced == ()
    modeling, half, animation, lighting = (w.title() for w in workflows)
    assert gpu_contents(plan) == [[
        [("RTX6000-12Q", modeling), ("RTX6000-12Q", half)],
        [("RTX6000-24Q", animation)],
        [("RTX6000-24Q", lighting)],
    ]]
    only = plan.layout[0]
    assert [gpu.fb_used_mib for gpu in only.gpus] == [24 * GIB] * 3
    assert (only.vcpus_used, only.vcpu_capacity) == (8 + 8 + 12 + 16, 72)
    assert (only.ram_gib_used, only.ram_capacity_gib) == (32 + 32 + 64 + 64, 384)
    assert only.artists == 4
    assert plan.lower_bound_servers == 1
    assert plan.optimal
    assert plan.artists_per_server == 4.0


def test_same_input_gives_the_same_plan():
    spec = server()
    demands = [preset(w, spec, 5) for w in ("lighting", "modeling", "animation", "shading", "layout")]
    assert plan_density(spec, demands) == plan_density(spec, list(demands))


# Packing ---------------------------------------------------------------------------------


def test_modeling_artists_pack_two_per_quadro_rtx_6000():
    spec = server(cpu_threads=512, ram_gib=4096)

    twelve = plan_density(spec, [demand("RTX6000-12Q", 12)])
    thirteen = plan_density(spec, [demand("RTX6000-12Q", 13)])

    assert twelve.servers == 2
    assert all(len(gpu.vgpus) == 2 for srv in twelve.layout for gpu in srv.gpus)
    assert thirteen.servers == 3
    assert [srv.artists for srv in thirteen.layout] == [6, 6, 1]
    assert [len(gpu.vgpus) for gpu in thirteen.layout[2].gpus] == [1, 0, 0]
    assert twelve.optimal
    assert thirteen.optimal


def test_a_half_filled_gpu_is_completed_before_an_empty_one_is_opened():
    # Three 8Q on an L40S (48 GB, 6 per GPU in equal-size mode) stay on one GPU.
    plan = plan_density(server("L40S", gpus=2, cpu_threads=128, ram_gib=1024), [demand("L40S-8Q", 3)])
    assert [len(gpu.vgpus) for gpu in plan.layout[0].gpus] == [3, 0]


def test_equal_size_gpus_never_mix_12q_and_24q():
    plan = plan_density(server("L40S", gpus=1, cpu_threads=128, ram_gib=1024),
                        [demand("L40S-24Q", 1), demand("L40S-12Q", 2)])

    assert plan.servers == 2
    for srv in plan.layout:
        for gpu in srv.gpus:
            assert len({v.profile.fb_mib for v in gpu.vgpus}) <= 1
    assert plan.lower_bounds["gpus"] == 2
    assert plan.optimal


def test_mixed_size_gpus_share_12q_and_24q_on_an_l40s():
    plan = plan_density(server("L40S", gpus=1, cpu_threads=128, ram_gib=1024, size_mode="mixed"),
                        [demand("L40S-24Q", 1), demand("L40S-12Q", 2)])

    assert plan.servers == 1
    assert sorted(name for name, _ in gpu_contents(plan)[0][0]) == ["L40S-12Q", "L40S-12Q", "L40S-24Q"]
    assert plan.layout[0].gpus[0].fb_used_mib == 48 * GIB


@pytest.mark.parametrize(
    ("profile", "count", "equal_servers", "mixed_servers"),
    [
        # NVIDIA's maxima on a 48 GB board: 16Q 3 equal / 2 mixed, 8Q 6 / 4, 1Q 32 / 16.
        ("L40S-16Q", 3, 1, 2),
        ("L40S-8Q", 6, 1, 2),
        ("L40S-1Q", 32, 1, 2),
    ],
)
def test_mixed_size_mode_respects_the_lower_mixed_maxima(profile, count, equal_servers, mixed_servers):
    big_cpu = {"cpu_threads": 512, "ram_gib": 4096}
    equal = plan_density(server("L40S", gpus=1, **big_cpu), [demand(profile, count, vcpus=1, ram_gib=1)])
    mixed = plan_density(server("L40S", gpus=1, size_mode="mixed", **big_cpu),
                         [demand(profile, count, vcpus=1, ram_gib=1)])
    assert equal.servers == equal_servers
    assert mixed.servers == mixed_servers
    assert mixed.optimal


# Multi-vGPU ------------------------------------------------------------------------------


def test_a_four_gpu_lighting_vm_takes_four_gpus_of_one_server():
    plan = plan_density(server(gpus=4, cpu_threads=96, ram_gib=512),
                        [demand("RTX6000-24Q", 2, vgpus=4, vcpus=16, ram_gib=64, label="Lighting")])

    assert plan.servers == 2
    for srv in plan.layout:
        vms = {v.vm for gpu in srv.gpus for v in gpu.vgpus}
        assert len(vms) == 1
        assert [len(gpu.vgpus) for gpu in srv.gpus] == [1, 1, 1, 1]


def test_a_four_gpu_lighting_vm_fits_no_three_gpu_server():
    plan = plan_density(server(), [
        demand("RTX6000-24Q", 2, vgpus=4, vcpus=16, ram_gib=64, label="Lighting", workflow="lighting"),
        demand("RTX6000-12Q", 1, label="Modeling"),
    ])

    assert plan.servers == 1
    assert plan.artists_placed == 1
    assert len(plan.unplaced) == 1
    unplaced = plan.unplaced[0]
    assert (unplaced.label, unplaced.workflow, unplaced.count) == ("Lighting", "lighting", 2)
    assert unplaced.rule == RULE_VM_GPUS
    assert "4 vGPUs" in unplaced.reason
    assert "3 GPUs" in unplaced.reason


def test_turing_boards_refuse_multi_vgpu_with_half_gpu_profiles():
    plan = plan_density(server(), [demand("RTX6000-12Q", 1, vgpus=2, label="Heavy modeling")])

    assert plan.servers == 0
    assert plan.unplaced[0].rule == Rule.MULTI_VGPU_FULL_ONLY
    assert "RTX6000-12Q is smaller" in plan.unplaced[0].reason


def test_ampere_and_ada_boards_combine_half_gpu_profiles_on_separate_gpus():
    plan = plan_density(server("L40S", gpus=2, cpu_threads=64, ram_gib=512), [demand("L40S-24Q", 1, vgpus=2)])

    assert plan.servers == 1
    assert [len(gpu.vgpus) for gpu in plan.layout[0].gpus] == [1, 1]


def test_a_vpc_profile_cannot_be_multi_vgpu():
    plan = plan_density(server("L40S", gpus=2, cpu_threads=64, ram_gib=512), [demand("L40S-2B", 1, vgpus=2)])
    assert plan.unplaced[0].rule == Rule.VM_MAX_VGPUS


# Host capacity ---------------------------------------------------------------------------


def test_the_vcpu_limit_opens_a_new_server():
    # GPUs would take six 12Q artists per server; 16 threads take two of 8 vCPUs.
    plan = plan_density(server(cpu_threads=16), [demand("RTX6000-12Q", 4, vcpus=8)])

    assert plan.servers == 2
    assert [srv.vcpus_used for srv in plan.layout] == [16, 16]
    assert plan.lower_bounds == {"gpus": 1, "vcpus": 2, "ram": 1}
    assert plan.limited_by == ["vcpus"]


def test_vcpu_overcommit_lets_more_artists_in():
    plan = plan_density(server(cpu_threads=16, vcpu_overcommit=2.0), [demand("RTX6000-12Q", 4, vcpus=8)])

    assert plan.servers == 1
    assert plan.layout[0].vcpu_capacity == 32


def test_ram_and_its_overcommit_limit_a_server_too():
    demands = [demand("RTX6000-12Q", 6, vcpus=4, ram_gib=64)]
    tight = plan_density(server(ram_gib=256), demands)
    overcommitted = plan_density(server(ram_gib=256, ram_overcommit=1.5), demands)

    assert tight.servers == 2
    assert tight.limited_by == ["ram"]
    assert overcommitted.servers == 1
    assert overcommitted.layout[0].ram_capacity_gib == 384


def test_a_vm_larger_than_a_server_is_unplaced_with_the_hosts_numbers():
    plan = plan_density(server(), [demand("RTX6000-24Q", 1, vcpus=96, label="Sim")])

    assert plan.servers == 0
    assert plan.unplaced[0].rule == Rule.HOST_VCPU
    assert "needs 96 vCPUs" in plan.unplaced[0].reason
    assert "72 of 72 vCPUs free" in plan.unplaced[0].reason


def test_a_balanced_fill_pairs_gpu_heavy_with_cpu_heavy_artists():
    # First-fit decreasing puts both 48Q artists on the first server (GPUs full, vCPUs idle) and
    # then needs a server for each CPU-heavy artist: 3. Pairing one of each per server needs 2.
    spec = server("L40S", gpus=2, cpu_threads=32, ram_gib=512)
    plan = plan_density(spec, [demand("L40S-48Q", 2, vcpus=4), demand("L40S-1Q", 2, vcpus=28)])

    assert plan.servers == 2
    assert plan.method == BALANCED_FILL
    assert plan.optimal
    for srv in plan.layout:
        assert sorted(v.profile.name for gpu in srv.gpus for v in gpu.vgpus) == ["L40S-1Q", "L40S-48Q"]


def test_first_fit_decreasing_is_kept_on_a_tie():
    spec = server()
    assert plan_density(spec, [preset("modeling", spec, 7)]).method == FIRST_FIT_DECREASING


def test_ten_thousand_artists_are_planned():
    plan = plan_density(server(), [demand("RTX6000-12Q", 10_000, vcpus=8, ram_gib=32)])

    # Six 12Q per 3-GPU server; 72 threads take nine, 384 GiB twelve: the GPUs decide.
    assert plan.servers == 1667
    assert plan.artists_placed == 10_000
    assert plan.optimal


# Lower bound -----------------------------------------------------------------------------


def test_lower_bound_counts_gpus_by_size_class_in_equal_size_mode():
    spec = server(cpu_threads=1000, ram_gib=10_000)
    # 3 x 24Q need 3 GPUs, 3 x 12Q need 2 (two per GPU, never beside a 24Q): 5 GPUs, 2 servers.
    bounds = lower_bounds(spec, [demand("RTX6000-24Q", 3), demand("RTX6000-12Q", 3)])
    assert bounds["gpus"] == 2
    # A multi-vGPU VM counts each of its vGPUs.
    assert lower_bounds(spec, [demand("RTX6000-24Q", 2, vgpus=4)])["gpus"] == 3


def test_lower_bound_counts_aligned_spans_in_mixed_size_mode():
    spec = server("L40S", gpus=1, cpu_threads=1000, ram_gib=10_000, size_mode="mixed")
    # A mixed-size 8Q sits in a 12 GB aligned span: four per GPU, so five need two GPUs.
    assert lower_bounds(spec, [demand("L40S-8Q", 5)])["gpus"] == 2
    assert lower_bounds(spec, [demand("L40S-8Q", 4)])["gpus"] == 1


def test_lower_bound_counts_vcpus_and_ram_over_capacity_with_overcommit():
    spec = server(cpu_threads=40, ram_gib=100, vcpu_overcommit=1.5, ram_overcommit=1.2)
    # 10 x 8 = 80 vCPUs over 60; 10 x 32 = 320 GiB over 120.
    bounds = lower_bounds(spec, [demand("RTX6000-4Q", 10)])
    assert bounds == {"gpus": 1, "vcpus": 2, "ram": 3}


def test_nothing_to_plan_needs_no_server():
    plan = plan_density(server(), [])
    assert (plan.servers, plan.lower_bound_servers, plan.optimal, plan.artists_per_server) == (0, 0, True, None)


# Profiles across boards ------------------------------------------------------------------


@pytest.mark.parametrize(
    ("fb_gib", "series", "board", "expected"),
    [
        (12, "Q", "Quadro RTX 6000", "RTX6000-12Q"),
        (12, "Q", "NVIDIA L40S", "L40S-12Q"),
        (12, "Q", "NVIDIA A16", "A16-16Q"),  # A16 GPUs have no 12Q: the next size up
        (12, "Q", "Tesla T4", "T4-16Q"),
        (5, "Q", "Quadro RTX 6000", "RTX6000-6Q"),
        (1, "Q", "NVIDIA A10", "A10-1Q"),
        (24, "Q", "Tesla T4", "T4-16Q"),  # more than the GPU: capped at a whole GPU
        (48, "Q", "NVIDIA A10", "A10-24Q"),
        (2, "B", "NVIDIA A40", "A40-2B"),
        (2, "B", "Quadro RTX 6000", None),  # Turing boards offer no B profile in the catalog
    ],
)
def test_profile_for_takes_the_smallest_profile_that_holds_the_frame_buffer(fb_gib, series, board, expected):
    chosen = profile_for(fb_gib * GIB, series, board, CATALOG_SPECS)
    assert (chosen.name if chosen else None) == expected


def test_board_profile_notes_translations_caps_and_missing_series():
    t4 = model_spec("T4")
    assert board_profile(16 * GIB, "Q", t4, CATALOG_SPECS) == (profile_spec("T4-16Q"), "")
    _, rounded_up = board_profile(12 * GIB, "Q", model_spec("A16"), CATALOG_SPECS)
    assert "A16-16Q" in rounded_up
    capped, note = board_profile(24 * GIB, "Q", t4, CATALOG_SPECS)
    assert capped.name == "T4-16Q"
    assert "capped" in note
    missing, why = board_profile(2 * GIB, "B", t4, CATALOG_SPECS)
    assert missing is None
    assert why == "Tesla T4 offers no B-series profile"


def test_a_multi_vgpu_demand_takes_whole_gpus_on_a_board_that_allows_nothing_smaller():
    """2 x 24 GiB on a Quadro RTX 8000 (48 GB) is 2 x RTX8000-48Q: its vGPU manager refuses a VM
    two RTX8000-24Q; the plan places it, where the smaller profile would leave it unplaced."""
    spec = server("RTX8000")
    whole, note = board_profile(24 * GIB, "Q", spec.gpu_model, CATALOG_SPECS, vgpus=2)
    assert whole.name == "RTX8000-48Q"
    assert "full-GPU profiles" in note
    assert board_profile(24 * GIB, "Q", spec.gpu_model, CATALOG_SPECS)[0].name == "RTX8000-24Q"  # one vGPU
    assert board_profile(24 * GIB, "Q", model_spec("L40S"), CATALOG_SPECS, vgpus=2)[0].name == "L40S-24Q"
    plan = plan_density(spec, [ArtistDemand("Lighting", "lighting", whole, vgpus=2, count=1)])
    assert (plan.servers, plan.unplaced) == (1, ())


def test_a_demand_without_a_profile_is_unplaced_with_its_note():
    spec = server("T4")
    profile, note = board_profile(2 * GIB, "B", spec.gpu_model, CATALOG_SPECS)
    plan = plan_density(spec, [ArtistDemand("Office", "other", profile, count=3, note=note)])
    assert plan.unplaced[0].rule == RULE_NO_PROFILE
    assert plan.unplaced[0].count == 3
    assert plan.unplaced[0].reason == note


# Every plan obeys the placement rules ----------------------------------------------------


def replay(spec: ServerSpec, demands: list[ArtistDemand], plan: DensityPlan) -> None:
    """Place every vGPU of the plan again, server by server in the planner's order, through
    check_placement on fresh states, updating them as fleet.services would; each must be
    accepted at the slot the plan recorded."""
    for srv in plan.layout:
        gpus = {gpu.index: GpuState(id=gpu.index, label=str(gpu.index), host_id=srv.index, model=spec.gpu_model,
                                    size_mode=spec.size_mode) for gpu in srv.gpus}
        host = spec.host_state(srv.index, f"server-{srv.index}")
        vms: dict[int, VmState] = {}
        placed = sorted(((v, gpu.index) for gpu in srv.gpus for v in gpu.vgpus), key=lambda pair: pair[0].seq)
        for vgpu, gpu_index in placed:
            asked = demands[vgpu.row]
            vm = vms.get(vgpu.vm) or VmState(id=vgpu.vm, name=f"vm-{vgpu.vm}", vcpus=asked.vcpus,
                                             ram_gib=asked.ram_gib)
            decision = check_placement(gpus[gpu_index], vgpu.profile, vm, host)
            assert decision.ok, decision.violations
            assert decision.placement_id == vgpu.placement_id
            gpus[gpu_index] = dataclasses.replace(gpus[gpu_index], vgpus=(
                *gpus[gpu_index].vgpus, PlacedVgpu(vgpu.profile, vm.id, decision.placement_id)))
            if vm.host_id != host.id:
                host = dataclasses.replace(host, allocated_vcpus=host.allocated_vcpus + vm.vcpus,
                                           allocated_ram_gib=host.allocated_ram_gib + vm.ram_gib)
            vms[vm.id] = dataclasses.replace(vm, host_id=host.id,
                                             vgpus=(*vm.vgpus, VmVgpu(vgpu.profile, gpu_index, host.id)))
        assert (host.allocated_vcpus, host.allocated_ram_gib) == (srv.vcpus_used, srv.ram_gib_used)


def fits_an_empty_server(spec: ServerSpec, d: ArtistDemand) -> bool:
    """Whether one VM of `d` fits an empty server, asked of the rules directly: its vGPUs on GPUs
    of their own (the GPUs of an empty server are alike, so the order does not matter)."""
    if d.vgpus > spec.gpus:
        return False
    host = spec.host_state(1, "empty")
    vm = VmState(id=1, name="probe", vcpus=d.vcpus, ram_gib=d.ram_gib)
    for gpu_index in range(d.vgpus):
        gpu = GpuState(id=gpu_index, label=str(gpu_index), host_id=1, model=spec.gpu_model, size_mode=spec.size_mode)
        if not check_placement(gpu, d.profile, vm, host).ok:
            return False
        vm = dataclasses.replace(vm, host_id=1, vgpus=(*vm.vgpus, VmVgpu(d.profile, gpu_index, 1)))
    return True


@st.composite
def planning_cases(draw):
    code = draw(st.sampled_from(["RTX6000", "L40S", "A16", "T4", "A10"]))
    model = model_spec(code)
    spec = ServerSpec(
        model, gpus=draw(st.integers(1, 4)), cpu_threads=draw(st.integers(8, 96)),
        ram_gib=draw(st.integers(32, 768)), vcpu_overcommit=draw(st.sampled_from([1.0, 1.5, 2.0])),
        ram_overcommit=draw(st.sampled_from([1.0, 1.25])),
        size_mode=draw(st.sampled_from(["equal", "mixed"] if model.mixed_size_capable else ["equal"])),
    )
    names = all_profile_names(code)
    demands = [
        ArtistDemand(
            label=f"row{index}", workflow=None, profile=profile_spec(draw(st.sampled_from(names))),
            vgpus=draw(st.sampled_from([1, 1, 1, 2, 4])), vcpus=draw(st.integers(1, 24)),
            ram_gib=draw(st.integers(4, 128)), count=draw(st.integers(1, 8)),
        )
        for index in range(draw(st.integers(1, 6)))
    ]
    return spec, demands


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(planning_cases())
def test_every_plan_replays_through_the_placement_rules(case):
    spec, demands = case
    plan = plan_density(spec, demands)

    replay(spec, demands, plan)

    # Every artist is placed with all its vGPUs, or reported unplaced, once.
    vgpus_placed = Counter()
    vgpus_of_vm: dict[int, list[tuple[int, int]]] = defaultdict(list)
    row_of_vm: dict[int, int] = {}
    for srv in plan.layout:
        for gpu in srv.gpus:
            for v in gpu.vgpus:
                vgpus_placed[v.row] += 1
                vgpus_of_vm[v.vm].append((srv.index, gpu.index))
                assert row_of_vm.setdefault(v.vm, v.row) == v.row
    unplaced = {u.label: u.count for u in plan.unplaced}
    for index, d in enumerate(demands):
        if d.label in unplaced:
            assert (vgpus_placed[index], unplaced[d.label]) == (0, d.count)
            assert not fits_an_empty_server(spec, d)
        else:
            assert vgpus_placed[index] == d.count * d.vgpus
    # A VM's vGPUs sit on distinct GPUs of one server, as many as it asked for.
    for vm, where in vgpus_of_vm.items():
        assert len({server_index for server_index, _ in where}) == 1
        assert len(set(where)) == len(where) == demands[row_of_vm[vm]].vgpus
    assert plan.servers == len(plan.layout) >= plan.lower_bound_servers
    assert plan.artists_placed == sum(srv.artists for srv in plan.layout)
    assert all(srv.artists for srv in plan.layout)

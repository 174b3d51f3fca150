"""Everything the fleet overview (`/`) shows, read in a fixed number of queries.

Placement states of every GPU are built from two bulk queries (GPUs with host and model, then
every vGPU with its profile) instead of `services.gpu_state()` once per GPU, and handed to the
pure `fleet.capacity`; telemetry comes from `telemetry.queries`. The query count does not grow
with the fleet: ten, whether it has two GPUs or a thousand.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass
from datetime import datetime, timedelta

from fleet import capacity, placement
from fleet.choices import GpuMode
from fleet.models import Artist, Gpu, Host, Vgpu, VgpuProfile, VirtualMachine
from hypervisors import drift
from hypervisors.drift_queries import fleet_drift
from telemetry import queries as telemetry_queries
from telemetry.models import AgentStatus

#: Samples older than this are not "now": a GPU whose agent went quiet is not among the hottest.
HOT_SAMPLE_MAX_AGE = timedelta(minutes=5)
HOT_GPUS = 5
IDLE_WINDOW = timedelta(hours=24)
IDLE_VMS = 5
CANDIDATES = 3
AGENTS_NEEDING_ATTENTION = 6
AGENT_STATUS_ORDER = (AgentStatus.OK, AgentStatus.STALE, AgentStatus.ERROR, AgentStatus.NEW, AgentStatus.DISABLED)


@dataclass(frozen=True)
class GpuRef:
    """A GPU as the overview names it: host · PCI bus id, model, and its detail page's id."""

    id: int
    host_id: int
    host_name: str
    pci_bus_id: str
    model_name: str


@dataclass(frozen=True)
class Candidate:
    """A GPU that takes `count` more vGPUs of a profile, with its free frame buffer now."""

    gpu: GpuRef
    count: int
    free_fb_mib: int

    @property
    def free_fb_gib(self) -> float:
        return self.free_fb_mib / capacity.MIB_PER_GIB


@dataclass(frozen=True)
class RoomRow:
    """One line of "where could a new vGPU go": a common profile and its best GPUs."""

    room: capacity.ProfileRoom
    candidates: list[Candidate]
    more_gpus: int  # GPUs that take some but are not among `candidates`
    refusals: list[tuple[str, int]]  # (why, how many GPUs) for the GPUs of the model that take none


@dataclass(frozen=True)
class HotGpu:
    gpu: GpuRef
    sample: dict


@dataclass(frozen=True)
class IdleVm:
    vm_id: int
    vm_name: str
    artist_name: str | None
    profiles: str
    fb_p95_pct: float
    util_gpu_avg: float | None
    hours: int


@dataclass
class Overview:
    """The overview's figures and tables (see templates/fleet/partials/overview_live.html)."""

    now: datetime
    host_count: int
    vm_count: int
    artist_count: int
    gpu_count: int
    vgpu_mode_gpu_count: int
    passthrough_gpu_count: int
    vgpu_count: int
    vms_with_vgpus: int
    frame_buffer: capacity.FrameBuffer
    usage: list[capacity.ProfileUsage]
    room: list[RoomRow]
    agent_counts: list[tuple[str, str, int]]  # (status, label, count)
    agent_total: int
    agents_needing_attention: list
    more_agents_needing_attention: int
    hottest: list[HotGpu]
    gpus_without_recent_sample: int
    idle: list[IdleVm]
    idle_no_data: int
    drift: list[drift.KindCount]  # per kind of drift between inventory, hypervisors and agents
    drifting_vms: int
    drifting_gpus: int
    hot_sample_max_age_min: int = int(HOT_SAMPLE_MAX_AGE.total_seconds() // 60)
    idle_window_h: int = int(IDLE_WINDOW.total_seconds() // 3600)


# Why a GPU takes no vGPU of a profile, worded for the capacity table ("no room: <why> (2 GPUs)").
REFUSAL_WORDS = {
    placement.Rule.PASSTHROUGH: "passthrough mode",
    placement.Rule.EQUAL_SIZE: "another size placed (equal-size mode)",
    placement.Rule.MAX_PER_GPU: "the profile's maximum per GPU reached",
    placement.Rule.FRAME_BUFFER: "not enough free frame buffer",
    placement.Rule.PLACEMENT_SLOT: "no free aligned span (mixed-size mode)",
    placement.Rule.MIXED_SIZE_PROFILE: "mixed-size mode, which the profile is not offered in",
}


@dataclass(frozen=True)
class PlacedRow:
    """A vGPU as the overview needs it: its VM and its profile's name."""

    vm_id: int
    profile_name: str


def gpu_states() -> tuple[list[placement.GpuState], dict[int, GpuRef], list[PlacedRow], list[placement.ProfileSpec]]:
    """The placement state of every GPU, a GpuRef of each by id, every vGPU, and the catalog's
    profiles. Three queries.

    GPUs and vGPUs are read as plain rows (their model's columns joined) and the profiles, a few
    hundred rows, once beside them: a studio has thousands of GPUs and vGPUs, and building a
    model instance and its related ones per row took seconds of the page at 1,000 hosts.
    """
    profiles = {profile.pk: profile.to_spec() for profile in VgpuProfile.objects.select_related("gpu_model")}
    gpus = Gpu.objects.order_by("host__name", "pci_bus_id", "id").values_list(
        "id", "host_id", "host__name", "pci_bus_id", "mode", "size_mode", "gpu_model_id", "gpu_model__name",
        "gpu_model__fb_mib", "gpu_model__mixed_size_capable", "gpu_model__multi_vgpu_full_only")
    vgpus = Vgpu.objects.order_by("gpu_id", "placement_id", "id").values_list(
        "gpu_id", "vm_id", "placement_id", "profile_id")
    placed: dict[int, list[placement.PlacedVgpu]] = defaultdict(list)
    rows = []
    for gpu_id, vm_id, placement_id, profile_id in vgpus:
        spec = profiles[profile_id]
        placed[gpu_id].append(placement.PlacedVgpu(spec, vm_id, placement_id))
        rows.append(PlacedRow(vm_id, spec.name))
    models: dict[int, placement.GpuModelSpec] = {}
    states, refs = [], {}
    for gpu_id, host_id, host_name, pci_bus_id, mode, size_mode, model_id, *model_columns in gpus:
        if model_id not in models:
            name, fb_mib, mixed_size_capable, multi_vgpu_full_only = model_columns
            models[model_id] = placement.GpuModelSpec(  # as GpuModel.to_spec
                name=name, fb_mib=fb_mib, mixed_size_capable=mixed_size_capable,
                multi_vgpu_full_only=multi_vgpu_full_only)
        # The label is the PCI bus id, as Gpu.label.
        states.append(placement.GpuState(
            id=gpu_id, label=pci_bus_id, host_id=host_id, model=models[model_id],
            mode=mode, size_mode=size_mode, vgpus=tuple(placed[gpu_id]),
        ))
        refs[gpu_id] = GpuRef(gpu_id, host_id, host_name, pci_bus_id, models[model_id].name)
    return states, refs, rows, list(profiles.values())


def catalog_q_profiles(profiles: list[placement.ProfileSpec], model_names: set[str]) -> list[placement.ProfileSpec]:
    """The Q profiles of the given GPU models (candidates of `capacity.common_profiles`)."""
    return [profile for profile in profiles if profile.series == "Q" and profile.gpu_model in model_names]


def _room_rows(rooms: list[capacity.ProfileRoom], refs: dict[int, GpuRef]) -> list[RoomRow]:
    return [
        RoomRow(
            room=room,
            candidates=[
                Candidate(refs[r.gpu.id], r.count, r.free_fb_mib) for r in room.candidates[:CANDIDATES]
            ],
            more_gpus=max(len(room.candidates) - CANDIDATES, 0),
            refusals=[(REFUSAL_WORDS.get(rule, rule), count) for rule, count in room.refusals],
        )
        for room in rooms
    ]


def _hottest(refs: dict[int, GpuRef], now: datetime) -> tuple[list[HotGpu], int]:
    samples = telemetry_queries.latest_gpu_samples(since=now - HOT_SAMPLE_MAX_AGE)
    ranked = sorted(
        (HotGpu(refs[gpu_id], sample) for gpu_id, sample in samples.items()
         if gpu_id in refs and sample["util_gpu"] is not None),
        key=lambda hot: (-hot.sample["util_gpu"], -(hot.sample["temp_c"] or 0), hot.gpu.host_name,
                         hot.gpu.pci_bus_id),
    )
    return ranked[:HOT_GPUS], len(refs) - len(samples)


def _idle(vgpus: list[PlacedRow], now: datetime) -> tuple[list[IdleVm], int]:
    rows, no_data = telemetry_queries.allocation_use(since=now - IDLE_WINDOW, limit=IDLE_VMS)
    profiles: dict[int, list[str]] = defaultdict(list)
    for vgpu in vgpus:
        profiles[vgpu.vm_id].append(vgpu.profile_name)
    return [
        IdleVm(
            vm_id=row["vm_id"], vm_name=row["vm_name"], artist_name=row["artist_name"],
            profiles=", ".join(sorted(profiles.get(row["vm_id"], []))),
            fb_p95_pct=row["fb_p95_pct"], util_gpu_avg=row["util_gpu_avg"], hours=row["hours"],
        )
        for row in rows
    ], no_data


def _agents() -> tuple[list[tuple[str, str, int]], list]:
    """(status, label, count) for every status, and the agents needing attention: those in error
    first, then the stale ones, silent longest first (never-seen agents are "new", not here)."""
    groups = telemetry_queries.agents_by_status()
    counts = [(status, AgentStatus(status).label, len(groups[status])) for status in AGENT_STATUS_ORDER]
    attention = groups[AgentStatus.ERROR] + sorted(groups[AgentStatus.STALE], key=lambda a: (a.last_seen, a.name))
    return counts, attention


def load_overview(now: datetime) -> Overview:
    """Read everything the overview shows, as of `now`. A fixed number of queries (ten, and the
    drift snapshot's, `hypervisors.drift_queries`)."""
    states, refs, vgpus, profiles = gpu_states()
    usage = capacity.profile_usage(states)
    vgpu_models = {state.model.name for state in states if state.mode != GpuMode.PASSTHROUGH}
    rooms = capacity.fleet_room(states, catalog_q_profiles(profiles, vgpu_models))
    agent_counts, attention = _agents()
    hottest, without_sample = _hottest(refs, now)
    idle, idle_no_data = _idle(vgpus, now)
    passthrough = sum(1 for state in states if state.mode == GpuMode.PASSTHROUGH)
    drift_items = fleet_drift(now)
    drifting_vms, drifting_gpus = drift.drifting(drift_items)
    return Overview(
        now=now,
        host_count=Host.objects.count(),
        vm_count=VirtualMachine.objects.count(),
        artist_count=Artist.objects.count(),
        gpu_count=len(states),
        vgpu_mode_gpu_count=len(states) - passthrough,
        passthrough_gpu_count=passthrough,
        vgpu_count=len(vgpus),
        vms_with_vgpus=len({vgpu.vm_id for vgpu in vgpus}),
        frame_buffer=capacity.frame_buffer(states),
        usage=usage,
        room=_room_rows(rooms, refs),
        agent_counts=agent_counts,
        agent_total=sum(count for _, _, count in agent_counts),
        agents_needing_attention=attention[:AGENTS_NEEDING_ATTENTION],
        more_agents_needing_attention=max(len(attention) - AGENTS_NEEDING_ATTENTION, 0),
        hottest=hottest,
        gpus_without_recent_sample=without_sample,
        idle=idle,
        idle_no_data=idle_no_data,
        drift=drift.counts(drift_items),
        drifting_vms=drifting_vms,
        drifting_gpus=drifting_gpus,
    )

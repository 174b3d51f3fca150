"""Where new vGPUs could go right now, and how the vGPU slots in use are shared out by profile.

Pure functions over `fleet.placement` states (no ORM), so the overview's answers are tested
without a database and can never disagree with what placement would accept: the room a GPU
has for a profile is found by asking `placement.check_gpu_fit` again and again, placing one
vGPU after another on a copy of the GPU's state until the rules refuse. That follows every
GPU-level rule, including the ones plain arithmetic gets wrong: an equal-size GPU only takes
its current profile size, a mixed-size GPU needs a free *aligned* span, each profile has a
maximum per GPU, and a passthrough GPU takes none.

What is left out on purpose: the rules of the VM that would hold the vGPU and of its host
(vCPUs and RAM, vGPUs per VM, one host per VM). They depend on which VM it is, and are checked
when a vGPU is actually placed for one.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace
from functools import lru_cache

from fleet.placement import GpuModelSpec, GpuState, PlacedVgpu, ProfileSpec, check_gpu_fit

MIB_PER_GIB = 1024
#: The VM id of the vGPUs imagined while counting room: the GPU-level rules never look at it.
IMAGINED_VM_ID = 0
#: Why a profile is "common" (see `common_profiles`); shown beside it on the overview.
IN_USE, FULL_GPU, QUARTER_GPU = "in use", "full GPU", "1/4 GPU"


@dataclass(frozen=True)
class GpuRoom:
    """How many more vGPUs of one profile fit on `gpu`, placed one after another.

    `refusal` is the code (`placement.Rule`) of the rule that stopped the count: why none, or
    why no more, fit.
    """

    gpu: GpuState
    count: int
    refusal: str | None = None

    @property
    def free_fb_mib(self) -> int:
        return self.gpu.free_fb_mib


@dataclass(frozen=True)
class ProfileRoom:
    """Room for new vGPUs of `profile` across the fleet.

    `candidates` are the GPUs that take at least one, most room first (then most free frame
    buffer); `refusals` counts, by rule code, the GPUs of the profile's model that take none.
    """

    profile: ProfileSpec
    reasons: tuple[str, ...]
    gpu_count: int
    candidates: tuple[GpuRoom, ...]
    refusals: tuple[tuple[str, int], ...]

    @property
    def total(self) -> int:
        return sum(room.count for room in self.candidates)


@dataclass(frozen=True)
class ProfileUsage:
    """The vGPUs of one profile placed in the fleet, and the slots of it still free on their GPUs."""

    profile: ProfileSpec
    model_name: str
    vgpu_count: int
    gpu_ids: tuple[int, ...]
    free_slots: int

    @property
    def fb_mib(self) -> int:
        return self.vgpu_count * self.profile.fb_mib

    @property
    def fb_gib(self) -> float:
        return self.fb_mib / MIB_PER_GIB

    @property
    def gpu_count(self) -> int:
        return len(self.gpu_ids)


def room_on_gpu(gpu: GpuState, profile: ProfileSpec) -> GpuRoom:
    """How many more vGPUs of `profile` `gpu` takes now, by placing them one after another."""
    count, refusal = _room(*_signature(gpu), profile)
    return GpuRoom(gpu=gpu, count=count, refusal=refusal)


def _signature(gpu: GpuState) -> tuple:
    """What the GPU rules look at: model, modes and layout of (profile, placement ID)."""
    return gpu.model, gpu.mode, gpu.size_mode, tuple((vgpu.profile, vgpu.placement_id) for vgpu in gpu.vgpus)


class _Rooms:
    """`room_on_gpu` over a whole fleet: GPUs alike share one signature, taken once per GPU,
    so each profile costs one simulation per distinct GPU and a lookup per GPU (at 1,000 hosts
    the overview asks for 14 profiles on 3,769 GPUs of a few dozen kinds)."""

    def __init__(self, gpus: Iterable[GpuState]):
        kinds: dict[tuple, int] = {}
        self.signatures: list[tuple] = []
        self.kind_of: dict[int, int] = {}
        for gpu in gpus:
            signature = _signature(gpu)
            kind = kinds.setdefault(signature, len(kinds))
            if kind == len(self.signatures):
                self.signatures.append(signature)
            self.kind_of[gpu.id] = kind

    def room(self, gpu: GpuState, profile: ProfileSpec, memo: dict[int, tuple[int, str | None]]) -> GpuRoom:
        kind = self.kind_of[gpu.id]
        if kind not in memo:
            memo[kind] = _room(*self.signatures[kind], profile)
        count, refusal = memo[kind]
        return GpuRoom(gpu=gpu, count=count, refusal=refusal)


@lru_cache(maxsize=4096)
def _room(model: GpuModelSpec, mode: str, size_mode: str, layout: tuple,
          profile: ProfileSpec) -> tuple[int, str | None]:
    """`room_on_gpu` for a GPU of this model, modes and layout of (profile, placement ID): the GPU
    rules look at nothing else, and a fleet has many GPUs alike (empty ones first of all), so each
    distinct GPU is simulated once. Bounded by the profile's largest maximum per GPU, past which
    the MAX_PER_GPU rule refuses."""
    state = GpuState(
        id=0, label="", host_id=0, model=model, mode=mode, size_mode=size_mode,
        vgpus=tuple(PlacedVgpu(placed, IMAGINED_VM_ID, placement_id) for placed, placement_id in layout),
    )
    limit = max(profile.max_per_gpu, profile.max_per_gpu_mixed or 0)
    for count in range(limit + 1):
        decision = check_gpu_fit(state, profile)
        if not decision.ok:
            return count, decision.violations[0].rule
        imagined = PlacedVgpu(profile, IMAGINED_VM_ID, decision.placement_id)
        state = replace(state, vgpus=(*state.vgpus, imagined))
    return limit + 1, None


def _candidate_order(room: GpuRoom) -> tuple:
    return (-room.count, -room.free_fb_mib, room.gpu.host_id, room.gpu.label, room.gpu.id)


def profile_room(gpus: Iterable[GpuState], profile: ProfileSpec, reasons: tuple[str, ...] = (),
                 _rooms: _Rooms | None = None) -> ProfileRoom:
    """Room for `profile` on every GPU of its model among `gpus` (see `ProfileRoom`)."""
    gpus = [gpu for gpu in gpus if gpu.model.name == profile.gpu_model]
    rooms_of = _rooms or _Rooms(gpus)
    memo: dict[int, tuple[int, str | None]] = {}
    rooms = [rooms_of.room(gpu, profile, memo) for gpu in gpus]
    refusals = Counter(room.refusal for room in rooms if room.count == 0 and room.refusal)
    return ProfileRoom(
        profile=profile,
        reasons=reasons,
        gpu_count=len(rooms),
        candidates=tuple(sorted((room for room in rooms if room.count), key=_candidate_order)),
        refusals=tuple(sorted(refusals.items(), key=lambda item: (-item[1], item[0]))),
    )


def _profile_order(profile: ProfileSpec) -> tuple:
    return (profile.gpu_model, -profile.fb_mib, profile.name)


def common_profiles(gpus: Sequence[GpuState], catalog: Iterable[ProfileSpec]) -> list[tuple[ProfileSpec, tuple]]:
    """The profiles the overview answers "where could one more go?" for, each with its reasons.

    The rule, kept simple enough to state on the page: every profile in use in the fleet, plus,
    for each model of a vGPU-mode GPU, its largest Q profile (a full GPU) and its Q profile of
    exactly a quarter of the GPU's frame buffer (where the model has one). `catalog` holds the
    candidate profiles of those models; ordered by model, then largest first.
    """
    reasons: dict[int, list[str]] = {}
    specs: dict[int, ProfileSpec] = {}

    def add(profile: ProfileSpec, reason: str) -> None:
        specs[profile.id] = profile
        if reason not in reasons.setdefault(profile.id, []):
            reasons[profile.id].append(reason)

    for gpu in gpus:
        for vgpu in gpu.vgpus:
            add(vgpu.profile, IN_USE)
    model_fb_mib = {gpu.model.name: gpu.model.fb_mib for gpu in gpus if gpu.mode != "passthrough"}
    q_profiles = [p for p in catalog if p.series == "Q" and p.gpu_model in model_fb_mib]
    for model_name, fb_mib in model_fb_mib.items():
        of_model = [p for p in q_profiles if p.gpu_model == model_name]
        if of_model:
            add(max(of_model, key=lambda p: (p.fb_mib, -p.id)), FULL_GPU)
        for profile in of_model:
            if profile.fb_mib * 4 == fb_mib:
                add(profile, QUARTER_GPU)
    return [(specs[pid], tuple(reasons[pid])) for pid in sorted(specs, key=lambda pid: _profile_order(specs[pid]))]


def fleet_room(gpus: Sequence[GpuState], catalog: Iterable[ProfileSpec]) -> list[ProfileRoom]:
    """Room for each of the `common_profiles` across `gpus`, in their order."""
    rooms = _Rooms(gpus)
    return [profile_room(gpus, profile, reasons, rooms) for profile, reasons in common_profiles(gpus, catalog)]


def profile_usage(gpus: Iterable[GpuState]) -> list[ProfileUsage]:
    """One row per profile in use: its vGPUs, the GPUs running it, and the slots of that profile
    still free on those GPUs (counted as `room_on_gpu` does). Ordered by model, then largest first."""
    gpus = list(gpus)
    specs: dict[int, ProfileSpec] = {}
    vgpu_counts: Counter[int] = Counter()
    gpu_ids: dict[int, list[int]] = {}
    for gpu in gpus:
        for vgpu in gpu.vgpus:
            specs[vgpu.profile.id] = vgpu.profile
            vgpu_counts[vgpu.profile.id] += 1
            running = gpu_ids.setdefault(vgpu.profile.id, [])
            if gpu.id not in running:
                running.append(gpu.id)
    by_id = {gpu.id: gpu for gpu in gpus}
    rooms = _Rooms(gpus)

    def free_slots(profile: ProfileSpec, ids: list[int]) -> int:
        memo: dict[int, tuple[int, str | None]] = {}
        return sum(rooms.room(by_id[gid], profile, memo).count for gid in ids)

    rows = [
        ProfileUsage(
            profile=profile,
            model_name=profile.gpu_model,
            vgpu_count=vgpu_counts[pid],
            gpu_ids=tuple(gpu_ids[pid]),
            free_slots=free_slots(profile, gpu_ids[pid]),
        )
        for pid, profile in specs.items()
    ]
    return sorted(rows, key=lambda row: _profile_order(row.profile))


@dataclass(frozen=True)
class FrameBuffer:
    """Frame buffer over the vGPU-mode GPUs: what placed vGPUs' profiles claim against what the boards have."""

    allocated_mib: int
    physical_mib: int

    @property
    def allocated_gib(self) -> float:
        return self.allocated_mib / MIB_PER_GIB

    @property
    def physical_gib(self) -> float:
        return self.physical_mib / MIB_PER_GIB

    @property
    def percent(self) -> float | None:
        return 100 * self.allocated_mib / self.physical_mib if self.physical_mib else None


def frame_buffer(gpus: Iterable[GpuState]) -> FrameBuffer:
    """Allocated vs physical frame buffer of the GPUs in vGPU mode (passthrough GPUs belong to one VM whole)."""
    shared = [gpu for gpu in gpus if gpu.mode != "passthrough"]
    return FrameBuffer(
        allocated_mib=sum(gpu.used_fb_mib for gpu in shared),
        physical_mib=sum(gpu.model.fb_mib for gpu in shared),
    )

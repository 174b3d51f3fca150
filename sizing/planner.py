"""The density planner: how many identical GPU servers a mix of artists needs, and where each
artist's VM goes on them.

Pure functions over `fleet.placement` dataclasses, no ORM. Every placement decision is asked of
`placement.check_placement` on synthetic servers (GpuState / HostState / VmState), so a plan
obeys exactly the rules the inventory enforces: equal-size GPUs, maximum per GPU, frame buffer,
aligned mixed-size slots, multi-vGPU VMs on one host with board and series shared (full-GPU
profiles only on Turing boards), and the host's vCPUs and RAM with overcommit.

The main heuristic is first-fit decreasing: VMs sorted multi-vGPU first, then by frame buffer
per vGPU, vCPUs and RAM, each put on the first server that takes it (a new server when none
does). Within a server a vGPU prefers a GPU that already holds its size, so equal-size GPUs fill
up before an empty GPU is opened. Each vGPU of a multi-vGPU VM goes to a GPU of its own (that is
what a second GPU is for). When vCPUs or RAM run out before the GPUs, a balanced fill that pairs
GPU-heavy with CPU-heavy artists can need fewer servers; both run and the better plan is kept.
The plan carries a lower bound on servers from GPUs by size class, vCPUs and RAM, so a plan that
meets it is known to be optimal.

NVIDIA's Maya/Arnold sizing guide is the reference case (vgpu-facts.md section 5): modeling,
shading, animation and lighting artists on one 3 x Quadro RTX 6000 server, two 12Q on one GPU
and a 24Q on each of the two others.
"""

from __future__ import annotations

import math
from bisect import bisect_left
from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field, replace

from fleet import placement
from fleet.placement import GpuModelSpec, GpuState, HostState, PlacedVgpu, ProfileSpec, Violation, VmState, VmVgpu

GIB = 1024

#: Most artists one plan may hold: enough for a large studio, small enough to answer in seconds.
MAX_ARTISTS = 10_000
MAX_GPUS_PER_SERVER = 16

#: Refusals that are the planner's own, beside the `placement.Rule` codes.
RULE_VM_GPUS = "vm_gpus"  # a multi-vGPU VM needs a GPU per vGPU, on one server
RULE_NO_PROFILE = "no_profile"  # the server's board offers no profile of the series asked for

#: The heuristics `plan_density` compares; the plan names the one it kept.
FIRST_FIT_DECREASING = "first-fit decreasing"
BALANCED_FILL = "balanced fill"


@dataclass(frozen=True)
class ServerSpec:
    """One server configuration; a plan uses any number of identical copies of it."""

    gpu_model: GpuModelSpec
    gpus: int
    cpu_threads: int
    ram_gib: int
    vcpu_overcommit: float = 1.0
    ram_overcommit: float = 1.0
    size_mode: str = "equal"

    def host_state(self, index: int, name: str) -> HostState:
        """An empty host of this configuration, as `placement` reads hosts."""
        return HostState(
            id=index, name=name, cpu_threads=self.cpu_threads, ram_gib=self.ram_gib,
            vcpu_overcommit=self.vcpu_overcommit, ram_overcommit=self.ram_overcommit,
        )

    @property
    def vcpu_capacity(self) -> int:
        return self.host_state(0, "").vcpu_capacity

    @property
    def ram_capacity_gib(self) -> int:
        return self.host_state(0, "").ram_capacity_gib


@dataclass(frozen=True)
class ArtistDemand:
    """`count` artists who each need a VM with `vgpus` vGPUs of `profile`, `vcpus` and `ram_gib`.

    `profile` is None when the server's board has no profile for them; `note` then says why
    (and otherwise how a preset was translated to the board, e.g. "12 GiB preset -> A16-16Q").
    """

    label: str
    workflow: str | None
    profile: ProfileSpec | None
    vgpus: int = 1
    vcpus: int = 8
    ram_gib: int = 32
    count: int = 1
    note: str = ""


@dataclass(frozen=True)
class PlannedVgpu:
    """One vGPU of the plan: for whom (the demand row's label and index, the artist's number within
    the row, the VM's number within the plan, which the vGPUs of one multi-vGPU VM share) and at
    which slot of its GPU."""

    profile: ProfileSpec
    label: str
    workflow: str | None
    row: int
    artist: int
    vm: int
    placement_id: int
    #: The order the planner placed it in; replaying a plan in this order reproduces its slots.
    seq: int


@dataclass(frozen=True)
class GpuPlan:
    """One GPU of a planned server and the vGPUs on it, by slot."""

    index: int
    fb_total_mib: int
    vgpus: tuple[PlannedVgpu, ...]

    @property
    def fb_used_mib(self) -> int:
        return sum(v.profile.fb_mib for v in self.vgpus)


@dataclass(frozen=True)
class ServerPlan:
    """One planned server: its GPUs, the vCPUs and RAM its VMs claim, and how many artists it serves."""

    index: int
    gpus: tuple[GpuPlan, ...]
    vcpus_used: int
    vcpu_capacity: int
    ram_gib_used: int
    ram_capacity_gib: int
    artists: int


@dataclass(frozen=True)
class Unplaced:
    """Artists of one demand row that no server of this configuration can take, and why."""

    label: str
    workflow: str | None
    count: int
    rule: str
    reason: str


@dataclass(frozen=True)
class DensityPlan:
    """The planner's answer. `lower_bounds` gives the fewest servers each resource alone needs
    ("gpus", "vcpus", "ram"); `lower_bound_servers` is their maximum, so `servers` equal to it
    is optimal."""

    servers: int
    layout: tuple[ServerPlan, ...]
    unplaced: tuple[Unplaced, ...]
    lower_bound_servers: int
    lower_bounds: dict[str, int] = field(default_factory=dict)
    artists_placed: int = 0
    method: str = ""

    @property
    def optimal(self) -> bool:
        return self.servers == self.lower_bound_servers

    @property
    def artists_per_server(self) -> float | None:
        """Artists placed per server, one decimal; None when nothing was placed."""
        return round(self.artists_placed / self.servers, 1) if self.servers else None

    @property
    def usage_pct(self) -> dict[str, float]:
        """Share of the planned servers' frame buffer, vCPUs and RAM the VMs take, in percent."""
        def pct(used: int, capacity: int) -> float:
            return round(100 * used / capacity, 1) if capacity else 0.0

        return {
            "gpus": pct(sum(g.fb_used_mib for s in self.layout for g in s.gpus),
                        sum(g.fb_total_mib for s in self.layout for g in s.gpus)),
            "vcpus": pct(sum(s.vcpus_used for s in self.layout), sum(s.vcpu_capacity for s in self.layout)),
            "ram": pct(sum(s.ram_gib_used for s in self.layout), sum(s.ram_capacity_gib for s in self.layout)),
        }

    @property
    def limited_by(self) -> list[str]:
        """The resources whose bound is the highest: what to add to a server to fit more artists."""
        if not self.lower_bound_servers:
            return []
        return [name for name, bound in self.lower_bounds.items() if bound == self.lower_bound_servers]


# Profiles of a board ------------------------------------------------------------------------


def profile_for(fb_mib: int, series: str, gpu_model_name: str,
                profiles: Iterable[ProfileSpec]) -> ProfileSpec | None:
    """The smallest profile of `gpu_model_name` and `series` with at least `fb_mib` of frame
    buffer, capped at the board's largest (a whole GPU); None when the board has no profile of
    that series.

    Presets are sized in frame buffer so one workflow can be planned on any board: a 12 GiB
    modeling preset is 12Q on a Quadro RTX 6000 or an L40S and 16Q on an A16 (16 GB GPUs).
    """
    candidates = sorted(
        (p for p in profiles if p.gpu_model == gpu_model_name and p.series == series),
        key=lambda p: (p.fb_mib, p.id),
    )
    if not candidates:
        return None
    for candidate in candidates:
        if candidate.fb_mib >= fb_mib:
            return candidate
    return candidates[-1]


def board_profile(fb_mib: int, series: str, gpu_model: GpuModelSpec,
                  profiles: Iterable[ProfileSpec], vgpus: int = 1) -> tuple[ProfileSpec | None, str]:
    """`profile_for` with a note for people: empty when the board has that exact size, else how
    the size was translated, capped or why no profile exists.

    A need larger than the board's GPU becomes the whole-GPU profile rather than more vGPUs:
    the frame buffer of several vGPUs is not pooled (each GPU renders with its own), so extra
    vGPUs would not give a viewport the memory it asked for. The note says so, so the admin
    can choose a larger board instead.

    A VM of several `vgpus` on a board that combines only full-GPU profiles in one VM (Quadro
    RTX 6000/8000, T4) is given the whole-GPU profile for each: 2 x 24 GiB on a 48 GB Quadro
    RTX 8000 is 2 x RTX8000-48Q, as the vGPU manager would allow nothing smaller.
    """
    chosen = profile_for(fb_mib, series, gpu_model.name, profiles)
    if chosen is None:
        return None, f"{gpu_model.name} offers no {series}-series profile"
    if vgpus > 1 and gpu_model.multi_vgpu_full_only and chosen.fb_mib < gpu_model.fb_mib:
        whole = profile_for(gpu_model.fb_mib, series, gpu_model.name, profiles)
        if whole is not None and whole.fb_mib >= gpu_model.fb_mib:
            return whole, (f"{vgpus} vGPUs of {_gib(fb_mib)} -> {vgpus} x {whole.name}: on {gpu_model.name} a VM "
                           f"with several vGPUs may only use full-GPU profiles")
    if chosen.fb_mib == fb_mib:
        return chosen, ""
    if chosen.fb_mib < fb_mib:
        return chosen, (f"needs {_gib(fb_mib)} per vGPU; capped at {chosen.name}, a whole {gpu_model.name} "
                        f"({_gib(gpu_model.fb_mib)}): a larger board would serve it better")
    return chosen, f"{_gib(fb_mib)} per vGPU -> {chosen.name}, the smallest {gpu_model.name} profile that holds it"


def _gib(mib: int) -> str:
    return f"{mib / GIB:g} GiB"


# Lower bound ------------------------------------------------------------------------------


def lower_bounds(server: ServerSpec, demands: Sequence[ArtistDemand]) -> dict[str, int]:
    """The fewest servers each resource alone needs for `demands` (all assumed placeable).

    GPUs: in equal-size mode vGPUs of different sizes never share a GPU, so each size class
    needs ceil(vGPUs / per-GPU maximum) GPUs of its own; in mixed-size mode each vGPU takes its
    aligned span of the GPU (`placement.mixed_span_units`) and no profile exceeds its mixed
    maximum. vCPUs and RAM: the totals over one server's capacity.
    """
    demands = [d for d in demands if d.profile is not None and d.count > 0]
    if not demands:
        return {"gpus": 0, "vcpus": 0, "ram": 0}
    gpus_needed = 0
    if server.size_mode == "mixed":
        units = sum(placement.mixed_span_units(d.profile) * d.vgpus * d.count for d in demands)
        per_profile: dict[int, int] = defaultdict(int)
        for d in demands:
            per_profile[d.profile.id] += d.vgpus * d.count
        by_id = {d.profile.id: d.profile for d in demands}
        gpus_needed = max(
            math.ceil(units / placement.PLACEMENT_GRID),
            *(math.ceil(n / (by_id[pid].max_per_gpu_mixed or 1)) for pid, n in per_profile.items()),
        )
    else:
        vgpus_by_size: dict[int, int] = defaultdict(int)
        cap_by_size: dict[int, int] = defaultdict(int)
        for d in demands:
            vgpus_by_size[d.profile.fb_mib] += d.vgpus * d.count
            cap_by_size[d.profile.fb_mib] = max(cap_by_size[d.profile.fb_mib], d.profile.max_per_gpu)
        for size, n in vgpus_by_size.items():
            per_gpu = max(min(cap_by_size[size], server.gpu_model.fb_mib // size), 1)
            gpus_needed += math.ceil(n / per_gpu)
    vcpus = sum(d.vcpus * d.count for d in demands)
    ram_gib = sum(d.ram_gib * d.count for d in demands)
    return {
        "gpus": math.ceil(gpus_needed / server.gpus),
        "vcpus": math.ceil(vcpus / max(server.vcpu_capacity, 1)),
        "ram": math.ceil(ram_gib / max(server.ram_capacity_gib, 1)),
    }


# Planning ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Vm:
    """One artist's VM to place: its demand row, its number within the row, and its number in the
    whole request (rows in the order given), which also identifies it to the placement rules."""

    demand_index: int
    demand: ArtistDemand
    artist: int
    number: int

    @property
    def name(self) -> str:
        return f"{self.demand.label} #{self.artist}"

    @property
    def kind(self) -> tuple:
        """VMs of one kind are interchangeable: a server that refused one refuses the next."""
        d = self.demand
        return d.profile.id, d.vgpus, d.vcpus, d.ram_gib


def candidate_gpus(gpus: Sequence[GpuState], profile: ProfileSpec, exclude: set[int]) -> list[int]:
    """Ids of the GPUs to try for a vGPU of `profile`, best first: those already holding its size
    (keeps equal-size GPUs full), then other GPUs in use with the least free frame buffer first,
    then empty ones. The rules still decide on each; this only orders the questions."""
    same, other, empty = [], [], []
    for gpu in gpus:
        if gpu.id in exclude:
            continue
        if not gpu.vgpus:
            empty.append(gpu.id)
        elif any(v.profile.fb_mib == profile.fb_mib for v in gpu.vgpus):
            same.append(gpu.id)
        else:
            other.append(gpu.id)
    other.sort(key=lambda gpu_id: (gpus[gpu_id].free_fb_mib, gpu_id))
    return same + other + empty


def _gpu_might_take(gpu: GpuState, profile: ProfileSpec) -> bool:
    """Frame buffer free, and in equal-size mode an empty GPU or one of this size with a slot left:
    a shortcut that spares the rules questions they would refuse, never a rule of its own."""
    if gpu.free_fb_mib < profile.fb_mib:
        return False
    if gpu.size_mode == "equal" and gpu.vgpus:
        return gpu.vgpus[0].profile.fb_mib == profile.fb_mib and len(gpu.vgpus) < profile.max_per_gpu
    if gpu.size_mode == "mixed":
        same = sum(1 for v in gpu.vgpus if v.profile.id == profile.id)
        return same < (profile.max_per_gpu_mixed or 0)
    return True


class _Server:
    """A server being filled: placement states of its host and GPUs, and what was placed where."""

    def __init__(self, spec: ServerSpec, index: int, name: str):
        self.index = index
        self.host = spec.host_state(index, name)
        self.gpus = [
            GpuState(id=gpu_index, label=f"{gpu_index}", host_id=index, model=spec.gpu_model,
                     size_mode=spec.size_mode)
            for gpu_index in range(spec.gpus)
        ]
        self.planned: list[list[PlannedVgpu]] = [[] for _ in range(spec.gpus)]
        self.artists = 0
        #: (profile id, vGPUs) its GPUs refused: they refuse them for good, as they only fill up.
        self.gpus_refused: set[tuple[int, int]] = set()

    @property
    def free_vcpus(self) -> int:
        return self.host.vcpu_capacity - self.host.allocated_vcpus

    @property
    def free_ram_gib(self) -> int:
        return self.host.ram_capacity_gib - self.host.allocated_ram_gib

    def has_room_for(self, vm: _Vm) -> bool:
        """Whether the VM's vCPUs and RAM fit beside those already here (the rules' own figures)."""
        return vm.demand.vcpus <= self.free_vcpus and vm.demand.ram_gib <= self.free_ram_gib

    def gpus_might_take(self, vm: _Vm) -> bool:
        """Whether enough GPUs might take one of the VM's vGPUs each (see `_gpu_might_take`)."""
        return sum(1 for gpu in self.gpus if _gpu_might_take(gpu, vm.demand.profile)) >= vm.demand.vgpus

    def might_take(self, vm: _Vm) -> bool:
        """A cheap necessary condition, checked before asking the rules (which decide)."""
        return self.has_room_for(vm) and self.gpus_might_take(vm)

    def try_place(self, vm: _Vm, seq: int) -> list[Violation]:
        """Place every vGPU of `vm` here if the rules allow all of them; returns [] when placed,
        else the violations that refused it (nothing is kept of a VM placed half-way)."""
        d = vm.demand
        if d.vgpus > len(self.gpus):
            return [Violation(RULE_VM_GPUS, (
                f"{vm.demand.label} needs {d.vgpus} vGPUs, each on a GPU of its own in one server; "
                f"a server has {len(self.gpus)} GPUs"
            ))]
        vm_id = vm.number
        state = VmState(id=vm_id, name=vm.name, vcpus=d.vcpus, ram_gib=d.ram_gib)
        gpus = list(self.gpus)
        chosen: list[tuple[int, int]] = []
        for _ in range(d.vgpus):
            refusal: list[Violation] = []
            for gpu_id in candidate_gpus(gpus, d.profile, {g for g, _ in chosen}):
                decision = placement.check_placement(gpus[gpu_id], d.profile, state, self.host)
                if decision.ok:
                    gpus[gpu_id] = replace(gpus[gpu_id], vgpus=(
                        *gpus[gpu_id].vgpus, PlacedVgpu(d.profile, vm_id, decision.placement_id),
                    ))
                    state = replace(state, host_id=self.index, vgpus=(
                        *state.vgpus, VmVgpu(d.profile, gpu_id, self.index),
                    ))
                    chosen.append((gpu_id, decision.placement_id))
                    break
                refusal = refusal or decision.violations
            else:
                return refusal or [Violation(RULE_VM_GPUS, (
                    f"{vm.demand.label} needs {d.vgpus} vGPUs, each on a GPU of its own in one server"
                ))]
        self.gpus = gpus
        self.host = replace(
            self.host, allocated_vcpus=self.host.allocated_vcpus + d.vcpus,
            allocated_ram_gib=self.host.allocated_ram_gib + d.ram_gib,
        )
        for offset, (gpu_id, placement_id) in enumerate(chosen):
            self.planned[gpu_id].append(PlannedVgpu(
                profile=d.profile, label=d.label, workflow=d.workflow, row=vm.demand_index, artist=vm.artist, vm=vm_id,
                placement_id=placement_id, seq=seq + offset,
            ))
        self.artists += 1
        return []

    def is_sealed(self, min_vcpus: int, min_ram_gib: int, min_fb_mib: int) -> bool:
        """Whether no VM of the plan could still fit (so later searches skip this server)."""
        return (self.free_vcpus < min_vcpus or self.free_ram_gib < min_ram_gib
                or all(gpu.free_fb_mib < min_fb_mib for gpu in self.gpus))

    def result(self) -> ServerPlan:
        """The server as planned. GPUs are numbered in the order of the artist mix (the GPU holding
        the first-listed artist comes first, empty GPUs last); the GPUs of a server are identical,
        so this changes no rule and makes the layout read like the mix that was asked for."""

        def first_artist(gpu_id: int) -> tuple:
            placed = self.planned[gpu_id]
            if not placed:
                return (1, (0, 0), gpu_id)
            return (0, min((v.row, v.artist) for v in placed), gpu_id)

        order = sorted(range(len(self.gpus)), key=first_artist)
        return ServerPlan(
            index=self.index,
            gpus=tuple(
                GpuPlan(
                    index=position, fb_total_mib=self.gpus[gpu_id].model.fb_mib,
                    vgpus=tuple(sorted(self.planned[gpu_id], key=lambda v: (v.placement_id, v.seq))),
                )
                for position, gpu_id in enumerate(order)
            ),
            vcpus_used=self.host.allocated_vcpus, vcpu_capacity=self.host.vcpu_capacity,
            ram_gib_used=self.host.allocated_ram_gib, ram_capacity_gib=self.host.ram_capacity_gib,
            artists=self.artists,
        )


def plan_density(server: ServerSpec, demands: Sequence[ArtistDemand]) -> DensityPlan:
    """How many servers of `server`'s configuration `demands` need, and where each VM goes.

    Two deterministic heuristics run and the plan with fewer servers wins (first-fit
    decreasing on a tie): first-fit decreasing, which packs GPUs tightly, and a balanced fill
    that completes one server at a time with the VM whose needs best match what the server has
    left, which pairs GPU-heavy with CPU-heavy artists when vCPUs or RAM run out first. Artists
    that no empty server can take (a VM larger than a server, 12Q multi-vGPU on a Turing board,
    a board without the profile) are returned in `unplaced` with the rule that refused them;
    everything else is placed.
    """
    unplaced: list[Unplaced] = []
    placeable: list[tuple[int, ArtistDemand]] = []
    refusals: dict[tuple, Violation | None] = {}  # by kind: rows of one kind get the same answer
    for index, demand in enumerate(demands):
        if demand.count <= 0:
            continue
        if demand.profile is None:
            unplaced.append(Unplaced(demand.label, demand.workflow, demand.count, RULE_NO_PROFILE,
                                     demand.note or f"{server.gpu_model.name} has no profile for {demand.label}"))
            continue
        probe = _Vm(index, demand, 1, 1)
        if probe.kind not in refusals:
            refusals[probe.kind] = _refusal_on_empty_server(server, probe)
        refusal = refusals[probe.kind] and _refusal_on_empty_server(server, probe)  # in this row's words
        if refusal is not None:
            unplaced.append(Unplaced(demand.label, demand.workflow, demand.count, refusal.rule, refusal.message))
            continue
        placeable.append((index, demand))

    first_number = {}
    total = 0
    for index, demand in enumerate(demands):
        first_number[index] = total + 1
        total += max(demand.count, 0)
    vms = sorted(
        (_Vm(index, demand, artist, first_number[index] + artist - 1)
         for index, demand in placeable for artist in range(1, demand.count + 1)),
        key=lambda vm: (-vm.demand.vgpus, -vm.demand.profile.fb_mib, -vm.demand.vcpus, -vm.demand.ram_gib,
                        vm.demand.profile.id, vm.demand_index, vm.artist),
    )
    method, servers = FIRST_FIT_DECREASING, _first_fit(server, vms)
    if len(servers) > 1:
        balanced = _balanced_fill(server, vms)
        if len(balanced) < len(servers):
            method, servers = BALANCED_FILL, balanced
    bounds = lower_bounds(server, [demand for _, demand in placeable])
    return DensityPlan(
        servers=len(servers),
        layout=tuple(s.result() for s in servers),
        unplaced=tuple(unplaced),
        lower_bound_servers=max(bounds.values()),
        lower_bounds=bounds,
        artists_placed=len(vms),
        method=method,
    )


def _refusal_on_empty_server(server: ServerSpec, vm: _Vm) -> Violation | None:
    """Why a VM of this kind fits no server at all (None when an empty server takes it)."""
    violations = _Server(server, 0, "empty-server").try_place(vm, 0)
    return violations[0] if violations else None


def _new_server(spec: ServerSpec, servers: list[_Server]) -> _Server:
    server = _Server(spec, len(servers) + 1, f"server-{len(servers) + 1}")
    servers.append(server)
    return server


def _first_fit(spec: ServerSpec, vms: Sequence[_Vm]) -> list[_Server]:
    """First-fit over servers opened one by one; every VM here fits an empty server.

    Shortcuts keep 10,000 artists fast without changing the answer, because servers only fill
    up: a server that refused a VM refuses every later VM of the same kind, and one whose GPUs
    refused a profile refuses every later VM of that profile and vGPU count whatever its vCPUs
    and RAM, so each search starts past such servers; servers too full for the smallest VM
    leave the search.
    """
    if not vms:
        return []
    min_vcpus = min(vm.demand.vcpus for vm in vms)
    min_ram_gib = min(vm.demand.ram_gib for vm in vms)
    min_fb_mib = min(vm.demand.profile.fb_mib for vm in vms)
    servers: list[_Server] = []
    open_positions: list[int] = []  # positions in `servers` still worth trying, ascending
    start_at: dict[tuple, int] = {}  # kind -> position of the first server that may take it
    gpus_start_at: dict[tuple, int] = {}  # (profile, vGPUs) -> first server whose GPUs may take it
    seq = 0
    for vm in vms:
        gpu_class = (vm.demand.profile.id, vm.demand.vgpus)
        target = None
        cursor = bisect_left(open_positions, max(start_at.get(vm.kind, 0), gpus_start_at.get(gpu_class, 0)))
        refused_by_gpus_so_far = True
        while cursor < len(open_positions):
            position = open_positions[cursor]
            candidate = servers[position]
            if gpu_class in candidate.gpus_refused:
                pass
            elif candidate.has_room_for(vm):
                if candidate.gpus_might_take(vm) and not candidate.try_place(vm, seq):
                    target = candidate
                    break
                candidate.gpus_refused.add(gpu_class)  # with room for its vCPUs and RAM: the GPUs refused
            else:
                refused_by_gpus_so_far = False
            if refused_by_gpus_so_far:
                gpus_start_at[gpu_class] = position + 1
            cursor += 1
        if target is None:
            target = _new_server(spec, servers)
            open_positions.append(len(servers) - 1)
            _place_on_new(target, vm, seq)
        position = target.index - 1
        start_at[vm.kind] = position
        seq += vm.demand.vgpus
        if target.is_sealed(min_vcpus, min_ram_gib, min_fb_mib):
            open_positions.remove(position)
    return servers


def _balanced_fill(spec: ServerSpec, vms: Sequence[_Vm]) -> list[_Server]:
    """Fill one server at a time, each step adding the VM whose needs (share of the server's frame
    buffer, vCPUs and RAM) have the largest dot product with what the server has left.

    The "dot product" heuristic for vector bin packing (Panigrahy et al., "Heuristics for Vector
    Bin Packing", 2011): it prefers VMs that use what the server has most of, so a server whose
    GPUs are nearly full takes CPU-heavy artists and the other way round. Each step compares one
    candidate per profile and vGPU count (the largest VM of that class that fits the server's
    free vCPUs and RAM), in first-fit-decreasing order on a tie, so a step costs the same for a
    fleet of 10,000 VMs of all sizes as for a mix of four rows. A class a server refused stays
    refused there: the rules that refused it (GPU sizes and slots) only tighten as it fills.
    """
    classes: dict[tuple, _ClassQueue] = {}
    for vm in vms:
        classes.setdefault((vm.demand.profile.id, vm.demand.vgpus), _ClassQueue()).append(vm)
    remaining = len(vms)
    servers: list[_Server] = []
    fb_total = spec.gpus * spec.gpu_model.fb_mib
    seq = 0
    while remaining:
        server = _new_server(spec, servers)
        refused: set[tuple] = set()
        vcpu_cap, ram_cap = max(server.host.vcpu_capacity, 1), max(server.host.ram_capacity_gib, 1)
        while True:
            free = (sum(g.free_fb_mib for g in server.gpus) / fb_total,
                    server.free_vcpus / vcpu_cap, server.free_ram_gib / ram_cap)
            ranked = []
            for order, (key, queue) in enumerate(classes.items()):
                if key in refused or not queue:
                    continue
                position = queue.largest_fitting(server.free_vcpus, server.free_ram_gib)
                if position is None or not server.might_take(queue.vms[position]):
                    refused.add(key)
                    continue
                d = queue.vms[position].demand
                score = (d.vgpus * d.profile.fb_mib / fb_total * free[0] + d.vcpus / vcpu_cap * free[1]
                         + d.ram_gib / ram_cap * free[2])
                ranked.append((-score, order, key, position))
            ranked.sort()
            for _, _, key, position in ranked:
                if not server.try_place(classes[key].vms[position], seq):
                    seq += classes[key].pop(position).demand.vgpus
                    remaining -= 1
                    break
                refused.add(key)
            else:
                if not server.artists:  # every VM here fits an empty server: cannot happen
                    raise AssertionError("an empty server refused every remaining VM")
                break
    return servers


class _ClassQueue:
    """The VMs of one profile and vGPU count still to place, most vCPUs first (then most RAM)."""

    #: How many VMs past the first small enough in vCPUs are checked for RAM.
    RAM_SCAN = 32

    def __init__(self):
        self.vms: list[_Vm] = []
        self._neg_vcpus: list[int] = []  # ascending, for bisect

    def __bool__(self) -> bool:
        return bool(self.vms)

    def append(self, vm: _Vm) -> None:
        """Append in first-fit-decreasing order, which within a class is most vCPUs first."""
        self.vms.append(vm)
        self._neg_vcpus.append(-vm.demand.vcpus)

    def largest_fitting(self, free_vcpus: int, free_ram_gib: int) -> int | None:
        """Position of the first VM whose vCPUs and RAM fit, or None."""
        start = bisect_left(self._neg_vcpus, -free_vcpus)
        for position in range(start, min(start + self.RAM_SCAN, len(self.vms))):
            if self.vms[position].demand.ram_gib <= free_ram_gib:
                return position
        return None

    def pop(self, position: int) -> _Vm:
        del self._neg_vcpus[position]
        return self.vms.pop(position)


def _place_on_new(server: _Server, vm: _Vm, seq: int) -> None:
    if server.try_place(vm, seq):  # checked on an empty server before planning
        raise AssertionError(f"{vm.name} was refused by an empty server")

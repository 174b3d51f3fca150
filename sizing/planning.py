"""The density planner's Django layer: turns a request (from the API or the planner page) into
`sizing.planner` inputs read from the database, and runs the plan.

Two ways to say who the artists are:
- a mix of rows, each a workflow (its `WorkflowPreset`, translated to the server's board by
  frame buffer) or an explicit profile of that board, with a count and optional vCPU, RAM and
  vGPU overrides;
- "from measurements": the fleet's VMs themselves (or those on some hosts), each with the
  profile its right-sizing suggestion advises (a resize not dismissed), else its current one,
  translated to the server's board, and its own vCPUs and RAM. This is the proof-of-concept
  workflow NVIDIA's sizing guide recommends, done with the studio's own measurements.

With `measured_cpu_ram`, a workflow row's vCPUs and RAM come from the fleet instead of the
preset: the right-sized vCPUs and RAM (`sizing.guest_engine`'s advice where it advises a change,
else what the VM has) of the fleet's VMs of that workflow whose guest was measured, the 75th
percentile of them (most artists of the workflow get at least what they use); the preset where
the fleet has none. In "from measurements" mode each VM is planned with its own right-sized
vCPUs and RAM.

Reads only, in a fixed number of queries whatever the number of rows or VMs.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass

from django.db.models import F

from fleet import placement
from fleet.choices import Workflow
from fleet.models import GpuModel, Host, Vgpu, VgpuProfile, VirtualMachine
from sizing import planner
from sizing.models import Suggestion, SuggestionAction, WorkflowPreset
from telemetry.aggregation import percentile_nearest_rank

#: vCPUs and RAM of an artist row given by profile, without overrides (the VM model's defaults).
DEFAULT_VCPUS = 8
DEFAULT_RAM_GIB = 32

#: Sources of the profile a VM is planned with in "from measurements" mode.
SOURCE_SUGGESTED = "suggested"
SOURCE_CURRENT = "current"

#: The sizing guide's example (vgpu-facts.md section 5): the planner page opens on it.
GUIDE_GPU_MODEL = "Quadro RTX 6000"
GUIDE_SERVER = {"gpus": 3, "cpu_threads": 72, "ram_gib": 384}
GUIDE_ARTISTS = ("modeling", "shading", "animation", "lighting")


class TooManyVms(Exception):
    """A "from measurements" plan would hold more VMs than one plan may (`planner.MAX_ARTISTS`)."""


@dataclass(frozen=True)
class ArtistRow:
    """One row of an artist mix: a workflow or an explicit profile, how many, and overrides."""

    count: int
    workflow: str | None = None
    profile: VgpuProfile | None = None
    vcpus: int | None = None
    ram_gib: int | None = None
    vgpus: int | None = None
    label: str = ""


@dataclass(frozen=True)
class PlanRequest:
    """A validated planning request: one server configuration and who is to be served."""

    gpu_model: GpuModel
    gpus: int
    cpu_threads: int
    ram_gib: int
    vcpu_overcommit: float = 1.0
    ram_overcommit: float = 1.0
    size_mode: str = "equal"
    artists: tuple[ArtistRow, ...] = ()
    from_measurements: bool = False
    host_ids: tuple[int, ...] = ()
    measured_cpu_ram: bool = False
    vm_ids: tuple[int, ...] = ()  # "from measurements": only these VMs (a study's group)


@dataclass(frozen=True)
class MeasuredVm:
    """How one VM entered a "from measurements" plan: the profile it starts from (suggested or
    current), the profile it is planned with on the server's board, and why."""

    vm_id: int
    vm_name: str
    host: str | None
    workflow: str | None
    current_profile: str
    vgpus: int
    source: str
    source_profile: str
    planned_profile: str | None
    reason: str


@dataclass(frozen=True)
class PlanResult:
    request: PlanRequest
    server: planner.ServerSpec
    demands: tuple[planner.ArtistDemand, ...]
    plan: planner.DensityPlan
    measured: tuple[MeasuredVm, ...] | None = None


# Reads ------------------------------------------------------------------------------------


def profile_specs(gpu_model: GpuModel) -> list[placement.ProfileSpec]:
    """Every profile of one board as placement specs (one query)."""
    return [
        placement.ProfileSpec(
            id=p.pk, name=p.name, gpu_model=gpu_model.name, series=p.series, fb_mib=p.fb_mib,
            max_per_gpu=p.max_per_gpu, max_per_gpu_mixed=p.max_per_gpu_mixed, max_per_vm=p.max_per_vm,
        )
        for p in VgpuProfile.objects.filter(gpu_model=gpu_model).order_by("fb_mib", "id")
    ]


def presets_by_workflow() -> dict[str, WorkflowPreset]:
    """The workflow presets, by workflow (one query)."""
    return {preset.workflow: preset for preset in WorkflowPreset.objects.order_by("workflow")}


def workflow_label(workflow: str) -> str:
    return Workflow(workflow).label if workflow in Workflow.values else workflow


# Building the planner's inputs --------------------------------------------------------------


def server_spec(request: PlanRequest) -> planner.ServerSpec:
    return planner.ServerSpec(
        gpu_model=request.gpu_model.to_spec(), gpus=request.gpus, cpu_threads=request.cpu_threads,
        ram_gib=request.ram_gib, vcpu_overcommit=request.vcpu_overcommit,
        ram_overcommit=request.ram_overcommit, size_mode=request.size_mode,
    )


@dataclass(frozen=True)
class MeasuredSize:
    """The vCPUs and RAM the fleet's measured VMs of one workflow need (see the module docstring)."""

    vcpus: int | None
    ram_gib: int | None
    vms: int


def _right_sized(action: str, suggested: int | None, current: int) -> int | None:
    """A VM's right-sized vCPUs or RAM: the advised size, what it has when advised to keep it, or
    None when its guest was not measured enough to say."""
    if action in (SuggestionAction.UPSIZE, SuggestionAction.DOWNSIZE) and suggested:
        return suggested
    return current if action == SuggestionAction.KEEP else None


def measured_sizes() -> dict[str, MeasuredSize]:
    """By workflow, the 75th percentile of the right-sized vCPUs and RAM of the fleet's VMs of
    that workflow whose guest was measured (one query)."""
    rows = (Suggestion.objects.filter(vm__artist__isnull=False).exclude(dismissed_key=F("evidence_key"))
            .values_list("vm__artist__workflow", "cpu_action", "suggested_vcpus", "vm__vcpus", "ram_action",
                         "suggested_ram_gib", "vm__ram_gib"))
    vcpus: dict[str, list[int]] = defaultdict(list)
    ram: dict[str, list[int]] = defaultdict(list)
    for workflow, cpu_action, suggested_vcpus, vm_vcpus, ram_action, suggested_ram, vm_ram in rows:
        if (sized := _right_sized(cpu_action, suggested_vcpus, vm_vcpus)) is not None:
            vcpus[workflow].append(sized)
        if (sized := _right_sized(ram_action, suggested_ram, vm_ram)) is not None:
            ram[workflow].append(sized)
    return {workflow: MeasuredSize(
        vcpus=percentile_nearest_rank(vcpus[workflow], 75) if vcpus[workflow] else None,
        ram_gib=percentile_nearest_rank(ram[workflow], 75) if ram[workflow] else None,
        vms=max(len(vcpus[workflow]), len(ram[workflow])),
    ) for workflow in set(vcpus) | set(ram)}


def preset_demand(preset: WorkflowPreset, server: planner.ServerSpec, profiles: list[placement.ProfileSpec],
                  row: ArtistRow | None = None, measured: MeasuredSize | None = None) -> planner.ArtistDemand:
    """The demand of artists of one workflow: the preset's frame buffer translated to the
    server's board (`planner.board_profile`), with the row's overrides where given, else the
    fleet's `measured` vCPUs and RAM where given, else the preset's."""
    row = row or ArtistRow(count=1, workflow=preset.workflow)
    profile, note = planner.board_profile(preset.fb_mib, preset.series, server.gpu_model, profiles,
                                          row.vgpus or preset.vgpus)
    vcpus = row.vcpus or (measured and measured.vcpus) or preset.vcpus
    ram_gib = row.ram_gib or (measured and measured.ram_gib) or preset.ram_gib
    if measured is not None and ((not row.vcpus and measured.vcpus) or (not row.ram_gib and measured.ram_gib)):
        what = " and ".join(name for name, used in (("vCPUs", not row.vcpus and measured.vcpus),
                                                    ("RAM", not row.ram_gib and measured.ram_gib)) if used)
        note = "; ".join(part for part in (note, f"{what} measured on {measured.vms} VM(s) of the fleet") if part)
    return planner.ArtistDemand(
        label=row.label or workflow_label(preset.workflow), workflow=preset.workflow, profile=profile,
        vgpus=row.vgpus or preset.vgpus, vcpus=vcpus, ram_gib=ram_gib, count=row.count, note=note,
    )


def profile_demand(row: ArtistRow) -> planner.ArtistDemand:
    """The demand of artists given by an explicit profile (already checked to be of the server's board)."""
    return planner.ArtistDemand(
        label=row.label or row.profile.name, workflow=row.workflow, profile=row.profile.to_spec(),
        vgpus=row.vgpus or 1, vcpus=row.vcpus or DEFAULT_VCPUS, ram_gib=row.ram_gib or DEFAULT_RAM_GIB,
        count=row.count,
    )


def mix_demands(request: PlanRequest, server: planner.ServerSpec, profiles: list[placement.ProfileSpec],
                presets: dict[str, WorkflowPreset] | None = None) -> list[planner.ArtistDemand]:
    """The demands of an artist mix, one per row, in the order given."""
    if presets is None:
        presets = presets_by_workflow() if any(row.profile is None for row in request.artists) else {}
    sizes = measured_sizes() if request.measured_cpu_ram else {}
    demands = []
    for row in request.artists:
        if row.profile is not None:
            demands.append(profile_demand(row))
        else:
            demands.append(preset_demand(presets[row.workflow], server, profiles, row, sizes.get(row.workflow)))
    return demands


def measured_demands(request: PlanRequest, server: planner.ServerSpec,
                     profiles: list[placement.ProfileSpec]) -> tuple[list[planner.ArtistDemand], list[MeasuredVm]]:
    """One demand per VM that holds vGPUs (on the requested hosts, or anywhere), planned with its
    suggested profile where a resize is advised and not dismissed, else its current profile.

    A VM's vGPUs share board and series; where their sizes differ the largest stands for all of
    them, so the plan never gives a VM less than it has. Three queries; `TooManyVms` when
    there are more VMs than one plan takes.
    """
    vgpus = Vgpu.objects.order_by("vm_id", "id")
    if request.host_ids:
        vgpus = vgpus.filter(vm__host_id__in=request.host_ids)
    if request.vm_ids:
        vgpus = vgpus.filter(vm_id__in=request.vm_ids)
    held: dict[int, list[int]] = defaultdict(list)
    for vm_id, profile_id in vgpus.values_list("vm_id", "profile_id"):
        held[vm_id].append(profile_id)
    if len(held) > planner.MAX_ARTISTS:
        raise TooManyVms(f"{len(held):,} VMs hold vGPUs on these hosts; one plan takes at most "
                         f"{planner.MAX_ARTISTS:,}: choose some hosts.")
    catalog = {p.pk: p for p in VgpuProfile.objects.select_related("gpu_model")}
    vms = (
        VirtualMachine.objects.filter(pk__in=vgpus.values("vm_id"))
        .select_related("artist", "host", "suggestion")
        .order_by("name", "id")
    )
    demands, measured = [], []
    for vm in vms:
        current = max((catalog[pid] for pid in held[vm.pk]), key=lambda p: (p.fb_mib, p.pk))
        count = len(held[vm.pk])
        source, start, vgpu_count, reason = _measured_choice(vm, current, count, catalog)
        profile, note = planner.board_profile(start.fb_mib, start.series, server.gpu_model, profiles, vgpu_count)
        workflow = vm.artist.workflow if vm.artist else None
        vcpus, ram_gib = vm.vcpus, vm.ram_gib
        suggestion: Suggestion | None = getattr(vm, "suggestion", None)
        if request.measured_cpu_ram and suggestion is not None and not suggestion.is_dismissed:
            vcpus = _right_sized(suggestion.cpu_action, suggestion.suggested_vcpus, vm.vcpus) or vm.vcpus
            ram_gib = _right_sized(suggestion.ram_action, suggestion.suggested_ram_gib, vm.ram_gib) or vm.ram_gib
        demands.append(planner.ArtistDemand(
            label=vm.name, workflow=workflow, profile=profile, vgpus=vgpu_count, vcpus=vcpus,
            ram_gib=ram_gib, count=1, note=note,
        ))
        measured.append(MeasuredVm(
            vm_id=vm.pk, vm_name=vm.name, host=vm.host.name if vm.host else None, workflow=workflow,
            current_profile=current.name, vgpus=vgpu_count, source=source, source_profile=start.name,
            planned_profile=profile.name if profile else None,
            reason="; ".join(part for part in (reason, note) if part),
        ))
    return demands, measured


def _measured_choice(vm: VirtualMachine, current: VgpuProfile, count: int,
                     catalog: dict[int, VgpuProfile]) -> tuple[str, VgpuProfile, int, str]:
    """(source, profile to start from, vGPUs, why) for one VM of a "from measurements" plan."""
    suggestion: Suggestion | None = getattr(vm, "suggestion", None)
    if suggestion is None:
        return SOURCE_CURRENT, current, count, "no right-sizing suggestion yet"
    resize = suggestion.action in (SuggestionAction.UPSIZE, SuggestionAction.DOWNSIZE)
    if resize and suggestion.suggested_profile_id in catalog and not suggestion.is_dismissed:
        suggested = catalog[suggestion.suggested_profile_id]
        vgpu_count = suggestion.suggested_vgpus or count
        return SOURCE_SUGGESTED, suggested, vgpu_count, (
            f"{suggestion.get_action_display().lower()} suggested: {suggestion.reason}".rstrip(": ")
        )
    if resize and suggestion.is_dismissed:
        return SOURCE_CURRENT, current, count, "suggestion dismissed by an admin"
    return SOURCE_CURRENT, current, count, f"suggestion: {suggestion.get_action_display().lower()}"


def run_plan(request: PlanRequest, *, presets: dict[str, WorkflowPreset] | None = None,
             profiles: list[placement.ProfileSpec] | None = None) -> PlanResult:
    """Plan `request`: read what it needs (unless the caller already holds the presets and the
    board's profiles), then ask the pure planner."""
    server = server_spec(request)
    if profiles is None:
        profiles = profile_specs(request.gpu_model)
    measured = None
    if request.from_measurements:
        demands, measured = measured_demands(request, server, profiles)
    else:
        demands = mix_demands(request, server, profiles, presets)
    return PlanResult(
        request=request, server=server, demands=tuple(demands),
        plan=planner.plan_density(server, demands), measured=tuple(measured) if measured is not None else None,
    )


# Validation shared by the API and the page ------------------------------------------------


def host_ids_unknown(host_ids) -> list[int]:
    """The ids in `host_ids` that name no host (one query)."""
    wanted = set(host_ids)
    return sorted(wanted - set(Host.objects.filter(pk__in=wanted).values_list("pk", flat=True)))


def profile_board_error(profile: VgpuProfile, gpu_model: GpuModel) -> str | None:
    """Why an explicit profile cannot be planned on this board, or None."""
    if profile.gpu_model_id != gpu_model.pk:
        return (f"{profile.name} is a profile of {profile.gpu_model.name} GPUs; this server has {gpu_model.name} "
                f"GPUs. Choose a {gpu_model.name} profile or a workflow.")
    return None


def total_artists_error(counts) -> str | None:
    """Why artist rows with these counts are too many for one plan, or None."""
    total = sum(counts)
    if total > planner.MAX_ARTISTS:
        return f"At most {planner.MAX_ARTISTS:,} artists in one plan; these rows ask for {total:,}."
    return None


def size_mode_error(gpu_model: GpuModel, size_mode: str) -> str | None:
    """Why a server of this board cannot run in `size_mode`, by the placement rules, or None."""
    empty = placement.GpuState(id=0, label="", host_id=0, model=gpu_model.to_spec())
    violations = placement.check_gpu_change(empty, "vgpu", size_mode)
    return violations[0].message if violations else None

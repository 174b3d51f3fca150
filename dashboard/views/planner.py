"""The density planner page (`/sizing/planner/`): staff only.

A plain GET form, so every plan is a link and the page works without JavaScript: a server
configuration and an artist mix (rows of workflow or profile, count, overrides; "Add row"
submits the form with one more blank row), or "From measurements" (the fleet's VMs with their
suggested profiles). With no parameters it opens on NVIDIA's sizing-guide example, four
artists on a 3 x Quadro RTX 6000 server, and shows its result. Invalid input re-renders the
form as typed, with each message next to its field, and status 400.

The result is drawn with CSS only: a server as a row of GPU columns whose height is the frame
buffer, vGPUs as blocks coloured by workflow, bars for vCPUs and RAM. Identical servers are
drawn once with their count. The queries are fixed whatever the number of rows or VMs.
"""

from __future__ import annotations

import contextlib
import dataclasses
from dataclasses import dataclass

from django.http import QueryDict
from django.shortcuts import render
from django.urls import reverse

from config import parsing
from dashboard.access import staff_required
from fleet.choices import Workflow
from sizing import planner, planning
from sizing.forms import (
    ARTISTS_PREFIX,
    MAX_ARTIST_ROWS,
    WORKFLOW_PREFIX,
    ArtistFormSet,
    PlannerCatalog,
    PlannerServerForm,
)
from sizing.models import WorkflowPreset

TEMPLATE = "sizing/planner.html"
#: Blank rows offered under the artist mix; "Add row" adds one more.
BLANK_ROWS = 2
#: Distinct server layouts drawn; a larger plan lists the rest by count.
MAX_DRAWN_LAYOUTS = 12
#: A block shorter than this share of its GPU column shows its text only as a tooltip.
MIN_LABELLED_PCT = 9
LIMIT_LABELS = {"gpus": "GPU frame buffer", "vcpus": "vCPUs", "ram": "RAM"}


@dataclass(frozen=True)
class Block:
    """One vGPU as drawn: its share of the GPU column, text and colour class."""

    pct: float
    profile: str
    size: str
    label: str
    css: str
    labelled: bool


@dataclass(frozen=True)
class ServerGroup:
    """Servers with the same layout, drawn once: numbers `first`..`last`. `columns` is the
    drawing of each GPU (see `draw_columns`)."""

    first: int
    last: int
    server: planner.ServerPlan
    columns: tuple[dict, ...] = ()

    @property
    def count(self) -> int:
        return self.last - self.first + 1

    @property
    def vcpu_pct(self) -> int:
        return _pct(self.server.vcpus_used, self.server.vcpu_capacity)

    @property
    def ram_pct(self) -> int:
        return _pct(self.server.ram_gib_used, self.server.ram_capacity_gib)


def draw_columns(server: planner.ServerPlan, row_counts: list[int], numbered: bool = True) -> tuple[dict, ...]:
    """Per GPU: its blocks bottom-up by slot and the figures under it. A block is named by its
    row's label, with the artist's number when the row has several artists and the drawing
    stands for one server (a group of alike servers holds other artists of the same rows)."""
    columns = []
    for gpu in server.gpus:
        blocks = []
        for v in gpu.vgpus:
            pct = 100 * v.profile.fb_mib / gpu.fb_total_mib
            label = f"{v.label} #{v.artist}" if numbered and row_counts[v.row] > 1 else v.label
            blocks.append(Block(
                pct=round(pct, 2), profile=v.profile.name, size=v.profile.name.rsplit("-", 1)[-1], label=label,
                css=f"wf-{v.workflow}" if v.workflow in Workflow.values else "wf-none",
                labelled=pct >= MIN_LABELLED_PCT,
            ))
        columns.append({
            "index": gpu.index, "blocks": blocks, "fb_used_gib": gpu.fb_used_mib / 1024,
            "fb_total_gib": gpu.fb_total_mib / 1024,
        })
    return tuple(columns)


def _pct(used: int, capacity: int) -> int:
    return min(round(100 * used / capacity), 100) if capacity else 0


def _layout_key(server: planner.ServerPlan) -> tuple:
    return (
        tuple(tuple((v.profile.id, v.label) for v in gpu.vgpus) for gpu in server.gpus),
        server.vcpus_used, server.ram_gib_used,
    )


def group_servers(layout: tuple[planner.ServerPlan, ...]) -> list[ServerGroup]:
    """Consecutive servers with the same layout (profiles and artist rows per GPU, vCPUs, RAM)
    as one group: a plan of 40 servers of six modelers each reads as one drawing."""
    groups: list[ServerGroup] = []
    for server in layout:
        if groups and _layout_key(groups[-1].server) == _layout_key(server):
            groups[-1] = ServerGroup(groups[-1].first, server.index, groups[-1].server)
        else:
            groups.append(ServerGroup(server.index, server.index, server))
    return groups


def guide_query(catalog: PlannerCatalog) -> QueryDict:
    """The form's data for the sizing guide's example, with blank rows to add to it."""
    data = QueryDict(mutable=True)
    model = catalog.guide_model()
    data.update({
        "gpu_model": str(model.pk) if model else "", **{k: str(v) for k, v in planning.GUIDE_SERVER.items()},
        "vcpu_overcommit": "1", "ram_overcommit": "1", "size_mode": "equal",
    })
    rows = planning.GUIDE_ARTISTS
    data.update(_management(len(rows) + BLANK_ROWS))
    for index, workflow in enumerate(rows):
        data[f"{ARTISTS_PREFIX}-{index}-demand"] = WORKFLOW_PREFIX + workflow
        data[f"{ARTISTS_PREFIX}-{index}-count"] = "1"
    return data


def _management(total: int) -> dict[str, str]:
    return {f"{ARTISTS_PREFIX}-TOTAL_FORMS": str(total), f"{ARTISTS_PREFIX}-INITIAL_FORMS": "0"}


def _submitted(query: QueryDict) -> bool:
    return "gpu_model" in query or f"{ARTISTS_PREFIX}-TOTAL_FORMS" in query


def _with_added_row(query: QueryDict) -> QueryDict:
    """The query with one more blank row ("Add row" works without JavaScript)."""
    data = query.copy()
    key = f"{ARTISTS_PREFIX}-TOTAL_FORMS"
    with contextlib.suppress(parsing.ParseError):  # the formset reports a damaged management form itself
        data[key] = str(parsing.parse_int(data.get(key, ""), minimum=0, maximum=MAX_ARTIST_ROWS) + 1)
    data.pop("add_row", None)
    return data


@staff_required
def planner_page(request):
    """The form, its plan when the form is valid (400 with the messages when not), and the presets."""
    catalog = PlannerCatalog.load()
    query = request.GET if _submitted(request.GET) else guide_query(catalog)
    if "add_row" in query:
        query = _with_added_row(query)
    server_form = PlannerServerForm(query, catalog=catalog)
    server_valid = server_form.is_valid()
    formset = ArtistFormSet(query, prefix=ARTISTS_PREFIX, form_kwargs={
        "catalog": catalog, "demand_choices": catalog.demand_choices(), "board": server_form.board(),
    })
    rows_valid = formset.is_valid()
    mix_error = None
    from_measurements = server_valid and server_form.cleaned_data["from_measurements"]
    if server_valid and rows_valid and not from_measurements and not formset.filled_rows():
        mix_error = "Add at least one artist row, or plan From measurements."
    valid = server_valid and (from_measurements or (rows_valid and not mix_error))
    result = None
    if valid:
        try:
            result = planning.run_plan(_plan_request(server_form.cleaned_data, formset), presets=catalog.presets,
                                       profiles=catalog.profile_specs(server_form.cleaned_data["gpu_model"]))
        except planning.TooManyVms as exc:
            server_form.add_error("hosts", str(exc))
            valid = False
    context = {
        "invalid": not valid,
        "server_form": server_form,
        "formset": formset,
        "mix_error": mix_error,
        "result": result,
        "presets": _preset_rows(catalog, server_form.board() or catalog.guide_model()),
        "presets_admin_url": reverse("admin:sizing_workflowpreset_changelist"),
        "guide_url": reverse("sizing:planner"),
        "api_url": reverse("sizing-plan"),
    }
    if result is not None:
        context.update(_result_context(result))
    return render(request, TEMPLATE, context, status=200 if valid else 400)


def _plan_request(data: dict, formset) -> planning.PlanRequest:
    """The validated server form's data and artist rows as a planning request."""
    from_measurements = data["from_measurements"]
    return planning.PlanRequest(
        gpu_model=data["gpu_model"], gpus=data["gpus"], cpu_threads=data["cpu_threads"], ram_gib=data["ram_gib"],
        vcpu_overcommit=data["vcpu_overcommit"], ram_overcommit=data["ram_overcommit"], size_mode=data["size_mode"],
        artists=() if from_measurements else tuple(formset.filled_rows()), from_measurements=from_measurements,
        host_ids=tuple(data.get("hosts") or ()), measured_cpu_ram=data.get("measured_cpu_ram", False),
    )


def _result_context(result: planning.PlanResult) -> dict:
    plan = result.plan
    row_counts = [demand.count for demand in result.demands]
    groups = group_servers(plan.layout)
    drawn = [dataclasses.replace(group, columns=draw_columns(group.server, row_counts, numbered=group.count == 1))
             for group in groups[:MAX_DRAWN_LAYOUTS]]
    hidden = groups[MAX_DRAWN_LAYOUTS:]
    return {
        "plan": plan,
        "server_groups": drawn,
        "hidden_groups": hidden,
        "hidden_servers": sum(group.count for group in hidden),
        "measured": sorted(result.measured or (), key=lambda vm: (vm.source != planning.SOURCE_SUGGESTED,
                                                                   vm.vm_name)),
        "limited_by": [LIMIT_LABELS[name] for name in plan.limited_by],
        "usage": [(LIMIT_LABELS[name], pct) for name, pct in plan.usage_pct.items()],
        "busiest": max(((LIMIT_LABELS[name], pct) for name, pct in plan.usage_pct.items()), key=lambda i: i[1]),
        "over_bound": plan.servers - plan.lower_bound_servers,
        "legend": _legend(plan),
        # From measurements, each VM's translation is in its row of the VM table instead.
        "translated": [d for d in result.demands if d.note] if result.measured is None else [],
    }


def _legend(plan: planner.DensityPlan) -> list[tuple[str, str]]:
    """(css class, label) of each workflow the drawing uses, in the order of `Workflow`."""
    used = {v.workflow for server in plan.layout for gpu in server.gpus for v in gpu.vgpus}
    legend = [(f"wf-{value}", label) for value, label in Workflow.choices if value in used]
    if None in used:
        legend.append(("wf-none", "No workflow"))
    return legend


@dataclass(frozen=True)
class PresetRow:
    """A preset as the presets table shows it, with the profile it gets on the chosen board."""

    preset: WorkflowPreset
    profile: str | None
    note: str
    change_url: str

    @property
    def fb_gib(self) -> float:
        return self.preset.fb_mib / 1024


def _preset_rows(catalog: PlannerCatalog, board) -> dict:
    """The presets with the profile each gets on `board`, and where to edit them."""
    rows = []
    specs = catalog.profile_specs(board) if board is not None else []
    for preset in catalog.presets.values():
        profile, note = (planner.board_profile(preset.fb_mib, preset.series, board.to_spec(), specs)
                         if board is not None else (None, ""))
        rows.append(PresetRow(
            preset=preset, profile=profile.name if profile else None, note=note,
            change_url=reverse("admin:sizing_workflowpreset_change", args=[preset.pk]),
        ))
    return {"board": board, "rows": rows}

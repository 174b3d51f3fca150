"""The heatmap page (`/heatmap/`): GPU × time, VM × time (frame buffer against the profile, GPU
load and the guest's CPU and memory) and host × hour of week, drawn in the browser by
static/js/heatmap.js from `/api/v1/heatmap/`.

The page reads no telemetry itself: it validates the controls, resolves the time range and
renders the API's parameters into data-* attributes, so the page and the API can never show
different figures. The controls are a plain GET form, so every view is a shareable URL and the
controls work without JavaScript; a bad parameter renders the page with status 400, the
message and the controls (with what the user typed), never a traceback.

Queries are fixed whatever the fleet's size: one aggregate for the agents' health (no agents
at all, how many stale or in error) and one for the host filter's choices.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime

from django import forms
from django.conf import settings
from django.http import QueryDict
from django.shortcuts import render
from django.urls import reverse
from django.utils import timezone
from django.utils.html import format_html

from config import parsing
from dashboard.access import staff_required
from dashboard.forms import RangeForm
from fleet.models import Host
from telemetry.heatmap import shared_end
from telemetry.metrics import METRICS
from telemetry.queries import agent_status_counts
from telemetry.ranges import PRESET_LABELS, PRESETS, TimeRange

TEMPLATE = "telemetry/heatmap.html"

STAT_LABELS = {"avg": "mean", "max": "max", "p95": "95th percentile"}
SORT_LABELS = {"host": "By host", "peak": "By peak", "mean": "By mean"}
#: Presets too short for an hour-of-week fold (most of its 168 columns would stay empty); switching
#: to the host view from one of them opens that view's own default range instead.
SHORT_FOR_FOLD = ("6h", "24h")


@dataclass(frozen=True)
class HeatmapView:
    """One of the page's three pictures: the API's `group` and `fold`, the metrics it offers
    (name -> label, in menu order) and what a cell means (the legend under the chart)."""

    key: str
    label: str
    group: str
    fold: str
    metrics: dict[str, str]
    default_metric: str
    default_range: str
    row_noun: str
    legend: str
    reading: str


_GPU_METRICS = {
    "util_gpu": "GPU utilization",
    "fb_used_pct": "Frame buffer used %",
    "enc_util": "Encoder utilization",
    "dec_util": "Decoder utilization",
    "temp_c": "Temperature",
    "power_w": "Power",
}

VIEWS = {view.key: view for view in (
    HeatmapView(
        key="gpu", label="GPU × time", group="gpu", fold="none", metrics=_GPU_METRICS,
        default_metric="util_gpu", default_range="24h", row_noun="GPUs",
        legend="Each cell: {metric} ({stat}) of one GPU over {step}.",
        reading="Rows sorted by host are grouped under their host, with a line between hosts. "
                "Click a cell to open that GPU at that time. Past 200 GPUs, a row is a host (or a group of "
                "GPUs) showing the highest value of its GPUs: click it to show them.",
    ),
    HeatmapView(
        key="vm", label="VM × time: frame buffer vs profile", group="vm", fold="none",
        metrics={
            "fb_used_pct": "Frame buffer % of profile",
            "util_gpu": "GPU utilization",
            "enc_util": "Encoder utilization",
            "dec_util": "Decoder utilization",
            "vcpu_util": "Guest CPU (all vCPUs)",
            "vcpu_max_util": "Guest busiest vCPU",
            "cpu_steal_pct": "Guest CPU steal",
            "ram_used_pct": "Guest memory % of RAM",
            "ram_used_mib": "Guest memory used",
        },
        default_metric="fb_used_pct", default_range="24h", row_noun="VMs",
        legend="Each cell: {metric} ({stat}) of one VM over {step}.",
        reading="Frame buffer used as a share of the VM's profile: rows that stay dark are over-provisioned "
                "(a smaller profile would do); rows near the top of the scale are short of frame buffer. "
                "The guest's CPU and memory are read through its hypervisor, no agent in the guest: a guest "
                "that reports no memory use shows gaps, not zero. Click a cell to open that VM at that time. "
                "Past 200 VMs, a row is a host's VMs (or a group of VMs) with the highest value of its VMs: "
                "click it to show them.",
    ),
    HeatmapView(
        key="host", label="Host × hour of week", group="host", fold="hour_of_week", metrics=_GPU_METRICS,
        default_metric="util_gpu", default_range="30d", row_noun="hosts",
        legend="Each cell: {metric} ({stat}) of one host's GPUs in that hour of the week (their mean; their "
               "highest for max and 95th percentile), averaged over the weeks in the range; hours in the "
               "studio's time zone ({tz}).",
        reading="Columns that stay dark across every host are the studio's quiet hours: good maintenance "
                "windows. Click a row to open that host.",
    ),
)}
DEFAULT_VIEW = "gpu"


def _chart_end(time_range: TimeRange) -> str:
    """The end the chart asks the API for: a preset's, which ends now, up to the next 5-minute
    boundary (`telemetry.heatmap.shared_end`: the same cells, one cached answer for everyone)."""
    return time_range.iso(shared_end(time_range.end) if time_range.key in PRESETS else time_range.end)


def _text(moment: datetime) -> str:
    return moment.astimezone(UTC).strftime("%Y-%m-%d %H:%M UTC")


def _local_input(moment: datetime) -> str:
    """The value a datetime-local input shows (the page's times are UTC)."""
    return moment.astimezone(UTC).strftime("%Y-%m-%dT%H:%M")


class HeatmapForm(forms.Form):
    """The page's controls. A bad value is an error of its field, in words that name the
    parameter and its choices; the page then draws with that field's default, so the form still
    shows (with what was typed) and only valid choices travel in its links."""

    view = forms.CharField(required=False)
    metric = forms.CharField(required=False)
    stat = forms.CharField(required=False)
    sort = forms.CharField(required=False)
    host = forms.CharField(required=False)

    def __init__(self, data, hosts: list[tuple[int, str]]):
        super().__init__(data)
        self.host_ids = {pk for pk, _ in hosts}

    @staticmethod
    def _choice(name: str, value: str, choices, default: str, where: str = "") -> str:
        value = (value or "").strip() or default
        if value not in choices:
            raise forms.ValidationError(f"Unknown {name} {value!r}{where}: use {', '.join(choices)}.", code="invalid")
        return value

    def clean_view(self) -> str:
        return self._choice("view", self.cleaned_data["view"], VIEWS, DEFAULT_VIEW)

    def clean_sort(self) -> str:
        return self._choice("sort", self.cleaned_data["sort"], SORT_LABELS, "host")

    def clean_stat(self) -> str:
        return self._choice("stat", self.cleaned_data["stat"], STAT_LABELS, "avg")

    def clean_host(self) -> int | None:
        raw = self.cleaned_data["host"].strip()
        if not raw:
            return None
        try:
            host_id = parsing.parse_int(raw)
        except parsing.ParseError:
            host_id = None
        if host_id not in self.host_ids:
            raise forms.ValidationError(f"Unknown host {raw!r}: pick one from the list, or all hosts.", code="invalid")
        return host_id

    def clean(self) -> dict:
        """The metric depends on the view, and the statistic on the metric."""
        view = VIEWS[self.cleaned_data.get("view") or DEFAULT_VIEW]
        try:
            metric = self._choice("metric", self.data.get("metric", ""), view.metrics, view.default_metric,
                                  f" in the {view.label} view")
        except forms.ValidationError as exc:
            self.add_error("metric", exc)
            metric = view.default_metric
        self.cleaned_data["metric"] = metric
        stat = self.cleaned_data.get("stat")
        stats = METRICS[metric].stats
        if stat is not None and stat not in stats:
            self.add_error("stat", f"{view.metrics[metric]} has no {STAT_LABELS[stat]}: use "
                                   f"{' or '.join(STAT_LABELS[s] for s in stats)} ({', '.join(stats)}).")
        return self.cleaned_data

    def value(self, name: str, default):
        """The field's clean value, or `default` when it was refused."""
        return self.cleaned_data[name] if name in self.cleaned_data and name not in self.errors else default


def _range_params(params: QueryDict, default_key: str) -> tuple[str, dict[str, str]]:
    """The range key the form shows and the parameters RangeForm reads. The form always
    sends its start and end inputs; they count only with `range=custom` (or with no preset, a
    hand-written `?start=&end=` URL), so picking a preset after a custom range just works."""
    key = (params.get("range") or "").strip()
    start, end = params.get("start") or "", params.get("end") or ""
    if key == "custom" or (not key and (start.strip() or end.strip())):
        return "custom", {"start": start, "end": end}
    key = key or default_key
    return key, {"range": key}


def _view_links(current: str, sort: str, host_id: int | None, range_key: str | None,
                range_query: dict[str, str]) -> list[dict]:
    """The segmented control: each view keeps the valid sort, host filter and chosen range (a
    preset too short for the hour-of-week fold excepted); metric and statistic start afresh,
    since the views offer different metrics. `range_key` is None when no range was chosen or
    the one chosen is bad, so each view opens on its own default."""
    links = []
    for view in VIEWS.values():
        query = QueryDict(mutable=True)
        query["view"] = view.key
        if sort != "host":
            query["sort"] = sort
        if host_id is not None:
            query["host"] = str(host_id)
        if range_key == "custom":
            query["range"] = "custom"
            query.update(range_query)
        elif range_key and not (view.fold == "hour_of_week" and range_key in SHORT_FOR_FOLD):
            query["range"] = range_key
        links.append({"key": view.key, "label": view.label, "url": f"?{query.urlencode()}",
                      "current": view.key == current})
    return links


def _no_rows(view: HeatmapView, one_host: bool) -> dict[str, str]:
    """What the page says when the API has no row at all: the inventory is what is missing."""
    where = " on this host" if one_host else ""
    if view.group == "vm":
        return {"title": "No VMs to show",
                "message": f"No VM{where} holds a vGPU now or reported any in this range: give VMs their vGPUs "
                           "in the admin site (or through the API).",
                "url": reverse("admin:fleet_vgpu_add"), "action": "Add a vGPU in the admin site"}
    return {"title": f"No {view.row_noun} to show",
            "message": f"The inventory has no GPUs{where} yet: add hosts and their GPUs in the admin site, "
                       "or register an agent, which discovers the GPUs of its host.",
            "url": reverse("admin:fleet_host_add"), "action": "Add a host in the admin site"}


@staff_required
def heatmap_page(request):
    """The heatmap page: 200 with the chart's parameters, or 400 with the messages and the form."""
    params = request.GET
    hosts = list(Host.objects.order_by("name").values_list("pk", "name"))
    form = HeatmapForm(params, hosts)
    form.is_valid()
    errors: list[str] = [str(error) for field in form for error in field.errors]

    view = VIEWS[form.value("view", DEFAULT_VIEW)]
    metric = form.cleaned_data["metric"]
    stat = form.value("stat", "avg")
    stats = METRICS[metric].stats
    if stat not in stats:
        stat = "avg"
    sort = form.value("sort", "host")
    host_id = form.value("host", None)

    range_key, range_query = _range_params(params, view.default_range)
    range_form = RangeForm(range_query, now=timezone.now(), default=view.default_range)
    time_range: TimeRange | None = range_form.time_range if range_form.is_valid() else None
    if range_form.error:
        errors.append(range_form.error)

    chosen = params.get("range") or params.get("start") or params.get("end")
    agents = agent_status_counts()
    metric_label = view.metrics[metric]
    context = {
        "view": view,
        "view_links": _view_links(view.key, sort, host_id, range_key if chosen and time_range else None,
                                  range_query),
        "errors": errors,
        "agents": agents,
        "no_agents": sum(agents.values()) == 0,
        "metric": metric,
        "metric_label": metric_label,
        "stat": stat,
        "stat_label": STAT_LABELS[stat],
        "metric_options": [{"value": name, "label": label, "stats": " ".join(METRICS[name].stats),
                            "selected": name == metric} for name, label in view.metrics.items()],
        "stat_options": [{"value": name, "label": label.capitalize(), "selected": name == stat,
                          "available": name in stats} for name, label in STAT_LABELS.items()],
        "sort": sort,
        "sort_options": SORT_LABELS,
        "range_key": range_key if range_key in PRESET_LABELS else view.default_range,
        "range_options": PRESET_LABELS,
        "hosts": hosts,
        "host_id": host_id,
        # The step is the API's choice; the page's script writes it into the span once it is known.
        "legend": format_html(view.legend, stat=STAT_LABELS[stat], metric=metric_label, tz=settings.TIME_ZONE,
                              step=format_html("<span data-step>{}</span>", "one time step")),
        "agents_url": reverse("telemetry:agent-list"),
    }
    if time_range is not None:
        context.update(
            time_range=time_range,
            start_text=_text(time_range.start),
            end_text=_text(time_range.end),
            start_input=_local_input(time_range.start),
            end_input=_local_input(time_range.end),
        )
    else:
        context.update(start_input=params.get("start", ""), end_input=params.get("end", ""))
    if errors:
        return render(request, TEMPLATE, context, status=400)
    if context["no_agents"]:
        return render(request, TEMPLATE, context)  # nothing reports yet: the page says what to do instead

    context["chart"] = {
        "api-url": reverse("heatmap-api"),
        "view": view.key,
        "group": view.group,
        "metric": metric,
        "stat": stat,
        "start": time_range.start_iso,
        "end": _chart_end(time_range),
        "sort": sort,
        "fold": view.fold,
        "host": "" if host_id is None else str(host_id),
        "stat-label": STAT_LABELS[stat],
        "metric-label": metric_label,
        "row-noun": view.row_noun,
        "tz": settings.TIME_ZONE,
    }
    context["api_url"] = context["chart"]["api-url"]
    context["no_rows"] = _no_rows(view, host_id is not None)
    return render(request, TEMPLATE, context)

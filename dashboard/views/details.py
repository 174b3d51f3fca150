"""Detail pages of one host, GPU, VM or artist.

Host and GPU pages are for fleet admins (a GPU's page shows every artist's vGPU on it). VM and
artist pages are scoped with `fleet.queries`: an artist reaches their own and gets a 404 for
anything else, as in the API. Each page reads its time range with `telemetry.ranges` (presets,
a custom range, or `?at=` from a heatmap click) and loads its tables in a fixed number of
queries (`dashboard.details`); its charts are drawn in the browser by static/js/timeseries.js from
the metrics API, so a chart's data never costs the page a query.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from urllib.parse import urlencode

from django.conf import settings
from django.contrib.auth.decorators import login_required
from django.db.models import Q
from django.shortcuts import get_object_or_404, render
from django.urls import reverse
from django.utils import timezone
from django.utils.formats import date_format

from alerts.queries import open_alerts_of
from alerts.xids import describe as describe_xid
from config.roles import is_fleet_admin
from dashboard.access import staff_required
from dashboard.details import (
    NO_USAGE,
    Usage,
    agents_by_host,
    gib,
    host_gpus,
    percent,
    resident_vgpus,
    vm_guest,
    vm_usage,
    vms_with_vgpus,
)
from dashboard.forms import RangeForm
from fleet import audit
from fleet.models import AuditEvent, Vgpu, VirtualMachine
from fleet.queries import gpus_for, hosts_for, visible_artists, visible_vms
from hypervisors.queries import active_operation_of, host_hypervisor
from telemetry.metrics import HOURLY, default_step
from telemetry.models import AgentStatus, GpuHealthState, HostDriverState, XidError
from telemetry.queries import latest_gpu_samples, latest_vgpu_samples
from telemetry.ranges import PRESET_LABELS, PRESETS, TimeRange

# Time range --------------------------------------------------------------------------------


def page_range(request, default: str = "24h") -> tuple[TimeRange, str]:
    """The page's range and, for an unusable one, the message to show (the page then shows
    `default` instead, answered with status 400, and keeps what was typed in the form)."""
    form = RangeForm(request.GET, now=timezone.now(), default=default)
    return form.time_range, form.error


@dataclass(frozen=True)
class RangeChoice:
    key: str
    label: str
    url: str
    current: bool


def range_context(request, time_range: TimeRange, error: str) -> dict:
    """What the range control (templates/fleet/partials/detail_range_control.html) shows."""
    choices = [RangeChoice(key, PRESET_LABELS[key], f"?{urlencode({'range': key})}",
                           not error and time_range.key == key) for key in PRESETS]
    typed_start, typed_end = request.GET.get("start", ""), request.GET.get("end", "")
    return {
        "time_range": time_range,
        "range_error": error,
        "range_choices": choices,
        "range_custom": not error and time_range.key == "custom",
        # A refused custom range reopens its form, with what was typed, to be fixed.
        "range_form_open": bool(error and (typed_start or typed_end)),
        # Keep what the user typed when it was refused, else the range shown (UTC, minutes).
        "custom_start": typed_start if error and typed_start else time_range.start.strftime("%Y-%m-%dT%H:%M"),
        "custom_end": typed_end if error and typed_end else time_range.end.strftime("%Y-%m-%dT%H:%M"),
    }


def render_page(request, template: str, context: dict, time_range: TimeRange, error: str):
    """Render a detail page with its range control; 400 when the range asked for was refused."""
    context.update(range_context(request, time_range, error))
    return render(request, template, context, status=400 if error else 200)


# Charts ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Hint:
    """What an empty chart or section tells the reader to do, with an optional link."""

    text: str
    url: str = ""
    label: str = ""


@dataclass
class Chart:
    """One chart that static/js/timeseries.js draws: the metrics API URL(s) it fetches, the
    lines it draws (metric and statistic of the response) and what it marks."""

    key: str
    title: str
    urls: list[str]
    lines: list[dict]
    unit: str
    hint: Hint
    labels: list[str] = field(default_factory=list)  # one line name per URL, when several
    scale: float = 1.0  # values are divided by it (MiB -> GiB)
    ymax: float | None = None
    limit: float | None = None
    limit_label: str = ""

    @property
    def url(self) -> str:
        return " ".join(self.urls)

    @property
    def lines_json(self) -> str:
        return json.dumps(self.lines)

    @property
    def labels_json(self) -> str:
        return json.dumps(self.labels)


def line(metric: str, stat: str, name: str) -> dict:
    return {"metric": metric, "stat": stat, "name": name}


def series_url(name: str, pk: int, time_range: TimeRange, metrics: tuple[str, ...]) -> str:
    """The metrics API URL of one GPU or VM over the page's range, at the API's default step
    (written out, so the URL says which resolution the chart shows)."""
    query = urlencode({
        "start": time_range.start_iso, "end": time_range.end_iso,
        "step": default_step(time_range.start, time_range.end), "metric": ",".join(metrics),
    })
    return f"{reverse(name, args=[pk])}?{query}"


def vm_charts(vm, profile_fb_mib: int, time_range: TimeRange, hint: Hint) -> list[Chart]:
    """Frame buffer used against the VM's profiles, and utilization; then the guest's CPU (all
    its vCPUs and the busiest one) and memory against its RAM, read through the hypervisor."""
    url = series_url("vm-metrics", vm.pk, time_range, ("fb_used_mib", "util_gpu"))
    guest = series_url("vm-metrics", vm.pk, time_range, ("vcpu_util", "vcpu_max_util", "ram_used_mib"))
    profiles = ", ".join(vgpu.profile.name for vgpu in vm.vgpus.all())
    return [
        Chart(f"vm-{vm.pk}-fb", "Frame buffer used", [url],
              [line("fb_used_mib", "avg", "Average"), line("fb_used_mib", "p95", "p95"),
               line("fb_used_mib", "max", "Peak")],
              "GiB", hint, scale=1024, limit=gib(profile_fb_mib) if profile_fb_mib else None,
              limit_label=f"Profile: {fmt_gib(profile_fb_mib)} GiB ({profiles})" if profile_fb_mib else ""),
        Chart(f"vm-{vm.pk}-util", "GPU utilization (share of the physical GPU)", [url],
              [line("util_gpu", "avg", "Average"), line("util_gpu", "p95", "p95")], "%", hint, ymax=100),
        Chart(f"vm-{vm.pk}-cpu", f"Guest CPU ({vm.vcpus} vCPUs, from the hypervisor)", [guest],
              [line("vcpu_util", "avg", "All vCPUs, average"), line("vcpu_util", "p95", "All vCPUs, p95"),
               line("vcpu_max_util", "p95", "Busiest vCPU, p95")], "%", hint, ymax=100),
        Chart(f"vm-{vm.pk}-ram", "Guest memory used (from the hypervisor)", [guest],
              [line("ram_used_mib", "avg", "Average"), line("ram_used_mib", "max", "Peak")], "GiB", hint,
              scale=1024, limit=vm.ram_gib, limit_label=f"RAM: {vm.ram_gib} GiB"),
    ]


# Agents: empty and stale states ------------------------------------------------------------


@dataclass(frozen=True)
class Notice:
    """A banner about a source of data: stale, failing or never seen."""

    tone: str  # "warn" or "error"
    text: str


def when(moment) -> str:
    return date_format(timezone.localtime(moment), "Y-m-d H:i T") if moment else "never"


def agent_notices(agents, staff: bool) -> list[Notice]:
    """Banners for the agents of a host whose data stopped or never came."""
    notices = []
    for agent in agents:
        status = agent.status
        if status == AgentStatus.STALE:
            notices.append(Notice("warn", f"Agent {agent.name} is stale: last seen {when(agent.last_seen)}. "
                                          "Charts stop where its data stopped."))
        elif status == AgentStatus.ERROR:
            detail = f" ({agent.last_error})" if staff and agent.last_error else ""
            notices.append(Notice("error", f"Agent {agent.name} failed at {when(agent.last_error_at)}{detail}; "
                                           f"last seen {when(agent.last_seen)}."))
        elif status == AgentStatus.NEW and staff:
            notices.append(Notice("warn", f"Agent {agent.name} has not reported yet."))
    return notices


def no_data_hint(host, agents, staff: bool) -> Hint:
    """What an empty chart says: which agent serves the host and its status, and where to look."""
    if host is None:
        return Hint("This VM is not placed on a host, so nothing reports its vGPUs.")
    if not staff:
        return Hint(f"If the workstation was running then, the collector on {host.name} may be down: "
                    "tell your studio's IT admin.")
    agents_url = reverse("telemetry:agent-list")
    if not agents:
        return Hint(f"No agent serves {host.name}: add one so its GPUs report.", agents_url, "Agents")
    served = "; ".join(f"{agent.name} ({AgentStatus(agent.status).label}, last seen {when(agent.last_seen)})"
                       for agent in agents)
    return Hint(f"{host.name} is served by {served}. Check the agent.", agents_url, "Agents")


# History -----------------------------------------------------------------------------------

HISTORY_LIMIT = 10


@dataclass(frozen=True)
class History:
    """The "History" box of a detail page: the latest events about the object and the link to
    all of its events on /audit/."""

    events: list[AuditEvent]
    all_url: str


def history(object_type: str, pk: int, *, related: tuple[str, ...] = (), key: str = "") -> History:
    """The last HISTORY_LIMIT events on one object, in one query, each with a one-line `summary`.

    `related` object types (vGPUs, resize requests) count when their before or after names the
    object in `key` ("vm_id": a VM's vGPUs were placed or removed): those rows may be gone, so
    only their snapshots still tie them to it."""
    match = Q(object_type=object_type, object_id=str(pk))
    if related:
        match |= Q(object_type__in=related) & (Q(**{f"before__{key}": pk}) | Q(**{f"after__{key}": pk}))
    events = list(AuditEvent.objects.filter(match).order_by("-at", "-id")[:HISTORY_LIMIT])
    for event in events:
        event.summary = audit.summary(event.before, event.after)
    query = urlencode({"object_type": object_type, "object_id": pk})
    return History(events, f"{reverse('fleet:audit')}?{query}")


# Figures -----------------------------------------------------------------------------------


def fmt_gib(mib: float | None) -> str:
    """GiB for a sentence: "12", "1.5", "9.1"."""
    if mib is None:
        return "?"
    value = mib / 1024
    return f"{value:.0f}" if abs(value - round(value)) < 0.05 else f"{value:.1f}"


@dataclass(frozen=True)
class Capacity:
    """A host resource: what the VMs claim against what overcommit allows."""

    allocated: int
    physical: int
    overcommit: float

    @property
    def limit(self) -> float:
        return self.physical * self.overcommit

    @property
    def pct(self) -> float:
        return min(100.0, percent(self.allocated, self.limit) or 0.0)


def usage_sentences(usage: Usage, profile_fb_mib: int, time_range: TimeRange) -> list[str]:
    """A plain-language summary of a VM's usage over the range, for the VM and /me/ pages."""
    if not usage.has_data:
        return [f"No usage was recorded between {when(time_range.start)} and {when(time_range.end)}."]
    sentences = []
    if usage.peak_fb_mib is not None:
        capacity = usage.profile_fb_mib or profile_fb_mib
        pct = usage.peak_fb_pct if usage.peak_fb_pct is not None else percent(usage.peak_fb_mib, capacity)
        of = f" of {fmt_gib(capacity)} GiB" if capacity else ""
        share = f" ({pct:.0f}%)" if pct is not None else ""
        sentences.append(f"Peak frame buffer use was {fmt_gib(usage.peak_fb_mib)}{of}{share}.")
        if pct is not None and pct >= 90:
            sentences.append("That is close to the profile's limit: if applications slow down or run out of "
                             "GPU memory, a larger profile may help.")
        elif pct is not None and pct < 50:
            sentences.append("Less than half of the profile's frame buffer was ever in use.")
    if usage.mean_util_gpu is not None:
        sentences.append(f"On average the vGPU kept its GPU {usage.mean_util_gpu:.0f}% busy"
                         f" (highest {usage.peak_util_gpu:.0f}%)." if usage.peak_util_gpu is not None else
                         f"On average the vGPU kept its GPU {usage.mean_util_gpu:.0f}% busy.")
    return sentences


# Pages -------------------------------------------------------------------------------------


@staff_required
def host_detail(request, pk):
    """A host: capacity and overcommit, its GPUs with allocation and newest readings, its VMs,
    its agents, and its GPUs' utilization over the range (one line per GPU)."""
    host = get_object_or_404(hosts_for(request.user), pk=pk)
    time_range, error = page_range(request)
    gpus = host_gpus(host)
    vms = list(vms_with_vgpus(VirtualMachine.objects.filter(host=host)))
    agents = agents_by_host([host.pk]).get(host.pk, [])
    hint = no_data_hint(host, agents, staff=True)
    charts = []
    if gpus:
        urls = [series_url("gpu-metrics", row.gpu.pk, time_range, ("util_gpu",)) for row in gpus]
        charts.append(Chart("host-util", "GPU utilization, average per GPU", urls,
                            [line("util_gpu", "avg", "Average")], "%", hint,
                            labels=[row.gpu.pci_bus_id for row in gpus], ymax=100))
    context = {
        "host": host, "gpus": gpus, "vms": vms, "agents": agents, "charts": charts, "hint": hint,
        "driver": HostDriverState.objects.filter(host=host).first(),
        "notices": agent_notices(agents, staff=True),
        "vcpus": Capacity(host.allocated_vcpus, host.cpu_threads, host.vcpu_overcommit),
        "ram": Capacity(host.allocated_ram_gib, host.ram_gib, host.ram_overcommit),
        "history": history("host", host.pk),
        "hypervisor": host_hypervisor(host),
    }
    return render_page(request, "fleet/host_detail.html", context, time_range, error)


def gpu_health(gpu) -> dict:
    """The GPU's health card: its stored state, its newest XIDs with what they mean, and its open alerts."""
    state = GpuHealthState.objects.filter(gpu=gpu).first()
    xids = [(xid, describe_xid(xid.code)) for xid in XidError.objects.filter(gpu=gpu).order_by("-at")[:5]]
    return {"state": state, "xids": xids, "alerts": list(open_alerts_of(gpu)[:10])}


@staff_required
def gpu_detail(request, pk):
    """A GPU: identity and mode, its resident vGPUs with their share and newest readings, the
    frame buffer split, and its time series over the range."""
    gpu = get_object_or_404(gpus_for(request.user), pk=pk)
    time_range, error = page_range(request)
    latest = latest_gpu_samples(gpu_ids=[gpu.pk]).get(gpu.pk)
    vgpus = resident_vgpus(gpu, latest_vgpu_samples())
    agents = agents_by_host([gpu.host_id]).get(gpu.host_id, [])
    hint = no_data_hint(gpu.host, agents, staff=True)
    fb_mib = gpu.gpu_model.fb_mib
    url = series_url("gpu-metrics", gpu.pk, time_range,
                     ("util_gpu", "fb_used_mib", "temp_c", "power_w", "enc_util", "dec_util"))
    charts = [
        Chart("gpu-util", "GPU utilization", [url],
              [line("util_gpu", "avg", "Average"), line("util_gpu", "p95", "p95")], "%", hint, ymax=100),
        Chart("gpu-fb", "Frame buffer used", [url],
              [line("fb_used_mib", "avg", "Average"), line("fb_used_mib", "max", "Peak")], "GiB", hint, scale=1024,
              limit=gib(fb_mib), limit_label=f"Physical frame buffer: {fmt_gib(fb_mib)} GiB"),
        Chart("gpu-temp", "Temperature", [url], [line("temp_c", "avg", "Average"), line("temp_c", "max", "Peak")],
              "°C", hint),
        Chart("gpu-power", "Power draw", [url], [line("power_w", "avg", "Average"), line("power_w", "max", "Peak")],
              "W", hint),
        Chart("gpu-codec", "Encoder and decoder", [url],
              [line("enc_util", "avg", "Encoder"), line("dec_util", "avg", "Decoder")], "%", hint, ymax=100),
    ]
    split = [{"name": f"{row.vgpu.vm.name} · {row.vgpu.profile.name}", "mib": row.vgpu.profile.fb_mib}
             for row in vgpus]
    free_mib = max(0, fb_mib - sum(part["mib"] for part in split))
    context = {
        "gpu": gpu, "latest": latest, "vgpus": vgpus, "agents": agents, "charts": charts, "hint": hint,
        "health": gpu_health(gpu),
        "notices": agent_notices(agents, staff=True),
        "fb_allocated_pct": min(100.0, percent(gpu.used_fb_mib, fb_mib) or 0.0),
        "fb_latest_pct": percent((latest or {}).get("fb_used_mib"), (latest or {}).get("fb_total_mib") or fb_mib),
        "split": {"segments": split, "free_mib": free_mib, "total_mib": fb_mib},
        "is_passthrough": gpu.mode == "passthrough",
        "history": history("gpu", gpu.pk, related=("vgpu",), key="gpu_id"),
    }
    return render_page(request, "fleet/gpu_detail.html", context, time_range, error)


@dataclass(frozen=True)
class VgpuFact:
    """A vGPU of a VM and its profile's share of the physical GPU's frame buffer."""

    vgpu: Vgpu
    share_pct: float | None


@login_required
def vm_detail(request, pk):
    """A VM: identity, artist, host, each vGPU against its profile, a usage summary over the range,
    its guest's CPU and memory (newest reading, last day and week, through the hypervisor link),
    its right-sizing suggestion and its frame buffer and utilization charts. Artists reach their
    own VMs only (else 404)."""
    staff = is_fleet_admin(request.user)
    # The VM's right-sizing suggestion comes in the same query (sizing keeps one per VM).
    vm = get_object_or_404(vms_with_vgpus(visible_vms(request.user)).select_related(
        "suggestion__current_profile", "suggestion__suggested_profile", "suggestion__resize_request",
    ), pk=pk)
    time_range, error = page_range(request)
    vgpus = list(vm.vgpus.all())
    profile_fb_mib = sum(vgpu.profile.fb_mib for vgpu in vgpus)
    usage = vm_usage([vm.pk], time_range.start, time_range.end).get(vm.pk, NO_USAGE)
    agents = agents_by_host([vm.host_id]).get(vm.host_id, [])
    hint = no_data_hint(vm.host, agents, staff)
    context = {
        "vm": vm, "vgpus": [VgpuFact(v, percent(v.profile.fb_mib, v.gpu.gpu_model.fb_mib)) for v in vgpus],
        "profile_fb_mib": profile_fb_mib, "profile_fb_gib": gib(profile_fb_mib), "usage": usage,
        "summary": usage_sentences(usage, profile_fb_mib, time_range),
        "guest": vm_guest(vm.pk, timezone.now(), settings.TELEMETRY_STALE_AFTER_S),
        "hypervisor_linked": bool(vm.host and vm.host.hypervisor_uri),
        "charts": vm_charts(vm, profile_fb_mib, time_range, hint), "hint": hint, "staff": staff,
        "notices": agent_notices(agents, staff),
        "operation": active_operation_of(vm.pk),
        "suggestion": getattr(vm, "suggestion", None),
        # Staff only: events name other people and show rows artists do not see.
        "history": history("vm", vm.pk, related=("vgpu", "resize_request"), key="vm_id") if staff else None,
    }
    return render_page(request, "fleet/vm_detail.html", context, time_range, error)


@dataclass(frozen=True)
class VmUsageRow:
    vm: VirtualMachine
    profile_fb_mib: int
    usage: Usage

    @property
    def profiles(self) -> str:
        return ", ".join(vgpu.profile.name for vgpu in self.vm.vgpus.all())


@login_required
def artist_detail(request, pk):
    """An artist: who they are, their VMs with profiles and how much of them they used over the
    range (hourly rollups; 7 days by default). Artists reach their own page only (else 404)."""
    staff = is_fleet_admin(request.user)
    artist = get_object_or_404(visible_artists(request.user).select_related("user"), pk=pk)
    time_range, error = page_range(request, default="7d")
    vms = list(vms_with_vgpus(VirtualMachine.objects.filter(artist=artist)))
    usage = vm_usage([vm.pk for vm in vms], time_range.start, time_range.end, step_s=HOURLY) if vms else {}
    rows = [VmUsageRow(vm, sum(v.profile.fb_mib for v in vm.vgpus.all()), usage.get(vm.pk, NO_USAGE))
            for vm in vms]
    context = {"artist": artist, "rows": rows, "staff": staff}
    return render_page(request, "fleet/artist_detail.html", context, time_range, error)

"""Reads of the detail pages (host, GPU, VM, artist) and of an artist's own workstation page.

Every function loads what one section of a page shows in one query whatever the number of
rows (GPUs of a host, vGPUs of a GPU, VMs of an artist), so a page's query count is fixed.
Role scoping is the caller's: views pick the object through `fleet.queries` (`hosts_for`,
`visible_vms`, ...) and hand its id here; nothing here widens what a user may see.

Usage summaries read the VM rollups (`telemetry.models.VmRollup`), never raw samples: the
frame buffer a VM used against what its profiles gave it, and how busy its vGPUs kept the GPU.
A VM's guest CPU and memory (read through its host's hypervisor link) come from its newest
`GuestSample` and its hourly `GuestRollup`s.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass
from datetime import datetime, timedelta

from django.db.models import (
    Count,
    F,
    FloatField,
    IntegerField,
    Max,
    OuterRef,
    Prefetch,
    Q,
    QuerySet,
    Subquery,
    Sum,
    Value,
)
from django.db.models.functions import Coalesce, NullIf

from fleet.models import Gpu, Vgpu, VirtualMachine
from fleet.queries import with_gpu_usage
from telemetry.aggregation import bucket_floor
from telemetry.metrics import HOURLY, default_step
from telemetry.models import Agent, Drift, GuestRollup, VmRollup
from telemetry.queries import latest_gpu_samples, latest_guest_samples

MIB_PER_GIB = 1024


def gib(mib: float | None) -> float | None:
    """MiB as GiB (frame buffer figures read better in GiB on a page)."""
    return None if mib is None else mib / MIB_PER_GIB


def percent(part: float | None, whole: float | None) -> float | None:
    """`part` as a percentage of `whole`; None when either is unknown or `whole` is 0."""
    if part is None or not whole:
        return None
    return part * 100.0 / whole


# Agents ------------------------------------------------------------------------------------


def agents_by_host(host_ids) -> dict[int, list[Agent]]:
    """The agents serving each host in `host_ids`, each with `open_drifts` (differences from the
    inventory it reported that nobody resolved yet), ordered by name. One query."""
    open_drifts = Drift.objects.filter(agent=OuterRef("pk"), resolved_at__isnull=True).order_by().values("agent")
    counted = open_drifts.annotate(n=Count("pk")).values("n")
    agents = Agent.objects.filter(host_id__in=[pk for pk in host_ids if pk is not None]).annotate(
        open_drifts=Coalesce(Subquery(counted, output_field=IntegerField()), Value(0)),
    ).order_by("name", "id")
    grouped: dict[int, list[Agent]] = defaultdict(list)
    for agent in agents:
        grouped[agent.host_id].append(agent)
    return grouped


# Host --------------------------------------------------------------------------------------


@dataclass(frozen=True)
class GpuRow:
    """A GPU as a host's page lists it: frame buffer allocated to vGPUs against the physical one,
    and its newest reading (None when it never reported)."""

    gpu: Gpu
    latest: dict | None

    @property
    def fb_allocated_mib(self) -> int:
        return self.gpu.used_fb_mib

    @property
    def fb_physical_mib(self) -> int:
        return self.gpu.gpu_model.fb_mib

    @property
    def fb_allocated_pct(self) -> float:
        return min(100.0, percent(self.fb_allocated_mib, self.fb_physical_mib) or 0.0)


def host_gpus(host) -> list[GpuRow]:
    """The host's GPUs with model, allocation and newest reading, by PCI bus id. Two queries."""
    gpus = list(with_gpu_usage(Gpu.objects.filter(host=host).select_related("gpu_model")).order_by("pci_bus_id", "id"))
    latest = latest_gpu_samples([gpu.pk for gpu in gpus]) if gpus else {}
    return [GpuRow(gpu, latest.get(gpu.pk)) for gpu in gpus]


def vms_with_vgpus(queryset: QuerySet[VirtualMachine]) -> QuerySet[VirtualMachine]:
    """VMs with artist and host, and their vGPUs with profile and GPU (two queries in all)."""
    return queryset.select_related("artist", "host").prefetch_related(
        Prefetch("vgpus", queryset=Vgpu.objects.select_related("profile", "gpu__gpu_model").order_by("id")),
    ).order_by("name", "id")


# GPU ---------------------------------------------------------------------------------------


@dataclass(frozen=True)
class ResidentVgpu:
    """A vGPU on a GPU's page: its profile's share of the GPU and its newest reading."""

    vgpu: Vgpu
    gpu_fb_mib: int
    latest: dict | None

    @property
    def profile_share_pct(self) -> float | None:
        return percent(self.vgpu.profile.fb_mib, self.gpu_fb_mib)

    @property
    def fb_used_mib(self) -> float | None:
        return (self.latest or {}).get("fb_used_mib")

    @property
    def fb_used_pct_of_profile(self) -> float | None:
        return percent(self.fb_used_mib, self.vgpu.profile.fb_mib)

    @property
    def util_gpu(self) -> float | None:
        return (self.latest or {}).get("util_gpu")


def resident_vgpus(gpu, latest: dict[tuple[int, int], dict]) -> list[ResidentVgpu]:
    """The vGPUs on `gpu` with VM, artist and profile (one query), by slot, paired with the
    newest vGPU samples `latest` ({(vm_id, gpu_id): sample})."""
    vgpus = Vgpu.objects.filter(gpu=gpu).select_related("vm__artist", "profile").order_by("placement_id", "id")
    fb_mib = gpu.gpu_model.fb_mib
    return [ResidentVgpu(vgpu, fb_mib, latest.get((vgpu.vm_id, gpu.pk))) for vgpu in vgpus]


# VM usage ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Usage:
    """What a VM used over a range, from its rollups. Frame buffer percentages are of what its
    profiles gave it in each bucket (`VmRollup.profile_fb_mib`), so a resize in the range does
    not distort them; `p95` figures are the highest bucket p95 (an upper bound, as the metrics
    API merges them); utilization is the busiest vGPU's share of its physical GPU."""

    buckets: int = 0
    peak_fb_mib: float | None = None
    p95_fb_mib: float | None = None
    profile_fb_mib: float | None = None
    peak_fb_pct: float | None = None
    p95_fb_pct: float | None = None
    mean_util_gpu: float | None = None
    peak_util_gpu: float | None = None

    @property
    def has_data(self) -> bool:
        return self.buckets > 0 and (self.peak_fb_mib is not None or self.mean_util_gpu is not None)

    @property
    def peak_fb_gib(self) -> float | None:
        return gib(self.peak_fb_mib)

    @property
    def profile_fb_gib(self) -> float | None:
        return gib(self.profile_fb_mib)


NO_USAGE = Usage()


def rollup_step(start: datetime, end: datetime) -> int:
    """The rollups (300 or 3600 s) the metrics API reads for this range at its default step, so
    a page's summary and its charts agree."""
    return HOURLY if default_step(start, end) >= HOURLY else 300


def vm_usage(vm_ids, start: datetime, end: datetime, step_s: int | None = None) -> dict[int, Usage]:
    """A `Usage` of each VM in `vm_ids` between `start` and `end` from its `step_s` rollups
    (default: those the charts read); VMs without rollups in the range are absent. One query."""
    step_s = step_s or rollup_step(start, end)
    capacity = NullIf(F("profile_fb_mib"), Value(0.0))
    with_util = Q(util_gpu_avg__isnull=False)
    rows = VmRollup.objects.filter(
        vm_id__in=list(vm_ids), step_s=step_s, bucket__gte=bucket_floor(start, step_s), bucket__lt=end,
    ).order_by().values("vm_id").annotate(
        buckets=Count("pk"),
        peak_fb_mib=Max("fb_used_mib_max"),
        p95_fb_mib=Max("fb_used_mib_p95"),
        profile_mib=Max("profile_fb_mib"),  # not `profile_fb_mib`: that name would shadow the column below
        peak_fb_pct=Max(F("fb_used_mib_max") * Value(100.0) / capacity, output_field=FloatField()),
        p95_fb_pct=Max(F("fb_used_mib_p95") * Value(100.0) / capacity, output_field=FloatField()),
        util_weighted=Sum(F("util_gpu_avg") * F("samples"), filter=with_util, output_field=FloatField()),
        util_samples=Sum("samples", filter=with_util, output_field=IntegerField()),
        peak_util_gpu=Max("util_gpu_max"),
    )
    usage = {}
    for row in rows:
        vm_id, util_samples, util_weighted = row.pop("vm_id"), row.pop("util_samples"), row.pop("util_weighted")
        mean_util = util_weighted / util_samples if util_samples else None
        usage[vm_id] = Usage(mean_util_gpu=mean_util, profile_fb_mib=row.pop("profile_mib"), **row)
    return usage


# VM guest (CPU and memory through the hypervisor link) ---------------------------------------

#: The windows the guest card sums up: (key, label, length), from the hourly guest rollups.
GUEST_WINDOWS = (("day", "Last 24 h", timedelta(hours=24)), ("week", "Last 7 days", timedelta(days=7)))
#: The rollup figures of each window: (key, label, unit); p95 and max of each.
GUEST_FIGURES = (("vcpu_util", "All vCPUs", "%"), ("vcpu_max_util", "Busiest vCPU", "%"),
                 ("ram_used_mib", "RAM used", "GiB"))


@dataclass(frozen=True)
class GuestWindow:
    """One window of the guest card: its hourly buckets, and per figure (p95, max), None where
    the guest reported nothing (a guest without the balloon driver has no memory figure)."""

    key: str
    label: str
    buckets: int
    figures: dict[str, tuple[float | None, float | None]]


@dataclass(frozen=True)
class GuestRow:
    """One line of the card's table: a figure's (p95, max) in each window, in `unit`."""

    key: str
    label: str
    unit: str
    cells: list[tuple[float | None, float | None]]

    @property
    def texts(self) -> list[str]:
        """Each window's cell as the page shows it: "12% / 40%", "5.9 / 6.3 GiB", "not reported"."""
        return [_p95_max(p95, peak, self.unit) for p95, peak in self.cells]


def _p95_max(p95: float | None, peak: float | None, unit: str) -> str:
    if peak is None:
        return "not reported"
    if unit == "%":
        return f"{p95:.0f}% / {peak:.0f}%" if p95 is not None else f"max {peak:.0f}%"
    return f"{p95:.1f} / {peak:.1f} {unit}" if p95 is not None else f"max {peak:.1f} {unit}"


@dataclass(frozen=True)
class Guest:
    """What a VM page shows of its guest: the newest reading (None: none yet), and the windows."""

    latest: dict | None
    stale: bool
    windows: list[GuestWindow]

    @property
    def ram_used_pct(self) -> float | None:
        return percent((self.latest or {}).get("ram_used_mib"), (self.latest or {}).get("ram_mib"))

    @property
    def ram_used_gib(self) -> float | None:
        return gib((self.latest or {}).get("ram_used_mib"))

    @property
    def ram_gib(self) -> float | None:
        return gib((self.latest or {}).get("ram_mib"))

    @property
    def rows(self) -> list[GuestRow]:
        rows = []
        for key, label, unit in GUEST_FIGURES:
            cells = [window.figures[key] for window in self.windows]
            if unit == "GiB":
                cells = [(gib(p95), gib(peak)) for p95, peak in cells]
            rows.append(GuestRow(key, label, unit, cells))
        return rows

    @property
    def has_history(self) -> bool:
        return any(window.buckets for window in self.windows)


def vm_guest(vm_id: int, now: datetime, stale_after_s: float) -> Guest:
    """The guest card of one VM: its newest guest reading (stale when older than
    `stale_after_s`) and the p95 and max of its vCPU share, busiest vCPU and memory used over
    each of GUEST_WINDOWS up to `now`. p95 is the highest hourly p95 (an upper bound, as the
    metrics API merges buckets); max is exact. Two queries."""
    latest = latest_guest_samples(vm_ids=[vm_id]).get(vm_id)
    starts = {key: bucket_floor(now - length, HOURLY) for key, _, length in GUEST_WINDOWS}
    aggregates = {}
    for key, _, _ in GUEST_WINDOWS:
        within = Q(bucket__gte=starts[key])
        aggregates[f"{key}__buckets"] = Count("pk", filter=within)
        for figure, _, _ in GUEST_FIGURES:
            aggregates[f"{key}__{figure}_p95"] = Max(f"{figure}_p95", filter=within)
            aggregates[f"{key}__{figure}_max"] = Max(f"{figure}_max", filter=within)
    row = GuestRollup.objects.filter(
        vm_id=vm_id, step_s=HOURLY, bucket__gte=min(starts.values()), bucket__lt=now,
    ).aggregate(**aggregates)
    windows = [
        GuestWindow(key, label, row[f"{key}__buckets"], {
            figure: (row[f"{key}__{figure}_p95"], row[f"{key}__{figure}_max"]) for figure, _, _ in GUEST_FIGURES
        })
        for key, label, _ in GUEST_WINDOWS
    ]
    stale = latest is not None and (now - latest["ts"]).total_seconds() > stale_after_s
    return Guest(latest, stale, windows)

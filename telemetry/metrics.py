"""The metrics the time-series reads serve, and the steps they can be read at: one definition for
the API (telemetry/api/metrics.py, telemetry/api/heatmap.py), the heatmaps and the pages.

Each metric says which rollups it lives in (`Metric.source`): "vgpu", the NVIDIA readings of the
agents (`GpuRollup` for a GPU, `VmRollup` for a VM's vGPUs together), or "guest", a VM's guest
CPU and memory read through its hypervisor (`GuestRollup`, VMs only). `VM_ROLLUPS` maps a
source to a VM's rollup model and the column its percentages are of; readers ask it instead of
naming a model, so a metric is read from one place.

A step is a multiple of 300 s below an hour (read from the 5-minute rollups) or a multiple of
3600 s (read from the hourly rollups); without one the smallest of STEP_LADDER giving at most
DEFAULT_POINTS points is used.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from datetime import datetime

from django.db.models import Model

from config import parsing
from telemetry.models import GuestRollup, VmRollup

MAX_RANGE_DAYS = 400
MAX_POINTS = 10_000
DEFAULT_POINTS = 720
STEP_LADDER = (300, 600, 900, 1800, 3600, 7200, 10800, 21600, 43200, 86400, 172800, 604800)
HOURLY = 3600
FIVE_MINUTES = 300


@dataclass(frozen=True)
class Metric:
    """A metric name of the API and the rollup columns behind each of its statistics."""

    name: str
    stats: tuple[str, ...]
    gpu_only: bool = False
    #: The rollups it is read from: "vgpu" (GpuRollup, VmRollup) or "guest" (GuestRollup, VMs only).
    source: str = "vgpu"
    #: A percentage of the rollup's capacity column, read from this metric's columns:
    #: fb_used_pct is fb_used_mib of the frame buffer, ram_used_pct ram_used_mib of the RAM.
    percent_of: str | None = None

    @property
    def percent_of_capacity(self) -> bool:
        return self.percent_of is not None

    @property
    def vm_only(self) -> bool:
        return self.source == "guest"

    def column(self, stat: str) -> str:
        return f"{self.percent_of or self.name}_{stat}"


METRICS = {m.name: m for m in (
    Metric("util_gpu", ("avg", "max", "p95")),
    Metric("util_mem", ("avg", "max")),
    Metric("fb_used_mib", ("avg", "max", "p95")),
    Metric("fb_used_pct", ("avg", "max", "p95"), percent_of="fb_used_mib"),
    Metric("enc_util", ("avg", "max")),
    Metric("dec_util", ("avg", "max")),
    Metric("temp_c", ("avg", "max"), gpu_only=True),
    Metric("power_w", ("avg", "max"), gpu_only=True),
    Metric("sm_clock_mhz", ("avg",), gpu_only=True),
    # A VM's guest, read through its hypervisor (no agent in the guest).
    Metric("vcpu_util", ("avg", "max", "p95"), source="guest"),
    Metric("vcpu_max_util", ("avg", "max", "p95"), source="guest"),
    Metric("cpu_steal_pct", ("avg", "max"), source="guest"),
    Metric("ram_used_mib", ("avg", "max", "p95"), source="guest"),
    Metric("ram_used_pct", ("avg", "max", "p95"), source="guest", percent_of="ram_used_mib"),
)}
GPU_METRICS = tuple(name for name, m in METRICS.items() if not m.vm_only)
VM_METRICS = tuple(name for name, m in METRICS.items() if not m.gpu_only)


@dataclass(frozen=True)
class VmRollups:
    """Where a VM's series of one source live: the rollup model and the column a percentage of
    that source is of."""

    model: type[Model]
    capacity_column: str


VM_ROLLUPS = {
    "vgpu": VmRollups(VmRollup, "profile_fb_mib"),  # frame buffer the VM's profiles gave it then
    "guest": VmRollups(GuestRollup, "ram_mib"),  # the VM's RAM allocation then
}


def default_step(start: datetime, end: datetime) -> int:
    """The smallest step of STEP_LADDER giving at most DEFAULT_POINTS points over the range."""
    span = (end - start).total_seconds()
    return next((s for s in STEP_LADDER if math.ceil(span / s) <= DEFAULT_POINTS), STEP_LADDER[-1])


def parse_step(raw: str | None, start: datetime, end: datetime) -> int:
    """`step` in seconds: given (a multiple of 300 below an hour, else of 3600) or chosen by
    `default_step`; parsing.ParseError saying what is wrong otherwise."""
    if raw is None or raw.strip() == "":
        return default_step(start, end)
    try:
        step = parsing.parse_int(raw)
    except parsing.ParseError as exc:
        raise parsing.ParseError(f"{exc} Give a whole number of seconds.") from None
    if step <= 0 or (step < HOURLY and step % FIVE_MINUTES) or (step >= HOURLY and step % HOURLY):
        raise parsing.ParseError(
            f"{step} s is not a step the rollups can serve: use a multiple of 300 below 3600 "
            f"(300, 600, 900, 1800) or a multiple of 3600.")
    return step

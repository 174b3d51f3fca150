"""Right-sizing the rest of the workstation: its vCPUs and RAM from what the guest used, read
through the hypervisor (telemetry's GuestRollup hours), and what the CPU says about the vGPU's
advice when the two disagree. Pure functions, no ORM (`sizing.suggestions` feeds them).

NVIDIA's sizing guide asks for the whole workstation to be sized from measurements: a DCC
application that is single-threaded saturates one vCPU while the others idle, so neither more
vCPUs nor a bigger vGPU make its viewport faster; a modeling VM given 32 GB that uses 6 holds
RAM another VM on the host could use.

How advice is reached (each step documented where it is coded):

1. **Which hours.** Hours with guest readings under the VM's current vCPU count (CPU) or RAM
   allocation (RAM): figures under another size say little about this one.
2. **Coverage.** Too few covered hours (`min_covered_hours`) or worked hours (`is_worked_hour`)
   give "insufficient_data". A guest that never reports its memory (no balloon driver) gives
   insufficient data for RAM, never a downsize on a figure of 0.
3. **vCPUs.** More when the VM's vCPUs together are often busy (p95 above `cpu_high_pct`): as
   many as bring that p95 to `cpu_target_pct`. Fewer when they are rarely busy (p95 below
   `cpu_low_pct`) and no single vCPU is (busiest vCPU's p95 below `single_busy_pct`): as few as
   keep the p95 at `cpu_target_pct`, at least `min_vcpus`. Never more when the load is one
   saturated vCPU (busiest p95 at least `single_thread_pct` while the average stays below
   `cpu_high_pct`): more cores do not help a single-threaded application.
4. **RAM.** More when the guest's use is often near the allocation (p95 above `ram_high_pct`):
   to where the p95 is `ram_target_pct`. Less when even its peak stays below `ram_low_pct`: to
   where the peak is `ram_target_pct`, at least `min_ram_gib`. Sizes are whole GiB on a ladder
   (`RAM_STEPS_GIB`).
5. **Host room.** An increase is bounded by what the host can still give (its threads and RAM
   times overcommit, less what its VMs claim); the reason says when it caps the advice.
6. **Steal.** vCPUs that often wait for a host CPU (steal or ready time above `steal_high_pct`)
   are the host's contention, not the VM's size: said, and no vCPU is added for it.

`combine` then reads the vGPU's advice and the GPU's load beside this one and names the case
when they disagree (`Combined`): a CPU-bound VM whose GPU idles (do not upsize the vGPU), a
GPU-bound VM whose vCPUs idle (the vGPU, not vCPUs), a VM short of RAM whose frame buffer is
fine (RAM, not a bigger vGPU), a VM slowed by host contention (move it or lower the host's
overcommit).
"""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime

from telemetry.aggregation import percentile_nearest_rank

UPSIZE = "upsize"
DOWNSIZE = "downsize"
KEEP = "keep"
INSUFFICIENT_DATA = "insufficient_data"
MIB_PER_GIB = 1024
#: The RAM sizes advice picks from, GiB.
RAM_STEPS_GIB = (4, 6, 8, 12, 16, 24, 32, 48, 64, 96, 128, 192, 256, 384, 512)


@dataclass(frozen=True)
class GuestHour:
    """One hourly guest rollup of a VM (telemetry's GuestRollup at step 3600)."""

    start: datetime
    samples: int
    vcpus: int
    ram_mib: int
    vcpu_util_avg: float | None = None
    vcpu_util_p95: float | None = None
    vcpu_max_util_p95: float | None = None
    vcpu_max_util_max: float | None = None
    cpu_steal_pct_avg: float | None = None
    ram_used_mib_p95: float | None = None
    ram_used_mib_max: float | None = None


@dataclass(frozen=True)
class GuestThresholds:
    """The figures vCPU and RAM advice turns on; admins may tune them."""

    min_covered_hours: int = 72
    min_active_hours: int = 24
    idle_cpu_pct: float = 5.0  # an hour whose vCPUs together and busiest vCPU stay below this is idle
    cpu_high_pct: float = 80.0
    cpu_target_pct: float = 60.0
    cpu_low_pct: float = 25.0
    single_busy_pct: float = 60.0
    single_thread_pct: float = 90.0
    steal_high_pct: float = 5.0
    ram_high_pct: float = 90.0
    ram_target_pct: float = 70.0
    ram_low_pct: float = 50.0
    # A workstation below these runs its OS and DCC application badly whatever it measured.
    min_vcpus: int = 4
    min_ram_gib: int = 8


@dataclass(frozen=True)
class HostRoom:
    """What the VM's host can still give it: vCPUs and GiB under its overcommit, less what its VMs claim."""

    host: str
    vcpus: int
    ram_gib: int


@dataclass(frozen=True)
class GuestAdvice:
    """vCPU and RAM advice for one VM; `evidence` is JSON-serialisable (the figures behind it)."""

    cpu_action: str
    vcpus: int
    ram_action: str
    ram_gib: int
    suggested_vcpus: int | None = None
    suggested_ram_gib: int | None = None
    single_thread_bound: bool = False
    steal_high: bool = False
    reasons: tuple[str, ...] = ()
    evidence: dict = field(default_factory=dict)

    @property
    def reason(self) -> str:
        return " ".join(self.reasons)


def is_worked_hour(hour: GuestHour, thresholds: GuestThresholds) -> bool:
    """Whether the guest did anything in the hour: its vCPUs together or its busiest one above
    `idle_cpu_pct` (an idle desktop's background stays below)."""
    figures = [v for v in (hour.vcpu_util_p95, hour.vcpu_max_util_p95) if v is not None]
    return any(v >= thresholds.idle_cpu_pct for v in figures)


def _p95(values: Sequence[float | None]) -> float | None:
    present = [v for v in values if v is not None]
    return percentile_nearest_rank(present, 95) if present else None


def _mean(values: Sequence[float | None]) -> float | None:
    present = [v for v in values if v is not None]
    return sum(present) / len(present) if present else None


def _ram_step(gib: float) -> int:
    """The smallest size of the ladder holding `gib`; past its top, whole 64 GiB."""
    for step in RAM_STEPS_GIB:
        if step >= gib - 1e-9:
            return step
    return int(math.ceil(gib / 64) * 64)


def _cpu(hours: Sequence[GuestHour], vcpus: int, t: GuestThresholds, room: HostRoom | None, evidence: dict):
    """(action, suggested vCPUs, single-thread bound, steal high, reasons) for the CPU."""
    covered = [h for h in hours if h.vcpus == vcpus and (h.vcpu_util_p95 is not None or h.vcpu_util_avg is not None)]
    worked = [h for h in covered if is_worked_hour(h, t)]
    evidence.update(cpu_covered_hours=len(covered), cpu_active_hours=len(worked))
    if len(covered) < t.min_covered_hours or len(worked) < t.min_active_hours:
        return INSUFFICIENT_DATA, None, False, False, (
            f"vCPUs: {len(covered)} h of guest CPU readings at {vcpus} vCPUs ({len(worked)} worked); advice needs "
            f"{t.min_covered_hours} h with {t.min_active_hours} worked.",)
    util = _p95([h.vcpu_util_p95 if h.vcpu_util_p95 is not None else h.vcpu_util_avg for h in worked])
    busiest = _p95([h.vcpu_max_util_p95 for h in worked])
    peak = max((h.vcpu_max_util_max for h in worked if h.vcpu_max_util_max is not None), default=None)
    steal = _mean([h.cpu_steal_pct_avg for h in worked])
    evidence.update(vcpu_util_p95=util, vcpu_max_util_p95=busiest, vcpu_max_util_max=peak, cpu_steal_pct_avg=steal)
    steal_high = steal is not None and steal >= t.steal_high_pct
    single = busiest is not None and busiest >= t.single_thread_pct and util < t.cpu_high_pct
    reasons = []
    if steal_high:
        reasons.append(f"Its vCPUs wait {steal:.1f} % of the time for a host CPU (steal): the host is contended; "
                       "more vCPUs would wait too.")
    if util >= t.cpu_high_pct and not steal_high:
        wanted = max(vcpus + 1, math.ceil(vcpus * util / t.cpu_target_pct))
        if room is not None and wanted - vcpus > room.vcpus:
            capped = vcpus + max(0, room.vcpus)
            reasons.append(f"vCPUs: p95 {util:.0f} % of its {vcpus} vCPUs; {wanted} would bring it to "
                           f"{t.cpu_target_pct:.0f} %, but {room.host} has room for {max(0, room.vcpus)} more.")
            return (UPSIZE if capped > vcpus else KEEP), (capped if capped > vcpus else None), single, steal_high, \
                tuple(reasons)
        reasons.append(f"vCPUs: p95 {util:.0f} % of its {vcpus} vCPUs together: {wanted} bring it to about "
                       f"{t.cpu_target_pct:.0f} %.")
        return UPSIZE, wanted, single, steal_high, tuple(reasons)
    if single:
        reasons.append(f"vCPUs: one vCPU is saturated (busiest p95 {busiest:.0f} %) while the {vcpus} together stay "
                       f"at p95 {util:.0f} %: a single-threaded load, which more vCPUs do not speed up.")
        return KEEP, None, True, steal_high, tuple(reasons)
    if util < t.cpu_low_pct and (busiest is None or busiest < t.single_busy_pct):
        wanted = max(t.min_vcpus, math.ceil(vcpus * util / t.cpu_target_pct))
        if wanted < vcpus:
            reasons.append(f"vCPUs: p95 {util:.0f} % of its {vcpus} vCPUs, busiest vCPU p95 "
                           f"{0 if busiest is None else busiest:.0f} %: {wanted} would carry the same load at about "
                           f"{min(100.0, util * vcpus / wanted):.0f} %.")
            return DOWNSIZE, wanted, False, steal_high, tuple(reasons)
    reasons.append(f"vCPUs: p95 {util:.0f} % of its {vcpus} vCPUs, busiest vCPU p95 "
                   f"{0 if busiest is None else busiest:.0f} %: the right count.")
    return KEEP, None, False, steal_high, tuple(reasons)


def _ram(hours: Sequence[GuestHour], ram_gib: int, t: GuestThresholds, room: HostRoom | None, evidence: dict):
    """(action, suggested GiB, reasons) for the RAM."""
    sized = [h for h in hours if math.ceil(h.ram_mib / MIB_PER_GIB) == ram_gib]
    covered = [h for h in sized if h.ram_used_mib_p95 is not None or h.ram_used_mib_max is not None]
    evidence.update(ram_covered_hours=len(covered), ram_unreported_hours=len(sized) - len(covered))
    if len(covered) < t.min_covered_hours:
        why = (" (the guest reports no memory use: install the balloon driver or the hypervisor's guest tools)"
               if sized and not covered else "")
        return INSUFFICIENT_DATA, None, (f"RAM: {len(covered)} h of memory readings at {ram_gib} GiB{why}; advice "
                                         f"needs {t.min_covered_hours} h.",)
    p95 = _p95([h.ram_used_mib_p95 if h.ram_used_mib_p95 is not None else h.ram_used_mib_max for h in covered])
    peak = max(h.ram_used_mib_max if h.ram_used_mib_max is not None else h.ram_used_mib_p95 for h in covered)
    alloc_mib = ram_gib * MIB_PER_GIB
    evidence.update(ram_used_mib_p95=p95, ram_used_mib_max=peak, ram_mib=alloc_mib)
    p95_pct, peak_pct = 100.0 * p95 / alloc_mib, 100.0 * peak / alloc_mib
    if p95_pct > t.ram_high_pct:
        wanted = _ram_step(p95 * 100.0 / t.ram_target_pct / MIB_PER_GIB)
        if room is not None and wanted - ram_gib > room.ram_gib:
            capped = _largest_step_within(ram_gib + max(0, room.ram_gib))
            message = (f"RAM: the guest uses p95 {p95 / MIB_PER_GIB:.1f} of its {ram_gib} GiB ({p95_pct:.0f} %); "
                       f"{wanted} GiB would leave headroom, but {room.host} has room for {max(0, room.ram_gib)} GiB "
                       "more.")
            if capped > ram_gib:
                return UPSIZE, capped, (message,)
            return KEEP, None, (message,)
        return UPSIZE, wanted, (f"RAM: the guest uses p95 {p95 / MIB_PER_GIB:.1f} of its {ram_gib} GiB "
                                f"({p95_pct:.0f} %): {wanted} GiB bring it to about "
                                f"{100.0 * p95 / (wanted * MIB_PER_GIB):.0f} %.",)
    if peak_pct < t.ram_low_pct:
        wanted = max(t.min_ram_gib, _ram_step(peak * 100.0 / t.ram_target_pct / MIB_PER_GIB))
        if wanted < ram_gib:
            return DOWNSIZE, wanted, (f"RAM: the guest never used more than {peak / MIB_PER_GIB:.1f} of its "
                                      f"{ram_gib} GiB ({peak_pct:.0f} %): {wanted} GiB hold that peak at about "
                                      f"{100.0 * peak / (wanted * MIB_PER_GIB):.0f} %, and the rest goes back "
                                      "to the host.",)
    return KEEP, None, (f"RAM: the guest uses p95 {p95 / MIB_PER_GIB:.1f} of its {ram_gib} GiB, peak "
                        f"{peak / MIB_PER_GIB:.1f}: the right size.",)


def _largest_step_within(gib: int) -> int:
    return max((step for step in RAM_STEPS_GIB if step <= gib), default=gib)


def advise_guest(hours: Sequence[GuestHour], vcpus: int, ram_gib: int, thresholds: GuestThresholds = GuestThresholds(),
                 room: HostRoom | None = None) -> GuestAdvice:
    """vCPU and RAM advice for a VM with `vcpus` and `ram_gib` now, from its hourly guest
    rollups over the window; `room` bounds an increase (see the module docstring)."""
    evidence: dict = {}
    cpu_action, vcpus_to, single, steal_high, cpu_reasons = _cpu(hours, vcpus, thresholds, room, evidence)
    ram_action, ram_to, ram_reasons = _ram(hours, ram_gib, thresholds, room, evidence)
    evidence = {key: (round(value, 2) if isinstance(value, float) else value) for key, value in evidence.items()}
    return GuestAdvice(cpu_action=cpu_action, vcpus=vcpus, ram_action=ram_action, ram_gib=ram_gib,
                       suggested_vcpus=vcpus_to, suggested_ram_gib=ram_to, single_thread_bound=single,
                       steal_high=steal_high, reasons=cpu_reasons + ram_reasons, evidence=evidence)


# GPU and CPU together ----------------------------------------------------------------------------

CPU_BOUND = "cpu_bound"
GPU_BOUND = "gpu_bound"
MEMORY_BOUND = "memory_bound"
HOST_CONTENDED = "host_contended"


@dataclass(frozen=True)
class Combined:
    """What the vGPU's and the guest's advice say together, when they disagree or one explains
    the other: `kind`, the sentence for people, and whether the vGPU's upsize should stand."""

    kind: str
    message: str
    keep_vgpu: bool = False


def combine(gpu_action: str, gpu_util_p95: float | None, guest: GuestAdvice, *, gpu_busy_pct: float = 80.0,
            gpu_idle_pct: float = 30.0, fb_pressure: bool = False) -> Combined | None:
    """The combined reading of a VM's vGPU advice (`gpu_action`, its GPU's utilization p95 over
    worked hours, `fb_pressure`: the frame buffer is what drives an upsize) and its guest advice;
    None when they agree or say nothing of each other."""
    gpu_idle = gpu_util_p95 is not None and gpu_util_p95 < gpu_idle_pct
    gpu_busy = gpu_util_p95 is not None and gpu_util_p95 >= gpu_busy_pct
    if guest.steal_high:
        return Combined(HOST_CONTENDED, "Its vCPUs often wait for a host CPU: the host is overcommitted for its load. "
                                        "Move the VM to a quieter host or lower the host's vCPU overcommit; a bigger "
                                        "vGPU or more vCPUs would not help.", keep_vgpu=not fb_pressure)
    if guest.single_thread_bound and gpu_idle:
        return Combined(CPU_BOUND, f"The GPU idles (p95 {gpu_util_p95:.0f} %) while one vCPU is saturated: a "
                                   "CPU-bound, single-threaded workflow. Fewer but faster cores (a host with a higher "
                                   "clock) help; do not upsize the vGPU" + (
                                       " for speed (its frame buffer still needs the upsize)." if fb_pressure
                                       else "."), keep_vgpu=not fb_pressure)
    if gpu_busy and guest.cpu_action in (KEEP, DOWNSIZE) and not guest.single_thread_bound \
            and guest.cpu_action != INSUFFICIENT_DATA:
        return Combined(GPU_BOUND, f"The GPU is busy (p95 {gpu_util_p95:.0f} %) while the vCPUs are not: the GPU "
                                   "limits this workstation; a larger vGPU share (or a less crowded GPU) helps, more "
                                   "vCPUs would not.")
    if guest.ram_action == UPSIZE and gpu_action != "upsize":
        return Combined(MEMORY_BOUND, "The guest is short of RAM while its frame buffer is fine: add RAM, not a "
                                      "bigger vGPU.")
    return None


def evidence_key(gpu_key: str, guest: GuestAdvice, combined: Combined | None) -> str:
    """The suggestion's digest with the guest's advice folded in (see `sizing.engine.evidence_key`,
    on which a dismissal turns): the vCPU and RAM actions and sizes and the combined reading,
    without figures, so an hourly refresh does not bring back a dismissed suggestion. A VM with
    no guest advice at all keeps the vGPU's key as it was."""
    parts = {"cpu": guest.cpu_action, "vcpus": guest.suggested_vcpus, "ram": guest.ram_action,
             "ram_gib": guest.suggested_ram_gib, "combined": combined.kind if combined else None}
    if guest.cpu_action == INSUFFICIENT_DATA and guest.ram_action == INSUFFICIENT_DATA and combined is None:
        return gpu_key
    return hashlib.sha256(f"{gpu_key}:{json.dumps(parts, sort_keys=True)}".encode()).hexdigest()

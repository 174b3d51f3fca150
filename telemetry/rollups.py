"""Building the 5-minute and hourly rollups from raw samples, resumably.

One series per entity kind and step: `gpu:300`, `vm:300`, `guest:300` (a VM's guest CPU and
memory, `GuestSample`), and the same at 3600, each with a `RollupCheckpoint` whose `done_until`
says that every bucket starting before it is built.

How a run works (`build_rollups(step_s)`):

- **Which buckets.** From the checkpoint (or, on the very first run, from the bucket of the
  oldest raw sample) up to the last complete bucket: a bucket is complete once `now` has
  passed its end; the bucket in progress is never written. Stretches without samples are
  skipped with one indexed query, so a fleet that was off for a week costs nothing to cross.
- **Bounded work.** At most `max_buckets` buckets holding samples per run
  (TELEMETRY_ROLLUP_MAX_BUCKETS); the next run carries on from the checkpoint.
- **Half-finished buckets are redone** (Zulip's analytics): a bucket's rollup rows and the
  checkpoint move forward in one transaction, so a run that dies mid-bucket leaves the
  checkpoint before that bucket and the next run builds it again.
- **Late samples.** Samples reach us a poll or two after they were taken, so each run also
  re-aggregates the complete buckets that ended less than TELEMETRY_ROLLUP_LATE_S ago (default
  120 s: twelve 10-second polls), even though the checkpoint has passed them. A sample later
  than that is folded in only after `rewind_rollups(since)` moves the checkpoints back (for
  ingest of old documents or a backfill).
- **Heatmap strips.** A bucket's 5-minute GPU rollups are written into the GPUs' strips of
  the day in the same transaction (`telemetry.strips`), late and rebuilt buckets included.
- **Idempotent.** Rows are upserted on their unique key (entity, step, bucket) with
  `bulk_create(update_conflicts=True)`, so a rerun, a redo or two workers racing write the
  same figures; the checkpoint only ever moves forward, except by `rewind_rollups`.

Both steps read raw samples, hourly ones included: the hourly p95 is then the exact p95 of
the hour's readings (a p95 cannot be derived from 5-minute p95s), at the price of reading
each raw row twice. Raw samples are kept (TELEMETRY_RETENTION_RAW_DAYS, 14 days) far longer
than the hourly series lags, and retention never prunes a sample a series has not passed.

A VM's rollup merges its vGPUs at each timestamp first (frame buffer summed, utilization the
busiest vGPU's), then aggregates those points; `samples` counts timestamps. Its
`profile_fb_mib` is what the VM's current vGPU profiles give it when the bucket is built, so a
bucket rebuilt after a resize shows the new size.

A VM bucket is `partial` when at some timestamp in it fewer of the VM's vGPUs reported than it
declares then (by GPU: samples are unique per VM, GPU and instant), e.g. one vGPU of a
two-vGPU VM unreadable for a poll. Its frame buffer at that instant is a share of the VM's, so
the bucket understates the VM's use: right-sizing (`sizing.suggestions`) leaves such buckets
out rather than read a half as the whole and suggest a downsize. A poll missed whole (no
reading of any vGPU) leaves no point, and does not make the bucket partial.

Aggregates are computed in Python over rows streamed per bucket, sorted by entity
(`values_list().iterator()`, no model instances; memory holds one entity's readings at a time),
so they mean the same on SQLite and PostgreSQL; definitions (nearest-rank p95, nulls left out)
are in `telemetry.aggregation`.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from itertools import groupby
from operator import itemgetter

from django.conf import settings
from django.db import IntegrityError, transaction
from django.db.models import Count, Sum
from django.utils import timezone

from fleet.models import Gpu, Vgpu, VirtualMachine
from telemetry import strips
from telemetry.aggregation import bucket_floor, max_or_none, sum_or_none, summarize
from telemetry.metrics import FIVE_MINUTES
from telemetry.models import (
    ROLLUP_STEPS_S,
    GpuRollup,
    GpuSample,
    GuestRollup,
    GuestSample,
    RollupCheckpoint,
    VgpuSample,
    VmRollup,
)

logger = logging.getLogger(__name__)

KINDS = ("gpu", "vm", "guest")

#: Rows fetched per round trip while streaming one bucket's samples.
CHUNK_ROWS = 5000
#: Rollup rows per INSERT ... ON CONFLICT statement.
WRITE_BATCH = 1000

_GPU_FIELDS = ("util_gpu", "util_mem", "fb_used_mib", "fb_total_mib", "enc_util", "dec_util", "temp_c",
               "power_w", "sm_clock_mhz")
_VM_FIELDS = ("fb_used_mib", "util_gpu", "util_mem", "enc_util", "dec_util")
_GUEST_FIELDS = ("vcpus", "ram_mib", "vcpu_util", "vcpu_max_util", "cpu_steal_pct", "ram_used_mib")

_COMMON_UPDATE = ["samples", "util_gpu_avg", "util_gpu_max", "util_gpu_p95", "util_mem_avg", "util_mem_max",
                  "fb_used_mib_avg", "fb_used_mib_max", "fb_used_mib_p95", "enc_util_avg", "enc_util_max",
                  "dec_util_avg", "dec_util_max"]
GPU_ROLLUP_UPDATE_FIELDS = [*_COMMON_UPDATE, "fb_total_mib", "temp_c_avg", "temp_c_max", "power_w_avg",
                            "power_w_max", "sm_clock_mhz_avg"]
VM_ROLLUP_UPDATE_FIELDS = [*_COMMON_UPDATE, "profile_fb_mib", "partial"]
GUEST_ROLLUP_UPDATE_FIELDS = ["samples", "vcpus", "ram_mib", "vcpu_util_avg", "vcpu_util_p95", "vcpu_util_max",
                              "vcpu_max_util_avg", "vcpu_max_util_p95", "vcpu_max_util_max", "cpu_steal_pct_avg",
                              "cpu_steal_pct_max", "ram_used_mib_avg", "ram_used_mib_p95", "ram_used_mib_max"]
_SAMPLES = {"gpu": GpuSample, "vm": VgpuSample, "guest": GuestSample}
#: Per kind: the rollup model, the entity its unique key starts with, and the columns a rebuild rewrites.
_ROLLUP_WRITES = {
    "gpu": (GpuRollup, "gpu", GPU_ROLLUP_UPDATE_FIELDS),
    "vm": (VmRollup, "vm", VM_ROLLUP_UPDATE_FIELDS),
    "guest": (GuestRollup, "vm", GUEST_ROLLUP_UPDATE_FIELDS),
}


def checkpoint_name(kind: str, step_s: int) -> str:
    return f"{kind}:{step_s}"


@dataclass
class SeriesResult:
    """What one run did for one series; `done_until` is the checkpoint after the run."""

    name: str
    buckets: int = 0
    samples: int = 0
    rows: int = 0
    done_until: datetime | None = None
    seconds: float = 0.0

    def as_dict(self) -> dict:
        return {"name": self.name, "buckets": self.buckets, "samples": self.samples, "rows": self.rows,
                "done_until": self.done_until.isoformat() if self.done_until else None,
                "seconds": round(self.seconds, 3)}


@dataclass
class BuildResult:
    step_s: int
    series: list[SeriesResult] = field(default_factory=list)

    @property
    def samples(self) -> int:
        return sum(s.samples for s in self.series)

    def as_dict(self) -> dict:
        return {"step_s": self.step_s, "series": [s.as_dict() for s in self.series]}


# Aggregation of one bucket ------------------------------------------------------------------


def gpu_rollup(step_s: int, bucket: datetime, gpu_id: int, rows: list[tuple]) -> GpuRollup:
    """One GPU's rollup from its readings in the bucket (tuples in the order of _GPU_FIELDS)."""
    (util_gpu, util_mem, fb_used, fb_total, enc, dec, temp, power, sm_clock) = zip(*rows, strict=True)
    ug, um, fb, en, de, te, po, sm = map(summarize, (util_gpu, util_mem, fb_used, enc, dec, temp, power, sm_clock))
    return GpuRollup(
        gpu_id=gpu_id, step_s=step_s, bucket=bucket, samples=len(rows),
        util_gpu_avg=ug.avg, util_gpu_max=ug.max, util_gpu_p95=ug.p95,
        util_mem_avg=um.avg, util_mem_max=um.max,
        fb_used_mib_avg=fb.avg, fb_used_mib_max=fb.max, fb_used_mib_p95=fb.p95,
        enc_util_avg=en.avg, enc_util_max=en.max, dec_util_avg=de.avg, dec_util_max=de.max,
        fb_total_mib=max_or_none(fb_total),
        temp_c_avg=te.avg, temp_c_max=te.max, power_w_avg=po.avg, power_w_max=po.max,
        sm_clock_mhz_avg=sm.avg,
    )


def vm_points(rows: list[tuple]) -> list[list]:
    """One VM's readings `(ts, fb_used_mib, util_gpu, util_mem, enc_util, dec_util)` of its vGPUs,
    sorted by time, merged into one point a timestamp: frame buffer summed over its vGPUs,
    utilization the max (a VM with two vGPUs is as busy as its busiest one). Missing readings
    stay None."""
    points: list[list] = []
    last_ts = None
    for ts, fb, util_gpu, util_mem, enc, dec in rows:
        if ts != last_ts:
            points.append([fb, util_gpu, util_mem, enc, dec])
            last_ts = ts
            continue
        point = points[-1]
        point[0] = sum_or_none((point[0], fb))
        for i, value in enumerate((util_gpu, util_mem, enc, dec), start=1):
            point[i] = max_or_none((point[i], value))
    return points


def fewest_readings(rows: list[tuple]) -> int:
    """The fewest vGPU readings at one timestamp among one VM's readings `(ts, ...)`, sorted by time."""
    return min(sum(1 for _ in group) for _, group in groupby(rows, key=itemgetter(0))) if rows else 0


def vm_rollup(step_s: int, bucket: datetime, vm_id: int, points: list[list], profile_fb_mib: float | None,
              partial: bool = False) -> VmRollup:
    """One VM's rollup from its merged points in the bucket (see `vm_points`); `partial` when some
    point lacks one of its declared vGPUs (see the module docstring)."""
    fb_used, util_gpu, util_mem, enc, dec = zip(*points, strict=True)
    fb, ug, um, en, de = map(summarize, (fb_used, util_gpu, util_mem, enc, dec))
    return VmRollup(
        vm_id=vm_id, step_s=step_s, bucket=bucket, samples=len(points),
        util_gpu_avg=ug.avg, util_gpu_max=ug.max, util_gpu_p95=ug.p95,
        util_mem_avg=um.avg, util_mem_max=um.max,
        fb_used_mib_avg=fb.avg, fb_used_mib_max=fb.max, fb_used_mib_p95=fb.p95,
        enc_util_avg=en.avg, enc_util_max=en.max, dec_util_avg=de.avg, dec_util_max=de.max,
        profile_fb_mib=profile_fb_mib, partial=partial,
    )


def guest_rollup(step_s: int, bucket: datetime, vm_id: int, rows: list[tuple]) -> GuestRollup:
    """One VM's guest rollup from its readings in the bucket (tuples in the order of _GUEST_FIELDS)."""
    vcpus, ram_mib, vcpu_util, vcpu_max, steal, ram_used = zip(*rows, strict=True)
    cpu, busiest, waited, ram = map(summarize, (vcpu_util, vcpu_max, steal, ram_used))
    return GuestRollup(
        vm_id=vm_id, step_s=step_s, bucket=bucket, samples=len(rows), vcpus=max(vcpus), ram_mib=max(ram_mib),
        vcpu_util_avg=cpu.avg, vcpu_util_p95=cpu.p95, vcpu_util_max=cpu.max,
        vcpu_max_util_avg=busiest.avg, vcpu_max_util_p95=busiest.p95, vcpu_max_util_max=busiest.max,
        cpu_steal_pct_avg=waited.avg, cpu_steal_pct_max=waited.max,
        ram_used_mib_avg=ram.avg, ram_used_mib_p95=ram.p95, ram_used_mib_max=ram.max,
    )


def current_profile_fb() -> dict[int, tuple[float, int]]:
    """By VM id: the frame buffer its current vGPUs give it (sum of their profiles, MiB) and the
    number of GPUs they sit on (readings a complete timestamp holds)."""
    totals = Vgpu.objects.order_by().values("vm_id").annotate(
        fb=Sum("profile__fb_mib"), gpus=Count("gpu_id", distinct=True)).values_list("vm_id", "fb", "gpus")
    return {vm_id: (float(fb), gpus) for vm_id, fb, gpus in totals}


class _Series:
    """One checkpointed series: reading a bucket's raw samples and turning them into rollups."""

    def __init__(self, kind: str, step_s: int):
        self.kind = kind
        self.step_s = step_s
        self.name = checkpoint_name(kind, step_s)
        self.samples_model = _SAMPLES[kind]
        self._profile_fb: dict[int, tuple[float, int]] | None = None

    def next_bucket(self, since: datetime, before: datetime) -> datetime | None:
        """Start of the first bucket at or after `since` that holds a sample, if it starts before
        `before` (one query on the `ts` index)."""
        ts = (self.samples_model.objects.filter(ts__gte=since, ts__lt=before).order_by("ts")
              .values_list("ts", flat=True).first())
        return bucket_floor(ts, self.step_s) if ts is not None else None

    def oldest_bucket(self) -> datetime | None:
        ts = self.samples_model.objects.order_by("ts").values_list("ts", flat=True).first()
        return bucket_floor(ts, self.step_s) if ts is not None else None

    def aggregate(self, bucket: datetime) -> tuple[int, list[GpuRollup] | list[VmRollup]]:
        """The rollups of `bucket` and the number of samples read. Rows stream sorted by entity,
        so memory holds one entity's readings at a time, not the bucket's (an hour of a large
        fleet is millions of rows)."""
        end = bucket + timedelta(seconds=self.step_s)
        samples = self.samples_model.objects.filter(ts__gte=bucket, ts__lt=end)
        # Only entities that exist: a poll that raced a deletion leaves rows naming a GPU or VM
        # that is gone (telemetry.models.SAMPLE_REFERENCE), and a rollup must not name it.
        if self.kind == "gpu":
            samples = samples.filter(gpu_id__in=Gpu.objects.values("pk"))
        else:
            samples = samples.filter(vm_id__in=VirtualMachine.objects.values("pk"))
        count = 0
        rollups = []
        if self.kind == "guest":
            rows = samples.order_by("vm_id").values_list("vm_id", *_GUEST_FIELDS).iterator(chunk_size=CHUNK_ROWS)
            for vm_id, group in groupby(rows, key=itemgetter(0)):
                readings = [row[1:] for row in group]
                count += len(readings)
                rollups.append(guest_rollup(self.step_s, bucket, vm_id, readings))
            return count, rollups
        if self.kind == "gpu":
            rows = samples.order_by("gpu_id").values_list("gpu_id", *_GPU_FIELDS).iterator(chunk_size=CHUNK_ROWS)
            for gpu_id, group in groupby(rows, key=itemgetter(0)):
                readings = [row[1:] for row in group]
                count += len(readings)
                rollups.append(gpu_rollup(self.step_s, bucket, gpu_id, readings))
            return count, rollups
        if self._profile_fb is None:
            self._profile_fb = current_profile_fb()
        rows = samples.order_by("vm_id", "ts").values_list("vm_id", "ts", *_VM_FIELDS).iterator(chunk_size=CHUNK_ROWS)
        for vm_id, group in groupby(rows, key=itemgetter(0)):
            readings = [row[1:] for row in group]
            count += len(readings)
            profile_fb, gpus = self._profile_fb.get(vm_id, (None, 0))
            rollups.append(vm_rollup(self.step_s, bucket, vm_id, vm_points(readings), profile_fb,
                                     partial=fewest_readings(readings) < gpus))
        return count, rollups

    def write(self, bucket: datetime, rollups: list) -> None:
        """Upsert on the rollup's unique key: a rerun or a rebuild overwrites, never duplicates.
        5-minute GPU rollups write their bucket into the heatmap strips too (`telemetry.strips`)."""
        model, entity, update_fields = _ROLLUP_WRITES[self.kind]
        model.objects.bulk_create(
            rollups, batch_size=WRITE_BATCH, update_conflicts=True, unique_fields=[entity, "step_s", "bucket"],
            update_fields=update_fields,
        )
        if self.kind == "gpu" and self.step_s == FIVE_MINUTES:
            strips.write_bucket(bucket, rollups)


# Checkpoints -------------------------------------------------------------------------------


def _advance_checkpoint(name: str, until: datetime) -> None:
    """Move the checkpoint forward to `until` (never back: a slower concurrent run must not undo
    a faster one's progress), creating it on the first run."""
    moved = RollupCheckpoint.objects.filter(name=name, done_until__lt=until).update(
        done_until=until, updated_at=timezone.now(),
    )
    if moved:
        return
    try:
        with transaction.atomic():
            RollupCheckpoint.objects.get_or_create(name=name, defaults={"done_until": until})
    except IntegrityError:  # another run created it between our two statements
        _advance_checkpoint(name, until)


def rewind_rollups(since: datetime) -> int:
    """Move every checkpoint past `since` back to the bucket holding it, so the next runs rebuild
    from there (samples that arrived after the late window, a backfill). Returns how many moved."""
    moved = 0
    for step_s in ROLLUP_STEPS_S:
        start = bucket_floor(since, step_s)
        names = [checkpoint_name(kind, step_s) for kind in KINDS]
        moved += RollupCheckpoint.objects.filter(name__in=names, done_until__gt=start).update(
            done_until=start, updated_at=timezone.now(),
        )
    return moved


# The build ---------------------------------------------------------------------------------


def _build_series(series: _Series, now: datetime, max_buckets: int, late_s: float) -> SeriesResult:
    started = time.perf_counter()
    step = timedelta(seconds=series.step_s)
    horizon = bucket_floor(now, series.step_s)  # start of the bucket in progress: the end of work
    result = SeriesResult(series.name)
    checkpoint = RollupCheckpoint.objects.filter(name=series.name).values_list("done_until", flat=True).first()
    if checkpoint is None:
        cursor = series.oldest_bucket()
        if cursor is None:
            return result  # no sample yet: the first run with samples starts at the oldest
    else:
        # Buckets that closed within the late window are built again: samples still trickle in.
        cursor = min(checkpoint, bucket_floor(now - timedelta(seconds=late_s), series.step_s))
    caught_up = False
    while True:
        bucket = series.next_bucket(cursor, horizon) if cursor < horizon else None
        if bucket is None:
            caught_up = True
            break
        if result.buckets >= max_buckets:
            break
        # Read outside the transaction (SQLite's write lock is taken at BEGIN); the rows and the
        # checkpoint then commit together, so a run that dies here leaves the bucket to redo.
        samples, built = series.aggregate(bucket)
        with transaction.atomic():
            series.write(bucket, built)
            cursor = bucket + step
            _advance_checkpoint(series.name, cursor)
        result.buckets += 1
        result.samples += samples
        result.rows += len(built)
    if caught_up:
        # No sample left before the horizon: the empty stretch up to it is done too.
        _advance_checkpoint(series.name, horizon)
    result.done_until = RollupCheckpoint.objects.filter(name=series.name).values_list(
        "done_until", flat=True).first()
    result.seconds = time.perf_counter() - started
    return result


def build_rollups(step_s: int, now: datetime | None = None, max_buckets: int | None = None,
                  late_s: float | None = None) -> BuildResult:
    """Build the complete `step_s` buckets (300 or 3600) of GPUs, VMs and guests that are not built yet,
    at most `max_buckets` holding samples per series, and rebuild those that closed within the
    last `late_s` seconds. Safe to run twice or concurrently; see the module docstring."""
    if step_s not in ROLLUP_STEPS_S:
        raise ValueError(f"step_s must be one of {ROLLUP_STEPS_S}, not {step_s!r}")
    now = now or timezone.now()
    max_buckets = settings.TELEMETRY_ROLLUP_MAX_BUCKETS if max_buckets is None else max_buckets
    late_s = settings.TELEMETRY_ROLLUP_LATE_S if late_s is None else late_s
    result = BuildResult(step_s)
    for kind in KINDS:
        series_result = _build_series(_Series(kind, step_s), now, max_buckets, late_s)
        result.series.append(series_result)
        if series_result.buckets:
            logger.info("rollups %s: %d buckets, %d samples, %d rows in %.2f s, done until %s",
                        series_result.name, series_result.buckets, series_result.samples, series_result.rows,
                        series_result.seconds, series_result.done_until)
    return result

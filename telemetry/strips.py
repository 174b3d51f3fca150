"""Heatmap strips: each GPU's UTC day of a % metric as the typed heatmap's codes (`GpuStrip`),
kept beside the 5-minute rollups so that the GPU x time heatmap at 5-minute steps reads two
short rows a GPU for 24 h instead of 288 rollups (docs/benchmarks.md, "Heatmap").

Why it is built this way:

- **Only fixed scales.** A % metric is drawn from 0 to 100 whatever the cells, so a bucket's
  code does not depend on the request and can be written once (`heatmap_codec.fixed_codes`,
  the arithmetic of the typed heatmap's SQL). Other metrics take their scale from the cells
  of each request and are read from the rollups.
- **Written with the rollups.** `build_rollups` calls `write_bucket` in the transaction that
  writes a bucket's 5-minute GPU rollups, whether the bucket is new, rebuilt for late samples
  or rebuilt after `rewind_rollups`: only the (GPU, series, day) rows of that bucket change,
  one byte each. On PostgreSQL the database changes the byte in place (`overlay`), so a run
  sends one byte a GPU and series; elsewhere the rows are read and written back.
- **Coverage.** Rollups written before strips existed (an upgrade) have none: `StripCoverage`
  says from when on every rollup has its strip (from the beginning on a new installation), and
  the heatmap reads strips only for a range starting then or later. `rebuild_days`
  (`manage.py build_heatmap_strips`) writes the strips of older rollups and moves the coverage
  back.
- **Retention.** `telemetry.retention` deletes the strips of days whose 5-minute rollups are
  gone (`expired`) and moves the coverage past them (`uncover_before`).

`fb_used_pct` is encoded with the GPU's capacity when the bucket is written (its reported
total, else its model's), as the VM rollups keep the profile size of their time.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Sequence
from datetime import UTC, date, datetime, time, timedelta

from django.db import connection, transaction
from django.db.models import QuerySet
from django.utils import timezone

from fleet.models import Gpu
from telemetry import heatmap_codec
from telemetry.metrics import FIVE_MINUTES, METRICS
from telemetry.models import GpuRollup, GpuStrip, StripCoverage

logger = logging.getLogger(__name__)

#: Buckets of a strip: a UTC day of 5-minute buckets.
BUCKETS_PER_DAY = 86400 // FIVE_MINUTES
#: The name of the coverage of the 5-minute GPU strips.
COVERAGE = "gpu:300"
#: The coverage of an installation whose every rollup was written with its strips.
BEGINNING = datetime(1970, 1, 1, tzinfo=UTC)
#: The metrics drawn on the fixed 0-100 scale (telemetry.heatmap.UNITS "%"), whose strips are kept.
PERCENT_METRICS = ("util_gpu", "util_mem", "fb_used_pct", "enc_util", "dec_util")
SCALE = (0.0, 100.0)
#: Strips written per statement when whole days are written.
WRITE_BATCH = 2000
#: The PostgreSQL advisory lock of the strips' writers (an arbitrary number of this product's).
_LOCK_KEY = 0x53545250


def series_name(metric: str, stat: str) -> str:
    """The series of a metric and statistic: the rollup column (`util_gpu_avg`), or for the frame
    buffer share `fb_used_pct_<stat>`."""
    return f"{metric}_{stat}"


#: Every series kept: (name, metric, stat).
SERIES = tuple((series_name(metric, stat), metric, stat) for metric in PERCENT_METRICS
               for stat in METRICS[metric].stats)
SERIES_NAMES = frozenset(name for name, _, _ in SERIES)
_BLANK = bytes([heatmap_codec.NULL_CODE]) * BUCKETS_PER_DAY
#: The rollup columns the series read, and the capacity columns of fb_used_pct.
_COLUMNS = tuple(dict.fromkeys(METRICS[metric].column(stat) for _, metric, stat in SERIES))


def day_of(bucket: datetime) -> tuple[date, int]:
    """The UTC day of a 5-minute bucket and the bucket's index in it (0-287)."""
    moment = bucket.astimezone(UTC)
    midnight = datetime.combine(moment.date(), time(), tzinfo=UTC)
    return moment.date(), int((moment - midnight).total_seconds()) // FIVE_MINUTES


def day_start(day: date) -> datetime:
    return datetime.combine(day, time(), tzinfo=UTC)


def _values(columns: dict[str, float | None], capacity: float | None) -> list[float | None]:
    """A rollup's value of each series (in SERIES order) from its columns: fb_used_pct as the
    heatmap computes it, frame buffer used * 100 / capacity (None without a capacity)."""
    values = []
    for _, metric, stat in SERIES:
        value = columns[METRICS[metric].column(stat)]
        if METRICS[metric].percent_of_capacity:
            value = value * 100.0 / capacity if value is not None and capacity else None
        values.append(value)
    return values


def _model_capacity(gpu_ids: Iterable[int]) -> dict[int, float | None]:
    """By GPU: its model's frame buffer (MiB), the capacity of a rollup without a reported total."""
    wanted = set(gpu_ids)
    return dict(Gpu.objects.filter(pk__in=wanted).values_list("pk", "gpu_model__fb_mib")) if wanted else {}


def _capacity(fb_total_mib: float | None, model_fb_mib: float | None) -> float | None:
    return fb_total_mib if fb_total_mib is not None else model_fb_mib


# Writing -------------------------------------------------------------------------------------


def write_bucket(bucket: datetime, rollups: Sequence[GpuRollup]) -> int:
    """Write one 5-minute bucket's GPU rollups into the strips of its day (each series' byte of
    each GPU), creating the coverage on the first call. Call it in the transaction that writes
    the rollups. Returns the strips written."""
    if not rollups:
        return 0
    day, index = day_of(bucket)
    models = _model_capacity(r.gpu_id for r in rollups if r.fb_total_mib is None)
    by_gpu = [heatmap_codec.fixed_codes(_values({column: getattr(rollup, column) for column in _COLUMNS},
                                                _capacity(rollup.fb_total_mib, models.get(rollup.gpu_id))), *SCALE)
              for rollup in rollups]
    # Series after series: the strips of a new day are then stored a series at a time, and a
    # heatmap, which reads one series, reads few pages.
    gpu_ids = [rollup.gpu_id for rollup in rollups]
    codes = bytes(codes[s] for s in range(len(SERIES)) for codes in by_gpu)
    _lock()
    if connection.vendor == "postgresql":
        _overlay(day, index, gpu_ids, codes)
    else:
        _read_modify_write(day, index, gpu_ids, codes)
    _cover(bucket)
    return len(codes)


def _overlay(day: date, index: int, gpu_ids: list[int], codes: bytes) -> None:
    """PostgreSQL: set byte `index` of each (GPU, series) strip of `day` in the database (`codes`:
    series after series, GPUs in the order of `gpu_ids`), a new strip being all "no data" but
    that byte. A strip whose byte is already that code is left alone: a bucket rebuilt within
    the late window mostly is, and no new row version is written for it."""
    table = GpuStrip._meta.db_table
    position = index + 1  # SQL counts bytes from 1
    byte = f"substring(%s::bytea from k * {len(gpu_ids)} + t.i::int for 1)"
    sql = (f"INSERT INTO {table} (gpu_id, series, day, codes)"
           f" SELECT t.gpu_id, (%s::varchar[])[k + 1], %s, overlay(%s::bytea placing {byte} from {position})"
           f" FROM generate_series(0, {len(SERIES) - 1}) AS k"
           f" CROSS JOIN unnest(%s::integer[]) WITH ORDINALITY AS t(gpu_id, i) ORDER BY k, t.i"
           f" ON CONFLICT (day, series, gpu_id) DO UPDATE SET codes = overlay({table}.codes placing"
           f" substring(EXCLUDED.codes from {position} for 1) from {position})"
           f" WHERE substring({table}.codes from {position} for 1) <> substring(EXCLUDED.codes from {position} for 1)")
    with connection.cursor() as cursor:
        cursor.execute(sql, [[name for name, _, _ in SERIES], day, _BLANK, codes, gpu_ids])


def _read_modify_write(day: date, index: int, gpu_ids: list[int], codes: bytes) -> None:
    """Elsewhere (SQLite, small fleets): read the day's strips, change the byte, write them back."""
    held = {(gpu_id, name): bytes(data) for gpu_id, name, data in
            GpuStrip.objects.filter(day=day, gpu_id__in=set(gpu_ids)).values_list("gpu_id", "series", "codes")}
    strips = []
    for s, (name, _, _) in enumerate(SERIES):
        for i, gpu_id in enumerate(gpu_ids):
            line = bytearray(held.get((gpu_id, name), _BLANK))
            line[index] = codes[s * len(gpu_ids) + i]
            strips.append(GpuStrip(gpu_id=gpu_id, series=name, day=day, codes=bytes(line)))
    _upsert(strips)


def _upsert(strips: list[GpuStrip]) -> None:
    GpuStrip.objects.bulk_create(strips, batch_size=WRITE_BATCH, update_conflicts=True,
                                 unique_fields=["day", "series", "gpu"], update_fields=["codes"])


def _cover(bucket: datetime) -> None:
    """Start the coverage, at the first bucket written with its strips: from the beginning when no
    5-minute GPU rollup is older (a new installation), else from that bucket (the older ones
    were written before strips existed). One statement, whether the coverage exists or not."""
    adapt = connection.ops.adapt_datetimefield_value
    sql = (f"INSERT INTO {StripCoverage._meta.db_table} (name, since, updated_at)"
           f" SELECT %s, CASE WHEN EXISTS (SELECT 1 FROM {GpuRollup._meta.db_table} r"
           f" WHERE r.step_s = %s AND r.bucket < %s) THEN %s ELSE %s END, %s WHERE 1 = 1"
           f" ON CONFLICT (name) DO NOTHING")
    with connection.cursor() as cursor:
        cursor.execute(sql, [COVERAGE, FIVE_MINUTES, adapt(bucket), adapt(bucket), adapt(BEGINNING),
                             adapt(timezone.now())])


def rebuild_days(first: date, last: date) -> int:
    """Write the strips of the 5-minute GPU rollups of the UTC days `first` to `last` from the
    rollups (the rollups of an upgrade, written before strips existed; a seeded benchmark), one
    day a transaction, and move the coverage back to `first` where the rebuilt days reach what
    it covers. Returns the strips written."""
    written = 0
    day = first
    while day <= last:
        with transaction.atomic():
            _lock()
            written += _rebuild_day(day)
        day += timedelta(days=1)
    since = covered_since()
    end = day_start(last + timedelta(days=1))
    if since is None:
        # Nothing was written with its strips yet: covered up to `end` only if no rollup follows.
        if GpuRollup.objects.filter(step_s=FIVE_MINUTES, bucket__gte=end).exists():
            return written
        StripCoverage.objects.get_or_create(name=COVERAGE, defaults={"since": day_start(first)})
    elif since <= end:
        StripCoverage.objects.filter(name=COVERAGE, since__gt=day_start(first)).update(since=day_start(first))
    return written


def _lock() -> None:
    """PostgreSQL: one writer of strips at a time (`write_bucket` and `rebuild_days`), until the
    transaction ends, so a rebuilt day never writes back a byte older than one written meanwhile."""
    if connection.vendor == "postgresql":
        with connection.cursor() as cursor:
            cursor.execute("SELECT pg_advisory_xact_lock(%s)", [_LOCK_KEY])


def _rebuild_day(day: date) -> int:
    """Every strip of `day` from its rollups (read in bucket order: memory holds the day's strips,
    not its rollups)."""
    start = day_start(day)
    rows = (GpuRollup.objects.filter(step_s=FIVE_MINUTES, bucket__gte=start, bucket__lt=start + timedelta(days=1))
            .order_by("bucket").values_list("gpu_id", "bucket", "fb_total_mib", *_COLUMNS)
            .iterator(chunk_size=5000))
    models = dict(Gpu.objects.values_list("pk", "gpu_model__fb_mib"))
    lines: dict[int, list[bytearray]] = {}
    for gpu_id, bucket, fb_total, *values in rows:
        _, index = day_of(bucket)
        per_series = lines.get(gpu_id)
        if per_series is None:
            per_series = lines[gpu_id] = [bytearray(_BLANK) for _ in SERIES]
        columns = dict(zip(_COLUMNS, values, strict=True))
        codes = heatmap_codec.fixed_codes(_values(columns, _capacity(fb_total, models.get(gpu_id))), *SCALE)
        for line, code in zip(per_series, codes, strict=True):
            line[index] = code
    # Series after series, as `write_bucket` creates them.
    _upsert([GpuStrip(gpu_id=gpu_id, series=name, day=day, codes=bytes(per_series[s]))
             for s, (name, _, _) in enumerate(SERIES) for gpu_id, per_series in lines.items()])
    return len(lines) * len(SERIES)


# Retention -----------------------------------------------------------------------------------


def expired(cutoff: datetime) -> QuerySet:
    """The strips of UTC days that end at or before `cutoff`: retention deletes them with the
    5-minute rollups before `cutoff`."""
    return GpuStrip.objects.filter(day__lt=cutoff.astimezone(UTC).date())


def uncover_before(cutoff: datetime) -> None:
    """The coverage starts at `cutoff` at least once the rollups before it are deleted: a range
    starting earlier is read from the rollups left (the strip of the day holding `cutoff` still
    has the codes of the deleted ones)."""
    StripCoverage.objects.filter(name=COVERAGE, since__lt=cutoff).update(since=cutoff)


def covered_since() -> datetime | None:
    """From when on strips are complete (None: no strips yet)."""
    return StripCoverage.objects.filter(name=COVERAGE).values_list("since", flat=True).first()

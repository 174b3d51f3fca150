"""The heatmap matrices behind `/api/v1/heatmap/` and the `/heatmap/` page: one row per GPU, VM
or host in the caller's scope, one column per time bucket (or per hour of the week), each cell
one statistic of one metric read from the rollups.

Why it is built this way:

- **Every row in scope is listed**, data or not (a row of nulls), so an idle or silent machine
  shows as a gap instead of vanishing from the picture. Rows and their labels come from one
  query per kind (joins, plus one for the VMs' profile names), never one per row.
- **Cells are aggregated in the database.** A 24 h GPU × time heatmap of a 1,000-GPU fleet is
  288,000 cells; the column of each rollup is an integer computed in SQL
  (`floor((epoch(bucket) - epoch(start)) / step)`), and merging several rollups into one cell
  (a step wider than the rollups) is a GROUP BY, so Python never builds a datetime per cell.
  The SQL is in the "Values" section below and nowhere else; `_cells_sql` runs on SQLite and
  PostgreSQL alike.
- **On PostgreSQL the database writes the JSON.** Turning 288,000 cells into Python floats
  and back into JSON text cost more than all the rest together (bench/heatmap.py), so there
  each row's cells come back as one `json_agg` text, in time order, with the row's peak, mean
  and lowest; Python pads a row with nulls where its data starts late or ends early, and the
  API splices the texts into its response (`JsonRows`). A row with holes inside its run (a
  collection outage) is placed cell by cell from its keys, read by one more query.
- **Typed GPU x time at 5-minute steps of a % metric reads strips.** Each GPU's UTC day of
  codes (`telemetry.strips`, written with the rollups): two short rows a GPU for 24 h instead
  of 288 rollups, so 10,000 GPUs answer in tens of milliseconds instead of seconds
  (docs/benchmarks.md). The codes are the ones the rollups give, byte for byte. A listed row's
  peak and mean are still exact (read from the rollups of the listed rows only); a group's,
  sorted by host, are read from its rows' codes and say how close they are (`precision`).
  Other metrics (their scale comes from the cells), steps, groupings and ranges before the
  strips' coverage read the rollups as below.
- **Merging follows `telemetry.aggregation`**, as the metrics API does: avg is the
  sample-weighted mean of the rollups' avgs, max the max of their maxes, p95 the max of their
  p95s (an upper bound). `fb_used_pct` is each rollup's frame buffer used over its capacity (a
  GPU's reported total, else its model's; a VM's `profile_fb_mib`), then merged the same way.
- **A VM row reads the rollups of the metric's source** (`telemetry.metrics.VM_ROLLUPS`): its
  vGPUs' from `VmRollup`, its guest's CPU and memory (read through the hypervisor) from
  `GuestRollup`; `ram_used_pct` is each rollup's memory used over its `ram_mib`. Memory a guest
  did not report is a null cell, never 0.
- **A host row combines its GPUs** bucket by bucket: the mean of their values for avg, the
  highest for max and p95 (a host is as hot as its hottest GPU).
- **Artists read no shared GPU.** GPU and host rows read only the GPUs of
  `fleet.queries.gpu_telemetry_visible`: for an artist, those on which no one else is placed
  (a shared GPU's readings include the co-tenants' usage). Their VM rows are their own series.
- **Hour of week** folds the hourly values of the range onto 168 columns, Monday 00:00 to
  Sunday 23:00 in the studio's time zone (settings.TIME_ZONE): the database aggregates per
  (row, hour), Python maps each hour to its local hour of the week (DST included: a local hour
  lives where the wall clock says) and takes the mean of each column's hourly values.

Pure of HTTP: the API view parses and validates the query string into a `HeatmapQuery`.
"""

from __future__ import annotations

import gzip
import hashlib
import json
import logging
import math
from collections import Counter, defaultdict
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from zoneinfo import ZoneInfo

from django.conf import settings
from django.db import connection
from django.db.models import Count, Exists, IntegerField, OuterRef, Q, QuerySet, Subquery, Value
from django.db.models.functions import Coalesce
from django.urls import reverse

from config import read_cache
from config.roles import is_fleet_admin
from fleet.models import Gpu, GpuModel, Vgpu
from fleet.queries import gpu_telemetry_visible, visible_hosts, visible_vms
from telemetry import heatmap_codec, strips
from telemetry.aggregation import bucket_floor
from telemetry.metrics import FIVE_MINUTES, GPU_METRICS, HOURLY, METRICS, STEP_LADDER, VM_METRICS, VM_ROLLUPS
from telemetry.models import GpuRollup, GpuStrip

log = logging.getLogger(__name__)

GROUPS = ("gpu", "vm", "host")
FOLDS = ("none", "hour_of_week")
SORTS = ("host", "peak", "mean")
#: json: `z` as lists of numbers (the v1 form); typed: `z` as one byte a cell (`heatmap_codec`).
ENCODINGS = ("json", "typed")
ROW_NOUNS = {"gpu": "GPUs", "vm": "VMs", "host": "hosts"}
STATS = ("avg", "max", "p95")
GROUP_METRICS = {"gpu": GPU_METRICS, "vm": VM_METRICS, "host": GPU_METRICS}
#: The metric a heatmap shows when none is asked for: for VMs the picture behind right-sizing.
DEFAULT_METRIC = {"gpu": "util_gpu", "vm": "fb_used_pct", "host": "util_gpu"}
#: The default step is the smallest of STEP_LADDER giving at most this many columns.
DEFAULT_COLUMNS = 300
MAX_COLUMNS = 2000
HOURS_PER_WEEK = 168
WEEKDAYS = ("Mon", "Tue", "Wed", "Thu", "Fri", "Sat", "Sun")
UNITS = {
    "util_gpu": "%", "util_mem": "%", "fb_used_pct": "%", "enc_util": "%", "dec_util": "%",
    "fb_used_mib": "MiB", "temp_c": "°C", "power_w": "W", "sm_clock_mhz": "MHz",
    "vcpu_util": "%", "vcpu_max_util": "%", "cpu_steal_pct": "%", "ram_used_pct": "%", "ram_used_mib": "MiB",
}
DETAIL_ROUTES = {"gpu": "fleet:gpu-detail", "vm": "fleet:vm-detail", "host": "fleet:host-detail"}


@dataclass(frozen=True)
class HeatmapQuery:
    """A validated heatmap request. `start` is the first bucket's start (the requested start
    floored to `step`), `end` the requested end (exclusive)."""

    group: str
    metric: str
    stat: str
    fold: str
    sort: str
    host_id: int | None
    start: datetime
    end: datetime
    step: int
    encoding: str = "json"
    #: Group the rows (after the window below) into at most this many when there are more.
    rows_max: int | None = None
    #: A window of the sorted rows: the drill-down into a group.
    row_start: int = 0
    row_count: int | None = None

    @property
    def source_step(self) -> int:
        """The rollups read: hourly for hour-of-week folds and steps of an hour or more."""
        return HOURLY if self.fold == "hour_of_week" or self.step >= HOURLY else FIVE_MINUTES

    @property
    def columns(self) -> int:
        if self.fold == "hour_of_week":
            return HOURS_PER_WEEK
        return column_count(self.start, self.end, self.step)

    @property
    def buckets(self) -> int:
        """How many `step`-wide buckets the SQL numbers (hours, for a fold)."""
        return column_count(self.start, self.end, self.step)


def column_count(first: datetime, end: datetime, step: int) -> int:
    """Buckets of `step` seconds from `first` (a bucket start) up to `end` (exclusive)."""
    return max(0, math.ceil((end - first).total_seconds() / step))


def default_step(start: datetime, end: datetime) -> int:
    """The smallest step of STEP_LADDER giving at most DEFAULT_COLUMNS columns (6 h and 24 h:
    300 s, 7 d: 3600 s, 30 d: 10800 s)."""
    for step in STEP_LADDER:
        if column_count(bucket_floor(start, step), end, step) <= DEFAULT_COLUMNS:
            return step
    return STEP_LADDER[-1]


def hour_of_week_labels() -> list[str]:
    """"Mon 00:00" ... "Sun 23:00": the columns of an hour-of-week fold."""
    return [f"{day} {hour:02d}:00" for day in WEEKDAYS for hour in range(24)]


def hour_of_week(moment: datetime, tz: ZoneInfo) -> int:
    """Column of `moment` in an hour-of-week fold: Monday 00:00-00:59 local time is 0."""
    local = moment.astimezone(tz)
    return local.weekday() * 24 + local.hour


def fold_hour_of_week(cells: dict[int, dict[int, float]], first: datetime, hours: int, tz: ZoneInfo,
                      ) -> dict[int, list[float | None]]:
    """Hourly values `{row: {hour index since first: value}}` folded onto 168 columns: each the
    mean of the row's values at that local hour of the week (None where it has none)."""
    columns = [hour_of_week(first + timedelta(hours=i), tz) for i in range(hours)]
    folded = {}
    for row, values in cells.items():
        sums = [0.0] * HOURS_PER_WEEK
        counts = [0] * HOURS_PER_WEEK
        for index, value in values.items():
            column = columns[index]
            sums[column] += value
            counts[column] += 1
        folded[row] = [sums[c] / counts[c] if counts[c] else None for c in range(HOURS_PER_WEEK)]
    return folded


def iso(moment: datetime) -> str:
    return moment.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


# Rows --------------------------------------------------------------------------------------


@dataclass(slots=True)
class Row:
    """One row of the heatmap and what the page shows around it."""

    id: int
    label: str
    host_id: int | None
    host: str | None
    subtitle: str
    #: Order of the `host` sort: host name (rows without a host last), then the row's own name.
    order: tuple


def _url_template(group: str) -> str:
    """The detail URL with a "{}" for the id: one reverse() per request instead of one per row."""
    marker = 987654321
    return reverse(DETAIL_ROUTES[group], args=[marker]).replace(str(marker), "{}")


def _host_order(host_name: str | None) -> tuple:
    return (0, host_name) if host_name is not None else (1, "")


def _gpu_rows(user, host_id: int | None) -> tuple[list[Row], QuerySet]:
    gpus = gpu_telemetry_visible(user)
    if host_id is not None:
        gpus = gpus.filter(host_id=host_id)
    rows = [
        Row(id=pk, label=f"{host} · {bus}", host_id=host_pk, host=host, subtitle=model,
            order=(_host_order(host), bus, pk))
        for pk, bus, host_pk, host, model in gpus.values_list(
            "pk", "pci_bus_id", "host_id", "host__name", "gpu_model__name")
    ]
    return rows, gpus


def _vm_rows(user, query: HeatmapQuery) -> tuple[list[Row], QuerySet]:
    """VMs holding a vGPU now or with rollups of the metric's source in the range (a VM whose
    vGPUs were removed still shows its history), with their artist and profiles: two queries."""
    vms = visible_vms(user)
    if query.host_id is not None:
        vms = vms.filter(host_id=query.host_id)
    rollups = VM_ROLLUPS[METRICS[query.metric].source].model
    with_rollups = rollups.objects.filter(vm=OuterRef("pk"), step_s=query.source_step, bucket__gte=query.start,
                                          bucket__lt=query.end)
    listed = vms.filter(Q(Exists(Vgpu.objects.filter(vm=OuterRef("pk")))) | Q(Exists(with_rollups)))
    profiles: dict[int, Counter] = defaultdict(Counter)
    for vm_id, name in Vgpu.objects.filter(vm__in=listed.values("pk")).values_list("vm_id", "profile__name"):
        profiles[vm_id][name] += 1
    rows = []
    for pk, name, host_pk, host, artist in listed.values_list("pk", "name", "host_id", "host__name", "artist__name"):
        held = " + ".join(f"{p} ×{n}" if n > 1 else p for p, n in sorted(profiles[pk].items())) or "no vGPU now"
        rows.append(Row(id=pk, label=name, host_id=host_pk, host=host, subtitle=f"{artist or 'no artist'} · {held}",
                        order=(_host_order(host), name, pk)))
    return rows, vms


def _host_rows(user, host_id: int | None) -> tuple[list[Row], QuerySet]:
    """Hosts in scope with how many of their GPUs the row combines (those whose readings the user
    may read). An artist's host row combines only the GPUs no one else shares with them, and a
    host without such a GPU is no row of theirs: its figures would be other people's."""
    hosts = visible_hosts(user)
    gpus = gpu_telemetry_visible(user)
    if not is_fleet_admin(user):
        hosts = hosts.filter(pk__in=gpus.values("host_id"))
    if host_id is not None:
        hosts = hosts.filter(pk=host_id)
        gpus = gpus.filter(host_id=host_id)
    counts = gpus.filter(host=OuterRef("pk")).order_by().values("host").annotate(n=Count("pk")).values("n")
    hosts = hosts.annotate(gpu_count=Coalesce(Subquery(counts, output_field=IntegerField()), Value(0)))
    rows = [
        Row(id=pk, label=name, host_id=pk, host=name,
            subtitle=f"{count} GPU" if count == 1 else f"{count or 'no'} GPUs", order=(_host_order(name), pk))
        for pk, name, count in hosts.values_list("pk", "name", "gpu_count")
    ]
    return rows, gpus


# Values ------------------------------------------------------------------------------------


def _bucket_index_sql(column: str) -> str:
    """`(epoch(column) - %s) / %s` rounded down, as the database spells it: the index of the
    bucket holding `column` given the first bucket's Unix seconds and the step."""
    if connection.vendor == "postgresql":
        return f"CAST(floor((date_part('epoch', {column}) - %s) / %s) AS INTEGER)"
    # SQLite keeps UTC text; integers on both sides and never negative, so integer division
    # is the floor. '%%' is a literal '%' once the parameters are bound.
    return f"((CAST(strftime('%%s', {column}) AS INTEGER) - %s) / %s)"


def _in_scope(sql: str, params: list, column: str, scope: QuerySet | None) -> tuple[str, list]:
    """`sql` restricted to the entities of `scope` (None: all)."""
    if scope is None:
        return sql, params
    scope_sql, scope_params = scope.values("pk").query.sql_with_params()
    return f"{sql} AND {column} IN ({scope_sql})", params + list(scope_params)


def _listed(ids: list[int]) -> tuple[str, list]:
    """`= ANY(%s)` with the list as one parameter on PostgreSQL, `IN (%s, ...)` elsewhere."""
    if connection.vendor == "postgresql":
        return "= ANY(%s)", [ids]
    return f"IN ({', '.join(['%s'] * len(ids)) or 'NULL'})", list(ids)


def _merged(query: HeatmapQuery) -> bool:
    """Whether a cell merges several rollups (a step wider than the rollups read)."""
    return query.step != query.source_step


def _cells_sql(query: HeatmapQuery, scope: QuerySet | None, key: str = "index", only: list[int] | None = None,
               ) -> tuple[str, list]:
    """The SQL of a heatmap's cells, `SELECT row_id, k, value`: one row per heatmap row and
    `query.step` bucket holding rollups. `k` is the bucket's index since `query.start` (`key`
    "index") or, where a cell is one rollup, the rollup's own `bucket` ("bucket"). `scope`
    restricts the entities read (None: all of them); `only` lists the row ids to read."""
    metric = METRICS[query.metric]
    merged = _merged(query)
    if key != "index" and merged:
        raise ValueError("merged cells are keyed by their index")
    if query.group == "vm":
        rollups = VM_ROLLUPS[metric.source]
        model, entity, capacity, join = rollups.model, "vm_id", f"r.{rollups.capacity_column}", ""
    else:
        model, entity, capacity = GpuRollup, "gpu_id", "COALESCE(r.fb_total_mib, m.fb_mib)"
        join = (f" JOIN {Gpu._meta.db_table} g ON g.id = r.gpu_id"
                f" JOIN {GpuModel._meta.db_table} m ON m.id = g.gpu_model_id") if metric.percent_of_capacity else ""
    value = f"r.{metric.column(query.stat)}"
    if metric.percent_of_capacity:
        value = f"{value} * 100.0 / NULLIF({capacity}, 0)"
    if not merged:
        cell = value  # one rollup a cell: its own figure (a rollup has at least one sample)
    elif query.stat == "avg":
        # Sample-weighted mean of the rollups' means; rollups without the reading don't count.
        cell = f"SUM({value} * r.samples) / NULLIF(SUM(CASE WHEN {value} IS NOT NULL THEN r.samples ELSE 0 END), 0)"
    else:
        cell = f"MAX({value})"  # max of the maxes; max of the p95s, an upper bound of the p95
    params: list = []
    if key == "index":
        k = _bucket_index_sql("r.bucket")
        params += [int(query.start.timestamp()), query.step]
    else:
        k = "r.bucket"
    adapt = connection.ops.adapt_datetimefield_value
    sql = (f"SELECT r.{entity} AS row_id, {k} AS k, {cell} AS value FROM {model._meta.db_table} r{join}"
           f" WHERE r.step_s = %s AND r.bucket >= %s AND r.bucket < %s")
    params += [query.source_step, adapt(query.start), adapt(query.end)]
    sql, params = _in_scope(sql, params, f"r.{entity}", scope)
    if only is not None:
        listed, listed_params = _listed(only)
        sql += (f" AND r.gpu_id IN (SELECT only_gpu.id FROM {Gpu._meta.db_table} only_gpu"
                f" WHERE only_gpu.host_id {listed})") if query.group == "host" else f" AND r.{entity} {listed}"
        params += listed_params
    if merged:
        sql += " GROUP BY 1, 2"
    if query.group == "host":
        # Each host's GPUs, bucket by bucket: their mean for avg, their highest for max and p95.
        combine = "AVG" if query.stat == "avg" else "MAX"
        sql = (f"SELECT h.host_id AS row_id, t.k AS k, {combine}(t.value) AS value"
               f" FROM ({sql}) t JOIN {Gpu._meta.db_table} h ON h.id = t.row_id GROUP BY 1, 2")
    return sql, params


def _cells(query: HeatmapQuery, scope: QuerySet | None) -> dict[int, dict[int, float]]:
    """`{row id: {bucket index: value}}` of the cells that have data."""
    sql, params = _cells_sql(query, scope)
    cells: dict[int, dict[int, float]] = defaultdict(dict)
    with connection.cursor() as cursor:
        cursor.execute(sql, params)
        for row_id, index, value in cursor.fetchall():
            if value is not None:
                cells[row_id][index] = value
    return cells


def _json_rows_sql(query: HeatmapQuery, scope: QuerySet | None) -> tuple[str, list]:
    """PostgreSQL: one row per heatmap row with data, `(row_id, first key, last key, number of
    cells, peak, mean, lowest, the cells as JSON text in time order)`."""
    cells_sql, params = _cells_sql(query, scope, "index" if _merged(query) else "bucket")
    sql = (f"SELECT c.row_id, MIN(c.k), MAX(c.k), COUNT(*), MAX(c.value), AVG(c.value), MIN(c.value),"
           f" json_agg(c.value ORDER BY c.k)::text FROM ({cells_sql}) c GROUP BY c.row_id")
    return sql, params


def _keys(query: HeatmapQuery, scope: QuerySet | None, row_ids: list[int]) -> dict[int, list]:
    """PostgreSQL: the keys of the cells of rows with holes, in time order."""
    cells_sql, params = _cells_sql(query, scope, "index" if _merged(query) else "bucket", only=row_ids)
    with connection.cursor() as cursor:
        cursor.execute(f"SELECT c.row_id, array_agg(c.k ORDER BY c.k) FROM ({cells_sql}) c GROUP BY c.row_id", params)
        return dict(cursor.fetchall())


class JsonRows(Sequence):
    """The rows of `z` as JSON text, as PostgreSQL wrote them. The API splices the text into its
    response (`telemetry.api.heatmap.HeatmapRenderer`) instead of turning some 300,000 floats
    into Python objects and back to text; any other reader gets a sequence of lists."""

    def __init__(self, texts: list[str]):
        self.texts = texts

    def __len__(self) -> int:
        return len(self.texts)

    def __getitem__(self, index):
        if isinstance(index, slice):
            return [json.loads(text) for text in self.texts[index]]
        return json.loads(self.texts[index])

    def tolist(self) -> list[list[float | None]]:
        return [json.loads(text) for text in self.texts]

    def json(self) -> str:
        return "[" + ",".join(self.texts) + "]"


@dataclass
class Line:
    """One row's cells (a list; JSON text, or the typed encoding's codes, from PostgreSQL) and its
    figures."""

    cells: list | str | bytes
    peak: float | None = None
    mean: float | None = None
    low: float | None = None

    @classmethod
    def of(cls, cells: list) -> Line:
        present = [v for v in cells if v is not None]
        if not present:
            return cls(cells)
        return cls(cells, max(present), math.fsum(present) / len(present), min(present))


def _json_lines(query: HeatmapQuery, scope: QuerySet | None) -> dict[int, Line]:
    """PostgreSQL: each row with data as JSON text padded with nulls to every column. Python
    never holds the cells of a row without holes; the keys of those with holes (rare: a
    collection outage) take one more query."""
    columns = query.columns
    start_s, step = query.start.timestamp(), query.step

    def index(key) -> int:
        return key if isinstance(key, int) else int((key.timestamp() - start_s) // step)

    sql, params = _json_rows_sql(query, scope)
    with connection.cursor() as cursor:
        cursor.execute(sql, params)
        found = cursor.fetchall()
    lines, holed = {}, {}
    for row_id, first, last, count, peak, mean, low, text in found:
        first, last = index(first), index(last)
        if last - first + 1 == count:
            text = f"[{'null, ' * first}{text[1:-1]}{', null' * (columns - 1 - last)}]"
            lines[row_id] = Line(text, peak, mean, low)
        else:
            holed[row_id] = Line(text, peak, mean, low)
    if holed:
        for row_id, keys in _keys(query, scope, list(holed)).items():
            line = holed[row_id]
            dense = [None] * columns
            for key, value in zip(keys, json.loads(line.cells), strict=True):
                dense[index(key)] = value
            lines[row_id] = Line(json.dumps(dense), line.peak, line.mean, line.low)
    return lines


def _codes_sql(query: HeatmapQuery, scope: QuerySet | None) -> tuple[str, list]:
    """PostgreSQL, typed encoding: as `_json_rows_sql`, the cells being one character a cell in
    time order, `chr(code + 1)` for a value's code (`heatmap_codec`) and `chr(256)` for a cell
    without the reading. A % metric's scale is 0-100; any other's is the range of the cells,
    which the database finds in the same statement (the cells are read once)."""
    cells_sql, params = _cells_sql(query, scope, "index" if _merged(query) else "bucket")
    if UNITS[query.metric] == "%":
        # A fixed scale: no pass over the cells for it (materialising them costs a third more).
        cells, scale = f"({cells_sql}) c", f"(SELECT 0.0 AS lo, {heatmap_codec.LEVELS / 100.0!r} AS per) s"
        prefix = ""
    else:
        prefix = f"WITH c AS MATERIALIZED ({cells_sql}) "
        cells = "c"
        scale = (f"(SELECT MIN(value) AS lo, CASE WHEN MAX(value) > MIN(value)"
                 f" THEN {heatmap_codec.LEVELS}.0 / (MAX(value) - MIN(value)) ELSE 0 END AS per FROM c) s")
    code = f"LEAST({heatmap_codec.LEVELS}, GREATEST(0, floor((c.value - s.lo) * s.per + 0.5)))::int"
    sql = (f"{prefix}SELECT c.row_id, MIN(c.k), MAX(c.k), COUNT(*), MAX(c.value), AVG(c.value), MIN(c.value),"
           # GREATEST and LEAST skip NULLs: a cell without the reading is tested first.
           f" string_agg(CASE WHEN c.value IS NULL THEN chr(256) ELSE chr({code} + 1) END, '' ORDER BY c.k)"
           f" FROM {cells} CROSS JOIN {scale} GROUP BY c.row_id")
    return sql, params


#: chr(code + 1) / chr(256) as UTF-32 code units, every fourth byte: code + 1, or 0 for "no data".
_FROM_SHIFTED = bytes([heatmap_codec.NULL_CODE]) + bytes(range(255))


def _codes(text: str) -> bytes:
    """The codes of `_codes_sql`'s text: its characters are at most U+0100, so the low byte of
    each UTF-32 unit is the character's value (0 for U+0100) and one C-level pass maps it back."""
    return text.encode("utf-32-le")[::4].translate(_FROM_SHIFTED)


def _code_lines(query: HeatmapQuery, scope: QuerySet | None) -> dict[int, Line]:
    """PostgreSQL, typed encoding: each row with data as its codes (bytes, NULL_CODE where it
    has none), with its exact figures. Rows with holes are placed from their keys."""
    columns = query.columns
    start_s, step = query.start.timestamp(), query.step
    null = bytes([heatmap_codec.NULL_CODE])

    def index(key) -> int:
        return key if isinstance(key, int) else int((key.timestamp() - start_s) // step)

    sql, params = _codes_sql(query, scope)
    with connection.cursor() as cursor:
        cursor.execute(sql, params)
        found = cursor.fetchall()
    lines, holed = {}, {}
    for row_id, first, last, count, peak, mean, low, text in found:
        first, last = index(first), index(last)
        codes = _codes(text)
        if last - first + 1 == count:
            lines[row_id] = Line(null * first + codes + null * (columns - 1 - last), peak, mean, low)
        else:
            holed[row_id] = Line(codes, peak, mean, low)
    if holed:
        for row_id, keys in _keys(query, scope, list(holed)).items():
            line = holed[row_id]
            dense = bytearray(null * columns)
            for key, code in zip(keys, line.cells, strict=True):
                dense[index(key)] = code
            lines[row_id] = Line(bytes(dense), line.peak, line.mean, line.low)
    return lines


# Strips ------------------------------------------------------------------------------------


def _strip_series(query: HeatmapQuery) -> str | None:
    """The strips (`telemetry.strips`) a typed GPU x time answer at 5-minute steps of a % metric
    reads, when they cover its range; None when it is read from the rollups."""
    if query.encoding != "typed" or query.group != "gpu" or query.fold != "none" or query.step != FIVE_MINUTES:
        return None
    series = strips.series_name(query.metric, query.stat)
    if series not in strips.SERIES_NAMES:
        return None
    since = strips.covered_since()
    return series if since is not None and since <= query.start else None


def _strip_codes(query: HeatmapQuery, series: str, scope: QuerySet | None, only: list[int] | None,
                 ) -> dict[int, bytes]:
    """By GPU with a strip in the range: its codes, one a column (NULL_CODE where it has none),
    from the piece of each UTC day's strip the range covers."""
    first_day, first = strips.day_of(query.start)
    last_day, last = strips.day_of(query.start + timedelta(seconds=query.step * (query.columns - 1)))
    per_day = strips.BUCKETS_PER_DAY
    days = [first_day + timedelta(days=i) for i in range((last_day - first_day).days + 1)]
    # Each day's piece: where it starts in the strip (SQL counts from 1) and its length.
    pieces = [(day, first + 1 if day == first_day else 1,
               (last + 1 if day == last_day else per_day) - (first if day == first_day else 0)) for day in days]
    adapt = connection.ops.adapt_datefield_value
    table = GpuStrip._meta.db_table

    def day_sql(day) -> tuple[str, list]:
        """The strips of `day` in scope, the unique key (day, series, gpu) read in GPU order."""
        sql, params = _in_scope(f"FROM {table} s WHERE s.day = %s AND s.series = %s", [adapt(day), series],
                                "s.gpu_id", scope)
        if only is None:
            return sql, params
        listed, listed_params = _listed(only)
        return f"{sql} AND s.gpu_id {listed}", params + listed_params

    if connection.vendor == "postgresql":
        return _joined_strip_codes(pieces, day_sql)
    found = []
    for day, start, length in pieces:
        sql, params = day_sql(day)
        with connection.cursor() as cursor:
            cursor.execute(f"SELECT s.gpu_id, substr(s.codes, {start}, {length}) {sql}", params)
            found.append(dict(cursor.fetchall()))
    lines = {}
    for gpu_id in set().union(*found):
        parts = [day_pieces.get(gpu_id) for day_pieces in found]
        lines[gpu_id] = b"".join(part if part is not None else bytes([heatmap_codec.NULL_CODE]) * length
                                 for part, (_, _, length) in zip(parts, pieces, strict=True))
    return lines


def _joined_strip_codes(pieces: list[tuple], day_sql) -> dict[int, bytes]:
    """PostgreSQL: each GPU's codes joined by the database (the days' strips merge-joined in GPU
    order, a missing day filled with NULL_CODE) and read in binary: a third of the time of
    reading a row a day as text and joining them here, at 10,000 GPUs."""
    import psycopg

    fills, selects, params = [], [], []
    for index, (day, start, length) in enumerate(pieces):
        fills.append(f"COALESCE(d{index}.piece, %s)")
        sql, day_params = day_sql(day)
        join = "" if index == 0 else " FULL JOIN "
        selects.append(f"{join}(SELECT s.gpu_id, substr(s.codes, {start}, {length}) AS piece {sql}) d{index}"
                       + ("" if index == 0 else " USING (gpu_id)"))
        params += day_params
    fill_params = [bytes([heatmap_codec.NULL_CODE]) * length for _, _, length in pieces]
    sql = f"SELECT gpu_id, {' || '.join(fills)} FROM {''.join(selects)}"
    connection.ensure_connection()
    # A cursor binding on the server, which can answer in binary (Django's binds on the client),
    # wrapped as Django wraps its own: the read cache notes the tables read, tests the queries.
    raw = psycopg.Cursor(connection.connection)
    raw.format = psycopg.pq.Format.BINARY
    with connection.make_debug_cursor(raw) if connection.queries_logged else connection.make_cursor(raw) as cursor:
        cursor.execute(sql, fill_params + params)
        return dict(cursor.fetchall())


def _exact_figures(query: HeatmapQuery, scope: QuerySet | None, only: list[int] | None) -> dict[int, Line]:
    """By row with data: its peak and mean from the rollups (`MAX` and `AVG` of its cells, as
    `_code_lines` computes them), for the rows of `only` (None: all in `scope`)."""
    cells_sql, params = _cells_sql(query, scope, "bucket", only=only)
    with connection.cursor() as cursor:
        cursor.execute(f"SELECT c.row_id, MAX(c.value), AVG(c.value) FROM ({cells_sql}) c GROUP BY c.row_id", params)
        return {row_id: Line(b"", peak, mean) for row_id, peak, mean in cursor.fetchall() if peak is not None}


def _strip_heatmap(query: HeatmapQuery, rows: list[Row], scope: QuerySet | None, series: str) -> dict:
    """The typed answer from the strips: the rows sorted and windowed, their codes read from the
    strips (of the window's rows only, when it is not every row), then grouped or listed.

    Figures: a listed row's peak and mean are exact (`_exact_figures`, for the listed rows
    only); a group's come from its rows' codes, within `precision` of the exact ones, unless
    the sort needed every row's exact figures anyway (`sort=peak` or `mean`)."""
    none = Line(b"")
    figures = None
    if query.sort == "host":
        ordered = sorted(rows, key=lambda row: row.order)
    else:
        figures = _exact_figures(query, scope, None)
        ordered = [row for row, _ in _sorted(rows, [figures.get(row.id, none) for row in rows], query.sort)]
    window = ordered
    if query.row_start or query.row_count is not None:
        end = None if query.row_count is None else query.row_start + query.row_count
        window = ordered[query.row_start:end]
    ids = [row.id for row in window]
    codes = _strip_codes(query, series, scope, None if len(window) == len(ordered) else ids)
    blank = bytes([heatmap_codec.NULL_CODE]) * query.columns
    lines = [codes.get(row_id, blank) for row_id in ids]
    body = _head(query) | {"zmin": 0, "zmax": 100, "total_rows": len(ordered), "row_start": query.row_start,
                           "groups": None, "encoding": query.encoding, "ids": ids}
    if query.rows_max is not None and len(window) > query.rows_max:
        body.update(y=[row.label for row in window], z=lines)
        hosts = [(row.host_id, row.host) for row in window]
        if figures is None:  # sorted by host: each group's figures come from its rows' codes
            _group(body, query, hosts)
            _code_group_figures(body, lines, query)
        else:
            _group(body, query, hosts, ([figures.get(row.id, none).peak for row in window],
                                        [figures.get(row.id, none).mean for row in window]))
    else:
        if figures is None:
            figures = _exact_figures(query, scope, ids) if ids else {}
        url = _url_template(query.group)
        body.update(y=[row.label for row in window], ids=ids, z=lines, rows=[
            {"id": row.id, "label": row.label, "host_id": row.host_id, "host": row.host,
             "detail_url": url.format(row.id), "subtitle": row.subtitle,
             "peak": figures.get(row.id, none).peak, "mean": figures.get(row.id, none).mean}
            for row in window])
    body["z"] = heatmap_codec.typed_matrix(body["z"], query.columns, body["zmin"], body["zmax"])
    return body


def _code_group_figures(body: dict, lines: list[bytes], query: HeatmapQuery) -> None:
    """Each group's peak and mean decoded from the codes: the highest code of its cells, and the
    mean of its rows' mean codes; within `precision` (half a step) of the exact figures."""
    offset, step = heatmap_codec.quantisation(0, 100)
    for group, cells in zip(body["groups"], body["z"], strict=True):
        start = group["row_start"] - query.row_start
        means = [mean for line in lines[start:start + group["row_count"]]
                 if (mean := heatmap_codec.code_mean(line)) is not None]
        top = heatmap_codec.code_peak(cells)
        group.update(peak=None if top is None else offset + top * step,
                     mean=offset + math.fsum(means) / len(means) * step if means else None, precision=step / 2)


# The heatmap -------------------------------------------------------------------------------


def _lines(query: HeatmapQuery, rows: list[Row], scope: QuerySet | None) -> list[Line]:
    """Each row's cells and figures, aligned with `rows`."""
    if query.fold == "hour_of_week":
        cells = _cells(query, scope)
        folded = fold_hour_of_week(cells, query.start, query.buckets, ZoneInfo(settings.TIME_ZONE))
        return [Line.of(folded.get(row.id) or [None] * HOURS_PER_WEEK) for row in rows]
    if connection.vendor == "postgresql" and query.encoding == "typed":
        lines = _code_lines(query, scope)
        empty = Line(bytes([heatmap_codec.NULL_CODE]) * query.columns)
        return [lines.get(row.id, empty) for row in rows]
    if connection.vendor == "postgresql":
        lines = _json_lines(query, scope)
        empty = Line("[" + ", ".join(["null"] * query.columns) + "]")
        return [lines.get(row.id, empty) for row in rows]
    cells = _cells(query, scope)
    dense = []
    for row in rows:
        line = [None] * query.columns
        for index, value in cells.get(row.id, {}).items():
            line[index] = value
        dense.append(Line.of(line))
    return dense


def _sorted(rows: list[Row], lines: list[Line], sort: str) -> list[tuple[Row, Line]]:
    """Rows with their lines in the order asked for. Rows without any data go last in the peak
    and mean sorts; ties keep the host order."""
    entries = sorted(zip(rows, lines, strict=True), key=lambda entry: entry[0].order)
    if sort in ("peak", "mean"):
        def figure(entry):
            value = entry[1].peak if sort == "peak" else entry[1].mean
            return (value is None, -(value or 0.0))

        entries.sort(key=figure)
    return entries


def build_heatmap(user, query: HeatmapQuery) -> dict:
    """The response of `/api/v1/heatmap/` for `user` (scoped by `fleet.queries`): Plotly's
    heatmap shape (x, y, z) plus each row's id, host, detail URL, subtitle, peak and mean, then
    windowed, grouped and encoded as the query asks (`_shaped`). In the json encoding on
    PostgreSQL `z` is a `JsonRows` (lists of floats elsewhere); typed, a dict of bytes in base64."""
    if query.group == "gpu":
        rows, scope = _gpu_rows(user, query.host_id)
    elif query.group == "vm":
        rows, scope = _vm_rows(user, query)
    else:
        rows, scope = _host_rows(user, query.host_id)
    # Staff over the whole fleet read every rollup: no IN (subquery) to plan around.
    whole_fleet = query.host_id is None and is_fleet_admin(user)
    series = _strip_series(query) if rows and not scope.query.is_empty() else None
    if series is not None:
        return _strip_heatmap(query, rows, None if whole_fleet else scope, series)
    if scope.query.is_empty() or not rows:
        lines = [Line.of([None] * query.columns) for _ in rows]
    else:
        lines = _lines(query, rows, None if whole_fleet else scope)

    entries = _sorted(rows, lines, query.sort)
    cells = [line.cells for _, line in entries]
    url = _url_template(query.group)
    unit = UNITS[query.metric]
    if unit == "%":
        zmin, zmax = 0, 100
    else:
        with_data = [line for _, line in entries if line.peak is not None]
        zmin = min((line.low for line in with_data), default=None)
        zmax = max((line.peak for line in with_data), default=None)
    body = _head(query) | {
        "y": [row.label for row, _ in entries],
        "ids": [row.id for row, _ in entries],
        "rows": [
            {"id": row.id, "label": row.label, "host_id": row.host_id, "host": row.host,
             "detail_url": url.format(row.id), "subtitle": row.subtitle, "peak": line.peak, "mean": line.mean}
            for row, line in entries
        ],
        "z": JsonRows(cells) if cells and isinstance(cells[0], str) else cells,
        "zmin": zmin, "zmax": zmax,
    }
    return _shaped(body, query)


def _head(query: HeatmapQuery) -> dict:
    """What an answer says of its query, and its columns' labels (`x`)."""
    if query.fold == "hour_of_week":
        x = hour_of_week_labels()
    else:
        step = timedelta(seconds=query.step)
        x = [iso(query.start + i * step) for i in range(query.columns)]
    return {
        "group": query.group, "metric": query.metric, "stat": query.stat, "fold": query.fold, "sort": query.sort,
        "unit": UNITS[query.metric], "start": iso(query.start), "end": iso(query.end), "step": query.step,
        "source_step": query.source_step, "x": x,
    }


def _shaped(body: dict, query: HeatmapQuery) -> dict:
    """`body` with the window, groups and encoding the query asks for, and the keys that say
    what was done: `total_rows` (rows in scope), `row_start` (the window's first row) and
    `groups` (null unless the rows were grouped)."""
    total = len(body["ids"])
    body.update(total_rows=total, row_start=query.row_start, groups=None, encoding=query.encoding)
    if query.row_start or query.row_count is not None:
        window = slice(query.row_start, None if query.row_count is None else query.row_start + query.row_count)
        z = body["z"]
        body.update(y=body["y"][window], ids=body["ids"][window], rows=body["rows"][window],
                    z=JsonRows(z.texts[window]) if isinstance(z, JsonRows) else z[window])
    if query.encoding == "typed":
        # Codes first (PostgreSQL wrote them already), so groups take the highest code of their
        # rows: the code of their highest value, the scale being the same.
        offset, step = heatmap_codec.quantisation(body["zmin"], body["zmax"])
        z = body["z"]
        body["z"] = [row if isinstance(row, bytes) else heatmap_codec.encode_row(row, offset, step)
                     for row in (z.tolist() if isinstance(z, JsonRows) else z)]
    if query.rows_max is not None and len(body["ids"]) > query.rows_max:
        _group(body, query)
    if query.encoding == "typed":
        body["z"] = heatmap_codec.typed_matrix(body["z"], len(body["x"]), body["zmin"], body["zmax"])
    return body


def _group(body: dict, query: HeatmapQuery, hosts: list[tuple[int | None, str | None]] | None = None,
           figures: tuple[list, list] | None = None) -> None:
    """Rows replaced by at most `rows_max` groups of consecutive rows (`heatmap_codec`): one a
    host when rows are sorted by host and the hosts fit, else groups of equal size. `y` the
    groups' labels, `z` their cells, `groups` their windows and figures; `ids` and `rows` empty
    (a group's rows come from its window: `row_start` and `row_count`). Each row's host (id,
    name) and figures (peaks, means) are read from `rows` unless given; without figures, the
    groups' are left to the caller."""
    z = body["z"]
    lines = z.tolist() if isinstance(z, JsonRows) else z
    labels = body["y"]
    if hosts is None:
        hosts = [(row["host_id"], row["host"]) for row in body["rows"]]
        figures = ([row["peak"] for row in body["rows"]], [row["mean"] for row in body["rows"]])
    groups, cells = [], []
    host_ids = [host_id for host_id, _ in hosts]
    # One group a host needs no more hosts than groups: counted before walking the runs.
    by_host = query.sort == "host" and query.group != "host" and len(set(host_ids)) <= query.rows_max
    windows = heatmap_codec.host_runs(host_ids) if by_host else []
    if not by_host or len(windows) > query.rows_max:
        by_host, windows = False, heatmap_codec.group_windows(len(lines), query.rows_max)
    for start, count in windows:
        group = {
            "label": (f"{hosts[start][1] or 'No host'} ({count} {ROW_NOUNS[query.group]})"
                      if by_host and count > 1 else
                      heatmap_codec.group_label(labels[start], labels[start + count - 1], count,
                                                ROW_NOUNS[query.group])),
            "row_start": query.row_start + start, "row_count": count,
            "hosts": len(set(host_ids[start:start + count]) - {None}),
            "peak": None, "mean": None, "precision": 0.0,
        }
        if figures is not None:
            peaks = [peak for peak in figures[0][start:start + count] if peak is not None]
            means = [mean for mean in figures[1][start:start + count] if mean is not None]
            group.update(peak=max(peaks) if peaks else None, mean=math.fsum(means) / len(means) if means else None)
        groups.append(group)
        members_cells = lines[start:start + count]
        cells.append(heatmap_codec.group_codes(members_cells) if isinstance(lines[0], bytes)
                     else heatmap_codec.group_cells(members_cells))
    body.update(y=[group["label"] for group in groups], ids=[], rows=[], z=cells, groups=groups)


# The typed answer, cached ------------------------------------------------------------------

#: Typed answers are reused until a table they read is written (the rollups advance, the
#: inventory changes: `config.read_cache`), and at most this long.
TYPED_MAX_AGE_S = 300
#: The rows the heatmap page asks for at most (static/js/heatmap.js ROWS_MAX): more are grouped.
PAGE_ROWS_MAX = 200


def typed_cache_key(user, query: HeatmapQuery) -> str:
    """One entry per scope and query: fleet admins share theirs (they see the same rows)."""
    scope = "fleet" if is_fleet_admin(user) else f"user:{user.pk}"
    fields = (scope, query.group, query.metric, query.stat, query.fold, query.sort, query.host_id,
              query.start.timestamp(), query.end.timestamp(), query.step, query.encoding, query.rows_max,
              query.row_start, query.row_count)
    return "heatmap:typed:" + hashlib.sha256(repr(fields).encode()).hexdigest()[:32]


def typed_answer(user, query: HeatmapQuery) -> bytes:
    """The typed answer as gzipped JSON, computed once per rollup advance and scope. Level 1:
    base64 text compresses barely better at 6 or 9 (10,000 x 288 cells of bench/heatmap.py:
    3.30 MB at 1, 3.23 at 6, 3.21 at 9) for 1.6-1.9x the time."""
    def compute() -> bytes:
        text = json.dumps(build_heatmap(user, query), ensure_ascii=False, allow_nan=False, separators=(",", ":"))
        return gzip.compress(text.encode(), compresslevel=1, mtime=0)

    return read_cache.cached(typed_cache_key(user, query), compute, max_age_s=TYPED_MAX_AGE_S)


def shared_end(now: datetime) -> datetime:
    """The end the heatmap page asks for a range ending now: the next 5-minute boundary. Rollups
    are 5-minute or hourly buckets, so the columns and cells are the same as up to `now`, and
    every viewer within those 5 minutes asks the same question and shares one cached answer."""
    floor = bucket_floor(now, FIVE_MINUTES)
    return floor if floor == now else floor + timedelta(seconds=FIVE_MINUTES)


def page_default_query(now: datetime) -> HeatmapQuery:
    """What the heatmap page asks first (dashboard.views.heatmap and static/js/heatmap.js): GPU
    x time, util_gpu mean, the last 24 h up to `shared_end`, by host, grouped past a screen."""
    end = shared_end(now)
    start = now - timedelta(hours=24)
    step = default_step(start, end)
    return HeatmapQuery(group="gpu", metric=DEFAULT_METRIC["gpu"], stat="avg", fold="none", sort="host",
                        host_id=None, start=bucket_floor(start, step), end=end, step=step, encoding="typed",
                        rows_max=PAGE_ROWS_MAX)


def warm_page_heatmap(now: datetime) -> bool:
    """Compute the page's first heatmap for fleet admins into the cache, so the first admin to
    open the page after the rollups advance does not wait for it (10,000 GPUs: about a second).
    Called once rollups were written; False when there is no admin to compute it as."""
    from django.contrib.auth import get_user_model

    admin = get_user_model().objects.filter(is_active=True, is_superuser=True).order_by("pk").first()
    if admin is None or not is_fleet_admin(admin):
        return False
    typed_answer(admin, page_default_query(now))
    return True

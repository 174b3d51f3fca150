"""Benchmark of `/api/v1/heatmap/`: GPU x time of a 1,000-GPU fleet over 24 h (or 10,000), json and
typed encodings, against the same matrix computed from raw samples.

    DATABASE_URL=postgres://postgres@127.0.0.1:5432/bench_heatmap python bench/heatmap.py [--gpus 1000] [--runs 7]

Runs in a throwaway test database (Django's `test_<name>`: `test_bench_heatmap` above, created
and dropped here), so it never touches real data. It seeds `--gpus` NVIDIA L40S GPUs on hosts
of 8 and a raw sample of each GPU every `--every` seconds for `--hours` hours from 10:35 UTC
(24 h every 30 s: 2.88 M rows, by one INSERT ... SELECT over generate_series; the range spans
two UTC days, as "the last 24 h" does), then the 5-minute and hourly rollups of those samples
by SQL aggregation (the same definitions as `telemetry.rollups`: avg, max, nearest-rank p95 =
percentile_disc(0.95); checked against `gpu_rollup` on a few buckets), because `build_rollups`
reads the samples into Python and would take minutes here, then the heatmap strips of those
rollups with the product's own code (`telemetry.strips.rebuild_days`, what
`manage.py build_heatmap_strips` runs; the typed answers read from them are checked against
the ones read from the rollups, byte for byte).

Then, after a warm-up, it times `--runs` requests of the endpoint through Django's APIClient
(a staff user; routing, the view, the queries, the JSON rendering) for GPU x time at 300 s
steps (288 columns), and the same matrix from raw samples: one SQL GROUP BY over GpuSample
into the same dense rows (query and matrix only, no labels and no JSON: a floor for any
raw-sample endpoint). Checks that both matrices agree (avg util_gpu) and prints both medians,
`ratio` (raw / endpoint), the raw query again without parallel workers (its cost on one
core), rows x columns and the payload size, then a few other views for reference.
The covering indexes of migration telemetry 0003 are in place (the seeding is followed by
VACUUM ANALYZE, as autovacuum would do, so PostgreSQL can answer from them alone).
Then the typed encoding (`?encoding=typed`, gzip accepted as a browser does): its payload on
the wire against the json one, its cells against the json ones (within half a quantisation
step); then, in turns (one call of each a round, so a burst of load on the shared machine
weighs on all alike), the raw-sample GROUP BY alone in the database (no rows fetched: the
strictest ratio) and the typed answer cold (the read cache emptied before each request: the
first request after the rollups advance, or a view nobody asked for yet), every row and as the
page asks it (`rows_max=200`), from the strips and from the rollups (the strips' coverage set
aside: the answer before strips existed); then warm (the cached answer every later viewer
gets). The load average is printed around the turns. `--gpus 10000 --every 300` is the
10,000 GPU x 288 bucket fleet of issue 21. PostgreSQL only (the seeding uses
generate_series). Prints figures; asserts only the agreement of the matrices.
"""

from __future__ import annotations

import argparse
import cProfile
import gc
import gzip
import io
import json
import math
import os
import platform
import pstats
import statistics
import sys
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")
os.environ.setdefault("DEBUG", "true")  # development settings, as `make run`: DEBUG is off unless set

import django  # noqa: E402

django.setup()

from django.db import connection  # noqa: E402
from django.test.utils import (  # noqa: E402
    setup_databases,
    setup_test_environment,
    teardown_databases,
    teardown_test_environment,
)

# A time of day, as "the last 24 h" is: the range spans two UTC days (two strips a GPU).
T0 = datetime(2026, 3, 2, 10, 35, tzinfo=UTC)
GPUS_PER_HOST = 8
BOARD = "NVIDIA L40S"
URL = "/api/v1/heatmap/"

# Rows are written in time order, as collection and `build_rollups` write them (the physical
# order decides what an index scan by GPU costs).
# util_gpu follows a studio day (busy in the afternoon) with a per-GPU phase and noise; the
# other metrics are noise around plausible levels. Some GPUs stay silent (every 97th): rows
# of nulls, as a real fleet has.
_SAMPLES_SQL = """
INSERT INTO telemetry_gpusample (gpu_id, ts, util_gpu, util_mem, fb_used_mib, fb_total_mib, enc_util, dec_util,
                                 temp_c, power_w, sm_clock_mhz)
SELECT g.id, %(t0)s::timestamptz + s * %(every)s * interval '1 second',
       LEAST(100, GREATEST(0, 45 + 40 * sin((s * %(every)s / 86400.0 + g.id / 97.0) * 2 * pi()) + random() * 20 - 10)),
       random() * 60, random() * 49152, 49152, NULL, 0, 30 + random() * 50, 60 + random() * 290, 2520
FROM fleet_gpu g CROSS JOIN generate_series(0, %(count)s - 1) s
WHERE g.id %% 97 <> 0
ORDER BY s, g.id
"""

_ROLLUPS_SQL = """
INSERT INTO telemetry_gpurollup (gpu_id, step_s, bucket, samples, util_gpu_avg, util_gpu_max, util_gpu_p95,
                                 util_mem_avg, util_mem_max, fb_used_mib_avg, fb_used_mib_max, fb_used_mib_p95,
                                 enc_util_avg, enc_util_max, dec_util_avg, dec_util_max, fb_total_mib,
                                 temp_c_avg, temp_c_max, power_w_avg, power_w_max, sm_clock_mhz_avg)
SELECT gpu_id, %(step)s, to_timestamp(floor(date_part('epoch', ts) / %(step)s) * %(step)s) AS bucket, count(*),
       avg(util_gpu), max(util_gpu), percentile_disc(0.95) WITHIN GROUP (ORDER BY util_gpu),
       avg(util_mem), max(util_mem),
       avg(fb_used_mib), max(fb_used_mib), percentile_disc(0.95) WITHIN GROUP (ORDER BY fb_used_mib),
       avg(enc_util), max(enc_util), avg(dec_util), max(dec_util), max(fb_total_mib),
       avg(temp_c), max(temp_c), avg(power_w), max(power_w), avg(sm_clock_mhz)
FROM telemetry_gpusample
GROUP BY gpu_id, bucket
ORDER BY bucket, gpu_id
"""

# The raw-sample matrix: the same cells (avg util_gpu per GPU and 300 s bucket), from samples (the
# samples keep whole percents, whose avg PostgreSQL gives as numeric: read as the rollups are, a double).
_RAW_SQL = """
SELECT gpu_id, CAST(floor((date_part('epoch', ts) - %s) / %s) AS INTEGER), CAST(avg(util_gpu) AS double precision)
FROM telemetry_gpusample WHERE ts >= %s AND ts < %s
GROUP BY 1, 2
"""


# The index docs/benchmarks.md proposes: the rollups in GPU order with what the GPU heatmaps'
# default views read, so the ordered aggregation reads an index instead of sorting the heap.
def seed(gpus: int, hours: float, every_s: int) -> dict:
    from fleet.models import Gpu, GpuModel, Host
    from telemetry import strips

    started = time.perf_counter()
    model = GpuModel.objects.get(name=BOARD)
    hosts = Host.objects.bulk_create(Host(name=f"bench-{h:04d}", cpu_threads=128, ram_gib=1024)
                                     for h in range(math.ceil(gpus / GPUS_PER_HOST)))
    Gpu.objects.bulk_create(
        Gpu(host=hosts[g // GPUS_PER_HOST], gpu_model=model, pci_bus_id=f"00000000:{g % GPUS_PER_HOST + 1:02X}:00.0",
            uuid=f"GPU-bench-{g}")
        for g in range(gpus)
    )
    timings = {}
    with connection.cursor() as cursor:
        cursor.execute("SELECT setseed(0.7)")
        cursor.execute(_SAMPLES_SQL, {"t0": T0, "every": every_s, "count": int(hours * 3600 / every_s)})
        timings["samples"] = (cursor.rowcount, time.perf_counter() - started)
        for step_s in (300, 3600):
            begun = time.perf_counter()
            cursor.execute(_ROLLUPS_SQL, {"step": step_s})
            timings[f"rollups {step_s} s"] = (cursor.rowcount, time.perf_counter() - begun)
    begun = time.perf_counter()
    last = T0 + timedelta(hours=hours) - timedelta(seconds=1)
    written = strips.rebuild_days(T0.date(), last.date())
    timings["heatmap strips"] = (written, time.perf_counter() - begun)
    with connection.cursor() as cursor:
        begun = time.perf_counter()
        # As autovacuum would have by the time anyone looks: statistics and the visibility map.
        cursor.execute("VACUUM ANALYZE")
        timings["vacuum analyze"] = (0, time.perf_counter() - begun)
    return timings


def check_rollups(buckets: int = 4) -> None:
    """The SQL rollups match `telemetry.rollups.gpu_rollup` (the product's definitions) on a few
    buckets of a few GPUs."""
    from telemetry.models import GpuRollup, GpuSample
    from telemetry.rollups import _GPU_FIELDS, gpu_rollup

    fields = ["samples", "util_gpu_avg", "util_gpu_max", "util_gpu_p95", "fb_used_mib_avg", "fb_used_mib_p95",
              "temp_c_max", "power_w_avg", "fb_total_mib"]
    for stored in GpuRollup.objects.order_by("?")[:buckets]:
        end = stored.bucket + timedelta(seconds=stored.step_s)
        rows = list(GpuSample.objects.filter(gpu_id=stored.gpu_id, ts__gte=stored.bucket, ts__lt=end)
                    .values_list(*_GPU_FIELDS))
        expected = gpu_rollup(stored.step_s, stored.bucket, stored.gpu_id, rows)
        for name in fields:
            got, want = getattr(stored, name), getattr(expected, name)
            if not math.isclose(got, want, rel_tol=1e-9, abs_tol=1e-9):
                raise SystemExit(f"SQL rollup differs from gpu_rollup: GPU {stored.gpu_id} {stored.bucket} "
                                 f"{stored.step_s} s {name}: {got} != {want}")


def raw_matrix(ids: list[int], start: datetime, end: datetime, step_s: int) -> list[list[float | None]]:
    """Dense rows, in the order of `ids`, of avg util_gpu per `step_s` bucket from raw samples."""
    columns = math.ceil((end - start).total_seconds() / step_s)
    index = {gpu_id: i for i, gpu_id in enumerate(ids)}
    z = [[None] * columns for _ in ids]
    with connection.cursor() as cursor:
        cursor.execute(_RAW_SQL, [start.timestamp(), step_s, start, end])
        for gpu_id, column, value in cursor.fetchall():
            z[index[gpu_id]][column] = value
    return z


def timed(function, runs: int, warmup: int = 2) -> tuple[float, list[float], object]:
    """Median seconds of `runs` calls after `warmup` calls, every time, and the last result."""
    for _ in range(warmup):
        result = function()
    times = []
    for _ in range(runs):
        started = time.perf_counter()
        result = function()
        times.append(time.perf_counter() - started)
    return statistics.median(times), times, result


def agree(a: list[list], b: list[list]) -> tuple[int, float]:
    """Cells compared and the largest difference; SystemExit where one has a value and not the other."""
    cells, worst = 0, 0.0
    for i, (row_a, row_b) in enumerate(zip(a, b, strict=True)):
        for j, (x, y) in enumerate(zip(row_a, row_b, strict=True)):
            if (x is None) != (y is None):
                raise SystemExit(f"row {i} column {j}: {x} vs {y}")
            if x is not None:
                cells += 1
                worst = max(worst, abs(x - y))
    return cells, worst


def within_step(exact: list[list], decoded: list[list]) -> tuple[int, float]:
    """Cells compared and the largest difference of a decoded typed matrix from the json one."""
    return agree(exact, decoded)


def _runs(times: list[float]) -> str:
    return ", ".join(f"{t * 1000:.0f}" for t in times)


def interleaved(functions: dict, runs: int) -> dict[str, list[float]]:
    """Seconds of each function's calls, called in turns (one of each a round, after one untimed
    round): on a shared machine a burst of load then weighs on all of them alike."""
    for function in functions.values():
        function()
    times = {name: [] for name in functions}
    for _ in range(runs):
        for name, function in functions.items():
            started = time.perf_counter()
            function()
            times[name].append(time.perf_counter() - started)
    return times


def load() -> str:
    return "load average " + " ".join(f"{x:.2f}" for x in os.getloadavg())


def typed_figures(args, endpoint, body: dict, json_bytes: int, end: datetime) -> None:
    """The typed encoding (`?encoding=typed`, gzip accepted as a browser does): its payload against
    the json one, its values against the json ones; then, in turns, the raw-sample GROUP BY alone
    in the database and the typed answer cold (the read cache emptied before each request: the
    first request after the rollups advance, or a view nobody asked for yet), whole and as the
    page asks it (`rows_max=200`), read from the heatmap strips and, with the strips' coverage
    set aside, from the rollups as before them; then warm (the cached answer)."""
    from config import read_cache
    from telemetry.heatmap_codec import decode
    from telemetry.models import StripCoverage

    def typed(cold: bool, **extra):
        if cold:
            read_cache.clear()
        return endpoint(encoding="typed", HTTP_ACCEPT_ENCODING="gzip", **extra)

    def from_rollups(**extra):
        """The same request answered from the rollups: the strips' coverage set aside meanwhile."""
        kept = list(StripCoverage.objects.all())
        StripCoverage.objects.all().delete()
        try:
            return typed(True, **extra)
        finally:
            StripCoverage.objects.bulk_create(kept)

    def sql_alone():
        with connection.cursor() as cursor:
            cursor.execute(f"SELECT count(*) FROM ({_RAW_SQL}) raw", [T0.timestamp(), 300, T0, end])
            cursor.fetchall()

    def parsed(response) -> dict:
        return json.loads(gzip.decompress(response.content))

    rows = len(body["ids"])
    response = typed(True)
    assert response["Content-Encoding"] == "gzip"
    text = gzip.decompress(response.content)
    typed_body = json.loads(text)
    cells, worst = within_step(body["z"], decode(typed_body["z"]))
    precision = typed_body["z"]["precision"]
    if worst > precision + 1e-9:
        raise SystemExit(f"typed cell off by {worst} > precision {precision}")
    print(f"typed encoding (from the strips): {cells:,} cells agree with json within {worst:.3f} (precision "
          f"{precision:.3f} = half of step {typed_body['z']['step']:.4f})")
    before = parsed(from_rollups())
    if before["z"]["bdata"] != typed_body["z"]["bdata"]:
        raise SystemExit("the typed answer from the strips differs from the one from the rollups")
    for new, old in zip(typed_body["rows"], before["rows"], strict=True):
        for name in ("peak", "mean"):
            if (new[name] is None) != (old[name] is None) or (
                    new[name] is not None and not math.isclose(new[name], old[name], rel_tol=1e-9)):
                raise SystemExit(f"row {new['label']} {name}: {new[name]} from the strips, {old[name]} before")
    grouped, grouped_before = parsed(typed(True, rows_max=200)), parsed(from_rollups(rows_max=200))
    if grouped["z"]["bdata"] != grouped_before["z"]["bdata"] or grouped["y"] != grouped_before["y"]:
        raise SystemExit("the grouped typed answer from the strips differs from the one from the rollups")
    off = max(abs(new[name] - old[name]) for new, old in zip(grouped["groups"], grouped_before["groups"], strict=True)
              for name in ("peak", "mean") if new[name] is not None)
    print(f"the same codes from the strips as from the rollups: {rows:,} rows and {len(grouped['y'])} groups, "
          f"byte for byte; rows' peak and mean exact; groups' within {off:.3f} (their precision "
          f"{grouped['groups'][0]['precision']:.3f})")
    print(f"payload {rows:,} x {len(body['x'])}: json {json_bytes / 1e6:.2f} MB; typed {len(text) / 1e6:.2f} MB, "
          f"gzipped on the wire {len(response.content) / 1e6:.3f} MB = {len(response.content) / json_bytes:.1%} "
          f"of json; rows_max=200: {grouped['z']['shape']} cells, "
          f"{len(typed(False, rows_max=200).content) / 1e3:.0f} kB")

    # This process holds the json answer's 2.9 M floats for the checks above; a web worker holds
    # nothing of the kind, and the collector's full passes over them would land on whichever
    # request happens to trigger one. Frozen out of its sight, as a pre-forking server does.
    gc.collect()
    gc.freeze()
    print(f"in turns, {args.runs} rounds ({load()}):")
    times = interleaved({
        "raw samples: the GROUP BY alone (count of it, nothing fetched)": sql_alone,
        "typed cold from the strips, every row": lambda: typed(True),
        "typed cold from the strips, rows_max=200 (the page)": lambda: typed(True, rows_max=200),
        "typed cold from the rollups (before the strips), every row": from_rollups,
        "typed cold from the rollups, rows_max=200": lambda: from_rollups(rows_max=200),
    }, args.runs)
    print(f"  ({load()} after)")
    gc.unfreeze()
    raw_alone = statistics.median(next(iter(times.values())))
    for name, seconds in times.items():
        median = statistics.median(seconds)
        ratio = "" if median == raw_alone else f"; GROUP BY alone / this {raw_alone / median:.1f}x"
        print(f"  {name}: median {median * 1000:.1f} ms (runs: {_runs(seconds)}){ratio}")
    warm_s, warm_runs, _ = timed(lambda: typed(False), args.runs)
    grouped_warm, _, _ = timed(lambda: typed(False, rows_max=200), args.runs)
    print(f"typed, warm (cached answer): median {warm_s * 1000:.1f} ms (runs: {_runs(warm_runs)}); rows_max=200 "
          f"{grouped_warm * 1000:.1f} ms; GROUP BY alone / warm {raw_alone / warm_s:.1f}x")
    if rows > 1000:
        # The payload of 1,000 rows of this fleet (a window of the sorted rows), as a 1,000-GPU fleet has.
        small = endpoint(row_count=1000)
        small_typed = typed(False, row_count=1000)
        print(f"payload 1,000 x {len(body['x'])} (row_count=1000): json {len(small.content) / 1e6:.2f} MB; typed "
              f"gzipped {len(small_typed.content) / 1e6:.3f} MB = {len(small_typed.content) / len(small.content):.1%}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gpus", type=int, default=1000)
    parser.add_argument("--hours", type=float, default=24)
    parser.add_argument("--every", type=int, default=30, help="seconds between samples")
    parser.add_argument("--runs", type=int, default=7)
    parser.add_argument("--profile", action="store_true", help="print a cProfile of one endpoint request")
    parser.add_argument("--skip-others", action="store_true", help="skip the other views (sort, metric, step, host)")
    parser.add_argument("--keep", action="store_true",
                        help="keep the database (and reuse its seed next time: the same arguments are assumed)")
    args = parser.parse_args()
    if connection.vendor != "postgresql":
        raise SystemExit("bench/heatmap.py seeds with generate_series: set DATABASE_URL to a PostgreSQL server")

    from rest_framework.test import APIClient

    from fleet.tests.factories import UserFactory

    # The test client's host name allowed, and DEBUG off: no query log slowing the requests.
    setup_test_environment(debug=False)
    # No serialized copy of the database (that is for transactional tests): with --keep it would
    # read every seeded row before the first figure.
    old_config = setup_databases(verbosity=0, interactive=False, keepdb=args.keep, serialized_aliases=set())
    try:
        with connection.cursor() as cursor:
            cursor.execute("SHOW server_version")
            server = cursor.fetchone()[0]
        print(f"database: PostgreSQL {server}, {connection.settings_dict['NAME']}; Python {platform.python_version()}, "
              f"{os.cpu_count()} CPUs")
        from fleet.models import Gpu

        if Gpu.objects.exists():
            print(f"reusing the seeded database ({Gpu.objects.count():,} GPUs)")
        else:
            for name, (rows, seconds) in seed(args.gpus, args.hours, args.every).items():
                print(f"seeded {name:>14}: {rows:>10,} rows in {seconds:6.1f} s")
        check_rollups()
        print("SQL rollups checked against telemetry.rollups.gpu_rollup: OK")
        with connection.cursor() as cursor:
            cursor.execute("VACUUM ANALYZE telemetry_gpurollup")
        print("rollups vacuumed and analyzed (index-only scans of telemetry 0003's covering index)")

        client = APIClient()
        client.force_authenticate(UserFactory(username="bench-admin", is_staff=True))  # get_or_create
        end = T0 + timedelta(hours=args.hours)
        params = {"start": T0.isoformat(), "end": end.isoformat(), "group": "gpu", "metric": "util_gpu",
                  "stat": "avg", "step": 300}

        def endpoint(HTTP_ACCEPT_ENCODING="", **extra):  # noqa: N803 - the test client's name for the header
            response = client.get(URL, {**params, **extra}, HTTP_ACCEPT_ENCODING=HTTP_ACCEPT_ENCODING)
            assert response.status_code == 200, response.content[:500]
            return response

        api_s, api_runs, response = timed(endpoint, args.runs)
        body = response.json()
        raw_s, raw_runs, raw = timed(lambda: raw_matrix(body["ids"], T0, end, 300), args.runs)
        cells, worst = agree(body["z"], raw)
        del raw  # 2.9 M floats: see typed_figures on the garbage collector
        rows, columns = len(body["y"]), len(body["x"])
        print(f"GPU x time, 300 s: {rows:,} rows x {columns} columns = {rows * columns:,} cells "
              f"({cells:,} with data), payload {len(response.content) / 1e6:.2f} MB")
        print(f"matrices agree: {cells:,} cells, largest difference {worst:.2e}")
        print(f"endpoint (rollups):    median {api_s * 1000:7.1f} ms  "
              f"(runs: {', '.join(f'{t * 1000:.0f}' for t in api_runs)})")
        print(f"raw samples (GROUP BY): median {raw_s * 1000:7.1f} ms  "
              f"(runs: {', '.join(f'{t * 1000:.0f}' for t in raw_runs)})")
        print(f"ratio (raw / endpoint): {raw_s / api_s:.1f}x")
        # The raw GROUP BY runs on 2 parallel workers besides the leader; the endpoint's
        # ordered aggregation cannot (json_agg has no parallel mode in PostgreSQL 15). The same
        # raw query on one process tells what it costs in CPU, not only in wall time.
        with connection.cursor() as cursor:
            cursor.execute("SET max_parallel_workers_per_gather = 0")
        serial_s, serial_runs, _ = timed(lambda: raw_matrix(body["ids"], T0, end, 300), args.runs, warmup=1)
        with connection.cursor() as cursor:
            cursor.execute("RESET max_parallel_workers_per_gather")
        print(f"raw samples, no parallel workers: median {serial_s * 1000:7.1f} ms  "
              f"(runs: {', '.join(f'{t * 1000:.0f}' for t in serial_runs)}); ratio {serial_s / api_s:.1f}x")

        typed_figures(args, endpoint, body, len(response.content), end)

        if args.skip_others:
            return
        for label, extra in (
            ("GPU x time, sort=peak", {"sort": "peak"}),
            ("GPU x time, fb_used_pct", {"metric": "fb_used_pct"}),
            ("GPU x time, 900 s (merged)", {"step": 900}),
            ("host x time, 300 s", {"group": "host"}),
            ("host x hour of week", {"group": "host", "fold": "hour_of_week", "step": ""}),
        ):
            seconds, _, other = timed(lambda extra=extra: endpoint(**extra), args.runs, warmup=1)
            shape = other.json()
            print(f"{label:>28}: median {seconds * 1000:7.1f} ms  ({len(shape['y']):,} x {len(shape['x'])}, "
                  f"{len(other.content) / 1e6:.2f} MB)")

        if args.profile:
            profiler = cProfile.Profile()
            profiler.enable()
            endpoint()
            profiler.disable()
            out = io.StringIO()
            pstats.Stats(profiler, stream=out).sort_stats("tottime").print_stats(25)
            print(out.getvalue())
    finally:
        if not args.keep:
            teardown_databases(old_config, verbosity=0)
        teardown_test_environment()


if __name__ == "__main__":
    main()

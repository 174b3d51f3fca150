"""Sizing figures for docs/operations.md ("Sizing the deployment"): what one collector core, one
PostgreSQL core and 1,000 hosts of a collector's memory come to.

    DATABASE_URL=postgres://postgres@127.0.0.1:5432/fleet_bench REDIS_URL=redis://127.0.0.1:6379/12 \\
        python bench/deployment_sizing.py [--agents 2000] [--seconds 20]

It reuses bench/ingest.py's machinery: the same inventory (hosts bench-NNNN, 8 L40S GPUs with 4
vGPUs each: 40 sample rows a poll), the same agents (one asyncio process serving a pre-rendered
sim report per agent on loopback) and the real collection path (`telemetry.collect.poll_batch`:
fetch, parse, map, COPY, agent status). Measured in one run, side by side:

1. collector CPU per poll: one collector process polls the whole fleet, batch after batch, for
   `--seconds` after an untimed warm-up pass (as a worker that has been running); its CPU time
   (user + system, every thread: getrusage) over the polls it made. At the poll interval
   (TELEMETRY_POLL_INTERVAL_S, 10 s) one core polls interval / CPU-per-poll hosts. CPU time, not
   wall time: on a shared machine the wall clock counts other processes' turns, CPU time does
   not (much).
2. PostgreSQL rows per second per core: the CPU time of that collector's own PostgreSQL backend
   (/proc/<pid>/stat; the server must run on this machine) over the sample rows it stored: the
   whole store path (inventory lookups, COPY, agent status). Then the bare COPY of the same rows,
   alone, in 400-row batches (the ceiling of bench/ingest.py). The server's background processes
   (WAL writer, checkpointer, background writer, autovacuum) are printed apart: they serve every
   database of the server, other people's too on a shared machine.
3. memory per 1,000 hosts: the resident memory (RSS) of a collector process (spawned fresh, as
   a worker's) that polled a quarter of the fleet and of one that polled all of it, each after
   its polls (a process's memory stops growing after its first pass over its agents); the
   difference over the difference in hosts is what each further 1,000 hosts cost one process
   (a kept-alive connection to each agent, its copy of their inventory rows), the rest is the
   process itself.

Prints figures and the load average; asserts nothing. Needs a PostgreSQL database of its own
(it migrates it and creates the bench inventory once, as bench/ingest.py does, which it shares).
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import platform
import sys
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# The project first: bench/ (this script's folder) must not shadow an app of the same name.
sys.path.insert(0, str(ROOT))
if str(ROOT / "bench") not in sys.path:
    sys.path.append(str(ROOT / "bench"))
from production import use_production_settings  # noqa: E402 (bench/)

use_production_settings()  # DEBUG off, as the workers run (bench/production.py)

import ingest  # noqa: E402 - bench/ingest.py, after the path above
import proc_cpu  # noqa: E402
from proc_cpu import backend_pid, own_cpu_s, process_cpu_s  # noqa: E402

ROWS_PER_POLL = ingest.GPUS_PER_HOST * (1 + ingest.VGPUS_PER_GPU)
#: Also the autovacuum processes: they clean up after the rows this bench stores.
BACKGROUND = (*proc_cpu.BACKGROUND, "autovacuum launcher", "autovacuum worker")


def rss_mib() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError("no VmRSS in /proc/self/status")


def background_pids() -> list[int]:
    from django.db import connection

    return proc_cpu.postgres_background_pids(connection, BACKGROUND)


def background_cpu_s(pids: list[int]) -> float:
    """Their CPU seconds; an autovacuum worker that has ended counts 0."""
    return sum(map(process_cpu_s, pids))


# -- 1 and 2: a collector process -------------------------------------------------------------------


def collector(ids: list[int], seconds: float, batch: int, queue) -> None:
    """Poll `ids` through collect.poll_batch: an untimed pass, then `seconds` of passes (each agent at
    most once a second, as bench/ingest.py). Reports CPU, its backend's CPU, rows and memory."""
    import django

    django.setup()
    ingest._raise_fd_limit()
    from django.db import connection

    from telemetry import collect

    backend = backend_pid(connection)
    rss_start = rss_mib()
    batches = collect.shard(ids, batch)
    last_start = [0.0] * len(batches)
    for index, share in enumerate(batches):
        last_start[index] = time.monotonic()
        collect.poll_batch(share)
    rss_warm = rss_mib()
    background = background_pids()
    cpu0, backend0, background0, started = own_cpu_s(), process_cpu_s(backend), background_cpu_s(background), \
        time.monotonic()
    polls = ok = rows = bound = 0
    while time.monotonic() - started < seconds:
        for index, share in enumerate(batches):
            if time.monotonic() - started >= seconds:
                break
            wait = last_start[index] + ingest.SPACING_S - time.monotonic()
            if wait > 0:
                bound += 1
                time.sleep(wait)
            last_start[index] = time.monotonic()
            result = collect.poll_batch(share)
            polls += result.polled
            ok += result.ok
            rows += result.gpu_samples + result.vgpu_samples
    queue.put({"hosts": len(ids), "polls": polls, "ok": ok, "rows": rows, "bound": bound,
               "elapsed": time.monotonic() - started, "cpu_s": own_cpu_s() - cpu0,
               "backend_cpu_s": process_cpu_s(backend) - backend0,
               "background_cpu_s": background_cpu_s(background) - background0,
               "rss_start": rss_start, "rss_warm": rss_warm, "rss_end": rss_mib(),
               "inventory_rows": _inventory_rows()})


def _inventory_rows() -> int:
    """Rows of this process's copy of the inventory (0: not kept, the read cache is off)."""
    from telemetry import inventory_cache

    return inventory_cache.CACHE.rows()


def run_collector(ids: list[int], seconds: float, batch: int) -> dict:
    from django.db import connection

    ingest.clear_samples()
    connection.close()
    # Spawned, not forked: a fresh process, as a worker's, whose memory holds nothing of this one's
    # (a forked child's RSS counts the pages it shares with the parent that built the inventory).
    context = multiprocessing.get_context("spawn")
    queue = context.Queue()
    process = context.Process(target=collector, args=(ids, seconds, batch, queue))
    process.start()
    result = queue.get()
    process.join()
    return result


# -- 2: the bare COPY -------------------------------------------------------------------------------


def run_copy(rows_wanted: int) -> dict:
    """COPY `rows_wanted` sample rows (GPU and vGPU, 8 and 32 a host, as a poll stores them) of the
    bench inventory in 400-row batches, each its own transaction; CPU of this backend."""
    from django.db import connection, transaction

    from fleet.models import Gpu, Vgpu

    ingest.clear_samples()
    gpus = list(Gpu.objects.filter(host__name__startswith="bench-").order_by("pk").values_list("pk", flat=True))
    vgpus: dict[int, list[tuple[int, int]]] = {}
    for vm_id, gpu_id, vgpu_id in Vgpu.objects.filter(gpu__host__name__startswith="bench-").values_list(
            "vm_id", "gpu_id", "id"):
        vgpus.setdefault(gpu_id, []).append((vm_id, vgpu_id))
    backend = backend_pid(connection)
    background = background_pids()
    start_ts = datetime.now(tz=UTC).replace(microsecond=0) - timedelta(hours=1)
    copied = rounds = 0
    backend0, background0, started = process_cpu_s(backend), background_cpu_s(background), time.monotonic()
    with connection.cursor() as cursor:
        raw = cursor.connection
        while copied < rows_wanted:
            ts = start_ts + timedelta(seconds=rounds)
            gpu_rows, vgpu_rows = [], []
            for gpu_id in gpus:
                gpu_rows.append((gpu_id, ts, 63, 41, 30_000, 46_068, 0, 0, 61, 212.5, 1_980))
                vgpu_rows.extend((vm_id, gpu_id, vgpu_id, ts, 7_000, 15, 10, 0, 0)
                                 for vm_id, vgpu_id in vgpus.get(gpu_id, ()))
                if len(gpu_rows) + len(vgpu_rows) >= 400:
                    ingest._copy(raw, transaction, gpu_rows, vgpu_rows)
                    copied += len(gpu_rows) + len(vgpu_rows)
                    gpu_rows, vgpu_rows = [], []
            ingest._copy(raw, transaction, gpu_rows, vgpu_rows)
            copied += len(gpu_rows) + len(vgpu_rows)
            rounds += 1
    result = {"rows": copied, "elapsed": time.monotonic() - started,
              "backend_cpu_s": process_cpu_s(backend) - backend0,
              "background_cpu_s": background_cpu_s(background) - background0}
    ingest.clear_samples()
    return result


# -- report ---------------------------------------------------------------------------------------


def loadavg() -> str:
    return " ".join(f"{value:.2f}" for value in os.getloadavg())


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--agents", type=int, default=2000, help="simulated hosts of the fleet (default 2000)")
    parser.add_argument("--seconds", type=float, default=20.0, help="seconds of polls per collector (default 20)")
    parser.add_argument("--batch", type=int, default=50, help="agents per poll_batch (TELEMETRY_BATCH_SIZE)")
    parser.add_argument("--copy-rows", type=int, default=400_000, help="rows of the bare COPY (default 400,000)")
    parser.add_argument("--base-port", type=int, default=23000)
    parser.add_argument("--interval", type=float, default=10.0,
                        help="poll interval the hosts-per-core figure is given for (TELEMETRY_POLL_INTERVAL_S)")
    args = parser.parse_args()
    ingest._raise_fd_limit()

    spec = ingest.setup(args.agents, args.base_port)
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute("SHOW server_version")
        pg_version = cursor.fetchone()[0]
    server = ingest.start_agents(spec, "bench-sizing-agents.json")
    if server is None:
        return 1
    ids = [agent["id"] for agent in spec]
    quarter = ids[: max(1, len(ids) // 4)]
    print(f"{platform.node()}: {os.cpu_count()} cores, Python {platform.python_version()}, PostgreSQL {pg_version}, "
          f"{args.agents} hosts x {ingest.GPUS_PER_HOST} GPUs x {ingest.VGPUS_PER_GPU} vGPUs ({ROWS_PER_POLL} rows "
          f"a poll), {args.seconds:g} s of polls a collector, batches of {args.batch}")
    print(f"load average at start: {loadavg()}", flush=True)
    try:
        small = run_collector(quarter, args.seconds, args.batch)
        print(f"load average after the {len(quarter)}-host collector: {loadavg()}", flush=True)
        full = run_collector(ids, args.seconds, args.batch)
        print(f"load average after the {len(ids)}-host collector: {loadavg()}", flush=True)
    finally:
        server.kill()
    copy = run_copy(args.copy_rows)
    print(f"load average at the end: {loadavg()}")
    print()

    for run in (small, full):
        print(f"collector, {run['hosts']:>5} hosts: {run['ok']}/{run['polls']} polls ok, {run['rows']} rows in "
              f"{run['elapsed']:.1f} s; CPU {run['cpu_s']:.2f} s (collector) {run['backend_cpu_s']:.2f} s (its "
              f"PostgreSQL backend) {run['background_cpu_s']:.2f} s (server background); RSS {run['rss_start']:.1f} "
              f"MiB at start, {run['rss_warm']:.1f} after the warm-up pass, {run['rss_end']:.1f} at the end; "
              f"{run['inventory_rows']:,} inventory rows kept"
              + (f"  (waited for the 1 s spacing {run['bound']} times)" if run["bound"] else ""))
    print(f"bare COPY: {copy['rows']} rows in {copy['elapsed']:.1f} s; CPU {copy['backend_cpu_s']:.2f} s (backend) "
          f"{copy['background_cpu_s']:.2f} s (server background)")
    print()

    both = [run for run in (small, full) if run["ok"]]
    cpu_ms = 1000 * sum(run["cpu_s"] for run in both) / sum(run["ok"] for run in both)
    print(f"collector CPU per poll:              {cpu_ms:.2f} ms  (1 process, both runs)")
    print(f"hosts per worker core at {args.interval:g} s:      {args.interval * 1000 / cpu_ms:,.0f}")
    store_rows_s = sum(run["rows"] for run in both) / sum(run["backend_cpu_s"] for run in both)
    with_background = sum(run["rows"] for run in both) / sum(run["backend_cpu_s"] + run["background_cpu_s"]
                                                              for run in both)
    print(f"rows/s per PostgreSQL core, store:   {store_rows_s:,.0f}  (the collector's backend; "
          f"{with_background:,.0f} counting the server's background processes too)")
    print(f"rows/s per PostgreSQL core, COPY:    {copy['rows'] / copy['backend_cpu_s']:,.0f}  (bare COPY, backend; "
          f"{copy['rows'] / (copy['backend_cpu_s'] + copy['background_cpu_s']):,.0f} with background)")
    slope = (full["rss_end"] - small["rss_end"]) / (full["hosts"] - small["hosts"]) * 1000
    base = small["rss_end"] - slope * small["hosts"] / 1000
    print(f"memory per 1,000 hosts:              {slope:.1f} MiB  (one collector process; the process itself "
          f"{base:.0f} MiB)")
    print(f"load average at the end:             {loadavg()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

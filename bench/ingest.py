"""Benchmark of collection: agent polls through the real path into PostgreSQL, against a ceiling.

    DATABASE_URL=postgres://postgres@127.0.0.1:5432/fleet_bench python bench/ingest.py [--agents 3000] [--seconds 30]

What it measures, on loopback, in one run:
- real path: `telemetry.collect.poll_batch` (concurrent keep-alive fetch, `parse_agent_payload`,
  one `store_reports` per batch, agent status updates) over batches of TELEMETRY_BATCH_SIZE,
  in 1 process and in `--procs` processes (as a Celery worker of that concurrency would);
- ceiling: the same agents and rows with nothing but a sequential keep-alive scrape,
  `json.loads`, a dict lookup of each UUID and COPY into the same two tables;
and prints agent polls/s, samples/s, a zero-loss check (rows stored == rows expected from
the successful polls) and `ratio` = real polls/s / ceiling polls/s.

The agents: one separate process serving every agent on its own loopback port with asyncio,
answering GET /v1/metrics (bearer token checked, keep-alive) with a payload PRE-RENDERED by the
real sim backend (`telemetry.agent.sim_backend.SimBackend`, 8 L40S GPUs with 4 L40S-12Q vGPUs
each = 32 vGPUs per agent, ~13 KB of JSON) into which a fresh `collected_at` is written per
request. Not the real agent server: its thread per connection and per-request simulation
would take CPU from the collector on a 2-core machine and measure the sim, not the collector
(bench/agent.py measures the agent).

Each collector process first makes one untimed pass over its agents (a worker that has run a
while keeps its connections, event loop and copy of the inventory warm); `--cold` starts
the clock at once. `--profile FILE` runs the 1-process phase under cProfile and prints its top.

Samples are stamped to the whole second (telemetry.ingest), so an agent polled twice within a
second yields one sample: each pass over the fleet therefore polls every agent at most once a
second, like a fleet of `--agents` hosts polled at a 1 s interval. The fleet must be large
enough that this never binds; the run says when it did. The inventory (hosts bench-NNNN) is
created once in the database, reused, and analyzed at every start; each phase deletes the
bench's samples first.
Needs a database of its own: it migrates it. Prints figures; asserts nothing.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing
import os
import platform
import resource
import sys
import time
import uuid
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from proc_cpu import backend_pid, own_cpu_s, postgres_background_pids, process_cpu_s  # noqa: E402 (bench/)
from production import use_production_settings  # noqa: E402 (bench/)

use_production_settings()  # DEBUG off, as the workers run (bench/production.py)

GPUS_PER_HOST = 8
VGPUS_PER_GPU = 4
BOARD = "NVIDIA L40S"
PROFILE = "L40S-12Q"
# An agent is polled again no sooner than this (samples are stamped to the whole second).
SPACING_S = 1.05
NAMESPACE = uuid.UUID("0e4c9f5a-3b7d-4e21-9c4f-be0c00000000")

# -- agents ---------------------------------------------------------------------------------------


def serve_agents(spec_path: str, ready: multiprocessing.Event) -> None:
    """Serve every agent of the spec file on its port until killed (runs in its own process)."""
    spec = json.loads(Path(spec_path).read_text())
    _raise_fd_limit()

    async def main():
        servers = []
        for agent in spec:
            prefix, suffix = agent["prefix"].encode(), agent["suffix"].encode()
            expected = f"Bearer {agent['token']}".encode()

            async def handle(reader, writer, prefix=prefix, suffix=suffix, expected=expected):
                try:
                    while True:
                        head = await reader.readuntil(b"\r\n\r\n")
                        if expected not in head:
                            body = b'{"error": "invalid bearer token"}'
                            status = b"401 Unauthorized"
                        else:
                            body = prefix + repr(time.time()).encode() + suffix
                            status = b"200 OK"
                        writer.write(b"HTTP/1.1 " + status + b"\r\nContent-Type: application/json\r\nContent-Length: "
                                     + str(len(body)).encode() + b"\r\n\r\n" + body)
                except (asyncio.IncompleteReadError, ConnectionError):
                    pass
                finally:
                    writer.close()

            servers.append(await asyncio.start_server(handle, "127.0.0.1", agent["port"], backlog=64))
        ready.set()
        await asyncio.Event().wait()

    asyncio.run(main())


def start_agents(spec: list[dict], file_name: str) -> multiprocessing.Process | None:
    """The agents of `spec` served by a process of their own (its spec written to var/`file_name`),
    once they listen; None (said on stderr) if they do not start within a minute. The database
    connection of this process is closed first: a forked child must not share its session."""
    from django.db import connection

    spec_path = ROOT / "var" / file_name
    spec_path.parent.mkdir(exist_ok=True)
    spec_path.write_text(json.dumps(spec))
    connection.close()
    ready = multiprocessing.Event()
    server = multiprocessing.Process(target=serve_agents, args=(str(spec_path), ready), daemon=True)
    server.start()
    if not ready.wait(60):
        server.kill()
        print("agents did not start", file=sys.stderr)
        return None
    return server


def _raise_fd_limit() -> None:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))


# -- inventory ------------------------------------------------------------------------------------


# What an agent with the health fields (issue 19) adds to a report of a healthy vGPU host: the same
# state every poll, as on a healthy fleet, so the health writes cost only their per-batch reads.
DRIVER = {"driver_version": "580.159.04", "vgpu_manager_version": "19.2", "nvml_version": "12.580.159.04",
          "cuda_driver_version": 13000, "unsupported": []}
GPU_HEALTH = {"ecc_mode": "enabled", "ecc_corrected_volatile": 0, "ecc_uncorrected_volatile": 0,
              "ecc_corrected_aggregate": 0, "ecc_uncorrected_aggregate": 0, "retired_pages_sbe": None,
              "retired_pages_dbe": None, "retired_pages_pending": None, "remapped_rows_correctable": 0,
              "remapped_rows_uncorrectable": 0, "remapped_rows_pending": False, "remapped_rows_failure": False,
              "throttle_reasons": ["gpu_idle"], "pcie_replay_counter": 0, "fan_speed_pct": None,
              "temp_slowdown_c": 87.0, "temp_shutdown_c": 92.0, "power_limit_w": 350.0, "performance_state": "P0",
              "xid_events": [], "unsupported": ["retired_pages_sbe", "retired_pages_dbe", "retired_pages_pending",
                                                "fan_speed_pct"]}
VGPU_HEALTH = {"license_state": "licensed", "license_expiry": 1798761600.0, "guest_driver_version": "580.95",
               "frame_rate_limit": 60, "encoder_sessions": 0, "guest_info_state": "initialized", "unsupported": []}


def with_health(document: dict) -> dict:
    """The report with the health fields of a healthy host added (driver, per GPU, per vGPU)."""
    document["driver"] = DRIVER
    for gpu in document["gpus"]:
        gpu["clocks_event_reasons"] = 1
        gpu["health"] = GPU_HEALTH
        for vgpu in gpu["vgpus"]:
            vgpu.update(VGPU_HEALTH)
    return document


def setup(agents: int, base_port: int, health: bool = False) -> list[dict]:
    """Create (once) the bench inventory and its Agent rows; return the agents' serving spec."""
    import django

    django.setup()
    from django.core.management import call_command
    from django.db import connection, transaction

    from fleet.models import Gpu, GpuModel, Host, Vgpu, VgpuProfile, VirtualMachine
    from telemetry.agent.sim_backend import SimBackend
    from telemetry.demo import host_scenario
    from telemetry.models import Agent

    assert connection.vendor == "postgresql", "set DATABASE_URL to a PostgreSQL database of its own"
    call_command("migrate", verbosity=0)
    model = GpuModel.objects.get(name=BOARD)
    profile = VgpuProfile.objects.get(name=PROFILE)
    names = [f"bench-{n:04d}" for n in range(agents)]
    existing = set(Host.objects.filter(name__in=names).values_list("name", flat=True))
    missing = [name for name in names if name not in existing]
    if missing:
        print(f"creating the bench inventory: {len(missing)} hosts, {len(missing) * GPUS_PER_HOST} GPUs, "
              f"{len(missing) * GPUS_PER_HOST * VGPUS_PER_GPU} VMs ...", flush=True)
        with transaction.atomic():
            hosts = Host.objects.bulk_create([Host(name=name, cpu_threads=256, ram_gib=4096) for name in missing])
            gpus = Gpu.objects.bulk_create([
                Gpu(host=host, gpu_model=model, pci_bus_id=f"00000000:{0x1B + g:02X}:00.0",
                    uuid=f"GPU-{uuid.uuid5(NAMESPACE, f'{host.name}/{g}')}")
                for host in hosts for g in range(GPUS_PER_HOST)
            ])
            vms = VirtualMachine.objects.bulk_create([
                VirtualMachine(name=f"{gpu.host.name}-vm-{gpu.pci_bus_id[9:11]}-{v}", host=gpu.host, vcpus=4,
                               ram_gib=16, uuid=uuid.uuid5(NAMESPACE, f"{gpu.uuid}/{v}"))
                for gpu in gpus for v in range(VGPUS_PER_GPU)
            ])
            Vgpu.objects.bulk_create([
                Vgpu(vm=vm, gpu=gpus[i // VGPUS_PER_GPU], profile=profile, placement_id=i % VGPUS_PER_GPU)
                for i, vm in enumerate(vms)
            ])
    spec = []
    hosts = {host.name: host for host in Host.objects.filter(name__in=names)}
    for offset, name in enumerate(names):
        port = base_port + offset
        agent, _ = Agent.objects.update_or_create(
            name=name, defaults={"url": f"http://127.0.0.1:{port}", "host": hosts[name], "enabled": True,
                                 "timeout_s": 5.0, "kind": "nvml"},
        )
        document = {"agent": {"version": "1.0.0", "hostname": name, "backend": "sim"}, "collected_at": 0.0,
                    "gpus": SimBackend(host_scenario(hosts[name], timezone="UTC")).collect(time.time())}
        if health:
            document = with_health(document)
        text = json.dumps(document, separators=(",", ":"))
        prefix, suffix = text.split('"collected_at":0.0', 1)
        spec.append({"id": agent.pk, "name": name, "port": port, "token": agent.token,
                     "prefix": prefix + '"collected_at":', "suffix": suffix})
    # Planner statistics for the inventory just created (autovacuum analyzes it some minutes
    # later, a production database long since): without them PostgreSQL guesses, and the
    # phases would measure its guesses, differently from one run to the next.
    with connection.cursor() as cursor:
        cursor.execute("ANALYZE fleet_host, fleet_gpu, fleet_gpumodel, fleet_virtualmachine, fleet_vgpu, "
                       "fleet_vgpuprofile, telemetry_agent")
    return spec


def warm_health(spec: list[dict], batch: int) -> None:
    """Store one report of every agent, untimed, so the phases measure a fleet whose health state
    rows exist and do not change (the steady state: a GPU's rows are written once, then only
    when its health changes)."""
    from telemetry.ingest import store_reports
    from telemetry.models import Agent
    from telemetry.payload import parse_agent_payload

    agents = Agent.objects.in_bulk([agent["id"] for agent in spec])
    started = time.monotonic()
    for n in range(0, len(spec), batch):
        now = time.time()
        store_reports([(agents[agent["id"]], parse_agent_payload(f"{agent['prefix']}{now}{agent['suffix']}"))
                       for agent in spec[n:n + batch]], received_at=now)
    print(f"health state written for {len(spec)} agents in {time.monotonic() - started:.1f} s (untimed)", flush=True)
    from django.db import connection

    with connection.cursor() as cursor:  # as autovacuum would have, see setup()
        cursor.execute("ANALYZE telemetry_gpuhealthstate, telemetry_vgpuhealthstate, telemetry_hostdriverstate")


def clear_samples() -> None:
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute("DELETE FROM telemetry_vgpusample WHERE gpu_id IN (SELECT g.id FROM fleet_gpu g "
                       "JOIN fleet_host h ON h.id = g.host_id WHERE h.name LIKE 'bench-%')")
        cursor.execute("DELETE FROM telemetry_gpusample WHERE gpu_id IN (SELECT g.id FROM fleet_gpu g "
                       "JOIN fleet_host h ON h.id = g.host_id WHERE h.name LIKE 'bench-%')")
        # Every phase starts from clean tables: no autovacuum of the last phase's dead rows midway.
        cursor.execute("VACUUM ANALYZE telemetry_gpusample, telemetry_vgpusample")


def stored_rows() -> tuple[int, int]:
    from django.db import connection

    with connection.cursor() as cursor:
        bench = "SELECT g.id FROM fleet_gpu g JOIN fleet_host h ON h.id = g.host_id WHERE h.name LIKE 'bench-%'"
        cursor.execute(f"SELECT count(*) FROM telemetry_gpusample WHERE gpu_id IN ({bench})")
        gpu_rows = cursor.fetchone()[0]
        cursor.execute(f"SELECT count(*) FROM telemetry_vgpusample WHERE gpu_id IN ({bench})")
        return gpu_rows, cursor.fetchone()[0]


# -- real path ------------------------------------------------------------------------------------


def real_worker(ids: list[int], seconds: float, batch: int, queue, profile: str = "", warm: bool = True) -> None:
    """Poll `ids` through collect.poll_batch for `seconds`; each agent at most once a second.
    With `profile`, the polls run under cProfile (fetching and parsing included: they run on the
    calling thread's event loop) and the stats are written to that file."""
    import django

    django.setup()
    _raise_fd_limit()
    from telemetry import collect

    if profile:
        import cProfile

        profiler = cProfile.Profile()

    polls = ok = gpu_rows = vgpu_rows = passes = bound = 0
    errors: dict[str, str] = {}
    batches = collect.shard(ids, batch)
    last_start = [0.0] * len(batches)
    # One untimed pass first, as a worker that has been running a while: what a process keeps
    # between batches (connections, the event loop, the inventory copy) is warm when the clock starts.
    warm_gpu = warm_vgpu = 0
    if warm:
        for index, shard in enumerate(batches):
            last_start[index] = time.monotonic()
            result = collect.poll_batch(shard)
            warm_gpu += result.gpu_samples
            warm_vgpu += result.vgpu_samples
    from django.db import connection

    backend = backend_pid(connection)
    cpu_started, backend_started = own_cpu_s(), process_cpu_s(backend)
    started = time.monotonic()
    if profile:
        profiler.enable()
    while time.monotonic() - started < seconds:
        for index, shard in enumerate(batches):
            if time.monotonic() - started >= seconds:
                break
            wait = last_start[index] + SPACING_S - time.monotonic()
            if wait > 0:  # stamps are whole seconds: never poll an agent twice in one
                bound += 1
                time.sleep(wait)
            last_start[index] = time.monotonic()
            result = collect.poll_batch(shard)
            polls += result.polled
            ok += result.ok
            gpu_rows += result.gpu_samples
            vgpu_rows += result.vgpu_samples
            errors.update(result.errors)
        passes += 1
    cpu = {"collector": own_cpu_s() - cpu_started, "postgresql": process_cpu_s(backend) - backend_started}
    if profile:
        profiler.disable()
        profiler.dump_stats(profile)
    queue.put({"cpu": cpu, "polls": polls, "ok": ok, "gpu_rows": gpu_rows, "vgpu_rows": vgpu_rows, "passes": passes,
               "bound": bound, "elapsed": time.monotonic() - started, "errors": dict(list(errors.items())[:3]),
               "warm_rows": (warm_gpu, warm_vgpu)})


def run_real(spec: list[dict], seconds: float, procs: int, batch: int, profile: str = "", warm: bool = True) -> dict:
    from django.db import connection

    clear_samples()
    shared = SharedCpu(connection)
    # A forked child must not inherit (and later close) this process's database session.
    connection.close()
    ids = [agent["id"] for agent in spec]
    queue = multiprocessing.Queue()
    shares = [ids[i::procs] for i in range(procs)]
    workers = [multiprocessing.Process(target=real_worker, args=(share, seconds, batch, queue, profile, warm))
               for share in shares]
    for worker in workers:
        worker.start()
    shared.start()  # the collectors' clocks start after their warm-up pass: this window is wider
    results = [queue.get() for _ in workers]
    shared_cpu = shared.stop()
    for worker in workers:
        worker.join()
    total = {key: sum(r[key] for r in results) for key in ("polls", "ok", "gpu_rows", "vgpu_rows", "bound")}
    total["cpu"] = {part: sum(r["cpu"][part] for r in results) for part in ("collector", "postgresql")}
    total["cpu"].update(shared_cpu)
    total["elapsed"] = max(r["elapsed"] for r in results)
    total["errors"] = {k: v for r in results for k, v in r["errors"].items()}
    # The warm-up pass's rows are in the tables too: the timed polls' rows are the rest.
    warm_rows = [sum(r["warm_rows"][i] for r in results) for i in (0, 1)]
    total["stored"] = tuple(stored - warmed for stored, warmed in zip(stored_rows(), warm_rows, strict=True))
    return total


# -- ceiling --------------------------------------------------------------------------------------


def run_ceiling(spec: list[dict], seconds: float) -> dict:
    """Sequential keep-alive scrape + json.loads + COPY of the same rows into the same tables."""
    import http.client
    from datetime import UTC, datetime

    from django.db import connection, transaction

    from fleet.models import Gpu, Vgpu

    clear_samples()
    gpu_ids = dict(Gpu.objects.filter(host__name__startswith="bench-").values_list("uuid", "id"))
    vgpu_of = {str(vm_uuid): (vm_id, vgpu_id) for vm_uuid, vm_id, vgpu_id in
               Vgpu.objects.filter(gpu__host__name__startswith="bench-").values_list("vm__uuid", "vm_id", "id")}
    conns = {agent["id"]: http.client.HTTPConnection("127.0.0.1", agent["port"], timeout=5) for agent in spec}
    headers = {agent["id"]: {"Authorization": f"Bearer {agent['token']}"} for agent in spec}
    polls = ok = expected_gpu = expected_vgpu = bound = 0
    shared, backend = SharedCpu(connection), backend_pid(connection)
    cpu_started, backend_started = own_cpu_s(), process_cpu_s(backend)
    shared.start()
    started = time.monotonic()
    with connection.cursor() as cursor:
        raw = cursor.connection
        last_start = {agent["id"]: 0.0 for agent in spec}
        while time.monotonic() - started < seconds:
            gpu_rows, vgpu_rows = [], []
            for agent in spec:
                if time.monotonic() - started >= seconds:
                    break
                wait = last_start[agent["id"]] + SPACING_S - time.monotonic()
                if wait > 0:
                    bound += 1
                    time.sleep(wait)
                last_start[agent["id"]] = time.monotonic()
                conn = conns[agent["id"]]
                conn.request("GET", "/v1/metrics", headers=headers[agent["id"]])
                response = conn.getresponse()
                body = response.read()
                polls += 1
                if response.status != 200:
                    continue
                document = json.loads(body)
                ts = datetime.fromtimestamp(int(document["collected_at"]), tz=UTC)
                for gpu in document["gpus"]:
                    gpu_id = gpu_ids[gpu["uuid"]]
                    gpu_rows.append((gpu_id, ts, gpu["util_gpu"], gpu["util_mem"], gpu["fb_used_mib"],
                                     gpu["fb_total_mib"], gpu["enc_util"], gpu["dec_util"], gpu["temp_c"],
                                     gpu["power_w"], gpu["sm_clock_mhz"]))
                    for vgpu in gpu["vgpus"]:
                        vm_id, vgpu_id = vgpu_of[vgpu["vm_uuid"]]
                        vgpu_rows.append((vm_id, gpu_id, vgpu_id, ts, vgpu["fb_used_mib"], vgpu["util_gpu"],
                                          vgpu["util_mem"], vgpu["enc_util"], vgpu["dec_util"]))
                ok += 1
                if len(gpu_rows) >= 400:  # COPY every 50 polls, as a batch stores 50
                    expected_gpu += len(gpu_rows)
                    expected_vgpu += len(vgpu_rows)
                    _copy(raw, transaction, gpu_rows, vgpu_rows)
                    gpu_rows, vgpu_rows = [], []
            expected_gpu += len(gpu_rows)
            expected_vgpu += len(vgpu_rows)
            _copy(raw, transaction, gpu_rows, vgpu_rows)
    cpu = {"collector": own_cpu_s() - cpu_started, "postgresql": process_cpu_s(backend) - backend_started,
           **shared.stop()}
    for conn in conns.values():
        conn.close()
    return {"cpu": cpu, "polls": polls, "ok": ok, "gpu_rows": expected_gpu, "vgpu_rows": expected_vgpu, "bound": bound,
            "elapsed": time.monotonic() - started, "errors": {}, "stored": stored_rows()}


class SharedCpu:
    """CPU seconds, between `start()` and `stop()`, of the parts a phase shares with the collectors:
    the agents' server process and PostgreSQL's background processes (the WAL writer flushing the
    samples' WAL, the checkpointer, the background writer)."""

    agents_pid = 0  # set by main() once the agents' server runs

    def __init__(self, connection):
        self.pids = {"agents": [self.agents_pid], "postgresql background": postgres_background_pids(connection)}

    def _now(self) -> dict[str, float]:
        return {part: sum(map(process_cpu_s, pids)) for part, pids in self.pids.items()}

    def start(self) -> None:
        self.started = self._now()

    def stop(self) -> dict[str, float]:
        return {part: seconds - self.started[part] for part, seconds in self._now().items()}


def _copy(raw, transaction, gpu_rows, vgpu_rows) -> None:
    if not gpu_rows:
        return
    with transaction.atomic(), raw.cursor() as cur:
        with cur.copy("COPY telemetry_gpusample (gpu_id, ts, util_gpu, util_mem, fb_used_mib, fb_total_mib, "
                      "enc_util, dec_util, temp_c, power_w, sm_clock_mhz) FROM STDIN") as copy:
            for row in gpu_rows:
                copy.write_row(row)
        with cur.copy("COPY telemetry_vgpusample (vm_id, gpu_id, vgpu_id, ts, fb_used_mib, util_gpu, util_mem, "
                      "enc_util, dec_util) FROM STDIN") as copy:
            for row in vgpu_rows:
                copy.write_row(row)


# -- report ---------------------------------------------------------------------------------------


def report(name: str, result: dict) -> float:
    elapsed = result["elapsed"]
    rows = result["gpu_rows"] + result["vgpu_rows"]
    stored = sum(result["stored"])
    expected = result["ok"] * GPUS_PER_HOST * (1 + VGPUS_PER_GPU)
    polls_s = result["ok"] / elapsed
    loss = "OK" if stored == expected == rows else "MISMATCH"
    print(f"{name:<22} {polls_s:8.1f} agent polls/s  {stored / elapsed:9.0f} samples/s  "
          f"polls {result['ok']}/{result['polls']}  rows stored {stored} expected {expected}  zero loss: {loss}"
          + (f"  (waited for the 1 s spacing {result['bound']} times: add agents)" if result["bound"] else ""))
    if result["errors"]:
        print(f"{'':<22} errors: {result['errors']}")
    if result["ok"]:
        parts = "  ".join(f"{part} {seconds * 1000 / result['ok']:.2f}" for part, seconds in result["cpu"].items())
        total = sum(result["cpu"].values()) * 1000 / result["ok"]
        print(f"{'':<22} CPU ms a poll: {parts}; all {total:.2f}")
    return polls_s


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--agents", type=int, default=3000, help="simulated agents (default 3000)")
    parser.add_argument("--seconds", type=float, default=30.0, help="seconds per phase (default 30)")
    parser.add_argument("--procs", type=int, default=2, help="collector processes of the second real phase")
    parser.add_argument("--batch", type=int, default=50, help="agents per poll_batch (TELEMETRY_BATCH_SIZE)")
    parser.add_argument("--base-port", type=int, default=20000)
    parser.add_argument("--health", action="store_true",
                        help="agents report the health fields of issue 19 (driver, GPU health, vGPU licence)")
    parser.add_argument("--cold", action="store_true",
                        help="start the real phases' clocks at once, without the untimed warm-up pass of each "
                             "collector process over its agents")
    parser.add_argument("--profile", metavar="FILE", default="",
                        help="run the 1-process phase under cProfile, write its stats to FILE and print the top "
                             "entries (the phase's figure is then not comparable)")
    args = parser.parse_args()
    _raise_fd_limit()

    spec = setup(args.agents, args.base_port, args.health)
    if args.health:
        warm_health(spec, args.batch)
    server = start_agents(spec, "bench-agents.json")
    if server is None:
        return 1
    SharedCpu.agents_pid = server.pid
    print(f"{platform.node()}: {os.cpu_count()} cores, Python {platform.python_version()}, "
          f"{args.agents} agents x {GPUS_PER_HOST} GPUs x {VGPUS_PER_GPU} vGPUs "
          f"({GPUS_PER_HOST * (1 + VGPUS_PER_GPU)} rows a poll), {args.seconds:g} s a phase, batches of {args.batch}")
    try:
        real_1 = report("real path, 1 process", run_real(spec, args.seconds, 1, args.batch, args.profile,
                                                           not args.cold))
        if args.profile:
            import pstats

            stats = pstats.Stats(args.profile)
            stats.sort_stats("tottime").print_stats(25)
            stats.sort_stats("cumulative").print_stats(40)
        real_n = report(f"real path, {args.procs} processes", run_real(spec, args.seconds, args.procs, args.batch,
                                                                       warm=not args.cold))
        ceiling = report("ceiling (seq+COPY)", run_ceiling(spec, args.seconds))
    finally:
        server.kill()
    print(f"ratio {real_1 / ceiling:.2f} (1 process)  ratio {real_n / ceiling:.2f} ({args.procs} processes)")
    return 0


if __name__ == "__main__":
    sys.exit(main())

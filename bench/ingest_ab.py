"""Collection side by side: two checkouts' collectors polling AT THE SAME TIME, with their CPU per poll.

    git worktree add /tmp/before <commit>        # or: mkdir /tmp/before && git archive <commit> | tar -x -C /tmp/before
    DATABASE_URL=postgres://postgres@127.0.0.1:5432/fleet_bench REDIS_URL=redis://127.0.0.1:6379/0 \\
        python bench/ingest_ab.py --trees /tmp/before . [--agents 2500] [--seconds 20] [--rounds 2] [--procs 1]

Why: on a machine shared with other jobs, `bench/ingest.py`'s phases run one after the other and
each sees whatever load the others' jobs made meanwhile (its ceiling alone moved 2x between runs
of one afternoon). Here both checkouts' collectors run in the same seconds on disjoint halves of
the bench's agents, so they share the machine's load; the halves swap every round. Besides
agent polls/s, each collector process reports the CPU it used (all its threads) and the CPU of
its PostgreSQL session (Linux: /proc/PID/stat of the server process), per poll: figures that
move far less with the load than throughput does.

Each collector process runs `telemetry.collect.poll_batch` of ITS checkout (a worker started
with that checkout first on sys.path), after one untimed pass over its agents, as
bench/ingest.py's real path does; each agent at most once a second. The agents, the inventory
and the health fields are bench/ingest.py's (`--health` there; `--no-health` leaves them out),
created once in the database.
Zero loss is checked per round: rows stored == rows the collectors reported (40 per good poll).
Needs a PostgreSQL database of its own and a shared cache (REDIS_URL), as the workers would.
Prints figures; asserts nothing.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import platform
import resource
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT / "bench") not in sys.path:
    sys.path.append(str(ROOT / "bench"))

from proc_cpu import backend_pid, own_cpu_s, process_cpu_s  # noqa: E402 (bench/)
from production import use_production_settings  # noqa: E402 (bench/)


def worker(tree: str, ids_file: str, seconds: float, batch: int, out: str, go_file: str) -> None:
    """One collector process of `tree`: warm pass, wait for the shared start, poll, write figures."""
    sys.path.insert(0, tree)
    os.chdir(tree)
    use_production_settings()  # DEBUG off, as the workers run (bench/production.py)
    import django

    django.setup()
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    from django.db import connection

    from telemetry import collect

    assert collect.__file__.startswith(str(Path(tree).resolve())), f"{collect.__file__} is not {tree}'s"
    batches = collect.shard(json.loads(Path(ids_file).read_text()), batch)
    last = [0.0] * len(batches)
    warm = 0
    for index, shard in enumerate(batches):
        last[index] = time.monotonic()
        result = collect.poll_batch(shard)
        warm += result.gpu_samples + result.vgpu_samples
    backend = backend_pid(connection)

    Path(out + ".ready").write_text("1")
    while not Path(go_file).exists():
        time.sleep(0.01)
    start_at = float(Path(go_file).read_text())
    while time.time() < start_at:
        time.sleep(0.001)
    cpu, server, started = own_cpu_s(), process_cpu_s(backend), time.monotonic()
    ok = rows = 0
    errors: dict[str, str] = {}
    while time.monotonic() - started < seconds:
        for index, shard in enumerate(batches):
            if time.monotonic() - started >= seconds:
                break
            wait = last[index] + 1.05 - time.monotonic()  # samples are whole seconds (bench/ingest.py)
            if wait > 0:
                time.sleep(wait)
            last[index] = time.monotonic()
            result = collect.poll_batch(shard)
            ok += result.ok
            rows += result.gpu_samples + result.vgpu_samples
            errors.update(result.errors)
    elapsed = time.monotonic() - started
    Path(out).write_text(json.dumps({
        "ok": ok, "rows": rows, "warm": warm, "elapsed": elapsed, "server_cpu": process_cpu_s(backend) - server,
        "cpu": own_cpu_s() - cpu,
        "errors": dict(list(errors.items())[:3]),
    }))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--trees", nargs=2, required=True, metavar=("A", "B"), help="the two checkouts")
    parser.add_argument("--names", nargs=2, default=None, metavar=("A", "B"))
    parser.add_argument("--agents", type=int, default=2500)
    parser.add_argument("--seconds", type=float, default=20.0, help="seconds a round")
    parser.add_argument("--rounds", type=int, default=2, help="rounds; the halves of the agents swap each round")
    parser.add_argument("--procs", type=int, default=1, help="collector processes a checkout")
    parser.add_argument("--batch", type=int, default=50, help="agents per poll_batch (TELEMETRY_BATCH_SIZE)")
    parser.add_argument("--base-port", type=int, default=61000, help="first agent port (one port an agent)")
    parser.add_argument("--no-health", action="store_true",
                        help="agents without the health fields of issue 19 (as agents older than them)")
    args = parser.parse_args()
    trees = [str(Path(tree).resolve()) for tree in args.trees]
    names = args.names or ["A", "B"]

    sys.path.insert(0, str(ROOT))
    use_production_settings()  # DEBUG off, as the workers run (bench/production.py)
    from bench import ingest as bench

    bench._raise_fd_limit()
    spec = bench.setup(args.agents, args.base_port, health=not args.no_health)
    if not args.no_health:
        bench.warm_health(spec, args.batch)
    work = ROOT / "var" / "bench-ab"
    work.mkdir(parents=True, exist_ok=True)
    spec_path = work / "agents.json"
    spec_path.write_text(json.dumps(spec))
    from django.db import connection

    connection.close()
    ready = multiprocessing.Event()
    server = multiprocessing.Process(target=bench.serve_agents, args=(str(spec_path), ready), daemon=True)
    server.start()
    if not ready.wait(60):
        print("agents did not start", file=sys.stderr)
        return 1
    ids = [agent["id"] for agent in spec]
    halves = [ids[0::2], ids[1::2]]
    totals = {name: {"ok": 0, "cpu": 0.0, "server_cpu": 0.0, "rates": []} for name in names}
    print(f"{platform.node()}: {os.cpu_count()} cores, Python {platform.python_version()}, {args.agents} agents "
          f"({'without' if args.no_health else 'with'} health fields), {args.procs} collector process(es) a "
          f"checkout, {args.seconds:g} s a round, batches of {args.batch}")
    try:
        for round_ in range(args.rounds):
            bench.clear_samples()
            connection.close()
            for stale in work.glob("w*"):
                stale.unlink()
            go = work / "w-go"
            running = []
            for side, (name, tree) in enumerate(zip(names, trees, strict=True)):
                half = halves[(side + round_) % 2]
                for k in range(args.procs):
                    ids_file, out = work / f"w-{side}-{k}.ids", work / f"w-{side}-{k}.json"
                    ids_file.write_text(json.dumps(half[k::args.procs]))
                    log = open(str(out) + ".log", "w")  # noqa: SIM115 - open while the worker runs
                    command = [sys.executable, __file__, "--worker", tree, str(ids_file), str(args.seconds),
                               str(args.batch), str(out), str(go)]
                    running.append((name, out, subprocess.Popen(command, stdout=log, stderr=log)))
            while not all(Path(str(out) + ".ready").exists() for _, out, _ in running):
                dead = [out for _, out, process in running if process.poll() is not None]
                if dead:
                    print(Path(str(dead[0]) + ".log").read_text()[-2000:], file=sys.stderr)
                    return 1
                time.sleep(0.2)
            load = " ".join(f"{value:.2f}" for value in os.getloadavg())
            go.write_text(str(time.time() + 0.5))
            for _, _, process in running:
                process.wait()
            results = {name: [json.loads(out.read_text()) for n, out, _ in running if n == name] for name in names}
            stored = sum(bench.stored_rows())
            connection.close()
            reported = sum(r["rows"] + r["warm"] for rs in results.values() for r in rs)
            parts = []
            for name in names:
                rs = results[name]
                ok, elapsed = sum(r["ok"] for r in rs), max(r["elapsed"] for r in rs)
                cpu, server_cpu = sum(r["cpu"] for r in rs), sum(r["server_cpu"] for r in rs)
                whole = sum(r["rows"] for r in rs) == ok * bench.GPUS_PER_HOST * (1 + bench.VGPUS_PER_GPU)
                total = totals[name]
                total["ok"] += ok
                total["cpu"] += cpu
                total["server_cpu"] += server_cpu
                total["rates"].append(ok / elapsed)
                errors = {k: v for r in rs for k, v in r["errors"].items()}
                parts.append(f"{name}: {ok / elapsed:6.1f} polls/s, collector {1000 * cpu / max(ok, 1):.2f} ms "
                             f"CPU/poll, PostgreSQL {1000 * server_cpu / max(ok, 1):.2f} ms CPU/poll"
                             + ("" if whole else " ROWS MISSING") + (f" errors {errors}" if errors else ""))
            verdict = "zero loss" if stored == reported else "MISMATCH"
            print(f"round {round_ + 1} (load {load}): " + " | ".join(parts)
                  + f" | rows stored {stored}, reported {reported}: {verdict}")
    finally:
        server.kill()
    for name in names:
        total = totals[name]
        print(f"{name}: {sum(total['rates']) / len(total['rates']):.1f} polls/s (mean of rounds), collector "
              f"{1000 * total['cpu'] / total['ok']:.2f} ms CPU/poll, "
              f"PostgreSQL {1000 * total['server_cpu'] / total['ok']:.2f} ms CPU/poll")
    a, b = (totals[name] for name in names)
    rate = (sum(b["rates"]) / len(b["rates"])) / (sum(a["rates"]) / len(a["rates"]))
    cpu = (b["cpu"] / b["ok"]) / (a["cpu"] / a["ok"])
    both = ((b["cpu"] + b["server_cpu"]) / b["ok"]) / ((a["cpu"] + a["server_cpu"]) / a["ok"])
    print(f"{names[1]} / {names[0]}: polls/s x{rate:.2f}, collector CPU/poll x{cpu:.2f}, "
          f"collector + PostgreSQL CPU/poll x{both:.2f}")
    return 0


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--worker":
        tree_, ids_, seconds_, batch_, out_, go_ = sys.argv[2:8]
        worker(tree_, ids_, float(seconds_), int(batch_), out_, go_)
        sys.exit(0)
    sys.exit(main())

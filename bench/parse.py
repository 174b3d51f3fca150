"""Benchmark of reading one agent report: `parse_agent_payload` on what the sim agent serves.

    .venv/bin/python bench/parse.py [--before main] [--gpus 8] [--vgpus 4] [--rounds 15]

The body is the sim agent's own answer to GET /v1/metrics (`AgentServer.metrics_body`), for a
host of `--gpus` L40S with `--vgpus` L40S-8Q vGPUs each, health fields included (8 x 4: ~24 KB,
the collector's typical report): the body of the parser's equivalence tests
(`telemetry.tests.test_payload_typed.sim_body`). It times, in one process and alternated round by round so
that a busy machine weighs on all alike:
- before: `telemetry/payload.py` as it is at git revision `--before`, loaded from `git show`;
- now: the working tree's `parse_agent_payload`;
- field by field: the working tree's checks of a report the one pass does not accept (what an
  unusual report costs).
Prints CPU µs a report (time.process_time), the median of the rounds and their range, and checks
that the readings are equal. Asserts nothing else; needs no database.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def module_at(revision: str):
    """telemetry/payload.py as it is at `revision`, imported as a module of its own."""
    source = subprocess.run(["git", "show", f"{revision}:telemetry/payload.py"], cwd=ROOT, check=True,
                            capture_output=True).stdout
    fd, path = tempfile.mkstemp(suffix=".py", prefix="payload_before_")
    with os.fdopen(fd, "wb") as out:
        out.write(source)
    spec = importlib.util.spec_from_file_location("payload_before", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up
    spec.loader.exec_module(module)
    os.unlink(path)
    return module


def per_report_us(parse, body: bytes, n: int) -> float:
    started = time.process_time()
    for _ in range(n):
        parse(body)
    return (time.process_time() - started) / n * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--before", default="main", help="git revision to compare with (default main)")
    parser.add_argument("--gpus", type=int, default=8)
    parser.add_argument("--vgpus", type=int, default=4, help="vGPUs per GPU")
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--n", type=int, default=400, help="reports a round and reading")
    args = parser.parse_args()

    from telemetry import payload
    from telemetry.tests.test_payload_typed import sim_body

    before = module_at(args.before)
    body = sim_body(args.gpus, args.vgpus)
    assert repr(before.parse_agent_payload(body)) == repr(payload.parse_agent_payload(body)), "readings differ"
    readings = {
        f"before ({args.before})": before.parse_agent_payload,
        "now": payload.parse_agent_payload,
        "now, field by field": payload._checked_payload,
    }
    for parse in readings.values():  # warm
        per_report_us(parse, body, args.n // 4)
    times: dict[str, list[float]] = {name: [] for name in readings}
    for _ in range(args.rounds):
        for name, parse in readings.items():
            times[name].append(per_report_us(parse, body, args.n))
    print(f"body: {len(body):,} bytes, {args.gpus} GPUs, {args.gpus * args.vgpus} vGPUs; {args.rounds} rounds of "
          f"{args.n} reports each, alternated; CPU µs a report (process_time), median [min-max]")
    base = statistics.median(times[f"before ({args.before})"])
    for name, values in times.items():
        median = statistics.median(values)
        print(f"  {name:22} {median:7.1f}  [{min(values):.1f}-{max(values):.1f}]  x{base / median:.2f}")


if __name__ == "__main__":
    main()

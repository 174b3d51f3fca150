"""Benchmark of the collector's deadlines: how long a poll batch lasts when some agents misbehave.

    python bench/deadlines.py [--agents 50] [--slow 5] [--timeout 0.5] [--rounds 5]

What it measures, on loopback, through `telemetry.collect.fetch_all` (the concurrent fetch of a
batch on one event loop: aiohttp's keep-alive connections, a total deadline per agent):
- a batch of `--agents` agents answering at once, `--slow` of which hold their answer far past
  their `--timeout`: the batch's wall time, against the timeout (what concurrent polling should
  cost) and against the sum of the slow agents' timeouts (what polling one after the other
  would cost);
- one agent trickling its body a byte every 0.1 s (each byte would reset a socket timeout):
  the time until the collector gives up, against its timeout.

The agents are the fakes of the collector's tests (`telemetry.tests.loopback.FakeAgent`); the
tests assert the behaviour (the others are asked before the collector gives up on a slow one;
the trickle is cut off with a timeout error), this script the figures. No database is used:
the agents are unsaved rows. Prints figures; asserts nothing.
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import sys
import time
from contextlib import ExitStack
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")
os.environ.setdefault("DEBUG", "true")  # development settings, as `make run`: DEBUG is off unless set

import django  # noqa: E402

django.setup()

from telemetry import collect  # noqa: E402
from telemetry.fetch import ConnectionPool  # noqa: E402
from telemetry.models import Agent  # noqa: E402
from telemetry.tests.loopback import FakeAgent  # noqa: E402


def agent(pk: int, url: str, timeout_s: float) -> Agent:
    return Agent(pk=pk, name=f"bench-{pk}", url=url, timeout_s=timeout_s)


def batch_seconds(agents: int, slow: int, timeout_s: float) -> tuple[float, int]:
    """(wall time of one batch, how many polls failed) with `slow` of `agents` holding their answer."""
    with ExitStack() as stack:
        servers = [stack.enter_context(FakeAgent("slow", payload={}, delay_s=timeout_s * 20)) for _ in range(slow)]
        servers += [stack.enter_context(FakeAgent("http500")) for _ in range(agents - slow)]
        batch = [agent(pk, server.url, timeout_s) for pk, server in enumerate(servers, start=1)]
        started = time.perf_counter()
        outcomes = collect.fetch_all(batch, pool=ConnectionPool(), concurrency=agents)
        elapsed = time.perf_counter() - started
    return elapsed, sum(outcome.error is not None for outcome in outcomes)


def trickle_seconds(timeout_s: float) -> tuple[float, str]:
    with FakeAgent("trickle") as trickle:
        started = time.perf_counter()
        [outcome] = collect.fetch_all([agent(1, trickle.url, timeout_s)], pool=ConnectionPool())
        elapsed = time.perf_counter() - started
    return elapsed, outcome.error or ""


def summary(values: list[float]) -> str:
    return f"min {min(values):.3f} s, median {statistics.median(values):.3f} s, max {max(values):.3f} s"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--agents", type=int, default=50, help="agents in the batch (default 50)")
    parser.add_argument("--slow", type=int, default=5, help="of which hold their answer (default 5)")
    parser.add_argument("--timeout", type=float, default=0.5, help="each agent's timeout_s (default 0.5)")
    parser.add_argument("--rounds", type=int, default=5, help="batches measured (default 5)")
    args = parser.parse_args()
    if not 0 < args.slow <= args.agents:
        parser.error("--slow must be between 1 and --agents")

    print(f"python {platform.python_version()} on {platform.machine()}, {os.cpu_count()} CPUs")
    batches = [batch_seconds(args.agents, args.slow, args.timeout) for _ in range(args.rounds)]
    times = [elapsed for elapsed, _ in batches]
    print(f"batch of {args.agents} agents, {args.slow} holding their answer past timeout_s={args.timeout}:")
    print(f"  wall time: {summary(times)} over {args.rounds} batches; polls failed per batch: "
          f"{sorted({failed for _, failed in batches})} (all: the quick agents answer HTTP 500)")
    print(f"  = {statistics.median(times) / args.timeout:.2f} x the timeout "
          f"(one after the other: at least {args.slow * args.timeout:.1f} s, {args.slow:.0f} x)")
    trickles = [trickle_seconds(args.timeout) for _ in range(args.rounds)]
    print(f"an agent trickling a byte every 0.1 s, timeout_s={args.timeout}:")
    print(f"  cut off after: {summary([elapsed for elapsed, _ in trickles])} "
          f"(= {statistics.median([e for e, _ in trickles]) / args.timeout:.2f} x the timeout)")
    print(f"  error: {trickles[-1][1]}")


if __name__ == "__main__":
    main()

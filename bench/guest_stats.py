"""Benchmark of guest CPU and memory collection at fleet scale: what storing one minute's
readings of every VM costs the database, per host as `read_guest_stats` does it.

    DATABASE_URL=postgres://postgres@127.0.0.1:5432/<db> python bench/guest_stats.py [--hosts 1000] [--vms 4]

Builds a throw-away test database (`test_<db>`, as the test suite does) and removes it after.

Seeds `--hosts` hosts of `--vms` VMs each (8 vCPUs, 32 GiB), then stores `--rounds` rounds of
readings a minute apart, each host's counters as its backend would return them, through
`hypervisors.guest_stats.store` (the VMs looked up by UUID, the last counters read, the shares
worked out by `guest_rates`, samples inserted and counters kept in one transaction). The first
round (no counters kept yet, so no CPU figure) is a warm-up and not counted.

Side by side in the same run, on the same rows:
- **per host**: `store(host, counters)` once per host, as a chunk of `read_guest_stats_hosts` does;
- **per chunk**: `store_chunk([(host, counters), ...])` once per chunk of HOSTS_PER_TASK hosts.
Prints, for each, the time per host, the samples written a second, and the worker time one
minute of a 10,000-host fleet would cost. Asserts only that every VM got its samples.
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import sys
import time
import uuid as uuidlib
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")
os.environ.setdefault("DEBUG", "true")  # development settings, as `make run`

import django  # noqa: E402

django.setup()

from django.conf import settings  # noqa: E402
from django.db import connection  # noqa: E402
from django.test.utils import setup_databases, setup_test_environment, teardown_databases  # noqa: E402

NS = 1_000_000_000
FLEET_HOSTS = 10_000


def seed(hosts: int, vms: int) -> list:
    """`hosts` hosts with `vms` VMs each; returns the hosts with their VMs' UUIDs (`host.uuids`)."""
    from fleet.models import Host, VirtualMachine

    made = Host.objects.bulk_create(Host(name=f"bench-guest-{i:05d}", cpu_threads=64, ram_gib=512)
                                    for i in range(hosts))
    rows = [VirtualMachine(name=f"{host.name}-vm{j}", uuid=uuidlib.uuid4(), host=host, vcpus=8, ram_gib=32)
            for host in made for j in range(vms)]
    VirtualMachine.objects.bulk_create(rows, batch_size=2000)
    for host in made:
        host.uuids = []
    by_id = {host.pk: host for host in made}
    for row in rows:
        by_id[row.host_id].uuids.append(str(row.uuid))
    return made


def counters_for(host, minute: int) -> list:
    """What a host's backend returns at `minute`: each VM's cumulative vCPU and steal times and memory."""
    from hypervisors.backends.base import GuestCounters

    now_ns = (1_790_000_000 + 60 * minute) * NS
    found = []
    for index, uuid in enumerate(host.uuids):
        busy = [(minute * 60 * NS * (10 + 10 * ((index + v) % 9))) // 100 for v in range(8)]
        found.append(GuestCounters(uuid=uuid, read_at_ns=now_ns, vcpus=8, ram_mib=32768, vcpu_ns=tuple(busy),
                                   steal_ns=sum(busy) // 100, ram_used_mib=8192 + 64 * index,
                                   ram_available_mib=32112))
    return found


def per_host(hosts, minute: int, chunk: int) -> None:
    from hypervisors import guest_stats

    for host in hosts:
        guest_stats.store(host, counters_for(host, minute))


def per_chunk(hosts, minute: int, chunk: int) -> None:
    from hypervisors import guest_stats

    for first in range(0, len(hosts), chunk):
        guest_stats.store_chunk([(host, counters_for(host, minute)) for host in hosts[first:first + chunk]])


def counters_only(hosts, minute: int, chunk: int) -> None:
    for host in hosts:
        counters_for(host, minute)


def timed_rounds(way, hosts, rounds: int, first_minute: int, chunk: int) -> list[float]:
    """Seconds per round of `way` over every host; the first round is a warm-up."""
    seconds = []
    for r in range(rounds + 1):
        started = time.perf_counter()
        way(hosts, first_minute + r, chunk)
        if r:
            seconds.append(time.perf_counter() - started)
    return seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--hosts", type=int, default=1000)
    parser.add_argument("--vms", type=int, default=4, help="VMs per host")
    parser.add_argument("--rounds", type=int, default=3, help="counted rounds per way (after one warm-up)")
    args = parser.parse_args()

    from hypervisors.tasks import GUEST_HOSTS_PER_TASK as HOSTS_PER_TASK
    from telemetry.models import GuestSample

    setup_test_environment()
    old_config = setup_databases(verbosity=0, interactive=False)
    try:
        hosts = seed(args.hosts, args.vms)
        vms = args.hosts * args.vms
        version = connection.pg_version if connection.vendor == "postgresql" else ""
        print(f"# {platform.node()} ({os.cpu_count()} cores), {connection.vendor} {version}, "
              f"Python {platform.python_version()}")
        print(f"# {args.hosts} hosts x {args.vms} VMs = {vms} VMs; {args.rounds} counted rounds a way; "
              f"chunks of {HOSTS_PER_TASK} hosts; DEBUG={settings.DEBUG}")
        baseline = statistics.median(timed_rounds(counters_only, hosts, args.rounds, 0, HOSTS_PER_TASK))
        print(f"{'making the counters (not stored)':34} {1000 * baseline / args.hosts:7.3f} ms a host")
        results = {}
        minute = 100
        for name, way in (("per host", per_host), ("per chunk", per_chunk)):
            before = GuestSample.objects.count()
            seconds = timed_rounds(way, hosts, args.rounds, minute, HOSTS_PER_TASK)
            written = GuestSample.objects.count() - before
            assert written == vms * (args.rounds + 1), (name, written)
            minute += args.rounds + 2  # a gap: the next way's first round starts afresh
            median = statistics.median(seconds) - baseline
            results[name] = median
            print(f"{name:34} {1000 * median / args.hosts:7.3f} ms a host   {vms / median:9,.0f} samples/s   "
                  f"{median / args.hosts * FLEET_HOSTS:6.1f} worker-s per minute of {FLEET_HOSTS:,} hosts "
                  f"(rounds: {', '.join(f'{s:.2f}' for s in seconds)} s)")
        print(f"per host / per chunk: {results['per host'] / results['per chunk']:.2f}x")
    finally:
        teardown_databases(old_config, verbosity=0)


if __name__ == "__main__":
    main()

"""Benchmark of the hypervisors app: what one resize operation costs beyond the guest's own
shutdown, and what a sync of a host with 1,000 domains costs.

    DATABASE_URL=postgres://postgres@127.0.0.1:5432/<db> python bench/hypervisor_ops.py [--runs 30] [--domains 1000]

Builds a throw-away test database (`test_<db>`, as the test suite does) and removes it after.

1. **One resize operation** (the approval's inventory change and the creation of the
   operation, then the run: notify, shut down, remove the old vGPU, create the new one,
   redefine, start, verify), the VM going 24Q -> 12Q -> 24Q ... so every run does the same
   work. The guest's shutdown takes no time on either hypervisor, so what is measured is the
   product's own overhead (database writes, audit events, the calls to the hypervisor):
   - **sim**: the simulated hypervisor (one JSON state file), guests that power off at once
     (`shutdown_s` = 0);
   - **libvirt**: a private libvirtd serving libvirt's test driver, the vGPU devices created
     and removed by the real host agent's device action (its HTTP server on loopback) over a
     fake sysfs in the mdev layout with the emulated kernel, as
     hypervisors/tests/test_end_to_end_libvirt.py runs it (Tesla T4, T4-8Q <-> T4-4Q).
   Per step: the median of the step's own time (its started/finished stamps).
2. **Sync of 1,000 domains**: a private libvirtd's test driver with 1,000 domains defined, a
   host linked to it; `read_domains` (listing), `host_inventory` + `discovery.diff_host`
   (diffing), `sync_host` (both and the stored report), `apply_report("all")` (1,000 new VMs
   into the inventory), then `sync_host` again (1,000 domains, all in step).

Prints figures; asserts only that each operation succeeded.
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import os
import platform
import statistics
import sys
import tempfile
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


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def summary(label: str, values_s: list[float]) -> str:
    ms = [v * 1000 for v in values_s]
    return f"{label:34} median {statistics.median(ms):8.1f} ms   p95 {percentile(ms, 0.95):8.1f} ms   (n={len(ms)})"


def resize_runs(world, runs: int, profiles: tuple[str, str], user, admin) -> None:
    """`runs` resizes of world.vm, alternating between the two profiles; prints the figures."""
    from fleet import requests as fleet_requests
    from fleet.tests.factories import profile
    from hypervisors import operations
    from hypervisors.choices import OperationStatus

    approve_s, run_s, steps_s = [], [], {}
    for index in range(runs + 1):  # the first is a warm-up, not counted
        wanted = profile(profiles[(index + 1) % 2])
        request = fleet_requests.file_request(world.vm, user, wanted, 1, "benchmark")
        started = time.perf_counter()
        fleet_requests.approve(request, admin, "bench", run_now=True)
        approved = time.perf_counter()
        operation = operations.Operation.objects.get(request=request)
        done = operations.run(operation.pk)
        finished = time.perf_counter()
        assert done.status == OperationStatus.SUCCEEDED, done.error
        if index == 0:
            continue
        approve_s.append(approved - started)
        run_s.append(finished - approved)
        for step in done.steps.all():
            steps_s.setdefault(step.get_kind_display(), []).append(
                (step.finished_at - step.started_at).total_seconds())
    print(summary("approve (inventory + operation)", approve_s))
    print(summary("run (all steps, end to end)", run_s))
    print(summary("approve + run", [a + b for a, b in zip(approve_s, run_s, strict=True)]))
    for kind, values in steps_s.items():
        print("  " + summary(f"step: {kind}", values))
    in_steps = [sum(v[i] for v in steps_s.values()) for i in range(len(run_s))]
    print("  " + summary("steps' own time, summed", in_steps))


def bench_sim(runs: int, admin) -> None:
    from types import SimpleNamespace

    from fleet import services
    from fleet.tests.factories import ArtistFactory, GpuFactory, HostFactory, VirtualMachineFactory, gpu_model, profile
    from hypervisors import sim_seed

    host = HostFactory(name="bench-sim-01", hypervisor_uri="sim://bench-sim-01")
    l40s = gpu_model("NVIDIA L40S")
    gpu = GpuFactory(host=host, gpu_model=l40s, pci_bus_id="00000000:3B:00.0")
    GpuFactory(host=host, gpu_model=l40s, pci_bus_id="00000000:5E:00.0")
    artist = ArtistFactory()
    vm = VirtualMachineFactory(name="ws-bench-sim", artist=artist, host=host, vcpus=8, ram_gib=32)
    services.place_vgpu(vm, gpu, profile("L40S-24Q"))
    sim_seed.seed_host(host).set_shutdown_s(0)
    print("\n-- one resize operation, simulated hypervisor (shutdown_s = 0), L40S-24Q <-> L40S-12Q")
    resize_runs(SimpleNamespace(vm=vm), runs, ("L40S-24Q", "L40S-12Q"), artist.user, admin)


def bench_libvirt(runs: int, admin) -> None:
    from rest_framework.test import APIClient

    from fleet.tests.factories import ArtistFactory
    from hypervisors.testing.libvirtd import Libvirtd
    from hypervisors.tests.test_end_to_end_libvirt import CASES, kvm_world

    artist = ArtistFactory()
    api = APIClient()
    api.force_authenticate(admin)
    with Libvirtd() as daemon, tempfile.TemporaryDirectory() as root, \
            kvm_world("mdev", daemon, Path(root), artist, api) as world:
        _, _, held, wanted, _ = CASES["mdev"]
        print(f"\n-- one resize operation, libvirt {daemon_version(world.uri)} test driver through a private libvirtd "
              f"+ the host agent's device action (fake sysfs, mdev layout), {held} <-> {wanted}")
        resize_runs(world, runs, (held, wanted), artist.user, admin)


def daemon_version(uri: str) -> str:
    import libvirt

    conn = libvirt.open(uri)
    try:
        version = conn.getLibVersion()
    finally:
        conn.close()
    return f"{version // 1_000_000}.{version // 1000 % 1000}.{version % 1000}"


def domain_xml(index: int) -> str:
    return (f"<domain type='test'><name>ws-sync-{index:04d}</name><uuid>{uuidlib.UUID(int=index + 1)}</uuid>"
            "<memory unit='GiB'>4</memory><vcpu>2</vcpu><os><type arch='x86_64'>hvm</type></os></domain>")


def bench_sync(domains: int, admin) -> None:
    import libvirt

    from fleet.models import VirtualMachine
    from fleet.tests.factories import HostFactory
    from hypervisors import discovery, services
    from hypervisors.testing.libvirtd import Libvirtd

    with Libvirtd() as daemon:
        shell = libvirt.open(daemon.uri())  # the test driver keeps its host while a connection is open
        try:
            started = time.perf_counter()
            for index in range(domains):
                shell.defineXML(domain_xml(index))
            defined_s = time.perf_counter() - started
            # Room for every VM (2 vCPUs, 4 GiB each), so each new one lands on the host.
            host = HostFactory(name="bench-sync-01", hypervisor_uri=daemon.uri(), cpu_threads=domains * 2 + 64,
                               ram_gib=domains * 4 + 128)
            print(f"\n-- sync of {domains:,} domains (+ the test driver's own 'test'), libvirt test driver through a "
                  f"private libvirtd (defining them took {defined_s:.1f} s)")
            timings = {}

            def timed(label: str, call):
                started = time.perf_counter()
                result = call()
                timings[label] = time.perf_counter() - started
                print(f"{label:46} {timings[label] * 1000:9.1f} ms")
                return result

            listed = timed("list domains (read_domains)", lambda: services.read_domains(host))
            timed("diff (host_inventory + diff_host)",
                  lambda: discovery.diff_host(listed, services.host_inventory(host, listed)))
            report = timed("sync_host (list + diff + store the report)",
                           lambda: services.sync_host(host, user=admin))
            outcomes = timed(f"apply all ({len(report.differences):,} new VMs)",
                             lambda: services.apply_report(report, "all", user=admin))
            again = timed("sync_host again (all in step)", lambda: services.sync_host(host, user=admin))
            print(f"   {sum(o['ok'] for o in outcomes):,} applied, "
                  f"{VirtualMachine.objects.filter(host=host).count():,} VMs on the host in the inventory, "
                  f"{len(again.differences)} differences left; "
                  f"apply: {timings[list(timings)[3]] / max(len(outcomes), 1) * 1000:.2f} ms per VM")
        finally:
            shell.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=30, help="operations per hypervisor (after one warm-up)")
    parser.add_argument("--domains", type=int, default=1000)
    parser.add_argument("--skip", choices=["sim", "libvirt", "sync"], action="append", default=[])
    args = parser.parse_args()

    logging.getLogger("telemetry.agent").setLevel(logging.WARNING)  # one line per vGPU made or removed
    setup_test_environment()
    old_config = setup_databases(verbosity=0, interactive=False)
    sim_dir = tempfile.TemporaryDirectory(prefix="bench-sim-")
    settings.HYPERVISOR_SIM_DIR = Path(sim_dir.name)
    settings.HYPERVISOR_VERIFY_WAIT_S = 0
    from hypervisors import operations

    operations.enqueue = lambda operation_id: None  # the benchmark runs each operation itself, in process
    try:
        from fleet.tests.factories import UserFactory

        admin = UserFactory(username="bench-admin", is_staff=True)
        print(f"machine: {platform.node()}, {os.cpu_count()} CPUs, Python {platform.python_version()}, "
              f"database: {connection.vendor} {connection.settings_dict['NAME']}")
        if "sim" not in args.skip:
            bench_sim(args.runs, admin)
        if "libvirt" not in args.skip:
            bench_libvirt(args.runs, admin)
        if "sync" not in args.skip:
            bench_sync(args.domains, admin)
    finally:
        with contextlib.suppress(Exception):
            sim_dir.cleanup()
        teardown_databases(old_config, verbosity=0)


if __name__ == "__main__":
    main()

"""Benchmark of one alert evaluation over a large fleet: 1,000 hosts x 8 GPUs x 4 vGPUs.

    DATABASE_URL=postgres://postgres@127.0.0.1:5432/<db> python bench/alert_evaluation.py [--hosts 1000] [--cycles 7]

Builds a throw-away test database (`test_<db>`, as the test suite does) and removes it after. The
fleet: `--hosts` hosts of 8 Quadro RTX 6000 GPUs, each GPU with 4 VMs of RTX6000-6Q; an agent
per host; 10 minutes of samples every 10 s for every GPU and vGPU (the rules' windows read the
last 5); a health state row per GPU and a licence row per vGPU; and, so the rules have something
to find, 1 GPU in 50 running hot and throttled, 1 vGPU in 100 with a full frame buffer, 1 GPU in
200 with an XID and 1 in 500 with uncorrectable ECC errors, 1 vGPU in 300 unlicensed and 1 agent
in 100 failing.

Times `alerts.evaluate.evaluate` (gather, judge, reconcile, licence series) per cycle: the first
cycle opens every alert, the others find the same and change nothing but `last_seen`. Also times
each part of the gathering alone. The budget is 2 s per cycle on this machine's 2 cores.
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import sys
import time
from datetime import timedelta
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")
os.environ.setdefault("DEBUG", "true")

import django  # noqa: E402

django.setup()

from django.db import connection  # noqa: E402
from django.test.utils import setup_databases, setup_test_environment, teardown_databases  # noqa: E402
from django.utils import timezone  # noqa: E402

BUDGET_S = 2.0
GPUS_PER_HOST = 8
VGPUS_PER_GPU = 4
WINDOW_MIN = 10
STEP_S = 10


def build(hosts: int, now) -> dict:
    from fleet.models import Gpu, GpuModel, Host, Vgpu, VgpuProfile, VirtualMachine
    from telemetry.models import Agent

    model = GpuModel.objects.get(name="Quadro RTX 6000")
    profile = VgpuProfile.objects.get(name="RTX6000-6Q")
    Host.objects.bulk_create([Host(name=f"bench-{h:04d}", cpu_threads=72, ram_gib=768) for h in range(hosts)],
                             batch_size=2000)
    host_ids = list(Host.objects.order_by("pk").values_list("pk", flat=True))
    Gpu.objects.bulk_create([Gpu(host_id=host_id, gpu_model=model, pci_bus_id=f"00000000:{g + 1:02X}:00.0",
                                 uuid=f"GPU-{host_id:08d}-{g:04d}-0000-0000-000000000000")
                             for host_id in host_ids for g in range(GPUS_PER_HOST)], batch_size=5000)
    gpus = list(Gpu.objects.order_by("pk").values_list("pk", "host_id"))
    VirtualMachine.objects.bulk_create([VirtualMachine(name=f"vws-{gpu_id:06d}-{v}", vcpus=8, ram_gib=16,
                                                       host_id=host_id)
                                        for gpu_id, host_id in gpus for v in range(VGPUS_PER_GPU)], batch_size=5000)
    vm_ids = list(VirtualMachine.objects.order_by("pk").values_list("pk", flat=True))
    Vgpu.objects.bulk_create([Vgpu(vm_id=vm_ids[i * VGPUS_PER_GPU + v], gpu_id=gpu_id, profile=profile,
                                   placement_id=v)
                              for i, (gpu_id, _) in enumerate(gpus) for v in range(VGPUS_PER_GPU)], batch_size=5000)
    Agent.objects.bulk_create([Agent(name=f"agent-{host_id}", url=f"http://bench-{host_id}:9410", host_id=host_id,
                                     token_salt=f"{host_id:032x}", token_sha256=f"{host_id:064x}",
                                     consecutive_failures=5 if host_id % 100 == 0 else 0,
                                     last_error="connection refused" if host_id % 100 == 0 else "")
                               for host_id in host_ids], batch_size=2000)
    samples(now)
    return {"hosts": len(host_ids), "gpus": len(gpus), "vgpus": len(vm_ids)}


def samples(now) -> None:
    """Samples, health state and events in SQL (generate_series): millions of rows in seconds."""
    points = WINDOW_MIN * 60 // STEP_S
    with connection.cursor() as cursor:
        cursor.execute(f"""
            INSERT INTO telemetry_gpusample (gpu_id, ts, util_gpu, util_mem, fb_used_mib, fb_total_mib, temp_c,
                                             power_w, sm_clock_mhz, clocks_event_reasons)
            SELECT g.id, %s - s * interval '{STEP_S} seconds', 40 + (g.id + s) %% 50, 20, 16000, 24576,
                   CASE WHEN g.id %% 50 = 0 THEN 88 ELSE 55 + (g.id + s) %% 20 END, 180, 1700,
                   CASE WHEN g.id %% 50 = 0 THEN 96 ELSE 0 END
            FROM fleet_gpu g CROSS JOIN generate_series(0, {points - 1}) s""", [now])
        cursor.execute(f"""
            INSERT INTO telemetry_vgpusample (vm_id, gpu_id, vgpu_id, ts, fb_used_mib, util_gpu, util_mem)
            SELECT v.vm_id, v.gpu_id, v.id, %s - s * interval '{STEP_S} seconds',
                   CASE WHEN v.id %% 100 = 0 THEN 6100 ELSE 2000 + (v.id * 37 + s) %% 3000 END,
                   (v.id + s) %% 30, 10
            FROM fleet_vgpu v CROSS JOIN generate_series(0, {points - 1}) s""", [now])
        cursor.execute("""
            INSERT INTO telemetry_gpuhealthstate (gpu_id, ecc_mode, ecc_uncorrected_volatile, ecc_corrected_volatile,
                   remapped_rows_pending, remapped_rows_failure, temp_slowdown_c, temp_shutdown_c, power_limit_w,
                   unsupported, changed_at)
            SELECT g.id, 'enabled', CASE WHEN g.id %% 500 = 0 THEN 2 ELSE 0 END, 0, false, false, 89, 95, 260,
                   '[]'::jsonb, %s FROM fleet_gpu g""", [now])
        cursor.execute("""
            INSERT INTO telemetry_vgpuhealthstate (vm_id, gpu_id, vgpu_id, type_name, license_state, license_expiry,
                   guest_driver_version, unsupported, changed_at)
            SELECT v.vm_id, v.gpu_id, v.id, 'RTX6000-6Q',
                   CASE WHEN v.id %% 300 = 0 THEN 'unlicensed' ELSE 'licensed' END, %s + interval '30 days',
                   '580.95.05', '[]'::jsonb, %s FROM fleet_vgpu v""", [now, now])
        cursor.execute("""
            INSERT INTO telemetry_xiderror (gpu_id, code, at, received_at)
            SELECT g.id, 79, %s - interval '3 minutes', %s FROM fleet_gpu g WHERE g.id %% 200 = 0""", [now, now])
        cursor.execute("ANALYZE")


def time_parts(now, rules) -> list[tuple[str, float]]:
    """Each part of the gathering alone (a fresh name cache each, so each pays for its own names)."""
    from alerts import gather as g

    temperature = rules["gpu_temperature"][1]
    parts = []
    for label, fn in (("agents", lambda n: g._agents(n, 3)),
                      ("GPU windows (5 min)", lambda n: g._gpu_windows(n, now, 5, temperature)),
                      ("vGPU windows (5 min)", lambda n: g._vgpu_windows(n, now, 5, 0.95)),
                      ("GPU states", lambda n: g._gpu_states(n)),
                      ("XIDs", lambda n: g._xids(n, now, 60)),
                      ("licences (unhealthy)", lambda n: g.vgpu_licences(n, expiring_before=now)),
                      ("licence counts", lambda n: g.licence_counts()),
                      ("host versions", lambda n: g._host_versions(n)),
                      ("schedulers (cached)", lambda n: g._schedulers(n))):
        started = time.perf_counter()
        fn(g._Names())
        parts.append((label, time.perf_counter() - started))
    return parts


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--hosts", type=int, default=1000)
    parser.add_argument("--cycles", type=int, default=7, help="evaluations after the first")
    args = parser.parse_args()
    setup_test_environment()
    old_config = setup_databases(verbosity=0, interactive=False)
    try:
        if connection.vendor != "postgresql":
            raise SystemExit("The benchmark builds its samples with PostgreSQL's generate_series: set DATABASE_URL.")
        from alerts.evaluate import ensure_rules, evaluate
        from alerts.models import Alert

        now = timezone.now().replace(microsecond=0)
        started = time.perf_counter()
        counts = build(args.hosts, now)
        built_s = time.perf_counter() - started
        rules = ensure_rules()
        print(f"machine: {platform.node()} {platform.machine()}, {os.cpu_count()} cores, Python "
              f"{platform.python_version()}, PostgreSQL {connection.pg_version // 10000}")
        print(f"fleet: {counts['hosts']} hosts, {counts['gpus']} GPUs, {counts['vgpus']} vGPUs; "
              f"{WINDOW_MIN} min of samples every {STEP_S} s (built in {built_s:.0f} s)")
        first_t = time.perf_counter()
        outcome = evaluate(now)
        first = time.perf_counter() - first_t
        print(f"first evaluation: {first * 1000:7.0f} ms, {len(outcome.fired)} alerts opened "
              f"({', '.join(f'{kind}: {n}' for kind, n in sorted(_by_rule(Alert).items()))})")
        cycles = []
        for cycle in range(args.cycles):
            at = now + timedelta(seconds=5 * (cycle + 1))
            t = time.perf_counter()
            outcome = evaluate(at)
            cycles.append(time.perf_counter() - t)
            assert not outcome.fired, "a steady fleet opens nothing"
            assert not outcome.resolved, "a steady fleet resolves nothing"
        median = statistics.median(cycles)
        print(f"steady evaluation: median {median * 1000:7.0f} ms, max {max(cycles) * 1000:7.0f} ms over "
              f"{len(cycles)} cycles; budget {BUDGET_S * 1000:.0f} ms -> {median / BUDGET_S:.0%} of it")
        enabled = {slug: (row.severity, row.effective_params) for slug, row in rules.items()}
        for label, seconds in time_parts(now, enabled):
            print(f"  {label:24} {seconds * 1000:7.0f} ms")
    finally:
        teardown_databases(old_config, verbosity=0)


def _by_rule(alert_model) -> dict[str, int]:
    from django.db.models import Count

    return dict(alert_model.objects.values_list("rule__kind").annotate(n=Count("id")).values_list("rule__kind", "n"))


if __name__ == "__main__":
    main()

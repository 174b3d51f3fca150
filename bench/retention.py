"""Benchmark of raw-sample retention on PostgreSQL: a day dropped as partitions vs deleted in
batches, and the bytes each stored sample row costs before and after the compact column types.

    DATABASE_URL=postgres://... python bench/retention.py [--hosts 20] [--gpus-per-host 4]
        [--vgpus-per-gpu 4] [--every 10]

Scale: the full fleet is 10,000 hosts; each carries --gpus-per-host GPUs with --vgpus-per-gpu
vGPUs, sampled every --every seconds, so one day is hosts x GPUs x (1 + vGPUs) x 86,400 / every
rows (10,000 x 4 x 5 x 8,640 = 1.7 billion with the defaults, 3.5 billion at 9 vGPUs per GPU).
The bench stores one such day for --hosts hosts (default 20: 1/500 of the fleet) and prints the
scale it ran at.

Runs in a throwaway test database (Django's `test_<name>`, created and dropped here). In one run:
1. the sample tables as they were before (migration 0006: double precision columns, one plain
   table each): the day loaded, bytes per row (heap and indexes), then `prune_samples` times
   the batched DELETE that retention did until now;
2. the tables migrated to 0007 (compact types, partitioned by day): the same day loaded, bytes
   per row, then the batched DELETE of the same rows through the partitioned table (what
   retention would cost without dropping), and VACUUM of what it left;
3. the same day loaded again, and `prune_samples` times retention as it is now (DROP of the
   day partitions).
Figures are rows per second and the ratio DROP : DELETE. Prints figures; asserts nothing.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")
os.environ.setdefault("DEBUG", "true")

import django  # noqa: E402

django.setup()

import logging  # noqa: E402

logging.getLogger("telemetry").setLevel(logging.WARNING)  # retention's own log lines would interleave

from django.conf import settings  # noqa: E402
from django.db import connection  # noqa: E402
from django.db.migrations.executor import MigrationExecutor  # noqa: E402
from django.test.utils import setup_databases, teardown_databases  # noqa: E402

FLEET_HOSTS = 10_000
DAY = datetime(2026, 3, 2, tzinfo=UTC)
TABLES = ("telemetry_gpusample", "telemetry_vgpusample")


def migrate_to(target: str) -> None:
    executor = MigrationExecutor(connection)
    executor.loader.build_graph()
    executor.migrate([("telemetry", target)])


def seed_inventory(hosts: int, gpus_per_host: int, vgpus_per_gpu: int) -> None:
    from fleet.models import Gpu, GpuModel, Host, Vgpu, VgpuProfile, VirtualMachine

    model = GpuModel.objects.get(name="NVIDIA L40S")
    profile = VgpuProfile.objects.get(name="L40S-12Q")
    host_rows = Host.objects.bulk_create(Host(name=f"bench-{h:05d}", cpu_threads=128, ram_gib=1024)
                                         for h in range(hosts))
    gpus = Gpu.objects.bulk_create(
        Gpu(host=host, gpu_model=model, pci_bus_id=f"00000000:{g + 1:02X}:00.0", uuid=f"GPU-bench-{h}-{g}")
        for h, host in enumerate(host_rows) for g in range(gpus_per_host))
    vms = VirtualMachine.objects.bulk_create(
        VirtualMachine(name=f"bench-vm-{i}", host=gpus[i // vgpus_per_gpu].host)
        for i in range(len(gpus) * vgpus_per_gpu))
    Vgpu.objects.bulk_create(Vgpu(vm=vm, gpu=gpus[i // vgpus_per_gpu], profile=profile,
                                  placement_id=i % vgpus_per_gpu) for i, vm in enumerate(vms))


def load_day(every_s: int) -> dict[str, int]:
    """One day of samples for every GPU and vGPU, in time order as ingest writes them, with
    whole-number readings as NVML gives them (the same rows whichever column types hold them)."""
    end = DAY + timedelta(days=1)
    series = f"generate_series(%s::timestamptz, %s::timestamptz - interval '{every_s} seconds', " \
             f"interval '{every_s} seconds')"
    with connection.cursor() as cursor:
        cursor.execute("SELECT setseed(0.7)")
        cursor.execute(
            "INSERT INTO telemetry_gpusample (gpu_id, ts, util_gpu, util_mem, fb_used_mib, fb_total_mib, enc_util, "
            "dec_util, temp_c, power_w, sm_clock_mhz, clocks_event_reasons) "
            "SELECT g.id, t, floor(random() * 101), floor(random() * 61), floor(random() * 46068), 46068, NULL, 0, "
            "30 + floor(random() * 50), round((60 + random() * 290)::numeric, 3), 2490, 0 "
            f"FROM {series} t CROSS JOIN fleet_gpu g ORDER BY t, g.id", [DAY, end])
        gpu_rows = cursor.rowcount
        cursor.execute(
            "INSERT INTO telemetry_vgpusample (vm_id, gpu_id, vgpu_id, ts, fb_used_mib, util_gpu, util_mem, "
            "enc_util, dec_util) "
            "SELECT v.vm_id, v.gpu_id, v.id, t, floor(random() * 12288), floor(random() * 26), floor(random() * 16), "
            f"NULL, 0 FROM {series} t CROSS JOIN fleet_vgpu v ORDER BY t, v.id", [DAY, end])
        vgpu_rows = cursor.rowcount
        cursor.execute("ANALYZE telemetry_gpusample, telemetry_vgpusample")
    return {"telemetry_gpusample": gpu_rows, "telemetry_vgpusample": vgpu_rows}


def sizes(table: str) -> tuple[int, int]:
    """(heap bytes, index bytes) of `table` and all its partitions."""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT coalesce(sum(pg_table_size(relid)), 0), coalesce(sum(pg_indexes_size(relid)), 0) "
            "FROM pg_partition_tree(%s) WHERE isleaf", [table])
        heap, indexes = cursor.fetchone()
        if not heap:  # a plain table is no partition tree
            cursor.execute("SELECT pg_table_size(%s::regclass), pg_indexes_size(%s::regclass)", [table, table])
            heap, indexes = cursor.fetchone()
    return int(heap), int(indexes)


def byte_figures(rows: dict[str, int]) -> dict[str, tuple[float, float, float]]:
    out = {}
    for table in TABLES:
        heap, indexes = sizes(table)
        out[table] = (heap / rows[table], indexes / rows[table], (heap + indexes) / rows[table])
    return out


def roll_checkpoints_past(moment: datetime) -> None:
    from telemetry.models import RollupCheckpoint

    for name in ("gpu:300", "gpu:3600", "vm:300", "vm:3600"):
        RollupCheckpoint.objects.update_or_create(name=name, defaults={"done_until": moment})


def timed(fn):
    start = time.perf_counter()
    result = fn()
    return time.perf_counter() - start, result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--hosts", type=int, default=20)
    parser.add_argument("--gpus-per-host", type=int, default=4)
    parser.add_argument("--vgpus-per-gpu", type=int, default=4)
    parser.add_argument("--every", type=int, default=10, help="seconds between samples")
    args = parser.parse_args()
    if connection.vendor != "postgresql":
        sys.exit("bench/retention.py measures PostgreSQL partitions: set DATABASE_URL=postgres://...")

    from telemetry import partitions
    from telemetry.retention import delete_in_batches, prune_samples

    old_config = setup_databases(verbosity=0, interactive=False)
    try:
        batch = settings.TELEMETRY_PRUNE_BATCH
        now = DAY + timedelta(days=settings.TELEMETRY_RETENTION_RAW_DAYS + 2)
        per_day_full = FLEET_HOSTS * args.gpus_per_host * (1 + args.vgpus_per_gpu) * 86_400 // args.every
        with connection.cursor() as cursor:
            cursor.execute("SHOW server_version")
            version = cursor.fetchone()[0]
        print(f"PostgreSQL {version}; {os.cpu_count()} CPUs; retention batch {batch} rows")
        print(f"scale: {args.hosts} of {FLEET_HOSTS} hosts (1/{FLEET_HOSTS / args.hosts:g}), {args.gpus_per_host} GPUs "
              f"and {args.gpus_per_host * args.vgpus_per_gpu} vGPUs a host, a sample every {args.every} s; "
              f"full fleet {per_day_full:,} rows a day")
        seed_inventory(args.hosts, args.gpus_per_host, args.vgpus_per_gpu)
        roll_checkpoints_past(now)

        # 1. before: double precision columns, plain tables; retention's batched DELETE.
        migrate_to("0006_health_state")
        load_s, rows = timed(lambda: load_day(args.every))
        total = sum(rows.values())
        print(f"one scaled day: {rows['telemetry_gpusample']:,} GPU + {rows['telemetry_vgpusample']:,} vGPU "
              f"sample rows = {total:,} (loaded in {load_s:.1f} s)")
        before = byte_figures(rows)
        delete_s, deleted = timed(lambda: prune_samples(now=now))
        assert deleted["gpu_samples"] + deleted["vgpu_samples"] == total, deleted

        # 2. after: compact types, partitioned by day; the same rows deleted in batches.
        migrate_to("0007_partition_samples")
        partitions.ensure_partitions(now=DAY, days_ahead=0)
        rows = load_day(args.every)
        after = byte_figures(rows)
        from telemetry.models import GpuSample, VgpuSample

        cutoff = DAY + timedelta(days=1)
        part_delete_s, part_deleted = timed(lambda: sum(
            delete_in_batches(model.objects.filter(ts__lt=cutoff), batch) for model in (GpuSample, VgpuSample)))
        assert part_deleted == total, part_deleted
        vacuum_s, _ = timed(lambda: connection.cursor().execute("VACUUM telemetry_gpusample, telemetry_vgpusample"))

        # 3. now: the same day dropped as partitions.
        prune_samples(now=now)  # the emptied partitions go
        partitions.ensure_partitions(now=DAY, days_ahead=0)
        load_day(args.every)
        drop_s, dropped = timed(lambda: prune_samples(now=now))
        assert dropped["gpu_sample_partitions"] == dropped["vgpu_sample_partitions"] == 1, dropped
        with connection.cursor() as cursor:
            cursor.execute("SELECT (SELECT count(*) FROM telemetry_gpusample) + (SELECT count(*) FROM "
                           "telemetry_vgpusample)")
            assert cursor.fetchone()[0] == 0

        print()
        print("bytes per stored sample row (heap + indexes = total), one day, as loaded")
        print(f"{'table':<22}{'before (float8, plain)':>30}{'after (compact, partitioned)':>34}{'saved':>8}")
        for table in TABLES:
            b, a = before[table], after[table]
            print(f"{table:<22}{b[0]:>10.1f} +{b[1]:>6.1f} ={b[2]:>7.1f}   {a[0]:>12.1f} +{a[1]:>6.1f} ={a[2]:>7.1f}"
                  f"{(1 - a[2] / b[2]) * 100:>7.0f}%")
        print()
        print(f"retention of the scaled day ({total:,} rows)")
        lines = (("batched DELETE, before (plain float8 tables)", delete_s),
                 ("batched DELETE, partitioned compact tables", part_delete_s),
                 ("DROP of the day partitions (retention now)", drop_s))
        for label, seconds in lines:
            print(f"  {label:<48}{seconds:>9.3f} s{total / seconds:>16,.0f} rows/s")
        print(f"  {'VACUUM after the partitioned DELETE':<48}{vacuum_s:>9.3f} s")
        print(f"ratio DROP : DELETE (rows/s): {delete_s / drop_s:,.0f}x against the DELETE before, "
              f"{part_delete_s / drop_s:,.0f}x against DELETE on the same partitioned tables")
        full_delete_h = per_day_full / (total / delete_s) / 3600
        print(f"extrapolated to the full fleet's day ({per_day_full:,} rows): batched DELETE "
              f"~{full_delete_h:,.1f} h of deleting a day at the rate above; DROP stays one catalog change "
              f"per table (its time does not grow with rows)")
    finally:
        teardown_databases(old_config, verbosity=0)


if __name__ == "__main__":
    main()

"""Benchmark of the rollup build: raw samples rolled up per second, per series and step.

    DATABASE_URL=postgres://... python bench/rollups.py [--gpus 200] [--vgpus-per-gpu 4] [--hours 2]

Runs in a throwaway test database (Django's `test_<name>`, created and dropped here), so it
never touches real samples or checkpoints. It seeds `--gpus` L40S GPUs, each with
`--vgpus-per-gpu` single-vGPU VMs, and a sample of each GPU and vGPU every `--every` seconds
for `--hours` hours, then times `build_rollups` over all of it (every bucket complete, no
bound on buckets): 5-minute, then hourly, for GPUs and VMs. Prints figures; asserts nothing.
"""

from __future__ import annotations

import argparse
import math
import os
import random
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
from django.test.utils import setup_databases, teardown_databases  # noqa: E402

T0 = datetime(2026, 3, 2, 0, 0, tzinfo=UTC)


def seed(gpus: int, vgpus_per_gpu: int, hours: float, every_s: int) -> tuple[int, int]:
    from fleet.models import Gpu, GpuModel, Host, Vgpu, VgpuProfile, VirtualMachine
    from telemetry.models import GpuSample, VgpuSample

    model = GpuModel.objects.get(name="NVIDIA L40S")
    profile = VgpuProfile.objects.get(name="L40S-12Q")
    hosts = Host.objects.bulk_create(Host(name=f"bench-{h:04d}", cpu_threads=128, ram_gib=1024)
                                     for h in range(math.ceil(gpus / 8)))
    gpu_rows = Gpu.objects.bulk_create(
        Gpu(host=hosts[g // 8], gpu_model=model, pci_bus_id=f"00000000:{g % 8 + 1:02X}:00.0", uuid=f"GPU-bench-{g}")
        for g in range(gpus)
    )
    vms = VirtualMachine.objects.bulk_create(VirtualMachine(name=f"bench-vm-{i}", host=hosts[i // vgpus_per_gpu // 8])
                                             for i in range(gpus * vgpus_per_gpu))
    # Straight rows, not placement: the benchmark is about samples, and the layout is valid anyway.
    Vgpu.objects.bulk_create(Vgpu(vm=vm, gpu=gpu_rows[i // vgpus_per_gpu], profile=profile,
                                  placement_id=i % vgpus_per_gpu) for i, vm in enumerate(vms))
    rng = random.Random(7)
    steps = int(hours * 3600 / every_s)
    gpu_count = vgpu_count = 0
    batch_g, batch_v = [], []
    for k in range(steps):
        ts = T0 + timedelta(seconds=k * every_s)
        for g, gpu in enumerate(gpu_rows):
            batch_g.append(GpuSample(gpu=gpu, ts=ts, util_gpu=rng.uniform(0, 100), util_mem=rng.uniform(0, 60),
                                     fb_used_mib=rng.uniform(0, 49152), fb_total_mib=49152.0, enc_util=None,
                                     dec_util=0.0, temp_c=rng.uniform(30, 80), power_w=rng.uniform(60, 350),
                                     sm_clock_mhz=2520.0))
            for v in range(vgpus_per_gpu):
                batch_v.append(VgpuSample(vm=vms[g * vgpus_per_gpu + v], gpu=gpu, ts=ts,
                                          fb_used_mib=rng.uniform(0, 12288), util_gpu=rng.uniform(0, 25),
                                          util_mem=rng.uniform(0, 15), enc_util=None, dec_util=0.0))
        if len(batch_v) >= 20_000 or k == steps - 1:
            GpuSample.objects.bulk_create(batch_g, batch_size=5000)
            VgpuSample.objects.bulk_create(batch_v, batch_size=5000)
            gpu_count += len(batch_g)
            vgpu_count += len(batch_v)
            batch_g, batch_v = [], []
    if connection.vendor == "postgresql":
        with connection.cursor() as cursor:
            cursor.execute("ANALYZE")
    return gpu_count, vgpu_count


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gpus", type=int, default=200)
    parser.add_argument("--vgpus-per-gpu", type=int, default=4)
    parser.add_argument("--hours", type=float, default=2)
    parser.add_argument("--every", type=int, default=10, help="seconds between samples")
    args = parser.parse_args()

    from telemetry.rollups import build_rollups

    old_config = setup_databases(verbosity=0, interactive=False)
    try:
        started = time.perf_counter()
        gpu_samples, vgpu_samples = seed(args.gpus, args.vgpus_per_gpu, args.hours, args.every)
        print(f"database: {connection.vendor} {connection.settings_dict['NAME']}")
        print(f"seeded {gpu_samples:,} GPU samples and {vgpu_samples:,} vGPU samples "
              f"({args.gpus} GPUs, {args.gpus * args.vgpus_per_gpu} VMs, {args.hours} h every {args.every} s) "
              f"in {time.perf_counter() - started:.1f} s")
        now = T0 + timedelta(hours=args.hours)
        for step_s in (300, 3600):
            result = build_rollups(step_s, now=now, max_buckets=10**9, late_s=0)
            for series in result.series:
                rate = series.samples / series.seconds if series.seconds else 0
                print(f"{series.name:>8}: {series.buckets:4d} buckets, {series.samples:>9,} samples -> "
                      f"{series.rows:>7,} rollups in {series.seconds:6.2f} s = {rate:>9,.0f} samples/s")
    finally:
        teardown_databases(old_config, verbosity=0)


if __name__ == "__main__":
    main()

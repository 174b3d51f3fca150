"""Rollups: the aggregation definitions, and the resumable build of 5-minute and hourly buckets
from raw samples (exact figures, idempotent reruns, checkpoints, late samples, bounded work)."""

import json
import math
from datetime import UTC, datetime, timedelta

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from hypothesis import given
from hypothesis import strategies as st

from telemetry import aggregation, rollups
from telemetry.aggregation import bucket_floor, p95, percentile_nearest_rank, summarize, weighted_mean
from telemetry.models import GpuRollup, GuestRollup, GuestSample, RollupCheckpoint, VgpuSample, VmRollup
from telemetry.rollup_tasks import build_rollups as build_rollups_task
from telemetry.rollups import build_rollups, rewind_rollups
from telemetry.schedules import BUILD_ROLLUPS_EVERY_S as BUILD_EVERY_S
from telemetry.schedules import ensure_rollup_schedules
from telemetry.tests.rollup_world import T0, at, gpu_samples, studio, vgpu_samples

# Pure aggregation ---------------------------------------------------------------------------


def test_p95_is_nearest_rank_a_reading_that_was_taken():
    assert p95(list(range(1, 101))) == 95
    assert p95(list(range(1, 21))) == 19  # ceil(0.95 * 20) = 19th smallest
    assert p95([float(v) for v in range(1, 11)]) == 10.0  # ceil(9.5) = 10th: the max of ten
    assert p95([42.0]) == 42.0
    assert p95([]) is None
    assert p95([3.0, 1.0, 2.0, 100.0] * 5) == 100.0  # order does not matter
    assert percentile_nearest_rank([10, 20, 30, 40], 50) == 20


def test_summary_leaves_missing_readings_out_never_zero():
    assert summarize([None, 2.0, 4.0]) == aggregation.Summary(avg=3.0, max=4.0, p95=4.0)
    assert summarize([None, None]) == aggregation.Summary(None, None, None)
    assert aggregation.sum_or_none([None, 1024.0, 2048.0]) == 3072.0
    assert aggregation.sum_or_none([None]) is None


def test_buckets_start_at_multiples_of_the_step_in_utc():
    moment = datetime(2026, 3, 2, 10, 7, 31, 500_000, tzinfo=UTC)
    assert bucket_floor(moment, 300) == datetime(2026, 3, 2, 10, 5, tzinfo=UTC)
    assert bucket_floor(moment, 3600) == datetime(2026, 3, 2, 10, 0, tzinfo=UTC)
    assert bucket_floor(datetime(2026, 3, 2, 10, 5, tzinfo=UTC), 300) == datetime(2026, 3, 2, 10, 5, tzinfo=UTC)


def test_weighted_mean_counts_each_reading_once():
    # 10 readings averaging 50 and 30 readings averaging 10: 20 overall, not 30.
    assert weighted_mean([(50.0, 10), (10.0, 30), (None, 5)]) == 20.0
    assert weighted_mean([(None, 3)]) is None


@given(st.lists(st.lists(st.integers(0, 100), min_size=1, max_size=40), min_size=1, max_size=8))
def test_max_of_p95s_never_understates_the_merged_p95(parts):
    """The re-bucketing rule of the metrics API is an upper bound of the true p95."""
    merged = [v for part in parts for v in part]
    assert max(p95(part) for part in parts) >= p95(merged)
    assert max(max(part) for part in parts) == max(merged)


# The build ------------------------------------------------------------------------------------


@pytest.fixture
def world(db):
    return studio()


def gpu_rollup(gpu, bucket, step_s=300):
    return GpuRollup.objects.get(gpu=gpu, step_s=step_s, bucket=bucket)


def test_gpu_bucket_has_exact_avg_max_p95(world):
    utils = [float(v) for v in range(1, 31)]  # 30 readings, 10 s apart: one 5-minute bucket
    gpu_samples(
        world.gpu_1, T0, 30, util_gpu=utils, util_mem=lambda i: None if i == 0 else 20.0,
        fb_used_mib=lambda i: 1000.0 + 10 * i, fb_total_mib=46068.0, enc_util=None, dec_util=5.0,
        temp_c=lambda i: 40.0 + i % 3, power_w=lambda i: 100.0 + i, sm_clock_mhz=1800.0,
    )

    result = build_rollups(300, now=at(330))

    row = gpu_rollup(world.gpu_1, T0)
    assert row.samples == 30
    assert (row.util_gpu_avg, row.util_gpu_max, row.util_gpu_p95) == (15.5, 30.0, 29.0)
    assert (row.util_mem_avg, row.util_mem_max) == (20.0, 20.0)  # the missing first reading is left out
    assert (row.fb_used_mib_avg, row.fb_used_mib_max, row.fb_used_mib_p95) == (1145.0, 1290.0, 1280.0)
    assert row.fb_total_mib == 46068.0
    assert (row.enc_util_avg, row.enc_util_max) == (None, None)  # not reported: null, never 0
    assert (row.dec_util_avg, row.dec_util_max) == (5.0, 5.0)
    assert (row.temp_c_avg, row.temp_c_max) == (41.0, 42.0)
    assert (row.power_w_avg, row.power_w_max) == (114.5, 129.0)
    assert row.sm_clock_mhz_avg == 1800.0
    assert result.series[0].samples == 30
    assert RollupCheckpoint.objects.get(name="gpu:300").done_until == at(300)


def test_vm_bucket_sums_frame_buffer_over_its_vgpus_and_takes_the_busiest(world):
    # ws-ana has a vGPU on each GPU: at each reading, 2 GiB + 3 GiB used; utilization 30% and 70%.
    vgpu_samples(world.vm_ana, world.gpu_1, T0, 20, fb_used_mib=2048.0, util_gpu=30.0, util_mem=lambda i: float(i),
                 enc_util=None, dec_util=None)
    vgpu_samples(world.vm_ana, world.gpu_2, T0, 20, fb_used_mib=lambda i: 3072.0 + i, util_gpu=70.0,
                 util_mem=None, enc_util=None, dec_util=None)
    vgpu_samples(world.vm_bob, world.gpu_2, T0, 10, fb_used_mib=8192.0, util_gpu=90.0)

    build_rollups(300, now=at(400))

    ana = VmRollup.objects.get(vm=world.vm_ana, step_s=300, bucket=T0)
    fb_points = [2048.0 + 3072.0 + i for i in range(20)]
    assert ana.samples == 20  # timestamps, not vGPU readings
    assert ana.fb_used_mib_avg == pytest.approx(sum(fb_points) / 20)
    assert ana.fb_used_mib_max == 5139.0
    assert ana.fb_used_mib_p95 == percentile_nearest_rank(fb_points, 95) == 5138.0
    assert (ana.util_gpu_avg, ana.util_gpu_max, ana.util_gpu_p95) == (70.0, 70.0, 70.0)
    assert ana.util_mem_max == 19.0
    assert ana.enc_util_avg is None
    assert ana.profile_fb_mib == 2 * 12288  # two L40S-12Q
    assert not ana.partial
    bob = VmRollup.objects.get(vm=world.vm_bob, step_s=300, bucket=T0)
    assert (bob.samples, bob.fb_used_mib_avg, bob.util_gpu_max, bob.profile_fb_mib) == (10, 8192.0, 90.0, 12288)


def test_vm_bucket_missing_a_vgpus_readings_is_partial(world):
    # ws-ana declares two vGPUs; at 10:02:00 and 10:02:10 only the one on GPU 1 reported.
    vgpu_samples(world.vm_ana, world.gpu_1, T0, 30, fb_used_mib=4096.0, util_gpu=30.0)
    second = vgpu_samples(world.vm_ana, world.gpu_2, T0, 30, fb_used_mib=4096.0, util_gpu=30.0)
    VgpuSample.objects.filter(pk__in=[second[12].pk, second[13].pk]).delete()
    vgpu_samples(world.vm_bob, world.gpu_2, T0, 30, fb_used_mib=8192.0, util_gpu=90.0)
    # The next bucket is whole again.
    vgpu_samples(world.vm_ana, world.gpu_1, at(300), 30, fb_used_mib=4096.0)
    vgpu_samples(world.vm_ana, world.gpu_2, at(300), 30, fb_used_mib=4096.0)

    build_rollups(300, now=at(700))

    ana = VmRollup.objects.get(vm=world.vm_ana, step_s=300, bucket=T0)
    assert ana.partial
    assert (ana.samples, ana.fb_used_mib_max) == (30, 8192.0)
    assert not VmRollup.objects.get(vm=world.vm_ana, step_s=300, bucket=at(300)).partial
    assert not VmRollup.objects.get(vm=world.vm_bob, step_s=300, bucket=T0).partial


def test_incomplete_bucket_is_not_written(world):
    gpu_samples(world.gpu_1, T0, 40, util_gpu=50.0)  # 10:00:00 to 10:06:30

    build_rollups(300, now=at(400))

    assert list(GpuRollup.objects.values_list("bucket", flat=True)) == [T0]
    assert gpu_rollup(world.gpu_1, T0).samples == 30
    assert RollupCheckpoint.objects.get(name="gpu:300").done_until == at(300)


def test_first_run_starts_at_the_oldest_samples_bucket(world):
    gpu_samples(world.gpu_1, at(17 * 60 + 5), 6, util_gpu=10.0)  # 10:17:05 .. 10:17:55

    build_rollups(300, now=at(3600))

    assert list(GpuRollup.objects.values_list("bucket", flat=True)) == [at(15 * 60)]
    assert RollupCheckpoint.objects.get(name="gpu:300").done_until == at(3600)


def test_no_samples_no_checkpoint_and_nothing_written(world):
    result = build_rollups(300, now=at(3600))

    assert GpuRollup.objects.count() == VmRollup.objects.count() == 0
    assert not RollupCheckpoint.objects.exists()
    assert [s.buckets for s in result.series] == [0, 0, 0]


def test_rerun_is_idempotent(world):
    gpu_samples(world.gpu_1, T0, 90, util_gpu=lambda i: float(i % 17))
    vgpu_samples(world.vm_ana, world.gpu_1, T0, 90, fb_used_mib=lambda i: 1000.0 + i)
    build_rollups(300, now=at(1000))
    first = list(GpuRollup.objects.order_by("bucket").values()) + list(VmRollup.objects.order_by("bucket").values())

    build_rollups(300, now=at(1000))
    build_rollups(300, now=at(1000), late_s=10_000)  # rebuilds every bucket again

    again = list(GpuRollup.objects.order_by("bucket").values()) + list(VmRollup.objects.order_by("bucket").values())
    assert again == first
    assert len(first) == 6  # 3 buckets of one GPU and one VM


def test_checkpoint_resumes_with_bounded_work_per_run(world):
    gpu_samples(world.gpu_1, T0, 300, util_gpu=lambda i: float(i // 30))  # ten 5-minute buckets
    now = at(3000)

    runs = []
    for _ in range(4):
        result = build_rollups(300, now=now, max_buckets=3, late_s=0)
        runs.append((result.series[0].buckets, result.series[0].done_until))

    assert runs == [(3, at(900)), (3, at(1800)), (3, at(2700)), (1, at(3000))]
    utils = list(GpuRollup.objects.filter(gpu=world.gpu_1).order_by("bucket").values_list("util_gpu_avg", flat=True))
    assert utils == [float(i) for i in range(10)]


def test_a_bucket_costs_the_same_queries_whatever_the_fleet(world):
    gpu_samples(world.gpu_1, T0, 60, util_gpu=1.0)
    with CaptureQueriesContext(connection) as one_gpu:
        build_rollups(300, now=at(600), late_s=0)
    RollupCheckpoint.objects.all().delete()
    for gpu in (world.gpu_2, world.gpu_idle):
        gpu_samples(gpu, T0, 60, util_gpu=2.0)
    with CaptureQueriesContext(connection) as three_gpus:
        build_rollups(300, now=at(600), late_s=0)

    assert GpuRollup.objects.count() == 6
    assert len(three_gpus) == len(one_gpu)


def test_empty_stretches_cost_nothing_and_do_not_count(world):
    gpu_samples(world.gpu_1, T0, 3, util_gpu=1.0)
    gpu_samples(world.gpu_1, T0 + timedelta(days=7), 3, util_gpu=2.0)

    result = build_rollups(300, now=T0 + timedelta(days=8), max_buckets=2)

    assert result.series[0].buckets == 2
    assert list(GpuRollup.objects.values_list("util_gpu_avg", flat=True).order_by("bucket")) == [1.0, 2.0]
    assert RollupCheckpoint.objects.get(name="gpu:300").done_until == T0 + timedelta(days=8)


def test_late_sample_within_the_late_window_is_folded_into_its_bucket(world):
    gpu_samples(world.gpu_1, T0, 29, util_gpu=10.0)  # the reading at 10:04:50 is late
    build_rollups(300, now=at(305), late_s=120)
    assert gpu_rollup(world.gpu_1, T0).samples == 29

    gpu_samples(world.gpu_1, at(290), 1, util_gpu=100.0)
    build_rollups(300, now=at(365), late_s=120)

    row = gpu_rollup(world.gpu_1, T0)
    assert row.samples == 30
    assert row.util_gpu_max == 100.0
    assert row.util_gpu_avg == pytest.approx((29 * 10 + 100) / 30)


def test_sample_later_than_the_window_needs_a_rewind(world):
    gpu_samples(world.gpu_1, T0, 29, util_gpu=10.0)
    build_rollups(300, now=at(305), late_s=120)
    gpu_samples(world.gpu_1, at(290), 1, util_gpu=100.0)

    build_rollups(300, now=at(1200), late_s=120)
    assert gpu_rollup(world.gpu_1, T0).util_gpu_max == 10.0  # the bucket closed 15 minutes ago

    assert rewind_rollups(at(290)) == 1  # gpu:300 (the VM series never ran)
    assert RollupCheckpoint.objects.get(name="gpu:300").done_until == T0
    build_rollups(300, now=at(1200), late_s=120)
    assert gpu_rollup(world.gpu_1, T0).util_gpu_max == 100.0
    assert RollupCheckpoint.objects.get(name="gpu:300").done_until == at(1200)


def test_half_finished_bucket_is_redone(world, monkeypatch):
    gpu_samples(world.gpu_1, T0, 90, util_gpu=lambda i: float(i // 30))  # three buckets
    real_advance = rollups._advance_checkpoint
    calls = []

    def dies_in_second_bucket(name, until):
        calls.append(until)
        if len(calls) == 2:  # the second bucket's rows are written, its checkpoint not yet
            raise RuntimeError("worker killed")
        real_advance(name, until)

    monkeypatch.setattr(rollups, "_advance_checkpoint", dies_in_second_bucket)
    with pytest.raises(RuntimeError):
        build_rollups(300, now=at(900), late_s=0)

    assert list(GpuRollup.objects.values_list("bucket", flat=True)) == [T0]  # bucket 2 rolled back
    assert RollupCheckpoint.objects.get(name="gpu:300").done_until == at(300)

    monkeypatch.setattr(rollups, "_advance_checkpoint", real_advance)
    build_rollups(300, now=at(900), late_s=0)
    assert list(GpuRollup.objects.order_by("bucket").values_list("util_gpu_avg", flat=True)) == [0.0, 1.0, 2.0]


def test_hourly_p95_is_exact_over_the_hour_not_a_max_of_5_minute_p95s(world):
    # Eleven calm 5-minute buckets and one with a 2-minute spike to 100%: the hour's p95 is calm.
    def util(i):
        return 100.0 if 30 * 11 <= i < 30 * 11 + 12 else float(i % 7)

    gpu_samples(world.gpu_1, T0, 360, util_gpu=util)
    build_rollups(300, now=at(3700))
    build_rollups(3600, now=at(3700))

    hour = gpu_rollup(world.gpu_1, T0, step_s=3600)
    readings = [util(i) for i in range(360)]
    assert hour.samples == 360
    assert hour.util_gpu_p95 == percentile_nearest_rank(readings, 95) == 6.0
    assert hour.util_gpu_max == 100.0
    assert hour.util_gpu_avg == pytest.approx(math.fsum(readings) / 360)
    assert max(GpuRollup.objects.filter(step_s=300).values_list("util_gpu_p95", flat=True)) == 100.0
    assert RollupCheckpoint.objects.get(name="gpu:3600").done_until == at(3600)


def test_build_refuses_a_step_without_rollups():
    with pytest.raises(ValueError, match="step_s"):
        build_rollups(600)


# The task -----------------------------------------------------------------------------------


def test_task_builds_both_steps_and_reports_in_json(world, time_machine):
    # The task reads the clock: stopped mid-hour, so no bucket closes between here and the run.
    time_machine.move_to(at(1800), tick=False)
    start = bucket_floor(T0, 3600) - timedelta(hours=2)
    gpu_samples(world.gpu_1, start, 120, every_s=60, util_gpu=40.0)
    vgpu_samples(world.vm_ana, world.gpu_1, start, 120, every_s=60, fb_used_mib=4096.0)

    done = build_rollups_task.apply().get()

    json.dumps(done)  # results travel as JSON
    assert set(done) == {"300", "3600"}
    assert GpuRollup.objects.filter(step_s=3600, gpu=world.gpu_1).count() == 2
    assert GpuRollup.objects.filter(step_s=300, gpu=world.gpu_1).count() == 24
    assert VmRollup.objects.filter(step_s=3600, vm=world.vm_ana).values_list("fb_used_mib_avg", flat=True)[0] == 4096
    assert build_rollups_task.ignore_result


def test_rollup_schedules_are_created_once_and_expire_before_the_next_run(db):
    from django_celery_beat.models import PeriodicTask

    ensure_rollup_schedules()
    ensure_rollup_schedules()

    tasks = {t.name: t for t in PeriodicTask.objects.filter(name__in=["build_rollups", "prune_samples"])}
    assert tasks["build_rollups"].task == "telemetry.rollup_tasks.build_rollups"
    assert tasks["build_rollups"].interval.every == 60
    assert tasks["build_rollups"].expire_seconds < 60
    assert tasks["prune_samples"].task == "telemetry.rollup_tasks.prune_samples"
    assert tasks["prune_samples"].interval.every == 3600
    assert tasks["prune_samples"].expire_seconds < 3600
    assert PeriodicTask.objects.filter(name="build_rollups").count() == 1


def test_worker_registers_the_tasks_beat_names():
    """Beat sends tasks by name: a worker that did not import this module would refuse them."""
    from config.celery import app

    app.loader.import_default_modules()
    assert {"telemetry.rollup_tasks.build_rollups", "telemetry.rollup_tasks.prune_samples"} <= set(app.tasks)
    assert app.tasks["telemetry.rollup_tasks.build_rollups"].soft_time_limit < BUILD_EVERY_S


def test_a_vms_guest_cpu_and_memory_roll_up_with_their_busiest_vcpu_and_unknown_memory_left_out(world):
    """Guest readings (through the hypervisor link) of ws-ana: 8 vCPUs, one of them saturated in
    the second half; memory not reported at one reading (no balloon figure), never read as 0."""
    for i in range(10):
        GuestSample.objects.create(vm=world.vm_ana, ts=at(30 * i), vcpus=8, ram_mib=32768,
                                   vcpu_util=12.5 if i >= 5 else 3.0, vcpu_max_util=100.0 if i >= 5 else 10.0,
                                   cpu_steal_pct=0.5, ram_used_mib=None if i == 3 else 6000 + 100 * i)

    result = build_rollups(300, now=at(600))

    assert [s.name for s in result.series] == ["gpu:300", "vm:300", "guest:300"]
    [row] = GuestRollup.objects.filter(vm=world.vm_ana, step_s=300)
    assert (row.bucket, row.samples, row.vcpus, row.ram_mib) == (T0, 10, 8, 32768)
    assert (row.vcpu_util_avg, row.vcpu_util_max) == (7.75, 12.5)
    assert (row.vcpu_max_util_avg, row.vcpu_max_util_p95, row.vcpu_max_util_max) == (55.0, 100.0, 100.0)
    assert (row.cpu_steal_pct_avg, row.cpu_steal_pct_max) == (0.5, 0.5)
    # Nine memory readings (6000..6900 but 6300): the one without a figure is left out.
    assert (row.ram_used_mib_max, row.ram_used_mib_p95) == (6900.0, 6900.0)
    assert row.ram_used_mib_avg == pytest.approx((sum(6000 + 100 * i for i in range(10)) - 6300) / 9)

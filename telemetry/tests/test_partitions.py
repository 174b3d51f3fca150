"""Day partitions of the raw sample tables (PostgreSQL), and what must hold on every database:
no sample is lost for want of a partition, retention drops only whole days that every rollup
series has passed, rollups read across midnight, and the upgrade keeps every stored sample."""

from datetime import UTC, datetime, timedelta

import pytest
from django.db import IntegrityError, connection
from django.db.migrations.executor import MigrationExecutor
from django.utils import timezone

from fleet.tests.factories import GpuFactory, HostFactory, gpu_model
from telemetry import partitions
from telemetry.ingest import store_reports
from telemetry.models import GpuRollup, GpuSample, RollupCheckpoint, VgpuSample
from telemetry.retention import prune_samples
from telemetry.rollup_tasks import create_sample_partitions
from telemetry.rollups import build_rollups
from telemetry.tests.ingest_world import gpu_reading, make_agent, report
from telemetry.tests.rollup_world import gpu_samples, studio, vgpu_samples

GPU_TABLE = GpuSample._meta.db_table
VGPU_TABLE = VgpuSample._meta.db_table
# A day no partition exists for in the test database (the migration made today's and the next week's).
NOW = datetime(2026, 4, 1, 12, 0, tzinfo=UTC)
MIDNIGHT = datetime(2026, 4, 1, tzinfo=UTC)

postgres_only = pytest.mark.skipif(
    connection.vendor != "postgresql",
    reason="partitions are PostgreSQL's; SQLite keeps plain tables (its batched deletes: test_retention.py)")


def rows_in(table: str) -> int:
    with connection.cursor() as cursor:
        cursor.execute(f"SELECT count(*) FROM ONLY {table}")
        return cursor.fetchone()[0]


def days(table: str) -> list[datetime]:
    return [p.start for p in partitions.partitions(table)]


def rolled_up_until(moment):
    for name in ("gpu:300", "gpu:3600", "vm:300", "vm:3600"):
        RollupCheckpoint.objects.update_or_create(name=name, defaults={"done_until": moment})


@pytest.fixture
def world(db, settings):
    settings.TELEMETRY_RETENTION_RAW_DAYS = 14
    settings.TELEMETRY_ROLLUP_LATE_S = 120
    return studio()


@postgres_only
def test_sample_tables_are_partitioned_with_a_week_ahead(db):
    today = partitions.day_floor(timezone.now())
    for table in (GPU_TABLE, VGPU_TABLE):
        assert partitions.is_partitioned(table)
        assert {today + timedelta(days=n) for n in range(8)} <= set(days(table))


@postgres_only
def test_partitions_are_created_ahead_and_a_second_run_creates_nothing(world):
    first = partitions.ensure_partitions(now=NOW, days_ahead=3)
    second = partitions.ensure_partitions(now=NOW, days_ahead=3)

    assert first == {"gpusample_partitions": 4, "gpusample_moved": 0,
                     "vgpusample_partitions": 4, "vgpusample_moved": 0}
    assert second == {"gpusample_partitions": 0, "gpusample_moved": 0,
                      "vgpusample_partitions": 0, "vgpusample_moved": 0}
    wanted = [MIDNIGHT + timedelta(days=n) for n in range(4)]
    assert [d for d in days(GPU_TABLE) if d < MIDNIGHT + timedelta(days=30)] == wanted
    # The periodic task (beat's entry) finds today and the week ahead already there.
    assert not any(create_sample_partitions.apply().get().values())


def test_the_periodic_task_is_scheduled(db):
    from django_celery_beat.models import PeriodicTask

    from telemetry.schedules import ensure_default_schedules

    ensure_default_schedules()
    entry = PeriodicTask.objects.get(name="create_sample_partitions")
    assert entry.task == "telemetry.rollup_tasks.create_sample_partitions"
    assert entry.enabled
    assert entry.interval.every == 3600


def test_a_sample_beyond_the_created_partitions_is_stored_and_later_moved_to_its_day(db, settings):
    settings.TELEMETRY_RETENTION_RAW_DAYS = 14
    gpu = GpuFactory(host=HostFactory(name="render-01"), gpu_model=gpu_model("NVIDIA L40S"), uuid="GPU-far-0001")
    agent = make_agent("agent-render-01", host=gpu.host)
    # Beat was down for two months: no partition for this day.
    when = (timezone.now() + timedelta(days=60)).replace(microsecond=0)
    reading = gpu_reading(gpu.uuid, util_gpu=37.5, temp_c=51, power_w=161.25, fb_used_mib=14336.4)

    stats = store_reports([(agent, report("render-01", [reading], collected_at=when.timestamp()))],
                          received_at=when.timestamp())

    assert stats.gpu_samples == 1
    sample = GpuSample.objects.get()
    # Whole percents and MiB as NVML reports them and the pages show them; power keeps its fraction.
    assert (sample.ts, sample.util_gpu, sample.temp_c, sample.fb_used_mib, sample.power_w) == (
        when, 38, 51, 14336, 161.25)
    if connection.vendor != "postgresql":
        assert partitions.ensure_partitions(now=when) == {}
        return
    assert rows_in(partitions.default_partition(GPU_TABLE)) == 1

    # The periodic task gives the waiting sample's day a partition and moves it there.
    moved = create_sample_partitions.apply().get()

    assert moved["gpusample_partitions"] >= 1
    assert moved["gpusample_moved"] == 1
    assert rows_in(partitions.default_partition(GPU_TABLE)) == 0
    assert rows_in(partitions.partition_name(GPU_TABLE, partitions.day_floor(when))) == 1
    assert GpuSample.objects.get().pk == sample.pk


@postgres_only
def test_retention_drops_whole_expired_days_and_keeps_days_rollups_still_need(world):
    for n in range(21):
        partitions.create_partition(GPU_TABLE, MIDNIGHT - timedelta(days=n))
    gpu_samples(world.gpu_1, MIDNIGHT - timedelta(days=20, hours=-6), 3, util_gpu=1)
    gpu_samples(world.gpu_1, MIDNIGHT - timedelta(days=16, hours=-6), 3, util_gpu=2)
    gpu_samples(world.gpu_1, MIDNIGHT - timedelta(days=14, hours=-6), 3, util_gpu=3)  # straddles the age cutoff
    gpu_samples(world.gpu_1, MIDNIGHT - timedelta(days=1), 3, util_gpu=4)
    # The hourly GPU series lags 18 days behind: only what it has passed may go.
    rolled_up_until(NOW)
    RollupCheckpoint.objects.filter(name="gpu:3600").update(done_until=NOW - timedelta(days=18))
    # Samples are days old when retention meets them: their deferred key checks are long done
    # (PostgreSQL refuses to drop a table with checks pending in the same transaction).
    connection.check_constraints()

    first = prune_samples(now=NOW)

    assert first["gpu_sample_partitions"] == 2  # the days 20 and 19 ago; 18 ago ends after the checkpoint
    assert sorted(set(GpuSample.objects.values_list("util_gpu", flat=True))) == [2, 3, 4]
    assert days(GPU_TABLE)[0] == MIDNIGHT - timedelta(days=18)

    rolled_up_until(NOW)
    second = prune_samples(now=NOW)

    # The age cutoff is 14 days ago at noon: the day that holds it stays whole until it has passed.
    assert second["gpu_sample_partitions"] == 4
    assert sorted(set(GpuSample.objects.values_list("util_gpu", flat=True))) == [3, 4]
    assert days(GPU_TABLE)[0] == MIDNIGHT - timedelta(days=14)
    assert prune_samples(now=NOW)["gpu_sample_partitions"] == 0


@postgres_only
def test_retention_deletes_expired_rows_of_the_default_partition_in_batches(world):
    gpu_samples(world.gpu_1, NOW - timedelta(days=20), 25, util_gpu=1)  # no partition: DEFAULT
    gpu_samples(world.gpu_1, NOW - timedelta(days=2), 5, util_gpu=2)
    rolled_up_until(NOW)

    deleted = prune_samples(now=NOW, batch_size=10)

    assert (deleted["gpu_samples"], deleted["gpu_sample_partitions"]) == (25, 0)
    assert list(set(GpuSample.objects.values_list("util_gpu", flat=True))) == [2]


def test_rollups_across_midnight_land_in_the_right_buckets(world):
    if connection.vendor == "postgresql":
        partitions.create_partition(GPU_TABLE, MIDNIGHT - timedelta(days=1))
        partitions.create_partition(GPU_TABLE, MIDNIGHT)
        partitions.create_partition(VGPU_TABLE, MIDNIGHT - timedelta(days=1))
        partitions.create_partition(VGPU_TABLE, MIDNIGHT)
    start = MIDNIGHT - timedelta(minutes=10)
    # 23:50:00 to 00:09:50, every 10 s: 10% before midnight, 70% after.
    gpu_samples(world.gpu_1, start, 120, util_gpu=lambda i: 10 if i < 60 else 70)
    vgpu_samples(world.vm_ana, world.gpu_1, start, 120, fb_used_mib=lambda i: 1000 if i < 60 else 3000)
    if connection.vendor == "postgresql":
        before = partitions.partition_name(GPU_TABLE, MIDNIGHT - timedelta(days=1))
        assert (rows_in(before), rows_in(partitions.partition_name(GPU_TABLE, MIDNIGHT))) == (60, 60)

    after = MIDNIGHT + timedelta(hours=1, minutes=10)
    build_rollups(300, now=after)
    build_rollups(3600, now=after)

    five = {r.bucket: (r.samples, r.util_gpu_avg) for r in GpuRollup.objects.filter(gpu=world.gpu_1, step_s=300)}
    assert five == {start: (30, 10), start + timedelta(minutes=5): (30, 10),
                    MIDNIGHT: (30, 70), MIDNIGHT + timedelta(minutes=5): (30, 70)}
    hourly = {r.bucket: (r.samples, r.util_gpu_avg) for r in GpuRollup.objects.filter(gpu=world.gpu_1, step_s=3600)}
    assert hourly == {MIDNIGHT - timedelta(hours=1): (60, 10), MIDNIGHT: (60, 70)}
    vm = {r.bucket: r.fb_used_mib_avg for r in world.vm_ana.rollups.filter(step_s=3600)}
    assert vm == {MIDNIGHT - timedelta(hours=1): 1000, MIDNIGHT: 3000}


@postgres_only
@pytest.mark.django_db(transaction=True, serialized_rollback=True)
def test_the_upgrade_converts_tables_holding_samples_without_losing_one():
    executor = MigrationExecutor(connection)
    executor.migrate([("telemetry", "0006_health_state")])
    old_apps = executor.loader.project_state([("telemetry", "0006_health_state")]).apps
    try:
        assert not partitions.is_partitioned(GPU_TABLE)
        OldGpuSample = old_apps.get_model("telemetry", "GpuSample")
        OldVgpuSample = old_apps.get_model("telemetry", "VgpuSample")
        world = studio()
        old = [OldGpuSample.objects.create(gpu_id=world.gpu_1.pk, ts=MIDNIGHT - timedelta(days=40) + timedelta(hours=h),
                                           util_gpu=37.5, util_mem=None, fb_used_mib=14336.0, temp_c=51.0,
                                           power_w=161.25, sm_clock_mhz=2490.0)
               for h in range(0, 24 * 40, 7)]
        OldVgpuSample.objects.create(vm_id=world.vm_ana.pk, gpu_id=world.gpu_1.pk, ts=MIDNIGHT, fb_used_mib=9011.0,
                                     util_gpu=12.4)
    finally:
        executor = MigrationExecutor(connection)
        executor.loader.build_graph()
        executor.migrate(executor.loader.graph.leaf_nodes())

    assert partitions.is_partitioned(GPU_TABLE)
    assert partitions.is_partitioned(VGPU_TABLE)
    assert GpuSample.objects.count() == len(old)
    converted = {s.pk: s for s in GpuSample.objects.all()}
    assert sorted(converted) == sorted(s.pk for s in old)
    sample = converted[old[0].pk]
    assert (sample.ts, sample.util_gpu, sample.util_mem, sample.fb_used_mib, sample.temp_c, sample.power_w,
            sample.sm_clock_mhz) == (old[0].ts, 38, None, 14336, 51, 161.25, 2490)
    assert VgpuSample.objects.get().util_gpu == 12
    # Every day of the stored samples has its partition; nothing waits in DEFAULT.
    assert set(days(GPU_TABLE)) >= {partitions.day_floor(s.ts) for s in old}
    assert rows_in(partitions.default_partition(GPU_TABLE)) == 0
    # Ids carry on after the old ones; the keys hold as before.
    new = GpuSample.objects.create(gpu=world.gpu_1, ts=timezone.now(), util_gpu=5)
    assert new.pk > max(converted)
    with pytest.raises(IntegrityError, match="duplicate key"):
        GpuSample.objects.create(gpu=world.gpu_1, ts=new.ts, util_gpu=6)

"""Retention: raw samples and rollups past their age go, in batches; raw samples no rollup
series has passed stay, however old."""

from datetime import timedelta

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from telemetry.models import GpuRollup, GpuSample, GuestSample, RollupCheckpoint, VgpuSample, VmRollup, XidError
from telemetry.retention import prune_samples, raw_cutoff
from telemetry.rollup_tasks import prune_samples as prune_samples_task
from telemetry.rollups import build_rollups
from telemetry.tests.rollup_world import T0, gpu_samples, studio, vgpu_samples

NOW = T0 + timedelta(days=30)


@pytest.fixture
def world(db, settings):
    settings.TELEMETRY_RETENTION_RAW_DAYS = 14
    settings.TELEMETRY_RETENTION_5M_DAYS = 90
    settings.TELEMETRY_RETENTION_1H_DAYS = 730
    settings.TELEMETRY_ROLLUP_LATE_S = 120
    return studio()


def rolled_up_until(moment):
    for name in ("gpu:300", "gpu:3600", "vm:300", "vm:3600", "guest:300", "guest:3600"):
        RollupCheckpoint.objects.update_or_create(name=name, defaults={"done_until": moment})


def test_old_raw_samples_go_recent_ones_stay(world):
    old = gpu_samples(world.gpu_1, NOW - timedelta(days=20), 5, util_gpu=1.0)
    recent = gpu_samples(world.gpu_1, NOW - timedelta(days=13), 5, util_gpu=2.0)
    vgpu_samples(world.vm_ana, world.gpu_1, NOW - timedelta(days=20), 4, fb_used_mib=1.0)
    kept_vgpu = vgpu_samples(world.vm_ana, world.gpu_1, NOW - timedelta(days=1), 4, fb_used_mib=2.0)
    rolled_up_until(NOW)

    deleted = prune_samples(now=NOW)

    assert deleted["gpu_samples"] == len(old) == 5
    assert deleted["vgpu_samples"] == 4
    assert sorted(GpuSample.objects.values_list("pk", flat=True)) == sorted(s.pk for s in recent)
    assert sorted(VgpuSample.objects.values_list("pk", flat=True)) == sorted(s.pk for s in kept_vgpu)


def test_guest_samples_go_by_age_once_their_rollups_have_passed_them(world):
    def guest(days_ago):
        return GuestSample.objects.create(vm=world.vm_ana, ts=NOW - timedelta(days=days_ago), vcpus=8,
                                          ram_mib=32768, vcpu_util=10.0, ram_used_mib=4096)

    guest(20)
    kept = guest(2)
    RollupCheckpoint.objects.update_or_create(name="guest:300", defaults={"done_until": NOW})
    assert prune_samples(now=NOW)["guest_samples"] == 0  # the hourly guest series has not run: nothing goes
    rolled_up_until(NOW)

    assert prune_samples(now=NOW)["guest_samples"] == 1
    assert list(GuestSample.objects.values_list("pk", flat=True)) == [kept.pk]


def test_xid_errors_go_with_the_raw_samples_by_when_they_arrived(world):
    def xid(code, received_days_ago, at_days_ago):
        return XidError.objects.create(gpu=world.gpu_1, code=code, at=NOW - timedelta(days=at_days_ago),
                                       received_at=NOW - timedelta(days=received_days_ago))

    xid(79, 15, 15)
    xid(48, 14.5, 1)  # stamped recently by a host whose clock was wrong; arrived 14.5 days ago
    kept = [xid(79, 13, 13), xid(13, 1, 40)]  # the other way round

    # No rollup has run: samples stay, XID errors need none and go by age.
    deleted = prune_samples(now=NOW)

    assert (deleted["xid_errors"], deleted["gpu_samples"]) == (2, 0)
    assert sorted(XidError.objects.values_list("pk", flat=True)) == sorted(x.pk for x in kept)
    assert prune_samples(now=NOW)["xid_errors"] == 0


def test_rollups_go_by_their_own_retention(world):
    def rollup(model, step_s, age_days, **entity):
        return model.objects.create(step_s=step_s, bucket=NOW - timedelta(days=age_days), samples=1, **entity)

    kept = [
        rollup(GpuRollup, 300, 89, gpu=world.gpu_1),
        rollup(GpuRollup, 3600, 400, gpu=world.gpu_1),
        rollup(VmRollup, 300, 1, vm=world.vm_ana),
        rollup(VmRollup, 3600, 729, vm=world.vm_ana),
    ]
    rollup(GpuRollup, 300, 91, gpu=world.gpu_1)
    rollup(GpuRollup, 3600, 731, gpu=world.gpu_1)
    rollup(VmRollup, 300, 120, vm=world.vm_ana)
    rollup(VmRollup, 3600, 800, vm=world.vm_ana)

    deleted = prune_samples(now=NOW)

    assert {k: v for k, v in deleted.items() if v} == {
        "gpu_rollups_300": 1, "vm_rollups_300": 1, "gpu_rollups_3600": 1, "vm_rollups_3600": 1,
    }
    remaining = {(r.pk, r.step_s) for r in [*GpuRollup.objects.all(), *VmRollup.objects.all()]}
    assert remaining == {(r.pk, r.step_s) for r in kept}


def test_samples_not_rolled_up_are_kept_however_old(world):
    gpu_samples(world.gpu_1, NOW - timedelta(days=25), 6, util_gpu=1.0)

    # No rollup ever ran: nothing of the raw data may go.
    assert prune_samples(now=NOW)["gpu_samples"] == 0
    assert GpuSample.objects.count() == 6

    # The 5-minute series is done, the hourly one lags behind the oldest sample: still kept.
    RollupCheckpoint.objects.create(name="gpu:300", done_until=NOW)
    RollupCheckpoint.objects.create(name="gpu:3600", done_until=NOW - timedelta(days=26))
    assert prune_samples(now=NOW)["gpu_samples"] == 0
    assert GpuSample.objects.count() == 6


def test_raw_cutoff_stops_at_the_slowest_series_less_its_late_window(world):
    RollupCheckpoint.objects.create(name="gpu:300", done_until=NOW - timedelta(days=20))
    RollupCheckpoint.objects.create(name="gpu:3600", done_until=NOW - timedelta(days=19))

    # The 5-minute series still rebuilds the bucket before its checkpoint: its samples stay.
    assert raw_cutoff("gpu", NOW) == NOW - timedelta(days=20, minutes=5)
    assert raw_cutoff("vm", NOW) is None  # the VM series never ran

    rolled_up_until(NOW)
    assert raw_cutoff("gpu", NOW) == NOW - timedelta(days=14)


def test_retention_after_a_real_build_keeps_what_rollups_still_need(world):
    gpu_samples(world.gpu_1, T0, 30, util_gpu=50.0)
    gpu_samples(world.gpu_1, T0 + timedelta(days=20), 30, util_gpu=60.0)
    build_rollups(300, now=T0 + timedelta(days=20, minutes=10))
    build_rollups(3600, now=T0 + timedelta(days=20, minutes=10))

    deleted = prune_samples(now=T0 + timedelta(days=20, minutes=10))

    assert deleted["gpu_samples"] == 30  # the day-0 samples, rolled up and 20 days old
    assert set(GpuSample.objects.values_list("util_gpu", flat=True)) == {60.0}
    assert GpuRollup.objects.filter(step_s=300, bucket=T0).get().util_gpu_avg == 50.0


def test_deletes_in_batches_of_the_configured_size(world, settings):
    gpu_samples(world.gpu_1, NOW - timedelta(days=20), 25, util_gpu=1.0)
    rolled_up_until(NOW)
    settings.TELEMETRY_PRUNE_BATCH = 10

    with CaptureQueriesContext(connection) as queries:
        deleted = prune_samples(now=NOW)

    gpu_deletes = [q["sql"] for q in queries if q["sql"].startswith("DELETE") and "gpusample" in q["sql"]
                   and "vgpusample" not in q["sql"]]
    assert deleted["gpu_samples"] == 25
    assert len(gpu_deletes) == 3  # 10 + 10 + 5 rows, each statement committed on its own
    assert all("LIMIT 10" in sql for sql in gpu_deletes)
    assert GpuSample.objects.count() == 0


def test_max_batches_bounds_one_run(world):
    gpu_samples(world.gpu_1, NOW - timedelta(days=20), 25, util_gpu=1.0)
    rolled_up_until(NOW)

    assert prune_samples(now=NOW, batch_size=10, max_batches=1)["gpu_samples"] == 10
    assert GpuSample.objects.count() == 15
    assert prune_samples(now=NOW, batch_size=10)["gpu_samples"] == 15


def test_task_prunes_and_is_safe_twice(world):
    gpu_samples(world.gpu_1, T0, 5, util_gpu=1.0)  # T0 is long past 14 days ago
    VmRollup.objects.create(vm=world.vm_ana, step_s=300, bucket=T0 - timedelta(days=400), samples=1)
    rolled_up_until(T0 + timedelta(days=1))

    first = prune_samples_task.apply().get()
    second = prune_samples_task.apply().get()

    assert first["gpu_samples"] == 5
    assert first["vm_rollups_300"] == 1
    assert not any(second.values())
    assert GpuSample.objects.count() == 0

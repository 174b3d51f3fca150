"""Samples that name a GPU or VM deleted meanwhile: the sample tables keep no database foreign keys
(telemetry.models.SAMPLE_REFERENCE), so a poll mapped just before an admin deleted a GPU or a VM and
committed just after leaves rows naming it. Every reader of samples must take them in its stride:
no error, nothing shown or rolled up for the entity that is gone, everything else as before."""

from datetime import timedelta

import pytest
from django.utils import timezone

from alerts.evaluate import evaluate
from dashboard.overview import load_overview
from fleet.models import Gpu, VirtualMachine
from fleet.tests.factories import GpuFactory, HostFactory, VirtualMachineFactory, gpu_model
from hypervisors.drift_queries import fleet_drift
from telemetry.models import GpuRollup, GpuSample, VgpuSample, VmRollup
from telemetry.queries import allocation_use, latest_gpu_samples, latest_vgpu_samples
from telemetry.rollups import build_rollups
from telemetry.tests.rollup_world import L40S, gpu_samples, studio, vgpu_samples


@pytest.fixture
def orphans(db):
    """The studio with a minute of samples; then a GPU and a VM deleted by an admin (Django deletes
    their samples with them) and a racing poll's rows naming them stored after the delete."""
    world = studio()
    start = timezone.now().replace(microsecond=0) - timedelta(minutes=12)
    gpu_samples(world.gpu_1, start, 60, util_gpu=40, fb_used_mib=1000, fb_total_mib=49152)
    vgpu_samples(world.vm_bob, world.gpu_2, start, 60, util_gpu=30, fb_used_mib=2000)
    doomed_gpu = GpuFactory(host=HostFactory(name="render-09"), gpu_model=gpu_model(L40S),
                            pci_bus_id="00000000:3B:00.0", uuid="GPU-dead-0001")
    doomed_vm = VirtualMachineFactory(name="ws-gone")
    gone_gpu, gone_vm = doomed_gpu.pk, doomed_vm.pk
    doomed_gpu.delete()
    doomed_vm.delete()
    GpuSample.objects.bulk_create(GpuSample(gpu_id=gone_gpu, ts=start + timedelta(seconds=10 * i), util_gpu=99,
                                            fb_used_mib=40000, fb_total_mib=49152) for i in range(60))
    VgpuSample.objects.bulk_create(VgpuSample(vm_id=gone_vm, gpu_id=gone_gpu, ts=start + timedelta(seconds=10 * i),
                                              util_gpu=99, fb_used_mib=11000) for i in range(60))
    VgpuSample.objects.bulk_create(VgpuSample(vm_id=gone_vm, gpu_id=world.gpu_1.pk,
                                              ts=start + timedelta(seconds=10 * i), util_gpu=99, fb_used_mib=11000)
                                   for i in range(60))
    world.gone_gpu, world.gone_vm, world.start = gone_gpu, gone_vm, start
    return world


def test_the_racing_polls_rows_are_stored_without_a_foreign_key_refusing_them(orphans):
    assert not Gpu.objects.filter(pk=orphans.gone_gpu).exists()
    assert not VirtualMachine.objects.filter(pk=orphans.gone_vm).exists()
    assert GpuSample.objects.filter(gpu_id=orphans.gone_gpu).count() == 60
    assert VgpuSample.objects.filter(vm_id=orphans.gone_vm).count() == 120


def test_rollups_are_built_for_the_fleet_and_none_for_what_is_gone(orphans):
    for step_s in (300, 3600):
        build_rollups(step_s, now=orphans.start + timedelta(hours=2))
    assert GpuRollup.objects.filter(gpu=orphans.gpu_1).exists()
    assert VmRollup.objects.filter(vm=orphans.vm_bob).exists()
    assert not GpuRollup.objects.filter(gpu_id=orphans.gone_gpu).exists()
    assert not VmRollup.objects.filter(vm_id=orphans.gone_vm).exists()


def test_latest_readings_name_only_existing_gpus_and_vms(orphans):
    since = orphans.start
    assert set(latest_gpu_samples(since=since)) == {orphans.gpu_1.pk}
    assert set(latest_vgpu_samples(since=since)) == {(orphans.vm_bob.pk, orphans.gpu_2.pk)}
    rows, _ = allocation_use(since, 50)
    assert all(row.get("vm_id") != orphans.gone_vm for row in rows)


def test_overview_drift_and_alerts_run_and_speak_only_of_the_fleet(orphans):
    overview = load_overview(timezone.now())
    assert overview is not None
    drifts = fleet_drift()
    assert not [d for d in drifts if str(orphans.gone_gpu) in repr(d) and "GPU-dead" in repr(d)]
    outcome = evaluate(timezone.now())
    assert outcome is not None


def test_the_heatmap_lists_only_existing_gpus(orphans, admin_api):
    for step_s in (300, 3600):
        build_rollups(step_s, now=orphans.start + timedelta(hours=2))
    response = admin_api.get("/api/v1/heatmap/", {"start": orphans.start.isoformat(),
                                                   "end": (orphans.start + timedelta(hours=1)).isoformat()})
    assert response.status_code == 200, response.content
    assert "GPU-dead" not in response.content.decode()

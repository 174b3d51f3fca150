"""Storing reports sees the inventory as it is at each batch: an admin's change between two
batches of one worker (a GPU added or moved, a VM renamed, a vGPU placed or removed, a model
renamed) counts from the very next batch, on both database backends.

These guard the ingest's lookups against staleness: whatever they read or keep per process,
the second batch below must map like a fresh process would.
"""

from __future__ import annotations

import time

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from fleet import services
from fleet.models import VirtualMachine
from fleet.tests.factories import GpuFactory, profile
from telemetry import inventory_cache
from telemetry.ingest import store_reports
from telemetry.models import Drift, DriftKind, GpuSample, VgpuSample
from telemetry.tests.ingest_world import T0, gpu_reading, l40s_world, report, vgpu_reading

pytestmark = pytest.mark.django_db


@pytest.fixture
def world():
    return l40s_world()


def _batch(world, gpus, at: float):
    return store_reports([(world.agent, report("render-01", gpus, at))], received_at=at)


def _open(kind: str) -> list[Drift]:
    return list(Drift.objects.filter(kind=kind, resolved_at__isnull=True))


def test_a_gpu_the_admin_adds_between_batches_is_not_discovered_again(world):
    new_uuid = "GPU-3f7c6d85-bc41-4a9e-8d3a-8e5a4b6f7c93"
    _batch(world, [gpu_reading(world.gpu.uuid)], T0)

    declared = GpuFactory(host=world.host, gpu_model=world.model, pci_bus_id="00000000:81:00.0", uuid=new_uuid)
    stats = _batch(world, [gpu_reading(world.gpu.uuid), gpu_reading(new_uuid, index=1,
                                                                     pci_bus_id="00000000:81:00.0")], T0 + 10)

    assert (stats.discovered_gpus, stats.drifts) == (0, 0)
    assert GpuSample.objects.filter(gpu=declared).count() == 1


def test_a_gpu_moved_away_between_batches_is_reported_elsewhere_at_once(world):
    spare = GpuFactory(host=world.host, gpu_model=world.model, pci_bus_id="00000000:81:00.0",
                       uuid="GPU-4a8d7e96-cd52-4bf0-9e4b-9f6b5c7a8da4")
    assert _batch(world, [gpu_reading(spare.uuid)], T0).drifts == 0

    services.update_gpu(spare, host=world.other_host)
    stats = _batch(world, [gpu_reading(spare.uuid)], T0 + 10)

    (drift,) = _open(DriftKind.GPU_ELSEWHERE)
    assert drift.subject == spare.uuid
    assert "is on host render-02 in the inventory but is reported by agent agent-render-01 of host render-01" in \
        drift.detail
    # render-02's series is not render-01's agent's to write: only the sample from before the move.
    assert (stats.gpu_samples, GpuSample.objects.filter(gpu=spare).count()) == (0, 1)

    # Moved back: the next batch resolves it.
    services.update_gpu(spare, host=world.host)
    assert _batch(world, [gpu_reading(spare.uuid)], T0 + 20).resolved_drifts == 1


def test_a_vm_renamed_between_batches_is_found_by_its_new_name_only(world):
    by_name = lambda name: [gpu_reading(world.gpu_2.uuid, vgpus=[  # noqa: E731
        vgpu_reading(None, name, type_name="NVIDIA L40S-4Q")])]
    assert _batch(world, by_name("ws-layout-02"), T0).vgpu_samples == 1

    services.update_vm(world.layout, name="ws-layout-07")
    old_name = _batch(world, by_name("ws-layout-02"), T0 + 10)
    (drift,) = _open(DriftKind.UNKNOWN_VM)
    new_name = _batch(world, by_name("ws-layout-07"), T0 + 20)

    assert (old_name.vgpu_samples, drift.subject) == (0, "ws-layout-02")
    assert (new_name.vgpu_samples, new_name.resolved_drifts) == (1, 1)
    assert VgpuSample.objects.filter(vm=world.layout).count() == 2


def test_a_renamed_vm_reported_by_uuid_names_its_drift_by_the_new_name(world):
    running = [gpu_reading(world.gpu.uuid, vgpus=[vgpu_reading(str(world.idle.uuid), "ws-idle-03")])]
    _batch(world, running, T0)
    assert [d.subject for d in _open(DriftKind.VGPU_MISSING)] == [f"ws-idle-03 on {world.gpu.uuid}"]

    services.update_vm(world.idle, name="ws-idle-04")
    _batch(world, running, T0 + 10)

    assert [d.subject for d in _open(DriftKind.VGPU_MISSING)] == [f"ws-idle-04 on {world.gpu.uuid}"]


def test_a_vgpu_placed_or_removed_between_batches_changes_the_mapping_at_once(world):
    running = [gpu_reading(world.gpu.uuid, vgpus=[vgpu_reading(str(world.idle.uuid), "ws-idle-03")])]
    _batch(world, running, T0)
    assert len(_open(DriftKind.VGPU_MISSING)) == 1

    placed = services.place_vgpu(world.idle, world.gpu, profile("L40S-12Q"))
    stats = _batch(world, running, T0 + 10)
    assert (stats.drifts, stats.resolved_drifts) == (0, 1)
    # Placed nowhere, the VM was no host's to write; placed on render-01, its agent writes it.
    assert VgpuSample.objects.get(vm=world.idle).vgpu == placed

    services.remove_vgpu(placed)
    _batch(world, running, T0 + 20)
    assert len(_open(DriftKind.VGPU_MISSING)) == 1


def test_a_model_renamed_between_batches_is_compared_by_its_new_name(world):
    _batch(world, [gpu_reading(world.gpu.uuid)], T0)

    world.model.name = "NVIDIA L40S Rev B"
    world.model.save()
    _batch(world, [gpu_reading(world.gpu.uuid)], T0 + 10)

    (drift,) = _open(DriftKind.GPU_MODEL)
    assert drift.detail.endswith("reports itself as NVIDIA L40S; the inventory says NVIDIA L40S Rev B.")


def _inventory_reads(queries) -> list[str]:
    tables = ("fleet_gpu", "fleet_virtualmachine", "fleet_vgpu")
    return [q["sql"] for q in queries.captured_queries
            if any(f"FROM {table}" in q["sql"].replace('"', "") for table in tables)]


@pytest.mark.skipif(connection.vendor != "postgresql", reason="the collector's copy of the inventory is PostgreSQL's")
def test_a_batch_after_an_unchanged_inventory_reads_none_of_it(world):
    lighting = vgpu_reading(str(world.lighting.uuid), "ws-lighting-01")
    _batch(world, [gpu_reading(world.gpu.uuid, vgpus=[lighting])], T0)

    with CaptureQueriesContext(connection) as queries:
        stats = _batch(world, [gpu_reading(world.gpu.uuid, vgpus=[lighting])], T0 + 10)

    assert (stats.gpu_samples, stats.vgpu_samples) == (1, 1)
    assert _inventory_reads(queries) == []

    # Any write to an inventory table, by any code going through Django, drops the copy.
    VirtualMachine.objects.filter(pk=world.layout.pk).update(name="ws-layout-renamed")
    with CaptureQueriesContext(connection) as queries:
        _batch(world, [gpu_reading(world.gpu.uuid, vgpus=[lighting])], T0 + 20)
    assert _inventory_reads(queries) != []


@pytest.mark.skipif(connection.vendor != "postgresql", reason="the collector's copy of the inventory is PostgreSQL's")
def test_the_copy_is_read_again_after_its_age_limit_for_changes_made_outside_django(world, settings):
    lighting = vgpu_reading(str(world.lighting.uuid), "ws-lighting-01")
    _batch(world, [gpu_reading(world.gpu.uuid, vgpus=[lighting])], T0)
    # SQL by hand, as psql would run it: no version moves.
    with connection.connection.cursor() as cursor:
        cursor.execute("UPDATE fleet_virtualmachine SET uuid = %s WHERE id = %s",
                       ["0b6d9c4e-1f2a-4b3c-8d4e-5f6a7b8c9d0e", world.lighting.pk])
    settings.TELEMETRY_INVENTORY_CACHE_MAX_AGE_S = 0.05
    time.sleep(0.1)

    stats = _batch(world, [gpu_reading(world.gpu.uuid, vgpus=[lighting])], T0 + 10)

    assert stats.vgpu_samples == 0, "the VM's UUID changed: its old UUID maps no more"
    assert _open(DriftKind.VM_UUID_MISMATCH)


def test_with_the_read_cache_off_every_batch_reads_the_inventory(world, settings):
    settings.READ_CACHE_ENABLED = False
    lighting = vgpu_reading(str(world.lighting.uuid), "ws-lighting-01")
    _batch(world, [gpu_reading(world.gpu.uuid, vgpus=[lighting])], T0)

    with CaptureQueriesContext(connection) as queries:
        stats = _batch(world, [gpu_reading(world.gpu.uuid, vgpus=[lighting])], T0 + 10)

    assert stats.vgpu_samples == 1
    assert _inventory_reads(queries) != []
    assert inventory_cache.CACHE.rows() == 0

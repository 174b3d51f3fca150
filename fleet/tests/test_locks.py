"""`fleet.locks`: the one order rows are locked in, and the writers that keep to it.

The races themselves are in test_lock_order.py; here each writer's row locks are recorded
(`lock_race.record_locks`) on a fleet laid out so that any other order would show: ids that
run against the host order, a move to another host, several VMs at once.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from django.conf import settings
from django.db import connection
from django.test.utils import CaptureQueriesContext

from fleet import locks, services
from fleet import requests as service
from fleet.choices import ResizeStatus
from fleet.locks import FleetConflict
from fleet.models import Gpu, Host, Vgpu, VirtualMachine
from fleet.tests.factories import GpuFactory, HostFactory, VirtualMachineFactory, profile
from fleet.tests.lock_race import assert_lock_order, record_locks

pytestmark = pytest.mark.django_db


def test_every_row_lock_of_the_product_is_taken_through_fleet_locks():
    """The order lives in one place: a SELECT ... FOR UPDATE written anywhere else could take
    rows in another order and bring the deadlocks back."""
    root = Path(settings.BASE_DIR)
    sources = [p for p in root.rglob("*.py") if ".venv" not in p.parts and "tests" not in p.parts]
    offenders = [str(p.relative_to(root)) for p in sources
                 if "select_for_update" in p.read_text() and p != root / "fleet" / "locks.py"]
    assert offenders == []


def test_groups_are_locked_host_gpu_vm_vgpu_request_each_by_ascending_id(admin_user):
    host_b, host_a = HostFactory(name="b"), HostFactory(name="a")
    gpus = [GpuFactory(host=host_a), GpuFactory(host=host_b)]
    vgpu = services.place_vgpu(VirtualMachineFactory(), gpus[1], profile("RTX6000-12Q"))
    request = service.file_request(vgpu.vm, admin_user, profile("RTX6000-24Q"), 1, "more")
    with CaptureQueriesContext(connection) as queries:
        locked = locks.lock_for_change(requests=[request], vgpus=[vgpu], vms=[vgpu.vm_id], gpus=reversed(gpus),
                                       hosts=[host_a, host_b.pk, None])
    tables = [re.search(r'FROM "(\w+)"', q["sql"]).group(1) for q in queries.captured_queries]
    assert tables == ["fleet_host", "fleet_gpu", "fleet_virtualmachine", "fleet_vgpu", "fleet_resizerequest"]
    assert all('ORDER BY "fleet_' in q["sql"] for q in queries.captured_queries)
    assert list(locked.hosts) == sorted([host_a.pk, host_b.pk])
    assert set(locked.gpus) == {g.pk for g in gpus}


def test_a_row_deleted_before_its_lock_is_a_conflict_naming_it():
    host = HostFactory(name="render-07")
    gpu = GpuFactory(host=host, pci_bus_id="00000000:AF:00.0")
    Gpu.objects.filter(pk=gpu.pk).delete()
    with pytest.raises(FleetConflict) as conflict:
        locks.lock_for_change(hosts=[host], gpus=[gpu])
    assert str(conflict.value) == "GPU 00000000:AF:00.0 was deleted meanwhile; reload and try again."


@pytest.fixture
def crossed(admin_user):
    """Hosts whose ids run against their GPUs' and VMs': host-2 (lower id) holds the later GPU.
    ws-x (12Q) shares the first GPU of host-1 with ws-y (12Q); host-2's GPU is empty."""
    host_2, host_1 = HostFactory(name="host-2"), HostFactory(name="host-1")
    gpu_1 = GpuFactory(host=host_1)
    gpu_2 = GpuFactory(host=host_2)
    q12 = profile("RTX6000-12Q")
    vm_y, vm_x = VirtualMachineFactory(name="ws-y"), VirtualMachineFactory(name="ws-x")
    services.place_vgpu(vm_x, gpu_1, q12)
    services.place_vgpu(vm_y, gpu_1, q12)
    return host_1, host_2, gpu_1, gpu_2, vm_x, vm_y


def test_an_approval_moving_a_vm_to_another_host_locks_in_order(crossed, admin_user, monkeypatch):
    *_, gpu_2, vm_x, _ = crossed
    request = service.file_request(vm_x, admin_user, profile("RTX6000-24Q"), 1, "bigger")
    calls = record_locks(monkeypatch)
    service.approve(request, admin_user)
    assert Vgpu.objects.get(vm=vm_x).gpu == gpu_2
    assert_lock_order(calls)
    assert {model for model, _ in calls} >= {Host, Gpu, VirtualMachine, Vgpu}


def test_the_dry_run_of_the_request_queue_locks_in_order(crossed, admin_user, monkeypatch):
    *_, vm_x, _ = crossed
    request = service.file_request(vm_x, admin_user, profile("RTX6000-24Q"), 1, "bigger")
    calls = record_locks(monkeypatch)
    assert service.fits(request).where == "other_host"
    assert_lock_order(calls)
    assert request.status == ResizeStatus.PENDING


def test_removing_vgpus_of_vms_on_two_hosts_locks_in_order(crossed, monkeypatch):
    host_1, host_2, _, gpu_2, vm_x, vm_y = crossed
    services.place_vgpu(VirtualMachineFactory(name="ws-z"), gpu_2, profile("RTX6000-12Q"))
    calls = record_locks(monkeypatch)
    services.remove_vgpus(Vgpu.objects.order_by("-pk"))
    assert_lock_order(calls)
    assert not VirtualMachine.objects.filter(host__isnull=False).exists()


def test_deleting_a_vm_locks_it_before_what_hangs_off_it(crossed, admin_user, monkeypatch):
    *_, vm_x, _ = crossed
    service.file_request(vm_x, admin_user, profile("RTX6000-24Q"), 1, "bigger")
    calls, pk = record_locks(monkeypatch), vm_x.pk
    services.delete_inventory([vm_x])
    assert calls == [(VirtualMachine, [pk])]
    assert not VirtualMachine.objects.filter(pk=pk).exists()

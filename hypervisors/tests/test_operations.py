"""Operations on a simulated hypervisor: an approval on a linked host is carried out on the host,
step by step, and a failure at any step puts the host and the inventory back as they were.

The hypervisor is the real simulated backend (a JSON state file another process could share);
each check reads it through a fresh link, as an admin looking at the host would.
"""

from __future__ import annotations

from datetime import timedelta

import pytest
import time_machine
from django.utils import timezone

from fleet import requests as service
from fleet import services
from fleet.choices import ResizeStatus
from fleet.locks import FleetConflict
from fleet.models import AuditEvent, Notification, ResizeRequest, Vgpu
from fleet.tests.factories import GpuFactory, HostFactory, VirtualMachineFactory, profile
from hypervisors import operations
from hypervisors.backends import sim
from hypervisors.backends.base import PowerState
from hypervisors.choices import OperationStatus, StepStatus
from hypervisors.models import Operation, OperationClaim
from hypervisors.tests.fixtures import BUS_A, BUS_B, L40S_TYPES
from hypervisors.tests.worlds import OLD_DEVICE, host_view

pytestmark = pytest.mark.django_db

def approve(world, **options) -> Operation:
    approved = service.approve(world.request, world.admin, "go", **options)
    assert approved.status == ResizeStatus.APPLYING
    return Operation.objects.get(request=world.request)


def the_domain(world):
    return host_view().domain(str(world.vm.uuid))


def assert_as_before(world, done: Operation, because: str) -> None:
    """Rolled back: the VM runs with its old device on the host, the inventory holds its old
    vGPU, and the request failed with the reason."""
    assert done.status == OperationStatus.ROLLED_BACK
    assert because in done.error
    domain = the_domain(world)
    assert (domain.state, [d.id for d in domain.vgpus]) == (PowerState.RUNNING, [OLD_DEVICE])
    vgpu = Vgpu.objects.get(vm=world.vm)
    assert (vgpu.profile.name, vgpu.gpu_id, vgpu.device_id) == ("L40S-24Q", world.gpu_a.pk, OLD_DEVICE)
    failed = ResizeRequest.objects.get(pk=world.request.pk)
    assert failed.status == ResizeStatus.FAILED
    assert because in failed.last_error


def test_an_approval_on_a_linked_host_becomes_an_operation_that_replaces_the_vgpu_on_the_host(ana_linked):
    operation = approve(ana_linked, run_now=True)
    assert [s.kind for s in operation.steps.order_by("index")] == [
        "notify", "shutdown", "remove_vgpu", "create_vgpu", "redefine", "start", "verify"]
    # The artist is told at approval that it is being applied, not that it is done.
    told = Notification.objects.filter(user=ana_linked.artist.user).order_by("pk").last().message
    assert "being applied now" in told

    done = operations.run(operation.pk)

    assert done.status == OperationStatus.SUCCEEDED, done.error
    domain = the_domain(ana_linked)
    assert domain.state == PowerState.RUNNING
    assert [d.type_name for d in domain.vgpus] == ["NVIDIA L40S-12Q"]
    assert OLD_DEVICE not in {d.id for d in host_view().vgpu_devices()}
    # The inventory names the device the host now has; the request is approved; the artist knows.
    vgpu = Vgpu.objects.get(vm=ana_linked.vm)
    assert (vgpu.profile.name, vgpu.device_id) == ("L40S-12Q", domain.vgpus[0].id)
    assert ResizeRequest.objects.get(pk=ana_linked.request.pk).status == ResizeStatus.APPROVED
    told = Notification.objects.filter(user=ana_linked.artist.user).order_by("pk").last().message
    assert "the change is applied" in told
    assert not OperationClaim.objects.filter(active=True).exists()
    # Every step left an audit event.
    actions = set(AuditEvent.objects.filter(object_type="operation").values_list("action", flat=True))
    assert {"operation.create", "operation.shutdown", "operation.create_vgpu", "operation.start",
            "operation.verify", "operation.succeeded"} <= actions


def test_a_guest_that_does_not_power_off_leaves_everything_as_it_was_and_the_request_failed(ana_linked, settings):
    settings.HYPERVISOR_SHUTDOWN_TIMEOUT_S = 0.3
    host_view().set_ignore_acpi(str(ana_linked.vm.uuid))
    operation = approve(ana_linked, run_now=True)

    done = operations.run(operation.pk)

    assert_as_before(ana_linked, done, "did not power off within 0.3 s")
    assert done.steps.get(kind="shutdown").status == StepStatus.FAILED
    assert "could not be applied and was rolled back" in Notification.objects.filter(
        user=ana_linked.artist.user).order_by("pk").last().message


def test_a_gpu_that_cannot_take_the_new_vgpu_rolls_back_to_the_old_device_and_definition(ana_linked):
    # The host's driver allows no L40S-12Q on either GPU now (as a host full of others would).
    state = host_view()._read()
    for gpu in state["gpus"]:
        for vtype in gpu["types"]:
            if vtype["name"] == "NVIDIA L40S-12Q":
                vtype["max_instances"] = 0
    host_view().seed(state)
    operation = approve(ana_linked, run_now=True)

    done = operations.run(operation.pk)

    assert_as_before(ana_linked, done, "cannot take another NVIDIA L40S-12Q")
    assert [d.type_name for d in host_view().vgpu_devices()] == ["NVIDIA L40S-24Q"]


def test_a_run_cut_short_is_resumed_to_the_same_end_without_making_a_device_twice(ana_linked, settings):
    operation = approve(ana_linked, run_now=True)
    # A worker took it and got as far as creating the new vGPU, then died (no heartbeat since).
    taken = operations._take(operation.pk, timezone.now())
    current = operations.Run(taken, operations.backend_for(ana_linked.host), operations.backend_for(ana_linked.host))
    for step in taken.steps.order_by("index")[:4]:
        operations._do(current, step)
    created = taken.steps.get(kind="create_vgpu").result["device"]["id"]
    Operation.objects.filter(pk=operation.pk).update(heartbeat_at=timezone.now() - timedelta(hours=1))
    # The half-done step is run again too: a step marked running when the worker died.
    taken.steps.filter(kind="create_vgpu").update(status=StepStatus.RUNNING)

    assert operation.pk in operations.resume_due()
    done = operations.run(operation.pk)

    assert done.status == OperationStatus.SUCCEEDED, done.error
    assert [d.id for d in the_domain(ana_linked).vgpus] == [created]
    assert [d.id for d in host_view().vgpu_devices()] == [created]


def test_a_run_with_a_live_worker_is_not_taken_by_another(ana_linked):
    operation = approve(ana_linked, run_now=True)
    Operation.objects.filter(pk=operation.pk).update(status=OperationStatus.RUNNING, heartbeat_at=timezone.now())
    assert operations.run(operation.pk) is None
    assert operation.pk not in operations.resume_due()


def test_an_unreachable_hypervisor_holds_the_operation_until_it_answers(ana_linked, sim_dir, settings):
    settings.HYPERVISOR_RETRY_S = 0
    operation = approve(ana_linked, run_now=True)
    state_file = sim_dir / "node-01.json"
    hidden = state_file.with_suffix(".away")
    state_file.rename(hidden)

    held = operations.run(operation.pk)

    assert held.status == OperationStatus.RUNNING
    assert "unreachable" in held.error
    assert ResizeRequest.objects.get(pk=ana_linked.request.pk).status == ResizeStatus.APPLYING
    hidden.rename(state_file)
    assert operation.pk in operations.resume_due()
    assert operations.run(operation.pk).status == OperationStatus.SUCCEEDED


def test_a_second_approval_touching_a_gpu_under_an_operation_is_refused_whole(ana_linked):
    approve(ana_linked, run_now=False)
    other = VirtualMachineFactory(name="ws-bob", vcpus=4, ram_gib=16)
    services.place_vgpu(other, ana_linked.gpu_b, profile("L40S-24Q"))
    asked = service.file_request(other, ana_linked.admin, profile("L40S-12Q"), 1, "smaller")
    # The cheapest fit for ws-bob is GPU A, which the first operation holds.
    with pytest.raises(FleetConflict, match="is being changed by operation #"):
        service.approve(asked, ana_linked.admin, "")
    assert ResizeRequest.objects.get(pk=asked.pk).status == ResizeStatus.PENDING
    assert Vgpu.objects.get(vm=other).profile.name == "L40S-24Q"


def approve_in_window(world, start, hours: float) -> Operation:
    """Approve the request after the artist asked for the window from `start`, `hours` long."""
    ResizeRequest.objects.filter(pk=world.request.pk).update(wished_from=start,
                                                             wished_until=start + timedelta(hours=hours))
    world.request.refresh_from_db()
    return approve(world)


def test_an_operation_waits_for_the_wished_window_or_an_admins_run_now(ana_linked):
    start = timezone.now() + timedelta(hours=3)
    operation = approve_in_window(ana_linked, start, 2)
    assert operation.not_before == start
    assert operations.run(operation.pk) is None  # not yet
    assert operations.resume_due() == []
    with time_machine.travel(start + timedelta(minutes=1)):
        assert operations.resume_due() == [operation.pk]
        assert operations.run(operation.pk).status == OperationStatus.SUCCEEDED


def test_run_now_starts_a_waiting_operation_and_is_refused_once_it_ended(ana_linked):
    operation = approve(ana_linked)
    assert operations.resume_due() == []
    operations.run_now(operation, ana_linked.admin)
    assert operations.resume_due() == [operation.pk]
    operations.run(operation.pk)
    with pytest.raises(FleetConflict, match="is succeeded already"):
        operations.run_now(operation, ana_linked.admin)


def test_an_unlinked_host_is_approved_and_applied_at_once_as_before(ana_linked):
    ana_linked.host.hypervisor_uri = ""
    ana_linked.host.save()
    approved = service.approve(ana_linked.request, ana_linked.admin, "")
    assert approved.status == ResizeStatus.APPROVED
    assert not Operation.objects.exists()


def test_a_window_that_closed_unused_waits_for_an_admin_instead_of_running_late(ana_linked):
    start = timezone.now() + timedelta(hours=1)
    operation = approve_in_window(ana_linked, start, 1)
    with time_machine.travel(start + timedelta(hours=2)):  # no worker ran it in time
        assert operations.resume_due() == []
        assert operations.run(operation.pk) is None
        operations.run_now(operation, ana_linked.admin)
        assert operations.run(operation.pk).status == OperationStatus.SUCCEEDED


def test_a_cancelled_operation_gives_the_vm_its_vgpu_back_and_tells_the_artist_why(ana_linked):
    operation = approve(ana_linked)
    assert Vgpu.objects.get(vm=ana_linked.vm).profile.name == "L40S-12Q"  # reserved at approval

    operations.cancel(operation, ana_linked.admin, "the render deadline moved")

    operation.refresh_from_db()
    assert operation.status == OperationStatus.ROLLED_BACK
    assert operation.error == "Cancelled by it-admin before it started: the render deadline moved"
    assert (Vgpu.objects.get(vm=ana_linked.vm).profile.name, the_domain(ana_linked).vgpus[0].id) == (
        "L40S-24Q", OLD_DEVICE)
    failed = ResizeRequest.objects.get(pk=ana_linked.request.pk)
    assert failed.status == ResizeStatus.FAILED
    assert failed.last_error in operation.error
    assert "the render deadline moved" in Notification.objects.filter(
        user=ana_linked.artist.user).order_by("pk").last().message
    assert not OperationClaim.objects.filter(active=True).exists()
    assert operations.run(operation.pk) is None
    with pytest.raises(FleetConflict, match="only a pending operation can be cancelled"):
        operations.cancel(operation, ana_linked.admin)


def test_a_change_that_moves_the_vm_to_another_host_goes_there_cold_with_its_new_vgpu(ana_linked):
    # node-01 has no room for a 12Q once ws-ana's 24Q is gone (GPU A keeps another 24Q, GPU B a
    # 48Q); node-02, linked too, has an empty L40S.
    state = host_view()._read()
    sim.add_device(state, BUS_B, "NVIDIA L40S-48Q")
    sim.add_device(state, BUS_A, "NVIDIA L40S-24Q")
    host_view().seed(state)
    for gpu, name in ((ana_linked.gpu_a, "L40S-24Q"), (ana_linked.gpu_b, "L40S-48Q")):
        services.place_vgpu(VirtualMachineFactory(vcpus=2, ram_gib=8), gpu, profile(name))
    node_02 = HostFactory(name="node-02", hypervisor_uri="sim://node-02")
    gpu_c = GpuFactory(host=node_02, gpu_model=ana_linked.gpu_a.gpu_model, pci_bus_id=BUS_A)
    other = sim.empty_state("node-02")
    sim.add_gpu(other, BUS_A, "NVIDIA L40S", L40S_TYPES)
    host_view("node-02").seed(other)

    operation = approve(ana_linked, run_now=True)
    assert (operation.host, operation.target_host) == (ana_linked.host, node_02)
    assert [s.kind for s in operation.steps.order_by("index")] == [
        "notify", "shutdown", "remove_vgpu", "move_domain", "create_vgpu", "redefine", "start", "verify"]
    done = operations.run(operation.pk)

    assert done.status == OperationStatus.SUCCEEDED, done.error
    moved = host_view("node-02").domain(str(ana_linked.vm.uuid))
    assert (moved.state, [(d.gpu_bus_id, d.type_name) for d in moved.vgpus]) == (
        PowerState.RUNNING, [(BUS_A, "NVIDIA L40S-12Q")])
    assert str(ana_linked.vm.uuid) not in {d.uuid for d in host_view().list_domains()}
    assert OLD_DEVICE not in {d.id for d in host_view().vgpu_devices()}
    vgpu = Vgpu.objects.select_related("vm").get(vm=ana_linked.vm)
    assert (vgpu.gpu_id, vgpu.vm.host_id, vgpu.device_id) == (gpu_c.pk, node_02.pk, moved.vgpus[0].id)

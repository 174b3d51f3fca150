"""A change of a VM's vCPUs and RAM on a linked host: approval becomes one operation that shuts
the VM down, redefines it with its own vGPU device and the new size, and starts it; with a
vGPU change besides, the same operation does both; a failure puts the old size back on the
host and in the inventory.

The hypervisor is the real simulated backend, read back through a fresh link."""

from __future__ import annotations

import pytest

from fleet import requests as service
from fleet.choices import ResizeStatus
from fleet.models import AuditEvent, ResizeRequest, Vgpu, VirtualMachine
from fleet.tests.factories import profile
from hypervisors import operations
from hypervisors.backends.base import PowerState
from hypervisors.choices import OperationStatus
from hypervisors.models import Operation, OperationClaim
from hypervisors.tests.worlds import OLD_DEVICE, host_view

pytestmark = pytest.mark.django_db


def _refile(world, profile_=None, vgpus=None, **size) -> ResizeRequest:
    """Ana's request of the world withdrawn, and this one filed instead."""
    service.cancel(world.request, world.artist.user)
    return service.file_request(world.vm, world.artist.user, profile_, vgpus, "longer sims", **size)


def _approve(world, request) -> Operation:
    approved = service.approve(request, world.admin, "go", run_now=True)
    assert approved.status == ResizeStatus.APPLYING
    return Operation.objects.get(request=request)


def test_a_size_change_alone_redefines_the_vm_with_its_own_device_and_the_new_size(ana_linked):
    request = _refile(ana_linked, requested_vcpus=16, requested_ram_gib=64)
    operation = _approve(ana_linked, request)
    assert [s.kind for s in operation.steps.order_by("index")] == ["notify", "shutdown", "redefine", "start",
                                                                   "verify"]
    assert (operation.before["vcpus"], operation.before["ram_mib"]) == (8, 32 * 1024)
    assert (operation.after["vcpus"], operation.after["ram_mib"]) == (16, 64 * 1024)
    # Its GPU is not held: another VM's change on it may go on meanwhile.
    assert list(OperationClaim.objects.filter(operation=operation).values_list("vm_id", "gpu_id")) == [
        (ana_linked.vm.pk, None)]

    done = operations.run(operation.pk)

    assert done.status == OperationStatus.SUCCEEDED, done.error
    domain = host_view().domain(str(ana_linked.vm.uuid))
    assert (domain.vcpus, domain.ram_mib, domain.state) == (16, 64 * 1024, PowerState.RUNNING)
    assert [d.id for d in domain.vgpus] == [OLD_DEVICE]
    vm = VirtualMachine.objects.get(pk=ana_linked.vm.pk)
    assert (vm.vcpus, vm.ram_gib) == (16, 64)
    vgpu = Vgpu.objects.get(vm=vm)
    assert (vgpu.profile.name, vgpu.gpu_id, vgpu.device_id) == ("L40S-24Q", ana_linked.gpu_a.pk, OLD_DEVICE)
    assert ResizeRequest.objects.get(pk=request.pk).status == ResizeStatus.APPROVED


def test_a_vgpu_and_a_size_change_are_one_operation(ana_linked):
    request = _refile(ana_linked, profile("L40S-12Q"), 1, requested_ram_gib=48)
    operation = _approve(ana_linked, request)
    assert Operation.objects.filter(vm=ana_linked.vm).count() == 1

    done = operations.run(operation.pk)

    assert done.status == OperationStatus.SUCCEEDED, done.error
    domain = host_view().domain(str(ana_linked.vm.uuid))
    assert (domain.vcpus, domain.ram_mib) == (8, 48 * 1024)
    assert [d.type_name for d in domain.vgpus] == ["NVIDIA L40S-12Q"]
    assert VirtualMachine.objects.get(pk=ana_linked.vm.pk).ram_gib == 48


def test_a_failed_size_change_puts_the_old_size_back_on_the_host_and_in_the_inventory(ana_linked, settings):
    settings.HYPERVISOR_SHUTDOWN_TIMEOUT_S = 0.3
    host_view().set_ignore_acpi(str(ana_linked.vm.uuid))
    vgpu_pk = Vgpu.objects.get(vm=ana_linked.vm).pk
    request = _refile(ana_linked, requested_vcpus=4)
    operation = _approve(ana_linked, request)
    assert VirtualMachine.objects.get(pk=ana_linked.vm.pk).vcpus == 4  # reserved in the inventory meanwhile

    done = operations.run(operation.pk)

    assert done.status == OperationStatus.ROLLED_BACK
    domain = host_view().domain(str(ana_linked.vm.uuid))
    assert (domain.vcpus, domain.state, [d.id for d in domain.vgpus]) == (8, PowerState.RUNNING, [OLD_DEVICE])
    vm = VirtualMachine.objects.get(pk=ana_linked.vm.pk)
    assert (vm.vcpus, vm.ram_gib) == (8, 32)
    # The vGPU was never touched: the same row, with its device.
    assert list(Vgpu.objects.filter(vm=vm).values_list("pk", "device_id")) == [(vgpu_pk, OLD_DEVICE)]
    failed = ResizeRequest.objects.get(pk=request.pk)
    assert failed.status == ResizeStatus.FAILED
    back = AuditEvent.objects.filter(action="vm.update", object_id=str(vm.pk)).order_by("pk").last()
    assert (back.before["vcpus"], back.after["vcpus"]) == (4, 8)

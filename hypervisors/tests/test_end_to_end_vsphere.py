"""A resize carried out on VMware vSphere, end to end: the artist files a request through the API,
the admin approves it (run now), the operation runs against a real vCenter simulator (govmomi's
vcsim with T4 vGPU hosts, hypervisors.testing.vcsim), and then vCenter itself shows the VM
running with the new vGPU profile, and the API's inventory says the same. A change of vCPUs and RAM
alone gives the VM its new size and keeps its vGPU device. A guest that does not power off leaves
everything as it was.
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from fleet.choices import ResizeStatus
from fleet.models import ResizeRequest, Vgpu
from fleet.tests.factories import GpuFactory, HostFactory, VirtualMachineFactory, gpu_model, profile
from hypervisors import discovery, matching, operations, services
from hypervisors.backends import open_backend, vsphere
from hypervisors.backends.base import Domain, PowerState
from hypervisors.choices import OperationStatus
from hypervisors.models import Operation
from hypervisors.testing.vcsim import Vcsim
from hypervisors.tests.test_vsphere import GPU_A, GPU_B, T4_PROFILES, admin_session, vgpu_backings, vm_named
from hypervisors.tests.worlds import approve_size_now

pytestmark = pytest.mark.django_db


def esx_world(vcsim, artist, admin_api, vm_name: str, *, name: str = "esx-01",
              esx: str = "DC0_H0") -> SimpleNamespace:
    """`name` (vCenter's host `esx`) linked through the simulator, with its two T4s and every VM
    the host runs in the inventory as vCenter shows them (device ids included); `vm_name` is Ana's."""
    return linked_world(vcsim.uri(esx), vcsim.secret_ref, name, artist, admin_api, vm_name)


def linked_world(uri: str, secret_ref: str, name: str, artist, admin_api, vm_name: str, *,
                 skip: tuple[str, ...] = ()) -> SimpleNamespace:
    """Host `name` linked to the hypervisor at `uri`, with two T4s (GPU_A, GPU_B) and every VM the
    hypervisor shows there in the inventory as it shows them (vCPUs, RAM, vGPUs with their device
    ids), but those named in `skip`; `vm_name` is the artist's (world.vm, its device and profile)."""
    host = HostFactory(name=name, hypervisor_uri=uri, hypervisor_secret_ref=secret_ref)
    gpus = {bus: GpuFactory(host=host, gpu_model=gpu_model("Tesla T4"), pci_bus_id=bus) for bus in (GPU_A, GPU_B)}
    backend = open_backend(uri, secret_ref=secret_ref)
    domains = [d for d in backend.list_domains() if d.name not in skip]
    backend.close()
    world = SimpleNamespace(host=host, gpus=gpus)
    for domain in domains:
        owner = {"artist": artist} if domain.name == vm_name else {}
        if not domain.vgpus:
            owner["host"] = host  # a VM with a vGPU is on the host its vGPU is
        vm = VirtualMachineFactory(name=domain.name, uuid=domain.uuid, vcpus=domain.vcpus,
                                   ram_gib=discovery.ram_gib_of(domain.ram_mib), **owner)
        for device in domain.vgpus:
            held = matching.match_profile(device.type_name, T4_PROFILES)
            place(admin_api, vm, gpus[device.gpu_bus_id], held)
            Vgpu.objects.filter(vm=vm, gpu=gpus[device.gpu_bus_id]).update(device_id=device.id)
            if domain.name == vm_name:
                world.vm, world.device, world.held = vm, device, held
    return world


def place(admin_api, vm, gpu, held: str) -> None:
    response = admin_api.post("/api/v1/vgpus/", {"vm": vm.pk, "gpu": gpu.pk, "profile": profile(held).pk},
                              format="json")
    assert response.status_code == 201, response.content


def approve_now(world, wanted: str, admin_api, artist_api) -> Operation:
    filed = artist_api.post("/api/v1/resize-requests/", {
        "vm": world.vm.pk, "requested_profile": profile(wanted).pk, "requested_vgpus": 1,
        "reason": "the new show needs twice the frame buffer"}, format="json")
    assert filed.status_code == 201, filed.content
    approved = admin_api.post(f"/api/v1/resize-requests/{filed.json()['id']}/approve/",
                              {"comment": "tonight", "run_now": True}, format="json")
    assert approved.status_code == 200, approved.content
    return Operation.objects.get(request_id=filed.json()["id"])


def carry_out_size_change(world, uri: str, secret_ref: str, vcpus: int, ram_gib: int, admin_api,
                          artist_api) -> Domain:
    """The artist asks for `vcpus` and `ram_gib` alone, the admin approves it to run now, and the
    operation runs: it must succeed, the hypervisor (read back through its backend) must show the
    VM running with the new size and the very vGPU devices it had (ids, types, GPUs), and the
    inventory the new size. Returns the VM as the backend reads it after the change."""
    backend = open_backend(uri, secret_ref=secret_ref)
    devices_before = backend.domain(str(world.vm.uuid)).vgpus
    backend.close()

    done = operations.run(approve_size_now(world.vm, vcpus, ram_gib, admin_api, artist_api).pk)

    assert done.status == OperationStatus.SUCCEEDED, done.error
    backend = open_backend(uri, secret_ref=secret_ref)
    domain = backend.domain(str(world.vm.uuid))
    backend.close()
    assert (domain.vcpus, domain.ram_mib, domain.state) == (vcpus, ram_gib * 1024, PowerState.RUNNING)
    assert [(d.id, d.type_name, d.gpu_bus_id) for d in domain.vgpus] == [
        (d.id, d.type_name, d.gpu_bus_id) for d in devices_before]
    vm = admin_api.get(f"/api/v1/vms/{world.vm.pk}/").json()
    assert (vm["vcpus"], vm["ram_gib"]) == (vcpus, ram_gib)
    assert artist_api.get(f"/api/v1/resize-requests/{done.request_id}/").json()["status"] == "approved"
    return domain


def test_a_linked_esx_host_is_checked_and_read_in_step_with_the_inventory(vcsim, artist, admin_api):
    world = esx_world(vcsim, artist, admin_api, "DC0_H0_VM0")
    status = services.check_host(world.host)
    assert status.ok, status.message
    assert (status.hostname, status.uri) == ("DC0_H0", world.host.hypervisor_uri)
    report = services.sync_host(world.host)
    assert report.ok, report.error
    assert {e["name"]: e["kind"] for e in report.diff["entries"]} == {
        "DC0_H0_VM0": "same", "DC0_H0_VM1": "same", "DC0_H0_VM2": "same"}
    [row] = next(e for e in report.diff["entries"] if e["name"] == "DC0_H0_VM0")["vgpus"]
    assert (row["profile"], row["gpu_bus_id"], row["device_id"]) == ("T4-4Q", GPU_A, world.device.id)


def test_an_artists_request_approved_by_an_admin_is_carried_out_on_vsphere(
        vcsim, vcenter_admin, settings, artist, artist_api, admin_api):
    settings.HYPERVISOR_VERIFY_WAIT_S = 0
    world = esx_world(vcsim, artist, admin_api, "DC0_H0_VM0")

    done = operations.run(approve_now(world, "T4-8Q", admin_api, artist_api).pk)

    assert done.status == OperationStatus.SUCCEEDED, done.error
    real = vm_named(vcenter_admin, "DC0_H0_VM0")
    assert real.runtime.powerState == "poweredOn"
    assert vgpu_backings(real) == ["grid_t4-8q"]
    [vgpu] = Vgpu.objects.filter(vm=world.vm)
    assert vgpu.profile.name == "T4-8Q"
    backend = open_backend(vcsim.uri(), secret_ref=vcsim.secret_ref)
    assert [d.id for d in backend.domain(str(world.vm.uuid)).vgpus] == [vgpu.device_id]
    backend.close()
    assert vgpu.device_id != world.device.id
    assert artist_api.get(f"/api/v1/resize-requests/{done.request_id}/").json()["status"] == "approved"


def test_a_change_of_vcpus_and_ram_alone_is_carried_out_on_vsphere_keeping_the_vgpu(
        vcsim, vcenter_admin, settings, artist, artist_api, admin_api):
    settings.HYPERVISOR_VERIFY_WAIT_S = 0
    world = esx_world(vcsim, artist, admin_api, "DC0_H0_VM0")
    assert (world.vm.vcpus, world.vm.ram_gib) == (4, 8)

    domain = carry_out_size_change(world, vcsim.uri(), vcsim.secret_ref, 8, 16, admin_api, artist_api)

    assert [(d.id, d.type_name, d.gpu_bus_id) for d in domain.vgpus] == [(world.device.id, "GRID T4-4Q", GPU_A)]
    real = vm_named(vcenter_admin, "DC0_H0_VM0")
    assert (real.runtime.powerState, vgpu_backings(real)) == ("poweredOn", ["grid_t4-4q"])
    assert (real.config.hardware.numCPU, real.config.hardware.memoryMB) == (8, 16384)
    vgpu = Vgpu.objects.get(vm=world.vm)
    assert (vgpu.profile.name, vgpu.device_id) == ("T4-4Q", world.device.id)


def test_a_guest_that_will_not_power_off_is_left_running_as_it_was(
        vcsim, vcenter_admin, settings, artist, artist_api, admin_api):
    settings.HYPERVISOR_SHUTDOWN_TIMEOUT_S = 0.5
    world = esx_world(vcsim, artist, admin_api, "DC0_H0_VM2")

    done = operations.run(approve_now(world, "T4-4Q", admin_api, artist_api).pk)

    assert done.status == OperationStatus.ROLLED_BACK, done.error
    assert "did not power off within 0.5 s" in done.error
    real = vm_named(vcenter_admin, "DC0_H0_VM2")
    assert (real.runtime.powerState, vgpu_backings(real)) == ("poweredOn", ["grid_t4-8q"])
    vgpu = Vgpu.objects.get(vm=world.vm)
    assert (vgpu.profile.name, vgpu.device_id) == ("T4-8Q", world.device.id)
    assert ResizeRequest.objects.get(pk=done.request_id).status == ResizeStatus.FAILED


def test_a_resize_that_fits_only_on_another_host_moves_the_vm_there(
        vcsim, vcenter_admin, settings, artist, artist_api, admin_api):
    settings.HYPERVISOR_VERIFY_WAIT_S = 0
    world = esx_world(vcsim, artist, admin_api, "DC0_H0_VM0")
    other = esx_world(vcsim, None, admin_api, "", name="esx-02", esx="DC0_C0_H0")
    # A 4Q the inventory keeps on esx-01's first T4 (its second is full): no 8Q fits on esx-01.
    place(admin_api, VirtualMachineFactory(name="ws-render-node", ram_gib=1), world.gpus[GPU_A], "T4-4Q")

    done = operations.run(approve_now(world, "T4-8Q", admin_api, artist_api).pk)

    assert done.status == OperationStatus.SUCCEEDED, done.error
    assert done.target_host == other.host
    real = vm_named(vcenter_admin, "DC0_H0_VM0")
    assert (real.runtime.host.name, real.runtime.powerState, vgpu_backings(real)) == (
        "DC0_C0_H0", "poweredOn", ["grid_t4-8q"])
    [vgpu] = Vgpu.objects.filter(vm=world.vm).select_related("gpu__host")
    assert (vgpu.gpu.host, vgpu.profile.name) == (other.host, "T4-8Q")


def test_a_gpu_that_vsphere_finds_full_gets_the_vm_its_old_vgpu_back(
        vcsim, vcenter_admin, settings, artist, artist_api, admin_api):
    world = esx_world(vcsim, artist, admin_api, "DC0_H0_VM0")
    # The inventory has lost DC0_H0_VM2's 8Q on the second T4 and keeps a 4Q on the first that
    # vCenter does not run: placement chooses the second T4, which vSphere finds full.
    Vgpu.objects.filter(vm__name="DC0_H0_VM2").delete()
    place(admin_api, VirtualMachineFactory(name="ws-render-node", ram_gib=1), world.gpus[GPU_A], "T4-4Q")

    done = operations.run(approve_now(world, "T4-8Q", admin_api, artist_api).pk)

    assert done.status == OperationStatus.ROLLED_BACK, done.error
    assert "cannot take another GRID T4-8Q vGPU now" in done.error
    real = vm_named(vcenter_admin, "DC0_H0_VM0")
    assert (real.runtime.powerState, vgpu_backings(real)) == ("poweredOn", ["grid_t4-4q"])
    backend = open_backend(vcsim.uri(), secret_ref=vcsim.secret_ref)
    assert [d.id for d in backend.domain(str(world.vm.uuid)).vgpus] == [world.device.id]
    backend.close()
    vgpu = Vgpu.objects.get(vm=world.vm)
    assert (vgpu.profile.name, vgpu.device_id) == ("T4-4Q", world.device.id)
    assert ResizeRequest.objects.get(pk=done.request_id).status == ResizeStatus.FAILED


def test_a_start_that_vsphere_never_finishes_puts_the_old_vgpu_back_and_says_to_check_the_vm(
        monkeypatch, vcsim_binary, vcenter_secret, artist, artist_api, admin_api):
    monkeypatch.setattr(vsphere, "TASK_TIMEOUT_S", 0.5)
    with Vcsim(binary=vcsim_binary, hang=("PowerOnVM_Task",)) as server:
        world = esx_world(SimpleNamespace(uri=server.uri, secret_ref=vcenter_secret), artist, admin_api, "DC0_H0_VM0")

        done = operations.run(approve_now(world, "T4-8Q", admin_api, artist_api).pk)

        with admin_session(server) as admin:
            real = vm_named(admin, "DC0_H0_VM0")
            seen = (real.runtime.powerState, vgpu_backings(real))
        backend = open_backend(server.uri(), secret_ref=vcenter_secret)
        device_ids = [d.id for d in backend.domain(str(world.vm.uuid)).vgpus]
        backend.close()
    # The new definition is undone, but the VM cannot be started again: the admin is told so.
    assert done.status == OperationStatus.FAILED, done.error
    assert "did not start DC0_H0_VM0 within 0.5 s" in done.error
    assert "Not all was undone: the hypervisor could not be put back: vSphere" in done.error
    assert done.error.endswith("is still running); check DC0_H0_VM0 by hand.")
    assert seen == ("poweredOff", ["grid_t4-4q"])
    assert device_ids == [world.device.id]
    vgpu = Vgpu.objects.get(vm=world.vm)
    assert (vgpu.profile.name, vgpu.device_id) == ("T4-4Q", world.device.id)
    assert ResizeRequest.objects.get(pk=done.request_id).status == ResizeStatus.FAILED

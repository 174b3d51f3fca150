"""A resize carried out on Proxmox VE, end to end: the artist files a request through the API, the
admin approves it (run now), the operation runs against a Proxmox VE API over real HTTPS (the fake
of hypervisors.testing.pvefake, with T4 vGPU nodes), and then Proxmox VE itself shows the VM
running with the new vGPU type, and the API's inventory says the same, device id included. A
change of vCPUs and RAM alone gives the VM its new size and keeps its vGPU device. A guest that
does not power off, or a GPU Proxmox VE finds full, leaves everything as it was.
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest
from proxmoxer import ProxmoxAPI

from fleet.choices import ResizeStatus
from fleet.models import ResizeRequest, Vgpu, VirtualMachine
from fleet.tests.factories import VirtualMachineFactory
from hypervisors import operations, services
from hypervisors.backends.proxmox import mdev_uuid
from hypervisors.choices import OperationStatus
from hypervisors.testing import pvefake
from hypervisors.testing.pvefake import TYPE_4Q, TYPE_8Q, VM_ANIM, VM_BUILD, VM_LIGHT, VM_MODEL
from hypervisors.tests.test_end_to_end_vsphere import approve_now, carry_out_size_change, linked_world, place
from hypervisors.tests.test_proxmox import GPU_A, GPU_B, hostpci

pytestmark = pytest.mark.django_db


def pve_world(pve, artist, admin_api, vm_name: str, *, name: str = "pve-01", node: str = "pve1",
              skip: tuple[str, ...] = ()) -> SimpleNamespace:
    """`name` (Proxmox VE's node `node`) linked through the fake, with its two T4s and every VM the
    node runs in the inventory as Proxmox VE shows them (device ids included), but those in
    `skip`; `vm_name` is the artist's."""
    return linked_world(pve.uri(node), pve.secret_ref, name, artist, admin_api, vm_name, skip=skip)


def test_a_linked_proxmox_node_is_checked_and_read_in_step_with_the_inventory(pve, artist, admin_api):
    world = pve_world(pve, artist, admin_api, "ws-anim-01")
    status = services.check_host(world.host)
    assert status.ok, status.message
    assert (status.hostname, status.uri) == ("pve1", world.host.hypervisor_uri)
    report = services.sync_host(world.host)
    assert report.ok, report.error
    assert {e["name"]: e["kind"] for e in report.diff["entries"]} == {
        "ws-anim-01": "same", "ws-light-01": "same", "ws-model-01": "same", "build-agent": "same"}
    [row] = next(e for e in report.diff["entries"] if e["name"] == "ws-anim-01")["vgpus"]
    assert (row["profile"], row["gpu_bus_id"], row["device_id"]) == ("T4-4Q", GPU_A, mdev_uuid(VM_ANIM, 0))


def test_an_artists_request_approved_by_an_admin_is_carried_out_on_proxmox(
        pve, settings, artist, artist_api, admin_api):
    settings.HYPERVISOR_VERIFY_WAIT_S = 0
    world = pve_world(pve, artist, admin_api, "ws-anim-01")

    done = operations.run(approve_now(world, "T4-8Q", admin_api, artist_api).pk)

    assert done.status == OperationStatus.SUCCEEDED, done.error
    real = pve.server.vm(VM_ANIM)
    assert real["status"] == "running"
    assert hostpci(pve, VM_ANIM) == {"hostpci0": f"0000:3b:00.0,mdev={TYPE_8Q},pcie=1"}
    [vgpu] = Vgpu.objects.filter(vm=world.vm)
    assert vgpu.profile.name == "T4-8Q"
    # The inventory records the device as Proxmox VE made it at start, which the host agent reads.
    assert [i["uuid"] for i in real["instances"]] == [vgpu.device_id] == [mdev_uuid(VM_ANIM, 0)]
    assert artist_api.get(f"/api/v1/resize-requests/{done.request_id}/").json()["status"] == "approved"


def test_a_change_of_vcpus_and_ram_alone_is_carried_out_on_proxmox_keeping_the_vgpu(
        pve, settings, artist, artist_api, admin_api):
    settings.HYPERVISOR_VERIFY_WAIT_S = 0
    world = pve_world(pve, artist, admin_api, "ws-light-01")
    assert (world.vm.vcpus, world.vm.ram_gib) == (8, 32)

    domain = carry_out_size_change(world, pve.uri(), pve.secret_ref, 4, 16, admin_api, artist_api)

    assert [(d.id, d.type_name, d.gpu_bus_id) for d in domain.vgpus] == [(mdev_uuid(VM_LIGHT, 0), "GRID T4-8Q", GPU_B)]
    real = pve.server.vm(VM_LIGHT)
    assert (real["status"], real["config"]["cores"], real["config"]["memory"]) == ("running", "4", "16384")
    assert hostpci(pve, VM_LIGHT) == {"hostpci0": f"0000:5e:00.0,mdev={TYPE_8Q}"}
    assert [i["uuid"] for i in real["instances"]] == [world.device.id]
    vgpu = Vgpu.objects.get(vm=world.vm)
    assert (vgpu.profile.name, vgpu.device_id) == ("T4-8Q", world.device.id)


def test_a_guest_that_will_not_power_off_is_left_running_as_it_was(pve, settings, artist, artist_api, admin_api):
    settings.HYPERVISOR_SHUTDOWN_TIMEOUT_S = 0.5
    world = pve_world(pve, artist, admin_api, "ws-model-01")

    done = operations.run(approve_now(world, "T4-4Q", admin_api, artist_api).pk)

    assert done.status == OperationStatus.ROLLED_BACK, done.error
    assert "did not power off within 0.5 s" in done.error
    real = pve.server.vm(VM_MODEL)
    assert (real["status"], hostpci(pve, VM_MODEL)) == ("running", {"hostpci0": f"0000:5e:00.0,mdev={TYPE_8Q}"})
    vgpu = Vgpu.objects.get(vm=world.vm)
    assert (vgpu.profile.name, vgpu.device_id) == ("T4-8Q", world.device.id)
    assert ResizeRequest.objects.get(pk=done.request_id).status == ResizeStatus.FAILED


def test_a_resize_that_fits_only_on_another_node_moves_the_vm_there(pve, settings, artist, artist_api, admin_api):
    settings.HYPERVISOR_VERIFY_WAIT_S = 0
    world = pve_world(pve, artist, admin_api, "ws-anim-01")
    other = pve_world(pve, None, admin_api, "", name="pve-02", node="pve2")
    # A 4Q the inventory keeps on pve-01's first T4 (its second is full): no 8Q fits on pve-01.
    place(admin_api, VirtualMachineFactory(name="ws-render-node", ram_gib=1), world.gpus[GPU_A], "T4-4Q")

    done = operations.run(approve_now(world, "T4-8Q", admin_api, artist_api).pk)

    assert done.status == OperationStatus.SUCCEEDED, done.error
    assert done.target_host == other.host
    real = pve.server.vm(VM_ANIM)
    assert (real["node"], real["status"]) == ("pve2", "running")
    [vgpu] = Vgpu.objects.filter(vm=world.vm).select_related("gpu__host")
    assert (vgpu.gpu.host, vgpu.profile.name) == (other.host, "T4-8Q")
    [instance] = real["instances"]
    assert (instance["type"], instance["uuid"]) == (TYPE_8Q, vgpu.device_id)
    assert f"0000:{vgpu.gpu.pci_bus_id[-7:].lower()}" in hostpci(pve, VM_ANIM)["hostpci0"]


def test_a_gpu_that_proxmox_finds_full_gets_the_vm_its_old_vgpu_back(pve, artist, artist_api, admin_api):
    world = pve_world(pve, artist, admin_api, "ws-anim-01")
    # The inventory has lost ws-model-01's 8Q on the second T4 and keeps a 4Q on the first that
    # Proxmox VE does not run: placement chooses the second T4, which Proxmox VE finds full.
    Vgpu.objects.filter(vm__name="ws-model-01").delete()
    place(admin_api, VirtualMachineFactory(name="ws-render-node", ram_gib=1), world.gpus[GPU_A], "T4-4Q")

    done = operations.run(approve_now(world, "T4-8Q", admin_api, artist_api).pk)

    assert done.status == OperationStatus.ROLLED_BACK, done.error
    assert "cannot take another GRID T4-8Q vGPU now" in done.error
    real = pve.server.vm(VM_ANIM)
    assert (real["status"], hostpci(pve, VM_ANIM)) == ("running", {"hostpci0": f"0000:3b:00.0,mdev={TYPE_4Q}"})
    assert [i["uuid"] for i in real["instances"]] == [world.device.id]
    vgpu = Vgpu.objects.get(vm=world.vm)
    assert (vgpu.profile.name, vgpu.device_id) == ("T4-4Q", world.device.id)
    assert ResizeRequest.objects.get(pk=done.request_id).status == ResizeStatus.FAILED


def test_a_new_vm_whose_vgpu_the_node_places_at_start_joins_the_inventory_on_a_gpu_with_room(
        pve, artist, admin_api):
    # build-agent gets a 4Q through the cluster's resource mapping: Proxmox VE picks the GPU at start.
    api = ProxmoxAPI(pve.server.host, port=pve.server.port, user=pvefake.USERNAME, password=pvefake.PASSWORD,
                     verify_ssl=str(pve.server.ca_pem))
    api.nodes("pve1").qemu(VM_BUILD).config.post(hostpci0=f"mapping={pvefake.MAPPING},mdev={TYPE_4Q}")
    world = pve_world(pve, artist, admin_api, "", skip=("build-agent",))

    report = services.sync_host(world.host)
    entry = next(e for e in report.diff["entries"] if e["name"] == "build-agent")
    assert entry["kind"] == "new"
    [row] = entry["vgpus"]
    assert (row["profile"], row["gpu_bus_id"]) == ("T4-4Q", "")
    [outcome] = services.apply_report(report, [entry["uuid"]])

    vm = VirtualMachine.objects.get(name="build-agent")
    [vgpu] = Vgpu.objects.filter(vm=vm).select_related("gpu")
    # The first T4 holds a 4Q already (room for three more); the second is full of 8Qs.
    assert (vgpu.gpu.pci_bus_id, vgpu.profile.name, vgpu.device_id) == (GPU_A, "T4-4Q", mdev_uuid(VM_BUILD, 0))
    assert any("Placed T4-4Q on GPU 00000000:3B:00.0" in line for line in outcome["messages"]), outcome

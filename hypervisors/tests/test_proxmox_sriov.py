"""The Proxmox VE backend on a GPU in NVIDIA's SR-IOV layout (vGPU 17+ on an L40S, Proxmox VE
8.3+): the physical function offers no types, each virtual function takes one vGPU and is the
device's identity. Against the fake's `sriov_inventory()` (hypervisors.testing.pvefake), over
real HTTPS; ending with a resize carried out end to end through the product's operation.
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from fleet.models import Vgpu
from fleet.tests.factories import GpuFactory, HostFactory, VirtualMachineFactory, gpu_model
from hypervisors import discovery, matching, operations
from hypervisors.backends import open_backend
from hypervisors.backends.base import (
    DeviceKind,
    DomainSpec,
    HypervisorError,
    NoInstanceAvailable,
    PowerState,
    VgpuDevice,
)
from hypervisors.choices import OperationStatus
from hypervisors.testing.pvefake import (
    L40S_12Q,
    L40S_24Q,
    L40S_VFS,
    SRIOV_NODE,
    VM_EDIT,
    VM_RENDER,
    VM_SPARE,
)
from hypervisors.tests.test_end_to_end_vsphere import approve_now, place
from hypervisors.tests.test_proxmox import by_name, hostpci

L40S = "00000000:41:00.0"
L40S_PROFILES = ["L40S-4Q", "L40S-6Q", "L40S-8Q", "L40S-12Q", "L40S-24Q", "L40S-48Q"]


@pytest.fixture
def node(pve_sriov):
    """Node pve3 (one L40S in the SR-IOV layout) through the fake's API, signed in as root@pam."""
    backend = open_backend(pve_sriov.uri(), secret_ref=pve_sriov.secret_ref)
    yield backend
    backend.close()


def vf(address: str) -> str:
    """A VF's address in the fleet's form: "0000:41:00.4" -> "00000000:41:00.4"."""
    return "0000" + address.upper()


def offered(backend) -> dict[str, int]:
    return {t.name: t.available for t in backend.vgpu_types() if t.gpu_bus_id == L40S}


# Reading -----------------------------------------------------------------------------------------


def test_a_vgpu_on_a_virtual_function_is_read_as_that_vf_of_its_gpu_with_the_drivers_type_name(node):
    answer = node.check()
    assert answer.ok, answer.message
    assert "node pve3 of 1 node(s), 1 NVIDIA GPU(s) with vGPU types" in answer.message  # the L40S, not its VFs
    vms = by_name(node)
    render = vms["ws-render-01"]
    assert render.state == PowerState.RUNNING
    # The VF holding the vGPU lists no types any more; the name still comes from the GPU's free VFs.
    assert render.vgpus == (VgpuDevice(DeviceKind.VF, vf(L40S_VFS[0]), L40S, "NVIDIA L40S-12Q"),)
    assert matching.match_profile(render.vgpus[0].type_name, L40S_PROFILES) == "L40S-12Q"
    assert vms["ws-spare-01"].vgpus == (VgpuDevice(DeviceKind.VF, vf(L40S_VFS[1]), L40S, "NVIDIA L40S-12Q"),)
    assert vms["ws-edit-01"].vgpus == ()


def test_the_gpus_types_are_counted_per_gpu_not_per_virtual_function(node, pve_sriov):
    # One 12Q runs: NVIDIA's L40S holds four, so three more, though seven VFs are free; no other
    # size fits beside it, and Proxmox VE lists none.
    assert offered(node) == {"NVIDIA L40S-12Q": 3}
    [twelve] = node.vgpu_types()
    assert twelve.type_id == L40S_12Q

    node.shutdown(by_name(node)["ws-render-01"].uuid, timeout_s=10)

    assert pve_sriov.server.instances(SRIOV_NODE, L40S_VFS[0]) == []  # the VF's vGPU type is back to 0
    # An empty L40S: every size, as many as NVIDIA allows, but no more than its eight VFs.
    assert offered(node) == {"NVIDIA L40S-4Q": 8, "NVIDIA L40S-6Q": 8, "NVIDIA L40S-8Q": 6, "NVIDIA L40S-12Q": 4,
                             "NVIDIA L40S-24Q": 2, "NVIDIA L40S-48Q": 1}


# Changing ----------------------------------------------------------------------------------------


def test_a_new_vgpu_goes_on_a_free_vf_that_no_vm_names(node):
    device = node.create_vgpu(L40S, "NVIDIA L40S-12Q")
    # .4 runs ws-render-01's vGPU; .5 is free on the card but named in stopped ws-spare-01's configuration.
    assert device == VgpuDevice(DeviceKind.VF, vf(L40S_VFS[2]), L40S, "NVIDIA L40S-12Q")
    with pytest.raises(NoInstanceAvailable, match="offers no vGPU type named 'NVIDIA L40S-24Q' \\(it offers: "
                                                  "NVIDIA L40S-12Q\\)"):
        node.create_vgpu(L40S, "NVIDIA L40S-24Q")


def test_a_stopped_vm_given_a_vgpu_runs_with_it_on_a_vf_of_its_own(node, pve_sriov):
    edit = by_name(node)["ws-edit-01"]
    node.shutdown(edit.uuid, timeout_s=10)  # stopped already: nothing to do
    device = node.create_vgpu(L40S, "NVIDIA L40S-12Q")
    node.redefine(edit.uuid, DomainSpec(vcpus=8, ram_mib=32768, vgpus=(device,)))
    node.start(edit.uuid)

    state = pve_sriov.server.vm(VM_EDIT)
    assert state["status"] == "running"
    assert hostpci(pve_sriov, VM_EDIT) == {"hostpci0": f"{L40S_VFS[2]},mdev={L40S_12Q},pcie=1"}
    assert [(i["pci"], i["type"]) for i in state["instances"]] == [(L40S_VFS[2], L40S_12Q)]
    assert node.domain(edit.uuid).vgpus == (VgpuDevice(DeviceKind.VF, vf(L40S_VFS[2]), L40S, "NVIDIA L40S-12Q"),)
    assert offered(node) == {"NVIDIA L40S-12Q": 2}
    assert hostpci(pve_sriov, VM_RENDER) == {"hostpci0": f"{L40S_VFS[0]},mdev={L40S_12Q},pcie=1"}


def test_a_vf_a_running_vm_holds_or_a_size_the_gpu_has_no_room_for_fails_the_start(node, pve_sriov):
    edit = by_name(node)["ws-edit-01"]
    taken = VgpuDevice(DeviceKind.VF, vf(L40S_VFS[0]), L40S, "NVIDIA L40S-12Q")
    node.redefine(edit.uuid, DomainSpec(vcpus=4, ram_mib=16384, vgpus=(taken,)))
    with pytest.raises(HypervisorError, match="could not start ws-edit-01: the task failed: PCI device "
                                              "'0000:41:00.4' already in use by VMID '301'"):
        node.start(edit.uuid)

    bigger = VgpuDevice(DeviceKind.VF, vf(L40S_VFS[7]), L40S, L40S_24Q)  # no 24Q beside ws-render-01's 12Q
    node.redefine(edit.uuid, DomainSpec(vcpus=4, ram_mib=16384, vgpus=(bigger,)))
    with pytest.raises(NoInstanceAvailable, match="vgpu type '1156' not available for '0000:41:01.3'"):
        node.start(edit.uuid)

    assert pve_sriov.server.vm(VM_EDIT)["status"] == "stopped"
    assert pve_sriov.server.instances(SRIOV_NODE, L40S_VFS[7]) == []
    assert pve_sriov.server.vm(VM_RENDER)["instances"] == [
        {"uuid": "", "pci": L40S_VFS[0], "type": L40S_12Q}]
    assert pve_sriov.server.vm(VM_SPARE)["status"] == "stopped"


# End to end --------------------------------------------------------------------------------------


@pytest.mark.django_db
def test_an_artists_request_is_carried_out_on_an_l40s_and_the_inventory_records_the_new_vf(
        pve_sriov, settings, artist, artist_api, admin_api):
    settings.HYPERVISOR_VERIFY_WAIT_S = 0
    world = l40s_world(pve_sriov, artist, admin_api, "ws-render-01", skip=("ws-spare-01",))
    assert world.device.id == vf(L40S_VFS[0])

    done = operations.run(approve_now(world, "L40S-24Q", admin_api, artist_api).pk)

    assert done.status == OperationStatus.SUCCEEDED, done.error
    real = pve_sriov.server.vm(VM_RENDER)
    assert real["status"] == "running"
    # The operation takes the 12Q out of the VM's configuration before it makes the 24Q, so the
    # VM's own VF is the first free one that no VM names (ws-spare-01 still names .5).
    assert hostpci(pve_sriov, VM_RENDER) == {"hostpci0": f"{L40S_VFS[0]},mdev={L40S_24Q},pcie=1"}
    assert real["instances"] == [{"uuid": "", "pci": L40S_VFS[0], "type": L40S_24Q}]
    [vgpu] = Vgpu.objects.filter(vm=world.vm).select_related("gpu", "profile")
    assert (vgpu.profile.name, vgpu.gpu.pci_bus_id, vgpu.device_id) == ("L40S-24Q", L40S, vf(L40S_VFS[0]))
    assert pve_sriov.server.vm(VM_SPARE)["config"]["hostpci0"].startswith(L40S_VFS[1])
    assert artist_api.get(f"/api/v1/resize-requests/{done.request_id}/").json()["status"] == "approved"


def l40s_world(pve_sriov, artist, admin_api, vm_name: str, *, skip: tuple[str, ...] = ()) -> SimpleNamespace:
    """Host "pve-03" linked to node pve3 with its L40S, and every VM the node shows in the
    inventory as it shows them (vGPUs with their VF ids), but those in `skip`; `vm_name` is the
    artist's (world.vm, its device)."""
    uri = pve_sriov.uri()
    host = HostFactory(name="pve-03", hypervisor_uri=uri, hypervisor_secret_ref=pve_sriov.secret_ref)
    gpu = GpuFactory(host=host, gpu_model=gpu_model("NVIDIA L40S"), pci_bus_id=L40S)
    backend = open_backend(uri, secret_ref=pve_sriov.secret_ref)
    domains = [d for d in backend.list_domains() if d.name not in skip]
    backend.close()
    world = SimpleNamespace(host=host, gpus={L40S: gpu})
    for domain in domains:
        owner = {"artist": artist} if domain.name == vm_name else {}
        if not domain.vgpus:
            owner["host"] = host
        vm = VirtualMachineFactory(name=domain.name, uuid=domain.uuid, vcpus=domain.vcpus,
                                   ram_gib=discovery.ram_gib_of(domain.ram_mib), **owner)
        for device in domain.vgpus:
            held = matching.match_profile(device.type_name, L40S_PROFILES)
            place(admin_api, vm, gpu, held)
            Vgpu.objects.filter(vm=vm, gpu=gpu).update(device_id=device.id)
            if domain.name == vm_name:
                world.vm, world.device, world.held = vm, device, held
    return world

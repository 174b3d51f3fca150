"""A resize carried out on a real hypervisor, end to end: the artist files a request through the
API, the admin approves it (run now), the operation runs, and then libvirt itself shows the
domain running with the new vGPU device, the host agent's sysfs shows that device with the new
type, and the API's inventory says the same.

The pieces are real: a private libvirtd serving libvirt's test driver (the domain), the host
agent's HTTP server with its device action (the vGPU devices) over a fake sysfs in both NVIDIA
layouts with the emulated kernel, and the dashboard's API. libvirt's test driver cannot create
mdevs itself, which is exactly the host the agent's device action exists for.
"""

from __future__ import annotations

import contextlib
from datetime import timedelta
from types import SimpleNamespace
from xml.etree import ElementTree as ET

import pytest
from django.utils import timezone

from faults.services import require_module
from fleet.choices import ResizeStatus
from fleet.models import ResizeRequest, Vgpu
from fleet.tests.factories import GpuFactory, HostFactory, VirtualMachineFactory, gpu_model, profile
from hypervisors.agent_devices import agent_device_token
from hypervisors.choices import OperationStatus
from hypervisors.models import Operation
from hypervisors.tests.worlds import approve_size_now
from telemetry.tests.loopback import polled_agent
from telemetry.tests.test_agent_vgpu_devices import MDEV, SRIOV, fake_host

libvirt = require_module("libvirt", purpose="the end-to-end hypervisor tests need libvirt-python "
                         "(pip install -r requirements-libvirt.txt)")

from hypervisors import operations  # noqa: E402 - after the check that libvirt-python is there

pytestmark = pytest.mark.django_db

#: Per layout: the GPU model, the profile the VM holds, the one the artist asks for.
CASES = {
    "mdev": (MDEV, "Tesla T4", "T4-8Q", "T4-4Q", "GRID T4-4Q"),
    "sriov": (SRIOV, "NVIDIA L40S", "L40S-24Q", "L40S-12Q", "NVIDIA L40S-12Q"),
}


def hostdev_xml(kind: str, device_id: str) -> str:
    if kind == "mdev":
        return (f"<hostdev mode='subsystem' type='mdev' model='vfio-pci'><source><address uuid='{device_id}'/>"
                "</source></hostdev>")
    domain, bus, rest = device_id.split(":")
    slot, function = rest.split(".")
    return (f"<hostdev mode='subsystem' type='pci' managed='yes'><source><address domain='0x{domain[-4:]}' "
            f"bus='0x{bus}' slot='0x{slot}' function='0x{function}'/></source></hostdev>")


def workstation_xml(name: str, uuid: str, hostdev: str, *, on_poweroff: str = "destroy") -> str:
    return f"""<domain type='test'>
  <name>{name}</name><uuid>{uuid}</uuid>
  <memory unit='GiB'>32</memory><currentMemory unit='GiB'>32</currentMemory><vcpu>8</vcpu>
  <os><type arch='x86_64'>hvm</type></os>
  <on_poweroff>{on_poweroff}</on_poweroff>
  <devices>
    <disk type='file' device='disk'><source file='/var/lib/libvirt/images/{name}.qcow2'/>
      <target dev='vda' bus='virtio'/></disk>
    {hostdev}
  </devices>
</domain>"""


def libvirt_view(uri: str, uuid: str) -> tuple[bool, ET.Element]:
    """(running, live XML) of the domain through a connection of its own, as virsh would show it."""
    conn = libvirt.open(uri)
    try:
        domain = conn.lookupByUUIDString(uuid)
        return bool(domain.isActive()), ET.fromstring(domain.XMLDesc(0))
    finally:
        conn.close()


@contextlib.contextmanager
def kvm_world(case: str, libvirtd, tmp_path, artist, admin_api, *, on_poweroff: str = "destroy"):
    """kvm-01 linked to the private libvirtd, its agent serving a fake sysfs of the case's layout;
    Ana's ws-ana running there with a vGPU of the held profile, known to inventory, host and agent."""
    layout, model, held, wanted, host_type = CASES[case]
    host = HostFactory(name="kvm-01", hypervisor_uri=libvirtd.uri())
    gpu = GpuFactory(host=host, gpu_model=gpu_model(model), pci_bus_id=layout.gpu)
    vm = VirtualMachineFactory(name="ws-ana", artist=artist, vcpus=8, ram_gib=32)
    agent = polled_agent("kvm-01-agent", "http://127.0.0.1:1", host=host)
    token = agent_device_token(agent)
    prefix = "GRID " if case == "mdev" else "NVIDIA "
    with fake_host(layout, tmp_path, device_token=token) as agent_host:
        agent.url = agent_host.server.url
        agent.save(update_fields=["url"])

        def call(method: str, path: str, body=None):
            return agent_host.call(method, path, body, token=token)

        status, _, old = call("POST", "/v1/vgpu-devices", {"gpu": layout.gpu, "type": prefix + held})
        assert status == 201, old
        # Held open to the end: the test driver keeps its host only while a connection is open.
        shell = libvirt.open(libvirtd.uri())
        shell.defineXML(workstation_xml(vm.name, str(vm.uuid), hostdev_xml(layout.device_kind, old["id"]),
                                        on_poweroff=on_poweroff))
        shell.lookupByUUIDString(str(vm.uuid)).create()
        response = admin_api.post("/api/v1/vgpus/", {"vm": vm.pk, "gpu": gpu.pk, "profile": profile(held).pk},
                                  format="json")
        assert response.status_code == 201, response.content
        Vgpu.objects.filter(vm=vm).update(device_id=old["id"])
        world = SimpleNamespace(layout=layout, host=host, gpu=gpu, vm=vm, old=old, call=call, shell=shell,
                                uri=libvirtd.uri(), wanted=wanted, held=held, host_type=host_type, prefix=prefix)
        try:
            yield world
        finally:
            with contextlib.suppress(libvirt.libvirtError):
                world.shell.close()


def devices_on(world) -> list[dict]:
    return world.call("GET", "/v1/vgpu-devices")[2]["devices"]


def held_ids(world) -> list[str]:
    """The vGPU devices the domain's live XML holds (mdev UUIDs), read through libvirt."""
    _, live = libvirt_view(world.uri, str(world.vm.uuid))
    return [a.get("uuid") for a in live.findall("devices/hostdev[@type='mdev']/source/address")]


def approve_now(world, admin_api, artist_api) -> Operation:
    filed = artist_api.post("/api/v1/resize-requests/", {
        "vm": world.vm.pk, "requested_profile": profile(world.wanted).pk, "requested_vgpus": 1,
        "reason": "my scenes fit in half the frame buffer"}, format="json")
    assert filed.status_code == 201, filed.content
    approved = admin_api.post(f"/api/v1/resize-requests/{filed.json()['id']}/approve/",
                              {"comment": "done tonight", "run_now": True}, format="json")
    assert approved.status_code == 200, approved.content
    assert approved.json()["status"] == "applying"
    return Operation.objects.get(request_id=filed.json()["id"])


def assert_rolled_back(world, done: Operation, because: str) -> None:
    """The host, the agent and the inventory as they were; the request failed with the reason."""
    assert done.status == OperationStatus.ROLLED_BACK, done.error
    assert because in done.error
    running, _ = libvirt_view(world.uri, str(world.vm.uuid))
    assert running
    assert held_ids(world) == [world.old["id"]]
    assert [(d["id"], d["type"]) for d in devices_on(world)] == [(world.old["id"], world.prefix + world.held)]
    vgpu = Vgpu.objects.get(vm=world.vm)
    assert (vgpu.profile.name, vgpu.device_id) == (world.held, world.old["id"])
    request = ResizeRequest.objects.get(pk=done.request_id)
    assert request.status == ResizeStatus.FAILED
    assert because in request.last_error


@pytest.mark.parametrize("case", CASES, ids=list(CASES))
def test_an_artists_request_approved_by_an_admin_is_carried_out_on_libvirt(
        case, libvirtd, tmp_path, settings, artist, artist_api, admin_api):
    settings.HYPERVISOR_VERIFY_WAIT_S = 0
    with kvm_world(case, libvirtd, tmp_path, artist, admin_api) as world:
        operation = approve_now(world, admin_api, artist_api)

        done = operations.run(operation.pk)

        assert done.status == OperationStatus.SUCCEEDED, done.error
        running, live = libvirt_view(world.uri, str(world.vm.uuid))
        assert running
        devices = devices_on(world)
        assert [d["type"] for d in devices] == [world.host_type]
        new_id = devices[0]["id"]
        if case == "mdev":
            assert new_id != world.old["id"]  # a new mdev; on SR-IOV the freed VF may well be the one reused
            assert held_ids(world) == [new_id]
        else:
            addresses = live.findall("devices/hostdev[@type='pci']/source/address")
            assert len(addresses) == 1
            assert new_id.lower().endswith(f"{addresses[0].get('bus')[2:]}:{addresses[0].get('slot')[2:]}."
                                           f"{addresses[0].get('function')[2:]}".lower())
        assert live.find("devices/disk/source").get("file").endswith("ws-ana.qcow2")  # the rest is kept
        listed = admin_api.get(f"/api/v1/vgpus/?vm={world.vm.pk}").json()["results"]
        assert [(v["gpu"], v["profile"], v["device_id"]) for v in listed] == [
            (world.gpu.pk, profile(world.wanted).pk, new_id)]
        request = artist_api.get(f"/api/v1/resize-requests/{operation.request_id}/").json()
        assert request["status"] == "approved"


def test_a_guest_that_will_not_power_off_is_left_running_as_it_was(
        libvirtd, tmp_path, settings, artist, artist_api, admin_api):
    settings.HYPERVISOR_SHUTDOWN_TIMEOUT_S = 0.5
    # A guest that restarts when asked to power off looks, from the host, like one that ignores it.
    with kvm_world("mdev", libvirtd, tmp_path, artist, admin_api, on_poweroff="restart") as world:
        done = operations.run(approve_now(world, admin_api, artist_api).pk)
        assert_rolled_back(world, done, "did not power off within 0.5 s")


def test_a_gpu_that_refuses_the_new_vgpu_gets_its_old_one_back(
        libvirtd, tmp_path, settings, artist, artist_api, admin_api):
    with kvm_world("mdev", libvirtd, tmp_path, artist, admin_api) as world:
        # A vGPU made on the host outside the product: the T4 keeps holding 8Q, so no 4Q fits.
        status, _, stranger = world.call("POST", "/v1/vgpu-devices",
                                         {"gpu": world.layout.gpu, "type": world.prefix + world.held})
        assert status == 201
        done = operations.run(approve_now(world, admin_api, artist_api).pk)
        assert done.status == OperationStatus.ROLLED_BACK, done.error
        assert "has no room for another GRID T4-4Q: it holds 1 x GRID T4-8Q" in done.error
        assert held_ids(world) == [world.old["id"]]
        assert sorted(d["id"] for d in devices_on(world)) == sorted([world.old["id"], stranger["id"]])
        assert Vgpu.objects.get(vm=world.vm).profile.name == world.held


def test_libvirtd_stopped_mid_operation_holds_it_until_it_is_back_then_it_ends_as_planned(
        libvirtd, tmp_path, settings, artist, artist_api, admin_api):
    settings.HYPERVISOR_VERIFY_WAIT_S = 0
    settings.HYPERVISOR_RETRY_S = 0
    with kvm_world("mdev", libvirtd, tmp_path, artist, admin_api) as world:
        operation = approve_now(world, admin_api, artist_api)
        # A worker gets as far as creating the new vGPU ...
        taken = operations._take(operation.pk, timezone.now())
        current = operations.Run(taken, operations.backend_for(world.host), operations.backend_for(world.host))
        for step in taken.steps.order_by("index")[:4]:
            operations._do(current, step)
        current.close()
        Operation.objects.filter(pk=operation.pk).update(heartbeat_at=timezone.now() - timedelta(hours=1))
        # ... then libvirtd stops. A real libvirtd keeps its domains' definitions across a restart;
        # the test driver does not, so the test keeps the definition to give it back.
        kept = world.shell.lookupByUUIDString(str(world.vm.uuid)).XMLDesc(libvirt.VIR_DOMAIN_XML_INACTIVE)
        world.shell.close()
        libvirtd.stop()

        held = operations.run(operation.pk)
        assert held.status == OperationStatus.RUNNING
        assert "unreachable" in held.error
        assert ResizeRequest.objects.get(pk=operation.request_id).status == ResizeStatus.APPLYING

        libvirtd.start()
        world.shell = libvirt.open(world.uri)
        world.shell.defineXML(kept)
        assert operation.pk in operations.resume_due()
        done = operations.run(operation.pk)

        assert done.status == OperationStatus.SUCCEEDED, done.error
        new_id = done.steps.get(kind="create_vgpu").result["device"]["id"]
        assert held_ids(world) == [new_id]
        assert [d["type"] for d in devices_on(world)] == [world.host_type]
        assert ResizeRequest.objects.get(pk=operation.request_id).status == ResizeStatus.APPROVED


def test_a_change_of_vcpus_and_ram_alone_is_carried_out_on_libvirt_keeping_the_vgpu(
        libvirtd, tmp_path, settings, artist, artist_api, admin_api):
    settings.HYPERVISOR_VERIFY_WAIT_S = 0
    with kvm_world("mdev", libvirtd, tmp_path, artist, admin_api) as world:
        done = operations.run(approve_size_now(world.vm, 4, 16, admin_api, artist_api).pk)

        assert done.status == OperationStatus.SUCCEEDED, done.error
        running, live = libvirt_view(world.uri, str(world.vm.uuid))
        assert running
        assert live.find("vcpu").text == "4"
        memory = live.find("memory")
        assert int(memory.text) * {"KiB": 1, "MiB": 1024, "GiB": 1024 ** 2}[memory.get("unit", "KiB")] == 16 * 1024 ** 2
        assert held_ids(world) == [world.old["id"]]  # the same mdev, not made again
        assert [d["id"] for d in devices_on(world)] == [world.old["id"]]
        vm = admin_api.get(f"/api/v1/vms/{world.vm.pk}/").json()
        assert (vm["vcpus"], vm["ram_gib"]) == (4, 16)

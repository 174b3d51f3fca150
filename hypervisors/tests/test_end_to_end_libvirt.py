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

from xml.etree import ElementTree as ET

import pytest

from faults.services import require_module
from fleet.models import Vgpu
from fleet.tests.factories import GpuFactory, HostFactory, VirtualMachineFactory, gpu_model, profile
from hypervisors.agent_devices import agent_device_token
from hypervisors.choices import OperationStatus
from hypervisors.models import Operation
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


def workstation_xml(name: str, uuid: str, hostdev: str) -> str:
    return f"""<domain type='test'>
  <name>{name}</name><uuid>{uuid}</uuid>
  <memory unit='GiB'>32</memory><currentMemory unit='GiB'>32</currentMemory><vcpu>8</vcpu>
  <os><type arch='x86_64'>hvm</type></os>
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


@pytest.mark.parametrize("case", CASES, ids=list(CASES))
def test_an_artists_request_approved_by_an_admin_is_carried_out_on_libvirt(
        case, libvirtd, tmp_path, settings, artist, artist_api, admin_api):
    layout, model, held, wanted, host_type = CASES[case]
    settings.HYPERVISOR_VERIFY_WAIT_S = 0
    host = HostFactory(name="kvm-01", hypervisor_uri=libvirtd.uri())
    gpu = GpuFactory(host=host, gpu_model=gpu_model(model), pci_bus_id=layout.gpu)
    vm = VirtualMachineFactory(name="ws-ana", artist=artist, vcpus=8, ram_gib=32)
    agent = polled_agent("kvm-01-agent", "http://127.0.0.1:1", host=host)

    token = agent_device_token(agent)
    with fake_host(layout, tmp_path, device_token=token) as agent_host:
        agent.url = agent_host.server.url
        agent.save(update_fields=["url"])
        # The VM as the host has it today: its vGPU made through the agent, its domain running.
        status, _, old = agent_host.call("POST", "/v1/vgpu-devices", {
            "gpu": layout.gpu, "type": ("GRID " if case == "mdev" else "NVIDIA ") + held}, token=token)
        assert status == 201, old
        # Held open to the end: the test driver keeps its host only while a connection is open.
        admin_shell = libvirt.open(libvirtd.uri())
        admin_shell.defineXML(workstation_xml(vm.name, str(vm.uuid), hostdev_xml(layout.device_kind, old["id"])))
        admin_shell.lookupByUUIDString(str(vm.uuid)).create()
        admin_api.post("/api/v1/vgpus/", {"vm": vm.pk, "gpu": gpu.pk, "profile": profile(held).pk}, format="json")
        Vgpu.objects.filter(vm=vm).update(device_id=old["id"])

        filed = artist_api.post("/api/v1/resize-requests/", {
            "vm": vm.pk, "requested_profile": profile(wanted).pk, "requested_vgpus": 1,
            "reason": "my scenes fit in half the frame buffer"}, format="json")
        assert filed.status_code == 201, filed.content
        approved = admin_api.post(f"/api/v1/resize-requests/{filed.json()['id']}/approve/",
                                  {"comment": "done tonight", "run_now": True}, format="json")
        assert approved.status_code == 200, approved.content
        assert approved.json()["status"] == "applying"

        done = operations.run(Operation.objects.get(request_id=filed.json()["id"]).pk)

        assert done.status == OperationStatus.SUCCEEDED, done.error
        running, live = libvirt_view(libvirtd.uri(), str(vm.uuid))
        assert running
        devices = agent_host.call("GET", "/v1/vgpu-devices", token=token)[2]["devices"]
        assert [d["type"] for d in devices] == [host_type]
        new_id = devices[0]["id"]
        if case == "mdev":
            assert new_id != old["id"]  # a new mdev; on SR-IOV the freed VF may well be the one reused
            held_ids = [a.get("uuid") for a in live.findall("devices/hostdev[@type='mdev']/source/address")]
            assert held_ids == [new_id]
        else:
            addresses = live.findall("devices/hostdev[@type='pci']/source/address")
            assert len(addresses) == 1
            assert new_id.lower().endswith(f"{addresses[0].get('bus')[2:]}:{addresses[0].get('slot')[2:]}."
                                           f"{addresses[0].get('function')[2:]}".lower())
        assert live.find("devices/disk/source").get("file").endswith("ws-ana.qcow2")  # the rest is kept
        listed = admin_api.get(f"/api/v1/vgpus/?vm={vm.pk}").json()["results"]
        assert [(v["gpu"], v["profile"], v["device_id"]) for v in listed] == [(gpu.pk, profile(wanted).pk, new_id)]
        request = artist_api.get(f"/api/v1/resize-requests/{filed.json()['id']}/").json()
        assert request["status"] == "approved"
        admin_shell.close()

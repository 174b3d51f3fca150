"""A linked host for operation tests: node-01 on a simulated hypervisor, with Ana's running VM
known to both the inventory and the host, and her pending request for a smaller vGPU."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from fleet import requests as service
from fleet import services
from fleet.models import Vgpu
from fleet.tests.factories import GpuFactory, HostFactory, UserFactory, VirtualMachineFactory, gpu_model, profile
from hypervisors.backends import sim
from hypervisors.models import Operation
from hypervisors.tests.fixtures import BUS_A, BUS_B, L40S_TYPES

OLD_DEVICE = "6f1c3e57-0000-4000-8000-00000000a001"


def approve_size_now(vm, vcpus: int, ram_gib: int, admin_api, artist_api) -> Operation:
    """The artist asks through the API for `vcpus` and `ram_gib` alone for `vm` (its vGPUs stay as
    they are) and the admin approves it to run now: the operation that carries it out."""
    filed = artist_api.post("/api/v1/resize-requests/", {
        "vm": vm.pk, "requested_vcpus": vcpus, "requested_ram_gib": ram_gib, "reason": "layout work only now"},
        format="json")
    assert filed.status_code == 201, filed.content
    approved = admin_api.post(f"/api/v1/resize-requests/{filed.json()['id']}/approve/", {"run_now": True},
                              format="json")
    assert approved.json()["status"] == "applying", approved.content
    return Operation.objects.get(request_id=filed.json()["id"])


def host_view(name: str = "node-01") -> sim.SimBackend:
    """The simulated host as an admin on it sees it now (a fresh link)."""
    return sim.SimBackend.open(f"sim://{name}")


@pytest.fixture
def ana_linked(sim_dir, settings, artist):
    """node-01 linked to sim://node-01: two L40S GPUs; Ana's VM ws-ana runs with one L40S-24Q on
    GPU A, known to both the inventory and the hypervisor; Ana asks for an L40S-12Q."""
    settings.HYPERVISOR_VERIFY_WAIT_S = 0
    settings.HYPERVISOR_SHUTDOWN_TIMEOUT_S = 3
    host = HostFactory(name="node-01", hypervisor_uri="sim://node-01")
    l40s = gpu_model("NVIDIA L40S")
    gpu_a = GpuFactory(host=host, gpu_model=l40s, pci_bus_id=BUS_A)
    gpu_b = GpuFactory(host=host, gpu_model=l40s, pci_bus_id=BUS_B)
    vm = VirtualMachineFactory(name="ws-ana", artist=artist, vcpus=8, ram_gib=32)
    vgpu = services.place_vgpu(vm, gpu_a, profile("L40S-24Q"))
    Vgpu.objects.filter(pk=vgpu.pk).update(device_id=OLD_DEVICE)

    state = sim.empty_state("node-01")
    state["shutdown_s"] = 0.05
    sim.add_gpu(state, BUS_A, "NVIDIA L40S", L40S_TYPES)
    sim.add_gpu(state, BUS_B, "NVIDIA L40S", L40S_TYPES)
    sim.add_device(state, BUS_A, "NVIDIA L40S-24Q", OLD_DEVICE)
    sim.add_domain(state, str(vm.uuid), vm.name, 8, 32 * 1024, [OLD_DEVICE], running=True)
    sim.SimBackend.open("sim://node-01").seed(state)

    request = service.file_request(vm, artist.user, profile("L40S-12Q"), 1, "lighter scenes now")
    admin = UserFactory(username="it-admin", is_staff=True)
    return SimpleNamespace(host=host, gpu_a=gpu_a, gpu_b=gpu_b, vm=vm, request=request, admin=admin, artist=artist)



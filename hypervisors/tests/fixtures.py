"""Fixtures of simulated hypervisors (a plugin of the root conftest.py, so the pages' tests use them too)."""

import pytest

from hypervisors.backends import sim


@pytest.fixture
def sim_dir(settings, tmp_path):
    """HYPERVISOR_SIM_DIR in tmp_path, so a test's simulated hosts are its own."""
    settings.HYPERVISOR_SIM_DIR = tmp_path / "sim"
    return settings.HYPERVISOR_SIM_DIR


L40S_TYPES = [("NVIDIA L40S-48Q", 1), ("NVIDIA L40S-24Q", 2), ("NVIDIA L40S-12Q", 4)]
BUS_A, BUS_B = "00000000:3B:00.0", "00000000:5E:00.0"


@pytest.fixture
def node(sim_dir):
    """sim://node-01: two L40S GPUs, no domains, guests that power off in 0.1 s."""
    state = sim.empty_state("node-01")
    state["shutdown_s"] = 0.1
    sim.add_gpu(state, BUS_A, "NVIDIA L40S", L40S_TYPES)
    sim.add_gpu(state, BUS_B, "NVIDIA L40S", L40S_TYPES)
    backend = sim.SimBackend.open("sim://node-01")
    backend.seed(state)
    return backend


@pytest.fixture
def linked(sim_dir, db):
    """node-01 (two Quadro RTX 6000, linked to sim://node-01): ws-a holds an RTX6000-12Q on the
    first GPU (one 12Q slot left there), ws-b an RTX6000-24Q on the second (full). Its simulated
    hypervisor is seeded from the inventory, so the two agree."""
    from types import SimpleNamespace

    from fleet import services
    from fleet.tests.factories import GpuFactory, HostFactory, VirtualMachineFactory, profile
    from hypervisors import sim_seed

    host = HostFactory(name="node-01", hypervisor_uri="sim://node-01")
    gpu_a = GpuFactory(host=host, pci_bus_id=BUS_A)
    gpu_b = GpuFactory(host=host, pci_bus_id=BUS_B)
    vm_a = VirtualMachineFactory(name="ws-a", vcpus=8, ram_gib=32)
    vm_b = VirtualMachineFactory(name="ws-b", vcpus=12, ram_gib=64)
    services.place_vgpu(vm_a, gpu_a, profile("RTX6000-12Q"))
    services.place_vgpu(vm_b, gpu_b, profile("RTX6000-24Q"))
    backend = sim_seed.seed_host(host)
    return SimpleNamespace(host=host, gpu_a=gpu_a, gpu_b=gpu_b, vm_a=vm_a, vm_b=vm_b, sim=backend)


@pytest.fixture
def drifting(linked):
    """`linked`, read after ws-b's domain lost its vGPU device on the host; node-01's agent reads
    its GPUs, and ws-a on GPU A and on GPU B (where it was before); node-02 is linked but never read.
    The drift: ws-b's missing device, ws-a's old GPU in the agent, node-02 unread."""
    from datetime import timedelta

    from django.utils import timezone

    from fleet.tests.factories import HostFactory
    from hypervisors import services
    from telemetry.models import Agent, GpuSample, VgpuSample

    linked.sim.change_domain(str(linked.vm_b.uuid), vgpus=[])
    assert services.sync_host(linked.host).ok
    Agent.objects.create(name="node-01-agent", url="http://node-01:9410", host=linked.host)
    seen = timezone.now() - timedelta(seconds=3)
    for gpu in (linked.gpu_a, linked.gpu_b):
        GpuSample.objects.create(gpu=gpu, ts=seen, util_gpu=5)
        VgpuSample.objects.create(vm=linked.vm_a, gpu=gpu, ts=seen)
    linked.other = HostFactory(name="node-02", hypervisor_uri="sim://node-02")
    return linked


def add_unread_hosts(count: int) -> None:
    """`count` more linked hosts, never read, each with a GPU and a VM: a larger fleet for query counts."""
    from fleet.tests.factories import GpuFactory, HostFactory, VirtualMachineFactory

    for index in range(count):
        host = HostFactory(name=f"node-1{index}", hypervisor_uri=f"sim://node-1{index}")
        GpuFactory(host=host, pci_bus_id=BUS_A)
        VirtualMachineFactory(name=f"ws-z{index}", host=host)

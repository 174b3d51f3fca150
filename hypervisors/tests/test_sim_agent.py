"""The demo's simulated agent reports what the host's simulated hypervisor runs: a change carried
out on the hypervisor (a new vGPU type, a VM moved to another GPU, a VM shut down) shows in the
agent's next readings, as the real agent follows what the driver sees."""

from __future__ import annotations

import pytest

from hypervisors.backends import sim
from hypervisors.tests.fixtures import BUS_A, BUS_B
from telemetry.agent.scenario import build_scenario
from telemetry.agent.sim_backend import SimBackend

VM = "3f1c6a2e-5b7d-4c9a-8e1f-2a3b4c5d6e7f"


@pytest.fixture
def hypervisor(node):
    """sim://node-01 (two L40S, `node`), with ws-ana running on an L40S-24Q of GPU A."""
    device = node.create_vgpu(BUS_A, "NVIDIA L40S-24Q")
    node.define_domain("ws-ana", vcpus=8, ram_mib=32768, vgpus=(device,), uuid=VM, running=True)
    return node


def agent(sim_dir) -> SimBackend:
    scenario = build_scenario("node-01", [
        {"name": "NVIDIA L40S", "fb_total_mib": 49152, "pci_bus_id": BUS_A, "vgpus": [
            {"vm_name": "ws-ana", "vm_uuid": VM, "type_name": "L40S-24Q", "fb_mib": 24576, "workflow": "lighting"}]},
        {"name": "NVIDIA L40S", "fb_total_mib": 49152, "pci_bus_id": BUS_B, "vgpus": []},
    ])
    scenario["hypervisor_state"] = str(sim_dir / "node-01.json")
    return SimBackend(scenario)


def reported(backend: SimBackend) -> dict[str, list[tuple[str, str]]]:
    return {gpu["pci_bus_id"]: [(v["vm_name"], v["type_name"]) for v in gpu["vgpus"]]
            for gpu in backend.collect(now=1_780_000_000)}


def test_the_agent_reports_the_vgpu_the_hypervisor_made_on_the_gpu_it_made_it_on(hypervisor, sim_dir):
    reader = agent(sim_dir)
    assert reported(reader) == {BUS_A: [("ws-ana", "L40S-24Q")], BUS_B: []}

    hypervisor.shutdown(VM, timeout_s=5)
    assert reported(reader) == {BUS_A: [], BUS_B: []}  # off: no vGPU in use
    old = hypervisor.domain(VM).vgpus[0]
    hypervisor.redefine(VM, sim.DomainSpec(vcpus=8, ram_mib=32768, vgpus=()))
    hypervisor.remove_vgpu(old)
    new = hypervisor.create_vgpu(BUS_B, "NVIDIA L40S-12Q")
    hypervisor.redefine(VM, sim.DomainSpec(vcpus=8, ram_mib=32768, vgpus=(new,)))
    hypervisor.start(VM)

    assert reported(reader) == {BUS_A: [], BUS_B: [("ws-ana", "L40S-12Q")]}
    readings = {gpu["pci_bus_id"]: gpu for gpu in reader.collect(now=1_780_000_000)}
    vgpu = readings[BUS_B]["vgpus"][0]
    assert vgpu["vm_uuid"] == VM
    assert vgpu["mdev_uuid"] == new.id  # the hypervisor's device id, as NVML gives an mdev vGPU's
    assert 0 <= vgpu["fb_used_mib"] <= 12 * 1024  # within the new, smaller frame buffer


def test_the_agent_reports_each_vgpu_with_the_hypervisors_device_id(hypervisor, sim_dir):
    device = hypervisor.domain(VM).vgpus[0]
    (gpu,) = [gpu for gpu in agent(sim_dir).collect(now=1_780_000_000) if gpu["vgpus"]]

    assert [(v["vm_uuid"], v["mdev_uuid"]) for v in gpu["vgpus"]] == [(VM, device.id)]


def test_without_the_hypervisors_file_the_agent_keeps_to_its_scenario(sim_dir):
    assert reported(agent(sim_dir)) == {BUS_A: [("ws-ana", "L40S-24Q")], BUS_B: []}


@pytest.mark.django_db
def test_the_demo_points_each_simulated_agent_at_its_hosts_simulated_hypervisor(sim_dir):
    from fleet.tests.factories import GpuFactory, HostFactory
    from telemetry.demo import host_scenario

    linked = HostFactory(name="node-01", hypervisor_uri="sim://node-01")
    GpuFactory(host=linked)
    plain = HostFactory(name="node-02")
    GpuFactory(host=plain)
    assert host_scenario(linked)["hypervisor_state"] == str(sim_dir / "node-01.json")
    assert "hypervisor_state" not in host_scenario(plain)

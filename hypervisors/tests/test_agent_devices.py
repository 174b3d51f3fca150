"""AgentDeviceManager end to end: the dashboard's side asking a real agent on loopback (its
server in a thread) to create and remove vGPUs in a fake host sysfs of either NVIDIA layout,
with the agent's refusals arriving as the backend's errors."""

from __future__ import annotations

import io
from collections.abc import Iterator

import pytest
from django.core.management import call_command

from fleet.tests.factories import HostFactory
from hypervisors.agent_devices import AgentDeviceManager, agent_device_token
from hypervisors.backends.base import (
    DeviceBusy,
    DeviceKind,
    HypervisorError,
    NoInstanceAvailable,
    Unreachable,
    VgpuDevice,
)
from telemetry.scheduler_apply import agent_write_token
from telemetry.tests.loopback import FakeAgent, closed_port_url, polled_agent
from telemetry.tests.test_agent_vgpu_devices import MDEV, SRIOV, Host, Layout, fake_host

pytestmark = pytest.mark.django_db


@pytest.fixture
def host_row():
    return HostFactory(name="node-01")


def agent_world(tmp_path, layout: Layout, host_row, *, token: str | None = "derived"):
    """(agent row, running fake host): the agent started with the token the dashboard derives for
    it, another `token`, or none (None)."""
    agent = polled_agent("node-01-agent", "http://127.0.0.1:1", host=host_row)
    device_token = agent_device_token(agent) if token == "derived" else token
    world = fake_host(layout, tmp_path, device_token=device_token)
    return agent, world


@pytest.fixture(params=[MDEV, SRIOV], ids=["mdev", "sriov"])
def managed(request, tmp_path, host_row) -> Iterator[tuple[AgentDeviceManager, Host]]:
    agent, world = agent_world(tmp_path, request.param, host_row)
    with world as host:
        agent.url = host.server.url
        agent.save(update_fields=["url"])
        yield AgentDeviceManager.for_host(host_row), host


def test_lists_the_types_each_gpu_offers_in_the_dashboards_spelling(managed):
    manager, host = managed
    types = {item.name: item for item in manager.vgpu_types()}
    offered = types[host.layout.two_fit]
    assert (offered.gpu_bus_id, offered.type_id) == (host.layout.gpu, host.layout.two_fit_id)
    assert offered.available == (2 if host.layout is MDEV else 16)
    assert manager.vgpu_devices() == []


def test_creates_until_the_gpu_is_full_then_no_instance_available(managed):
    manager, host = managed
    made = []
    for _ in range(2):
        made.append(manager.create_vgpu(host.layout.gpu, host.layout.two_fit))
        host.emulator.settle()

    with pytest.raises(NoInstanceAvailable) as caught:
        manager.create_vgpu(host.layout.gpu, host.layout.two_fit)

    assert str(caught.value) == (f"Agent node-01-agent cannot create a {host.layout.two_fit} on GPU {host.layout.gpu}: "
                                 f"GPU {host.layout.gpu} has no room for another {host.layout.two_fit}: it holds "
                                 f"2 x {host.layout.two_fit}.")
    assert {device.kind for device in made} == {host.layout.device_kind}
    assert sorted(manager.vgpu_devices(), key=lambda d: d.id) == sorted(made, key=lambda d: d.id)
    if host.layout is SRIOV:
        assert [device.id for device in made] == ["00000000:41:00.4", "00000000:41:00.5"]
    assert all(device.type_name == host.layout.two_fit and device.gpu_bus_id == host.layout.gpu for device in made)


def test_removes_a_device_and_a_device_already_gone_is_no_error(managed):
    manager, host = managed
    device = manager.create_vgpu(host.layout.gpu, host.layout.two_fit)
    host.emulator.settle()

    manager.remove_vgpu(device)
    host.emulator.settle()
    manager.remove_vgpu(device)

    assert manager.vgpu_devices() == []
    assert {item.name: item.available for item in manager.vgpu_types()}[host.layout.smaller] == (
        4 if host.layout is MDEV else 16)


def test_a_device_a_running_vm_holds_raises_device_busy(managed):
    manager, host = managed
    device = manager.create_vgpu(host.layout.gpu, host.layout.two_fit)
    host.emulator.settle()
    host.emulator.hold(device.id)

    with pytest.raises(DeviceBusy) as caught:
        manager.remove_vgpu(device)

    assert str(caught.value) == (f"Agent node-01-agent cannot remove vGPU {device.id}: vGPU {device.id} is in use "
                                 "(a running VM holds it): shut the VM down first.")
    assert manager.vgpu_devices() == [device]


def test_a_type_the_gpu_does_not_offer_is_a_hypervisor_error_not_a_full_gpu(managed):
    manager, host = managed
    with pytest.raises(HypervisorError) as caught:
        manager.create_vgpu(host.layout.gpu, "NVIDIA A40-8Q")
    assert not isinstance(caught.value, NoInstanceAvailable)
    assert "(HTTP 404): GPU" in str(caught.value)
    assert "offers no vGPU type named 'NVIDIA A40-8Q'" in str(caught.value)


def test_an_agent_holding_another_token_is_unreachable_with_how_to_install_the_right_one(tmp_path, host_row):
    agent, world = agent_world(tmp_path, MDEV, host_row, token="a-token-from-before-rotation")
    with world as host:
        agent.url = host.server.url
        agent.save(update_fields=["url"])
        with pytest.raises(Unreachable) as caught:
            AgentDeviceManager.for_host(host_row).vgpu_types()
    assert str(caught.value) == ("Agent node-01-agent refused the device token (invalid bearer token): restart agent "
                                 "node-01-agent with --device-token-file holding the output of "
                                 "`python manage.py agent_device_token node-01-agent`.")


def test_an_agent_without_a_device_token_is_unreachable_saying_how_to_enable_it(tmp_path, host_row):
    agent, world = agent_world(tmp_path, SRIOV, host_row, token=None)
    with world as host:
        agent.url = host.server.url
        agent.save(update_fields=["url"])
        with pytest.raises(Unreachable) as caught:
            AgentDeviceManager.for_host(host_row).create_vgpu(SRIOV.gpu, SRIOV.two_fit)
    assert str(caught.value).startswith(f"Agent node-01-agent cannot create a {SRIOV.two_fit} on GPU {SRIOV.gpu}: "
                                        "this agent does not manage vGPU devices")
    assert str(caught.value).endswith("To enable it, restart agent node-01-agent with --device-token-file holding "
                                      "the output of `python manage.py agent_device_token node-01-agent`.")


def test_an_agent_that_does_not_answer_is_unreachable(host_row):
    polled_agent("node-01-agent", closed_port_url(), host=host_row)
    with pytest.raises(Unreachable) as caught:
        AgentDeviceManager.for_host(host_row).remove_vgpu(
            VgpuDevice(DeviceKind.MDEV, "0b9e1e1a-64e1-4c8b-9d55-1f2a3b4c5d6e", MDEV.gpu))
    assert str(caught.value).startswith("Agent node-01-agent could not be reached to remove vGPU "
                                        "0b9e1e1a-64e1-4c8b-9d55-1f2a3b4c5d6e: ")


def test_a_host_without_an_enabled_agent_is_unreachable(host_row):
    agent = polled_agent("node-01-agent", "http://127.0.0.1:9410", host=host_row)
    agent.enabled = False
    agent.save(update_fields=["enabled"])
    with pytest.raises(Unreachable) as caught:
        AgentDeviceManager.for_host(host_row)
    assert str(caught.value).startswith("No enabled host agent polls node-01:")


def test_the_device_token_command_prints_a_token_of_its_own(host_row):
    agent = polled_agent("node-01-agent", "http://127.0.0.1:9410", host=host_row)
    out = io.StringIO()
    call_command("agent_device_token", "node-01-agent", stdout=out)
    printed = out.getvalue().strip()
    assert printed == agent_device_token(agent)
    assert len(printed) == 64
    assert printed not in (agent.token, agent_write_token(agent))
    write = io.StringIO()
    call_command("scheduler_write_token", "node-01-agent", stdout=write)
    assert write.getvalue().strip() == agent_write_token(agent)


def test_a_kernel_refusal_of_another_kind_is_a_hypervisor_error_with_the_kernels_words(managed):
    manager, host = managed
    if host.layout is MDEV:
        target = host.root / "sys/devices/pci0000:00/0000:3b:00.0/mdev_supported_types/nvidia-233/create"
    else:
        target = host.root / "sys/devices/pci0000:00/0000:41:00.4/nvidia/current_vgpu_type"
    target.unlink()
    target.mkdir()  # writing it now fails with EISDIR, an error no refusal of the driver's means
    with pytest.raises(HypervisorError) as caught:
        manager.create_vgpu(host.layout.gpu, host.layout.two_fit)
    assert type(caught.value) is HypervisorError
    assert "(HTTP 500): the kernel refused" in str(caught.value)
    assert str(caught.value).endswith(": Is a directory.")


@pytest.mark.parametrize(("behaviour", "payload", "message"), [
    ("fixed", {"gpus": []}, "answered without a list of types."),
    ("http500", None, "could not list vGPU types (HTTP 500): collection failed; see the agent's log."),
])
def test_an_agent_answering_something_else_is_a_hypervisor_error(behaviour, payload, message):
    with FakeAgent(behaviour, payload=payload) as fake, pytest.raises(HypervisorError) as caught:
        AgentDeviceManager(fake.url, "token").vgpu_types()
    assert str(caught.value) == f"Agent {fake.url} {message}"

"""Drift on a simulated hypervisor (the `linked` world): changes made on the host, readings the
agent stores and operations under way, read back through `drift_queries.fleet_drift` as the page
and the API read it; and its query count, which does not grow with the fleet."""

import json
import time
from datetime import timedelta

import pytest
from django.utils import timezone

from fleet import services as fleet_services
from fleet.models import Vgpu
from fleet.tests.factories import GpuFactory, HostFactory, VirtualMachineFactory, profile
from hypervisors import services, sim_seed
from hypervisors.backends import sim
from hypervisors.drift import Do, Kind, Severity
from hypervisors.drift_queries import drift_snapshot, fleet_drift
from hypervisors.models import Operation
from telemetry.agent.sim_backend import SimBackend
from telemetry.demo import host_scenario
from telemetry.ingest import store_reports
from telemetry.models import Agent, GpuSample, VgpuSample
from telemetry.payload import parse_agent_payload


def kinds(items) -> list[tuple[str, str]]:
    return sorted((item.kind, item.vm_name) for item in items)


def read(linked):
    """The admin's "Compare with the inventory" (a stored read; drift never reads the host itself)."""
    report = services.sync_host(linked.host)
    assert report.ok, report.error
    return report


def agent_on(host, *gpus):
    """An enabled agent bound to the host, whose GPUs it read a moment ago."""
    Agent.objects.create(name=f"{host.name}-agent", url=f"http://{host.name}:9410", host=host)
    for gpu in gpus:
        GpuSample.objects.create(gpu=gpu, ts=timezone.now() - timedelta(seconds=5), util_gpu=10)


def vgpu_reading(vm, gpu, seconds_ago: float = 5):
    VgpuSample.objects.create(vm=vm, gpu=gpu, ts=timezone.now() - timedelta(seconds=seconds_ago), util_gpu=20)


@pytest.mark.django_db
def test_a_seeded_host_whose_agent_reads_every_vgpu_has_no_drift(linked):
    read(linked)
    agent_on(linked.host, linked.gpu_a, linked.gpu_b)
    vgpu_reading(linked.vm_a, linked.gpu_a)
    vgpu_reading(linked.vm_b, linked.gpu_b)
    assert fleet_drift() == []


@pytest.mark.django_db
def test_a_never_read_host_says_so_and_compares_nothing_else(linked):
    items = fleet_drift()
    assert kinds(items) == [(Kind.UNREAD, "")]
    assert items[0].message.startswith("node-01 is linked to its hypervisor but was never read")


@pytest.mark.django_db
def test_a_domain_defined_on_the_host_by_hand_with_a_vgpu(linked):
    device = linked.sim.create_vgpu(linked.gpu_a.pci_bus_id, "NVIDIA RTX6000-12Q")
    linked.sim.define_domain("render-tmp", vcpus=4, ram_mib=8192, vgpus=(device,), running=True)
    read(linked)

    (item,) = fleet_drift()
    assert (item.kind, item.severity, item.vm_name, item.gpu_id) == (Kind.UNKNOWN_VM, Severity.CRITICAL,
                                                                     "render-tmp", linked.gpu_a.pk)
    assert item.action.code == Do.SYNC_AND_APPLY
    assert item.inventory == "not in the inventory"

    services.apply_report(services.sync_host(linked.host), "all")
    read(linked)
    assert fleet_drift() == []


@pytest.mark.django_db
def test_an_inventory_vgpu_whose_domain_has_no_device(linked):
    linked.sim.change_domain(str(linked.vm_b.uuid), vgpus=[])
    read(linked)
    (item,) = fleet_drift()
    assert (item.kind, item.vm_id, item.gpu_id) == (Kind.MISSING_DEVICE, linked.vm_b.pk, linked.gpu_b.pk)
    assert item.severity == Severity.CRITICAL  # it runs without its vGPU
    assert item.hypervisor.endswith("running, no vGPU")


@pytest.mark.django_db
def test_the_agent_still_reporting_the_old_gpu_and_a_silent_vm(linked):
    read(linked)
    agent_on(linked.host, linked.gpu_a, linked.gpu_b)
    vgpu_reading(linked.vm_a, linked.gpu_a)
    vgpu_reading(linked.vm_a, linked.gpu_b)  # ws-a is on GPU A everywhere else
    items = fleet_drift()
    assert kinds(items) == [(Kind.AGENT_OLD_GPU, "ws-a"), (Kind.AGENT_SILENT, "ws-b")]
    old = next(i for i in items if i.kind == Kind.AGENT_OLD_GPU)
    assert old.gpu_id == linked.gpu_b.pk
    assert "the inventory and the hypervisor have it on 00000000:3B:00.0" in old.message
    silent = next(i for i in items if i.kind == Kind.AGENT_SILENT)
    assert silent.telemetry.startswith("no reading in the last")


@pytest.mark.django_db
def test_a_device_recreated_by_hand_shows_as_the_device_the_agent_reports(linked):
    """The demo's agent follows the simulated hypervisor and reports each vGPU's mdev UUID; ingest
    keeps it on the vGPU, and drift names the device the driver runs against the one last read."""
    read(linked)
    agent = Agent.objects.create(name="node-01-agent", url="http://node-01:9410", host=linked.host)
    backend = SimBackend(host_scenario(linked.host))

    def poll():
        now = time.time()
        body = {"agent": {"version": "1", "hostname": "node-01", "backend": "sim"}, "collected_at": now,
                "gpus": backend.collect(now)}
        store_reports([(agent, parse_agent_payload(json.dumps(body)))], received_at=now)

    poll()
    recorded = Vgpu.objects.get(vm=linked.vm_a)
    assert recorded.reported_device_id == recorded.device_id != ""
    assert fleet_drift() == []

    vm = str(linked.vm_a.uuid)  # by hand on the host: ws-a's device removed and made again
    linked.sim.shutdown(vm, timeout_s=5)
    old = linked.sim.domain(vm).vgpus[0]
    linked.sim.redefine(vm, sim.DomainSpec(vcpus=8, ram_mib=32768, vgpus=()))
    linked.sim.remove_vgpu(old)
    new = linked.sim.create_vgpu(linked.gpu_a.pci_bus_id, sim_seed.type_name_for("RTX6000-12Q"))
    linked.sim.redefine(vm, sim.DomainSpec(vcpus=8, ram_mib=32768, vgpus=(new,)))
    linked.sim.start(vm)
    poll()

    assert Vgpu.objects.get(vm=linked.vm_a).reported_device_id == new.id
    (item,) = fleet_drift()
    assert (item.kind, item.vm_name, item.gpu_id) == (Kind.AGENT_DEVICE, "ws-a", linked.gpu_a.pk)
    assert f"as device {new.id}; the hypervisor's last read has {old.id}" in item.message
    assert item.action.code == Do.SYNC


@pytest.mark.django_db
def test_readings_older_than_the_window_do_not_count(linked, settings):
    settings.TELEMETRY_STALE_AFTER_S = 60
    settings.TELEMETRY_POLL_INTERVAL_S = 10
    read(linked)
    vgpu_reading(linked.vm_a, linked.gpu_b, seconds_ago=120)
    assert fleet_drift() == []


@pytest.mark.django_db
def test_the_agent_reports_a_vm_on_a_host_the_inventory_does_not_place_it_on(linked):
    read(linked)
    other = HostFactory(name="node-02")
    gpu = GpuFactory(host=other, pci_bus_id="00000000:3B:00.0")
    vgpu_reading(linked.vm_a, linked.gpu_a)
    vgpu_reading(linked.vm_a, gpu)
    (item,) = fleet_drift()
    assert (item.kind, item.host_id, item.other_host_id) == (Kind.AGENT_OTHER_HOST, linked.host.pk, other.pk)


@pytest.mark.django_db
def test_a_vm_under_an_operation_is_not_drift(linked):
    linked.sim.change_domain(str(linked.vm_a.uuid), vgpus=[])
    read(linked)
    operation = Operation.objects.create(kind="resize", vm=linked.vm_a, host=linked.host, target_host=linked.host)
    (item,) = fleet_drift()
    assert (item.kind, item.action.operation_id) == (Kind.IN_OPERATION, operation.pk)
    assert item.message == (f"ws-a is being changed by operation #{operation.pk} (pending): its views differ until "
                            "it ends.")


@pytest.mark.django_db
def test_an_operation_that_ended_after_the_last_read_asks_for_a_new_one(linked):
    linked.sim.change_domain(str(linked.vm_a.uuid), vgpus=[])
    read(linked)
    operation = Operation.objects.create(kind="resize", status="succeeded", vm=linked.vm_a, host=linked.host,
                                         target_host=linked.host, finished_at=timezone.now())
    (item,) = fleet_drift()
    assert (item.kind, item.action.code, item.action.operation_id) == (Kind.STALE_READ, Do.SYNC, operation.pk)


@pytest.mark.django_db
def test_the_snapshot_costs_nine_queries_whatever_the_fleet(linked, django_assert_num_queries):
    read(linked)
    with django_assert_num_queries(9):
        small = drift_snapshot()
    for index in range(3):
        host = HostFactory(name=f"node-1{index}", hypervisor_uri=f"sim://node-1{index}")
        gpu = GpuFactory(host=host, pci_bus_id="00000000:3B:00.0")
        vm = VirtualMachineFactory(name=f"ws-x{index}")
        vgpu = fleet_services.place_vgpu(vm, gpu, profile("RTX6000-12Q"))
        Vgpu.objects.filter(pk=vgpu.pk).update(device_id=f"dev-{index}")
        sim_seed.seed_host(host)
        services.sync_host(host)
        agent_on(host, gpu)
        vgpu_reading(vm, gpu)
    with django_assert_num_queries(9):
        large = drift_snapshot()
    assert (len(small.vms), len(large.vms)) == (2, 5)
    assert len(large.domains) == 5

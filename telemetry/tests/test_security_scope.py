"""Agent tokens write only their own host's (or VM's) series, and no report grows the inventory
without bound: tried as an attacker holding one token would try it.

The fleet: render-01 (GPUs A1 and A2; VMs ws-lighting-01 and ws-layout-02 placed on them) and
render-02 (GPU B1; VM ws-victim-b placed on it). The attacker holds the push token of
render-01's nvidia-smi agent, or the in-guest token of ws-lighting-01, or runs a polled agent
or a dcgm-exporter registered for one host. Whatever they send, no sample of render-02's GPU
or of a VM outside their scope exists afterwards; the legitimate parts of the same report are
stored, and each dropped part is a drift row naming the agent.
"""

from __future__ import annotations

import copy
import time
import xml.etree.ElementTree as ET
from datetime import UTC, datetime
from pathlib import Path
from types import SimpleNamespace

import pytest
from rest_framework.test import APIClient

from fleet import services
from fleet.models import Gpu, GpuModel, Host, VirtualMachine
from fleet.tests.factories import VirtualMachineFactory, profile
from telemetry import collect
from telemetry.fetch import ConnectionPool
from telemetry.ingest import store_reports
from telemetry.models import Agent, AgentKind, AgentStatus, Drift, DriftKind, GpuSample, VgpuSample
from telemetry.tests.ingest_world import SHARED_CAPTURES, T0, gpu_reading, l40s_world, make_agent, report
from telemetry.tests.loopback import FakeAgent, inventory_host, polled_agent, sim_payload

pytestmark = pytest.mark.django_db

URL = "/api/v1/ingest/nvidia-smi/"
FIXTURES = Path(__file__).parent / "fixtures"
VGPU_HOST = FIXTURES / "nvidia-smi" / "l40s-vgpu-host-v13.xml"
GUEST = FIXTURES / "nvidia-smi" / "l40s-2q-guest-v13.xml"
DCGM = FIXTURES / "dcgm-exporter" / "render-07-l40s.prom"
T4_UUID = "GPU-d37e67a5-91dd-3774-a5cb-99096249601a"
# Children of a <gpu> the parser reads (and, for some, the one grandchild it reads): a clone
# keeps these only, so that 2,000 of them fit the default body limit.
READ_CHILDREN = {"product_name", "uuid", "pci", "fb_memory_usage", "utilization", "gpu_virtualization_mode",
                 "temperature", "power_readings", "gpu_power_readings", "clocks", "vgpus"}
READ_GRANDCHILD = {"pci": "pci_bus_id", "clocks": "sm_clock", "temperature": "gpu_temp"}


@pytest.fixture
def world() -> SimpleNamespace:
    w = l40s_world()
    w.victim = VirtualMachineFactory(name="ws-victim-b")
    services.place_vgpu(w.victim, w.far_gpu, profile("L40S-12Q"))
    w.pusher = make_agent("smi-render-01", host=w.host, kind=AgentKind.NVIDIA_SMI)
    return w


# -- documents, built from the real captures ------------------------------------------------------

def capture(path) -> ET.Element:
    return ET.fromstring(path.read_bytes())


def document(root: ET.Element) -> bytes:
    """The document stamped now, as nvidia-smi would print it at this instant (UTC host)."""
    root = copy.deepcopy(root)
    root.find("timestamp").text = f"{datetime.fromtimestamp(int(time.time()), tz=UTC):%a %b %d %H:%M:%S %Y}"
    return ET.tostring(root)


def as_gpu(template: ET.Element, uuid: str, pci_bus_id: str, *, name: str | None = None,
           keep_vgpus: bool = True) -> ET.Element:
    """A copy of a capture's <gpu> that claims to be GPU `uuid` at `pci_bus_id`, without the
    children the parser skips and without indentation."""
    gpu = copy.deepcopy(template)
    for child in list(gpu):
        if child.tag not in READ_CHILDREN or (child.tag == "vgpus" and not keep_vgpus):
            gpu.remove(child)
        elif child.tag in READ_GRANDCHILD:
            for grandchild in list(child):
                if grandchild.tag != READ_GRANDCHILD[child.tag]:
                    child.remove(grandchild)
    for element in gpu.iter():
        element.tail = None
        if element.text is not None and not element.text.strip():
            element.text = None
    gpu.set("id", pci_bus_id)
    gpu.find("uuid").text = uuid
    gpu.find("pci/pci_bus_id").text = pci_bus_id
    if name is not None:
        gpu.find("product_name").text = name
    return gpu


def push(agent: Agent | str, body: bytes, query: str = ""):
    token = agent if isinstance(agent, str) else agent.token
    return APIClient().post(URL + query, data=body, content_type="application/xml",
                            HTTP_AUTHORIZATION=f"Bearer {token}")


def open_drift(kind: str, subject: str) -> Drift:
    return Drift.objects.get(kind=kind, subject=subject, resolved_at__isnull=True)


def nothing_of_render_02(world) -> None:
    assert not GpuSample.objects.filter(gpu__host=world.other_host).exists()
    assert not VgpuSample.objects.filter(vm=world.victim).exists()
    assert not VgpuSample.objects.filter(gpu__host=world.other_host).exists()


# -- a push token of host A ------------------------------------------------------------------------

def test_host_as_push_token_aimed_at_host_bs_gpu_uuid_stores_only_host_as_gpu(world):
    root = capture(VGPU_HOST)  # render-01's GPU A1 with its vGPUs
    root.append(as_gpu(root.find("gpu"), world.far_gpu.uuid, world.far_gpu.pci_bus_id, keep_vgpus=False))

    response = push(world.pusher, document(root))

    assert response.status_code == 201, response.content
    body = response.json()
    assert (body["gpu_samples"], body["vgpu_samples"], body["out_of_scope"]) == (1, 2, 1)
    nothing_of_render_02(world)
    assert list(GpuSample.objects.values_list("gpu", flat=True)) == [world.gpu.pk]
    drift = open_drift(DriftKind.GPU_ELSEWHERE, world.far_gpu.uuid)
    assert drift.agent == world.pusher
    assert drift.detail.startswith(f"GPU {world.far_gpu.uuid} (NVIDIA L40S) is on host render-02 in the inventory "
                                   f"but is reported by agent smi-render-01 of host render-01. Nothing of it is "
                                   f"stored")
    world.pusher.refresh_from_db()
    assert world.pusher.status == AgentStatus.OK  # its own host's readings did arrive


def test_host_as_push_token_aimed_at_a_vm_of_host_b_by_name(world):
    response = push(world.pusher, document(capture(GUEST)), query="?hostname=ws-victim-b")

    assert response.status_code == 201, response.content
    assert response.json() == {"gpu_samples": 0, "vgpu_samples": 0, "drifts": 1, "discovered_gpus": 0,
                               "out_of_scope": 1}
    nothing_of_render_02(world)
    drift = open_drift(DriftKind.OUT_OF_SCOPE, "ws-victim-b from smi-render-01")
    assert drift.agent == world.pusher
    assert drift.detail == (f"Agent smi-render-01 of host render-01 reports VM ws-victim-b from inside, but the "
                            f"inventory places that VM on another host (GPU {world.far_gpu.uuid}); not stored: an "
                            f"agent writes only the series of VMs placed on its host's GPUs.")


def test_host_as_push_token_aimed_at_a_vm_of_host_b_by_uuid(world):
    root = capture(VGPU_HOST)
    stray = root.find("gpu/vgpus")[2]  # the capture's third instance, relabelled as the victim's
    stray.find("vm_uuid").text = str(world.victim.uuid)
    stray.find("vm_name").text = "ws-lighting-01"  # a name of render-01 does not launder the UUID

    response = push(world.pusher, document(root))

    assert response.status_code == 201, response.content
    assert (response.json()["vgpu_samples"], response.json()["out_of_scope"]) == (2, 1)
    nothing_of_render_02(world)
    # The legitimate parts of the document are stored: render-01's GPU and its two VMs.
    assert GpuSample.objects.get().gpu == world.gpu
    assert set(VgpuSample.objects.values_list("vm__name", flat=True)) == {"ws-lighting-01", "ws-layout-02"}
    drift = open_drift(DriftKind.OUT_OF_SCOPE, "ws-victim-b from smi-render-01")
    assert "reports VM ws-victim-b on GPU" in drift.detail


def test_an_unbound_push_token_cannot_claim_a_host_of_the_inventory(world):
    stray = make_agent("smi-unbound", kind=AgentKind.NVIDIA_SMI)
    root = capture(VGPU_HOST)
    root.append(as_gpu(root.find("gpu"), "GPU-9e9e9e9e-0000-4000-8000-000000000001", "00000000:C1:00.0"))

    response = push(stray, document(root), query="?hostname=render-02")

    assert response.status_code == 403
    assert response.json()["detail"] == (
        "report refused: agent smi-unbound is bound to no host, and its report is from host render-02, which is in "
        "the inventory; an admin binds agent smi-unbound to its host (or, for pushes from inside a VM, to its VM) "
        "before its reports are stored (host: render-02). Nothing of it was stored.")
    assert not GpuSample.objects.exists()
    assert not VgpuSample.objects.exists()
    assert not Gpu.objects.filter(uuid="GPU-9e9e9e9e-0000-4000-8000-000000000001").exists()
    stray.refresh_from_db()
    assert (stray.host, stray.status) == (None, AgentStatus.ERROR)
    assert stray.last_error.startswith("nvidia-smi push refused: report refused: agent smi-unbound is bound to no")


# -- bounded growth ----------------------------------------------------------------------------------

def many_gpus(count: int) -> bytes:
    """The Tesla T4 capture with `count` GPUs, each a board and a model the inventory does not know."""
    root = capture(SHARED_CAPTURES / "tesla-t4.xml")
    template = root.find("gpu")
    root.remove(template)
    for n in range(count):
        root.append(as_gpu(template, f"GPU-{n:08x}-6666-4000-8000-000000000000",
                           f"0000{n // 256:04X}:{n % 256:02X}:00.0", name=f"NVIDIA Phantom {n}"))
    return document(root)


def test_a_document_with_2000_unknown_gpus_is_refused_and_creates_nothing(world, settings):
    body = many_gpus(2000)
    assert len(body) < settings.TELEMETRY_MAX_RESPONSE_BYTES  # refused for what it names, not for its size
    counts = (Host.objects.count(), Gpu.objects.count(), GpuModel.objects.count())

    response = push(world.pusher, body)

    assert response.status_code == 400
    assert response.json()["detail"] == (
        "report refused: it names 2000 GPUs the inventory does not know, and one report may add at most 16 "
        "(TELEMETRY_MAX_NEW_GPUS); add a larger server's GPUs by hand, or raise the limit. Nothing of it was stored.")
    assert (Host.objects.count(), Gpu.objects.count(), GpuModel.objects.count()) == counts
    assert not GpuSample.objects.exists()
    assert not Drift.objects.exists()
    world.pusher.refresh_from_db()
    assert "it names 2000 GPUs the inventory does not know" in world.pusher.last_error


def test_up_to_the_limit_a_report_discovers_beyond_it_nothing(world, settings):
    settings.TELEMETRY_MAX_NEW_GPUS = 3
    readings = [gpu_reading(f"GPU-new-{n}", index=n, name=f"NVIDIA Phantom {n}", pci_bus_id=f"00000000:E{n}:00.0")
                for n in range(4)]

    over = store_reports([(world.agent, report("render-01", [gpu_reading(world.gpu.uuid), *readings]))],
                         received_at=T0)
    at_limit = store_reports([(world.agent, report("render-01", readings[:3], T0 + 10))], received_at=T0 + 10)

    assert "it names 4 GPUs the inventory does not know, and one report may add at most 3" in \
        over.errors[world.agent.pk]
    assert world.agent.pk not in over.forbidden
    assert (at_limit.errors, at_limit.discovered_gpus, at_limit.gpu_samples) == ({}, 3, 3)
    assert GpuModel.objects.filter(name__startswith="NVIDIA Phantom").count() == 3
    # The refused report left nothing, not even the known GPU's reading.
    assert GpuSample.objects.filter(gpu=world.gpu).count() == 0


def test_a_poll_naming_2000_unknown_gpus_is_the_agents_error_and_creates_nothing():
    host = inventory_host("render-31", gpus=1, vgpus_per_gpu=1)
    payload = sim_payload(host)
    template = payload["gpus"][0]
    payload["gpus"] = [{**template, "uuid": f"GPU-{n:08x}-7777-4000-8000-000000000000", "index": n,
                        "name": f"NVIDIA Phantom {n}", "pci_bus_id": f"0000{n // 256:04X}:{n % 256:02X}:00.0",
                        "vgpus": []} for n in range(2000)]
    counts = (Gpu.objects.count(), GpuModel.objects.count())

    with FakeAgent("fixed", payload=payload) as fake:
        agent = polled_agent("render-31", fake.url, host=host)
        result = collect.poll_batch([agent.pk], pool=ConnectionPool())

    agent.refresh_from_db()
    assert (result.ok, result.failed) == (0, 1)
    assert agent.status == AgentStatus.ERROR
    assert agent.last_error.startswith("report refused: it names 2000 GPUs the inventory does not know")
    assert (Gpu.objects.count(), GpuModel.objects.count()) == counts
    assert not GpuSample.objects.exists()


# -- polled sources ----------------------------------------------------------------------------------

def test_a_polled_agent_reporting_another_hosts_gpus_lands_on_its_own_host_only():
    mine = inventory_host("render-21", gpus=2, vgpus_per_gpu=1)
    theirs = inventory_host("render-22", gpus=1, vgpus_per_gpu=2)
    payload = sim_payload(mine)
    payload["gpus"] += sim_payload(theirs)["gpus"]  # render-22's GPUs, with their VMs and scheduler state
    foreign = Gpu.objects.get(host=theirs)

    with FakeAgent("fixed", payload=payload) as fake:
        agent = polled_agent("render-21", fake.url, host=mine)
        result = collect.poll_batch([agent.pk], pool=ConnectionPool())

    assert (result.ok, result.gpu_samples, result.vgpu_samples) == (1, 2, 2)
    assert result.stats.out_of_scope == 3  # render-22's GPU and its two vGPUs
    assert not GpuSample.objects.filter(gpu__host=theirs).exists()
    assert not VgpuSample.objects.filter(vm__host=theirs).exists()
    foreign.refresh_from_db()
    assert foreign.scheduler_reported is None, "nor the scheduler state of a GPU that is not its host's"
    assert Gpu.objects.filter(host=mine, scheduler_reported__isnull=False).count() == 2
    drift = open_drift(DriftKind.GPU_ELSEWHERE, foreign.uuid)
    assert drift.agent_id == agent.pk
    assert "is on host render-22 in the inventory but is reported by agent render-21 of host render-21" in drift.detail


def test_a_dcgm_exporter_naming_another_hosts_gpu_stores_only_its_own_hosts():
    mine = Host.objects.create(name="render-07", cpu_threads=64, ram_gib=512)
    theirs = Host.objects.create(name="render-08", cpu_threads=64, ram_gib=512)
    taken = Gpu.objects.create(host=theirs, gpu_model=profile("L40S-12Q").gpu_model,
                               uuid="GPU-2f6b0a3e-7c41-4d9a-b1e2-8f3c5d7a9b10", pci_bus_id="00000000:3B:00.0")

    with FakeAgent("text", body=DCGM.read_bytes(), content_type="text/plain; version=0.0.4") as exporter:
        agent = polled_agent("render-07-dcgm", exporter.url + "/metrics", host=mine, kind=AgentKind.DCGM_EXPORTER)
        result = collect.poll_batch([agent.pk], pool=ConnectionPool())

    assert (result.ok, result.gpu_samples, result.errors) == (1, 2, {})
    assert not GpuSample.objects.filter(gpu=taken).exists()
    taken.refresh_from_db()
    assert taken.host == theirs  # not moved either
    assert set(Gpu.objects.filter(host=mine).values_list("pci_bus_id", flat=True)) == {
        "00000000:5E:00.0", "00000000:86:00.0"}
    assert open_drift(DriftKind.GPU_ELSEWHERE, taken.uuid).agent_id == agent.pk


# -- a token bound to one VM (in-guest pushes) -------------------------------------------------------

@pytest.fixture
def guest(world, admin_api):
    """An in-guest push agent of ws-lighting-01, registered by an admin through the API."""
    created = admin_api.post("/api/v1/agents/", {"name": "guest-lighting", "kind": "nvidia-smi",
                                                 "vm": world.lighting.pk}, format="json")
    assert created.status_code == 201, created.content
    body = created.json()
    assert (body["vm"], body["host"], body["url"]) == (world.lighting.pk, None, "")
    world.guest_token = body["token"]
    world.guest = Agent.objects.get(pk=body["id"])
    return world


def test_the_vm_bound_token_writes_its_own_vms_vgpu(guest):
    response = push(guest.guest_token, document(capture(GUEST)))  # hostname: the VM's own by default

    assert response.status_code == 201, response.content
    assert (response.json()["vgpu_samples"], response.json()["out_of_scope"]) == (1, 0)
    sample = VgpuSample.objects.get()
    assert (sample.vm, sample.gpu, sample.fb_used_mib) == (guest.lighting, guest.gpu, 612)


def test_the_vm_bound_token_cannot_write_another_vms_series(guest):
    response = push(guest.guest_token, document(capture(GUEST)), query="?hostname=ws-layout-02")
    by_host_name = push(guest.guest_token, document(capture(GUEST)), query="?hostname=ws-victim-b")

    assert (response.status_code, by_host_name.status_code) == (201, 201)
    assert response.json()["out_of_scope"] == 1
    assert not VgpuSample.objects.exists()
    drift = open_drift(DriftKind.OUT_OF_SCOPE, "ws-layout-02 from guest-lighting")
    assert drift.detail == ("Agent guest-lighting is bound to VM ws-lighting-01: it may write that VM's readings "
                            "only, but its report is for VM ws-layout-02; not stored.")
    assert drift.agent == guest.guest
    assert open_drift(DriftKind.OUT_OF_SCOPE, "ws-victim-b from guest-lighting")


def test_the_vm_bound_token_cannot_write_a_gpu_series_nor_discover_one(guest):
    host_side = push(guest.guest_token, document(capture(VGPU_HOST)))  # render-01's GPU A1, its vGPUs
    unknown = push(guest.guest_token, document(capture(SHARED_CAPTURES / "tesla-t4.xml")))

    assert (host_side.status_code, unknown.status_code) == (201, 201)
    assert (host_side.json()["gpu_samples"], host_side.json()["vgpu_samples"], host_side.json()["out_of_scope"]) == (
        0, 0, 4)
    assert (unknown.json()["discovered_gpus"], unknown.json()["out_of_scope"]) == (0, 1)
    assert not GpuSample.objects.exists()
    assert not VgpuSample.objects.exists()
    assert not Gpu.objects.filter(uuid=T4_UUID).exists()
    drift = open_drift(DriftKind.OUT_OF_SCOPE, "GPUs from guest-lighting")
    assert drift.detail.startswith("Agent guest-lighting is bound to VM ws-lighting-01: it may write that VM's vGPU "
                                   "readings only, never a GPU's. Its report named 1 physical GPU(s)")


def test_a_vm_bound_token_dies_with_its_vm(world, admin_api):
    created = admin_api.post("/api/v1/agents/", {"name": "guest-idle", "kind": "nvidia-smi", "vm": world.idle.pk},
                             format="json").json()

    assert admin_api.delete(f"/api/v1/vms/{world.idle.pk}/").status_code == 204

    assert not Agent.objects.filter(pk=created["id"]).exists()
    assert push(created["token"], document(capture(GUEST))).status_code == 401


@pytest.mark.parametrize(("body", "message"), [
    ({"kind": "nvidia-smi", "host": "HOST", "vm": "VM"}, "An agent is bound to a host or to a VM, not to both"),
    ({"kind": "nvml", "url": "http://ws-lighting-01:9410", "vm": "VM"},
     "Only nvidia-smi agents (documents pushed from inside the VM) are bound to a VM; an agent of kind nvml"),
])
def test_the_api_refuses_an_agent_bound_to_a_vm_and_a_host_or_polled(world, admin_api, body, message):
    body = {"name": "guest-x", **{k: world.host.pk if v == "HOST" else world.lighting.pk if v == "VM" else v
                                  for k, v in body.items()}}

    response = admin_api.post("/api/v1/agents/", body, format="json")
    binding_a_host_agent = admin_api.patch(f"/api/v1/agents/{world.pusher.pk}/", {"vm": world.lighting.pk},
                                           format="json")

    assert response.status_code == 400
    assert message in response.json()["vm"][0]
    assert binding_a_host_agent.status_code == 400
    assert "not to both" in binding_a_host_agent.json()["vm"][0]
    assert not Agent.objects.filter(name="guest-x").exists()
    assert Agent.objects.get(pk=world.pusher.pk).vm is None


def test_the_admin_site_adds_a_vm_bound_agent_and_shows_its_token_once(world, staff):
    form = {"name": "guest-admin", "kind": "nvidia-smi", "url": "", "vm": world.lighting.pk, "enabled": "on",
            "timeout_s": "3"}

    both = staff.post("/admin/telemetry/agent/add/", {**form, "host": world.host.pk})
    added = staff.post("/admin/telemetry/agent/add/", form)

    assert both.status_code == 200
    assert "An agent is bound to a host or to a VM, not to both." in both.content.decode()
    agent = Agent.objects.get(name="guest-admin")
    assert (agent.vm, agent.host) == (world.lighting, None)
    assert agent.token in added.content.decode()
    assert push(agent, document(capture(GUEST))).json()["vgpu_samples"] == 1
    assert VirtualMachine.objects.get(agents=agent) == world.lighting


def test_one_batch_of_several_agents_scopes_each_report_to_its_own_agent(world):
    """One store of two agents of render-01: a report's hostname changes nothing, only its agent's host counts."""
    polled = make_agent("agent-render-01-b", host=world.host)
    stats = store_reports([
        (polled, report("render-01", [gpu_reading(world.gpu.uuid), gpu_reading(world.far_gpu.uuid, index=1)])),
        (world.pusher, report("render-02", [gpu_reading(world.gpu_2.uuid, pci_bus_id=world.gpu_2.pci_bus_id)])),
    ], received_at=T0)

    assert (stats.gpu_samples, stats.out_of_scope, stats.errors) == (2, 1, {})
    assert set(GpuSample.objects.values_list("gpu__host__name", flat=True)) == {"render-01"}
    assert list(Drift.objects.values_list("kind", "subject")) == [(DriftKind.GPU_ELSEWHERE, world.far_gpu.uuid)]

"""The agent's scheduler write path over real HTTP on loopback: the agent server with the sim
backend, and the dashboard applying a GPU's policy through it (fleet.scheduler_policies)."""

import http.client
import json

import pynvml
import pytest

from fleet.models import AuditEvent, Gpu, SchedulerPolicy
from fleet.scheduler import SchedulerSettings as S
from fleet.scheduler_policies import agent_write_token, apply_through_agent, set_gpu_policy
from telemetry.agent.nvml_backend import NvmlBackend
from telemetry.agent.scenario import build_scenario
from telemetry.agent.scheduler_write import SchedulerRefused
from telemetry.agent.server import AgentServer
from telemetry.agent.sim_backend import SimBackend
from telemetry.demo import host_scenario
from telemetry.ingest import store_reports
from telemetry.payload import parse_agent_payload
from telemetry.tests.fake_nvml import FakeNvml, vgpu_host
from telemetry.tests.loopback import inventory_host, polled_agent, serving

READ, WRITE = "read-token", "write-token"
UUID = "GPU-11111111-2222-3333-4444-555555555555"


def scenario(vgpus: int = 0) -> dict:
    return {"hostname": "h", "gpus": [{
        "uuid": UUID, "name": "Tesla T4", "pci_bus_id": "00000000:86:00.0", "fb_total_mib": 15360,
        "vgpus": [{"vm_name": f"vm-{n}", "vm_uuid": None, "type_name": "T4-4Q", "fb_mib": 4096,
                   "workflow": "modeling", "user_type": "medium"} for n in range(vgpus)],
    }]}


def put(server, body, token: str | None = WRITE, uuid: str = UUID):
    conn = http.client.HTTPConnection(*server.server_address[:2], timeout=5)
    headers = {"Content-Type": "application/json"}
    if token is not None:
        headers["Authorization"] = f"Bearer {token}"
    try:
        conn.request("PUT", f"/v1/gpus/{uuid}/scheduler", body=json.dumps(body).encode(), headers=headers)
        response = conn.getresponse()
        return response.status, json.loads(response.read())
    finally:
        conn.close()


def agent(vgpus: int = 0, write_token: str | None = WRITE):
    raw = scenario(vgpus)
    backend = SimBackend(build_scenario(raw["hostname"], raw["gpus"]))
    return serving(AgentServer(("127.0.0.1", 0), backend, READ, "h", write_token=write_token))


EQUAL_ARR = {"policy": "equal_share", "arr": True, "frequency_hz": 480, "avg_factor": 33}


def test_applied_on_an_empty_gpu_and_reported_by_the_next_scrape():
    with agent() as server:
        status, body = put(server, EQUAL_ARR)
        metrics = server.metrics_body()
    assert status == 200
    assert body["scheduler"] == {"policy": "equal_share", "arr_mode": "enabled", "avg_factor": 33,
                                 "timeslice_ms": pytest.approx(2.083, abs=1e-3), "frequency_hz": 480}
    assert json.loads(metrics)["gpus"][0]["scheduler"]["policy"] == "equal_share"


def test_refused_with_409_while_vgpus_exist():
    with agent(vgpus=2) as server:
        status, body = put(server, EQUAL_ARR)
        metrics = json.loads(server.metrics_body())
    assert status == 409
    assert body == {"error": "the GPU holds 2 active vGPUs; the scheduler changes only on a GPU without vGPUs"}
    assert metrics["gpus"][0]["scheduler"]["policy"] == "best_effort"


def test_read_only_agent_answers_403():
    with agent(write_token=None) as server:
        status, body = put(server, EQUAL_ARR, token=READ)
    assert status == 403
    assert body["error"].startswith("read-only agent")


@pytest.mark.parametrize("token", [READ, "wrong", None])
def test_wrong_or_missing_write_token_is_401(token):
    with agent() as server:
        status, body = put(server, EQUAL_ARR, token=token)
    assert status == 401
    assert body["error"] in ("invalid bearer token", "missing bearer token")


@pytest.mark.parametrize(("body", "error"), [
    ({"policy": "round_robin"}, "policy must be one of best_effort, equal_share, fixed_share"),
    ({"policy": "best_effort", "arr": True}, "best effort has no adaptive round-robin"),
    ({"policy": "equal_share", "arr": True, "frequency_hz": 1000}, "frequency_hz must be an integer from 63 to 960"),
    ({"policy": "equal_share", "arr": True, "timeslice_ms": 3}, "timeslice_ms applies only with arr off"),
])
def test_bad_settings_are_400(body, error):
    with agent() as server:
        status, answer = put(server, body)
    assert (status, answer) == (400, {"error": error})


def test_unknown_gpu_is_404():
    with agent() as server:
        status, _ = put(server, EQUAL_ARR, uuid="GPU-00000000-0000-0000-0000-000000000000")
    assert status == 404


# -- the dashboard applying through the agent ---------------------------------------------------

def dashboard_agent(host, write: bool = True):
    row = polled_agent(f"agent-{host.name}", "http://127.0.0.1:1", host=host)
    backend = SimBackend(host_scenario(host, timezone="UTC"))
    server = AgentServer(("127.0.0.1", 0), backend, row.token, host.name,
                         write_token=agent_write_token(row) if write else None)
    return row, server


@pytest.mark.django_db
def test_dashboard_applies_through_the_agent_and_stores_the_reading(admin_user):
    host = inventory_host("apply-host", gpus=1, vgpus_per_gpu=0)
    gpu = Gpu.objects.get(host=host)
    row, server = dashboard_agent(host)
    with serving(server):
        row.url = server.url
        row.save()
        set_gpu_policy(gpu, S("fixed_share", timeslice_ms=5), admin_user)
        policy = apply_through_agent(gpu, admin_user)
    assert (policy.apply_state, policy.apply_detail) == ("applied", f"applied by agent {row.name}")
    assert policy.applied_at is not None
    gpu.refresh_from_db()
    assert gpu.scheduler_reported["policy"] == "fixed_share"
    assert gpu.scheduler_reported["timeslice_ms"] == 5
    event = AuditEvent.objects.get(action="scheduler_policy.apply")
    assert (event.before["apply_state"], event.after["apply_state"]) == ("applying", "applied")


@pytest.mark.django_db
def test_dashboard_apply_while_vgpus_exist_stays_staged_with_the_agents_reason(admin_user):
    host = inventory_host("busy-host", gpus=1, vgpus_per_gpu=1)
    gpu = Gpu.objects.get(host=host)
    row, server = dashboard_agent(host)
    with serving(server):
        row.url = server.url
        row.save()
        policy = apply_through_agent(gpu, admin_user)  # the driver default, copied into the GPU's row
    assert policy.apply_state == "staged"
    assert policy.apply_detail == (f"agent {row.name} refused (HTTP 409): the GPU holds 1 active vGPU; the "
                                   "scheduler changes only on a GPU without vGPUs")
    assert AuditEvent.objects.filter(action="scheduler_policy.apply").count() == 1


@pytest.mark.django_db
def test_dashboard_apply_to_a_read_only_agent_fails_with_its_answer(admin_user):
    host = inventory_host("ro-host", gpus=1, vgpus_per_gpu=0)
    gpu = Gpu.objects.get(host=host)
    row, server = dashboard_agent(host, write=False)
    with serving(server):
        row.url = server.url
        row.save()
        policy = apply_through_agent(gpu, admin_user)
    assert policy.apply_state == "failed"
    assert policy.apply_detail.startswith(f"agent {row.name} failed (HTTP 403): read-only agent")


@pytest.mark.django_db
def test_dashboard_apply_to_an_unreachable_agent_fails(admin_user):
    host = inventory_host("gone-host", gpus=1, vgpus_per_gpu=0)
    gpu = Gpu.objects.get(host=host)
    polled_agent("gone", "http://127.0.0.1:9", host=host, timeout_s=0.5)
    policy = apply_through_agent(gpu, admin_user)
    assert policy.apply_state == "failed"
    assert "could not be reached" in policy.apply_detail
    assert SchedulerPolicy.objects.get(gpu=gpu).apply_state == "failed"


@pytest.mark.django_db
def test_ingest_stores_the_scheduler_reading_only_when_it_changes():
    host = inventory_host("ingest-host", gpus=1, vgpus_per_gpu=0)
    gpu = Gpu.objects.get(host=host)
    row = polled_agent("ingest-agent", "http://127.0.0.1:1", host=host)
    backend = SimBackend(host_scenario(host, timezone="UTC"))

    def report():
        return parse_agent_payload({"agent": {"version": "1", "hostname": host.name, "backend": "sim"},
                                    "collected_at": 1_700_000_000.0, "gpus": backend.collect(1_700_000_000.0)})

    store_reports([(row, report())], received_at=1_700_000_000.0)
    gpu.refresh_from_db()
    assert gpu.scheduler_reported["policy"] == "best_effort"
    first_at = gpu.scheduler_reported_at
    assert first_at is not None

    store_reports([(row, report())], received_at=1_700_000_010.0)
    gpu.refresh_from_db()
    assert gpu.scheduler_reported_at == first_at  # unchanged reading: no write

    backend.set_scheduler(gpu.uuid, {"policy": "equal_share", "arr": False, "frequency_hz": None,
                                     "avg_factor": None, "timeslice_ms": 3})
    store_reports([(row, report())], received_at=1_700_000_020.0)
    gpu.refresh_from_db()
    assert (gpu.scheduler_reported["policy"], gpu.scheduler_reported["timeslice_ms"]) == ("equal_share", 3)


# -- the NVML backend (pynvml faked) -----------------------------------------------------------

class SettableNvml(FakeNvml):
    """FakeNvml plus nvmlDeviceSetVgpuSchedulerState, keeping the C struct it was given."""

    c_nvmlVgpuSchedulerSetState_t = pynvml.c_nvmlVgpuSchedulerSetState_t

    def __init__(self, gpus):
        super().__init__(gpus)
        self.set_states = []

    def nvmlDeviceSetVgpuSchedulerState(self, h, state):
        self._enter("nvmlDeviceSetVgpuSchedulerState", h)
        self.set_states.append(state)
        arr = pynvml.NVML_VGPU_SCHEDULER_ARR_ENABLE if state.enableARRMode else pynvml.NVML_VGPU_SCHEDULER_ARR_DISABLE
        if state.enableARRMode:
            params = state.schedulerParams.vgpuSchedDataWithARR
            h.scheduler = (state.schedulerPolicy, arr, params.avgFactor, 1_000_000_000 // params.frequency)
        else:
            h.scheduler = (state.schedulerPolicy, arr, 0, state.schedulerParams.vgpuSchedData.timeslice)


def nvml_backend(**overrides):
    nvml = SettableNvml([vgpu_host(**overrides)])
    backend = NvmlBackend(nvml)
    return nvml, backend, nvml.nvmlDeviceGetUUID(nvml.gpus[0])


def test_nvml_builds_the_set_state_struct_with_arr_and_reads_it_back():
    nvml, backend, uuid = nvml_backend(vgpus=[])
    reading = backend.set_scheduler(uuid, {"policy": "fixed_share", "arr": True, "frequency_hz": 960,
                                           "avg_factor": 20, "timeslice_ms": None})
    state = nvml.set_states[0]
    assert (state.schedulerPolicy, state.enableARRMode) == (3, 1)
    assert (state.schedulerParams.vgpuSchedDataWithARR.avgFactor,
            state.schedulerParams.vgpuSchedDataWithARR.frequency) == (20, 960)
    assert (reading["policy"], reading["arr_mode"], reading["avg_factor"], reading["frequency_hz"]) == (
        "fixed_share", "enabled", 20, 960)


def test_nvml_sends_the_time_slice_in_nanoseconds():
    nvml, backend, uuid = nvml_backend(vgpus=[])
    reading = backend.set_scheduler(uuid, {"policy": "equal_share", "arr": False, "frequency_hz": None,
                                           "avg_factor": None, "timeslice_ms": 3})
    assert nvml.set_states[0].schedulerParams.vgpuSchedData.timeslice == 3_000_000
    assert (reading["policy"], reading["timeslice_ms"]) == ("equal_share", 3.0)


def test_nvml_refuses_with_409_while_vgpus_are_active():
    nvml, backend, uuid = nvml_backend()
    with pytest.raises(SchedulerRefused) as caught:
        backend.set_scheduler(uuid, {"policy": "equal_share", "arr": True})
    assert caught.value.status == 409
    assert caught.value.message == ("the GPU holds 2 active vGPUs; the scheduler changes only on a GPU "
                                    "without vGPUs")
    assert nvml.set_states == []


@pytest.mark.parametrize(("code", "status"), [
    (pynvml.NVML_ERROR_NOT_SUPPORTED, 501), (pynvml.NVML_ERROR_NO_PERMISSION, 403),
    (pynvml.NVML_ERROR_IN_USE, 409), (pynvml.NVML_ERROR_INVALID_ARGUMENT, 400), (pynvml.NVML_ERROR_UNKNOWN, 500),
])
def test_nvml_errors_map_to_http_statuses(code, status):
    nvml, backend, uuid = nvml_backend(vgpus=[])
    nvml.errors["nvmlDeviceSetVgpuSchedulerState"] = code
    with pytest.raises(SchedulerRefused) as caught:
        backend.set_scheduler(uuid, {"policy": "best_effort", "arr": False})
    assert caught.value.status == status
    assert caught.value.message.startswith("NVML refused the scheduler change: ")


def test_agent_refuses_to_start_with_the_read_token_as_its_write_token(tmp_path, capsys):
    from telemetry.agent.__main__ import main

    (tmp_path / "read").write_text("same-token\n", encoding="utf-8")
    (tmp_path / "write").write_text("same-token\n", encoding="utf-8")
    (tmp_path / "read").chmod(0o600)
    (tmp_path / "write").chmod(0o600)
    code = main(["--listen", "127.0.0.1:0", "--token-file", str(tmp_path / "read"),
                 "--write-token-file", str(tmp_path / "write"), "--backend", "sim"])
    assert code == 2
    assert capsys.readouterr().err == (
        "telemetry.agent: error: the write token must differ from the read token\n")

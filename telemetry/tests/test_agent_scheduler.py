"""The agent's scheduler write path over real HTTP on loopback: the agent server with the sim
backend, the collector learning from its metrics whether it holds a write token, and the
dashboard applying a GPU's policy through it (fleet.scheduler_policies)."""

import http.client
import json
import re
import signal
import subprocess
from types import SimpleNamespace

import pynvml
import pytest
from django.test import Client
from rest_framework.test import APIClient

from fleet.models import AuditEvent, Gpu, SchedulerPolicy
from fleet.scheduler import SchedulerSettings as S
from fleet.scheduler_policies import set_gpu_policy
from telemetry import collect
from telemetry.agent.nvml_backend import NvmlBackend
from telemetry.agent.scenario import build_scenario
from telemetry.agent.scheduler_write import SchedulerRefused
from telemetry.agent.server import AgentServer
from telemetry.agent.sim_backend import SimBackend
from telemetry.demo import host_scenario
from telemetry.fetch import ConnectionPool
from telemetry.ingest import store_reports
from telemetry.models import Agent
from telemetry.payload import PayloadError, Report, parse_agent_payload
from telemetry.scheduler_apply import AgentUnavailable, agent_write_token, apply_through_agent
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
    """PUT `body` (JSON-encoded, or bytes sent as they are) to the agent; (status, decoded answer)."""
    conn = http.client.HTTPConnection(*server.server_address[:2], timeout=5)
    headers = {"Content-Type": "application/json"}
    if token is not None:
        headers["Authorization"] = f"Bearer {token}"
    raw = body if isinstance(body, bytes) else json.dumps(body).encode()
    try:
        conn.request("PUT", f"/v1/gpus/{uuid}/scheduler", body=raw, headers=headers)
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
    ({"policy": "equal_share", "frequency_hz": 480}, "frequency_hz and avg_factor apply only with arr on"),
    ({"policy": "equal_share", "arr": "yes"}, "arr must be true or false"),
    ({"policy": "equal_share", "arr": True, "avg_factor": 61}, "avg_factor must be an integer from 1 to 60"),
    ({"policy": "fixed_share", "timeslice_ms": 31}, "timeslice_ms must be an integer from 1 to 30"),
    ({"policy": "fixed_share", "timeslice_ms": True}, "timeslice_ms must be an integer from 1 to 30"),
    (["equal_share"], "the body must be a JSON object"),
])
def test_bad_settings_are_400(body, error):
    with agent() as server:
        status, answer = put(server, body)
    assert (status, answer) == (400, {"error": error})


@pytest.mark.parametrize(("body", "error"), [
    (b"{", "the body is not valid JSON"),
    (b"", "send a JSON body of 1 to 4096 bytes"),
    (b" " * 4097, "Content-Length '4097' is over the 4096-byte limit of a request body"),
])
def test_a_body_that_is_not_json_or_has_a_bad_size_is_400(body, error):
    with agent() as server:
        status, answer = put(server, body)
    assert (status, answer) == (400, {"error": error})


def test_unknown_gpu_is_404():
    with agent() as server:
        status, _ = put(server, EQUAL_ARR, uuid="GPU-00000000-0000-0000-0000-000000000000")
    assert status == 404


# -- the agent saying whether it holds a write token ------------------------------------------

def test_metrics_carry_scheduler_write_only_when_the_agent_holds_a_write_token():
    with agent() as writable:
        document = json.loads(writable.metrics_body())
    with agent(write_token=None) as read_only:
        plain = json.loads(read_only.metrics_body())
    assert document["agent"]["scheduler_write"] is True
    assert "scheduler_write" not in plain["agent"]  # absent means false, as from agents before the field
    assert parse_agent_payload(document).scheduler_write is True
    assert parse_agent_payload(plain).scheduler_write is False


def test_a_scheduler_write_flag_that_is_not_a_boolean_is_refused():
    with agent() as server:
        document = json.loads(server.metrics_body())
    document["agent"]["scheduler_write"] = "yes"
    with pytest.raises(PayloadError) as caught:
        parse_agent_payload(document)
    assert str(caught.value) == "agent.scheduler_write: expected true or false, got 'yes'"


# -- the dashboard applying through the agent ---------------------------------------------------

def dashboard_agent(host, write: bool = True):
    row = polled_agent(f"agent-{host.name}", "http://127.0.0.1:1", host=host)
    backend = SimBackend(host_scenario(host, timezone="UTC"))
    server = AgentServer(("127.0.0.1", 0), backend, row.token, host.name,
                         write_token=agent_write_token(row) if write else None)
    return row, server


def poll(row, server):
    """One collector poll of the agent over HTTP, as beat runs it: the dashboard learns from the
    agent's metrics whether it holds a write token."""
    Agent.objects.filter(pk=row.pk).update(url=server.url)
    result = collect.poll_batch([row.pk], pool=ConnectionPool())
    assert (result.ok, result.errors) == (1, {})
    row.refresh_from_db()


def staff_clients(user):
    web, api = Client(), APIClient()
    web.force_login(user)
    api.force_authenticate(user)
    return web, api


@pytest.mark.django_db
def test_collector_learns_whether_the_agent_holds_a_write_token_and_the_page_follows(admin_user):
    host = inventory_host("flag-host", gpus=1, vgpus_per_gpu=0)
    gpu = Gpu.objects.get(host=host)
    row, server = dashboard_agent(host, write=False)
    web, api = staff_clients(admin_user)
    with serving(server):
        poll(row, server)
    assert row.scheduler_write is False
    html = web.get(f"/scheduler/gpus/{gpu.pk}/").content.decode()
    assert "Apply through the agent" not in html
    assert "The agent of flag-host runs without a write token: apply the commands below by hand." in html
    assert f"python manage.py scheduler_write_token {row.name}" in html
    assert api.get(f"/api/v1/gpus/{gpu.pk}/scheduler/").json()["agent_can_apply"] is False

    writable = AgentServer(("127.0.0.1", 0), SimBackend(host_scenario(host, timezone="UTC")), row.token, host.name,
                           write_token=agent_write_token(row))
    with serving(writable):
        poll(row, writable)
    assert row.scheduler_write is True
    html = web.get(f"/scheduler/gpus/{gpu.pk}/").content.decode()
    assert "Apply through the agent</button>" in html
    assert "runs without a write token" not in html
    assert api.get(f"/api/v1/gpus/{gpu.pk}/scheduler/").json()["agent_can_apply"] is True
    assert api.get(f"/api/v1/agents/{row.pk}/").json()["scheduler_write"] is True


@pytest.mark.django_db
def test_reports_of_other_sources_leave_the_flag_alone():
    host = inventory_host("push-host", gpus=1, vgpus_per_gpu=0)
    row = polled_agent("push-agent", "http://127.0.0.1:1", host=host)
    Agent.objects.filter(pk=row.pk).update(scheduler_write=True)
    row.refresh_from_db()
    store_reports([(row, Report(hostname=host.name, backend="nvidia-smi", collected_at=1_700_000_000.0, gpus=[]))],
                  received_at=1_700_000_000.0)
    row.refresh_from_db()
    assert row.scheduler_write is True


@pytest.mark.django_db
def test_dashboard_applies_through_the_agent_and_stores_the_reading(admin_user):
    host = inventory_host("apply-host", gpus=1, vgpus_per_gpu=0)
    gpu = Gpu.objects.get(host=host)
    row, server = dashboard_agent(host)
    with serving(server):
        poll(row, server)
        set_gpu_policy(gpu, S("fixed_share", timeslice_ms=5), admin_user)
        policy = apply_through_agent(gpu, admin_user)
    assert (policy.apply_state, policy.apply_detail) == ("applied", f"applied by agent {row.name}")
    assert policy.applied_at is not None
    gpu.refresh_from_db()
    assert gpu.scheduler_reported["policy"] == "fixed_share"
    assert gpu.scheduler_reported["timeslice_ms"] == 5
    event = AuditEvent.objects.get(action="scheduler_policy.apply")
    assert (event.before["apply_state"], event.after["apply_state"]) == ("applying", "applied")
    assert event.comment == f"applied by agent {row.name}"


@pytest.mark.django_db
def test_api_apply_over_http_is_applied_and_audited_with_the_admin(admin_user):
    host = inventory_host("api-host", gpus=1, vgpus_per_gpu=0)
    gpu = Gpu.objects.get(host=host)
    row, server = dashboard_agent(host)
    _, api = staff_clients(admin_user)
    with serving(server):
        poll(row, server)
        api.put(f"/api/v1/gpus/{gpu.pk}/scheduler/", {"policy": "equal_share", "arr": True, "frequency_hz": 960,
                                                       "avg_factor": 20}, format="json")
        response = api.post(f"/api/v1/gpus/{gpu.pk}/scheduler/apply/")
    assert response.status_code == 200
    body = response.json()
    assert (body["apply_state"], body["drift"]) == ("applied", [])
    assert (body["reported"]["policy"], body["reported"]["frequency_hz"], body["reported"]["avg_factor"]) == (
        "equal_share", 960, 20)
    event = AuditEvent.objects.get(action="scheduler_policy.apply")
    assert (event.actor, event.source) == (admin_user, "api")


@pytest.mark.django_db
def test_dashboard_apply_while_vgpus_exist_stays_staged_with_the_agents_reason(admin_user):
    host = inventory_host("busy-host", gpus=1, vgpus_per_gpu=1)
    gpu = Gpu.objects.get(host=host)
    row, server = dashboard_agent(host)
    web, _ = staff_clients(admin_user)
    with serving(server):
        poll(row, server)
        set_gpu_policy(gpu, S("equal_share", arr=True), admin_user)
        response = web.post(f"/scheduler/gpus/{gpu.pk}/apply/", follow=True)
    policy = SchedulerPolicy.objects.get(gpu=gpu)
    reason = (f"agent {row.name} refused (HTTP 409): the GPU holds 1 active vGPU; the scheduler changes only on "
              "a GPU without vGPUs")
    assert (policy.apply_state, policy.apply_detail) == ("staged", reason)
    assert f"Staged until the GPU is empty or the driver reloads: {reason}" in response.content.decode()
    event = AuditEvent.objects.get(action="scheduler_policy.apply")
    assert (event.actor, event.source, event.after["apply_state"]) == (admin_user, "web", "staged")


@pytest.mark.django_db
def test_apply_through_an_agent_without_a_write_token_is_refused_before_asking_it(admin_user):
    host = inventory_host("ro-host", gpus=1, vgpus_per_gpu=0)
    gpu = Gpu.objects.get(host=host)
    row, server = dashboard_agent(host, write=False)
    web, api = staff_clients(admin_user)
    message = (f"The agent of ro-host runs without a write token: apply the commands by hand, or restart {row.name} "
               f"with --write-token-file holding the output of `python manage.py scheduler_write_token {row.name}`.")
    with serving(server):
        poll(row, server)
        with pytest.raises(AgentUnavailable) as caught:
            apply_through_agent(gpu, admin_user)
        response = api.post(f"/api/v1/gpus/{gpu.pk}/scheduler/apply/")
        page = web.post(f"/scheduler/gpus/{gpu.pk}/apply/", follow=True)
    assert str(caught.value) == message
    assert (response.status_code, response.json()) == (409, {"detail": message})
    assert message in page.content.decode().replace("&#x27;", "'")
    assert not SchedulerPolicy.objects.exists()
    assert not AuditEvent.objects.filter(action__startswith="scheduler_policy").exists()


@pytest.mark.django_db
def test_agent_restarted_read_only_since_its_last_poll_fails_with_its_answer(admin_user):
    host = inventory_host("stale-host", gpus=1, vgpus_per_gpu=0)
    gpu = Gpu.objects.get(host=host)
    row, server = dashboard_agent(host)
    with serving(server):
        poll(row, server)
    read_only = AgentServer(("127.0.0.1", 0), SimBackend(host_scenario(host, timezone="UTC")), row.token, host.name)
    with serving(read_only):
        Agent.objects.filter(pk=row.pk).update(url=read_only.url)
        policy = apply_through_agent(gpu, admin_user)
    assert policy.apply_state == "failed"
    assert policy.apply_detail == (f"agent {row.name} failed (HTTP 403): read-only agent: start it with "
                                   "--write-token-file to apply scheduler changes")
    assert AuditEvent.objects.get(action="scheduler_policy.apply").after["apply_state"] == "failed"


@pytest.mark.django_db
def test_dashboard_apply_to_an_unreachable_agent_fails(admin_user):
    host = inventory_host("gone-host", gpus=1, vgpus_per_gpu=0)
    gpu = Gpu.objects.get(host=host)
    row = polled_agent("gone", "http://127.0.0.1:9", host=host, timeout_s=0.5)
    Agent.objects.filter(pk=row.pk).update(scheduler_write=True)  # as its last report said
    policy = apply_through_agent(gpu, admin_user)
    assert policy.apply_state == "failed"
    assert policy.apply_detail.startswith("agent gone failed (no answer): the agent at http://127.0.0.1:9 could "
                                          "not be reached")
    assert SchedulerPolicy.objects.get(gpu=gpu).apply_state == "failed"


@pytest.mark.django_db
def test_gpu_without_a_uuid_cannot_be_applied_through_the_agent(admin_user):
    host = inventory_host("nouuid-host", gpus=1, vgpus_per_gpu=0)
    gpu = Gpu.objects.get(host=host)
    Gpu.objects.filter(pk=gpu.pk).update(uuid="")
    gpu.refresh_from_db()
    row = polled_agent("nouuid", "http://127.0.0.1:9", host=host)
    Agent.objects.filter(pk=row.pk).update(scheduler_write=True)
    with pytest.raises(AgentUnavailable) as caught:
        apply_through_agent(gpu, admin_user)
    assert str(caught.value) == "The GPU has no UUID yet (no agent reading); apply the commands by hand."


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


def test_agent_process_started_with_a_write_token_says_so_and_takes_changes_to_the_driver(tmp_path):
    from telemetry.tests.test_agent_cli import REPO, agent_command, clean_env

    for name, token in (("read", READ), ("write", WRITE)):
        (tmp_path / name).write_text(token + "\n", encoding="utf-8")
        (tmp_path / name).chmod(0o600)
    process = subprocess.Popen(
        agent_command("--listen", "127.0.0.1:0", "--token-file", str(tmp_path / "read"),
                      "--write-token-file", str(tmp_path / "write"), "--backend", "sim"),
        cwd=REPO, env=clean_env(), stderr=subprocess.PIPE, text=True,
    )
    try:
        port = int(re.search(r"on http://127\.0\.0\.1:(\d+)", process.stderr.readline()).group(1))
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
        conn.request("GET", "/v1/metrics", headers={"Authorization": f"Bearer {READ}"})
        metrics = json.loads(conn.getresponse().read())
        conn.close()
        assert metrics["agent"]["scheduler_write"] is True
        # The proof-of-concept scenario's GPUs all hold vGPUs: the driver (simulated) refuses.
        status, answer = put(SimpleNamespace(server_address=("127.0.0.1", port)), EQUAL_ARR,
                             uuid=metrics["gpus"][0]["uuid"])
    finally:
        process.send_signal(signal.SIGTERM)
        process.wait(timeout=10)
        process.stderr.close()
    assert (status, answer) == (409, {"error": "the GPU holds 2 active vGPUs; the scheduler changes only on a GPU "
                                               "without vGPUs"})

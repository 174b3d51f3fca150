"""POST /api/v1/ingest/nvidia-smi/: agent-token pushes of nvidia-smi documents, and agent tokens
opening nothing else."""

from __future__ import annotations

import re
import time
from datetime import UTC, datetime, timedelta

import pytest
from rest_framework.test import APIClient

from fleet.api_tokens import issue_token
from fleet.models import Gpu
from fleet.tests.factories import UserFactory
from telemetry.models import AgentKind, AgentStatus, GpuSample, VgpuSample
from telemetry.tests.ingest_world import OWN_FIXTURES, SHARED_CAPTURES, l40s_world, make_agent

pytestmark = pytest.mark.django_db

URL = "/api/v1/ingest/nvidia-smi/"
T4_UUID = "GPU-d37e67a5-91dd-3774-a5cb-99096249601a"


def stamped(path, moment: datetime) -> bytes:
    """A capture re-stamped at `moment` (its zoneless local time), as if nvidia-smi ran then."""
    raw = path.read_text()
    return re.sub(r"<timestamp>[^<]*</timestamp>", f"<timestamp>{moment:%a %b %d %H:%M:%S %Y}</timestamp>",
                  raw, count=1).encode()


def now_s() -> datetime:
    return datetime.fromtimestamp(int(time.time()), tz=UTC)


@pytest.fixture
def pusher():
    world = l40s_world()
    world.pusher = make_agent("smi-render-01", host=world.host, kind=AgentKind.NVIDIA_SMI)
    return world


def push(agent, body: bytes, content_type: str = "application/xml", query: str = "", **headers):
    client = APIClient()
    if agent is not None:
        headers.setdefault("HTTP_AUTHORIZATION", f"Bearer {agent.token}")
    return client.post(URL + query, data=body, content_type=content_type, **headers)


def test_push_stores_a_sample_and_discovers_the_gpu(pusher):
    moment = now_s() - timedelta(seconds=2)

    response = push(pusher.pusher, stamped(SHARED_CAPTURES / "tesla-t4.xml", moment))

    assert response.status_code == 201, response.content
    assert response.json() == {"gpu_samples": 1, "vgpu_samples": 0, "drifts": 1, "discovered_gpus": 1,
                               "out_of_scope": 0}
    gpu = Gpu.objects.select_related("gpu_model").get(uuid=T4_UUID)
    assert (gpu.host, gpu.gpu_model.name, gpu.pci_bus_id) == (pusher.host, "Tesla T4", "00000000:00:1E.0")
    sample = GpuSample.objects.get(gpu=gpu)
    assert sample.ts == moment
    assert (sample.util_gpu, sample.fb_used_mib, sample.fb_total_mib, sample.temp_c, sample.power_w,
            sample.sm_clock_mhz) == (0, 1032, 15360, 40, 26.78, 585)
    pusher.pusher.refresh_from_db()
    assert pusher.pusher.last_seen is not None
    assert pusher.pusher.status == AgentStatus.OK
    assert pusher.pusher.clock_skew_s == pytest.approx(-2, abs=1.5)


def test_the_same_document_pushed_twice_is_stored_once(pusher):
    body = stamped(SHARED_CAPTURES / "rtx-3080-v13.xml", now_s())

    first = push(pusher.pusher, body)
    time.sleep(1.1)
    again = push(pusher.pusher, body)

    assert (first.status_code, again.status_code) == (201, 201)
    assert again.json()["gpu_samples"] == 0
    assert GpuSample.objects.count() == 1
    assert GpuSample.objects.get().util_gpu == 65


def test_a_host_in_another_time_zone_is_stamped_in_utc(pusher):
    moment = now_s()
    local = moment.astimezone(UTC) + timedelta(hours=5, minutes=30)  # the host's clock reads IST

    response = push(pusher.pusher, stamped(SHARED_CAPTURES / "h200-v13.xml", local))

    assert response.status_code == 201, response.content
    assert GpuSample.objects.get().ts == moment


def test_text_xml_is_accepted_too(pusher):
    response = push(pusher.pusher, stamped(SHARED_CAPTURES / "quadro-p2000-v12.xml", now_s()), "text/xml")
    assert response.status_code == 201


def test_a_guest_vm_pushes_its_vgpu_under_its_own_name(pusher):
    body = stamped(OWN_FIXTURES / "nvidia-smi" / "l40s-2q-guest-v13.xml", now_s())

    response = push(pusher.pusher, body, query="?hostname=ws-lighting-01")

    assert response.status_code == 201, response.content
    assert response.json()["vgpu_samples"] == 1
    sample = VgpuSample.objects.get()
    assert (sample.vm, sample.gpu, sample.fb_used_mib) == (pusher.lighting, pusher.gpu, 612)
    assert not GpuSample.objects.exists()


def _refused(agent, response, status: int, message: str) -> None:
    assert response.status_code == status, response.content
    assert message in response.json()["detail"]
    agent.refresh_from_db()
    assert message in agent.last_error
    assert agent.last_error.startswith("nvidia-smi push refused: ")
    assert agent.last_error_at is not None
    assert agent.status == AgentStatus.ERROR
    assert agent.consecutive_failures == 1
    assert not GpuSample.objects.exists()
    assert not Gpu.objects.filter(uuid=T4_UUID).exists()


def test_malformed_xml_is_a_400_recorded_on_the_agent(pusher):
    body = stamped(SHARED_CAPTURES / "tesla-t4.xml", now_s())[:5000]
    _refused(pusher.pusher, push(pusher.pusher, body), 400, "malformed XML: ")


def test_an_xml_bomb_is_refused_unexpanded(pusher):
    bomb = b"""<?xml version="1.0"?>
<!DOCTYPE nvidia_smi_log [<!ENTITY a "aaaaaaaaaa"><!ENTITY b "&a;&a;&a;&a;&a;&a;&a;&a;&a;&a;">
<!ENTITY c "&b;&b;&b;&b;&b;&b;&b;&b;&b;&b;"><!ENTITY d "&c;&c;&c;&c;&c;&c;&c;&c;&c;&c;">]>
<nvidia_smi_log><timestamp>&d;</timestamp></nvidia_smi_log>"""
    _refused(pusher.pusher, push(pusher.pusher, bomb), 400, "refused XML: ")


def test_a_wrong_value_is_refused_with_its_path(pusher):
    body = stamped(SHARED_CAPTURES / "tesla-t4.xml", now_s()).replace(b"<gpu_util>0 %", b"<gpu_util>lots %")
    _refused(pusher.pusher, push(pusher.pusher, body), 400,
             "gpu[0]/utilization/gpu_util: expected a value like '12 %', got 'lots %'")


def test_a_stale_document_is_refused_for_its_clock(pusher):
    # The capture as it was taken in 2023: no time zone explains that.
    _refused(pusher.pusher, push(pusher.pusher, (SHARED_CAPTURES / "tesla-t4.xml").read_bytes()), 400,
             "report refused: stamped 2023-04-2")


def test_an_empty_body_is_refused(pusher):
    _refused(pusher.pusher, push(pusher.pusher, b""), 400, "empty body: expected an nvidia-smi -q -x document")


def test_a_document_over_the_size_limit_is_413(pusher, settings):
    settings.TELEMETRY_MAX_RESPONSE_BYTES = 10_000
    body = stamped(SHARED_CAPTURES / "tesla-t4.xml", now_s())
    assert len(body) > 10_000
    _refused(pusher.pusher, push(pusher.pusher, body), 413, "The document exceeds 10000 bytes")


def test_json_is_not_an_nvidia_smi_document(pusher):
    _refused(pusher.pusher, push(pusher.pusher, b'{"gpus": []}', "application/json"), 415,
             'Unsupported media type "application/json" in request.')


def test_missing_or_wrong_token_is_401_with_a_bearer_challenge(pusher):
    body = stamped(SHARED_CAPTURES / "tesla-t4.xml", now_s())

    missing = push(None, body)
    wrong = push(None, body, HTTP_AUTHORIZATION="Bearer not-the-token")
    malformed = push(None, body, HTTP_AUTHORIZATION="Bearer two words")

    for response in (missing, wrong, malformed):
        assert response.status_code == 401
        assert response["WWW-Authenticate"] == 'Bearer realm="vgpu-fleet-ingest"'
    assert wrong.json()["detail"] == "Invalid agent token."
    assert not GpuSample.objects.exists()


def test_a_rotated_token_stops_working(pusher):
    old = pusher.pusher.token
    pusher.pusher.rotate_token()
    pusher.pusher.save()

    response = push(None, stamped(SHARED_CAPTURES / "tesla-t4.xml", now_s()), HTTP_AUTHORIZATION=f"Bearer {old}")

    assert response.status_code == 401


def test_a_disabled_agent_is_403(pusher):
    pusher.pusher.enabled = False
    pusher.pusher.save()

    response = push(pusher.pusher, stamped(SHARED_CAPTURES / "tesla-t4.xml", now_s()))

    assert response.status_code == 403
    assert response.json()["detail"] == "Agent smi-render-01 is disabled; an admin must enable it before it can push."
    assert not GpuSample.objects.exists()


def test_a_polled_agents_token_cannot_push(pusher):
    response = push(pusher.agent, stamped(SHARED_CAPTURES / "tesla-t4.xml", now_s()))

    assert response.status_code == 403
    assert "is of kind nvml; only nvidia-smi agents push documents" in response.json()["detail"]


def test_a_session_cannot_push(pusher, admin_user):
    session = APIClient()
    session.force_login(admin_user)

    body = stamped(SHARED_CAPTURES / "tesla-t4.xml", now_s())

    response = session.post(URL, data=body, content_type="application/xml")

    assert response.status_code == 401
    assert not GpuSample.objects.exists()


@pytest.mark.parametrize("scope", ["ingest", "write"])
def test_an_admins_ingest_or_write_token_pushes_for_the_agent_it_names(pusher, admin_user, scope):
    _, key = issue_token(admin_user, "smi cron", scope=scope)

    response = push(None, stamped(SHARED_CAPTURES / "tesla-t4.xml", now_s()), query="?agent=smi-render-01",
                    HTTP_AUTHORIZATION=f"Token {key}")

    assert response.status_code == 201, response.content
    gpu = Gpu.objects.get(uuid=T4_UUID)
    assert gpu.host == pusher.host  # stored in the agent's scope, as if the agent had pushed
    assert GpuSample.objects.filter(gpu=gpu).count() == 1
    pusher.pusher.refresh_from_db()
    assert pusher.pusher.last_seen is not None


def test_a_token_push_is_refused_without_a_pushing_agent_or_by_a_read_token_or_an_artist(pusher, admin_user):
    body = stamped(SHARED_CAPTURES / "tesla-t4.xml", now_s())
    _, ingest_key = issue_token(admin_user, scope="ingest")
    _, read_key = issue_token(admin_user, scope="read")
    _, artist_key = issue_token(UserFactory(username="ana"), scope="ingest")
    disabled = make_agent("smi-off", host=pusher.host, kind=AgentKind.NVIDIA_SMI, enabled=False)

    def token_push(key, query=""):
        return push(None, body, query=query, HTTP_AUTHORIZATION=f"Token {key}")

    cases = {
        "no agent": (token_push(ingest_key), 400, {"agent": [
            "Required with an API token: the name of the nvidia-smi agent this document is pushed for."]}),
        "unknown agent": (token_push(ingest_key, "?agent=nope"), 400, {"agent": ["No agent is named 'nope'."]}),
        "NUL": (token_push(ingest_key, "?agent=a%00b"), 400, {"agent": [f"No agent is named {'a' + chr(0) + 'b'!r}."]}),
        "disabled": (token_push(ingest_key, f"?agent={disabled.name}"), 403, {
            "detail": "Agent smi-off is disabled; an admin must enable it before it can push."}),
        "polled": (token_push(ingest_key, f"?agent={pusher.agent.name}"), 403, {
            "detail": f"Agent {pusher.agent.name} is of kind nvml; only nvidia-smi agents push documents "
                      f"(the others are polled)."}),
        "read token": (token_push(read_key, "?agent=smi-render-01"), 403, {
            "detail": "This API token's scope is read: it may read (GET, HEAD, OPTIONS) but not POST. Use a token "
                      "with scope write."}),
        "artist": (token_push(artist_key, "?agent=smi-render-01"), 403, {
            "detail": "Only a fleet admin's API token may push documents for an agent."}),
        "agent token naming another": (push(pusher.pusher, body, query=f"?agent={disabled.name}"), 400, {"agent": [
            "This agent token pushes for agent smi-render-01 only; leave ?agent= out."]}),
    }
    got = {name: (response.status_code, response.json()) for name, (response, _, _) in cases.items()}
    assert got == {name: (status, body) for name, (_, status, body) in cases.items()}
    assert not GpuSample.objects.exists()


@pytest.mark.parametrize(("method", "path"), [
    ("get", "/api/v1/hosts/"),
    ("get", "/api/v1/gpus/"),
    ("get", "/api/v1/vms/"),
    ("get", "/api/v1/agents/"),
    ("post", "/api/v1/hosts/"),
    ("post", "/api/v1/vgpus/"),
    ("get", "/api/schema/"),
])
@pytest.mark.parametrize("scheme", ["Bearer", "Token"])
def test_an_agent_token_opens_nothing_but_ingest(pusher, method, path, scheme):
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"{scheme} {pusher.pusher.token}")

    response = getattr(client, method)(path, {"name": "sneaky", "cpu_threads": 8, "ram_gib": 8}, format="json")

    assert response.status_code in (401, 403), (path, response.status_code)
    assert response.status_code == 401 or path == "/api/schema/"


def test_the_schema_documents_the_endpoint_and_its_token(admin_api):
    schema = admin_api.get("/api/schema/", HTTP_ACCEPT="application/vnd.oai.openapi+json").json()

    operation = schema["paths"][URL]["post"]
    assert set(operation["responses"]) == {"201", "400", "401", "403", "413", "415"}
    assert operation["security"] == [{"agentToken": []}, {"tokenAuth": []}]
    assert "agent" in {parameter["name"] for parameter in operation["parameters"]}
    assert set(operation["requestBody"]["content"]) == {"application/xml", "text/xml"}
    assert schema["components"]["securitySchemes"]["agentToken"] == {"type": "http", "scheme": "bearer"}


def test_a_body_without_content_type_is_415(pusher):
    response = APIClient().generic("POST", URL, stamped(SHARED_CAPTURES / "tesla-t4.xml", now_s()), content_type="",
                                   HTTP_AUTHORIZATION=f"Bearer {pusher.pusher.token}")
    assert response.status_code == 415
    pusher.pusher.refresh_from_db()
    assert pusher.pusher.last_error.startswith("nvidia-smi push refused: Unsupported media type")

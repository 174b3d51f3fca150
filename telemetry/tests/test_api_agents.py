"""The agents API: staff only, the token shown once, status as the collector left it; and the admin."""

from __future__ import annotations

import re

import pytest
from django.utils import timezone

from telemetry import collect
from telemetry.models import Agent, GpuSample
from telemetry.tests.loopback import closed_port_url, inventory_host, polled_agent, real_agent

pytestmark = pytest.mark.django_db

LIST = "/api/v1/agents/"
FIELDS = {"id", "name", "url", "kind", "host", "vm", "enabled", "timeout_s", "last_seen", "status", "last_error",
          "last_error_at", "consecutive_failures", "scheduler_write"}


@pytest.fixture
def agent():
    return polled_agent("gpu-01", "http://10.0.0.1:9410")


@pytest.mark.parametrize(
    ("method", "path"),
    [("get", LIST), ("post", LIST), ("get", "{detail}"), ("patch", "{detail}"), ("delete", "{detail}"),
     ("post", "{detail}rotate-token/")],
)
def test_role_matrix(api, artist_api, admin_api, agent, method, path):
    url = path.format(detail=f"{LIST}{agent.pk}/")
    body = {"name": "new", "url": "http://10.0.0.2:9410"} if method in ("post", "patch") else None

    anonymous = getattr(api, method)(url, body, format="json")
    artist = getattr(artist_api, method)(url, body, format="json")
    admin = getattr(admin_api, method)(url, body, format="json")

    assert anonymous.status_code == 401
    assert anonymous.has_header("WWW-Authenticate")
    assert artist.status_code == 403
    assert artist.json()["detail"] == "Only fleet admins (staff) may see or manage agents."
    assert admin.status_code in (200, 201, 204)


def test_list_shows_status_and_errors_but_never_a_token(admin_api, agent):
    collect.record_outcomes([collect.PollOutcome(agent=agent, attempted_at=timezone.now(),
                                                 error="connection refused by http://10.0.0.1:9410/v1/metrics")])
    body = admin_api.get(LIST).json()

    assert body["count"] == 1
    row = body["results"][0]
    assert set(row) == FIELDS
    assert row["status"] == "error"
    assert row["last_error"].startswith("connection refused")
    assert row["consecutive_failures"] == 1
    assert agent.token not in str(body)


def test_create_returns_the_token_once_and_it_works_against_the_agent(admin_api):
    host = inventory_host("gpu-07", gpus=1, vgpus_per_gpu=1)
    created = admin_api.post(LIST, {"name": "gpu-07", "url": "http://gpu-07.studio.lan:9410", "host": host.pk},
                             format="json")

    assert created.status_code == 201
    body = created.json()
    token = body["token"]
    assert re.fullmatch(r"[0-9a-f]{64}", token)
    assert body["status"] == "new"
    detail = admin_api.get(f"{LIST}{body['id']}/").json()
    assert "token" not in detail
    assert token not in str(admin_api.get(LIST).json())
    assert Agent.objects.get(pk=body["id"]).token_sha256 != token, "stored hashed, not in clear"

    # The agent started with that token is polled successfully.
    with real_agent(host, token) as server:
        admin_api.patch(f"{LIST}{body['id']}/", {"url": server.url}, format="json")
        result = collect.poll_batch([body["id"]])
    assert result.ok == 1
    assert GpuSample.objects.filter(gpu__host=host).count() == 1
    assert admin_api.get(f"{LIST}{body['id']}/").json()["status"] == "ok"


def test_rotate_token_issues_a_new_token_once_and_revokes_the_old(admin_api):
    host = inventory_host("gpu-08", gpus=1, vgpus_per_gpu=0)
    agent = polled_agent("gpu-08", "http://placeholder", host=host)
    old = agent.token

    rotated = admin_api.post(f"{LIST}{agent.pk}/rotate-token/")

    assert rotated.status_code == 200
    new = rotated.json()["token"]
    assert rotated.json() == {"id": agent.pk, "name": "gpu-08", "token": new}
    assert new != old
    # An agent still holding the old token refuses the collector, which says so.
    with real_agent(host, old) as server:
        Agent.objects.filter(pk=agent.pk).update(url=server.url)
        result = collect.poll_batch([agent.pk])
    assert "HTTP 401" in result.errors["gpu-08"]
    assert "token" not in admin_api.get(f"{LIST}{agent.pk}/").json()


def test_polled_kinds_need_a_url_and_a_sane_timeout(admin_api):
    no_url = admin_api.post(LIST, {"name": "a", "kind": "dcgm-exporter"}, format="json")
    zero_timeout = admin_api.post(LIST, {"name": "b", "url": "http://h:9410", "timeout_s": 0}, format="json")
    pushes = admin_api.post(LIST, {"name": "c", "kind": "nvidia-smi"}, format="json")

    assert no_url.status_code == 400
    assert "http://host:9400/metrics for dcgm-exporter" in no_url.json()["url"][0]
    assert zero_timeout.status_code == 400
    assert "timeout_s" in zero_timeout.json()
    assert pushes.status_code == 201, "nvidia-smi documents are pushed: no URL to poll"
    assert pushes.json()["token"]


def test_filter_by_status(admin_api):
    ok = polled_agent("ok-agent", "http://h1:9410")
    broken = polled_agent("broken-agent", closed_port_url())
    Agent.objects.filter(pk=ok.pk).update(last_seen=timezone.now())
    collect.poll_batch([broken.pk])
    polled_agent("new-agent", "http://h3:9410")

    names = {status: [row["name"] for row in admin_api.get(LIST, {"status": status}).json()["results"]]
             for status in ("ok", "error", "new", "stale", "disabled")}

    assert names == {"ok": ["ok-agent"], "error": ["broken-agent"], "new": ["new-agent"], "stale": [],
                     "disabled": []}


def test_list_query_count_does_not_grow_with_agents(admin_api, django_assert_max_num_queries):
    host = inventory_host("many", gpus=0)
    for n in range(30):
        polled_agent(f"agent-{n:02d}", f"http://h{n}:9410", host=host)
    with django_assert_max_num_queries(4):
        response = admin_api.get(LIST, {"limit": 100})
    assert response.json()["count"] == 30


def test_schema_documents_the_token_only_where_it_is_shown(admin_api):
    schema = admin_api.get("/api/schema/", HTTP_ACCEPT="application/vnd.oai.openapi+json").json()
    components = schema["components"]["schemas"]
    assert "token" not in components["Agent"]["properties"]
    assert "token" in components["AgentWithToken"]["properties"]
    assert "/api/v1/agents/{id}/rotate-token/" in schema["paths"]
    assert schema["paths"]["/api/v1/agents/"]["post"]["responses"]["201"]["content"]["application/json"][
        "schema"]["$ref"].endswith("/AgentWithToken")


# -- admin site -----------------------------------------------------------------------------------


@pytest.fixture
def admin_client_logged_in(client, admin_user):
    client.force_login(admin_user)
    return client


def test_admin_changelist_shows_status_and_last_error(admin_client_logged_in):
    broken = polled_agent("broken-agent", closed_port_url())
    collect.poll_batch([broken.pk])
    html = admin_client_logged_in.get("/admin/telemetry/agent/").content.decode()
    assert "broken-agent" in html
    assert ">Error<" in html
    assert "connection refused by" in html


def test_admin_rotate_action_shows_the_new_token_once(admin_client_logged_in):
    agent = polled_agent("gpu-09", "http://h:9410")
    old = agent.token
    response = admin_client_logged_in.post("/admin/telemetry/agent/", {
        "action": "issue_new_tokens", "_selected_action": [agent.pk],
    })
    agent.refresh_from_db()
    html = response.content.decode()
    assert response.status_code == 200
    assert agent.token != old
    assert agent.token in html
    assert "no-store" in response["Cache-Control"] or "no-cache" in response["Cache-Control"]
    assert agent.token not in admin_client_logged_in.get(f"/admin/telemetry/agent/{agent.pk}/change/").content.decode()


def test_admin_add_shows_the_token(admin_client_logged_in):
    response = admin_client_logged_in.post("/admin/telemetry/agent/add/", {
        "name": "gpu-10", "kind": "nvml", "url": "http://gpu-10.studio.lan:9410", "enabled": "on", "timeout_s": "3",
    })
    assert response.status_code == 200
    assert response.context.get("adminform") is None or not response.context["adminform"].form.errors, (
        response.context["adminform"].form.errors)
    agent = Agent.objects.get(name="gpu-10")
    assert agent.token in response.content.decode()


def test_admin_samples_are_read_only(admin_client_logged_in):
    assert admin_client_logged_in.get("/admin/telemetry/gpusample/").status_code == 200
    assert admin_client_logged_in.get("/admin/telemetry/gpusample/add/").status_code == 403
    assert admin_client_logged_in.get("/admin/telemetry/drift/").status_code == 200
    assert admin_client_logged_in.get("/admin/telemetry/drift/add/").status_code == 403


@pytest.mark.parametrize("url", ["http://gpu-01:9410", "https://render-07.studio.lan:9400/metrics"])
def test_short_studio_host_names_are_accepted(admin_api, url):
    """Studio networks name hosts without a domain; an admin must be able to register them."""
    created = admin_api.post(LIST, {"name": "short", "url": url}, format="json")
    assert created.status_code == 201, created.json()
    assert created.json()["url"] == url


@pytest.mark.parametrize("url", ["ftp://gpu-01:9410", "gpu-01:9410", "http://:9410", "http://gpu-01:99999"])
def test_bad_agent_urls_are_refused_and_nothing_is_stored(admin_api, url):
    refused = admin_api.post(LIST, {"name": "bad", "url": url}, format="json")
    assert refused.status_code == 400
    assert "url" in refused.json()
    assert not Agent.objects.filter(name="bad").exists()

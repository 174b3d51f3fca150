"""The audit log of agents and drift (API and admin site), and of what an agent's report adds
to the inventory: who, from where, before and after, and never a token."""

from __future__ import annotations

import json

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from fleet.models import AuditEvent, Gpu, GpuModel, Host
from fleet.tests.factories import GpuFactory
from telemetry.ingest import store_reports
from telemetry.models import Agent, Drift, DriftKind
from telemetry.tests.ingest_world import T0, gpu_reading, l40s_world, make_agent, report
from telemetry.tests.loopback import polled_agent

pytestmark = pytest.mark.django_db

LIST = "/api/v1/agents/"


@pytest.fixture
def staff_client(client, admin_user):
    client.force_login(admin_user)
    return client


def only(action: str) -> AuditEvent:
    (event,) = AuditEvent.objects.filter(action=action)
    return event


def assert_no_secret(agent: Agent) -> None:
    """No event anywhere holds the agent's token, its salt or its hash."""
    logged = json.dumps(list(AuditEvent.objects.values("before", "after", "comment")))
    for secret in (agent.token, agent.token_salt, agent.token_sha256):
        assert secret not in logged


# API ----------------------------------------------------------------------------------------


def test_api_create_update_rotate_and_delete_are_recorded_without_the_token(admin_api, admin_user):
    created = admin_api.post(LIST, {"name": "gpu-11", "url": "http://10.0.0.11:9410"}, format="json")
    assert created.status_code == 201, created.content
    agent = Agent.objects.get(name="gpu-11")
    first_token = created.json()["token"]

    assert admin_api.patch(f"{LIST}{agent.pk}/", {"timeout_s": 5}, format="json").status_code == 200
    rotated = admin_api.post(f"{LIST}{agent.pk}/rotate-token/")
    assert rotated.status_code == 200
    agent.refresh_from_db()
    assert_no_secret(agent)
    assert first_token not in json.dumps(list(AuditEvent.objects.values("before", "after")))
    assert admin_api.delete(f"{LIST}{agent.pk}/").status_code == 204

    create, update, rotate, delete = (only(f"agent.{verb}") for verb in ("create", "update", "rotate_token",
                                                                          "delete"))
    assert (create.actor, create.source, create.object_id) == (admin_user, "api", str(agent.pk))
    assert (create.before, create.after["url"]) == (None, "http://10.0.0.11:9410")
    assert (update.before["timeout_s"], update.after["timeout_s"]) == (3.0, 5.0)
    assert rotate.comment == "new token issued; the previous one stopped working"
    assert set(rotate.after) == {"name", "kind", "url", "host_id", "vm_id", "enabled", "timeout_s"}
    assert (delete.object_repr, delete.before["name"], delete.after) == ("gpu-11", "gpu-11", None)


def test_an_api_update_that_changes_nothing_records_nothing(admin_api):
    agent = polled_agent("gpu-12", "http://10.0.0.12:9410")

    assert admin_api.patch(f"{LIST}{agent.pk}/", {"name": "gpu-12"}, format="json").status_code == 200

    assert not AuditEvent.objects.exists()


# Admin site ---------------------------------------------------------------------------------


def test_admin_add_rotate_disable_and_bulk_delete_are_recorded(staff_client, admin_user):
    added = staff_client.post("/admin/telemetry/agent/add/", {
        "name": "gpu-20", "kind": "nvml", "url": "http://gpu-20.studio.lan:9410", "enabled": "on", "timeout_s": "3",
    })
    assert added.status_code == 200
    agent = Agent.objects.get(name="gpu-20")
    other = polled_agent("gpu-21", "http://gpu-21:9410")

    staff_client.post("/admin/telemetry/agent/", {"action": "issue_new_tokens", "_selected_action": [agent.pk]})
    staff_client.post("/admin/telemetry/agent/", {"action": "disable", "_selected_action": [agent.pk, other.pk]})
    agent.refresh_from_db()
    assert_no_secret(agent)
    staff_client.post("/admin/telemetry/agent/", {"action": "delete_selected", "post": "yes",
                                                  "_selected_action": [agent.pk, other.pk]})

    create, rotate = only("agent.create"), only("agent.rotate_token")
    assert (create.source, create.actor, create.after["name"]) == ("admin", admin_user, "gpu-20")
    assert rotate.object_id == str(agent.pk)
    disabled = AuditEvent.objects.filter(action="agent.update").order_by("object_repr")
    assert [(e.object_repr, e.before["enabled"], e.after["enabled"]) for e in disabled] == [
        ("gpu-20", True, False), ("gpu-21", True, False)]
    # object_id is text: ordered by its number, so ids 9 and 10 do not swap.
    deleted = sorted(AuditEvent.objects.filter(action="agent.delete"), key=lambda e: int(e.object_id))
    assert [e.object_repr for e in deleted] == ["gpu-20", "gpu-21"]
    assert not Agent.objects.exists()


def test_admin_resolving_drift_is_recorded_per_row(staff_client, admin_user):
    agent = make_agent("agent-drift")
    rows = [Drift.objects.create(agent=agent, kind=DriftKind.UNKNOWN_GPU, subject=f"GPU-{i}", detail="new")
            for i in range(2)]

    response = staff_client.post("/admin/telemetry/drift/", {"action": "mark_resolved",
                                                             "_selected_action": [d.pk for d in rows]})

    assert response.status_code == 302
    events = sorted(AuditEvent.objects.filter(action="drift.resolve"), key=lambda e: int(e.object_id))
    assert [(e.object_id, e.before["resolved_at"], e.actor) for e in events] == [
        (str(d.pk), None, admin_user) for d in rows]
    assert all(e.after["resolved_at"] for e in events)


# Discovery ----------------------------------------------------------------------------------


def test_discovery_records_the_new_host_model_and_gpus_as_made_by_the_agent(db):
    l40s_world()
    agent = make_agent("dcgm-render-30", kind="dcgm-exporter")
    gpus = [gpu_reading(f"GPU-new-{i}", index=i, name="NVIDIA H200", pci_bus_id=f"00000000:0{i}:00.0",
                        fb_total_mib=143771) for i in range(2)]

    stats = store_reports([(agent, report("render-30", gpus))], received_at=T0)

    assert stats.discovered_gpus == 2
    host, model = Host.objects.get(name="render-30"), GpuModel.objects.get(name="NVIDIA H200")
    events = list(AuditEvent.objects.exclude(action="vgpu.place").order_by("id"))
    assert [(e.action, e.object_id) for e in events] == [
        ("host.create", str(host.pk)), ("agent.update", str(agent.pk)), ("gpu_model.create", str(model.pk)),
        *(("gpu.create", str(Gpu.objects.get(uuid=f"GPU-new-{i}").pk)) for i in range(2))]
    assert {(e.source, e.actor_name, e.actor) for e in events} == {("agent", "dcgm-render-30", None)}
    assert events[0].after["cpu_threads"] == 1
    # The agent's first report bound it to the host it introduced: its token writes there only from now on.
    assert (events[1].before["host_id"], events[1].after["host_id"]) == (None, host.pk)
    assert events[1].comment == "bound to the host its first report introduced"
    assert Agent.objects.get(pk=agent.pk).host == host
    assert (events[3].before, events[3].after["uuid"], events[3].after["host_id"]) == (None, "GPU-new-0", host.pk)


def test_a_declared_gpu_given_its_uuid_by_discovery_is_recorded_as_an_update(db):
    world = l40s_world()
    declared = GpuFactory(host=world.host, gpu_model=world.model, pci_bus_id="00000000:A1:00.0", uuid="")

    store_reports([(world.agent, report("render-01", [
        gpu_reading("GPU-from-nvml", pci_bus_id="00000000:A1:00.0")]))], received_at=T0)

    event = only("gpu.update")
    assert (event.object_id, event.actor_name, event.source) == (str(declared.pk), "agent-render-01", "agent")
    assert (event.before["uuid"], event.after["uuid"]) == ("", "GPU-from-nvml")


def test_reports_of_known_gpus_write_no_event_and_no_audit_query(db):
    world = l40s_world()
    store_reports([(world.agent, report("render-01", [gpu_reading(world.gpu.uuid)]))], received_at=T0)

    with CaptureQueriesContext(connection) as queries:
        store_reports([(world.agent, report("render-01", [gpu_reading(world.gpu.uuid)], T0 + 10))],
                      received_at=T0 + 10)

    assert not AuditEvent.objects.filter(source="agent").exists()
    assert not [q for q in queries.captured_queries if "fleet_auditevent" in q["sql"]]

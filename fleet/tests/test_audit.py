"""The audit log: events written by the fleet services, and the `audit-events/` API."""

from __future__ import annotations

import csv
import io

import pytest

from fleet import audit, services
from fleet.models import AuditEvent, Vgpu
from fleet.placement import PlacementError
from fleet.tests.factories import GpuFactory, HostFactory, VirtualMachineFactory, profile

pytestmark = pytest.mark.django_db


@pytest.fixture
def gpu():
    return GpuFactory(host=HostFactory(name="host-audit"))


def test_worker_placement_and_removal_are_recorded_as_system_with_before_and_after(gpu):
    vm = VirtualMachineFactory(name="ws-audit-01")

    vgpu = services.place_vgpu(vm, gpu, profile("RTX6000-12Q"))
    services.remove_vgpu(vgpu)

    place, remove = AuditEvent.objects.filter(action__startswith="vgpu.").order_by("id")
    assert (place.action, place.source, place.actor_name, place.actor) == ("vgpu.place", "system", "system", None)
    assert place.before is None
    assert (place.after["gpu_id"], place.after["vm_id"]) == (gpu.pk, vm.pk)
    assert (remove.action, remove.object_id, remove.after) == ("vgpu.remove", str(vgpu.pk), None)
    assert remove.before["profile_id"] == profile("RTX6000-12Q").pk


def test_refused_change_writes_no_event(gpu):
    for _ in range(2):
        services.place_vgpu(VirtualMachineFactory(), gpu, profile("RTX6000-12Q"))
    before = AuditEvent.objects.count()

    with pytest.raises(PlacementError):
        services.place_vgpu(VirtualMachineFactory(), gpu, profile("RTX6000-12Q"))

    assert AuditEvent.objects.count() == before


def test_host_update_records_changed_fields_and_a_no_op_save_records_nothing(admin_user, gpu):
    host = gpu.host
    with audit.acting_as(admin_user, "web"):
        services.update_host(host, name="host-renamed")
        services.update_host(host, name="host-renamed")

    event = AuditEvent.objects.get(action="host.update")
    assert (event.actor, event.source) == (admin_user, "web")
    assert (event.before["name"], event.after["name"]) == ("host-audit", "host-renamed")


def test_api_placement_is_recorded_with_the_token_user_and_source_api(admin_api, admin_user, gpu):
    vm = VirtualMachineFactory(name="ws-audit-02")

    response = admin_api.post("/api/v1/vgpus/", {"vm": vm.pk, "gpu": gpu.pk, "profile": profile("RTX6000-12Q").pk})

    assert response.status_code == 201, response.content
    event = AuditEvent.objects.get(action="vgpu.place")
    assert (event.actor, event.actor_name, event.source) == (admin_user, admin_user.username, "api")


def test_artists_are_refused_and_anonymous_must_sign_in(api, artist_api, admin_api):
    assert api.get("/api/v1/audit-events/").status_code == 401
    assert artist_api.get("/api/v1/audit-events/").status_code == 403
    assert admin_api.get("/api/v1/audit-events/").status_code == 200
    assert admin_api.post("/api/v1/audit-events/", {}).status_code == 405


def test_tokens_follow_their_user_and_the_csv_export_is_refused_to_artists(artist, admin_user):
    from rest_framework.test import APIClient

    from fleet.api_tokens import issue_token

    def client_of(user):
        client = APIClient()
        client.credentials(HTTP_AUTHORIZATION=f"Token {issue_token(user)[1]}")
        return client

    artist_token, admin_token = client_of(artist.user), client_of(admin_user)
    assert artist_token.get("/api/v1/audit-events/").status_code == 403
    assert artist_token.get("/api/v1/audit-events/?format=csv").status_code == 403
    assert admin_token.get("/api/v1/audit-events/").status_code == 200
    assert admin_token.get("/api/v1/audit-events/?format=csv")["Content-Type"].startswith("text/csv")


def test_filters_by_action_actor_object_text_and_time(admin_api, admin_user, gpu):
    with audit.acting_as(admin_user, "web"):
        services.update_host(gpu.host, name="host-filtered")
    vgpu = services.place_vgpu(VirtualMachineFactory(name="ws-audit-03"), gpu, profile("RTX6000-12Q"))

    def actions(query):
        response = admin_api.get(f"/api/v1/audit-events/?{query}")
        assert response.status_code == 200, response.content
        return [row["action"] for row in response.json()["results"]]

    assert actions("action=vgpu.place") == ["vgpu.place"]
    assert actions(f"actor={admin_user.username}") == ["host.update"]
    assert actions(f"actor={admin_user.pk}") == ["host.update"]
    assert actions(f"object_type=vgpu&object_id={vgpu.pk}") == ["vgpu.place"]
    assert actions("source=system") == ["vgpu.place"]
    assert actions("q=filtered") == ["host.update"]
    assert actions("since=2000-01-01T00:00:00Z&until=4102444800") == ["vgpu.place", "host.update"]
    assert actions("since=4102444800") == []
    bad = admin_api.get("/api/v1/audit-events/?since=yesterday")
    assert bad.status_code == 400
    assert "since" in bad.json()


def test_each_event_names_its_object_in_one_field_as_the_v1_contract_says(admin_api, gpu):
    vgpu = services.place_vgpu(VirtualMachineFactory(name="ws-audit-obj"), gpu, profile("RTX6000-12Q"))
    row = admin_api.get("/api/v1/audit-events/?action=vgpu.place").json()["results"][0]
    assert row["object"] == {"type": "vgpu", "id": str(vgpu.pk), "repr": str(vgpu)}
    assert {"id", "at", "actor", "action", "before", "after"} <= set(row)


def test_csv_export_has_the_columns_and_the_filtered_rows(admin_api, admin_user, gpu):
    with audit.acting_as(admin_user, "web"):
        services.update_host(gpu.host, name="host-csv")
    services.place_vgpu(VirtualMachineFactory(name="ws-audit-04"), gpu, profile("RTX6000-12Q"))

    response = admin_api.get("/api/v1/audit-events/?format=csv&action=host.update")

    assert response.status_code == 200
    assert response["Content-Type"].startswith("text/csv")
    rows = list(csv.reader(io.StringIO(b"".join(response.streaming_content).decode())))
    assert rows[0] == ["at", "actor", "source", "action", "object_type", "object_id", "object", "before",
                       "after", "comment"]
    assert len(rows) == 2
    assert rows[1][1:6] == [admin_user.username, "web", "host.update", "host", str(gpu.host_id)]
    assert '"name": "host-csv"' in rows[1][8]
    assert Vgpu.objects.count() == 1


def test_api_create_update_delete_of_an_artist_and_a_vm_are_recorded(admin_api, admin_user):
    created = admin_api.post("/api/v1/artists/", {"name": "Cleo Artist"})
    assert created.status_code == 201, created.content
    artist_id = created.json()["id"]
    assert admin_api.patch(f"/api/v1/artists/{artist_id}/", {"name": "Cleo B. Artist"}).status_code == 200
    vm = admin_api.post("/api/v1/vms/", {"name": "ws-cleo", "artist": artist_id, "vcpus": 8, "ram_gib": 32})
    assert vm.status_code == 201, vm.content
    assert admin_api.patch(f"/api/v1/vms/{vm.json()['id']}/", {"vcpus": 12}).status_code == 200
    assert admin_api.delete(f"/api/v1/vms/{vm.json()['id']}/").status_code == 204

    events = list(AuditEvent.objects.order_by("id").values_list("action", "source", "actor"))
    assert events == [(action, "api", admin_user.pk) for action in
                      ("artist.create", "artist.update", "vm.create", "vm.update", "vm.delete")]
    update = AuditEvent.objects.get(action="artist.update")
    assert (update.before["name"], update.after["name"]) == ("Cleo Artist", "Cleo B. Artist")
    deleted = AuditEvent.objects.get(action="vm.delete")
    assert (deleted.object_type, deleted.object_repr, deleted.after) == ("vm", "ws-cleo", None)
    assert deleted.before["vcpus"] == 12


def test_seed_demo_writes_one_summary_event_not_one_per_row():
    from fleet import demo

    demo.seed_demo(hosts=2, admin_password="pw-demo-1", artist_password="pw-demo-2")

    assert list(AuditEvent.objects.values_list("action", flat=True)) == ["fleet.seed_demo"]


def test_page_shows_changed_fields_filters_and_refuses_artists(client, admin_user, artist, gpu):
    with audit.acting_as(admin_user, "web"):
        services.update_host(gpu.host, name="host-page")
    services.place_vgpu(VirtualMachineFactory(name="ws-audit-05"), gpu, profile("RTX6000-12Q"))

    client.force_login(admin_user)
    page = client.get("/audit/?action=host.update").content.decode()
    assert "host.update" in page
    assert "<del>host-audit</del>" in page
    assert "<ins>host-page</ins>" in page
    assert f'href="/hosts/{gpu.host_id}/"' in page
    assert "<code>vgpu.place</code>" not in page
    assert "/api/v1/audit-events/?action=host.update&amp;format=csv" in page
    bad = client.get("/audit/?since=yesterday")
    assert bad.status_code == 400
    assert "since: &#x27;yesterday&#x27; is not a time: use ISO 8601" in bad.content.decode()

    client.force_login(artist.user)
    assert client.get("/audit/").status_code == 403

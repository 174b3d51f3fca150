"""GET /api/v1/suggestions/ and its accept, dismiss and restore actions: who sees and does what,
the filters, the query count of the list, and what is left in the database after each answer."""

from __future__ import annotations

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from fleet import services
from fleet.models import ResizeRequest
from fleet.tests.factories import GpuFactory, HostFactory, VirtualMachineFactory, profile
from sizing.models import Suggestion
from sizing.suggestions import refresh_suggestions
from sizing.tests.suggestion_world import GIB, NOW, TWO_WEEKS_H, guest_hourly, hourly, rtx_studio, two_weeks_of_use

pytestmark = pytest.mark.django_db

URL = "/api/v1/suggestions/"


@pytest.fixture
def world(artist):
    """Ana (the signed-in `artist`) owns ws-heavy (upsize); Bob ws-light (downsize); Cleo ws-peer (keep)."""
    world = rtx_studio(artist=artist)
    two_weeks_of_use(world)
    refresh_suggestions(now=NOW)
    world.heavy_s, world.light_s, world.peer_s = (Suggestion.objects.get(vm=vm)
                                                  for vm in (world.heavy, world.light, world.peer))
    return world


def results(response) -> list[dict]:
    assert response.status_code == 200, response.content
    return response.json()["results"]


def vm_names(response) -> list[str]:
    return [row["vm_name"] for row in results(response)]


def url(suggestion, action: str = "") -> str:
    return f"{URL}{suggestion.pk}/{action + '/' if action else ''}"


# Roles -------------------------------------------------------------------------------------------


def test_anonymous_callers_get_401_and_change_nothing(api, world):
    assert api.get(URL).status_code == 401
    assert api.get(url(world.heavy_s)).status_code == 401
    assert api.post(url(world.heavy_s, "accept")).status_code == 401
    assert api.post(url(world.light_s, "dismiss")).status_code == 401
    assert not ResizeRequest.objects.exists()
    assert not Suggestion.objects.exclude(dismissed_key="").exists()


def test_an_artist_sees_only_the_suggestions_of_their_own_vms(artist_api, world):
    assert vm_names(artist_api.get(URL)) == ["ws-heavy"]
    assert artist_api.get(url(world.heavy_s)).status_code == 200
    assert artist_api.get(url(world.light_s)).status_code == 404


def test_an_artist_may_not_accept_dismiss_or_restore_even_their_own(artist_api, world):
    for action in ("accept", "dismiss", "restore"):
        response = artist_api.post(url(world.heavy_s, action))
        assert response.status_code == 403, action
        assert "Only fleet admins" in response.json()["detail"]
    assert not ResizeRequest.objects.exists()
    assert Suggestion.objects.get(pk=world.heavy_s.pk).dismissed_key == ""


def test_an_admin_sees_every_suggestion_with_its_evidence(admin_api, world):
    body = admin_api.get(URL).json()

    assert set(body) == {"count", "next", "previous", "results"}
    assert body["count"] == 3
    rows = {row["vm_name"]: row for row in body["results"]}
    light = rows["ws-light"]
    assert light["vm"] == world.light.pk
    assert (light["artist"], light["host"]) == (world.bob.pk, world.host.pk)
    assert (light["current_profile"], light["current_profile_name"]) == (world.q24.pk, "RTX6000-24Q")
    assert (light["suggested_profile"], light["suggested_profile_name"]) == (world.q12.pk, "RTX6000-12Q")
    assert (light["action"], light["fits"], light["gpus_delta"]) == ("downsize", "move", -1)
    assert light["evidence"]["fb_p95_pct"] == 30.0
    assert light["evidence"]["impact"]["gpu_ids"] == [world.gpu_1.pk]
    assert light["dismissed"] is False
    assert light["resize_request"] is None
    assert rows["ws-peer"]["suggested_profile"] is None
    assert rows["ws-peer"]["suggested_profile_name"] is None


# Filters and ordering ----------------------------------------------------------------------------


def test_filters_by_action_host_artist_and_fits(admin_api, world):
    other_host = HostFactory(name="render-09")
    lonely = VirtualMachineFactory(name="ws-lonely")
    services.place_vgpu(lonely, GpuFactory(host=other_host), profile("RTX6000-24Q"))
    refresh_suggestions(now=NOW)

    assert vm_names(admin_api.get(URL, {"action": "downsize"})) == ["ws-light"]
    assert vm_names(admin_api.get(URL, {"action": "insufficient_data"})) == ["ws-lonely"]
    assert vm_names(admin_api.get(URL, {"host": other_host.pk})) == ["ws-lonely"]
    assert vm_names(admin_api.get(URL, {"artist": world.bob.pk})) == ["ws-light"]
    assert vm_names(admin_api.get(URL, {"fits": "same_gpu"})) == ["ws-heavy"]
    assert vm_names(admin_api.get(URL, {"fits": "move", "action": "downsize"})) == ["ws-light"]
    assert vm_names(admin_api.get(URL, {"ordering": "gpus_delta"}))[0] == "ws-light"


@pytest.mark.parametrize(("params", "field"), [
    ({"action": "shrink"}, "action"),
    ({"fits": "somewhere"}, "fits"),
    ({"host": 999_999}, "host"),
    ({"dismissed": "maybe"}, "dismissed"),
])
def test_a_bad_filter_is_a_400_naming_the_field(admin_api, world, params, field):
    response = admin_api.get(URL, params)
    assert response.status_code == 400
    assert field in response.json()


def test_an_artist_cannot_filter_on_another_artist(artist_api, world):
    response = artist_api.get(URL, {"artist": world.bob.pk})
    assert response.status_code == 400
    assert "artist" in response.json()


def test_dismissed_suggestions_are_hidden_unless_asked_for(admin_api, world):
    admin_api.post(url(world.light_s, "dismiss"))

    assert vm_names(admin_api.get(URL)) == ["ws-heavy", "ws-peer"]
    assert vm_names(admin_api.get(URL, {"dismissed": "false"})) == ["ws-heavy", "ws-peer"]
    assert vm_names(admin_api.get(URL, {"dismissed": "true"})) == ["ws-light"]
    assert vm_names(admin_api.get(URL, {"dismissed": "all"})) == ["ws-heavy", "ws-light", "ws-peer"]
    # Hidden from the list, not gone: its own URL still answers.
    assert admin_api.get(url(world.light_s)).json()["dismissed"] is True


def _crowd(n: int) -> None:
    host = HostFactory(cpu_threads=512, ram_gib=4096)
    for i in range(n):
        vm = VirtualMachineFactory()
        services.place_vgpu(vm, GpuFactory(host=host), profile("RTX6000-24Q"))
        hourly(vm, 96, fb_mib=2_000 + 900 * i, profile_fb_mib=24 * GIB)


def _list_queries(client) -> tuple[int, int]:
    with CaptureQueriesContext(connection) as queries:
        body = client.get(URL, {"dismissed": "all", "limit": 100}).json()
    return len(queries), body["count"]


def test_the_list_costs_the_same_queries_for_2_suggestions_as_for_12(admin_api, django_assert_num_queries):
    _crowd(2)
    refresh_suggestions(now=NOW)
    assert _list_queries(admin_api) == (2, 2)  # count, page
    _crowd(10)
    refresh_suggestions(now=NOW)
    with django_assert_num_queries(2):
        body = admin_api.get(URL, {"dismissed": "all", "limit": 100}).json()
    assert body["count"] == 12


# Accept ------------------------------------------------------------------------------------------


def test_accepting_files_a_pending_request_and_links_it(admin_api, admin_user, world):
    response = admin_api.post(url(world.heavy_s, "accept"), {"evidence_key": world.heavy_s.evidence_key,
                                                             "note": "Her scenes grew."})

    assert response.status_code == 201, response.content
    filed = ResizeRequest.objects.get()
    assert response.json()["resize_request"]["id"] == filed.pk
    assert response.json()["resize_request"]["status"] == "pending"
    assert (filed.vm, filed.requested_profile, filed.requested_vgpus, filed.requested_by) == (
        world.heavy, world.q24, 1, admin_user)
    assert filed.reason.startswith("Right-sizing: fb p95 11.3 GiB = 94% of 12 GiB over 14 days")
    assert filed.reason.endswith("Her scenes grew.")
    assert Suggestion.objects.get(pk=world.heavy_s.pk).resize_request == filed


def test_accepting_a_ram_downsize_alone_files_it_with_the_vms_own_vgpu(admin_api, world):
    """peer keeps its vGPU but used 5 of its 32 GiB: the request asks for 8 GiB and nothing else."""
    world.peer.vcpus, world.peer.ram_gib = 8, 32
    world.peer.save()
    guest_hourly(world.peer, TWO_WEEKS_H, util_pct=60.0, busiest_pct=70.0, ram_used_mib=5 * GIB)
    refresh_suggestions(now=NOW)
    suggestion = Suggestion.objects.get(vm=world.peer)

    response = admin_api.post(url(suggestion, "accept"), {"evidence_key": suggestion.evidence_key})

    assert response.status_code == 201, response.content
    filed = ResizeRequest.objects.get()
    assert {k: response.json()["resize_request"][k] for k in ("id", "requested_vcpus", "requested_ram_gib")} == {
        "id": filed.pk, "requested_vcpus": None, "requested_ram_gib": 8}
    assert (filed.requested_profile, filed.requested_vgpus, filed.current_ram_gib) == (world.q12, 1, 32)


def test_a_second_accept_while_the_request_is_pending_is_a_409(admin_api, world):
    first = admin_api.post(url(world.heavy_s, "accept"))
    second = admin_api.post(url(world.heavy_s, "accept"))

    assert first.status_code == 201
    assert second.status_code == 409
    assert f"already has a pending request (#{first.json()['resize_request']['id']})" in second.json()["detail"]
    assert ResizeRequest.objects.count() == 1


def test_another_pending_request_of_the_vm_blocks_an_accept(admin_api, world):
    mine = ResizeRequest.objects.create(vm=world.light, requested_profile=world.q12, reason="Filed by Bob")

    response = admin_api.post(url(world.light_s, "accept"))

    assert response.status_code == 409
    assert f"#{mine.pk}" in response.json()["detail"]
    assert list(ResizeRequest.objects.all()) == [mine]


def test_accepting_a_keep_is_a_409_that_files_nothing(admin_api, world):
    response = admin_api.post(url(world.peer_s, "accept"))

    assert response.status_code == 409
    assert "nothing to resize" in response.json()["detail"]
    assert not ResizeRequest.objects.exists()


def test_accepting_not_enough_data_is_a_409(admin_api, world):
    newcomer = VirtualMachineFactory(name="ws-new")
    services.place_vgpu(newcomer, GpuFactory(host=world.host, pci_bus_id="00000000:AF:00.0"), profile("RTX6000-24Q"))
    refresh_suggestions(now=NOW)

    response = admin_api.post(url(Suggestion.objects.get(vm=newcomer), "accept"))

    assert response.status_code == 409
    assert "Not enough data" in response.json()["detail"]
    assert not ResizeRequest.objects.exists()


def test_accepting_what_was_recomputed_since_it_was_shown_is_a_409(admin_api, world):
    response = admin_api.post(url(world.heavy_s, "accept"), {"evidence_key": "f" * 64})

    assert response.status_code == 409
    assert "recomputed" in response.json()["detail"]
    assert not ResizeRequest.objects.exists()


@pytest.mark.parametrize(("body", "field"), [
    ({"note": "x" * 2001}, "note"),
    ({"note": ["not", "text"]}, "note"),
    ({"evidence_key": "k" * 65}, "evidence_key"),
])
def test_bad_accept_input_is_a_400_with_field_messages_and_files_nothing(admin_api, world, body, field):
    response = admin_api.post(url(world.heavy_s, "accept"), body)

    assert response.status_code == 400
    assert field in response.json()
    assert not ResizeRequest.objects.exists()
    assert Suggestion.objects.get(pk=world.heavy_s.pk).resize_request is None


def test_an_unknown_suggestion_is_a_404(admin_api, world):
    assert admin_api.post(f"{URL}999999/accept/").status_code == 404
    assert not ResizeRequest.objects.exists()


# Dismiss and restore -----------------------------------------------------------------------------


def test_dismiss_records_who_and_when_and_restore_undoes_it(admin_api, admin_user, world):
    dismissed = admin_api.post(url(world.light_s, "dismiss"), {"evidence_key": world.light_s.evidence_key})

    assert dismissed.status_code == 200
    assert dismissed.json()["dismissed"] is True
    row = Suggestion.objects.get(pk=world.light_s.pk)
    assert (row.dismissed_key, row.dismissed_by) == (row.evidence_key, admin_user)
    assert row.dismissed_at is not None

    restored = admin_api.post(url(world.light_s, "restore"))

    assert restored.status_code == 200
    assert restored.json()["dismissed"] is False
    row.refresh_from_db()
    assert (row.dismissed_key, row.dismissed_by, row.dismissed_at) == ("", None, None)
    assert "ws-light" in vm_names(admin_api.get(URL))


def test_dismissing_what_was_recomputed_since_it_was_shown_is_a_409(admin_api, world):
    response = admin_api.post(url(world.light_s, "dismiss"), {"evidence_key": "0" * 64})

    assert response.status_code == 409
    assert Suggestion.objects.get(pk=world.light_s.pk).dismissed_key == ""


def test_a_bad_dismiss_is_a_400_and_dismisses_nothing(admin_api, world):
    response = admin_api.post(url(world.light_s, "dismiss"), {"evidence_key": "k" * 65})

    assert response.status_code == 400
    assert "evidence_key" in response.json()
    assert Suggestion.objects.get(pk=world.light_s.pk).dismissed_key == ""


def test_the_schema_documents_the_actions(admin_api):
    schema = admin_api.get("/api/schema/", HTTP_ACCEPT="application/vnd.oai.openapi+json").json()
    assert "/api/v1/suggestions/" in schema["paths"]
    accept = schema["paths"]["/api/v1/suggestions/{id}/accept/"]["post"]
    assert set(accept["responses"]) >= {"201", "409"}
    assert "dismissed" in {p["name"] for p in schema["paths"]["/api/v1/suggestions/"]["get"]["parameters"]}

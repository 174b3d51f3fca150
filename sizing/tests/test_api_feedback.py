"""/api/v1/feedback/: artists rate their own VMs; what each role reads (list, detail, CSV, trends),
the filters, the errors and the list's query count."""

from __future__ import annotations

import csv
import io
from datetime import timedelta

import pytest
from django.utils import timezone
from rest_framework.test import APIClient

from fleet.tests.factories import ArtistFactory, HostFactory, VirtualMachineFactory
from sizing import feedback
from sizing.models import Feedback

pytestmark = pytest.mark.django_db

URL = "/api/v1/feedback/"
BOB_NOTE = "bob-private: the crowd scene froze"
ANA_NOTE = "ana-private: smooth day"


@pytest.fixture
def rated(fleet_world):
    """Ana rated ws-ana 5 (fine), Bob rated ws-bob 1 (out of GPU memory), both today."""
    w = fleet_world
    w.ana_feedback, _ = feedback.file_feedback(w.ana.user, w.vm_a, 5, ["fine"], ANA_NOTE)
    w.bob_feedback, _ = feedback.file_feedback(w.bob.user, w.vm_b, 1, ["out_of_gpu_memory"], BOB_NOTE)
    return w


def client_of(user) -> APIClient:
    client = APIClient()
    client.force_authenticate(user)
    return client


# Filing ------------------------------------------------------------------------------------------


def test_an_artist_files_for_their_own_vm_and_a_second_the_same_day_updates_it(artist_api, fleet_world):
    first = artist_api.post(URL, {"vm": fleet_world.vm_a.pk, "rating": 2, "tags": ["display_lag"],
                                  "note": "Laggy"}, format="json")
    assert first.status_code == 201, first.content
    body = first.json()
    assert (body["vm_name"], body["rating"], body["tags"], body["note"]) == ("ws-ana", 2, ["display_lag"], "Laggy")
    assert body["session_date"] == timezone.localdate().isoformat()
    assert body["artist_name"] == "Ana Artist"
    assert body["host_name"] == "host-a"

    second = artist_api.post(URL, {"vm": fleet_world.vm_a.pk, "rating": 4, "tags": ["fine"]}, format="json")
    assert second.status_code == 200, second.content
    assert second.json()["id"] == body["id"]
    assert list(Feedback.objects.values_list("rating", "tags", "note")) == [(4, ["fine"], "")]


def test_filing_for_another_artists_vm_is_refused_as_for_resize_requests(artist_api, fleet_world, admin_api):
    refused = artist_api.post(URL, {"vm": fleet_world.vm_b.pk, "rating": 5}, format="json")
    assert refused.status_code == 403
    assert refused.json()["detail"] == "You may only rate your own workstation."
    # An admin does not rate on an artist's behalf either.
    assert admin_api.post(URL, {"vm": fleet_world.vm_a.pk, "rating": 5}, format="json").status_code == 403
    assert not Feedback.objects.exists()


@pytest.mark.parametrize(("body", "field", "words"), [
    ({"rating": 9}, "rating", "Choose a rating from 1 to 5 stars (not 9)."),
    ({"rating": "many"}, "rating", "A valid integer is required."),
    ({"tags": ["laggy"]}, "tags", "Unknown tag 'laggy'"),
    ({"tags": ["fine", "viewport_stutter"]}, "tags", "'fine' cannot go with a problem tag"),
    ({"note": "n" * 1001}, "note", "Keep the note to 1000 characters (it has 1001)."),
    ({"session_date": "2026-02-30"}, "session_date", "Date has wrong format"),
    ({"vm": 999999}, "vm", "object does not exist"),
])
def test_bad_values_answer_400_naming_the_field_and_store_nothing(artist_api, fleet_world, body, field, words):
    response = artist_api.post(URL, {"vm": fleet_world.vm_a.pk, "rating": 3, **body}, format="json")
    assert response.status_code == 400, response.content
    assert list(response.json()) == [field]
    assert words in response.json()[field][0]
    assert not Feedback.objects.exists()


# Reading: privacy --------------------------------------------------------------------------------


def test_an_artist_lists_only_their_own_ratings(artist_api, rated):
    response = artist_api.get(URL)
    assert [row["rating"] for row in response.json()["results"]] == [5]
    assert BOB_NOTE.encode() not in response.content
    assert b"Bob Artist" not in response.content


def test_another_artists_rating_is_a_404(artist_api, rated):
    assert artist_api.get(f"{URL}{rated.bob_feedback.pk}/").status_code == 404
    own = artist_api.get(f"{URL}{rated.ana_feedback.pk}/")
    assert own.status_code == 200
    assert own.json()["note"] == ANA_NOTE


def test_an_artist_filtering_by_another_artist_or_vm_gets_a_400_not_their_rows(artist_api, rated):
    for query in ({"artist": rated.bob.pk}, {"vm": "ws-bob"}, {"host": "host-b"}):
        response = artist_api.get(URL, query)
        assert response.status_code == 400, query
        assert BOB_NOTE.encode() not in response.content


def test_an_artists_csv_holds_only_their_own_ratings(artist_api, rated):
    response = artist_api.get(URL, {"format": "csv"})
    assert response["Content-Type"].startswith("text/csv")
    rows = list(csv.DictReader(io.StringIO(response.content.decode())))
    assert [(row["vm_name"], row["rating"], row["note"]) for row in rows] == [("ws-ana", "5", ANA_NOTE)]
    assert BOB_NOTE.encode() not in response.content


def test_trends_are_for_admins_only(artist_api, rated):
    response = artist_api.get(f"{URL}trends/")
    assert response.status_code == 403
    assert response.json()["detail"] == "Only fleet admins (staff) may read the feedback trends."
    assert b"out_of_gpu_memory" not in response.content


def test_admins_list_everyones_ratings_with_names_and_export_them(admin_api, rated):
    rows = admin_api.get(URL).json()["results"]
    assert sorted((row["artist_name"], row["rating"]) for row in rows) == [("Ana Artist", 5), ("Bob Artist", 1)]
    exported = list(csv.DictReader(io.StringIO(admin_api.get(URL, {"format": "csv"}).content.decode())))
    assert sorted((row["artist_name"], row["note"]) for row in exported) == [("Ana Artist", ANA_NOTE),
                                                                             ("Bob Artist", BOB_NOTE)]


def test_admin_filters(admin_api, rated):
    def names(**query):
        response = admin_api.get(URL, query)
        assert response.status_code == 200, response.content
        return [row["vm_name"] for row in response.json()["results"]]

    rated.bob.workflow = "lighting"
    rated.bob.save()
    old_day = timezone.localdate() - timedelta(days=5)
    feedback.file_feedback(rated.ana.user, rated.vm_a, 3, day=old_day)
    assert names(vm="ws-bob") == ["ws-bob"]
    assert names(artist=rated.ana.pk) == ["ws-ana", "ws-ana"]
    assert names(workflow="lighting") == ["ws-bob"]
    assert names(host="host-a") == ["ws-ana", "ws-ana"]
    assert sorted(names(since=timezone.localdate().isoformat())) == ["ws-ana", "ws-bob"]
    assert admin_api.get(URL, {"since": "2026-02-30"}).json() == {"since": ["Enter a valid date."]}


def test_trends_answer_per_workflow_and_per_host_without_names(admin_api, rated):
    response = admin_api.get(f"{URL}trends/", {"group": "host"})
    assert response.status_code == 200, response.content
    body = response.json()
    assert [(row["label"], row["count"], row["mean"], row["tags"]) for row in body["results"]] == [
        ("host-a", 1, 5.0, {"fine": 1.0}), ("host-b", 1, 1.0, {"out_of_gpu_memory": 1.0})]
    assert body["until"] == timezone.localdate().isoformat()
    assert b"Ana Artist" not in response.content
    assert b"Bob Artist" not in response.content
    assert BOB_NOTE.encode() not in response.content

    by_workflow = admin_api.get(f"{URL}trends/").json()
    assert by_workflow["group"] == "workflow"
    assert [(row["label"], row["count"], row["mean"]) for row in by_workflow["results"]] == [("Modeling", 2, 3.0)]


@pytest.mark.parametrize(("query", "field"), [({"group": "artist"}, "group"), ({"since": "yesterday"}, "since"),
                                              ({"since": "2026-11-10", "until": "2026-11-01"}, "since")])
def test_bad_trend_parameters_are_a_400_naming_them(admin_api, query, field):
    response = admin_api.get(f"{URL}trends/", query)
    assert response.status_code == 400
    assert list(response.json()) == [field]


def _rate_many(n: int) -> None:
    host = HostFactory()
    for _ in range(n):
        vm = VirtualMachineFactory(artist=ArtistFactory(), host=host)
        feedback.file_feedback(vm.artist.user, vm, 3, ["display_lag"])


def test_the_list_costs_the_same_queries_for_2_ratings_as_for_12(admin_api, django_assert_num_queries):
    _rate_many(2)
    with django_assert_num_queries(2):  # count, page
        assert admin_api.get(URL).json()["count"] == 2
    _rate_many(10)
    with django_assert_num_queries(2):
        assert admin_api.get(URL).json()["count"] == 12


def test_the_schema_documents_the_resource(admin_api):
    schema = admin_api.get("/api/schema/", {"format": "json"}).json()
    assert {"get", "post"} <= set(schema["paths"]["/api/v1/feedback/"])
    assert "/api/v1/feedback/trends/" in schema["paths"]

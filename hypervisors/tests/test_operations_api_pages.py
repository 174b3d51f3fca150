"""Following an operation: `/api/v1/operations/` for scripts, `/operations/` pages for people.
An admin sees every operation and can run a waiting one now; the artist sees the operations of
their own VMs (and nobody else's); the approval itself can ask for the operation to run now."""

from __future__ import annotations

import pytest
from rest_framework.test import APIClient

from fleet.choices import ResizeStatus
from fleet.models import ResizeRequest
from fleet.tests.factories import ArtistFactory, UserFactory
from hypervisors import operations
from hypervisors.choices import OperationStatus
from hypervisors.models import Operation

pytestmark = pytest.mark.django_db


@pytest.fixture
def waiting(ana_linked, admin_api):
    """The request approved through the API without run_now: its operation waits for an admin."""
    response = admin_api.post(f"/api/v1/resize-requests/{ana_linked.request.pk}/approve/", {"comment": "ok"},
                              format="json")
    assert response.status_code == 200, response.content
    assert response.json()["status"] == "applying"
    ana_linked.operation = Operation.objects.get(request=ana_linked.request)
    return ana_linked


def test_the_api_lists_an_operation_with_its_steps_and_the_admin_runs_it_now(waiting, admin_api):
    listed = admin_api.get("/api/v1/operations/?status=pending&vm=ws-ana").json()
    assert [row["id"] for row in listed["results"]] == [waiting.operation.pk]
    row = listed["results"][0]
    assert (row["vm_name"], row["host_name"], row["request"], row["run_now"]) == (
        "ws-ana", "node-01", waiting.request.pk, False)
    assert [step["kind"] for step in row["steps"]][:3] == ["notify", "shutdown", "remove_vgpu"]
    assert {step["status"] for step in row["steps"]} == {"pending"}

    started = admin_api.post(f"/api/v1/operations/{waiting.operation.pk}/run/")
    assert started.status_code == 202
    assert started.json()["run_now"] is True
    operations.run(waiting.operation.pk)

    done = admin_api.get(f"/api/v1/operations/{waiting.operation.pk}/").json()
    assert done["status"] == "succeeded"
    created = next(step for step in done["steps"] if step["kind"] == "create_vgpu")
    assert created["result"]["device"]["type_name"] == "NVIDIA L40S-12Q"
    # The saved definition (it may hold a console password) is never in the answer.
    assert all("definition" not in step["result"] for step in done["steps"])
    again = admin_api.post(f"/api/v1/operations/{waiting.operation.pk}/run/")
    assert again.status_code == 409
    assert "succeeded already" in again.json()["detail"]


def test_the_artist_follows_their_own_operation_and_cannot_run_it_nor_see_others(waiting, artist_api, api):
    mine = artist_api.get("/api/v1/operations/").json()
    assert [row["id"] for row in mine["results"]] == [waiting.operation.pk]
    assert artist_api.post(f"/api/v1/operations/{waiting.operation.pk}/run/").status_code == 403
    other = ArtistFactory(user=UserFactory(username="bob"), name="Bob")
    bob = APIClient()
    bob.force_authenticate(other.user)
    assert bob.get(f"/api/v1/operations/{waiting.operation.pk}/").status_code == 404
    assert bob.get("/api/v1/operations/").json()["results"] == []
    assert api.get("/api/v1/operations/").status_code in (401, 403)


def test_an_unknown_filter_is_refused_naming_it(waiting, admin_api):
    response = admin_api.get("/api/v1/operations/?state=pending")
    assert response.status_code == 400
    assert "state" in response.content.decode()
    assert admin_api.get("/api/v1/operations/?status=exploded").status_code == 400


def test_the_operation_page_shows_its_steps_and_runs_it_now(waiting, client, admin_user):
    client.force_login(admin_user)
    page = client.get(f"/operations/{waiting.operation.pk}/").content.decode()
    assert "Waits for an admin to run it" in page
    assert 'hx-trigger="every 2s"' in page  # refreshing while it is under way
    assert page.count('data-step-status="pending"') == waiting.operation.steps.count()

    response = client.post(f"/operations/{waiting.operation.pk}/run/")
    assert response.status_code == 302
    operations.run(waiting.operation.pk)
    page = client.get(f"/operations/{waiting.operation.pk}/").content.decode()
    assert 'data-status="succeeded"' in page
    assert "hx-trigger" not in page  # done: it stops asking
    assert 'data-step="create_vgpu" data-step-status="done"' in page
    listed = client.get("/operations/").content.decode()
    assert f"/operations/{waiting.operation.pk}/" in listed
    assert "7/7" in listed


def test_confirming_on_the_review_page_with_run_now_starts_the_operation_and_shows_it(ana_linked, client, admin_user):
    client.force_login(admin_user)
    review = client.get(f"/requests/{ana_linked.request.pk}/review/").content.decode()
    assert "is linked to its hypervisor" in review
    assert 'name="run_now"' in review
    fingerprint = review.split('name="fingerprint" value="')[1].split('"')[0]
    response = client.post(f"/requests/{ana_linked.request.pk}/approve/",
                           {"confirm": "on", "fingerprint": fingerprint, "run_now": "on", "comment": ""})
    operation = Operation.objects.get(request=ana_linked.request)
    assert response.status_code == 302
    assert response["Location"] == f"/operations/{operation.pk}/"
    assert operation.run_now is True
    assert ResizeRequest.objects.get(pk=ana_linked.request.pk).status == ResizeStatus.APPLYING
    assert operation.status == OperationStatus.PENDING


def test_an_artists_page_of_their_operation_has_no_run_button(waiting, client):
    client.force_login(waiting.artist.user)
    page = client.get(f"/operations/{waiting.operation.pk}/")
    assert page.status_code == 200
    assert "Run now</button>" not in page.content.decode()
    assert client.post(f"/operations/{waiting.operation.pk}/run/").status_code in (302, 403)
    assert Operation.objects.get(pk=waiting.operation.pk).run_now is False
    assert client.get("/operations/").status_code in (302, 403)


def test_the_vm_page_says_an_operation_is_under_way_and_links_to_it(waiting, client):
    client.force_login(waiting.artist.user)
    page = client.get(f"/vms/{waiting.vm.pk}/").content.decode()
    assert f'href="/operations/{waiting.operation.pk}/"' in page
    assert "is being changed on its hypervisor" in page
    operations.run_now(waiting.operation, waiting.admin)
    operations.run(waiting.operation.pk)
    assert "is being changed on its hypervisor" not in client.get(f"/vms/{waiting.vm.pk}/").content.decode()


def test_an_admin_cancels_a_waiting_operation_through_the_api_and_the_page(waiting, admin_api, client, admin_user):
    response = admin_api.post(f"/api/v1/operations/{waiting.operation.pk}/cancel/", {"reason": "x" * 501},
                              format="json")
    assert response.status_code == 400
    assert "reason" in response.json()
    assert Operation.objects.get(pk=waiting.operation.pk).status == OperationStatus.PENDING  # nothing lost

    client.force_login(admin_user)
    assert "Cancel the change" in client.get(f"/operations/{waiting.operation.pk}/").content.decode()
    client.post(f"/operations/{waiting.operation.pk}/cancel/", {"reason": "moved to Friday"})
    cancelled = admin_api.get(f"/api/v1/operations/{waiting.operation.pk}/").json()
    assert cancelled["status"] == "rolled_back"
    assert cancelled["error"].endswith("moved to Friday")
    again = admin_api.post(f"/api/v1/operations/{waiting.operation.pk}/cancel/", {}, format="json")
    assert again.status_code == 409

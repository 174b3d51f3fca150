"""Resize requests through the API: role matrix, validation messages, approval applying, 409, notifications, audit."""

import pytest
from django.core import mail

from fleet.choices import ResizeStatus
from fleet.models import AuditEvent, Notification, ResizeRequest, Vgpu
from fleet.tests.factories import UserFactory, profile

URL = "/api/v1/resize-requests/"


@pytest.fixture
def filed(fleet_world, artist_api, django_capture_on_commit_callbacks):
    """Ana's request for a 24Q; the e-mails queued on commit are sent (mail.outbox)."""
    body = {"vm": fleet_world.vm_a.pk, "requested_profile": profile("RTX6000-24Q").pk, "reason": "big scenes"}
    with django_capture_on_commit_callbacks(execute=True):
        response = artist_api.post(URL, body, format="json")
    assert response.status_code == 201, response.json()
    return ResizeRequest.objects.get(pk=response.json()["id"])


def test_anonymous_is_refused(api, fleet_world):
    assert api.get(URL).status_code in (401, 403)


@pytest.fixture
def admin_with_mail(admin_user):
    admin_user.email = "admin@example.com"
    admin_user.save()
    return admin_user


def test_artist_files_for_own_vm_and_admins_are_told(fleet_world, admin_with_mail, artist_api, filed):
    admin_user = admin_with_mail
    assert filed.status == ResizeStatus.PENDING
    assert filed.current_profile == fleet_world.profile_12q
    assert filed.requested_by == fleet_world.ana.user
    assert Notification.objects.filter(user=admin_user).count() == 1
    assert [m.to for m in mail.outbox] == [["admin@example.com"]]
    assert AuditEvent.objects.filter(action="resize_request.file", object_id=str(filed.pk)).exists()


def test_artist_cannot_file_for_another_vm(fleet_world, artist_api):
    body = {"vm": fleet_world.vm_b.pk, "requested_profile": profile("RTX6000-24Q").pk}
    assert artist_api.post(URL, body, format="json").status_code in (400, 403)


def test_artist_sees_only_own_requests(fleet_world, admin_api, artist_api, filed):
    other = admin_api.post(URL, {"vm": fleet_world.vm_b.pk, "requested_profile": profile("RTX6000-24Q").pk},
                           format="json")
    assert other.status_code == 201
    assert [r["id"] for r in artist_api.get(URL).json()["results"]] == [filed.pk]
    assert artist_api.get(f"{URL}{other.json()['id']}/").status_code == 404
    assert len(admin_api.get(URL).json()["results"]) == 2


@pytest.mark.parametrize(("body", "field", "message"), [
    ({"requested_profile": "RTX6000-12Q"}, "requested_profile", "already has this profile"),
    ({"requested_profile": "RTX6000-12Q", "requested_vgpus": 5}, "requested_vgpus", "less than or equal to 4"),
    ({"requested_profile": "RTX6000-24Q", "wished_from": "2026-12-02T10:00:00Z",
      "wished_until": "2026-12-01T10:00:00Z"}, "wished_until", "must end after it starts"),
])
def test_validation_messages(fleet_world, artist_api, body, field, message):
    body = {**body, "vm": fleet_world.vm_a.pk, "requested_profile": profile(body["requested_profile"]).pk}
    response = artist_api.post(URL, body, format="json")
    assert response.status_code == 400
    assert message in str(response.json()[field])


def test_one_pending_request_per_vm(fleet_world, artist_api, filed):
    body = {"vm": fleet_world.vm_a.pk, "requested_profile": profile("RTX6000-8Q").pk}
    response = artist_api.post(URL, body, format="json")
    assert response.status_code == 400
    assert "already has a pending request" in str(response.json()["vm"])


def test_artist_may_not_approve_or_reject(artist_api, filed):
    assert artist_api.post(f"{URL}{filed.pk}/approve/").status_code == 403
    assert artist_api.post(f"{URL}{filed.pk}/reject/").status_code == 403


def test_approve_applies_and_tells_the_artist(fleet_world, admin_api, filed, django_capture_on_commit_callbacks):
    fleet_world.ana.user.email = "ana@example.com"
    fleet_world.ana.user.save()
    with django_capture_on_commit_callbacks(execute=True):
        response = admin_api.post(f"{URL}{filed.pk}/approve/", {"comment": "ok"}, format="json")
    assert response.status_code == 200, response.json()
    assert response.json()["status"] == "approved"
    vgpus = list(Vgpu.objects.filter(vm=fleet_world.vm_a))
    assert [v.profile.name for v in vgpus] == ["RTX6000-24Q"]
    assert vgpus[0].gpu == fleet_world.gpu_a
    assert Notification.objects.filter(user=fleet_world.ana.user, message__contains="approved").exists()
    assert any("approved" in m.body for m in mail.outbox)
    actions = set(AuditEvent.objects.values_list("action", flat=True))
    assert {"resize_request.approve", "vgpu.remove", "vgpu.place"} <= actions


def test_approve_when_nothing_fits_is_409_and_stays_pending(fleet_world, admin_api, filed):
    # Bob's GPU and Ana's GPU are the only RTX 6000s; fill Ana's with another VM so 24Q cannot fit anywhere.
    from fleet import services
    from fleet.tests.factories import VirtualMachineFactory
    services.place_vgpu(VirtualMachineFactory(name="ws-filler"), fleet_world.gpu_a, fleet_world.profile_12q)
    response = admin_api.post(f"{URL}{filed.pk}/approve/", {}, format="json")
    assert response.status_code == 409
    filed.refresh_from_db()
    assert filed.status == ResizeStatus.PENDING
    assert "No GPU has room" in filed.last_error
    assert [v.profile.name for v in Vgpu.objects.filter(vm=fleet_world.vm_a)] == ["RTX6000-12Q"]


def test_reject_and_cancel(fleet_world, admin_api, artist_api, filed):
    response = admin_api.post(f"{URL}{filed.pk}/reject/", {"comment": "not now"}, format="json")
    assert response.status_code == 200
    assert response.json()["decision_comment"] == "not now"
    assert Notification.objects.filter(user=fleet_world.ana.user, message__contains="not now").exists()
    assert artist_api.post(f"{URL}{filed.pk}/cancel/").status_code == 409
    second = artist_api.post(URL, {"vm": fleet_world.vm_a.pk, "requested_profile": profile("RTX6000-8Q").pk},
                             format="json").json()
    assert artist_api.post(f"{URL}{second['id']}/cancel/").json()["status"] == "cancelled"
    assert AuditEvent.objects.filter(action="resize_request.cancel").exists()


def test_fits_on_detail(admin_api, filed):
    assert admin_api.get(f"{URL}{filed.pk}/").json()["fits"]["where"] == "same_gpu"


def test_other_users_cannot_cancel(fleet_world, filed):
    from rest_framework.test import APIClient
    client = APIClient()
    client.force_authenticate(UserFactory(username="eve"))
    assert client.post(f"{URL}{filed.pk}/cancel/").status_code == 404

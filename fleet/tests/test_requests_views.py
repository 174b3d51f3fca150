"""The request pages: the artist files on /me/, the admin decides on /requests/, both see the outcome."""

from django.test import Client

from fleet.choices import ResizeStatus
from fleet.models import Notification, ResizeRequest, Vgpu
from fleet.tests.factories import profile


def _client(user):
    client = Client()
    client.force_login(user)
    return client


def test_artist_files_on_me_and_admin_approves_on_queue(fleet_world, admin_user):
    ana = _client(fleet_world.ana.user)
    page = ana.get("/me/")
    assert "Request a change" in page.content.decode()
    response = ana.post(f"/me/vms/{fleet_world.vm_a.pk}/request/",
                        {"change": "profile", "requested_profile": profile("RTX6000-24Q").pk, "reason": "sim"})
    assert response.status_code == 302
    request = ResizeRequest.objects.get(vm=fleet_world.vm_a)
    admin = _client(admin_user)
    queue = admin.get("/requests/").content.decode()
    assert "RTX6000-24Q" in queue
    assert "same gpu: " in queue
    admin.post(f"/requests/{request.pk}/approve/", {"comment": "enjoy"})
    request.refresh_from_db()
    assert request.status == ResizeStatus.APPROVED
    assert [v.profile.name for v in Vgpu.objects.filter(vm=fleet_world.vm_a)] == ["RTX6000-24Q"]
    assert "enjoy" in ana.get("/me/").content.decode()
    assert "approved" in ana.get("/notifications/").content.decode()
    assert not Notification.objects.filter(user=fleet_world.ana.user, read_at__isnull=True).exists()


def test_one_more_vgpu_and_validation_message(fleet_world):
    ana = _client(fleet_world.ana.user)
    ana.post(f"/me/vms/{fleet_world.vm_a.pk}/request/", {"change": "more", "reason": "two"})
    request = ResizeRequest.objects.get(vm=fleet_world.vm_a)
    assert request.requested_vgpus == 2
    response = ana.post(f"/me/vms/{fleet_world.vm_a.pk}/request/", {"change": "less", "reason": "again"}, follow=True)
    assert "already has a pending request" in response.content.decode()


def test_artist_cannot_open_queue_or_decide(fleet_world, admin_user):
    ana = _client(fleet_world.ana.user)
    assert ana.get("/requests/").status_code == 403
    bob_request = ResizeRequest.objects.create(vm=fleet_world.vm_b, requested_profile=profile("RTX6000-24Q"))
    assert ana.post(f"/requests/{bob_request.pk}/approve/").status_code == 403
    assert ana.post(f"/me/vms/{fleet_world.vm_b.pk}/request/",
                    {"requested_profile": profile("RTX6000-24Q").pk}).status_code == 403

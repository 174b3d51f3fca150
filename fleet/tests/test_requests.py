"""Resize requests through the API: filing, validation messages, approval applying, 409,
rejection with a reason, notifications, audit entries and the evidence next to each request."""


import pytest
from django.core import mail

from fleet import requests as service
from fleet import services
from fleet.choices import ResizeStatus
from fleet.models import AuditEvent, Notification, ResizeRequest, Vgpu, VgpuProfile
from fleet.tests.factories import GpuFactory, HostFactory, VirtualMachineFactory, gpu_model, profile
from fleet.tests.request_world import URL


def test_artist_files_for_own_vm_and_admins_are_told(fleet_world, admin_with_mail, artist_api, filed):
    assert filed.status == ResizeStatus.PENDING
    assert filed.current_profile == fleet_world.profile_12q
    assert filed.requested_by == fleet_world.ana.user
    assert filed.reason == "big scenes"
    assert Notification.objects.filter(user=admin_with_mail, message__contains="ws-ana").count() == 1
    assert [m.to for m in mail.outbox] == [["admin@example.com"]]
    assert "1 x RTX6000-24Q" in mail.outbox[0].body


def test_admins_without_an_address_still_see_it_in_the_app(fleet_world, admin_user, filed):
    assert admin_user.email == ""
    assert Notification.objects.filter(user=admin_user, url="/requests/").count() == 1
    assert not mail.outbox


def test_artist_cannot_file_for_another_vm(fleet_world, artist_api):
    body = {"vm": fleet_world.vm_b.pk, "requested_profile": profile("RTX6000-24Q").pk, "reason": "mine now"}
    response = artist_api.post(URL, body, format="json")
    assert response.status_code == 403
    assert "your own workstation" in response.json()["detail"]
    assert not ResizeRequest.objects.exists()


def test_artist_sees_only_own_requests(fleet_world, admin_api, artist_api, filed):
    other = admin_api.post(URL, {"vm": fleet_world.vm_b.pk, "requested_profile": profile("RTX6000-24Q").pk,
                                 "reason": "bob asked by phone"}, format="json")
    assert other.status_code == 201, other.json()
    assert [r["id"] for r in artist_api.get(URL).json()["results"]] == [filed.pk]
    assert artist_api.get(f"{URL}{other.json()['id']}/").status_code == 404
    assert len(admin_api.get(URL).json()["results"]) == 2


def _other_model_profile():
    return VgpuProfile.objects.exclude(gpu_model=profile("RTX6000-12Q").gpu_model).order_by("pk").first()


@pytest.mark.parametrize(("body", "field", "message"), [
    ({"requested_profile": "RTX6000-12Q"}, "requested_profile", "already has this profile and number of vGPUs"),
    ({"requested_profile": "RTX6000-12Q", "requested_vgpus": 5}, "requested_vgpus", "less than or equal to 4"),
    ({"requested_profile": "RTX6000-12Q", "requested_vgpus": 0}, "requested_vgpus", "greater than or equal to 1"),
    ({"requested_profile": "RTX6000-12Q", "requested_vgpus": 2}, "requested_vgpus",
     "On Quadro RTX 6000 a VM with several vGPUs may only use full-GPU profiles (24 GiB); RTX6000-12Q is smaller"),
    ({"requested_profile": "other-model"}, "requested_profile", "the GPU model this VM runs on"),
    ({"requested_profile": "RTX6000-24Q", "wished_from": "2026-12-02T10:00:00Z",
      "wished_until": "2026-12-01T10:00:00Z"}, "wished_until", "must end after it starts"),
    ({"requested_profile": "RTX6000-24Q", "reason": "  "}, "reason", "Say why the VM needs the change"),
    ({"requested_profile": "RTX6000-24Q", "reason": None}, "reason", "Say why the VM needs the change"),
    ({"requested_profile": 999999}, "requested_profile", "Invalid pk"),
])
def test_validation_messages(fleet_world, artist_api, body, field, message):
    body = {"reason": "lighting pass", **body, "vm": fleet_world.vm_a.pk}
    if body["reason"] is None:
        del body["reason"]
    name = body["requested_profile"]
    if name == "other-model":
        body["requested_profile"] = _other_model_profile().pk
    elif isinstance(name, str):
        body["requested_profile"] = profile(name).pk
    response = artist_api.post(URL, body, format="json")
    assert response.status_code == 400
    assert message in str(response.json()[field])
    assert not ResizeRequest.objects.exists()


def test_a_profile_limits_vgpus_per_vm(fleet_world, artist_api):
    VgpuProfile.objects.filter(name="RTX6000-24Q").update(max_per_vm=2)
    body = {"vm": fleet_world.vm_a.pk, "requested_profile": profile("RTX6000-24Q").pk, "requested_vgpus": 3,
            "reason": "three screens"}
    response = artist_api.post(URL, body, format="json")
    assert response.status_code == 400
    assert "RTX6000-24Q allows at most 2 vGPU(s) per VM." in str(response.json()["requested_vgpus"])


def test_a_vm_with_several_vgpus_keeps_its_series(artist, artist_api):
    a40 = gpu_model("NVIDIA A40")
    vm = VirtualMachineFactory(name="ws-a40", artist=artist)
    host = HostFactory(name="host-a40")
    q24 = VgpuProfile.objects.get(gpu_model=a40, series="Q", fb_mib=24576)
    for _ in range(2):  # each vGPU of the VM on a GPU of its own
        services.place_vgpu(vm, GpuFactory(host=host, gpu_model=a40), q24)
    other_series = VgpuProfile.objects.filter(gpu_model=a40).exclude(series="Q").order_by("pk").first()
    body = {"vm": vm.pk, "requested_profile": other_series.pk, "requested_vgpus": 2, "reason": "compute"}
    response = artist_api.post(URL, body, format="json")
    assert response.status_code == 400
    assert "A VM with several vGPUs keeps its profile series." in str(response.json()["requested_profile"])


def test_one_pending_request_per_vm(fleet_world, artist_api, filed):
    body = {"vm": fleet_world.vm_a.pk, "requested_profile": profile("RTX6000-8Q").pk, "reason": "smaller"}
    response = artist_api.post(URL, body, format="json")
    assert response.status_code == 400
    assert "already has a pending request" in str(response.json()["vm"])


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
    assert Notification.objects.filter(user=fleet_world.ana.user, message__contains="approved and applied").exists()
    assert [m.to for m in mail.outbox if "approved" in m.body] == [["ana@example.com"]]


def test_approving_twice_is_a_conflict(admin_api, filed):
    assert admin_api.post(f"{URL}{filed.pk}/approve/", {}, format="json").status_code == 200
    again = admin_api.post(f"{URL}{filed.pk}/approve/", {}, format="json")
    assert again.status_code == 409
    assert "The request is approved already" in again.json()["detail"]


def test_approve_when_nothing_fits_is_409_and_stays_pending(fleet_world, admin_api, filed):
    # Bob's GPU and Ana's GPU are the only RTX 6000s; fill Ana's with another VM so 24Q cannot fit anywhere.
    services.place_vgpu(VirtualMachineFactory(name="ws-filler"), fleet_world.gpu_a, fleet_world.profile_12q)
    response = admin_api.post(f"{URL}{filed.pk}/approve/", {}, format="json")
    assert response.status_code == 409
    assert "No GPU has room for 1 x RTX6000-24Q for ws-ana" in response.json()["detail"]
    filed.refresh_from_db()
    assert filed.status == ResizeStatus.PENDING
    assert "No GPU has room" in filed.last_error
    assert [v.profile.name for v in Vgpu.objects.filter(vm=fleet_world.vm_a)] == ["RTX6000-12Q"]
    assert admin_api.get(f"{URL}{filed.pk}/").json()["fits"]["where"] == "nowhere"
    assert not AuditEvent.objects.filter(action__in=["resize_request.approve", "vgpu.remove"]).exists()


def test_reject_needs_a_comment(fleet_world, admin_api, filed):
    response = admin_api.post(f"{URL}{filed.pk}/reject/", {"comment": " "}, format="json")
    assert response.status_code == 400
    assert "Give a reason for the rejection" in str(response.json()["comment"])
    filed.refresh_from_db()
    assert filed.status == ResizeStatus.PENDING


def test_reject_and_cancel(fleet_world, admin_api, artist_api, filed):
    response = admin_api.post(f"{URL}{filed.pk}/reject/", {"comment": "not now"}, format="json")
    assert response.status_code == 200
    assert response.json()["decision_comment"] == "not now"
    assert Notification.objects.filter(user=fleet_world.ana.user, message__contains="rejected: not now").exists()
    late = artist_api.post(f"{URL}{filed.pk}/cancel/")
    assert late.status_code == 409
    assert "The request is rejected already" in late.json()["detail"]
    second = artist_api.post(URL, {"vm": fleet_world.vm_a.pk, "requested_profile": profile("RTX6000-8Q").pk,
                                   "reason": "smaller is enough"}, format="json").json()
    assert artist_api.post(f"{URL}{second['id']}/cancel/").json()["status"] == "cancelled"


def test_each_action_leaves_an_audit_entry_naming_who(fleet_world, admin_user, admin_api, artist_api, filed):
    """File, cancel (by the artist), reject and approve (by the admin): one event each, with
    the status before and after, and the vGPU moves of the approval tied to the request."""
    filed_event = AuditEvent.objects.get(action="resize_request.file", object_id=str(filed.pk))
    assert filed_event.actor == fleet_world.ana.user
    assert filed_event.after["status"] == "pending"

    artist_api.post(f"{URL}{filed.pk}/cancel/")
    cancelled = AuditEvent.objects.get(action="resize_request.cancel", object_id=str(filed.pk))
    assert (cancelled.actor, cancelled.before["status"], cancelled.after["status"]) == (
        fleet_world.ana.user, "pending", "cancelled")

    body = {"vm": fleet_world.vm_a.pk, "requested_profile": profile("RTX6000-24Q").pk, "reason": "again"}
    rejected_id = artist_api.post(URL, body, format="json").json()["id"]
    admin_api.post(f"{URL}{rejected_id}/reject/", {"comment": "render farm first"}, format="json")
    rejected = AuditEvent.objects.get(action="resize_request.reject", object_id=str(rejected_id))
    assert (rejected.actor, rejected.after["status"], rejected.comment) == (admin_user, "rejected", "render farm first")

    approved_id = artist_api.post(URL, body, format="json").json()["id"]
    admin_api.post(f"{URL}{approved_id}/approve/", {"comment": "go"}, format="json")
    approved = AuditEvent.objects.get(action="resize_request.approve", object_id=str(approved_id))
    assert (approved.actor, approved.before["status"], approved.after["status"]) == (admin_user, "pending", "approved")
    moves = AuditEvent.objects.filter(comment=f"resize request #{approved_id}")
    assert sorted(moves.values_list("action", flat=True)) == ["vgpu.place", "vgpu.remove"]
    assert {e.actor for e in moves} == {admin_user}


def test_fits_on_detail(admin_api, filed):
    fit = admin_api.get(f"{URL}{filed.pk}/").json()["fits"]
    assert fit["where"] == "same_gpu"
    assert fit["host"] == "host-a"


def test_fits_says_another_gpu_another_host_or_nowhere(fleet_world, admin_user):
    """A 24Q needs a whole RTX 6000: Ana's GPU keeps a neighbour's 12Q, so it cannot stay there.
    Both hosts' GPUs share the PCI address 3B:00.0, as real hosts' do: only ids tell them apart."""
    services.place_vgpu(VirtualMachineFactory(name="ws-neighbour"), fleet_world.gpu_a, fleet_world.profile_12q)
    request = service.file_request(fleet_world.vm_a, fleet_world.ana.user, profile("RTX6000-24Q"), 1, "bigger")
    assert service.fits(request).where == "nowhere"

    services.remove_vgpu(fleet_world.vgpu_b)  # host-b's 3B:00.0 is empty now
    fit = service.fits(request)
    assert (fit.where, fit.host, fit.gpus) == ("other_host", "host-b", ("00000000:3B:00.0",))

    GpuFactory(host=fleet_world.host_a, pci_bus_id="00000000:5E:00.0")
    fit = service.fits(request)
    assert (fit.where, fit.host, fit.gpus) == ("other_gpu", "host-a", ("00000000:5E:00.0",))
    assert Vgpu.objects.filter(vm=fleet_world.vm_a).get().gpu == fleet_world.gpu_a  # asking moved nothing


def test_working_out_where_a_request_fits_changes_nothing_the_read_cache_keeps(fleet_world, admin_api, filed):
    """Working out where a request fits only reads (a snapshot and the pure answer of fleet.fit):
    lists and the overview cached before it are still served after it (config/read_cache.py)."""
    from config import read_cache
    from fleet.models import Vgpu

    tables = [Vgpu._meta.db_table, "fleet_auditevent"]
    before = read_cache.versions(tables)
    assert service.fits(filed).where != "n/a"
    assert read_cache.versions(tables) == before
    assert Vgpu.objects.filter(vm=fleet_world.vm_a).count() == 1

"""The request pages: the artist files on /me/ (with the evidence next to the form), the admin
decides on /requests/ (with the evidence and where each fits), both see the outcome."""

import re

from django.test import Client

from fleet import request_preview, services
from fleet.choices import ResizeStatus
from fleet.models import Host, Notification, ResizeRequest, Vgpu, VirtualMachine
from fleet.tests.factories import GpuFactory, VirtualMachineFactory, profile
from sizing.models import OptimizerRun, SuggestionAction
from sizing.suggestions import accept_suggestion
from sizing.tests.suggestion_world import suggest


def _client(user):
    client = Client()
    client.force_login(user)
    return client


def _row(html: str, pk: int) -> str:
    match = re.search(rf'<tr data-request="{pk}">(.*?)</tr>', html, re.S)
    assert match, f"no row for request #{pk}"
    return match.group(1)


def _approve(admin, request, comment: str = "", **extra):
    """Approve through the confirm step, as the admin does: open it, tick, post its fingerprint."""
    page = admin.get(f"/requests/{request.pk}/review/").content.decode()
    match = re.search(r'name="fingerprint" value="(\w+)"', page)
    fingerprint = match.group(1) if match else ""
    return admin.post(f"/requests/{request.pk}/approve/",
                      {"comment": comment, "confirm": "on", "fingerprint": fingerprint, **extra}, follow=True)


def test_artist_files_on_me_and_admin_approves_on_queue(fleet_world, admin_user):
    ana = _client(fleet_world.ana.user)
    page = ana.get("/me/")
    assert "Request a change" in page.content.decode()
    response = ana.post(f"/me/vms/{fleet_world.vm_a.pk}/request/",
                        {"change": "profile", "requested_profile": profile("RTX6000-24Q").pk, "reason": "sim",
                         "wished_from": "2026-12-01T09:00", "wished_until": "2026-12-05T18:00"}, follow=True)
    assert "Request for ws-ana (1 x RTX6000-24Q) filed" in response.content.decode()
    request = ResizeRequest.objects.get(vm=fleet_world.vm_a)
    assert request.wished_from.isoformat().startswith("2026-12-01T09:00")
    admin = _client(admin_user)
    queue = admin.get("/requests/").content.decode()
    row = _row(queue, request.pk)
    assert "RTX6000-24Q" in row
    assert "same gpu: " in row
    assert "wished 2026-12-01 09:00 – 2026-12-05 18:00" in row
    done = _approve(admin, request, "enjoy").content.decode()
    assert done.count(f"Request #{request.pk} for ws-ana (1 x RTX6000-24Q) approved and applied.") == 1
    request.refresh_from_db()
    assert request.status == ResizeStatus.APPROVED
    assert [v.profile.name for v in Vgpu.objects.filter(vm=fleet_world.vm_a)] == ["RTX6000-24Q"]
    me = ana.get("/me/").content.decode()
    assert "enjoy" in me
    assert "Approved and applied" in _row(me, request.pk)
    assert "approved" in ana.get("/notifications/").content.decode()
    assert not Notification.objects.filter(user=fleet_world.ana.user, read_at__isnull=True).exists()


def test_quick_choices_follow_the_rules(fleet_world):
    """One more vGPU of a partial RTX 6000 profile is refused by the placement rules, so /me/
    does not offer it; with a full-GPU profile it does, and one less only past one vGPU."""
    ana = _client(fleet_world.ana.user)
    form = ana.get("/me/").content.decode()
    assert 'value="more"' not in form
    assert 'value="less"' not in form
    Vgpu.objects.filter(vm=fleet_world.vm_a).delete()
    full = profile("RTX6000-24Q")
    services.place_vgpu(fleet_world.vm_a, fleet_world.gpu_a, full)
    gpu_2 = GpuFactory(host=fleet_world.host_a, pci_bus_id="00000000:5E:00.0")
    services.place_vgpu(fleet_world.vm_a, gpu_2, full)
    form = ana.get("/me/").content.decode()
    assert "One more vGPU (3 × RTX6000-24Q)" in form
    assert "One less vGPU (1 × RTX6000-24Q)" in form
    ana.post(f"/me/vms/{fleet_world.vm_a.pk}/request/", {"change": "less", "reason": "one is plenty"})
    request = ResizeRequest.objects.get(vm=fleet_world.vm_a)
    assert (request.requested_profile, request.current_vgpus, request.requested_vgpus) == (full, 2, 1)


def test_form_messages(fleet_world):
    ana = _client(fleet_world.ana.user)
    url = f"/me/vms/{fleet_world.vm_a.pk}/request/"

    def messages_of(data):
        return ana.post(url, data, follow=True).content.decode()

    q24 = profile("RTX6000-24Q").pk
    assert "Choose a target profile of the VM&#x27;s GPU model." in messages_of({"reason": "x"})
    assert "Say why the VM needs the change" in messages_of({"requested_profile": q24, "reason": " "})
    assert "Enter the wished window as a date and time" in messages_of(
        {"requested_profile": q24, "reason": "x", "wished_from": "next week"})
    assert ("Change: choose a target profile, one vGPU more, one vGPU less or the same vGPUs with other vCPUs or RAM "
            "(not sideways).") in messages_of(
        {"change": "sideways", "requested_profile": q24, "reason": "x"})
    assert not ResizeRequest.objects.filter(vm=fleet_world.vm_a).exists()  # nothing filed from bad input
    assert "The wished window must end after it starts." in messages_of(
        {"requested_profile": q24, "reason": "x", "wished_from": "2026-12-02T09:00",
         "wished_until": "2026-12-01T09:00"})
    assert not ResizeRequest.objects.exists()
    ana.post(url, {"change": "profile", "requested_profile": q24, "reason": "two"})
    page = messages_of({"requested_profile": profile("RTX6000-8Q").pk, "reason": "again"})
    assert page.count("already has a pending request") == 1  # shown once, not once per VM box


def test_reject_without_a_comment_is_refused_with_the_reason(fleet_world, admin_user):
    request = ResizeRequest.objects.create(vm=fleet_world.vm_a, requested_profile=profile("RTX6000-24Q"), reason="x")
    admin = _client(admin_user)
    page = admin.post(f"/requests/{request.pk}/reject/", {"comment": ""}, follow=True).content.decode()
    assert f"Request #{request.pk} was not rejected: Give a reason for the rejection" in page
    request.refresh_from_db()
    assert request.status == ResizeStatus.PENDING
    admin.post(f"/requests/{request.pk}/reject/", {"comment": "the farm needs it this week"})
    request.refresh_from_db()
    assert (request.status, request.decision_comment) == (ResizeStatus.REJECTED, "the farm needs it this week")
    me = _client(fleet_world.ana.user).get("/me/").content.decode()
    assert "the farm needs it this week" in _row(me, request.pk)


def test_queue_shows_conflicts_and_where_nothing_fits(fleet_world, admin_user):
    request = ResizeRequest.objects.create(vm=fleet_world.vm_a, requested_profile=profile("RTX6000-24Q"), reason="x")
    services.place_vgpu(VirtualMachineFactory(name="ws-filler"), fleet_world.gpu_a, fleet_world.profile_12q)
    admin = _client(admin_user)
    review = admin.get(f"/requests/{request.pk}/review/").content.decode()
    assert "Cannot be approved now: No GPU has room" in review
    assert 'name="confirm"' not in review
    page = admin.post(f"/requests/{request.pk}/approve/",
                      {"confirm": "on", "fingerprint": request_preview.preview(request).fingerprint},
                      follow=True).content.decode()
    assert f"Request #{request.pk} could not be approved: No GPU has room for 1 x RTX6000-24Q for ws-ana" in page
    row = _row(page, request.pk)
    assert 'data-fit="nowhere"' in row
    assert "Fits nowhere" not in row
    assert "Last approval failed: No GPU has room" in row
    assert f'hx-get="/requests/{request.pk}/room/"' in row, "whether moving others helps loads on its own"


def test_a_request_that_fits_if_another_vm_moves_says_so_with_the_plan_one_click_away(fleet_world, admin_user):
    """Ana's 12Q shares host-a's GPU with a filler; host-b's GPU has a free 12Q slot: 24Q for Ana
    fits nowhere as the fleet stands, and on host-a's GPU once the filler moves to host-b. Host-a
    has threads for Ana and the filler only, and Bob's VM needs more than Ana's, so Bob moving
    there instead (Ana then taking host-b's GPU: as few moves) is not a plan, and the answer does
    not hang on how far a timed search got."""
    request = ResizeRequest.objects.create(vm=fleet_world.vm_a, requested_profile=profile("RTX6000-24Q"), reason="x")
    filler = VirtualMachineFactory(name="ws-filler")
    services.place_vgpu(filler, fleet_world.gpu_a, fleet_world.profile_12q)
    Host.objects.filter(pk=fleet_world.host_a.pk).update(cpu_threads=fleet_world.vm_a.vcpus + filler.vcpus)
    VirtualMachine.objects.filter(pk=fleet_world.vm_b.pk).update(vcpus=fleet_world.vm_a.vcpus + 4)
    admin = _client(admin_user)
    fragment = admin.get(f"/requests/{request.pk}/room/").content.decode()
    assert 'data-room="1"' in fragment
    assert re.sub(r"\s+", " ", re.sub(r"<[^>]+>", "", fragment)).strip().startswith(
        "Fits only if 1 other VM moves: ws-filler.")
    assert 'action="/sizing/optimizer/"' in fragment
    assert 'name="include_requests" value="on"' in fragment
    start = admin.post("/sizing/optimizer/", {"include_requests": "on"})
    assert start.status_code == 302
    run = OptimizerRun.objects.get()
    assert [c["vm_id"] for c in run.params["changes"]] == [fleet_world.vm_a.pk]


def test_a_request_that_fits_nowhere_even_by_moving_says_why(fleet_world, admin_user):
    request = ResizeRequest.objects.create(vm=fleet_world.vm_a, requested_profile=profile("RTX6000-24Q"),
                                           requested_vgpus=4, reason="x")
    fragment = _client(admin_user).get(f"/requests/{request.pk}/room/").content.decode()
    assert 'data-room="none"' in fragment
    assert "Not even by moving other VMs:" in fragment


def test_queue_shows_the_suggestion_evidence(fleet_world, admin_user):
    """Each pending request carries its VM's suggestion (kind, target, reason, figures) and
    whether it agrees; a request an admin filed by accepting the suggestion says so."""
    own = ResizeRequest.objects.create(vm=fleet_world.vm_a, requested_profile=profile("RTX6000-24Q"), reason="x",
                                       current_profile=fleet_world.profile_12q)
    suggest(fleet_world.vm_a, action=SuggestionAction.DOWNSIZE, target="RTX6000-8Q", reason="Mostly idle")
    from_suggestion = accept_suggestion(suggest(fleet_world.vm_b), admin_user, evidence_key="k1")
    page = _client(admin_user).get("/requests/").content.decode()
    mine = _row(page, own.pk)
    assert 'data-evidence="downsize"' in mine
    assert "to RTX6000-8Q" in mine
    assert "Mostly idle" in mine
    assert "differs from the request" in mine
    assert "Over 14 days: frame buffer p95 11.2 of 12 GiB (93%)" in mine
    accepted = _row(page, from_suggestion.pk)
    assert 'data-evidence="upsize"' in accepted
    assert "from right-sizing" in accepted
    assert "Right-sizing: fb p95 11.2 GiB" in accepted  # the reason the accepted suggestion wrote


def test_artist_sees_the_evidence_of_their_vm(fleet_world):
    ana = _client(fleet_world.ana.user)
    assert "No usage evidence yet." in ana.get("/me/").content.decode()
    suggest(fleet_world.vm_a)
    suggest(fleet_world.vm_b, action=SuggestionAction.DOWNSIZE, target="RTX6000-8Q", reason="Bob idles")
    box = ana.get("/me/").content.decode()
    assert 'data-evidence="upsize"' in box
    assert "Frame buffer p95 at 93% of the profile" in box
    assert "frame buffer p95 11.2 of 12 GiB (93%), peak 100%, mean 74%; GPU utilization p95 41%" in box
    assert "Bob idles" not in box
    assert "00000000:3B:00.0" not in box  # the suggestion's placement impact stays the admin's


def test_artist_cannot_open_queue_or_decide(fleet_world, admin_user):
    ana = _client(fleet_world.ana.user)
    assert ana.get("/requests/").status_code == 403
    bob_request = ResizeRequest.objects.create(vm=fleet_world.vm_b, requested_profile=profile("RTX6000-24Q"))
    assert ana.post(f"/requests/{bob_request.pk}/approve/").status_code == 403
    assert ana.post(f"/me/vms/{fleet_world.vm_b.pk}/request/",
                    {"requested_profile": profile("RTX6000-24Q").pk, "reason": "x"}).status_code == 403


# The confirm step ---------------------------------------------------------------------------


def _grow_across_hosts(fleet_world):
    """Ana's 12Q shares host-a's only GPU with a filler, so 24Q fits only on host-b's free GPU."""
    services.place_vgpu(VirtualMachineFactory(name="ws-filler"), fleet_world.gpu_a, fleet_world.profile_12q)
    free = GpuFactory(host=fleet_world.host_b, pci_bus_id="00000000:5E:00.0")
    request = ResizeRequest.objects.create(vm=fleet_world.vm_a, requested_profile=profile("RTX6000-24Q"),
                                           current_profile=fleet_world.profile_12q, current_vgpus=1, reason="x")
    return request, free


def test_approving_shows_the_move_and_the_shutdown_first(fleet_world, admin_user):
    request, _ = _grow_across_hosts(fleet_world)
    admin = _client(admin_user)
    queue = admin.get("/requests/").content.decode()
    assert f'href="/requests/{request.pk}/review/"' in _row(queue, request.pk)

    review = admin.get(f"/requests/{request.pk}/review/").content.decode()
    row = re.search(rf'<tr data-vm="{fleet_world.vm_a.pk}">(.*?)</tr>', review, re.S).group(1)
    cells = [re.sub(r"\s+", " ", re.sub(r"<[^>]+>", "", cell)).strip()
             for cell in re.findall(r"<td[^>]*>(.*?)</td>", row, re.S)]
    assert cells[0] == "ws-ana"
    assert cells[1] == "host-a 00000000:3B:00.0"
    assert cells[3] == "host-b 00000000:5E:00.0"
    assert cells[4] == "1 × RTX6000-12Q → 1 × RTX6000-24Q"
    assert cells[5] == "Yes: its vGPUs move to another host"
    assert "Shut down ws-ana before you confirm" in review
    held = [v.gpu_id for v in Vgpu.objects.filter(vm=fleet_world.vm_a)]
    assert held == [fleet_world.gpu_a.pk], "opening the confirm step changes nothing"


def test_an_approval_without_the_confirmation_changes_nothing(fleet_world, admin_user):
    request, _ = _grow_across_hosts(fleet_world)
    admin = _client(admin_user)
    fingerprint = request_preview.preview(request).fingerprint
    for body in ({}, {"comment": "go"}, {"fingerprint": fingerprint}, {"confirm": "on"}):
        response = admin.post(f"/requests/{request.pk}/approve/", body, follow=True)
        assert response.redirect_chain[-1][0] == f"/requests/{request.pk}/review/"
        assert f"Request #{request.pk} was not approved: {request_preview.NOT_CONFIRMED}" in response.content.decode()
    request.refresh_from_db()
    assert request.status == ResizeStatus.PENDING
    assert [v.gpu_id for v in Vgpu.objects.filter(vm=fleet_world.vm_a)] == [fleet_world.gpu_a.pk]


def test_a_confirmation_of_a_fleet_that_changed_since_is_refused(fleet_world, admin_user):
    request, free = _grow_across_hosts(fleet_world)
    admin = _client(admin_user)
    fingerprint = request_preview.preview(request).fingerprint
    services.place_vgpu(VirtualMachineFactory(name="ws-late"), free, profile("RTX6000-12Q"))  # takes half the target
    response = admin.post(f"/requests/{request.pk}/approve/", {"confirm": "on", "fingerprint": fingerprint},
                          follow=True)
    page = response.content.decode()
    assert "The fleet changed since you reviewed this approval" in page
    assert response.redirect_chain[-1][0] == f"/requests/{request.pk}/review/"
    request.refresh_from_db()
    assert request.status == ResizeStatus.PENDING
    assert [v.gpu_id for v in Vgpu.objects.filter(vm=fleet_world.vm_a)] == [fleet_world.gpu_a.pk]


def test_after_an_approval_the_vm_and_artist_pages_show_the_new_profile(fleet_world, admin_user,
                                                                       django_capture_on_commit_callbacks):
    """The VM had right-sizing advice computed on its 12Q ("upsize 12Q -> 24Q, 11.2 of 12 GiB");
    once the 24Q is approved, neither page quotes the 12Q any more."""
    suggest(fleet_world.vm_a)
    request = ResizeRequest.objects.create(vm=fleet_world.vm_a, requested_profile=profile("RTX6000-24Q"),
                                           current_profile=fleet_world.profile_12q, current_vgpus=1, reason="x")
    admin, ana = _client(admin_user), _client(fleet_world.ana.user)
    assert "11.2 of 12 GiB" in _text_of(ana.get("/me/"))
    with django_capture_on_commit_callbacks(execute=True):
        _approve(admin, request)
    for page in (ana.get(f"/vms/{fleet_world.vm_a.pk}/"), ana.get("/me/")):
        text = _text_of(page)
        assert "RTX6000-24Q" in text
        assert "RTX6000-12Q" not in re.sub(r"<option[^>]*>.*?</option>", "", text), "only the form offers it"
        assert "of 12 GiB" not in text


def _text_of(response) -> str:
    return response.content.decode()

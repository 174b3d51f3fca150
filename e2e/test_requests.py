"""Resize requests in a real browser: an artist files one on /me/, an admin sees it counted in
the navigation and approves it on /requests/ through the confirm step (what moves, what
must be shut down), and the artist sees the new profile, the
request applied and the notification (counted on the bell until opened)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from e2e.conftest import sign_in
from fleet import requests as service
from fleet.models import Host, ResizeRequest, Vgpu, VgpuProfile

pytestmark = pytest.mark.django_db(transaction=True, serialized_rollback=True)


def _fitting_profile(vm, user) -> VgpuProfile:
    """A profile of the VM's GPU model, other than its own, that fits somewhere now (asked, then forgotten)."""
    current = Vgpu.objects.filter(vm=vm).select_related("profile").first().profile
    for candidate in VgpuProfile.objects.filter(gpu_model=current.gpu_model).exclude(pk=current.pk).order_by("fb_mib"):
        probe = service.file_request(vm, user, candidate, Vgpu.objects.filter(vm=vm).count(), "probe")
        fit = service.fits(probe)
        probe.delete()
        if fit.where != "nowhere":
            return candidate
    pytest.fail(f"no other profile fits {vm.name}")


def test_artist_files_admin_approves_artist_sees_it(page, demo_world, tmp_path):
    # The flow on hosts no hypervisor link ties to: approval applies at once, the admin shuts the
    # VM down by hand (a linked host's approval becomes an operation: e2e/test_operations.py).
    Host.objects.update(hypervisor_uri="")
    out = Path(os.environ.get("SCREENSHOT_DIR") or tmp_path)
    out.mkdir(parents=True, exist_ok=True)
    artist = demo_world.artist
    vm = artist.vms.filter(vgpus__isnull=False).order_by("name").first()
    target = _fitting_profile(vm, artist.user)

    sign_in(page, artist.user.username, next_path="/me/")
    box = page.locator(f"[data-vm='{vm.pk}'] [data-section=requests]")
    box.locator("select[name=requested_profile]").select_option(str(target.pk))
    box.locator("input[name=reason]").fill("heavier scenes this month")
    box.locator("button[type=submit]", has_text="Send request").click()
    page.wait_for_load_state()
    assert "Pending" in page.locator(f"[data-vm='{vm.pk}'] [data-section=requests] table").inner_text()
    box.screenshot(path=str(out / "my-workstation-request.png"))
    request = ResizeRequest.objects.get(vm=vm, status="pending")
    page.context.clear_cookies()

    sign_in(page, "admin", next_path="/requests/")
    pending = ResizeRequest.objects.filter(status="pending").count()
    assert page.locator("[data-badge=requests]").text_content() == f"{pending} pending"
    row = page.locator(f"[data-table=pending] tr[data-request='{request.pk}']")
    assert target.name in row.inner_text()
    assert row.locator("[data-evidence]").count() == 1
    page.screenshot(path=str(out / "requests.png"), full_page=True)
    row.locator("[data-action=review]").click()
    page.wait_for_url(f"**/requests/{request.pk}/review/")
    held = sorted(Vgpu.objects.filter(vm=vm).values_list("gpu_id", "profile_id"))
    change = page.locator(f"[data-table=changes] tr[data-vm='{vm.pk}']")
    assert vm.name in change.inner_text()
    assert target.name in change.inner_text()
    assert change.locator("[data-shutdown=yes]").count() == 1
    assert f"Shut down {vm.name} before you confirm" in page.locator("[data-shutdowns]").inner_text()
    confirm = page.locator("[data-form=confirm]")
    confirm.locator("input[name=comment]").fill("go ahead")
    page.screenshot(path=str(out / "request-approve-confirm.png"), full_page=True)
    # The browser will not send the form before the box is ticked, and nothing changed yet.
    confirm.locator("button[type=submit]").click()
    assert page.url.endswith(f"/requests/{request.pk}/review/")
    assert sorted(Vgpu.objects.filter(vm=vm).values_list("gpu_id", "profile_id")) == held
    confirm.locator("input[name=confirm]").check()
    confirm.locator("button[type=submit]").click()
    page.wait_for_load_state()
    assert f"Request #{request.pk} for {vm.name}" in page.locator("ul.messages").inner_text()
    assert "approved and applied" in page.locator("ul.messages").inner_text()
    assert page.locator(f"[data-table=decided] tr[data-request='{request.pk}'] [data-status=approved]").count() == 1
    page.context.clear_cookies()

    sign_in(page, artist.user.username, next_path="/me/")
    assert page.locator("[data-badge=notifications]").text_content() == "1 unread"
    card = page.locator(f"[data-vm='{vm.pk}']")
    assert target.name in card.locator("p.muted").first.inner_text()
    status = card.locator(f"[data-section=requests] tr[data-request='{request.pk}'] [data-status]")
    assert status.inner_text() == "Approved and applied"
    assert "go ahead" in card.locator(f"[data-section=requests] tr[data-request='{request.pk}']").inner_text()
    page.goto("/notifications/")
    assert "approved and applied" in page.locator("ul.notifications li.unread").first.inner_text()
    assert page.locator("[data-badge=notifications]").count() == 0

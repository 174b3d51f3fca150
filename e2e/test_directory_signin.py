"""Signing in through the studio's LDAP directory in a real browser (Chromium), against a real
slapd (identity/tests/slapd.py): the admins' group lands on the fleet, an artist sees only their
own workstation, someone in neither group is told why, someone removed from the groups is signed
out at their next click, and a wrong password is throttled like a local one."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from e2e.conftest import sign_in
from fleet.tests.factories import ArtistFactory, UserFactory, VirtualMachineFactory
from identity.tests.slapd import LIGHTING, PASSWORD

# serialized_rollback: the flush after a transactional test re-creates content types, which the
# next test that restores the serialized database would then meet twice.
pytestmark = pytest.mark.django_db(transaction=True, serialized_rollback=True)


@pytest.fixture
def shots(tmp_path) -> Path:
    out = Path(os.environ.get("SCREENSHOT_DIR") or tmp_path)
    out.mkdir(parents=True, exist_ok=True)
    return out


def test_directory_sign_in_in_the_browser(page, directory, shots):
    # IT made bob's account and workstation before the directory was connected; the directory
    # sign-in takes that account over by user name.
    bob = ArtistFactory(name="Bob (local)", user=UserFactory(username="bob"))
    mine = VirtualMachineFactory(name="ws-bob-01", artist=bob)
    theirs = VirtualMachineFactory(name="ws-carol-01")

    page.goto("/login/")
    assert "Sign in with your Studio directory account" in page.locator(".directory").inner_text()
    page.screenshot(path=str(shots / "sign-in-directory.png"))

    sign_in(page, "alice", PASSWORD, next_path="/hosts/")
    assert page.url.endswith("/hosts/")
    assert page.locator("h1").first.inner_text().strip() != "Sign in"
    page.context.clear_cookies()

    sign_in(page, "bob", PASSWORD, next_path="/me/")
    assert page.url.endswith("/me/")
    body = page.locator("main").inner_text()
    assert mine.name in body
    assert theirs.name not in body
    assert page.goto(f"/vms/{theirs.pk}/").status == 404
    assert page.goto("/hosts/").status == 403
    page.goto("/me/")
    page.wait_for_load_state("networkidle")  # the workstation's charts have their data before bob is removed

    # Removed from the artists' group: the next click signs bob out, and the page says why.
    directory.remove_member(LIGHTING, "bob")
    page.reload()
    page.wait_for_url("**/login/**")
    assert "You were signed out." in page.locator("[role=alert]").first.inner_text()
    assert "not in a group that may use the fleet dashboard" in page.locator("main").inner_text()
    page.screenshot(path=str(shots / "sign-in-directory-removed.png"))
    page.context.clear_cookies()

    sign_in(page, "dave", PASSWORD)
    refusal = page.locator("[role=alert]").first.inner_text()
    assert "Your Studio directory account is not in a group that may use the fleet dashboard" in refusal
    page.screenshot(path=str(shots / "sign-in-directory-refused.png"))


def test_wrong_directory_passwords_are_throttled_like_local_ones(page, directory):
    for _ in range(4):
        sign_in(page, "carol", "not-her-password")
        assert "didn't match" in page.locator("[role=alert]").first.inner_text()
    sign_in(page, "carol", "not-her-password")
    assert "Too many failed sign-ins" in page.locator("main").inner_text()
    sign_in(page, "carol", PASSWORD)  # locked out: the right password waits too
    assert "Too many failed sign-ins" in page.locator("main").inner_text()
    assert "/login/" in page.url

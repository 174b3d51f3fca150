"""Signing in with OpenID Connect in Chromium: the login page's button, the test provider's own
login page (served as `localhost`, the dashboard as 127.0.0.1: two sites, two cookie jars), and
back to the dashboard, under the content security policy a studio's browser enforces.

Admins land on the fleet overview, whose htmx refresh sends the page by the provider again when
the ID token is due for renewal; an artist sees only their own VM, and a form they post while
their token is due goes by the provider and back (form-action must allow it); someone in
neither group reads why on the login page.
"""

from __future__ import annotations

import os
import re
import time
from pathlib import Path

import pytest
from django.contrib.sessions.backends.db import SessionStore
from django.test.utils import override_settings
from pytest_django.live_server_helper import LiveServer

from e2e.conftest import VIEWPORT, build_demo_world, chromium, watch_errors
from fleet.models import Artist, ResizeRequest, VirtualMachine
from identity.roles import NO_ROLE
from identity.tests.oidc_support import ADMINS, ARTISTS, DISPLAY_NAME, PASSWORD, oidc_enabled

pytestmark = pytest.mark.django_db(transaction=True, serialized_rollback=True)


@pytest.fixture(scope="module")
def browser():
    with chromium() as launched:
        yield launched


@pytest.fixture
def site(oidc_provider, transactional_db):
    """The dashboard with OIDC on, served over HTTP on 127.0.0.1 (its own server: a server's
    middleware is read when it starts, and the session renewal is middleware)."""
    with oidc_enabled(oidc_provider.env()), override_settings(DASHBOARD_REFRESH_S=1):
        server = LiveServer("127.0.0.1")
        try:
            yield server.url
        finally:
            server.stop()


@pytest.fixture
def page(browser, site):
    """A browser with no cookies at either site; JavaScript errors (a CSP refusal among them) fail
    the test. The navigations it makes are in `page.hops`."""
    context = browser.new_context(viewport=VIEWPORT, base_url=site)
    tab = context.new_page()
    errors = watch_errors(tab)
    tab.hops = []
    tab.on("request", lambda request: tab.hops.append(request.url) if request.is_navigation_request() else None)
    yield tab
    context.close()
    assert not errors, f"errors in the browser: {errors}"


@pytest.fixture
def world(tmp_path):
    """The demo fleet with a few hours of history."""
    return build_demo_world(tmp_path / "agents", tiers=((0.25, 900),))


def sign_in_at_provider(page, site: str, username: str, next_path: str = "/") -> None:
    """From a dashboard page, through the login page's button and the provider's login form."""
    page.goto(next_path)
    page.wait_for_url("**/login/**")
    page.locator("[data-sign-in=oidc]", has_text=f"Sign in with {DISPLAY_NAME}").click()
    page.wait_for_url(re.compile(r"^http://localhost:\d+/accounts/login/"))
    page.fill("#id_username", username)
    page.fill("#id_password", PASSWORD)
    page.click("button[type=submit]")
    page.wait_for_url(re.compile(rf"^{re.escape(site)}/"))
    page.wait_for_load_state("networkidle")


def expire_id_token(page, site: str) -> None:
    """The ID token's renewal time has passed (the dashboard's session says so)."""
    key = next(c["value"] for c in page.context.cookies(site) if c["name"] == "sessionid")
    session = SessionStore(session_key=key)
    session["oidc_id_token_expiration"] = 0
    session.save()


def renewals(page) -> list[str]:
    return [url for url in page.hops if "/o/authorize/" in url and "prompt=none" in url]


def test_an_admin_lands_on_the_overview_and_its_refresh_renews_the_session(page, site, oidc_provider, world):
    oidc_provider.put_user("ada", groups=(ADMINS,), first_name="Ada", last_name="Lovelace")
    sign_in_at_provider(page, site, "ada")
    assert page.url == f"{site}/"
    assert page.locator("h1").inner_text() == "Fleet overview"
    assert page.locator(".session .who").inner_text() == "Ada Lovelace"
    assert world.agents[0].host.name in page.locator("#overview-live").inner_text(), page.locator("main").inner_text()
    # The overview's htmx refresh finds the token due: the page goes by the provider and back.
    expire_id_token(page, site)
    deadline = time.monotonic() + 20
    while not renewals(page) and time.monotonic() < deadline:
        page.wait_for_timeout(200)
    page.wait_for_url(f"{site}/")
    page.wait_for_load_state("networkidle")
    assert renewals(page), page.hops
    assert page.locator("h1").inner_text() == "Fleet overview"


def test_an_artist_sees_only_their_vm_and_a_form_posted_at_renewal_goes_through(page, site, oidc_provider, world):
    oidc_provider.put_user("nina", groups=(ARTISTS,), first_name="Nina", last_name="Lindqvist")
    sign_in_at_provider(page, site, "nina", next_path="/me/")
    assert page.url == f"{site}/me/"
    nina = Artist.objects.get(user__username="nina")
    vm = VirtualMachine.objects.filter(artist=world.other, vgpus__isnull=False).order_by("name").first()
    VirtualMachine.objects.filter(pk=vm.pk).update(artist=nina)
    others = list(VirtualMachine.objects.exclude(artist=nina).values_list("name", flat=True))
    page.reload()
    mine = page.locator("main").inner_text()
    assert vm.name in mine
    assert not [name for name in others if re.search(rf"\b{re.escape(name)}\b", mine)]
    assert page.goto(f"/vms/{VirtualMachine.objects.exclude(artist=nina).first().pk}/").status == 404
    page.goto("/me/")

    # A POST while the token is due: its redirect to /me/ goes by the provider (CSP form-action).
    expire_id_token(page, site)
    box = page.locator(f"[data-vm='{vm.pk}'] [data-section=requests]")
    current = box.locator("select[name=requested_profile] option[selected]").get_attribute("value")
    target = next(value for value in box.locator("select[name=requested_profile] option").evaluate_all(
        "options => options.map(o => o.value)") if value != current)
    box.locator("select[name=requested_profile]").select_option(target)
    box.locator("input[name=reason]").fill("heavier scenes this month")
    box.locator("button[type=submit]", has_text="Send request").click()
    page.wait_for_url(f"{site}/me/")
    page.wait_for_load_state("networkidle")
    assert renewals(page), page.hops
    assert f"Request for {vm.name}" in page.locator("ul.messages").inner_text()
    assert ResizeRequest.objects.filter(vm=vm, requested_by__username="nina").exists()


def test_someone_in_neither_group_is_told_why_on_the_login_page(page, site, oidc_provider, tmp_path):
    oidc_provider.put_user("mallory", groups=("render-wranglers",))
    sign_in_at_provider(page, site, "mallory")
    assert page.url == f"{site}/login/"
    assert page.locator("ul.messages").inner_text() == NO_ROLE.format(directory=DISPLAY_NAME)
    assert page.locator("[data-sign-in=oidc]").is_visible()
    out = Path(os.environ.get("SCREENSHOT_DIR") or tmp_path)
    out.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(out / "login-oidc-refused.png"))
    page.goto("/")
    assert page.url.startswith(f"{site}/login/")

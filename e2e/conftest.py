"""Browser tests: real Chromium (Debian's, at CHROMIUM_PATH) driven by Playwright against the
app served over real HTTP by pytest-django's live server, on the demo fleet with a back-filled
history.

Without Chromium these tests are skipped with the reason, so `make test` works on a machine
that has only Python; CI sets REQUIRE_BROWSER=1, which turns a missing browser into a failure.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime, timedelta
from pathlib import Path
from types import SimpleNamespace

import pytest

# Playwright's sync API runs an event loop in this thread; the ORM calls the tests make between
# browser steps are still plain synchronous code, which Django otherwise refuses next to a loop.
os.environ.setdefault("DJANGO_ALLOW_ASYNC_UNSAFE", "true")

CHROMIUM_PATH = os.environ.get("CHROMIUM_PATH", "/usr/bin/chromium")
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-dev-shm-usage"]
PASSWORD = "pass-word-123"
VIEWPORT = {"width": 1440, "height": 900}


@contextmanager
def chromium() -> Iterator:
    """Debian's Chromium under Playwright; skips the test (fails it with REQUIRE_BROWSER) where
    there is none. identity/tests/test_oidc_browser.py starts one too."""
    if not Path(CHROMIUM_PATH).exists():
        message = (f"Chromium not found at {CHROMIUM_PATH}: install it (apt-get install chromium) or set "
                   f"CHROMIUM_PATH")
        if os.environ.get("REQUIRE_BROWSER"):
            pytest.fail(message)
        pytest.skip(message)
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        launched = playwright.chromium.launch(executable_path=CHROMIUM_PATH, headless=True, args=CHROMIUM_ARGS)
        yield launched
        launched.close()


@pytest.fixture(scope="session")
def browser():
    with chromium() as launched:
        yield launched


def watch_errors(tab) -> list[str]:
    """The JavaScript errors of `tab` from now on, and its failed loads under a page: a failed page
    load is the test's to check (a 403 or 404 may be the point); a failed script, stylesheet,
    image or API call under a page is a bug."""
    errors: list[str] = []
    tab.on("pageerror", lambda exc: errors.append(f"uncaught: {exc}"))
    tab.on("console", lambda msg: errors.append(msg.text)
           if msg.type == "error" and not msg.text.startswith("Failed to load resource") else None)
    tab.on("response", lambda response: errors.append(f"HTTP {response.status} for {response.url}")
           if response.status >= 400 and response.request.resource_type != "document" else None)
    return errors


@pytest.fixture
def page(browser, live_server):
    """A fresh browser context (no cookies) on the live server; JavaScript errors fail the test."""
    context = browser.new_context(viewport=VIEWPORT, base_url=live_server.url)
    tab = context.new_page()
    errors = watch_errors(tab)
    yield tab
    context.close()
    assert not errors, f"errors in the browser: {errors}"


def sign_in(page, username: str, password: str = PASSWORD, next_path: str = "/") -> None:
    """Log in through the login form, as a person would."""
    page.goto(next_path)
    page.wait_for_url("**/login/**")
    page.fill("#id_username", username)
    page.fill("#id_password", password)
    page.click("button[type=submit]")
    page.wait_for_load_state("networkidle")


def build_demo_world(out_dir: Path, tiers: tuple[tuple[float, int], ...]) -> SimpleNamespace:
    """The demo fleet (4 hosts, each with a simulated agent), a back-filled history of `tiers` and
    a live state: every agent seen just now but one, which is stale. Built per test: browser
    tests commit (the live server is another thread), and the flush afterwards restores the
    catalog through serialized rollback."""
    from fleet import demo as fleet_demo
    from fleet.catalog import load_catalog
    from fleet.models import Artist, GpuModel, VgpuProfile
    from sizing.models import WorkflowPreset
    from sizing.presets import load_presets
    from telemetry import history
    from telemetry.demo import write_demo_agents
    from telemetry.models import Agent

    # A transactional test elsewhere in the run may have flushed the catalog that migration
    # fleet 0002 loaded; the demo needs it (loading it is idempotent).
    if not GpuModel.objects.exists():
        load_catalog(GpuModel, VgpuProfile)
    load_presets(WorkflowPreset)  # likewise the workflow presets of migration sizing 0002
    fleet_demo.seed_demo(hosts=3, admin_password=PASSWORD, artist_password=PASSWORD)
    write_demo_agents(out_dir=out_dir)
    agents = list(Agent.objects.select_related("host").order_by("name"))
    now = datetime.now(UTC)
    history.backfill_history(agents, tiers=tiers, now=now)
    Agent.objects.update(last_seen=now, last_attempt=now)
    stale = agents[-1]
    Agent.objects.filter(pk=stale.pk).update(last_seen=now - timedelta(hours=2), last_attempt=now)
    artist = Artist.objects.filter(vms__vgpus__isnull=False).select_related("user").order_by("name").first()
    other = Artist.objects.filter(vms__vgpus__isnull=False).exclude(pk=artist.pk).order_by("name").first()
    return SimpleNamespace(now=now, agents=agents, stale=stale, artist=artist, other=other)


@pytest.fixture
def demo_world(tmp_path):
    """Two days of history, the last 12 hours at 5-minute resolution."""
    return build_demo_world(tmp_path / "agents", tiers=((2.0, 1800), (0.5, 300)))


@pytest.fixture
def rich_demo_world(tmp_path):
    """What `make run` shows: 8 days of history (hour-of-week needs a week), the last day dense."""
    return build_demo_world(tmp_path / "agents", tiers=((8.0, 1800), (1.05, 300)))


def request_on_its_host(vm, user, reason: str):
    """A pending request of `vm` for another profile of its GPU model that fits on its own host
    now (an approval then stays on that host's hypervisor); None when no profile does."""
    from fleet import requests as resize_requests
    from fleet.models import VgpuProfile

    current = vm.vgpus.select_related("profile").first().profile
    for candidate in VgpuProfile.objects.filter(gpu_model=current.gpu_model).exclude(pk=current.pk).order_by("fb_mib"):
        try:
            request = resize_requests.file_request(vm, user, candidate, vm.vgpus.count(), reason)
        except resize_requests.RequestError:  # e.g. a profile a VM of several vGPUs may not take
            continue
        if resize_requests.fits(request).where in ("same_gpu", "other_gpu"):
            return request
        request.delete()
    return None

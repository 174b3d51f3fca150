"""Every page fits the window, from a phone (375 px) to a wide desk screen: no horizontal scroll
of the page and no element past its right edge (a wide table scrolls inside its own box). The
pages are found by URL name, so the check follows them wherever their views live; a route of the
dashboard that is neither listed here as a page nor as a non-page fails the first test, so a new
page cannot miss the check.

With SCREENSHOT_DIR set, each page is also photographed at each width, as
<SCREENSHOT_DIR>/<page>-<width>.png (the whole page, or what the window shows where the whole
page would make a large file), and the open menu as menu-<width>.png; `make screenshots`
writes them to docs/screenshots/.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import pytest
from django.urls import get_resolver, reverse

from e2e.conftest import request_on_its_host, sign_in

pytestmark = pytest.mark.django_db(transaction=True, serialized_rollback=True)

WIDTHS = {375: 812, 1280: 800, 1920: 1080}  # width: height (a phone, a laptop, a desk screen)
NAMESPACES = ("fleet", "telemetry", "sizing", "hypervisors", "notify", "alerts")


@dataclass(frozen=True)
class Page:
    name: str  # the screenshot's name
    url_name: str
    who: str | None  # "admin", "artist" or None (signed out)
    arg: str | None = None  # the key of the object id in `ids`
    query: str = ""
    status: int = 200


PAGES = [
    Page("login", "login", None),
    Page("overview", "fleet:overview", "admin"),
    Page("hosts", "fleet:host-list", "admin"),
    Page("host-detail", "fleet:host-detail", "admin", "host"),
    Page("gpus", "fleet:gpu-list", "admin"),
    Page("gpu-detail", "fleet:gpu-detail", "admin", "gpu"),
    Page("vms", "fleet:vm-list", "admin"),
    Page("vm-detail", "fleet:vm-detail", "admin", "vm"),
    # A refused custom range: the page says why, its range form open to be fixed.
    Page("vm-detail-range-refused", "fleet:vm-detail", "admin", "vm",
         query="?start=2026-01-02T00:00&end=2026-01-01T00:00", status=400),
    Page("artists", "fleet:artist-list", "admin"),
    Page("artist-detail", "fleet:artist-detail", "admin", "artist"),
    Page("scheduler", "fleet:scheduler", "admin"),
    Page("scheduler-gpu", "fleet:scheduler-gpu", "admin", "gpu"),
    Page("scheduler-host", "fleet:scheduler-host", "admin", "host"),
    Page("scheduler-model", "fleet:scheduler-model", "admin", "gpu_model"),
    Page("heatmap-gpu", "telemetry:heatmap", "admin", query="?view=gpu&range=24h&sort=host"),
    Page("heatmap-vm", "telemetry:heatmap", "admin", query="?view=vm&range=24h&sort=peak"),
    Page("heatmap-host-week", "telemetry:heatmap", "admin", query="?view=host&range=7d"),
    Page("agents", "telemetry:agent-list", "admin"),
    Page("suggestions", "sizing:suggestion-list", "admin"),
    Page("planner", "sizing:planner", "admin"),
    Page("feedback", "sizing:feedback", "admin"),
    Page("study", "sizing:study", "admin"),
    Page("optimizer", "sizing:optimizer", "admin"),
    Page("optimizer-run", "sizing:optimizer-run", "admin", "run"),
    Page("requests", "fleet:requests", "admin"),
    Page("request-review", "fleet:request-review", "admin", "request"),
    # On a host linked to its (simulated) hypervisor: approving creates an operation.
    Page("request-review-linked", "fleet:request-review", "admin", "request_linked"),
    Page("host-detail-linked", "fleet:host-detail", "admin", "host_linked"),
    Page("operations", "hypervisors:operation-list", "admin"),
    Page("operation-detail", "hypervisors:operation-detail", "admin", "operation"),
    Page("operation-rolled-back", "hypervisors:operation-detail", "admin", "operation_rolled_back"),
    Page("operation-pending", "hypervisors:operation-detail", "admin", "operation_pending"),
    Page("audit", "fleet:audit", "admin"),
    Page("drift", "hypervisors:drift", "admin"),
    Page("notifications", "fleet:notifications", "admin"),
    Page("channels", "notify:channel-list", "admin"),
    Page("channel-create", "notify:channel-create", "admin"),
    Page("channel-edit", "notify:channel-edit", "admin", "channel"),
    Page("deliveries", "notify:delivery-list", "admin"),
    Page("alerts", "alerts:alert-list", "admin", query="?state=open"),
    Page("alert-detail", "alerts:alert", "admin", "alert"),
    Page("alert-rules", "alerts:rule-list", "admin"),
    Page("silences", "alerts:silence-list", "admin"),
    Page("licences", "alerts:licences", "admin"),
    Page("versions", "alerts:versions", "admin"),
    Page("admin-workstation", "fleet:workstation", "admin"),
    Page("my-workstation", "fleet:workstation", "artist"),
    Page("my-vm", "fleet:vm-detail", "artist", "vm"),
    Page("my-artist-page", "fleet:artist-detail", "artist", "artist"),
    Page("my-notifications", "fleet:notifications", "artist"),
]

# Routes of the dashboard that are not pages of their own: form targets (POST only) and the
# fragments htmx swaps into a page listed above.
NOT_PAGES = {
    "fleet:overview-live": "fragment of the overview",
    "fleet:scheduler-gpu-box": "fragment of the GPU detail page",
    "fleet:request-room": "fragment of the request queue",
    "fleet:request-decide": "POST",
    "fleet:request-file": "POST",
    "fleet:feedback-file": "POST",
    "fleet:feedback-not-now": "POST",
    "fleet:scheduler-gpu-apply": "POST",
    "fleet:scheduler-gpu-clear": "POST",
    "fleet:host-hypervisor-check": "POST",
    "fleet:host-hypervisor-sync": "POST",
    "hypervisors:operation-run": "POST",
    "hypervisors:operation-cancel": "POST",
    "sizing:optimizer-run-operations": "POST",
    "sizing:suggestion-refresh": "POST",
    "sizing:suggestion-accept": "POST",
    "sizing:suggestion-dismiss": "POST",
    "sizing:suggestion-restore": "POST",
    "sizing:optimizer-apply": "POST",
    "notify:channel-test": "POST",
    "notify:channel-delete": "POST",
    "alerts:alert-acknowledge": "POST",
    "alerts:alert-silence": "POST",
    "alerts:alert-drain": "POST",
    "alerts:silence-end": "POST",
    "sizing:study-csv": "CSV download of the study page",
}

# Every element whose box ends past the window's right edge, unless a box around it scrolls or
# clips sideways (a wide table in its .table-wrap); only the outermost of nested offenders, each
# named by a CSS-like path and the start of its text.
OVERFLOW = """() => {
  const width = window.innerWidth;
  const name = (el) => {
    let s = el.tagName.toLowerCase();
    if (el.id) s += "#" + el.id;
    const cls = typeof el.className === "string" ? el.className.trim() : "";
    if (cls) s += "." + cls.split(/\\s+/).join(".");
    return s;
  };
  const path = (el) => {
    const parts = [];
    for (let e = el; e && e !== document.body; e = e.parentElement) parts.unshift(name(e));
    return parts.slice(-4).join(" > ");
  };
  const inScroller = (el) => {
    for (let e = el.parentElement; e && e !== document.body; e = e.parentElement) {
      if (["auto", "scroll", "hidden", "clip"].includes(getComputedStyle(e).overflowX)) return true;
    }
    return false;
  };
  const offenders = [];
  for (const el of document.body.querySelectorAll("*")) {
    if (!el.checkVisibility({checkOpacity: true, checkVisibilityCSS: true})) continue;
    const rect = el.getBoundingClientRect();
    if (rect.width === 0 || rect.height === 0 || rect.right <= width + 0.5) continue;
    if (inScroller(el) || offenders.some((o) => o.el.contains(el))) continue;
    offenders.push({el, text: `${path(el)} (right edge ${Math.round(rect.right)} px) ` +
                              JSON.stringify((el.textContent || "").trim().replace(/\\s+/g, " ").slice(0, 60))});
  }
  return {
    scrollWidth: document.documentElement.scrollWidth, innerWidth: width,
    offenders: offenders.slice(0, 8).map((o) => o.text),
  };
}"""


def overflow(page) -> list[str]:
    """What sticks out of the window on the page open in `page` (empty when it all fits)."""
    found = page.evaluate(OVERFLOW)
    problems = []
    if found["scrollWidth"] > found["innerWidth"]:
        problems.append(f"the page scrolls sideways ({found['scrollWidth']} px wide in a "
                        f"{found['innerWidth']} px window)")
    return problems + found["offenders"]


def dashboard_routes() -> set[str]:
    """Every named route of the dashboard's namespaces, as "namespace:name"."""
    resolver = get_resolver()
    routes = set()
    for namespace in NAMESPACES:
        _prefix, sub = resolver.namespace_dict[namespace]
        routes |= {f"{namespace}:{pattern.name}" for pattern in sub.url_patterns if pattern.name}
    return routes


def test_every_route_of_the_dashboard_is_a_checked_page_or_not_a_page():
    pages = {page.url_name for page in PAGES if ":" in page.url_name}
    assert dashboard_routes() == pages | set(NOT_PAGES), \
        "a page of the dashboard is missing from e2e/test_layout.py PAGES (or a gone one is still listed)"
    assert not pages & set(NOT_PAGES)


def demo_ids(world) -> dict[str, int]:
    """Real objects to open the detail pages on: the artist's VM, its host and GPU, and an
    optimizer run carried out here; and a request of the artist's rejected (so both notification
    pages have a row and the decided list one) and another pending (operations: `operation_ids`)."""
    from django.contrib.auth.models import User

    from fleet import requests as resize_requests
    from fleet.models import VgpuProfile
    from sizing import optimizer_runs
    from sizing.suggestions import refresh_suggestions

    refresh_suggestions()  # what the hourly beat task does
    vm = world.artist.vms.filter(vgpus__isnull=False).order_by("name").first()
    vgpu = vm.vgpus.select_related("gpu", "profile").first()
    others = VgpuProfile.objects.filter(gpu_model=vgpu.profile.gpu_model).exclude(pk=vgpu.profile.pk)
    admin, user = User.objects.get(username="admin"), world.artist.user
    rejected = resize_requests.file_request(vm, user, others.order_by("fb_mib").first(), 1, "lookdev review")
    resize_requests.reject(rejected, admin, "No room this week; ask again after the review.")
    pending = resize_requests.file_request(vm, user, others.order_by("-fb_mib").first(), 1, "heavier scenes this month")
    run = optimizer_runs.start_run(None, include_suggestions=True)
    optimizer_runs.execute_run(run.pk)
    past_feedback()
    return {"host": vgpu.gpu.host_id, "gpu": vgpu.gpu_id, "gpu_model": vgpu.gpu.gpu_model_id, "vm": vm.pk,
            "artist": world.artist.pk, "run": run.pk, "request": pending.pk, "channel": channels_with_deliveries()}


def past_feedback() -> None:
    """Ten past working days rated on the demo's VMs (today is left for the prompt of /me/), so the
    feedback trends and the artist's Feedback section have rows."""
    from datetime import timedelta

    from django.utils import timezone

    from fleet.models import VirtualMachine
    from sizing.models import Feedback

    today = timezone.localdate()
    tags = (["out_of_gpu_memory", "slow_scene_open"], ["viewport_stutter"], ["display_lag"], [], ["fine"])
    vms = VirtualMachine.objects.filter(artist__isnull=False).select_related("artist").order_by("name")[:8]
    for index, vm in enumerate(vms):
        for day in range(1, 11):
            rating = 1 + (index + day) % 5
            Feedback.objects.create(artist=vm.artist, vm=vm, host_id=vm.host_id, rating=rating,
                                    tags=tags[rating - 1], session_date=today - timedelta(days=day),
                                    note="Heavy crowd scene" if rating < 3 else "")


def channels_with_deliveries() -> int:
    """An in-app channel that got a test message and a webhook nobody answers (its delivery
    retrying with the error shown); the webhook's id, whose page lists that delivery."""
    from notify import services
    from notify.models import NotificationChannel

    in_app, _ = services.save_channel(NotificationChannel(), name="Admins in the app", kind="in_app")
    services.send_test(in_app)
    hook, _ = services.save_channel(NotificationChannel(), name="Incident webhook (SIEM)", kind="webhook",
                                    target="http://127.0.0.1:9/fleet-alerts", rules=["xid", "ecc"],
                                    min_severity="warning")
    services.send_test(hook)
    return hook.pk


def alert_ids(world, vm_id: int) -> dict[str, int]:
    """Health as the demo's agents report it after a while, evaluated: an XID on the GPU of the
    artist's VM, that VM's licence lapsed, two driver versions among the hosts, a vWS pool with a
    day of use, and a silence; the XID alert's id."""
    from datetime import timedelta

    from django.contrib.auth.models import User
    from django.utils import timezone

    from alerts import services
    from alerts.evaluate import evaluate
    from alerts.models import Alert, LicencePool, LicenceUsage
    from fleet.models import Host, VirtualMachine
    from telemetry.models import HostDriverState, VgpuHealthState, XidError

    now = timezone.now()
    vm = VirtualMachine.objects.get(pk=vm_id)
    vgpu = vm.vgpus.select_related("gpu").first()
    XidError.objects.create(gpu=vgpu.gpu, code=79, at=now - timedelta(minutes=2))
    VgpuHealthState.objects.update_or_create(vm=vm, gpu=vgpu.gpu, defaults={
        "vgpu": vgpu, "type_name": vgpu.profile.name, "license_state": "unlicensed",
        "guest_driver_version": "580.95.05", "changed_at": now})
    for index, host in enumerate(Host.objects.order_by("name")):
        old = index == 1
        HostDriverState.objects.update_or_create(host=host, defaults={
            "driver_version": "570.172.07" if old else "580.95.02", "vgpu_manager_version": "18.4" if old else "19.2",
            "changed_at": now})
    LicencePool.objects.update_or_create(edition="vws", defaults={"owned": 24,
                                                                  "note": "Three-year term, renews 2027-06"})
    LicenceUsage.objects.bulk_create([
        LicenceUsage(ts=(now - timedelta(hours=h)).replace(second=0, microsecond=0), edition="vws",
                     in_use=14 + (h % 9), unlicensed=1 if h < 2 else 0) for h in range(1, 48)])
    evaluate(now)
    services.create_silence(User.objects.get(username="admin"), reason="Board swap booked for Friday",
                            host=vgpu.gpu.host, ends_at=now + timedelta(days=2), rule=None)
    return {"alert": Alert.objects.get(rule__kind="xid").pk}


def operation_ids(world, unlinked_host_id: int) -> dict[str, int]:
    """The demo's hosts on their simulated hypervisors (seeded as `make run` seeds them), but
    `unlinked_host_id`, unlinked so the pages of an unlinked host are checked too. On them: an
    operation carried out (succeeded), one rolled back (a guest that ignores the shutdown), one
    pending (approved without "run now"), a pending request to review, and a host whose
    hypervisor has a domain the inventory lacks. The caller points HYPERVISOR_SIM_DIR at a
    folder of the test's and keeps `operations.enqueue` from a broker."""
    from django.conf import settings
    from django.contrib.auth.models import User

    from fleet import requests as resize_requests
    from fleet import services as fleet_services
    from fleet.models import Host, VirtualMachine
    from hypervisors import operations, services, sim_seed
    from hypervisors.backends.sim import SimBackend
    from hypervisors.models import Operation, SyncTrigger

    fleet_services.update_host(Host.objects.get(pk=unlinked_host_id), hypervisor_uri="")
    sim_seed.link_demo_hosts(list(Host.objects.exclude(pk=unlinked_host_id).order_by("name")))
    admin = User.objects.get(username="admin")
    vms = VirtualMachine.objects.filter(vgpus__isnull=False, host__hypervisor_uri__startswith="sim://").exclude(
        artist=world.artist).distinct().order_by("name")
    requests = []
    for vm in vms:
        request = request_on_its_host(vm, vm.artist.user, "lighter scenes this month")
        if request is not None:
            requests.append(request)
        if len(requests) == 3:
            break
    assert len(requests) == 3, "too few VMs on linked hosts with room for another profile"
    done, failed, waiting = requests

    resize_requests.approve(done, admin, "go", run_now=True)
    succeeded = operations.run(Operation.objects.get(request=done).pk)
    assert succeeded.status == "succeeded", succeeded.error

    backend = SimBackend.open(failed.vm.host.hypervisor_uri)
    backend.set_ignore_acpi(str(failed.vm.uuid))
    resize_requests.approve(failed, admin, "go", run_now=True)
    timeout_s, settings.HYPERVISOR_SHUTDOWN_TIMEOUT_S = settings.HYPERVISOR_SHUTDOWN_TIMEOUT_S, 0.5
    rolled_back = operations.run(Operation.objects.get(request=failed).pk)
    settings.HYPERVISOR_SHUTDOWN_TIMEOUT_S = timeout_s
    assert rolled_back.status == "rolled_back", rolled_back.status

    resize_requests.approve(waiting, admin, "in the artist's window")
    pending = Operation.objects.get(request=waiting)

    review = request_on_its_host(done.vm, done.vm.artist.user, "after all, back to more frame buffer")
    host = done.vm.host
    SimBackend.open(host.hypervisor_uri).define_domain("ws-lookdev-spare-defined-on-the-host", vcpus=8,
                                                      ram_mib=32 * 1024)
    services.check_host(host)
    services.sync_host(host, user=admin, trigger=SyncTrigger.PAGE)
    return {"operation": succeeded.pk, "operation_rolled_back": rolled_back.pk, "operation_pending": pending.pk,
            "request_linked": review.pk, "host_linked": host.pk}


def screenshot(page, path: Path) -> None:
    """The whole page where that stays small (under 300 kB), else what the window shows."""
    page.screenshot(path=str(path), full_page=True)
    if path.stat().st_size > 300_000:
        page.screenshot(path=str(path))


def test_every_page_fits_the_window_at_375_1280_and_1920_px(page, rich_demo_world, tmp_path, monkeypatch, settings):
    """Each page, as the role that uses it, at each width: it loads, draws its charts and nothing
    sticks out past the window's right edge. The failures of every page and width are listed
    together, each naming the page, the width and the elements."""
    from hypervisors import operations
    from sizing import optimizer_runs

    out = Path(os.environ.get("SCREENSHOT_DIR") or tmp_path)
    out.mkdir(parents=True, exist_ok=True)
    monkeypatch.setattr(optimizer_runs, "enqueue", lambda run_id: None)  # the run is carried out here
    monkeypatch.setattr(operations, "enqueue", lambda operation_id: None)  # likewise the operations
    settings.HYPERVISOR_SIM_DIR = tmp_path / "sim"
    settings.HYPERVISOR_VERIFY_WAIT_S = 0
    ids = demo_ids(rich_demo_world)
    ids |= operation_ids(rich_demo_world, unlinked_host_id=ids["host"])
    ids |= alert_ids(rich_demo_world, ids["vm"])
    usernames = {"admin": "admin", "artist": rich_demo_world.artist.user.username}
    failures: list[str] = []
    signed_in = None
    for spec in PAGES:
        if spec.who != signed_in:
            page.context.clear_cookies()
            if spec.who is not None:
                page.set_viewport_size({"width": 1280, "height": 800})
                sign_in(page, usernames[spec.who])
            signed_in = spec.who
        url = reverse(spec.url_name, kwargs={"pk": ids[spec.arg]} if spec.arg else None) + spec.query
        for width, height in WIDTHS.items():
            page.set_viewport_size({"width": width, "height": height})
            response = page.goto(url)
            assert response.status == spec.status, f"{spec.name} ({url}) as {spec.who}: HTTP {response.status}"
            page.wait_for_load_state("networkidle")
            for chart in page.locator("[data-state]").all():
                state = chart.get_attribute("data-state")
                assert state in ("ready", "empty"), f"{spec.name} at {width} px: a chart is {state!r}"
            problems = overflow(page)
            if problems:
                failures.append(f"{spec.name} ({url}) at {width} px:\n    " + "\n    ".join(problems))
            screenshot(page, out / f"{spec.name}-{width}.png")
    assert not failures, "elements past the window's right edge:\n" + "\n".join(failures)


def menu_fits(page, width: int, what: str) -> None:
    problems = overflow(page)
    assert not problems, f"{what} at {width} px: " + "; ".join(problems)


def test_the_menu_opens_by_keyboard_and_mouse_and_fits_at_each_width(page, tmp_path):
    """An admin's five menus: each opens (Enter on its heading, or a click), fits the window at
    each width, closes with Escape and when another opens; the page shown is marked in its
    menu. On a phone the menus sit behind a "Menu" button, the section shown unfolded."""
    from django.contrib.auth.models import User

    from e2e.conftest import PASSWORD

    out = Path(os.environ.get("SCREENSHOT_DIR") or tmp_path)
    out.mkdir(parents=True, exist_ok=True)
    User.objects.create_superuser("admin", "admin@studio.example", PASSWORD)
    sign_in(page, "admin", next_path="/sizing/planner/")
    groups = ["Fleet", "Telemetry", "Sizing", "Requests", "Admin"]
    summary = {name: page.locator("details.navgroup > summary", has_text=name) for name in groups}

    page.set_viewport_size({"width": 1280, "height": 800})
    assert page.locator(".menu-toggle").is_hidden()
    assert page.locator("details.navgroup.current > summary").inner_text().startswith("Sizing")
    for name in groups:
        summary[name].focus()
        page.keyboard.press("Enter")
        menu = page.locator("details.navgroup[open] .navmenu")
        assert menu.count() == 1, name
        assert menu.is_visible(), name
        menu_fits(page, 1280, f"the {name} menu")
        page.keyboard.press("Escape")
        assert page.locator("details.navgroup[open]").count() == 0, name
        assert page.evaluate("() => document.activeElement.textContent").startswith(name)
    summary["Sizing"].click()
    assert page.locator("details.navgroup[open] a[aria-current=page]").inner_text() == "Density planner"
    page.screenshot(path=str(out / "menu-1280.png"), clip={"x": 0, "y": 0, "width": 1280, "height": 260})
    summary["Fleet"].click()
    assert page.locator("details.navgroup[open] > summary").inner_text() == "Fleet"
    page.locator("details.navgroup[open] a", has_text="GPUs").click()
    page.wait_for_url("**/gpus/")
    assert page.locator("details.navgroup.current > summary").inner_text().startswith("Fleet")
    assert page.locator("a[aria-current=page]").text_content() == "GPUs"  # in the closed Fleet menu

    for width in (1920, 2560):
        page.set_viewport_size({"width": width, "height": 1000})
        for name in groups:
            summary[name].click()
            menu_fits(page, width, f"the {name} menu")
        page.keyboard.press("Escape")

    page.set_viewport_size({"width": 375, "height": 812})
    toggle = page.locator(".menu-toggle")
    assert toggle.is_visible()
    assert page.locator("#topmenu").is_hidden()
    toggle.click()
    assert toggle.get_attribute("aria-expanded") == "true"
    assert page.locator("details.navgroup[open] > summary").inner_text().startswith("Fleet")  # the section shown
    menu_fits(page, 375, "the unfolded menu")
    page.screenshot(path=str(out / "menu-375.png"))
    for name in groups:
        summary[name].click()
        menu_fits(page, 375, f"the unfolded menu with {name} open")
    page.keyboard.press("Escape")
    assert page.locator("#topmenu").is_hidden()
    assert toggle.get_attribute("aria-expanded") == "false"

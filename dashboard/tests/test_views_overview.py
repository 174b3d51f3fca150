"""The fleet overview (`/`) and its live partial: what an admin reads there is what the database says.

Figures are read back from the page's stable hooks (data-figure / data-value, data-table rows)
and compared with the ORM; capacity answers are checked by actually placing vGPUs through
`fleet.services` until the rules refuse.
"""

from __future__ import annotations

import re
from datetime import timedelta
from types import SimpleNamespace

import pytest
from django.db.models import Sum
from django.test.html import Element, parse_html
from django.test.utils import CaptureQueriesContext
from django.urls import reverse
from django.utils import timezone

from fleet import services
from fleet.models import Artist, Gpu, Host, Vgpu, VirtualMachine
from fleet.placement import PlacementError
from fleet.tests.factories import GpuFactory, HostFactory, VirtualMachineFactory, gpu_model, profile
from telemetry.models import Agent, GpuSample, VmRollup

OVERVIEW = reverse("fleet:overview")
LIVE = reverse("fleet:overview-live")
A40, L40S = "NVIDIA A40", "NVIDIA L40S"


# Reading the page ---------------------------------------------------------------------------


def _walk(node):
    if isinstance(node, Element):
        yield node
        for child in node.children:
            yield from _walk(child)


def find(html: str, **attrs) -> list[Element]:
    """Elements whose attributes include `attrs` (data_figure="gpus" matches data-figure="gpus",
    class_="value" an element with the class "value"; a value of True matches any value)."""
    wanted = {name.rstrip("_").replace("_", "-"): value for name, value in attrs.items()}

    def matches(have: dict, name: str, value) -> bool:
        if name not in have:
            return False
        if value is True:
            return True
        return value in have[name].split() if name == "class" else have[name] == value

    return [
        element for element in _walk(parse_html(html))
        if all(matches(dict(element.attributes), name, value) for name, value in wanted.items())
    ]


def one(html: str, **attrs) -> Element:
    found = find(html, **attrs)
    assert len(found) == 1, (attrs, found)
    return found[0]


def attr(element: Element, name: str) -> str:
    return dict(element.attributes)[name]


def text(element) -> str:
    if isinstance(element, str):
        return element
    return re.sub(r"\s+", " ", " ".join(text(child) for child in element.children)).strip()


def figure(html: str, name: str) -> int:
    value = one(str(one(html, data_figure=name)), class_="value")
    return int(attr(value, "data-value"))


def rows(html: str, table: str) -> list[Element]:
    return [element for element in _walk(one(html, data_table=table)) if element.name == "tr" and element.attributes]


def cell(row: Element, col: str) -> str:
    return text(one(str(row), data_col=col))


# The fleet ---------------------------------------------------------------------------------


@pytest.fixture
def fleet(db):
    """host-a: an A40 (equal-size) with two A40-12Q and an L40S (mixed-size) with one L40S-24Q;
    host-b: an A40 in passthrough. VMs ws-1..ws-3 hold those vGPUs, ws-spare holds none."""
    host_a, host_b = HostFactory(name="host-a"), HostFactory(name="host-b")
    a40 = GpuFactory(host=host_a, gpu_model=gpu_model(A40), pci_bus_id="00000000:3B:00.0")
    l40s = GpuFactory(host=host_a, gpu_model=gpu_model(L40S), pci_bus_id="00000000:5E:00.0", size_mode="mixed")
    passthrough = GpuFactory(host=host_b, gpu_model=gpu_model(A40), pci_bus_id="00000000:3B:00.0",
                             mode="passthrough")
    vms = [VirtualMachineFactory(name=f"ws-{i}") for i in (1, 2, 3)]
    services.place_vgpu(vms[0], a40, profile("A40-12Q"))
    services.place_vgpu(vms[1], a40, profile("A40-12Q"))
    services.place_vgpu(vms[2], l40s, profile("L40S-24Q"))
    spare = VirtualMachineFactory(name="ws-spare")
    return SimpleNamespace(host_a=host_a, host_b=host_b, a40=a40, l40s=l40s, passthrough=passthrough,
                           vms=vms, spare=spare)


def page(client, url=OVERVIEW) -> str:
    response = client.get(url)
    assert response.status_code == 200
    return response.content.decode()


# Who gets what ----------------------------------------------------------------------------


def test_anonymous_visitors_are_sent_to_login(client, db):
    for url in (OVERVIEW, LIVE):
        response = client.get(url)
        assert response.status_code == 302
        assert response["Location"].startswith(reverse("login"))


def test_a_poll_after_the_session_ended_reloads_the_page(client, artist):
    """htmx polls from a page whose session has gone: reload the page (which then redirects)
    instead of swapping a login form or a 403 page into the overview."""
    response = client.get(LIVE, headers={"HX-Request": "true"})
    assert response.status_code == 200
    assert response["HX-Refresh"] == "true"
    assert response.content == b""
    client.force_login(artist.user)
    assert client.get(LIVE, headers={"HX-Request": "true"})["HX-Refresh"] == "true"


def test_an_artist_is_sent_to_their_workstation(client, artist):
    client.force_login(artist.user)
    response = client.get(OVERVIEW)
    assert response.status_code == 302
    assert response["Location"] == reverse("fleet:workstation")
    assert client.get(LIVE).status_code == 403


# Figures and tables -------------------------------------------------------------------------


def test_headline_figures_are_the_databases(staff, fleet):
    html = page(staff)
    vgpu_mode = Gpu.objects.filter(mode="vgpu")
    allocated_mib = Vgpu.objects.aggregate(total=Sum("profile__fb_mib"))["total"]
    physical_mib = vgpu_mode.aggregate(total=Sum("gpu_model__fb_mib"))["total"]

    assert figure(html, "hosts") == Host.objects.count() == 2
    assert figure(html, "gpus") == Gpu.objects.count() == 3
    gpus = str(one(html, data_figure="gpus"))
    assert attr(one(gpus, data_value_vgpu_mode=True), "data-value-vgpu-mode") == str(vgpu_mode.count()) == "2"
    assert attr(one(gpus, data_value_passthrough=True), "data-value-passthrough") == "1"
    assert figure(html, "vms") == VirtualMachine.objects.count() == 4
    assert figure(html, "artists") == Artist.objects.count()
    assert figure(html, "vgpus") == Vgpu.objects.count() == 3
    assert figure(html, "frame-buffer") == allocated_mib == 2 * 12 * 1024 + 24 * 1024
    fb = one(html, data_figure="frame-buffer")
    assert attr(one(str(fb), class_="value"), "data-physical-mib") == str(physical_mib) == str(96 * 1024)
    assert "48.0 GiB of 96.0 GiB" in text(fb)
    assert "50%" in text(fb)
    assert one(str(fb), style="width: 50.0%")


def test_slots_in_use_by_profile(staff, fleet):
    html = page(staff)
    table = {attr(row, "data-profile"): row for row in rows(html, "slots")}
    assert list(table) == ["A40-12Q", "L40S-24Q"]
    a40 = table["A40-12Q"]
    assert [cell(a40, col) for col in ("vgpus", "gpus", "fb", "free")] == ["2", "1", "24.0 GiB", "2"]
    assert A40 in text(a40)
    l40s = table["L40S-24Q"]
    assert [cell(l40s, col) for col in ("vgpus", "gpus", "fb", "free")] == ["1", "1", "24.0 GiB", "1"]


def test_where_a_new_vgpu_could_go(staff, fleet):
    html = page(staff)
    room = {attr(row, "data-profile"): row for row in rows(html, "capacity")}
    # In use, plus each model's full-GPU and quarter-GPU Q profile; largest first per model.
    assert list(room) == ["A40-48Q", "A40-12Q", "L40S-48Q", "L40S-24Q", "L40S-12Q"]
    assert {name: cell(row, "room") for name, row in room.items()} == {
        "A40-48Q": "0", "A40-12Q": "2", "L40S-48Q": "0", "L40S-24Q": "1", "L40S-12Q": "2",
    }
    a40_12q = room["A40-12Q"]
    candidate = one(str(a40_12q), data_gpu=str(fleet.a40.pk))
    assert attr(candidate, "data-count") == "2"
    assert "host-a · 00000000:3B:00.0" in text(candidate)
    assert "24.0 GiB free" in text(candidate)
    assert one(str(a40_12q), href=reverse("fleet:gpu-detail", args=[fleet.a40.pk]))
    assert "in use, 1/4 GPU" in text(a40_12q)
    assert "No room: passthrough mode (1 GPU)." in text(a40_12q)
    assert "No room: not enough free frame buffer (1 GPU); passthrough mode (1 GPU)." in text(room["A40-48Q"])
    assert "None" in text(room["A40-48Q"])


def test_the_capacity_shown_is_what_placement_then_accepts(staff, fleet):
    """The page says two more A40-12Q fit: the third, placed through the services, is refused."""
    html = page(staff)
    shown = int(cell(next(r for r in rows(html, "capacity") if ("data-profile", "A40-12Q") in r.attributes), "room"))
    placed = 0
    for i in range(shown + 1):
        try:
            services.place_vgpu(VirtualMachineFactory(name=f"ws-more-{i}"), fleet.a40, profile("A40-12Q"))
            placed += 1
        except PlacementError:
            break
    assert placed == shown == 2
    with pytest.raises(PlacementError):
        services.place_vgpu(VirtualMachineFactory(name="ws-pt"), fleet.passthrough, profile("A40-12Q"))
    html = page(staff)
    row = next(r for r in rows(html, "capacity") if ("data-profile", "A40-12Q") in r.attributes)
    assert cell(row, "room") == "0"


# Agent health --------------------------------------------------------------------------------


def _agents(host, now):
    Agent.objects.create(name="agent-ok", url="http://host-a:9410", host=host, last_seen=now)
    Agent.objects.create(name="agent-stale", url="http://host-b:9410", host=host, last_seen=now - timedelta(hours=2))
    Agent.objects.create(name="agent-error", url="http://host-c:9410", last_seen=now - timedelta(minutes=10),
                         last_error="connection refused", last_error_at=now)
    Agent.objects.create(name="agent-new", url="http://host-d:9410")
    Agent.objects.create(name="agent-off", url="http://host-e:9410", enabled=False)


def test_agent_health_counts_and_the_agents_needing_attention(staff, fleet):
    _agents(fleet.host_a, timezone.now())
    html = page(staff)
    counts = {attr(li, "data-agents"): attr(li, "data-count") for li in find(html, data_agents=True)}
    assert counts == {"ok": "1", "stale": "1", "error": "1", "new": "1", "disabled": "1"}
    badges = text(one(html, data_section="agents"))
    for word in ("OK", "Stale", "Error", "Never seen", "Disabled"):
        assert word in badges
    attention = rows(html, "agents-attention")
    assert [text(row).split()[0] for row in attention] == ["agent-error", "agent-stale"]
    assert "connection refused" in text(attention[0])
    assert "host-a" in text(attention[1])
    assert one(str(one(html, data_section="agents")), href=reverse("telemetry:agent-list"))


def test_no_agents_yet_says_how_to_get_one(staff, fleet):
    html = page(staff)
    agents = text(one(html, data_section="agents"))
    assert "No agents yet" in agents
    assert "manage.py demo_agents" in agents
    assert one(html, href=reverse("admin:telemetry_agent_add"))
    assert "No telemetry yet" in text(one(html, data_section="hottest"))


# Hottest GPUs and idle allocations ---------------------------------------------------------


def test_hottest_gpus_by_latest_utilization_without_stale_readings(staff, fleet):
    now = timezone.now()
    Agent.objects.create(name="agent-ok", url="http://host-a:9410", host=fleet.host_a, last_seen=now)
    GpuSample.objects.bulk_create([
        GpuSample(gpu=fleet.a40, ts=now - timedelta(minutes=3), util_gpu=99, temp_c=80, power_w=290),
        GpuSample(gpu=fleet.a40, ts=now - timedelta(seconds=20), util_gpu=40, temp_c=61, power_w=180),
        GpuSample(gpu=fleet.l40s, ts=now - timedelta(seconds=30), util_gpu=85.4, temp_c=72, power_w=250),
        # Busiest of all, but ten minutes old: its agent went quiet, so it is not "now".
        GpuSample(gpu=fleet.passthrough, ts=now - timedelta(minutes=10), util_gpu=100, temp_c=90, power_w=300),
    ])
    html = page(staff)
    hot = rows(html, "hottest")
    assert [attr(row, "data-gpu") for row in hot] == [str(fleet.l40s.pk), str(fleet.a40.pk)]
    assert [cell(row, "util") for row in hot] == ["85 %", "40 %"]
    assert (cell(hot[0], "temp"), cell(hot[0], "power")) == ("72 °C", "250 W")
    assert "host-a · 00000000:5E:00.0" in text(hot[0])
    assert L40S in text(hot[0])
    assert one(str(hot[0]), href=reverse("fleet:gpu-detail", args=[fleet.l40s.pk]))
    note = text(one(html, data_section="hottest"))
    assert "older than 5 minutes are left out" in note
    assert attr(one(html, data_value_no_recent=True), "data-value-no-recent") == "1"


def test_no_recent_readings_while_agents_exist(staff, fleet):
    _agents(fleet.host_a, timezone.now())
    GpuSample.objects.create(gpu=fleet.a40, ts=timezone.now() - timedelta(hours=1), util_gpu=50)
    assert "No recent GPU readings" in text(one(page(staff), data_section="hottest"))


def _hour(hours_ago: int):
    return timezone.now().replace(minute=0, second=0, microsecond=0) - timedelta(hours=hours_ago)


def _rollup(vm, hours_ago, fb_p95_mib, profile_fb_mib, util_avg):
    return VmRollup.objects.create(
        vm=vm, step_s=3600, bucket=_hour(hours_ago), samples=360, fb_used_mib_p95=fb_p95_mib,
        profile_fb_mib=profile_fb_mib, util_gpu_avg=util_avg,
    )


def test_most_idle_allocations_from_hourly_rollups(staff, fleet):
    ws1, ws2, ws3 = fleet.vms
    _rollup(ws1, 1, 6144, 12288, 30)    # 50 % at its busiest hour
    _rollup(ws1, 2, 3072, 12288, 10)
    _rollup(ws1, 30, 0, 12288, 0)       # older than 24 h: not counted
    _rollup(ws2, 1, 1024, 12288, 4)     # 8.3 %
    _rollup(fleet.spare, 1, 0, 12288, 0)  # holds no vGPU now: no allocation to judge
    html = page(staff)
    idle = rows(html, "idle")
    assert [attr(row, "data-vm") for row in idle] == [str(ws2.pk), str(ws1.pk)]
    assert [cell(row, "fb") for row in idle] == ["8 %", "50 %"]
    assert [cell(row, "util") for row in idle] == ["4 %", "20 %"]
    assert "A40-12Q" in text(idle[0])
    assert one(str(idle[0]), href=reverse("fleet:vm-detail", args=[ws2.pk]))
    # ws-3 holds a vGPU but has no rollup: "no data", not idle.
    assert attr(one(html, data_idle_no_data=True), "data-idle-no-data") == "1"
    assert ws3.name not in text(one(html, data_table="idle"))


def test_idle_allocations_equal_frame_buffer_share_goes_by_utilization(staff, fleet):
    ws1, ws2, ws3 = fleet.vms
    _rollup(ws1, 1, 1024, 12288, 9)
    _rollup(ws2, 1, 1024, 12288, 3)
    _rollup(ws3, 1, 2048, 24576, None)
    idle = rows(page(staff), "idle")
    assert [attr(row, "data-vm") for row in idle] == [str(ws2.pk), str(ws1.pk), str(ws3.pk)]
    assert cell(idle[2], "util") == "—"


def test_no_usage_data_yet(staff, fleet):
    html = page(staff)
    assert "No usage data in the last 24 h" in text(one(html, data_section="idle"))
    assert attr(one(html, data_idle_no_data=True), "data-idle-no-data") == "3"


# Empty fleet --------------------------------------------------------------------------------


def test_empty_fleet_says_how_to_add_hosts(staff):
    html = page(staff)
    assert figure(html, "hosts") == figure(html, "gpus") == figure(html, "vgpus") == 0
    inventory = text(one(html, data_section="inventory"))
    assert "No hosts or GPUs yet" in inventory
    assert "manage.py seed_demo" in inventory
    assert one(html, href=reverse("admin:fleet_host_add"))
    assert "No GPU in vGPU mode" in text(one(html, data_figure="frame-buffer"))
    assert "No allocations yet" in text(one(html, data_section="idle"))


def test_hosts_without_gpus_say_how_to_add_gpus(staff):
    HostFactory(name="host-a")
    html = page(staff)
    assert "No GPUs yet" in text(one(html, data_section="inventory"))
    assert one(html, href=reverse("admin:fleet_gpu_add"))


# Live refresh --------------------------------------------------------------------------------


def test_the_page_embeds_the_live_partial_that_htmx_refreshes(staff, fleet, settings):
    settings.DASHBOARD_REFRESH_S = 7
    html = page(staff)
    live = one(html, id="overview-live")
    assert attr(live, "hx-get") == LIVE
    assert attr(live, "hx-trigger") == "every 7s"
    assert attr(live, "hx-swap") == "outerHTML"
    assert "Updated" in text(one(str(live), class_="updated"))
    assert one(html, data_figure="gpus")


def test_the_live_partial_is_only_the_partial(staff, fleet):
    html = page(staff, LIVE)
    assert html.lstrip().startswith(("{#", "<div")), html[:80]
    assert "<html" not in html
    assert "<nav" not in html
    live = one(html, id="overview-live")
    assert attr(live, "hx-get") == LIVE
    assert figure(html, "gpus") == 3
    assert [attr(r, "data-profile") for r in rows(html, "slots")] == ["A40-12Q", "L40S-24Q"]


# Query counts ------------------------------------------------------------------------------


def _fleet_of(gpu_count: int, prefix: str):
    """`gpu_count` GPUs on hosts of four, A40s (equal-size) and L40S (mixed-size) in turn, each with
    a VM holding a 12Q, an agent per host (the first stale), a fresh sample per GPU and two hourly
    rollups per VM."""
    now = timezone.now()
    hosts = [HostFactory(name=f"{prefix}-host-{i:02d}") for i in range((gpu_count + 3) // 4)]
    for i, host in enumerate(hosts):
        Agent.objects.create(name=f"{prefix}-agent-{i}", url=f"http://{prefix}-host-{i}:9410", host=host,
                             last_seen=now - timedelta(hours=1 if i == 0 else 0))
    for i in range(gpu_count):
        model, size_mode, name = (A40, "equal", "A40-12Q") if i % 2 == 0 else (L40S, "mixed", "L40S-12Q")
        gpu = GpuFactory(host=hosts[i // 4], gpu_model=gpu_model(model), size_mode=size_mode,
                         pci_bus_id=f"00000000:{0x3B + i:02X}:00.0")
        vm = VirtualMachineFactory(name=f"{prefix}-ws-{i:02d}")
        services.place_vgpu(vm, gpu, profile(name))
        GpuSample.objects.create(gpu=gpu, ts=now - timedelta(seconds=30), util_gpu=i * 7 % 100, temp_c=60)
        for hours_ago in (1, 2):
            _rollup(vm, hours_ago, 512 * (i + 1), 12288, i)


def _queries(client, url) -> int:
    from django.db import connection

    with CaptureQueriesContext(connection) as captured:
        assert client.get(url).status_code == 200
    return len(captured)


@pytest.mark.parametrize("url", [OVERVIEW, LIVE])
def test_query_count_does_not_grow_with_the_fleet(staff, url, django_assert_num_queries):
    _fleet_of(2, "small")
    small = _queries(staff, url)
    _fleet_of(12, "large")
    assert Gpu.objects.count() == 14
    with django_assert_num_queries(small):
        html = page(staff, url)
    assert len(rows(html, "hottest")) == 5
    assert len(rows(html, "idle")) == 5
    # Session and user; GPUs, vGPUs, Q profiles; counts of hosts, VMs, artists; agents; latest
    # samples; idle allocations and their "no data" count; the drift snapshot's nine
    # (hypervisors.drift_queries); the full page adds the navigation badges (the live partial has
    # no navigation, and the lazy badges cost it nothing).
    assert small == {OVERVIEW: 22, LIVE: 21}[url]

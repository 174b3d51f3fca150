"""The heatmap page: staff only, its controls as a shareable GET form, the parameters its script
sends to /api/v1/heatmap/, a 400 page with the form for bad input, the no-agents and
stale-agents states, and a query count that does not grow with the fleet."""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta
from html.parser import HTMLParser
from urllib.parse import parse_qs, urlsplit

import pytest
from django.urls import reverse
from django.utils import timezone

from fleet.tests.factories import GpuFactory, HostFactory
from telemetry.models import Agent

pytestmark = pytest.mark.django_db

URL = "/heatmap/"
#: session, user, the agents' health aggregate, the host filter's choices, the navigation badges
QUERIES = 5


class _Page(HTMLParser):
    """The attributes of #heatmap, the form's controls and the view links of a rendered page."""

    def __init__(self):
        super().__init__()
        self.chart: dict[str, str] | None = None
        self.controls: dict[str, dict[str, str]] = {}
        self.selected: dict[str, str] = {}
        self.view_links: dict[str, str] = {}
        self._select: str | None = None
        self._in_views = False

    def handle_starttag(self, tag, attrs):
        attrs = {name: value or "" for name, value in attrs}
        if attrs.get("id") == "heatmap":
            self.chart = attrs
        if tag in ("select", "input") and "name" in attrs:
            self.controls[attrs["name"]] = attrs
            if tag == "select":
                self._select = attrs["name"]
        if tag == "option" and self._select and "selected" in attrs:
            self.selected[self._select] = attrs["value"]
        if tag == "nav" and attrs.get("aria-label") == "Heatmap view":
            self._in_views = True
        if tag == "a" and self._in_views:
            self.view_links[parse_qs(urlsplit(attrs["href"]).query)["view"][0]] = attrs["href"]

    def handle_endtag(self, tag):
        if tag == "select":
            self._select = None
        if tag == "nav":
            self._in_views = False


def parse(response) -> _Page:
    page = _Page()
    page.feed(response.content.decode())
    return page


def iso(text: str) -> datetime:
    return datetime.fromisoformat(text.replace("Z", "+00:00"))


@pytest.fixture
def agent_ok(db):
    return Agent.objects.create(name="gpu-01", url="http://10.0.0.1:9410", last_seen=timezone.now())


def test_default_view_is_gpu_by_time_over_24h_with_every_parameter_the_script_sends(staff, agent_ok):
    before = timezone.now().replace(microsecond=0)
    response = staff.get(URL)
    after = timezone.now()

    assert response.status_code == 200
    chart = parse(response).chart
    assert chart["data-api-url"] == "/api/v1/heatmap/"
    assert (chart["data-group"], chart["data-metric"], chart["data-stat"]) == ("gpu", "util_gpu", "avg")
    assert (chart["data-sort"], chart["data-fold"], chart["data-host"]) == ("host", "none", "")
    # Up to the next 5-minute boundary: the same columns and cells, one cached answer for everyone.
    assert before <= iso(chart["data-end"]) < after + timedelta(minutes=5)
    assert iso(chart["data-end"]).timestamp() % 300 == 0
    assert before - timedelta(hours=24) <= iso(chart["data-start"]) <= after - timedelta(hours=24)
    assert chart["data-row-noun"] == "GPUs"
    assert "data-state" not in chart  # the script fetches and draws
    content = response.content.decode()
    assert '<script src="/static/vendor/plotly.min.js" defer></script>' in content
    assert '<script src="/static/js/heatmap.js" defer></script>' in content
    assert "cdn" not in content.lower()
    assert "Each cell: GPU utilization (mean) of one GPU over <span data-step>one time step</span>." in content


def test_controls_are_a_get_form_showing_the_current_choices(staff, agent_ok):
    host = HostFactory(name="render-07")
    response = staff.get(URL, {"view": "gpu", "metric": "temp_c", "stat": "max", "range": "7d", "sort": "peak",
                               "host": host.pk})

    page = parse(response)
    assert response.status_code == 200
    assert '<form method="get" action="/heatmap/"' in response.content.decode()
    assert {"view", "metric", "stat", "range", "start", "end", "sort", "host"} <= set(page.controls)
    assert page.controls["start"]["type"] == page.controls["end"]["type"] == "datetime-local"
    assert page.selected == {"metric": "temp_c", "stat": "max", "range": "7d", "sort": "peak", "host": str(host.pk)}
    assert (page.chart["data-metric"], page.chart["data-stat"], page.chart["data-sort"]) == ("temp_c", "max", "peak")
    assert page.chart["data-host"] == str(host.pk)
    span = iso(page.chart["data-end"]) - iso(page.chart["data-start"])
    assert timedelta(days=7) <= span < timedelta(days=7, minutes=5)


@pytest.mark.time_machine(datetime(2026, 3, 4, 12, 0, 30, tzinfo=UTC), tick=False)
@pytest.mark.parametrize(("preset", "span"), [("6h", timedelta(hours=6)), ("24h", timedelta(hours=24)),
                                              ("7d", timedelta(days=7)), ("30d", timedelta(days=30))])
def test_each_preset_range_maps_to_its_span_ending_now(staff, agent_ok, preset, span):
    chart = parse(staff.get(URL, {"range": preset})).chart

    assert iso(chart["data-start"]) == timezone.now() - span
    # The chart asks up to the next 5-minute boundary (the same cells: rollups are 5-minute buckets).
    assert iso(chart["data-end"]) == datetime(2026, 3, 4, 12, 5, tzinfo=UTC)


def test_custom_range_is_read_as_utc_and_shown_in_the_inputs(staff, agent_ok):
    response = staff.get(URL, {"range": "custom", "start": "2026-03-01T00:00", "end": "2026-03-02T12:30"})

    page = parse(response)
    assert response.status_code == 200
    assert (page.chart["data-start"], page.chart["data-end"]) == ("2026-03-01T00:00:00Z", "2026-03-02T12:30:00Z")
    assert page.selected["range"] == "custom"
    assert (page.controls["start"]["value"], page.controls["end"]["value"]) == ("2026-03-01T00:00", "2026-03-02T12:30")
    assert "2026-03-01 00:00 UTC – 2026-03-02 12:30 UTC" in response.content.decode()


def test_a_preset_wins_over_the_custom_inputs_the_form_always_sends(staff, agent_ok):
    chart = parse(staff.get(URL, {"range": "6h", "start": "2026-03-01T00:00", "end": "2026-03-02T00:00"})).chart

    assert timedelta(hours=6) <= iso(chart["data-end"]) - iso(chart["data-start"]) < timedelta(hours=6, minutes=5)
    assert iso(chart["data-start"]).date() != datetime(2026, 3, 1, tzinfo=UTC).date()


def test_vm_view_reads_frame_buffer_against_the_profile(staff, agent_ok):
    response = staff.get(URL, {"view": "vm"})

    page = parse(response)
    content = response.content.decode()
    assert (page.chart["data-group"], page.chart["data-metric"]) == ("vm", "fb_used_pct")
    assert page.chart["data-fold"] == "none"
    assert ">Frame buffer % of profile</option>" in content
    assert "Temperature" not in content  # a VM has no temperature of its own
    assert "rows that stay dark are over-provisioned" in content


def test_vm_view_offers_the_guest_cpu_and_memory_with_their_own_statistics(staff, agent_ok):
    response = staff.get(URL, {"view": "vm", "metric": "ram_used_pct", "stat": "p95"})

    page = parse(response)
    content = response.content.decode()
    assert response.status_code == 200
    assert (page.chart["data-group"], page.chart["data-metric"], page.chart["data-stat"]) == (
        "vm", "ram_used_pct", "p95")
    assert page.chart["data-metric-label"] == "Guest memory % of RAM"
    for value, label, stats in [("vcpu_util", "Guest CPU (all vCPUs)", "avg max p95"),
                                ("vcpu_max_util", "Guest busiest vCPU", "avg max p95"),
                                ("cpu_steal_pct", "Guest CPU steal", "avg max"),
                                ("ram_used_pct", "Guest memory % of RAM", "avg max p95"),
                                ("ram_used_mib", "Guest memory used", "avg max p95")]:
        assert re.search(rf'<option value="{value}" data-stats="{stats}"( selected)?>{re.escape(label)}</option>',
                         content), value
    assert "Each cell: Guest memory % of RAM (95th percentile) of one VM over" in content
    assert "a guest that reports no memory use shows gaps, not zero" in content
    # The GPU and host views keep their own metrics: a GPU has no guest.
    for view in ("gpu", "host"):
        other = staff.get(URL, {"view": view}).content.decode()
        assert not re.search(r'<option value="(vcpu_util|vcpu_max_util|cpu_steal_pct|ram_used_pct|ram_used_mib)"',
                             other), view
    refused = staff.get(URL, {"view": "gpu", "metric": "vcpu_util"})
    assert refused.status_code == 400
    assert "Unknown metric &#x27;vcpu_util&#x27; in the GPU × time view" in refused.content.decode()


def test_host_view_folds_to_hour_of_week_over_30_days_by_default(staff, agent_ok):
    response = staff.get(URL, {"view": "host"})

    page = parse(response)
    assert (page.chart["data-group"], page.chart["data-fold"]) == ("host", "hour_of_week")
    span = iso(page.chart["data-end"]) - iso(page.chart["data-start"])
    assert timedelta(days=30) <= span < timedelta(days=30, minutes=5)
    assert page.selected["range"] == "30d"
    assert "hours in the studio's time zone (UTC)" in response.content.decode()


def test_view_links_keep_sort_host_and_range_but_not_a_range_too_short_for_a_weekly_fold(staff, agent_ok):
    host = HostFactory()
    links = parse(staff.get(URL, {"view": "gpu", "metric": "temp_c", "range": "24h", "sort": "mean",
                                  "host": host.pk})).view_links

    assert set(links) == {"gpu", "vm", "host"}
    vm = parse_qs(urlsplit(links["vm"]).query)
    assert vm == {"view": ["vm"], "sort": ["mean"], "host": [str(host.pk)], "range": ["24h"]}  # metric starts afresh
    assert "range" not in parse_qs(urlsplit(links["host"]).query)
    custom = parse(staff.get(URL, {"range": "custom", "start": "2026-03-01T00:00", "end": "2026-03-09T00:00"}))
    assert parse_qs(urlsplit(custom.view_links["host"]).query)["start"] == ["2026-03-01T00:00"]


@pytest.mark.parametrize(("params", "message"), [
    ({"range": "2w"}, "Unknown range &#x27;2w&#x27;: use 6h, 24h, 7d, 30d or a custom start and end."),
    ({"range": "custom", "start": "2026-03-01T00:00"}, "A custom range needs both a start and an end."),
    ({"range": "custom", "start": "2026-03-02T00:00", "end": "2026-03-01T00:00"},
     "The end of the range must be after its start."),
    ({"range": "custom", "start": "yesterday", "end": "2026-03-01T00:00"},
     "start &#x27;yesterday&#x27; is not a time: use ISO 8601"),
    ({"view": "pie"}, "Unknown view &#x27;pie&#x27;: use gpu, vm, host."),
    ({"metric": "bogus"}, "Unknown metric &#x27;bogus&#x27; in the GPU × time view: use util_gpu, fb_used_pct,"),
    ({"view": "vm", "metric": "temp_c"},
     "Unknown metric &#x27;temp_c&#x27; in the VM × time: frame buffer vs profile view"),
    ({"metric": "enc_util", "stat": "p95"}, "Encoder utilization has no 95th percentile: use mean or max (avg, max)."),
    ({"view": "vm", "metric": "cpu_steal_pct", "stat": "p95"},
     "Guest CPU steal has no 95th percentile: use mean or max (avg, max)."),
    ({"stat": "median"}, "Unknown stat &#x27;median&#x27;: use avg, max, p95."),
    ({"sort": "size"}, "Unknown sort &#x27;size&#x27;: use host, peak, mean."),
    ({"host": "999999"}, "Unknown host &#x27;999999&#x27;: pick one from the list, or all hosts."),
    ({"host": "gpu-01"}, "Unknown host &#x27;gpu-01&#x27;"),
])
def test_bad_parameters_give_a_400_page_with_the_message_and_the_form(staff, agent_ok, params, message):
    response = staff.get(URL, params)

    content = response.content.decode()
    page = parse(response)
    assert response.status_code == 400
    assert message in content
    assert "This heatmap can't be drawn" in content
    assert {"metric", "stat", "range", "start", "end", "sort", "host"} <= set(page.controls)
    assert page.chart is None  # nothing for the script to fetch
    assert "Traceback" not in content


def test_a_bad_custom_range_keeps_what_the_user_typed(staff, agent_ok):
    page = parse(staff.get(URL, {"range": "custom", "start": "2026-03-02T00:00", "end": "2026-03-01T00:00"}))

    assert page.selected["range"] == "custom"
    assert (page.controls["start"]["value"], page.controls["end"]["value"]) == ("2026-03-02T00:00", "2026-03-01T00:00")


def test_view_links_of_a_400_page_carry_only_valid_choices(staff, agent_ok):
    links = parse(staff.get(URL, {"range": "2w", "sort": "size", "host": "x"})).view_links

    assert parse_qs(urlsplit(links["gpu"]).query) == {"view": ["gpu"]}


def test_an_artist_gets_403_and_anonymous_visitors_the_login_page(client, artist):
    assert client.get(URL).status_code == 302
    assert client.get(URL)["Location"] == f"{reverse('login')}?next=/heatmap/"

    client.force_login(artist.user)
    response = client.get(URL)
    assert response.status_code == 403
    assert "Go to my workstation" in response.content.decode()


def test_no_agents_yet_says_how_to_get_one_and_draws_nothing(staff):
    response = staff.get(URL)

    content = response.content.decode()
    page = parse(response)
    assert response.status_code == 200
    assert "No agents yet" in content
    assert "manage.py demo_agents" in content
    assert f'href="{reverse("telemetry:agent-list")}"' in content
    assert page.chart["data-state"] == "empty"
    assert "data-api-url" not in page.chart
    assert "plotly.min.js" not in content


def test_stale_and_failing_agents_are_counted_in_a_banner(staff, agent_ok, settings):
    now = timezone.now()
    long_ago = now - timedelta(seconds=settings.TELEMETRY_STALE_AFTER_S * 10)
    Agent.objects.create(name="gpu-02", url="http://10.0.0.2:9410", last_seen=long_ago)
    Agent.objects.create(name="gpu-03", url="http://10.0.0.3:9410", last_seen=long_ago)
    Agent.objects.create(name="gpu-04", url="http://10.0.0.4:9410", last_seen=long_ago, last_error_at=now,
                         last_error="connection refused")
    Agent.objects.create(name="gpu-05", url="http://10.0.0.5:9410", last_seen=long_ago, enabled=False)

    content = staff.get(URL).content.decode()

    assert "2 agents are stale and 1 agent failed its last poll" in content
    assert "No agents yet" not in content


def test_no_banner_while_every_agent_reports(staff, agent_ok):
    content = staff.get(URL).content.decode()

    assert "Agents need attention" not in content
    assert "No agents yet" not in content


def test_the_script_has_an_empty_state_for_each_case_with_what_to_do(staff, agent_ok):
    response = staff.get(URL, {"range": "custom", "start": "2026-03-01T00:00", "end": "2026-03-02T00:00"})

    content = response.content.decode()

    assert '<template id="heatmap-no-rows">' in content
    assert "No GPUs to show" in content
    assert reverse("admin:fleet_host_add") in content
    assert '<template id="heatmap-no-data">' in content
    assert "No data between 2026-03-01 00:00 UTC and 2026-03-02 00:00 UTC: check the agents page." in content
    assert '<template id="heatmap-error">' in content


def _fleet(hosts: int, gpus_each: int, agents: int):
    for _ in range(hosts):
        host = HostFactory()
        for _gpu in range(gpus_each):
            GpuFactory(host=host)
    stale = timezone.now() - timedelta(hours=1)
    for a in range(agents):
        Agent.objects.create(name=f"agent-{a}", url=f"http://10.1.0.{a + 1}:9410", last_seen=stale)


@pytest.mark.parametrize(("hosts", "gpus_each", "agents"), [(1, 2, 2), (6, 2, 12)])
@pytest.mark.parametrize("view", ["gpu", "vm", "host"])
def test_query_count_does_not_grow_with_the_fleet(staff, django_assert_num_queries, hosts, gpus_each, agents, view):
    _fleet(hosts, gpus_each, agents)

    with django_assert_num_queries(QUERIES):
        response = staff.get(URL, {"view": view})

    assert response.status_code == 200
    assert f"{agents} agents are stale" in response.content.decode()


def test_the_api_accepts_what_the_page_sends(staff, agent_ok):
    """The page's data-* attributes, sent as the script sends them, get an answer, not a 400."""
    GpuFactory(host=HostFactory(name="render-01"))
    for params in ({}, {"view": "vm"}, {"view": "host"}, {"metric": "power_w", "stat": "max", "sort": "peak"},
                   {"view": "vm", "metric": "ram_used_mib", "stat": "p95"}, {"view": "vm", "metric": "cpu_steal_pct"}):
        chart = parse(staff.get(URL, params)).chart
        query = {name: chart[f"data-{name}"] for name in ("group", "metric", "stat", "start", "end", "sort", "fold")}

        response = staff.get(chart["data-api-url"], query)

        assert response.status_code == 200, response.content
        body = response.json()
        assert body["group"] == query["group"]
        # what static/js/heatmap.js reads to draw, hover and click through
        assert {"x", "y", "z", "rows", "unit", "step", "zmin", "zmax", "fold", "sort"} <= set(body)
        assert len(body["z"]) == len(body["y"]) == len(body["rows"])
        assert all({"host_id", "detail_url", "subtitle", "peak", "mean"} <= set(row) for row in body["rows"])

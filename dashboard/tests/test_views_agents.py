"""The agents page: status of every source with the word on the badge, last success and error,
filters shared with the API, sorting, pages, CSV, the live-refreshing table, empty states, roles
and a query count that does not grow with the agents shown."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from dashboard.tests.test_views_lists import count_queries, csv_rows, first_column, table, table_rows
from fleet.tests.factories import HostFactory, VirtualMachineFactory
from telemetry.models import Agent

pytestmark = pytest.mark.django_db

PAGE = "/agents/"
HEADERS = ["Agent", "Kind", "Host", "URL", "Status", "Last seen", "Last error", "Failures", "Clock skew"]


@pytest.fixture
def agents():
    """One agent of each state: ok, stale, in error (with a long message), never seen, disabled,
    an nvidia-smi source without URL or host, and an in-guest one bound to a VM."""
    now = timezone.now()
    host = HostFactory(name="render-01")
    other = HostFactory(name="render-02")
    long_error = "connection refused by http://render-02:9410/v1/metrics " + "x" * 120
    return {
        "ok": Agent.objects.create(name="a-ok", url="http://render-01:9410", host=host, last_seen=now,
                                   clock_skew_s=-1.24),
        "stale": Agent.objects.create(name="b-stale", url="http://render-03:9410", host=other,
                                      last_seen=now - timedelta(hours=3)),
        "error": Agent.objects.create(name="c-error", url="http://render-02:9410", host=other,
                                      last_seen=now - timedelta(hours=1), last_error=long_error,
                                      last_error_at=now - timedelta(minutes=1), consecutive_failures=7),
        "new": Agent.objects.create(name="d-new", url="http://render-04:9410"),
        "disabled": Agent.objects.create(name="e-disabled", url="http://render-05:9410", enabled=False),
        "push": Agent.objects.create(name="f-push", kind="nvidia-smi", url="", last_seen=now),
        "guest": Agent.objects.create(name="g-guest", kind="nvidia-smi", url="",
                                      vm=VirtualMachineFactory(name="ws-ana")),
    }


def test_lists_every_agent_with_status_word_times_errors_and_skew(staff, agents):
    response = staff.get(PAGE)

    assert response.status_code == 200
    parsed = table(response)
    assert parsed.headers == HEADERS
    rows = {row[0]: row for row in parsed.rows}
    assert list(rows) == ["a-ok", "b-stale", "c-error", "d-new", "e-disabled", "f-push", "g-guest"]
    assert rows["a-ok"][1:5] == ["nvml", "render-01", "http://render-01:9410", "ok"]
    assert rows["a-ok"][8] == "-1.2 s"
    assert rows["b-stale"][4] == "stale"
    assert rows["b-stale"][5].startswith("3 hours ago ")
    assert rows["b-stale"][5].endswith(" UTC")
    assert rows["c-error"][4] == "error"
    assert rows["c-error"][6].startswith("connection refused by http://render-02:9410/v1/metrics xxx")
    assert rows["c-error"][6].count("x") < 100, "truncated in the cell"
    assert rows["c-error"][7] == "7"
    assert rows["d-new"][4:6] == ["new", "never"]
    assert rows["e-disabled"][4] == "disabled"
    assert rows["f-push"][1:4] == ["nvidia-smi", "none", "(pushes)"]
    assert rows["g-guest"][1:3] == ["nvidia-smi", "VM ws-ana"], "an in-guest agent shows the VM it is bound to"

    html = response.content.decode()
    assert f'title="{agents["error"].last_error}"' in html, "the whole error on hover"
    assert '<span class="badge error">error</span>' in html
    assert f'href="/hosts/{agents["ok"].host_id}/">render-01</a>' in html
    assert f'href="/vms/{agents["guest"].vm_id}/">ws-ana</a>' in html
    assert f'href="/admin/telemetry/agent/{agents["ok"].pk}/change/"' in html
    assert agents["ok"].token not in html


def test_summary_counts_statuses_and_flags_agents_needing_attention(staff, agents):
    html = staff.get(PAGE).content.decode()

    assert 'href="/agents/?status=error" title="Show only the agents whose status is error">1 error</a>' in html
    assert ">2 ok</a>" in html
    assert ">1 stale</a>" in html
    assert "2 agents not reporting" in html


def test_a_recovered_error_is_shown_as_past(staff, agents):
    agent = agents["ok"]
    agent.last_error = "timed out after 2.0 s"
    agent.last_error_at = agent.last_seen - timedelta(minutes=5)
    agent.save()

    rows = {row[0]: row for row in table_rows(staff.get(PAGE))}

    assert rows["a-ok"][4] == "ok"
    assert rows["a-ok"][6].startswith("timed out after 2.0 s")
    assert rows["a-ok"][6].endswith("(since recovered)")


@pytest.mark.parametrize(
    ("params", "expected"),
    [
        ({"status": "error"}, ["c-error"]),
        ({"status": "stale"}, ["b-stale"]),
        ({"status": "ok"}, ["a-ok", "f-push"]),
        ({"kind": "nvidia-smi"}, ["f-push", "g-guest"]),
        ({"enabled": "false"}, ["e-disabled"]),
        ({"q": "RENDER-0"}, ["a-ok", "b-stale", "c-error", "d-new", "e-disabled"]),
        ({"q": "push"}, ["f-push"]),
        ({"q": "render-03"}, ["b-stale"]),
    ],
)
def test_filters_and_search_narrow_the_agents(staff, agents, params, expected):
    assert first_column(staff.get(PAGE, params)) == expected


def test_filter_by_host(staff, agents):
    host = agents["error"].host

    assert first_column(staff.get(PAGE, {"host": host.pk})) == ["b-stale", "c-error"]


def test_api_uses_the_same_filterset(admin_api, agents):
    """The page's FilterSet is the API's: search, status and host filter alike."""
    by_search = admin_api.get("/api/v1/agents/", {"q": "render-03"}).json()
    by_status = admin_api.get("/api/v1/agents/", {"status": "error", "host": agents["error"].host_id}).json()
    refused = admin_api.get("/api/v1/agents/", {"host": 999999})

    assert [a["name"] for a in by_search["results"]] == ["b-stale"]
    assert [a["name"] for a in by_status["results"]] == ["c-error"]
    assert refused.status_code == 400


@pytest.mark.parametrize(
    ("params", "message"),
    [
        ({"kind": "snmp"}, "Select a valid choice. snmp is not one of the available choices."),
        ({"status": "broken"}, "Select a valid choice. broken is not one of the available choices."),
        ({"host": "999999"}, "Select a valid choice. That choice is not one of the available choices."),
    ],
)
def test_invalid_filters_are_a_400_saying_why(staff, agents, params, message):
    response = staff.get(PAGE, params)

    assert response.status_code == 400
    html = response.content.decode()
    assert message in html
    assert table_rows(response) == []


def test_sorting_by_failures_and_last_seen(staff, agents):
    assert first_column(staff.get(PAGE, {"ordering": "-consecutive_failures"}))[0] == "c-error"
    html = staff.get(PAGE, {"ordering": "last_seen", "status": "stale"}).content.decode()
    assert 'aria-sort="ascending"' in html
    assert 'href="/agents/?status=stale&amp;ordering=-last_seen"' in html


def test_pages_keep_the_filters(staff):
    Agent.objects.bulk_create([Agent(name=f"farm-{n:03d}", url=f"http://farm-{n}:9410", token_salt=f"s{n}",
                                     token_sha256=f"h{n}") for n in range(55)])

    first = staff.get(PAGE, {"kind": "nvml", "q": "farm"})
    second = staff.get(PAGE, {"kind": "nvml", "q": "farm", "page": "2"})

    assert len(table_rows(first)) == 50
    assert "1–50 of 55 agents" in first.content.decode()
    assert 'href="/agents/?kind=nvml&amp;q=farm&amp;page=2" rel="next"' in first.content.decode()
    assert first_column(second) == [f"farm-{n:03d}" for n in range(50, 55)]


def test_csv_has_every_filtered_agent_and_neutralizes_formulas(staff):
    Agent.objects.bulk_create([Agent(name=f"farm-{n:03d}", url=f"http://farm-{n}:9410", token_salt=f"s{n}",
                                     token_sha256=f"h{n}") for n in range(55)])
    Agent.objects.create(name="=cmd|'/C calc'!A0", url="http://evil:9410", last_error="@SUM(1+1)",
                         last_error_at=timezone.now(), clock_skew_s=-2.5)

    response = staff.get(PAGE, {"format": "csv", "page": "1"})

    assert response["Content-Disposition"] == f'attachment; filename="agents-{timezone.now():%Y-%m-%d}.csv"'
    rows = csv_rows(response)
    assert rows[0] == ["name", "kind", "host", "vm", "url", "enabled", "status", "last_seen_utc", "last_error",
                       "last_error_at_utc", "consecutive_failures", "clock_skew_s"]
    assert len(rows) == 1 + 56, "every agent, not one page"
    evil = rows[1]
    assert evil[0] == "'=cmd|'/C calc'!A0"
    assert evil[6] == "error"
    assert evil[8] == "'@SUM(1+1)"
    assert evil[11] == "-2.5", "a negative number is a number, not a formula"

    filtered = csv_rows(staff.get(PAGE, {"format": "csv", "status": "error"}))
    assert [row[0] for row in filtered[1:]] == ["'=cmd|'/C calc'!A0"]


def test_table_refreshes_itself_with_the_filters(staff, agents, settings):
    settings.DASHBOARD_REFRESH_S = 7

    html = staff.get(PAGE, {"status": "error", "ordering": "-name"}).content.decode()

    assert 'hx-get="/agents/?status=error&amp;ordering=-name"' in html
    assert 'hx-trigger="every 7s"' in html
    assert 'hx-swap="outerHTML"' in html


def test_htmx_request_gets_the_table_alone(staff, agents):
    response = staff.get(PAGE, {"status": "error"}, headers={"HX-Request": "true"})

    assert response.status_code == 200
    html = response.content.decode()
    assert not html.lstrip().startswith("<!DOCTYPE")
    assert "<form" not in html
    assert html.lstrip().startswith('<div id="agent-table"')
    assert first_column(response) == ["c-error"]
    assert "HX-Request" in response["Vary"]


def test_no_agents_yet_explains_how_to_register_one(staff):
    html = staff.get(PAGE).content.decode()

    assert "No agents yet" in html
    assert 'href="/admin/telemetry/agent/add/"' in html
    assert "manage.py demo_agents" in html


def test_a_filter_matching_nothing_offers_a_reset(staff, agents):
    html = staff.get(PAGE, {"q": "nothing-like-this"}).content.decode()

    assert "No agents match these filters" in html
    assert '<a class="button" href="/agents/">Reset filters</a>' in html
    assert "No agents yet" not in html


def test_artists_get_403_and_anonymous_visitors_the_login_page(client, artist, agents):
    assert client.get(PAGE)["Location"] == f"/login/?next={PAGE}"

    client.force_login(artist.user)
    assert client.get(PAGE).status_code == 403
    assert client.get(PAGE, {"format": "csv"}).status_code == 403
    assert client.get(PAGE, headers={"HX-Request": "true"}).status_code == 403


def add_agents(count: int, start: int) -> None:
    for n in range(start, start + count):
        Agent.objects.create(name=f"qc-{n:03d}", url=f"http://qc-{n}:9410", host=HostFactory(name=f"qc-host-{n:03d}"),
                             last_seen=timezone.now(), last_error="old" if n % 2 else "",
                             last_error_at=timezone.now() - timedelta(hours=1) if n % 2 else None)


def test_query_count_does_not_grow_with_agents(staff, django_assert_num_queries):
    # session, user, the status summary, count, page, the host filter's choices, and the
    # navigation badges
    add_agents(2, start=0)
    with django_assert_num_queries(7):
        assert len(table_rows(staff.get(PAGE))) == 2
    partial = count_queries(staff, PAGE, {"status": "ok"})
    csv_count = count_queries(staff, PAGE, {"format": "csv"})

    add_agents(10, start=2)
    with django_assert_num_queries(7):
        assert len(table_rows(staff.get(PAGE))) == 12
    assert count_queries(staff, PAGE, {"status": "ok"}) == partial == 7
    assert count_queries(staff, PAGE, {"format": "csv"}) == csv_count == 3
    with django_assert_num_queries(5):  # the table alone: no filter form
        staff.get(PAGE, headers={"HX-Request": "true"})

"""What the walk over every URL with bad input found (test_security_bad_input.py), pinned down
as a client or an attacker meets it: a 400 that names the field, the admin's own refusal, or a
JSON 404, never a 500; and nothing is written."""

from __future__ import annotations

import json

import pytest
from axes.models import AccessAttempt
from django.contrib.auth.models import Group
from django.test import Client
from django_celery_beat.models import CrontabSchedule, PeriodicTask

from fleet.models import Host, ResizeRequest
from fleet.tests.factories import UserFactory
from tests.test_security_matrix import security_world

pytestmark = pytest.mark.django_db

ARABIC_INDIC = str.maketrans("0123456789", "٠١٢٣٤٥٦٧٨٩")


@pytest.fixture
def world(fleet_world, admin_user):
    return security_world(fleet_world, admin_user)


def _signed_in(user) -> Client:
    client = Client()
    client.force_login(user)
    return client


# --- the API's plumbing (config/api/__init__.py, config/routers.py) ------------------------------------


@pytest.mark.parametrize("path", ["/api/v1/nope/", "/api/nope", "/api/v1/hosts/abc/", "/api/v1/hosts/1/nope/"])
def test_an_unknown_api_path_is_a_json_404(staff, path):
    response = staff.get(path)

    assert response.status_code == 404
    assert response["Content-Type"] == "application/json"
    assert response.json() == {"detail": "Not found."}


@pytest.mark.parametrize("path", ["/api/v1/nope/", "/api/v1/hosts/abc/"])
def test_an_unknown_api_path_is_a_json_404_on_a_development_server_too(staff, settings, path):
    """With DEBUG on Django answers its HTML debug page; a script against `make run` gets JSON all the same."""
    settings.DEBUG = True

    response = staff.get(path)

    assert response.status_code == 404
    assert response["Content-Type"] == "application/json"
    assert response.json() == {"detail": "Not found."}


def test_an_api_path_without_its_slash_is_still_redirected(staff):
    response = staff.get("/api/v1/hosts")

    assert response.status_code == 301
    assert response["Location"] == "/api/v1/hosts/"


def test_an_unknown_page_keeps_its_html_404(staff):
    response = staff.get("/nope/")

    assert response.status_code == 404
    assert response["Content-Type"].startswith("text/html")


def test_an_id_in_an_api_path_is_ascii_digits(staff, fleet_world):
    """`int("٣")` is 3: the ORM would serve host 3 for `/api/v1/hosts/٣/`, as the page's `<int:pk>` does not."""
    pk = str(fleet_world.host_a.pk)

    assert staff.get(f"/api/v1/hosts/{pk}/").status_code == 200
    response = staff.get(f"/api/v1/hosts/{pk.translate(ARABIC_INDIC)}/")
    assert response.status_code == 404
    assert response.json() == {"detail": "Not found."}
    huge = staff.get(f"/api/v1/hosts/{10**30}/")
    assert huge.status_code == 404
    assert huge.json() == {"detail": "No Host matches the given query."}


@pytest.mark.parametrize("body", ["[" * 100_000, '{"name":' * 50_000 + '"x"' + "}" * 50_000,
                                  json.dumps({"name": json.loads("[" * 40 + "]" * 40)})])
def test_a_json_body_nested_too_deep_is_a_400_and_writes_nothing(staff, body):
    hosts = Host.objects.count()

    response = staff.generic("POST", "/api/v1/hosts/", body, "application/json")

    assert response.status_code == 400
    assert "nest deeper than 32 levels" in response.json()["detail"]
    assert Host.objects.count() == hosts


def test_an_extra_action_answers_with_a_format_suffix(world):
    """DRF's routers add `.json` to every route; an action that did not take `format` was a TypeError."""
    ana = _signed_in(world.ana.user)

    response = ana.post(f"/api/v1/resize-requests/{world.request.pk}/cancel.json/")

    assert response.status_code == 200
    assert response.json()["status"] == "cancelled"


@pytest.mark.parametrize(("query", "field", "message"), [
    ("limit=abc", "limit", "'abc' is not a whole number"),
    ("limit=0", "limit", "0 is out of range"),
    ("limit=²", "limit", "'²' is not a whole number"),
    ("offset=-1", "offset", "-1 is out of range"),
    ("offset=1e400", "offset", "'1e400' is not a whole number"),
])
def test_a_list_refuses_a_limit_or_offset_that_is_not_a_count(staff, fleet_world, query, field, message):
    """DRF would serve the first 50 rows instead, and a script would take them for what it asked."""
    response = staff.get(f"/api/v1/hosts/?{query}")

    assert response.status_code == 400
    assert message in response.json()[field][0]


def test_a_limit_above_the_most_is_served_as_the_most(staff, fleet_world):
    response = staff.get("/api/v1/hosts/?limit=100000")

    assert response.status_code == 200
    assert "limit=500" in (response.json()["next"] or "limit=500")


# --- times, numbers and pages in query strings (config/parsing.py) ------------------------------


@pytest.mark.parametrize(("start", "message"), [
    ("2026-02-30", "'2026-02-30' is not a time (day is out of range for month)"),
    ("1e400", "'1e400' is out of range: use a time from 1970 up to 9000."),
    ("9999-12-31T23:59:59", "out of range"),
    ("٢٠٢٦-٠٣-٠١", "is not a time"),
])
def test_metrics_name_a_start_that_is_no_time(staff, fleet_world, start, message):
    response = staff.get(f"/api/v1/gpus/{fleet_world.gpu_a.pk}/metrics/", {"start": start, "end": "2026-03-02"})

    assert response.status_code == 400
    assert message in response.json()["start"][0]


@pytest.mark.parametrize("host", ["²", "٣", "1e400", str(10**30)])
def test_the_heatmap_api_names_a_host_that_is_no_id(staff, fleet_world, host):
    response = staff.get("/api/v1/heatmap/", {"start": "2026-03-01", "end": "2026-03-02", "host": host})

    assert response.status_code == 400
    assert list(response.json()) == ["host"]


def test_the_heatmap_page_names_a_host_that_is_no_id(staff, fleet_world):
    response = staff.get("/heatmap/", {"host": "²"})

    assert response.status_code == 400
    assert "Unknown host &#x27;²&#x27;" in response.content.decode()


@pytest.mark.parametrize(("query", "field"), [("since=1e400", "since"), ("until=2026-02-30", "until"),
                                              ("since=nan", "since")])
def test_the_audit_log_names_a_time_that_is_no_time(staff, world, query, field):
    response = staff.get(f"/api/v1/audit-events/?{query}")

    assert response.status_code == 400
    assert "is not a time" in response.json()[field][0] or "out of range" in response.json()[field][0]
    page = staff.get(f"/audit/?{query}")
    assert page.status_code == 400
    assert f"{field}: " in page.content.decode()


def test_the_audit_log_reads_an_actor_that_is_no_id_as_a_user_name(staff, world):
    """`"²".isdigit()` is True, and `int("²")` failed with a 500."""
    response = staff.get("/api/v1/audit-events/", {"actor": "²"})

    assert response.status_code == 200
    assert response.json()["results"] == []


@pytest.mark.parametrize(("page", "status", "message"), [
    ("abc", 400, "Page: &#x27;abc&#x27; is not a whole number (digits 0-9). Pages are numbered from 1."),
    ("0", 400, "Page: 0 is out of range"),
    (str(10**30), 400, "is out of range"),
    ("999", 200, "host-b"),  # past the last page: the last page (rows may have gone since the link was made)
])
def test_a_list_page_refuses_a_page_that_is_no_page_number(staff, fleet_world, page, status, message):
    response = staff.get("/hosts/", {"page": page})

    assert response.status_code == status
    assert message in response.content.decode()


def test_the_audit_page_refuses_a_page_that_is_no_page_number(staff, world):
    response = staff.get("/audit/", {"page": "²"})

    assert response.status_code == 400
    assert "page: &#x27;²&#x27; is not a whole number" in response.content.decode()


# --- the pages' forms ---------------------------------------------------------------------------


def test_the_planner_adds_no_row_to_a_damaged_management_form(staff, fleet_world):
    """"Add row" read `artists-TOTAL_FORMS` with `isdigit()` then `int()`: `²` was a 500."""
    response = staff.get("/sizing/planner/", {"gpu_model": "1", "artists-TOTAL_FORMS": "²",
                                              "artists-INITIAL_FORMS": "0", "add_row": "1"})

    assert response.status_code == 400
    assert "ManagementForm data is missing or has been tampered with" in response.content.decode()


def test_the_planner_shows_at_most_50_rows_whatever_the_management_form_says(staff, fleet_world):
    response = staff.get("/sizing/planner/", {"gpu_model": "1", "artists-TOTAL_FORMS": str(10**30),
                                              "artists-INITIAL_FORMS": "0"})

    assert response.status_code == 400
    assert "Please submit at most 50 forms." in response.content.decode()
    assert 'name="artists-50-demand"' not in response.content.decode()


@pytest.mark.parametrize(("data", "message"), [
    ({"requested_profile": "²", "reason": "x"}, "Choose a target profile of the VM&#x27;s GPU model."),
    ({"requested_profile": str(10**30), "reason": "x"}, "Choose a target profile of the VM&#x27;s GPU model."),
    ({"requested_profile": "PROFILE", "reason": "x", "wished_from": "2026-02-30T10:00"},
     "Enter the wished window as a date and time, e.g. 2026-12-01 09:00. (&#x27;2026-02-30T10:00&#x27; is not a "
     "time (day is out of range for month)"),
    ({"requested_profile": "PROFILE", "reason": "x", "wished_until": "9999-12-31T23:59"}, "is out of range"),
])
def test_a_resize_request_form_names_what_is_wrong_and_files_nothing(fleet_world, data, message):
    ana = _signed_in(fleet_world.ana.user)
    data = {**data, "requested_profile": data["requested_profile"].replace("PROFILE", str(fleet_world.profile_12q.pk))}

    response = ana.post(f"/me/vms/{fleet_world.vm_a.pk}/request/", data, follow=True)

    assert response.status_code == 200
    assert message in response.content.decode()
    assert not ResizeRequest.objects.exists()


@pytest.mark.parametrize("target", ["abc", "nan", "//evil.example/", "https://evil.example/"])
def test_a_decision_goes_back_to_the_queue_when_next_is_no_path_of_the_site(world, target):
    response = _signed_in(world.admin).post(f"/requests/{world.request.pk}/reject/",
                                            {"comment": "no", "next": target})

    assert response.status_code == 302
    assert response["Location"] == "/requests/"


def test_the_request_queue_names_a_status_it_does_not_know(staff, world):
    response = staff.get("/requests/", {"status": "approved\x00"})

    assert response.status_code == 400
    assert "Unknown status &#x27;approved\\x00&#x27;" in response.content.decode()


def test_a_comment_with_a_nul_character_is_refused_and_the_request_stays_pending(world):
    """PostgreSQL cannot store a NUL character: the rejection was a 500 there."""
    response = _signed_in(world.admin).post(f"/requests/{world.request.pk}/reject/", {"comment": "no\x00"},
                                            follow=True)

    message = f"Request #{world.request.pk} was not rejected: Null characters are not allowed."
    assert message in response.content.decode()
    world.request.refresh_from_db()
    assert world.request.status == "pending"


@pytest.mark.parametrize("path", ["/login/", "/admin/login/"])
def test_a_sign_in_with_a_user_name_of_5000_characters_is_refused_and_counted(client, path):
    """Django's sign-in form hands any length on; axes stored it as sent, which PostgreSQL refused."""
    response = client.post(path, {"username": "x" * 5000, "password": "guess"})

    assert response.status_code == 200
    assert [len(attempt.username) for attempt in AccessAttempt.objects.all()] == [150]


# --- the admin site (config/admin_input.py, config/lookups.py) ---------------------------------


@pytest.mark.parametrize("query", [{"q": "ana\x00"}, {"task": "\x00"}])
def test_an_admin_filter_or_search_with_a_nul_character_is_the_admins_invalid_filter(staff, query):
    response = staff.get("/admin/django_celery_beat/periodictask/", query)

    assert response.status_code == 302
    assert response["Location"].endswith("?e=1")


@pytest.mark.parametrize("year", ["9999", "253402300800", "²", "-1"])
def test_an_admin_date_hierarchy_year_no_datetime_holds_is_the_admins_invalid_filter(staff, year):
    response = staff.get("/admin/axes/accesslog/", {"attempt_time__year": year})

    assert response.status_code == 302
    assert response["Location"].endswith("?e=1")


def test_an_id_no_column_holds_matches_nothing():
    """SQLite raised OverflowError for `pk__in=[10**30]`, where `pk=10**30` already matched nothing."""
    assert not Host.objects.filter(pk__in=[10**30, -(2**63) - 1]).exists()


def test_an_admin_form_with_an_id_no_column_holds_is_shown_again_with_its_error(staff):
    response = staff.post("/admin/auth/group/add/", {"name": "ops", "permissions": [str(10**30)]})

    assert response.status_code == 200
    assert "Select a valid choice" in response.content.decode()
    assert not Group.objects.exists()


@pytest.mark.parametrize("user", ["abc", "1.5", str(10**30)])
def test_an_autocomplete_field_is_shown_again_with_a_typed_value_that_is_no_id(staff, user):
    """Django's autocomplete widget looked the typed value up as it was: `abc` was a ValueError."""
    UserFactory(username="someone")

    response = staff.post("/admin/fleet/artist/add/", {"name": "New", "user": user, "workflow": "modeling",
                                                        "user_type": "medium"})

    assert response.status_code == 200
    assert "Select a valid choice" in response.content.decode()


def test_an_admin_inline_takes_at_most_200_forms_whatever_the_management_form_says(staff, fleet_world):
    host = fleet_world.host_a
    response = staff.post(f"/admin/fleet/host/{host.pk}/change/", {
        "name": host.name, "hypervisor": host.hypervisor, "cpu_model": host.cpu_model,
        "cpu_threads": host.cpu_threads, "ram_gib": host.ram_gib, "vcpu_overcommit": "1.0", "ram_overcommit": "1.0",
        "gpus-TOTAL_FORMS": str(10**30), "gpus-INITIAL_FORMS": "1", "gpus-MIN_NUM_FORMS": "0",
        "gpus-MAX_NUM_FORMS": "0",
    })

    # Django's message counts the forms the inline adds (none), its cap was 1,000 forms built,
    # validated and drawn again.
    assert response.status_code == 200
    assert "Please submit at most 0 forms." in response.content.decode()
    assert "gpus-199-" in response.content.decode()
    assert "gpus-200-" not in response.content.decode()


def test_the_crontab_admin_shows_a_refused_schedule_again(staff):
    response = staff.post("/admin/django_celery_beat/crontabschedule/add/", {
        "minute": "0", "hour": "-1", "day_of_week": "*", "day_of_month": "*", "month_of_year": "*",
        "timezone": "UTC",
    })

    assert response.status_code == 200
    assert "No enumeration for Hours" in response.content.decode()
    assert not CrontabSchedule.objects.exists()


@pytest.mark.parametrize("task", ["x" * 300, "task\x00"])
def test_the_periodic_task_admin_names_a_refused_task_name(staff, task):
    response = staff.post("/admin/django_celery_beat/periodictask/add/", {"name": "nightly", "task": task})

    assert response.status_code == 200
    assert "errorlist" in response.content.decode()
    assert not PeriodicTask.objects.filter(name="nightly").exists()

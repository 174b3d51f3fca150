"""Notifications: the API (own only, read flag, unread filter, marking read), the page that
marks them read when opened, and the navigation badges (unread for everyone, pending requests
for admins) with what they cost in queries."""

import re

import pytest
from django.test import Client

from fleet import requests as service
from fleet.models import Notification, ResizeRequest
from fleet.tests.factories import profile

URL = "/api/v1/notifications/"


def _client(user):
    client = Client()
    client.force_login(user)
    return client


def badge(html: str, name: str) -> str | None:
    """The number on a navigation badge, None when the badge is not shown."""
    match = re.search(rf'data-badge="{name}">(\d+)<', html)
    return match.group(1) if match else None


@pytest.fixture
def notes(artist, admin_user):
    """Two unread and one read notification for Ana, one for the admin."""
    older = Notification.objects.create(user=artist.user, message="older", url="/me/")
    newer = Notification.objects.create(user=artist.user, message="newer", url="/me/")
    seen = Notification.objects.create(user=artist.user, message="seen")
    service.mark_read(artist.user, [seen.pk])
    Notification.objects.create(user=admin_user, message="for the admin")
    return [older, newer, seen]


def test_list_is_own_only_newest_first_with_read_flag(artist_api, notes):
    rows = artist_api.get(URL).json()["results"]
    assert [(r["message"], r["read"]) for r in rows] == [("seen", True), ("newer", False), ("older", False)]
    assert rows[1]["url"] == "/me/"


@pytest.mark.parametrize(("query", "messages"), [
    ("?read=false", ["newer", "older"]),
    ("?read=true", ["seen"]),
])
def test_filter_unread_and_read(artist_api, notes, query, messages):
    assert [r["message"] for r in artist_api.get(URL + query).json()["results"]] == messages


def test_a_bad_filter_value_says_so(artist_api, notes):
    response = artist_api.get(URL + "?read=maybe")
    assert response.status_code == 400
    assert "Select a valid choice. maybe is not one of the available choices." in str(response.json()["read"])


def test_read_all_marks_only_own_unread(artist_api, admin_user, notes):
    response = artist_api.post(URL + "read-all/")
    assert response.json() == {"marked": 2}
    assert artist_api.get(URL + "?read=false").json()["count"] == 0
    assert Notification.objects.filter(user=admin_user, read_at__isnull=True).count() == 1
    assert artist_api.post(URL + "read-all/").json() == {"marked": 0}


def test_read_one(artist_api, admin_api, notes):
    older = notes[0]
    assert admin_api.post(f"{URL}{older.pk}/read/").status_code == 404  # admins too read only their own
    body = artist_api.post(f"{URL}{older.pk}/read/").json()
    assert body["read"] is True
    assert body["read_at"]
    assert [r["message"] for r in artist_api.get(URL + "?read=false").json()["results"]] == ["newer"]


def test_opening_the_page_marks_them_read_and_highlights_the_new_ones(artist, notes):
    ana = _client(artist.user)
    assert badge(ana.get("/me/").content.decode(), "notifications") == "2"
    page = ana.get("/notifications/").content.decode()
    assert len(re.findall(r'<li data-notification="\d+" class="unread">', page)) == 2
    assert badge(page, "notifications") is None  # read now, so the badge is gone on this very page
    assert not Notification.objects.filter(user=artist.user, read_at__isnull=True).exists()
    again = ana.get("/notifications/").content.decode()
    assert 'class="unread"' not in again
    assert "older" in again


def test_admin_sees_pending_requests_and_unread_badges(fleet_world, admin_user):
    admin = _client(admin_user)
    assert badge(admin.get("/requests/").content.decode(), "requests") is None
    service.file_request(fleet_world.vm_a, fleet_world.ana.user, profile("RTX6000-24Q"), 1, "bigger")
    request = service.file_request(fleet_world.vm_b, fleet_world.bob.user, profile("RTX6000-24Q"), 1, "bigger too")
    page = admin.get("/").content.decode()
    assert badge(page, "requests") == "2"
    assert badge(page, "notifications") == "2"  # one per filed request
    service.reject(request, admin_user, "no room this month")
    assert badge(admin.get("/").content.decode(), "requests") == "1"
    ana = _client(fleet_world.ana.user).get("/me/").content.decode()
    assert badge(ana, "requests") is None  # artists have no queue
    bob = _client(fleet_world.bob.user).get("/me/").content.decode()
    assert badge(bob, "notifications") == "1"  # the rejection


def test_badges_cost_one_query_and_nothing_for_anonymous(fleet_world, admin_user, django_assert_num_queries):
    ResizeRequest.objects.create(vm=fleet_world.vm_a, requested_profile=profile("RTX6000-24Q"), reason="x")
    Notification.objects.create(user=admin_user, message="hello")
    admin = _client(admin_user)
    from django.template import engines
    template = engines["django"].from_string("{{ badges.pending }}/{{ badges.unread }}")
    request = admin.get("/requests/").wsgi_request
    with django_assert_num_queries(1):
        assert template.render({}, request) == "1/1"
    anonymous = Client().get("/login/").wsgi_request
    with django_assert_num_queries(0):
        assert template.render({}, anonymous) == "0/0"


def test_pages_without_badges_pay_nothing(fleet_world, admin_user, django_assert_num_queries):
    """The counts are lazy: a template that shows no badge runs no query for them."""
    from django.template import engines
    request = _client(admin_user).get("/requests/").wsgi_request
    with django_assert_num_queries(0):
        engines["django"].from_string("no badges here").render({}, request)

"""Who may do what on every resize-request and notification endpoint, API and pages
(DESIGN.md "Roles"): anonymous, the artist (Ana), another artist (Bob), an admin, and API
tokens (an automation user with staff rights, and Ana's own token).

Each row names the status and what changed: a refusal must leave the request as it was.
"""

from dataclasses import dataclass
from typing import Any

import pytest
from django.test import Client
from rest_framework.test import APIClient

from fleet import requests as service
from fleet.api_tokens import issue_token
from fleet.choices import ResizeStatus
from fleet.models import Notification, ResizeRequest
from fleet.request_preview import preview
from fleet.tests.factories import UserFactory, VirtualMachineFactory, profile

ROLES = ["anonymous", "artist", "other_artist", "admin", "token", "artist_token"]
API = "/api/v1/"


@pytest.fixture
def world(fleet_world, admin_user):
    """Ana's pending request (on a second VM of hers) and one notification for each of Ana and
    the admin; Ana's first VM is free to file for."""
    second = VirtualMachineFactory(name="ws-ana-2", artist=fleet_world.ana)
    fleet_world.request = service.file_request(second, fleet_world.ana.user, profile("RTX6000-12Q"), 1, "a second VM")
    fleet_world.note = Notification.objects.create(user=fleet_world.ana.user, message="for Ana")
    fleet_world.admin_note = Notification.objects.get(user=admin_user)
    fleet_world.admin = admin_user
    fleet_world.bot = UserFactory(username="ci-bot", is_staff=True)
    return fleet_world


def api_client(role: str, w) -> APIClient:
    client = APIClient()
    users = {"artist": w.ana.user, "other_artist": w.bob.user, "admin": w.admin}
    if role in users:
        client.force_login(users[role])
    elif role in ("token", "artist_token"):
        user = w.bot if role == "token" else w.ana.user
        client.credentials(HTTP_AUTHORIZATION=f"Token {issue_token(user)[1]}")
    return client


@dataclass(frozen=True)
class Call:
    method: str
    path: Any  # world -> path
    body: dict | None = None


def _status(w) -> str:
    w.request.refresh_from_db()
    return w.request.status


ENDPOINTS = {
    "list": Call("get", lambda w: f"{API}resize-requests/"),
    "create": Call("post", lambda w: f"{API}resize-requests/",
                   {"vm": "vm_a", "requested_profile": "RTX6000-24Q", "reason": "bigger scenes"}),
    "retrieve": Call("get", lambda w: f"{API}resize-requests/{w.request.pk}/"),
    "approve": Call("post", lambda w: f"{API}resize-requests/{w.request.pk}/approve/", {"comment": "ok"}),
    "reject": Call("post", lambda w: f"{API}resize-requests/{w.request.pk}/reject/", {"comment": "not now"}),
    "cancel": Call("post", lambda w: f"{API}resize-requests/{w.request.pk}/cancel/"),
    "notifications": Call("get", lambda w: f"{API}notifications/"),
    "notification": Call("get", lambda w: f"{API}notifications/{w.note.pk}/"),
    "notification-read": Call("post", lambda w: f"{API}notifications/{w.note.pk}/read/"),
    "notifications-read-all": Call("post", lambda w: f"{API}notifications/read-all/"),
}

# endpoint -> status per role, in ROLES order
API_MATRIX = {
    "list":                   [401, 200, 200, 200, 200, 200],
    "create":                 [401, 201, 403, 201, 201, 201],
    "retrieve":               [401, 200, 404, 200, 200, 200],
    "approve":                [401, 403, 403, 200, 200, 403],
    "reject":                 [401, 403, 403, 200, 200, 403],
    "cancel":                 [401, 200, 404, 200, 200, 200],
    "notifications":          [401, 200, 200, 200, 200, 200],
    "notification":           [401, 200, 404, 404, 404, 200],
    "notification-read":      [401, 200, 404, 404, 404, 200],
    "notifications-read-all": [401, 200, 200, 200, 200, 200],
}

# What a request's status is after each decision, when the call was allowed.
AFTER = {"approve": ResizeStatus.APPROVED, "reject": ResizeStatus.REJECTED, "cancel": ResizeStatus.CANCELLED}


@pytest.mark.parametrize("endpoint", API_MATRIX)
@pytest.mark.parametrize("role", ROLES)
def test_api_role_matrix(world, endpoint, role):
    call = ENDPOINTS[endpoint]
    body = dict(call.body or {})
    if endpoint == "create":
        body.update(vm=world.vm_a.pk, requested_profile=profile("RTX6000-24Q").pk)
    response = getattr(api_client(role, world), call.method)(call.path(world), body, format="json")
    expected = API_MATRIX[endpoint][ROLES.index(role)]
    assert response.status_code == expected, response.content
    allowed = expected < 400
    if endpoint in AFTER:
        assert _status(world) == (AFTER[endpoint] if allowed else ResizeStatus.PENDING)
    if endpoint == "create":
        assert ResizeRequest.objects.filter(vm=world.vm_a).exists() == allowed
    if endpoint in ("notification-read", "notifications-read-all"):
        world.note.refresh_from_db()
        assert (world.note.read_at is not None) == (role in ("artist", "artist_token"))


@pytest.mark.parametrize("role", ROLES[1:])
def test_api_lists_show_only_what_the_role_may_see(world, role):
    """Artists see their own requests only (Bob: none); admins and the automation token see all.
    Notifications are everyone's own, admins' included."""
    client = api_client(role, world)
    requests = [r["id"] for r in client.get(f"{API}resize-requests/").json()["results"]]
    assert requests == {"other_artist": []}.get(role, [world.request.pk])
    messages = [n["message"] for n in client.get(f"{API}notifications/").json()["results"]]
    expected = {"artist": ["for Ana"], "artist_token": ["for Ana"], "admin": [world.admin_note.message]}
    assert messages == expected.get(role, [])


def page_client(role: str, w) -> Client:
    client = Client()
    users = {"artist": w.ana.user, "other_artist": w.bob.user, "admin": w.admin}
    if role in users:
        client.force_login(users[role])
    elif role in ("token", "artist_token"):  # pages take sessions only: a token is nobody there
        user = w.bot if role == "token" else w.ana.user
        client.defaults["HTTP_AUTHORIZATION"] = f"Token {issue_token(user)[1]}"
    return client


PAGES = {
    "queue": Call("get", lambda w: "/requests/"),
    "approve": Call("post", lambda w: f"/requests/{w.request.pk}/approve/", {"comment": "ok"}),
    "reject": Call("post", lambda w: f"/requests/{w.request.pk}/reject/", {"comment": "not now"}),
    "cancel": Call("post", lambda w: f"/requests/{w.request.pk}/cancel/"),
    "file": Call("post", lambda w: f"/me/vms/{w.vm_a.pk}/request/", {"change": "profile", "reason": "bigger"}),
    "notifications": Call("get", lambda w: "/notifications/"),
    "workstation": Call("get", lambda w: "/me/"),
}
LOGIN = "login"  # a redirect to the login page
PAGE_MATRIX = {
    "queue":         [LOGIN, 403, 403, 200, LOGIN, LOGIN],
    "approve":       [LOGIN, 403, 403, 302, LOGIN, LOGIN],
    "reject":        [LOGIN, 403, 403, 302, LOGIN, LOGIN],
    "cancel":        [LOGIN, 302, 403, 302, LOGIN, LOGIN],
    "file":          [LOGIN, 302, 403, 302, LOGIN, LOGIN],
    "notifications": [LOGIN, 200, 200, 200, LOGIN, LOGIN],
    "workstation":   [LOGIN, 200, 200, 200, LOGIN, LOGIN],
}


@pytest.mark.parametrize("page", PAGE_MATRIX)
@pytest.mark.parametrize("role", ROLES)
def test_page_role_matrix(world, page, role):
    call = PAGES[page]
    body = dict(call.body or {})
    if page == "file":
        body["requested_profile"] = profile("RTX6000-24Q").pk
    if page == "approve":  # what the confirm step posts
        body.update(confirm="on", fingerprint=preview(world.request).fingerprint)
    response = getattr(page_client(role, world), call.method)(call.path(world), body)
    expected = PAGE_MATRIX[page][ROLES.index(role)]
    if expected == LOGIN:
        assert response.status_code == 302
        assert response["Location"].startswith("/login/?next=")
    else:
        assert response.status_code == expected
    allowed = expected in (200, 302)
    if page in AFTER:
        assert _status(world) == (AFTER[page] if allowed else ResizeStatus.PENDING)
    if page == "file":
        assert ResizeRequest.objects.filter(vm=world.vm_a).exists() == allowed
    if page == "notifications" and allowed:
        body = response.content.decode()
        assert ("for Ana" in body) == (role == "artist")
    if page == "workstation" and allowed:
        assert ("ws-ana-2" in response.content.decode()) == (role == "artist")

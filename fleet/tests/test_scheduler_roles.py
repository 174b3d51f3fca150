"""Who may use the scheduler, on every API route and page: anonymous callers get 401 (API) or the
login page, artists 403 whatever they ask, admins by session and staff API tokens get through.
A refused caller changes nothing and leaves no audit event."""

from __future__ import annotations

import pytest
from django.test import Client
from django.urls import reverse
from rest_framework.test import APIClient

from fleet.api_tokens import issue_token
from fleet.models import AuditEvent, SchedulerPolicy
from fleet.tests.factories import GpuFactory, HostFactory, UserFactory

pytestmark = pytest.mark.django_db

ADMINS_ONLY_API = "Only fleet admins (staff) may see or change GPU scheduler policies."
EQUAL_ARR = {"policy": "equal_share", "arr": True}


@pytest.fixture
def gpu():
    return GpuFactory(host=HostFactory(name="roles-host", hypervisor="kvm"), pci_bus_id="00000000:86:00.0")


def api_calls(gpu) -> list[tuple[str, str, dict | None, int]]:
    """(method, route, body, status for an admin) of every scheduler API route and method; apply/
    is a 409 for an admin here because no agent polls the host (the permission let it through)."""
    calls = []
    for route in (f"/api/v1/gpus/{gpu.pk}/scheduler/", f"/api/v1/hosts/{gpu.host_id}/scheduler/",
                  f"/api/v1/gpu-models/{gpu.gpu_model_id}/scheduler/"):
        calls += [("get", route, None, 200), ("put", route, EQUAL_ARR, 200), ("delete", route, None, 200)]
    calls.append(("post", f"/api/v1/gpus/{gpu.pk}/scheduler/apply/", None, 409))
    return calls


def call(client, method: str, route: str, body: dict | None):
    if body is None:
        return getattr(client, method)(route)
    return getattr(client, method)(route, body, format="json")


def token_client(user) -> APIClient:
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Token {issue_token(user)[1]}")
    return client


def assert_nothing_changed():
    assert not SchedulerPolicy.objects.exists()
    assert not AuditEvent.objects.filter(action__startswith="scheduler_policy").exists()


def test_api_anonymous_gets_401_everywhere(api, gpu):
    for method, route, body, _ in api_calls(gpu):
        response = call(api, method, route, body)
        assert response.status_code == 401, (method, route)
        assert response.json() == {"detail": "Authentication credentials were not provided."}
    assert_nothing_changed()


@pytest.mark.parametrize("auth", ["session", "token"])
def test_api_artist_gets_403_everywhere(artist, gpu, auth):
    if auth == "token":
        client = token_client(artist.user)
    else:
        client = APIClient()
        client.force_login(artist.user)
    for method, route, body, _ in api_calls(gpu):
        response = call(client, method, route, body)
        assert response.status_code == 403, (method, route)
        assert response.json() == {"detail": ADMINS_ONLY_API}
    assert_nothing_changed()


@pytest.mark.parametrize("auth", ["session", "token"])
def test_api_admin_by_session_or_staff_token_gets_through_everywhere(admin_user, gpu, auth):
    if auth == "token":
        client = token_client(admin_user)
    else:
        client = APIClient()
        client.force_login(admin_user)
    for method, route, body, status in api_calls(gpu):
        response = call(client, method, route, body)
        assert response.status_code == status, (method, route, response.content)
    # Every PUT and DELETE left its audit event, by the admin through the API.
    actions = list(AuditEvent.objects.filter(action__startswith="scheduler_policy").order_by("pk")
                   .values_list("action", "actor_name", "source"))
    assert actions == [("scheduler_policy.update", "admin", "api"), ("scheduler_policy.delete", "admin", "api")] * 3


def test_api_token_of_a_non_staff_user_without_an_artist_gets_403(gpu):
    client = token_client(UserFactory(username="robot"))
    response = client.put(f"/api/v1/gpus/{gpu.pk}/scheduler/", EQUAL_ARR, format="json")
    assert (response.status_code, response.json()) == (403, {"detail": ADMINS_ONLY_API})
    assert_nothing_changed()


def page_calls(gpu) -> list[tuple[str, str, dict | None, int]]:
    """(method, url, form, status for an admin) of every scheduler page and form action."""
    return [
        ("get", "/scheduler/", None, 200),
        ("get", f"/scheduler/gpus/{gpu.pk}/", None, 200),
        ("get", f"/scheduler/gpus/{gpu.pk}/box/", None, 200),
        ("get", f"/scheduler/hosts/{gpu.host_id}/", None, 200),
        ("get", f"/scheduler/models/{gpu.gpu_model_id}/", None, 200),
        ("post", f"/scheduler/gpus/{gpu.pk}/", {"policy": "equal_share", "arr": "on"}, 302),
        ("post", f"/scheduler/gpus/{gpu.pk}/apply/", {}, 302),
        ("post", f"/scheduler/gpus/{gpu.pk}/clear/", {}, 302),
        ("post", f"/scheduler/hosts/{gpu.host_id}/", {"policy": "equal_share"}, 302),
        ("post", f"/scheduler/models/{gpu.gpu_model_id}/", {"policy": "best_effort"}, 302),
    ]


def page(client, method: str, url: str, form: dict | None):
    return client.get(url) if method == "get" else client.post(url, form)


def test_pages_send_anonymous_to_the_login_page(gpu):
    client = Client()
    login = reverse("login")
    for method, url, form, _ in page_calls(gpu):
        response = page(client, method, url, form)
        assert response.status_code == 302, (method, url)
        assert response["Location"].startswith(f"{login}?next="), (method, url)
    assert_nothing_changed()


def test_pages_refuse_artists_with_403(artist, gpu):
    client = Client()
    client.force_login(artist.user)
    for method, url, form, _ in page_calls(gpu):
        assert page(client, method, url, form).status_code == 403, (method, url)
    assert_nothing_changed()


def test_pages_serve_admins(admin_user, gpu):
    client = Client()
    client.force_login(admin_user)
    for method, url, form, status in page_calls(gpu):
        response = page(client, method, url, form)
        assert response.status_code == status, (method, url)
    actions = list(AuditEvent.objects.filter(action__startswith="scheduler_policy").order_by("pk")
                   .values_list("action", "source"))
    assert actions == [("scheduler_policy.update", "web"), ("scheduler_policy.delete", "web"),
                       ("scheduler_policy.update", "web"), ("scheduler_policy.update", "web")]

"""Sign-in throttling (django-axes, config/lockout.py): five failed sign-ins for one user name
from one address lock that pair out; the sixth is refused even with the right password and the
page says how long to wait. Other users, other addresses and API tokens are unaffected; the
lockout ends after the cool-off or when an admin resets it."""

from __future__ import annotations

from datetime import timedelta

import pytest
from axes.models import AccessAttempt
from django.core.management import call_command
from django.test import Client
from rest_framework.authtoken.models import Token

from fleet.tests.factories import UserFactory

pytestmark = pytest.mark.django_db

PASSWORD = "pass-word-123"  # UserFactory's
OFFICE = "10.1.0.15"
OTHER_DESK = "10.1.0.99"
LOCKED = "Too many failed sign-ins; try again in 15 minutes."


def sign_in(username: str, password: str, addr: str = OFFICE, url: str = "/login/"):
    client = Client(REMOTE_ADDR=addr)
    response = client.post(url, {"username": username, "password": password, "next": "/me/"})
    return client, response


def fail(username: str, times: int, addr: str = OFFICE) -> None:
    """`times` wrong passwords; the fifth already answers with the lockout."""
    for attempt in range(1, times + 1):
        _, response = sign_in(username, "wrong-password", addr)
        if attempt < 5:
            assert response.status_code == 200
            assert "didn't match" in response.content.decode()
        else:
            assert response.status_code == 429


def signed_in(client: Client) -> bool:
    return client.get("/me/").status_code == 200


@pytest.fixture
def ana():
    return UserFactory(username="ana")


def test_the_sixth_sign_in_is_refused_even_with_the_right_password(ana):
    fail("ana", 5)

    client, response = sign_in("ana", PASSWORD)

    assert response.status_code == 429
    page = response.content.decode()
    assert LOCKED in page
    assert 'value="ana"' in page  # the user name stays in the form
    assert "csrfmiddlewaretoken" in page
    assert not signed_in(client)


def test_four_failures_do_not_lock_and_a_success_clears_them(ana):
    fail("ana", 4)
    client, response = sign_in("ana", PASSWORD)
    assert response.status_code == 302
    assert signed_in(client)

    fail("ana", 4)  # counted afresh after the success
    client, _ = sign_in("ana", PASSWORD)
    assert signed_in(client)


def test_other_users_and_other_addresses_are_not_locked(ana):
    UserFactory(username="bob")
    fail("ana", 5)

    bob, _ = sign_in("bob", PASSWORD)
    ana_elsewhere, _ = sign_in("ana", PASSWORD, addr=OTHER_DESK)

    assert signed_in(bob)
    assert signed_in(ana_elsewhere)


def test_a_forwarded_for_header_does_not_change_the_address(ana):
    """A client cannot dodge the lockout by claiming another address in X-Forwarded-For."""
    fail("ana", 5)
    client = Client(REMOTE_ADDR=OFFICE, HTTP_X_FORWARDED_FOR=OTHER_DESK)
    response = client.post("/login/", {"username": "ana", "password": PASSWORD})
    assert response.status_code == 429


def test_the_admin_login_is_throttled_too(ana):
    for _ in range(5):
        sign_in("ana", "wrong-password", url="/admin/login/")
    _, response = sign_in("ana", PASSWORD, url="/admin/login/")
    assert response.status_code == 429
    assert LOCKED in response.content.decode()


def test_api_tokens_are_not_throttled(ana):
    """Automation signs in with tokens, which never count as sign-in failures: a locked-out
    user's token works, and wrong tokens lock nobody out."""
    token = Token.objects.create(user=ana)
    fail("ana", 5)
    api = Client(REMOTE_ADDR=OFFICE, HTTP_AUTHORIZATION=f"Token {token.key}")
    assert api.get("/api/v1/vms/").status_code == 200

    stranger = Client(REMOTE_ADDR=OTHER_DESK, HTTP_AUTHORIZATION="Token " + "0" * 40)
    for _ in range(10):
        assert stranger.get("/api/v1/vms/").status_code == 401
    client, _ = sign_in("ana", PASSWORD, addr=OTHER_DESK)
    assert signed_in(client)


def test_the_lockout_ends_after_the_cool_off(ana):
    fail("ana", 5)
    AccessAttempt.objects.update(attempt_time=AccessAttempt.objects.get().attempt_time - timedelta(minutes=16))

    client, response = sign_in("ana", PASSWORD)

    assert response.status_code == 302
    assert signed_in(client)


def test_the_cool_off_is_configurable_and_the_page_says_it(ana, settings):
    settings.AXES_COOLOFF_TIME = timedelta(minutes=30)
    fail("ana", 5)
    _, response = sign_in("ana", PASSWORD)
    assert "Too many failed sign-ins; try again in 30 minutes." in response.content.decode()


def test_an_admin_lifts_a_lockout_with_axes_reset_username(ana):
    fail("ana", 5)

    call_command("axes_reset_username", "ana")

    client, _ = sign_in("ana", PASSWORD)
    assert signed_in(client)

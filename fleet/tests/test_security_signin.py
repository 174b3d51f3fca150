"""Sign-in throttling (django-axes, config/lockout.py): five failed sign-ins for one user name
from one address lock that pair out; the sixth is refused even with the right password and the
page says how long to wait. Other users, other addresses and API tokens are unaffected; the
lockout ends after the cool-off or when an admin resets it. Behind a reverse proxy
(TRUSTED_PROXY_COUNT) each client is counted by the address the proxy saw, whatever it forges.

Password spraying (one guess at each of many names) locks the whole address after 30 failures,
without letting one user's mistakes or colleagues' corrected typos lock out a studio that shares
one NAT address; a locked-out admin gets back in with the commands docs/operations.md gives."""

from __future__ import annotations

from datetime import timedelta
from io import StringIO
from pathlib import Path

import pytest
from axes.models import AccessAttempt
from django.core.management import call_command
from django.test import Client
from django.utils import timezone

from config.lockout import client_address
from fleet.api_tokens import issue_token
from fleet.tests.factories import UserFactory

pytestmark = pytest.mark.django_db

ROOT = Path(__file__).resolve().parents[2]

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
    _, key = issue_token(ana)
    fail("ana", 5)
    api = Client(REMOTE_ADDR=OFFICE, HTTP_AUTHORIZATION=f"Token {key}")
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


# Behind a reverse proxy (TRUSTED_PROXY_COUNT) -----------------------------------------------------

PROXY = "172.18.0.2"  # nginx in front of gunicorn: every connection comes from it
MAYA_DESK = "10.1.0.21"
LEO_DESK = "10.1.0.22"


def through_proxy(username: str, password: str, forwarded_for: str):
    """A sign-in through the proxy, which appended the address it received it from."""
    client = Client(REMOTE_ADDR=PROXY, HTTP_X_FORWARDED_FOR=forwarded_for)
    return client, client.post("/login/", {"username": username, "password": password, "next": "/me/"})


@pytest.fixture
def one_proxy(settings):
    settings.TRUSTED_PROXY_COUNT = 1


def test_behind_one_proxy_each_client_is_counted_apart(ana, one_proxy):
    for _ in range(5):
        through_proxy("ana", "wrong-password", MAYA_DESK)

    _, at_maya = through_proxy("ana", PASSWORD, MAYA_DESK)
    leo, at_leo = through_proxy("ana", PASSWORD, LEO_DESK)

    assert at_maya.status_code == 429
    assert at_leo.status_code == 302, "another desk behind the same proxy is not locked out"
    assert signed_in(leo)
    assert list(AccessAttempt.objects.values_list("ip_address", flat=True)) == [MAYA_DESK]


def test_behind_one_proxy_a_forged_forwarded_for_entry_does_not_escape_the_lockout(ana, one_proxy):
    for _ in range(5):
        through_proxy("ana", "wrong-password", MAYA_DESK)

    # Maya's browser claims Leo's desk; the proxy appends the address it really saw.
    forged, response = through_proxy("ana", PASSWORD, f"{LEO_DESK}, {MAYA_DESK}")
    assert response.status_code == 429
    assert not signed_in(forged)
    # Nor do forged failures land on the desk they name.
    for _ in range(5):
        through_proxy("ana", "wrong-password", f"{LEO_DESK}, {MAYA_DESK}")
    leo, _ = through_proxy("ana", PASSWORD, LEO_DESK)
    assert signed_in(leo)


@pytest.mark.parametrize(("count", "forwarded_for", "counted"), [
    (0, "10.1.0.21", PROXY),  # no proxy trusted: the header is the client's to forge
    (1, "", PROXY),  # a connection that did not pass through the proxy
    (1, "10.1.0.22, 10.1.0.21", "10.1.0.21"),
    (2, "10.1.0.22, 10.1.0.21, 192.0.2.40", "10.1.0.21"),  # a CDN in front of nginx
    (2, "10.1.0.21", PROXY),  # fewer entries than proxies: not through all of them
    (1, "10.1.0.22, unknown", PROXY),  # a proxy that wrote no address
    (1, "2001:db8::21", "2001:db8::21"),
])
def test_the_counted_address_is_the_one_the_outermost_proxy_saw(settings, rf, count, forwarded_for, counted):
    settings.TRUSTED_PROXY_COUNT = count
    request = rf.post("/login/", REMOTE_ADDR=PROXY, HTTP_X_FORWARDED_FOR=forwarded_for)
    assert client_address(request) == counted


# Password spraying: many names from one address -------------------------------------------------

SPRAYER = "10.1.0.66"
ADDRESS_LOCKED = "Too many failed sign-ins from your network address; try again in 15 minutes."


def spray(names: int, addr: str = SPRAYER) -> list[int]:
    """One wrong guess at each of `names` user names (none of which exists); the statuses."""
    return [Client(REMOTE_ADDR=addr).post("/login/", {"username": f"staff{n:02d}", "password": "Winter2026!"})
            .status_code for n in range(names)]


def test_thirty_names_sprayed_from_one_address_lock_the_address_out(ana):
    assert spray(30) == [200] * 29 + [429]

    _, fresh = sign_in("nobody-tried-yet", "Winter2026!", addr=SPRAYER)
    client, right = sign_in("ana", PASSWORD, addr=SPRAYER)

    assert fresh.status_code == 429
    assert right.status_code == 429, "a real user's right password from the spraying address is refused too"
    assert ADDRESS_LOCKED in right.content.decode()
    assert not signed_in(client)


def test_another_address_is_not_affected_by_a_sprayer(ana):
    spray(30)

    client, response = sign_in("ana", PASSWORD, addr=OTHER_DESK)

    assert response.status_code == 302
    assert signed_in(client)


def test_a_forged_forwarded_for_does_not_escape_the_address_lockout(ana):
    """Without a trusted proxy the header is the client's to write: rotating it changes nothing."""
    statuses = [Client(REMOTE_ADDR=SPRAYER, HTTP_X_FORWARDED_FOR=f"192.0.2.{n}").post(
        "/login/", {"username": f"staff{n:02d}", "password": "Winter2026!"}).status_code for n in range(30)]
    assert statuses == [200] * 29 + [429]

    client = Client(REMOTE_ADDR=SPRAYER, HTTP_X_FORWARDED_FOR=OTHER_DESK)
    response = client.post("/login/", {"username": "ana", "password": PASSWORD, "next": "/me/"})
    assert response.status_code == 429
    assert not signed_in(client)


def test_behind_one_proxy_a_sprayer_is_locked_by_the_address_the_proxy_saw(ana, one_proxy):
    """Every connection comes from the proxy: the desk it names is locked, not the proxy, and
    entries the sprayer writes left of the proxy's own do not move the count elsewhere."""
    for n in range(30):
        through_proxy(f"staff{n:02d}", "Winter2026!", f"192.0.2.{n}, {MAYA_DESK}")

    _, at_maya = through_proxy("ana", PASSWORD, MAYA_DESK)
    leo, at_leo = through_proxy("ana", PASSWORD, LEO_DESK)

    assert at_maya.status_code == 429
    assert at_leo.status_code == 302, "another desk behind the same proxy signs in"
    assert signed_in(leo)


def test_one_user_hammering_a_locked_name_does_not_lock_the_studio_address(ana):
    """Behind one NAT address: a user who keeps trying after the name locked counts as one
    locked name, not as dozens of failures, so colleagues still sign in."""
    bob = UserFactory(username="bob")
    for _ in range(40):
        sign_in("ana", "wrong-password")

    client, response = sign_in(bob.username, PASSWORD)

    assert response.status_code == 302
    assert signed_in(client)


def test_typos_followed_by_a_good_sign_in_do_not_add_up(ana):
    """Forty colleagues each mistype once and then sign in: their failures no longer count, so
    the shared address takes 29 more failures before it locks."""
    for n in range(40):
        user = UserFactory(username=f"artist{n:02d}")
        sign_in(user.username, "typo")
        client, _ = sign_in(user.username, PASSWORD)
        assert signed_in(client)

    assert spray(30, addr=OFFICE) == [200] * 29 + [429]


def test_the_address_limit_is_configurable_and_zero_turns_it_off(ana, settings):
    settings.AXES_ADDRESS_FAILURE_LIMIT = 3
    assert spray(3) == [200, 200, 429]

    settings.AXES_ADDRESS_FAILURE_LIMIT = 0
    client, response = sign_in("ana", PASSWORD, addr=SPRAYER)
    assert response.status_code == 302
    assert signed_in(client)


def test_the_address_lockout_ends_after_the_cool_off(ana):
    spray(30)
    AccessAttempt.objects.update(attempt_time=timezone.now() - timedelta(minutes=16))

    client, response = sign_in("ana", PASSWORD, addr=SPRAYER)

    assert response.status_code == 302
    assert signed_in(client)


# The documented way back for a locked-out admin (docs/operations.md, README) ----------------------

DOCS = (ROOT / "docs" / "operations.md").read_text() + (ROOT / "README.md").read_text()


@pytest.fixture
def admin():
    return UserFactory(username="admin", is_staff=True, is_superuser=True)


def test_a_locked_out_admin_gets_back_in_with_the_documented_axes_reset_username(admin):
    assert "python manage.py axes_reset_username admin" in DOCS
    fail("admin", 5)
    _, refused = sign_in("admin", PASSWORD)
    assert refused.status_code == 429

    call_command("axes_reset_username", "admin", stdout=StringIO())

    client, response = sign_in("admin", PASSWORD)
    assert response.status_code == 302
    assert signed_in(client)


def test_an_admin_behind_a_locked_address_gets_back_in_with_the_documented_axes_reset_ip(admin):
    assert "python manage.py axes_reset_ip <address>" in DOCS
    spray(30, addr=OFFICE)
    _, refused = sign_in("admin", PASSWORD)
    assert refused.status_code == 429
    call_command("axes_reset_username", "admin", stdout=StringIO())
    _, still = sign_in("admin", PASSWORD)
    assert still.status_code == 429, "the address, not the name, is locked"
    listing = StringIO()
    call_command("axes_list_attempts", stdout=listing)
    assert OFFICE in listing.getvalue()  # where the documented listing shows the address to reset

    call_command("axes_reset_ip", OFFICE, stdout=StringIO())

    client, response = sign_in("admin", PASSWORD)
    assert response.status_code == 302
    assert signed_in(client)

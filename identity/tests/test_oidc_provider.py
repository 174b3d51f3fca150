"""Signing in through a real OpenID Connect provider (django-oauth-toolkit in a process of its own,
identity/tests/oidc_provider/): its login page, its authorization code with PKCE, its RS256 ID
token checked against its published keys, its userinfo endpoint, and its own session, which
renews the dashboard's without a prompt. The dashboard is the test client here (the browser
tests drive Chromium through the same flow): every call between the two sites is real HTTP.
"""

from __future__ import annotations

import io

import pytest
from django.contrib.auth.models import User
from django.core.management import call_command
from django.test import Client

from fleet.models import Artist
from fleet.tests.factories import UserFactory, VirtualMachineFactory
from identity.models import DirectoryAccount
from identity.roles import NO_ROLE
from identity.tests.oidc_support import (
    ADMINS,
    ARTISTS,
    DISPLAY_NAME,
    Person,
    back_at_dashboard,
    oidc_enabled,
    sign_in_through,
)

pytestmark = pytest.mark.django_db
REFUSED = NO_ROLE.format(directory=DISPLAY_NAME)
NAT = "10.20.30.40"  # the studio's one address, as the dashboard sees it


@pytest.fixture
def provider(oidc_provider):
    """The dashboard configured for the test provider."""
    with oidc_enabled(oidc_provider.env()):
        yield oidc_provider


def renew(client, person: Person, path: str = "/"):
    """The ID token's renewal time has passed: the next page goes by the provider (no prompt while
    its session lasts) and back through the callback. Returns the callback's response."""
    session = client.session
    session["oidc_id_token_expiration"] = 0
    session.save()
    response = client.get(path)
    assert response.status_code == 302, response
    assert "prompt=none" in response["Location"]
    return back_at_dashboard(client, person.at_provider(response["Location"]))


def test_an_admin_signs_in_and_lands_on_the_fleet_overview(provider, client, fleet_world):
    sub = provider.put_user("ada", groups=(ADMINS,), email="ada@studio.example", first_name="Ada",
                            last_name="Lovelace")
    response = sign_in_through(client, Person("ada"))
    assert response["Location"] == "/"
    page = client.get("/").content.decode()
    assert "<h1>Fleet overview</h1>" in page
    assert 'id="overview-live"' in page
    user = User.objects.get(username="ada")
    assert (user.is_staff, user.email, user.get_full_name()) == (True, "ada@studio.example", "Ada Lovelace")
    account = DirectoryAccount.objects.get(user=user)
    assert (account.source, account.subject, account.role, account.groups) == ("oidc", sub, "admin", [ADMINS])


def test_an_artist_signs_in_and_sees_only_their_vm(provider, client, fleet_world):
    provider.put_user("nina", groups=(ARTISTS,), first_name="Nina", last_name="Lindqvist")
    response = sign_in_through(client, Person("nina"), next_path="/me/")
    assert response["Location"] == "/me/"
    artist = Artist.objects.get(user__username="nina")
    VirtualMachineFactory(name="ws-nina", artist=artist)
    page = client.get("/me/").content.decode()
    assert "ws-nina" in page
    assert "ws-ana" not in page
    assert "ws-bob" not in page
    assert client.get(f"/vms/{fleet_world.vm_a.pk}/").status_code == 404
    assert client.get("/hosts/").status_code == 403


def test_someone_in_neither_group_is_refused_on_the_login_page(provider, client):
    provider.put_user("mallory", groups=("render-wranglers",))
    response = sign_in_through(client, Person("mallory"))
    assert response["Location"] == "/login/"
    page = client.get("/login/").content.decode()
    assert REFUSED.replace("'", "&#x27;") in page
    assert "Sign in with Studio SSO" in page
    assert not User.objects.filter(username="mallory").exists()
    assert client.get("/")["Location"] == "/login/?next=/"


def test_removal_from_the_groups_signs_out_at_the_next_renewal(provider, client, fleet_world):
    provider.put_user("ada", groups=(ADMINS,))
    person = Person("ada")
    sign_in_through(client, person)
    assert client.get("/hosts/").status_code == 200
    provider.put_user("ada", groups=())  # IT takes Ada out of the admins' group
    response = renew(client, person, "/hosts/")
    assert response["Location"] == "/login/"
    assert REFUSED.replace("'", "&#x27;") in client.get("/login/").content.decode()
    user = User.objects.get(username="ada")
    assert not user.is_active
    assert DirectoryAccount.objects.get(user=user).refused_reason
    assert client.get("/hosts/")["Location"] == "/login/?next=/hosts/"


def test_a_renewal_keeps_the_role_in_step(provider, client, fleet_world):
    provider.put_user("ada", groups=(ADMINS,))
    person = Person("ada")
    sign_in_through(client, person)
    provider.put_user("ada", groups=(ARTISTS,), first_name="Ada")
    assert renew(client, person, "/hosts/")["Location"] == "/hosts/"  # back where she was going
    assert client.get("/hosts/").status_code == 403  # an artist now
    assert not User.objects.get(username="ada").is_staff
    assert client.get("/me/").status_code == 200


def test_signed_out_at_the_provider_is_signed_out_at_the_next_renewal(provider, client):
    provider.put_user("ada", groups=(ADMINS,))
    sign_in_through(client, Person("ada"))
    elsewhere = Person("ada")  # a browser without the provider's session: its login_required answer
    assert renew(client, elsewhere, "/hosts/")["Location"] == "/login/"
    assert client.get("/hosts/")["Location"] == "/login/?next=/hosts/"
    assert User.objects.get(username="ada").is_active


def test_an_account_made_before_the_provider_is_linked_by_user_name(provider, client):
    local = UserFactory(username="bruno", is_staff=False)
    provider.put_user("bruno", groups=(ADMINS,), email="bruno@studio.example")
    sign_in_through(client, Person("bruno"))
    local.refresh_from_db()
    assert local.is_staff
    assert User.objects.filter(username__iexact="bruno").count() == 1
    assert DirectoryAccount.objects.get(user=local).source == "oidc"


def test_refusals_do_not_lock_the_studio_out(provider, fleet_world):
    """Refused sign-ins are not password failures: a studio behind one address, where several
    people are not in a group yet, still signs in (django-axes counts the password form only)."""
    for n in range(7):  # more than AXES_FAILURE_LIMIT, each from a browser of its own
        provider.put_user(f"new-{n}", groups=())
        assert sign_in_through(Client(REMOTE_ADDR=NAT), Person(f"new-{n}"))["Location"] == "/login/"
    provider.put_user("ada", groups=(ADMINS,))
    admin = Client(REMOTE_ADDR=NAT)
    assert sign_in_through(admin, Person("ada"))["Location"] == "/"
    assert admin.get("/hosts/").status_code == 200


def test_oidc_discover_prints_the_providers_variables(oidc_provider):
    out = io.StringIO()
    call_command("oidc_discover", f"{oidc_provider.url}/o", stdout=out)
    lines = dict(line.split("=", 1) for line in out.getvalue().splitlines() if not line.startswith("#"))
    env = oidc_provider.env()
    for name in ("OIDC_OP_AUTHORIZATION_ENDPOINT", "OIDC_OP_TOKEN_ENDPOINT", "OIDC_OP_USER_ENDPOINT",
                 "OIDC_OP_JWKS_ENDPOINT"):
        assert lines[name] == env[name]
    assert lines["OIDC_RP_SIGN_ALGO"] == "RS256"
    assert "OIDC_RP_SCOPES=openid email profile groups" in out.getvalue()

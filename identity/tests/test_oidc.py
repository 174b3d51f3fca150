"""OpenID Connect without the provider: the settings config/settings.py makes from the environment
(off unless configured, clear errors when half configured), the routes and the login page with it
on and off, what the backend makes of a provider's claims (role, which user, deactivation), the
session renewal's answers, and the sign-in failing cleanly when the provider cannot be reached.

The sign-in through the real provider is in test_oidc_provider.py, in Chromium in
test_oidc_browser.py. Here the backend is handed the claims a provider would send, through the
hooks mozilla-django-oidc calls once it has checked the ID token (`sign_in_with`).
"""

from __future__ import annotations

import re
from urllib.parse import parse_qs, urlsplit

import pytest
from axes.models import AccessAttempt
from django.contrib.auth.models import AnonymousUser, User
from django.contrib.messages import get_messages
from django.contrib.messages.storage.fallback import FallbackStorage
from django.contrib.sessions.backends.db import SessionStore
from django.core.exceptions import ImproperlyConfigured, SuspiciousOperation
from django.test import Client, RequestFactory
from django.urls import resolve

from fleet.models import Artist
from fleet.tests.factories import ArtistFactory, UserFactory
from identity.models import DirectoryAccount
from identity.oidc import (
    FAILED,
    NO_USERNAME,
    TAKEN,
    OidcBackend,
    claim,
    email_verified,
    groups_of,
    identity_from_claims,
    unthrottled,
)
from identity.roles import NO_ROLE, Role
from identity.tests.oidc_support import ADMINS, ARTISTS, DISPLAY_NAME, oidc_enabled, oidc_settings, unreachable_env

REFUSED = NO_ROLE.format(directory=DISPLAY_NAME)
BACKEND = "identity.oidc.OidcBackend"


@pytest.fixture
def oidc_on():
    """OIDC configured for a provider at a closed port (no sign-in reaches it here)."""
    with oidc_enabled(unreachable_env()) as configured:
        yield configured


# --- settings from the environment --------------------------------------------------------------


def test_off_unless_a_client_id_is_set():
    configured = oidc_settings({"OIDC_RP_CLIENT_ID": "", "OIDC_OP_TOKEN_ENDPOINT": "https://sso.example/token"})
    assert configured["OIDC_ENABLED"] is False
    assert "identity.oidc.SessionRefresh" not in configured["MIDDLEWARE"]
    assert BACKEND not in configured["AUTHENTICATION_BACKENDS"]
    assert "OIDC_OP_TOKEN_ENDPOINT" not in configured
    assert configured["CONTENT_SECURITY_POLICY"]["DIRECTIVES"]["form-action"] == ["'self'"]


def test_on_with_a_client_id_and_its_defaults():
    configured = oidc_settings(unreachable_env(OIDC_DISPLAY_NAME=""))
    assert configured["OIDC_ENABLED"] is True
    assert configured["OIDC_RP_SIGN_ALGO"] == "RS256"
    assert configured["OIDC_RP_SCOPES"] == "openid email profile"
    assert configured["OIDC_GROUPS_CLAIM"] == "groups"
    assert configured["OIDC_USERNAME_CLAIM"] == "preferred_username"
    assert configured["OIDC_ADMIN_GROUP"] == ADMINS
    assert configured["OIDC_ARTIST_GROUPS"] == [ARTISTS, "lookdev"]
    assert configured["OIDC_DISPLAY_NAME"] == "single sign-on"
    assert configured["OIDC_RENEW_ID_TOKEN_EXPIRY_SECONDS"] == 900
    assert configured["OIDC_USE_PKCE"] is True
    assert configured["OIDC_TOKEN_USE_BASIC_AUTH"] is False
    # The renewal runs right after the session's user is known; the password form keeps working.
    middleware = configured["MIDDLEWARE"]
    assert middleware[middleware.index("django.contrib.auth.middleware.AuthenticationMiddleware") + 1] == \
        "identity.oidc.SessionRefresh"
    assert configured["AUTHENTICATION_BACKENDS"] == ["config.lockout.SignInThrottleBackend",
                                                     "django.contrib.auth.backends.ModelBackend", BACKEND]
    assert configured["CONTENT_SECURITY_POLICY"]["DIRECTIVES"]["form-action"] == ["'self'", "http://127.0.0.1:9"]


@pytest.mark.parametrize("name", ["OIDC_OP_AUTHORIZATION_ENDPOINT", "OIDC_OP_TOKEN_ENDPOINT", "OIDC_OP_USER_ENDPOINT",
                                  "OIDC_OP_JWKS_ENDPOINT"])
def test_a_missing_endpoint_is_named(name):
    with pytest.raises(ImproperlyConfigured, match=f"^{name} must be set when OIDC_RP_CLIENT_ID is"):
        oidc_settings(unreachable_env(**{name: ""}))


@pytest.mark.parametrize(("env", "message"), [
    ({"OIDC_RP_CLIENT_SECRET": ""}, "OIDC_RP_CLIENT_SECRET (or OIDC_RP_CLIENT_SECRET_FILE) must be set"),
    ({"OIDC_OP_TOKEN_ENDPOINT": "sso.example/token"},
     "OIDC_OP_TOKEN_ENDPOINT='sso.example/token' is not an http(s) URL"),
    ({"OIDC_RP_SIGN_ALGO": "PS256"}, "OIDC_RP_SIGN_ALGO='PS256' is not one of RS256"),
    ({"OIDC_RP_SCOPES": "email profile"}, "OIDC_RP_SCOPES='email profile' must include openid"),
    ({"OIDC_ADMIN_GROUP": "", "OIDC_ARTIST_GROUPS": ""},
     "OIDC_ADMIN_GROUP or OIDC_ARTIST_GROUPS (or both) must be set"),
    ({"OIDC_RENEW_ID_TOKEN_EXPIRY_SECONDS": "5"}, "OIDC_RENEW_ID_TOKEN_EXPIRY_SECONDS=5 must be 60 or more"),
    ({"OIDC_TOKEN_USE_BASIC_AUTH": "sometimes"}, "OIDC_TOKEN_USE_BASIC_AUTH='sometimes' is not a boolean"),
])
def test_a_half_configured_provider_stops_start_up_saying_what_is_wrong(env, message):
    with pytest.raises(ImproperlyConfigured, match=re.escape(message)):
        oidc_settings(unreachable_env(**env))


def test_the_client_secret_can_come_from_a_file_and_hs256_needs_no_keys(tmp_path):
    secret = tmp_path / "oidc_client_secret"
    secret.write_text("from-a-file\n")
    configured = oidc_settings(unreachable_env(OIDC_RP_CLIENT_SECRET="", OIDC_RP_CLIENT_SECRET_FILE=str(secret),
                                               OIDC_RP_SIGN_ALGO="hs256", OIDC_OP_JWKS_ENDPOINT=""))
    assert configured["OIDC_RP_CLIENT_SECRET"] == "from-a-file"
    assert configured["OIDC_RP_SIGN_ALGO"] == "HS256"
    assert configured["OIDC_OP_JWKS_ENDPOINT"] is None


# --- routes and the login page ------------------------------------------------------------------


@pytest.mark.django_db
def test_off_there_is_no_oidc_route_and_no_button(client):
    assert client.get("/oidc/authenticate/").status_code == 404
    page = client.get("/login/").content.decode()
    assert "Sign in with" not in page
    assert 'class="primary">Sign in</button>' in page


@pytest.mark.django_db
def test_on_the_login_page_offers_the_provider_above_the_local_form(oidc_on):
    page = Client().get("/login/?next=/vms/").content.decode()
    button = re.search(r'<a class="button primary sso" data-sign-in="oidc" href="([^"]+)">Sign in with Studio SSO</a>',
                       page)
    assert button, page
    assert button[1] == "/oidc/authenticate/?next=/vms/"
    assert page.index("Sign in with Studio SSO") < page.index('name="password"')  # break-glass accounts below


@pytest.mark.django_db
def test_the_button_sends_the_browser_to_the_provider_with_pkce(oidc_on):
    response = Client().get("/oidc/authenticate/", {"next": "/vms/"})
    location = urlsplit(response["Location"])
    query = parse_qs(location.query)
    assert response.status_code == 302
    assert f"{location.scheme}://{location.netloc}{location.path}" == oidc_on["OIDC_OP_AUTHORIZATION_ENDPOINT"]
    assert query["client_id"] == ["fleet"]
    assert query["scope"] == ["openid email profile"]
    assert query["redirect_uri"] == ["http://testserver/oidc/callback/"]
    assert query["code_challenge_method"] == ["S256"]
    assert query["state"]
    assert query["nonce"]


@pytest.mark.django_db
def test_an_unreachable_provider_is_a_message_on_the_login_page_not_a_server_error(oidc_on, caplog):
    client = Client(REMOTE_ADDR="10.20.30.40")
    for _ in range(7):  # more than AXES_FAILURE_LIMIT: the provider's failures are not throttled here
        state = parse_qs(urlsplit(client.get("/oidc/authenticate/")["Location"]).query)["state"][0]
        response = client.get("/oidc/callback/", {"code": "a-code", "state": state}, follow=True)
        assert response.redirect_chain == [("/login/", 302)]
        assert FAILED.format(provider=DISPLAY_NAME) in response.content.decode()
    assert "OpenID Connect sign-in failed: ConnectionError" in caplog.text
    assert not AccessAttempt.objects.exists()
    # The password form is throttled as before.
    for _ in range(5):
        client.post("/login/", {"username": "nobody", "password": "wrong"})
    assert client.post("/login/", {"username": "nobody", "password": "wrong"}).status_code == 429


@pytest.mark.django_db
def test_a_callback_without_a_sign_in_under_way_goes_back_to_the_login_page(oidc_on):
    client = Client()
    assert client.get("/oidc/callback/")["Location"] == "/login/"
    assert client.get("/oidc/callback/", {"code": "x", "state": "y"})["Location"] == "/login/"
    client.get("/oidc/authenticate/")
    assert client.get("/oidc/callback/", {"code": "x", "state": "forged"}).status_code == 400


def test_the_callback_alone_is_exempt_from_sign_in_throttling(oidc_on):
    callback, login = RequestFactory().get("/oidc/callback/"), RequestFactory().post("/login/")
    callback.resolver_match, login.resolver_match = resolve("/oidc/callback/"), resolve("/login/")
    assert unthrottled(callback, {}) is True
    assert unthrottled(login, {"username": "ana"}) is False


# --- claims to an identity (pure) ---------------------------------------------------------------


def test_groups_and_names_from_the_claims():
    identity = identity_from_claims(
        {"sub": "s-1", "preferred_username": " nina ", "given_name": "Nina", "family_name": "Lindqvist",
         "email": "nina@studio.example", "groups": ["Lookdev", ARTISTS]},
        admin_groups=(ADMINS,), artist_groups=(ARTISTS,))
    assert (identity.username, identity.first_name, identity.last_name) == ("nina", "Nina", "Lindqvist")
    assert identity.groups == ("Lookdev", ARTISTS)
    assert identity.role == Role.ARTIST
    assert identity.subject == "s-1"
    assert identity.source == "oidc"


@pytest.mark.parametrize(("claims", "claim_name", "role"), [
    ({"groups": ["FLEET-ADMINS", ARTISTS]}, "groups", Role.ADMIN),  # admin first; names compared without case
    ({"groups": ARTISTS}, "groups", Role.ARTIST),  # a single group as a string
    ({"groups": []}, "groups", None),
    ({}, "groups", None),
    ({"groups": {"name": ADMINS}}, "groups", None),  # not a list of names
    ({"realm_access": {"roles": [ADMINS]}}, "realm_access.roles", Role.ADMIN),  # Keycloak's realm roles
    ({"https://studio.example/groups": [ARTISTS]}, "https://studio.example/groups", Role.ARTIST),  # a dotted name
])
def test_the_role_comes_from_the_groups_claim(claims, claim_name, role):
    identity = identity_from_claims({"sub": "s", "preferred_username": "x", **claims}, groups_claim=claim_name,
                                    admin_groups=(ADMINS,), artist_groups=(ARTISTS,))
    assert identity.role == role


def test_odd_claims():
    assert claim({"a": {"b": 1}}, "a.c") is None
    assert groups_of(["a", "", 7, None, {"x": 1}]) == ("a", "7")
    assert identity_from_claims({"sub": "s", "preferred_username": "x" * 151}).username == ""
    assert identity_from_claims({"sub": "s", "preferred_username": 42}).username == ""
    assert identity_from_claims({"sub": "s", "name": "Nina Lindqvist"}).first_name == "Nina Lindqvist"
    assert email_verified({"email_verified": "true"})
    assert not email_verified({"email_verified": False})
    assert not email_verified({})


# --- the backend: users, roles, refusals --------------------------------------------------------


def claims_of(username: str, *, groups=(ARTISTS,), sub: str | None = None, email: str = "", verified: bool = True,
              **extra) -> dict:
    return {"sub": sub or f"sub-{username}", "preferred_username": username, "email": email,
            "email_verified": verified, "given_name": username.title(), "family_name": "Doe",
            "groups": list(groups), **extra}


def sign_in_with(claims: dict, signed_in=None) -> tuple[User | None, list[str]]:
    """What the backend makes of the provider's `claims` (mozilla-django-oidc's get_or_create_user
    once it has the ID token and userinfo): the user signed in, or None, and the messages for
    the login page. `signed_in`: the user of the browser's session (a renewal)."""
    request = RequestFactory().get("/oidc/callback/")
    request.session = SessionStore()
    request.user = signed_in or AnonymousUser()
    request._messages = FallbackStorage(request)
    backend = OidcBackend()
    backend.request = request
    user = None
    try:
        if backend.verify_claims(claims):
            users = backend.filter_users_by_claims(claims)
            user = backend.update_user(users[0], claims) if users else backend.create_user(claims)
    except SuspiciousOperation:
        user = None
    return user, [str(message) for message in get_messages(request)]


@pytest.mark.django_db
def test_a_new_admin_and_a_new_artist_are_created_with_their_role(oidc_on):
    admin, notes = sign_in_with(claims_of("ada", groups=(ADMINS,), email="ada@studio.example"))
    assert notes == []
    assert (admin.username, admin.email, admin.get_full_name()) == ("ada", "ada@studio.example", "Ada Doe")
    assert admin.is_staff
    assert admin.is_active
    assert not admin.has_usable_password()
    artist, _ = sign_in_with(claims_of("nina", groups=("Lookdev",)))
    assert not artist.is_staff
    assert Artist.objects.get(user=artist).name == "Nina Doe"
    account = DirectoryAccount.objects.get(user=artist)
    assert (account.source, account.subject, account.role) == ("oidc", "sub-nina", "artist")
    assert account.groups == ["Lookdev"]
    assert account.last_sign_in_at is not None


@pytest.mark.django_db
def test_someone_in_neither_group_is_refused_and_nothing_is_created(oidc_on):
    user, notes = sign_in_with(claims_of("mallory", groups=("render-wranglers",)))
    assert user is None
    assert notes == [REFUSED]
    assert "Your Studio SSO account is not in a group that may use the fleet dashboard" in REFUSED
    assert not User.objects.filter(username="mallory").exists()


@pytest.mark.django_db
def test_an_existing_user_is_found_by_user_name_then_by_verified_email(oidc_on):
    local = UserFactory(username="Nina", email="nina@old.example")
    by_email = UserFactory(username="b.ortiz", email="bruno@studio.example")
    users_before = User.objects.count()
    assert sign_in_with(claims_of("nina", email="nina@studio.example"))[0] == local
    assert sign_in_with(claims_of("bruno", email="BRUNO@studio.example"))[0] == by_email
    assert User.objects.count() == users_before
    local.refresh_from_db()
    assert local.email == "nina@studio.example"  # kept in step with the provider
    assert DirectoryAccount.objects.get(user=by_email).subject == "sub-bruno"


@pytest.mark.django_db
def test_an_unverified_email_matches_nobody(oidc_on):
    admin = UserFactory(username="admin", email="admin@studio.example", is_staff=True)
    user, _ = sign_in_with(claims_of("eve", email="admin@studio.example", verified=False))
    assert user != admin
    assert user.username == "eve"


@pytest.mark.django_db
def test_a_renamed_person_keeps_their_user_by_subject(oidc_on):
    user, _ = sign_in_with(claims_of("nina", sub="s-42"))
    renamed, _ = sign_in_with(claims_of("nina.lindqvist", sub="s-42"))
    assert renamed == user


@pytest.mark.django_db
def test_a_user_linked_to_another_subject_is_not_taken_over(oidc_on):
    nina, _ = sign_in_with(claims_of("nina", sub="s-1"))
    other, notes = sign_in_with(claims_of("nina", sub="s-2", groups=(ADMINS,)))
    assert other is None
    assert notes == [TAKEN.format(provider=DISPLAY_NAME)]
    nina.refresh_from_db()
    assert not nina.is_staff
    assert DirectoryAccount.objects.get(user=nina).subject == "s-1"


@pytest.mark.django_db
def test_the_role_follows_the_groups_at_each_sign_in(oidc_on):
    user, _ = sign_in_with(claims_of("ada", groups=(ADMINS,)))
    assert user.is_staff
    user, _ = sign_in_with(claims_of("ada", groups=(ARTISTS,), given_name="Adaline"))
    assert not user.is_staff
    assert Artist.objects.get(user=user).name == "Adaline Doe"


@pytest.mark.django_db
def test_a_user_whose_groups_are_gone_is_deactivated_and_signed_out(oidc_on):
    user, _ = sign_in_with(claims_of("nina"))
    refused, notes = sign_in_with(claims_of("nina", groups=()), signed_in=user)
    user.refresh_from_db()
    assert refused is None
    assert notes == [REFUSED]
    assert not user.is_active
    reason = DirectoryAccount.objects.get(user=user).refused_reason
    assert reason == "Studio SSO: in none of the groups that give a role"
    assert OidcBackend().get_user(user.pk) is None  # the session's user is gone at the next request
    back, _ = sign_in_with(claims_of("nina"))
    assert back == user
    assert User.objects.get(pk=user.pk).is_active


@pytest.mark.django_db
def test_a_local_account_in_no_group_is_refused_but_left_alone(oidc_on):
    local = ArtistFactory(user=UserFactory(username="ana"), name="Ana Artist").user
    user, notes = sign_in_with(claims_of("ana", groups=()))
    local.refresh_from_db()
    assert user is None
    assert notes == [REFUSED]
    assert local.is_active
    assert not DirectoryAccount.objects.filter(user=local).exists()


@pytest.mark.django_db
def test_no_user_name_claim_is_refused_saying_so(oidc_on, settings):
    settings.OIDC_USERNAME_CLAIM = "upn"
    user, notes = sign_in_with(claims_of("nina"))
    assert user is None
    assert notes == [NO_USERNAME.format(provider=DISPLAY_NAME, claim="upn")]
    assert sign_in_with(claims_of("nina", upn="nina@studio.example"))[0].username == "nina@studio.example"


@pytest.mark.django_db
def test_password_sign_ins_are_not_the_backends(oidc_on):
    UserFactory(username="ana")
    request = RequestFactory().post("/login/?code=c&state=s")
    assert OidcBackend().authenticate(request, username="ana", password="x") is None


# --- the session's renewal with the provider ----------------------------------------------------


@pytest.fixture
def oidc_session(oidc_on, admin_user):
    """A client signed in through OIDC (as the callback leaves a session) whose ID token is due
    for renewal."""
    client = Client()
    client.force_login(admin_user, backend=BACKEND)
    return client


@pytest.mark.django_db
def test_a_due_renewal_sends_a_page_to_the_provider_without_a_prompt(oidc_session, oidc_on):
    response = oidc_session.get("/hosts/")
    query = parse_qs(urlsplit(response["Location"]).query)
    assert response["Location"].startswith(oidc_on["OIDC_OP_AUTHORIZATION_ENDPOINT"])
    assert query["prompt"] == ["none"]
    assert oidc_session.session["oidc_login_next"] == "/hosts/"


@pytest.mark.django_db
def test_a_due_renewal_tells_an_htmx_refresh_to_reload_its_page(oidc_session):
    response = oidc_session.get("/overview/live/", headers={"HX-Request": "true"})
    assert response.status_code == 204
    assert response["HX-Refresh"] == "true"


@pytest.mark.django_db
def test_the_api_and_writes_are_not_renewed(oidc_session):
    assert oidc_session.get("/api/v1/hosts/").status_code == 200
    assert oidc_session.post("/logout/")["Location"] == "/login/"


@pytest.mark.django_db
def test_a_renewed_session_and_a_password_session_pass(oidc_session, artist):
    session = oidc_session.session
    session["oidc_id_token_expiration"] = 4_000_000_000
    session.save()
    assert oidc_session.get("/hosts/").status_code == 200
    local = Client()
    local.force_login(artist.user)
    assert local.get("/me/").status_code == 200

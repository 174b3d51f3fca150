"""Signing in with the studio's OpenID Connect provider (Keycloak, Entra ID, Okta).

mozilla-django-oidc runs the authorization code flow (with PKCE) and checks the ID token; this
module decides who the person is and what they may do, the way every directory does
(identity.accounts): their role comes from the groups the provider lists in the
OIDC_GROUPS_CLAIM claim (identity.roles), their product user is the one already linked to their
subject, else the one with their user name, else the only unlinked one with their verified
e-mail address, else a new one. Each sign-in writes name, e-mail and role again. Someone in
neither group is refused with NO_ROLE on the sign-in page, and their user, if the directory owns
it, is deactivated. `SessionRefresh` asks the provider again when the ID token's renewal time has
passed, so a removal from the groups takes effect within OIDC_RENEW_ID_TOKEN_EXPIRY_SECONDS.

Configured in config/settings.py (on when OIDC_RP_CLIENT_ID is set); docs/operations.md,
"Signing in with OpenID Connect".
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

import jwt
import requests
from django.conf import settings
from django.contrib import auth, messages
from django.core.exceptions import SuspiciousOperation
from django.http import HttpResponse
from mozilla_django_oidc import middleware as oidc_middleware
from mozilla_django_oidc.auth import OIDCAuthenticationBackend

from identity.accounts import Identity, apply_identity, find_user
from identity.models import DirectoryAccount, DirectorySource
from identity.roles import NO_ROLE, role_of

logger = logging.getLogger(__name__)

#: What the sign-in page says when the provider signed someone in but the dashboard could not.
NO_USERNAME = ("Signing in with {provider} failed: it did not say your user name (the {claim} claim). "
               "Tell your IT team.")
TAKEN = ("Signing in with {provider} failed: your user name belongs to another {provider} account here. "
         "Tell your IT team.")
FAILED = ("Signing in with {provider} failed: the dashboard could not complete the sign-in with it. "
          "Try again; if it keeps failing, tell your IT team.")
#: Django's User.username holds at most 150 characters.
USERNAME_MAX_CHARS = 150
CALLBACK_URL_NAME = "oidc_authentication_callback"


def claim(claims: Mapping[str, Any], name: str) -> Any:
    """The claim `name`; a name with dots that is not a claim itself is a path into nested
    claims (Keycloak's `realm_access.roles`). Claim names may hold dots themselves (Auth0's
    namespaced `https://studio.example/groups`), so the whole name is tried first."""
    if name in claims:
        return claims[name]
    value: Any = claims
    for part in name.split("."):
        if not isinstance(value, Mapping) or part not in value:
            return None
        value = value[part]
    return value


def groups_of(value: Any) -> tuple[str, ...]:
    """The group names of a groups claim: a list (the usual shape) or one string; else none."""
    if isinstance(value, str):
        return (value,) if value.strip() else ()
    if isinstance(value, list | tuple):
        return tuple(str(group) for group in value if isinstance(group, str | int) and str(group).strip())
    return ()


def identity_from_claims(claims: Mapping[str, Any], *, username_claim: str = "preferred_username",
                         groups_claim: str = "groups", admin_groups: tuple[str, ...] = (),
                         artist_groups: tuple[str, ...] = ()) -> Identity:
    """What the provider's claims say about one person: their user name (empty when the claim is
    missing or too long to be one), name, e-mail, groups and the role those groups give."""
    groups = groups_of(claim(claims, groups_claim))
    username = claim(claims, username_claim)
    username = username.strip() if isinstance(username, str) else ""
    if len(username) > USERNAME_MAX_CHARS:
        username = ""
    first, last = _text(claims.get("given_name")), _text(claims.get("family_name"))
    if not first and not last:
        first = _text(claims.get("name"))
    return Identity(source=DirectorySource.OIDC, subject=str(claims.get("sub") or ""), username=username,
                    email=_text(claims.get("email")), first_name=first, last_name=last, groups=groups,
                    role=role_of(groups, admin_groups, artist_groups))


def email_verified(claims: Mapping[str, Any]) -> bool:
    """Whether the provider vouches for the e-mail address (some send the claim as a string). An
    unverified address matches no existing user: anyone may type an admin's into their profile."""
    return claims.get("email_verified") in (True, "true")


def _text(value: Any) -> str:
    return value.strip() if isinstance(value, str) else ""


class OidcBackend(OIDCAuthenticationBackend):
    """mozilla-django-oidc's backend, with the product's users and roles (module docstring).

    Django makes a new backend for each `authenticate()`, so `self.request` is the callback's."""

    def authenticate(self, request, **kwargs):
        # Only the callback view's call is ours (it passes the nonce); a password sign-in is not.
        if request is None or "nonce" not in kwargs:
            return None
        try:
            return super().authenticate(request, **kwargs)
        except (requests.RequestException, SuspiciousOperation, jwt.PyJWTError) as exc:
            # The provider unreachable or answering an error, a token that fails its checks: the
            # person is told on the sign-in page, the operator in the log (never a server error).
            logger.warning("OpenID Connect sign-in failed: %s: %s", type(exc).__name__, exc)
            self.refuse(FAILED.format(provider=settings.OIDC_DISPLAY_NAME))
            return None

    def get_userinfo(self, access_token, id_token, payload):
        """The ID token's claims updated with the userinfo endpoint's: Entra ID and Okta's org
        server put the groups in the ID token only, Keycloak may put them in either."""
        userinfo = super().get_userinfo(access_token, id_token, payload)
        if not isinstance(userinfo, dict) or userinfo.get("sub") != payload.get("sub"):
            # OpenID Connect Core 5.3.2: a userinfo of another subject must not be used.
            logger.warning("OpenID Connect: the userinfo endpoint's answer is not about the ID token's subject %r",
                           payload.get("sub"))
            self.refuse(FAILED.format(provider=settings.OIDC_DISPLAY_NAME))
            raise SuspiciousOperation("the userinfo endpoint answered for another subject than the ID token's")
        return {**payload, **userinfo}

    def identity(self, claims: Mapping[str, Any]) -> Identity:
        return identity_from_claims(
            claims, username_claim=settings.OIDC_USERNAME_CLAIM, groups_claim=settings.OIDC_GROUPS_CLAIM,
            admin_groups=(settings.OIDC_ADMIN_GROUP,), artist_groups=tuple(settings.OIDC_ARTIST_GROUPS))

    def verify_claims(self, claims) -> bool:
        """Whether the person may sign in: a user name and a role. Refused, they are told why; a
        user of theirs that the directory owns is deactivated (an unlinked local account is not
        the directory's to close)."""
        identity = self.identity(claims)
        provider = settings.OIDC_DISPLAY_NAME
        if not identity.username or not identity.subject:
            logger.warning("OpenID Connect: no usable %s claim for subject %r: check OIDC_USERNAME_CLAIM",
                           settings.OIDC_USERNAME_CLAIM, identity.subject)
            return self.refuse(NO_USERNAME.format(provider=provider, claim=settings.OIDC_USERNAME_CLAIM))
        if identity.role is not None:
            return True
        if claim(claims, settings.OIDC_GROUPS_CLAIM) is None and "_claim_names" in claims:
            logger.warning("OpenID Connect: %s is in too many groups for the token to list them (Entra ID's "
                           "group overage): emit only the groups assigned to the application", identity.username)
        user = self.match(identity, claims)
        if user is not None and DirectoryAccount.objects.filter(user=user).exists():
            apply_identity(user, identity, reason=f"{provider}: in none of the groups that give a role")
        logger.info("OpenID Connect: %s refused: groups %s give no role", identity.username, list(identity.groups))
        return self.refuse(NO_ROLE.format(directory=provider))

    def match(self, identity: Identity, claims: Mapping[str, Any]):
        """The product user of `identity`: the one linked to its subject, else find_user's (same
        user name, else the only unlinked user with its verified e-mail address), else None.
        A user linked to another subject of this provider is someone else's: refused."""
        account = (DirectoryAccount.objects.filter(source=DirectorySource.OIDC, subject=identity.subject)
                   .select_related("user").first())
        if account is not None:
            return account.user
        user = find_user(identity.username, identity.email if email_verified(claims) else "")
        if user is None:
            return None
        linked = DirectoryAccount.objects.filter(user=user).first()
        if linked is not None and linked.source == DirectorySource.OIDC and linked.subject != identity.subject:
            logger.warning("OpenID Connect: %s (subject %r) matches user %s, linked to subject %r: refused",
                           identity.username, identity.subject, user.get_username(), linked.subject)
            self.refuse(TAKEN.format(provider=settings.OIDC_DISPLAY_NAME))
            raise SuspiciousOperation("the user is linked to another OpenID Connect subject")
        return user

    def filter_users_by_claims(self, claims):
        user = self.match(self.identity(claims), claims)
        return [user] if user is not None else []

    def create_user(self, claims):
        identity = self.identity(claims)
        user = self.UserModel.objects.create_user(identity.username, email=identity.email)  # no usable password
        apply_identity(user, identity, signed_in=True)
        logger.info("OpenID Connect: created user %s (%s)", user.get_username(), identity.role)
        return user

    def update_user(self, user, claims):
        apply_identity(user, self.identity(claims), signed_in=True)
        return user

    def get_user(self, user_id):
        """The session's user, unless deactivated (mozilla's backend would still return them)."""
        user = super().get_user(user_id)
        return user if user is not None and self.user_can_authenticate(user) else None

    def refuse(self, message: str) -> bool:
        """Sign out whoever this browser was (a renewal that failed), and say why on the sign-in
        page (LOGIN_REDIRECT_URL_FAILURE). Returns False, verify_claims' refusal."""
        if getattr(self.request, "user", None) is not None and self.request.user.is_authenticated:
            auth.logout(self.request)
        messages.error(self.request, message)
        return False


class SessionRefresh(oidc_middleware.SessionRefresh):
    """mozilla-django-oidc's renewal, which redirects a GET to the provider once the ID token's
    renewal time has passed; an htmx refresh (the overview's, every few seconds) cannot follow
    that redirect, so it is told to reload its page, whose GET then goes to the provider."""

    def process_request(self, request):
        response = super().process_request(request)
        if response is not None and response.status_code == 302 and request.headers.get("HX-Request") == "true":
            return HttpResponse(status=204, headers={"HX-Refresh": "true"})
        return response


def unthrottled(request, credentials=None) -> bool:
    """AXES_WHITELIST_CALLABLE while OIDC is on: sign-ins through the callback are the
    provider's to throttle (it checked the password), so django-axes neither counts nor refuses
    them; the password form is throttled as before."""
    match = getattr(request, "resolver_match", None)
    return match is not None and match.url_name == CALLBACK_URL_NAME


def sign_in_options(request) -> dict[str, str]:
    """Context processor: the provider's name for the login page's button, when OIDC is on."""
    return {"oidc_provider": settings.OIDC_DISPLAY_NAME} if settings.OIDC_ENABLED else {}

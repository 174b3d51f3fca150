"""Signing in against the studio's LDAP / Active Directory (django-auth-ldap), with roles from groups.

Sign-in: django-auth-ldap finds the person with AUTH_LDAP_USER_SEARCH (as the bind account), binds
as them with the password typed, and reads their groups. `_decide_role` (its populate_user signal)
turns the groups into a role: a member of AUTH_LDAP_ADMIN_GROUP is a fleet admin, a member of an
AUTH_LDAP_ARTIST_GROUP an artist; anyone else is refused with a message that says so, and an
existing user who lost their groups is deactivated. On success `identity.accounts.apply_identity`
links the user (by user name, else by e-mail) and their artist record.

Every later request of a directory session asks the directory again (`DirectoryBackend.get_user`,
at most every AUTH_LDAP_RECHECK_S seconds; 0, the default, means every request), so someone
removed from the groups loses access at their next request, not at their next sign-in. While the
directory cannot be reached, sessions checked within AUTH_LDAP_OUTAGE_GRACE_S keep working: an
outage of the directory must not sign the whole studio out. `sync_accounts` (beat, every
AUTH_LDAP_SYNC_INTERVAL_S) does the same for every directory account, so users who are not
signed in (API tokens) are kept in step too.

Lookups here (`Directory`) use python-ldap with the same settings as django-auth-ldap, but raise
`DirectoryUnavailable` on any LDAP error instead of treating it as "not found": only an answer
of the directory may take access away.
"""

from __future__ import annotations

import contextlib
import logging
from dataclasses import dataclass
from datetime import timedelta
from types import SimpleNamespace

import ldap
from django.conf import settings
from django.core.cache import cache
from django.utils import timezone
from django_auth_ldap.backend import LDAPBackend, populate_user

from fleet.api_tokens import KeyRefused
from identity.accounts import Identity, apply_identity, find_user
from identity.models import DirectoryAccount, DirectorySource
from identity.roles import NO_ROLE, role_of
from identity.sessions import end_sessions
from identity.views import REFUSAL_ATTR

logger = logging.getLogger(__name__)

#: Active Directory's userAccountControl flag of a disabled account.
AD_ACCOUNT_DISABLED = 0x2
NOT_IN_DIRECTORY = "Your account is no longer in the {directory}."
DISABLED = "Your account is disabled in the {directory}."


class DirectoryUnavailable(Exception):
    """The directory did not answer (down, unreachable, bind refused, TLS failed)."""


def directory_name() -> str:
    return getattr(settings, "AUTH_LDAP_DISPLAY_NAME", "studio directory")


def _first(attrs: dict | None, name: str) -> str:
    values = (attrs or {}).get(name) or (attrs or {}).get(name.lower()) or []
    return str(values[0]) if values else ""


def identity_of(username: str, dn: str, attrs: dict | None, group_dns) -> tuple[Identity, str]:
    """The Identity an entry grants and, when it grants no role, the reason shown to the person."""
    groups = tuple(sorted(group_dns))
    role = role_of(groups, [settings.AUTH_LDAP_ADMIN_GROUP], settings.AUTH_LDAP_ARTIST_GROUPS)
    reason = "" if role else NO_ROLE.format(directory=directory_name())
    control = _first(attrs, "userAccountControl")
    if control.isdigit() and int(control) & AD_ACCOUNT_DISABLED:
        role, reason = None, DISABLED.format(directory=directory_name())
    identity = Identity(source=DirectorySource.LDAP, subject=dn, username=username, email=_first(attrs, "mail"),
                        first_name=_first(attrs, "givenName"), last_name=_first(attrs, "sn"), groups=groups,
                        role=role)
    return identity, reason


def gone(username: str) -> tuple[Identity, str]:
    """What to apply to a user the directory no longer holds."""
    return (Identity(source=DirectorySource.LDAP, subject="", username=username),
            NOT_IN_DIRECTORY.format(directory=directory_name()))


class Directory:
    """One connection to the directory, bound as AUTH_LDAP_BIND_DN (a context manager)."""

    def __enter__(self) -> Directory:
        try:
            self.connection = ldap.initialize(settings.AUTH_LDAP_SERVER_URI, bytes_mode=False)
            for option, value in settings.AUTH_LDAP_CONNECTION_OPTIONS.items():
                self.connection.set_option(option, value)
            if settings.AUTH_LDAP_START_TLS:
                self.connection.start_tls_s()
            self.connection.simple_bind_s(settings.AUTH_LDAP_BIND_DN, settings.AUTH_LDAP_BIND_PASSWORD)
        except ldap.LDAPError as error:
            raise DirectoryUnavailable(describe(error)) from None
        return self

    def __exit__(self, *exc) -> None:
        with contextlib.suppress(ldap.LDAPError):
            self.connection.unbind_s()

    def lookup(self, username: str) -> tuple[Identity, str] | None:
        """The identity of `username` with the reason when it grants no role; None when the
        directory holds no such person (or several: a user filter that matches two entries
        must not pick one)."""
        try:
            found = settings.AUTH_LDAP_USER_SEARCH.execute(self.connection, {"user": username})
            if len(found) != 1:
                return None
            dn, attrs = found[0]
            entry = SimpleNamespace(dn=dn, attrs=attrs, connection=self.connection)
            group_dns = [group_dn for group_dn, _ in
                         settings.AUTH_LDAP_GROUP_TYPE.user_groups(entry, settings.AUTH_LDAP_GROUP_SEARCH)]
        except ldap.LDAPError as error:
            raise DirectoryUnavailable(describe(error)) from None
        return identity_of(username, dn, attrs, group_dns)


def describe(error: ldap.LDAPError) -> str:
    """python-ldap's error as one line: its description and the server's own words."""
    detail = error.args[0] if error.args and isinstance(error.args[0], dict) else {}
    text = detail.get("desc") or type(error).__name__
    if detail.get("info"):
        text += f" ({detail['info']})"
    return text


class DirectoryBackend(LDAPBackend):
    """django-auth-ldap's backend with the product's roles, account links and per-request check."""

    def authenticate(self, request, username=None, password=None, **kwargs):
        self.request = request  # for _decide_role, which django-auth-ldap calls without it
        return super().authenticate(request, username=username, password=password, **kwargs)

    def get_or_build_user(self, username, ldap_user):
        """The user of this entry: same user name, else the only unlinked user with its e-mail
        address (renamed to the directory's user name, so later lookups find it), else new."""
        user = find_user(username, _first(ldap_user.attrs, "mail"))
        if user is None:
            return super().get_or_build_user(username, ldap_user)
        if user.get_username().lower() != username.lower():
            logger.info("Linking %s to the directory entry %s by e-mail", user.get_username(), ldap_user.dn)
            user.username = username.lower()
        return user, False

    def authenticate_ldap_user(self, ldap_user, password):
        user = super().authenticate_ldap_user(ldap_user, password)
        identity = getattr(ldap_user, "fleet_identity", None)
        if user is not None and identity is not None:
            apply_identity(user, identity, signed_in=True)
        return user

    def get_user(self, user_id):
        """The session's user, after asking the directory whether they still have a role."""
        user = super().get_user(user_id)
        if user is None or not user.is_active:
            return None
        return user if still_allowed(user) else None


def _decide_role(sender, user, ldap_user, **kwargs):
    """populate_user receiver: the role the groups grant, or a refusal that stops the sign-in
    before a new user is saved (an existing one is deactivated)."""
    identity, reason = identity_of(user.ldap_username, ldap_user.dn, ldap_user.attrs, ldap_user.group_dns)
    if identity.role is None:
        request = getattr(ldap_user.backend, "request", None)
        if request is not None:
            setattr(request, REFUSAL_ATTR, reason)
        if user.pk is not None:
            apply_identity(user, identity, reason=reason)
        raise ldap_user.AuthenticationFailed(reason)
    user.is_active = True
    user.is_staff = identity.role == "admin"
    ldap_user.fleet_identity = identity


populate_user.connect(_decide_role, sender=DirectoryBackend, dispatch_uid="identity_ldap_role")


def _checked_key(user) -> str:
    return f"identity:ldap-checked:{user.pk}"


def still_allowed(user, account: DirectoryAccount | None = None) -> bool:
    """Whether the directory still gives `user` a role; keeps their account in step as it asks.

    Asked at most every AUTH_LDAP_RECHECK_S seconds per user. When the directory is unreachable
    the answer is yes for AUTH_LDAP_OUTAGE_GRACE_S after the last answer it gave.
    """
    recheck_s = settings.AUTH_LDAP_RECHECK_S
    if recheck_s and cache.get(_checked_key(user)):
        return True
    if account is None:
        account = DirectoryAccount.objects.filter(user=user).first()
    try:
        with Directory() as directory:
            found = directory.lookup(user.get_username())
    except DirectoryUnavailable as error:
        grace = timedelta(seconds=settings.AUTH_LDAP_OUTAGE_GRACE_S)
        checked = account.last_synced_at if account else None
        allowed = checked is not None and timezone.now() - checked <= grace
        logger.warning("The directory is unreachable (%s); %s keeps access: %s", error, user.get_username(),
                       "yes, within the outage grace" if allowed else "no, last checked too long ago")
        return allowed
    identity, reason = found if found is not None else gone(user.get_username())
    keep_in_step(user, account, identity, reason)
    if recheck_s:
        cache.set(_checked_key(user), True, recheck_s)
    return identity.role is not None


#: A directory account's last_synced_at is written at most this often when nothing changed.
SYNC_STAMP_EVERY = timedelta(minutes=1)


def keep_in_step(user, account: DirectoryAccount | None, identity: Identity, reason: str) -> bool:
    """Apply `identity` when it differs from what is stored (or the stamp is old); whether it did."""
    same = (account is not None and account.role == (identity.role or "") and account.groups == list(identity.groups)
            and user.is_active == (identity.role is not None) and user.is_staff == (identity.role == "admin")
            and (not identity.email or user.email == identity.email)
            and (not identity.first_name or user.first_name == identity.first_name)
            and (not identity.last_name or user.last_name == identity.last_name))
    if same and account.last_synced_at and timezone.now() - account.last_synced_at < SYNC_STAMP_EVERY:
        return False
    if not identity.subject and account is not None:
        identity = Identity(source=identity.source, subject=account.subject, username=identity.username)
    apply_identity(user, identity, reason=reason)
    return not same


@dataclass
class SyncReport:
    checked: int = 0
    changed: int = 0
    refused: int = 0
    error: str = ""


def sync_accounts() -> SyncReport:
    """Ask the directory about every directory account (one connection) and keep each in step.
    Stops at the first DirectoryUnavailable without changing anyone: an outage is not a removal."""
    report = SyncReport()
    accounts = DirectoryAccount.objects.filter(source=DirectorySource.LDAP).select_related("user").order_by("pk")
    try:
        with Directory() as directory:
            for account in accounts:
                found = directory.lookup(account.user.get_username())
                identity, reason = found if found is not None else gone(account.user.get_username())
                report.checked += 1
                was_active = account.user.is_active
                report.changed += keep_in_step(account.user, account, identity, reason)
                report.refused += identity.role is None
                if was_active and identity.role is None:
                    end_sessions(account.user, reason)  # their browsers are refused anyway; this tidies
    except DirectoryUnavailable as error:
        report.error = str(error)
        logger.warning("Directory sync stopped after %d accounts: %s", report.checked, error)
    return report


def refuse_token_of_removed_user(sender, token, **kwargs) -> None:
    """fleet.api_tokens.presented receiver: a token of a directory user the directory no longer
    gives a role is refused at its next request, as their sessions are."""
    account = DirectoryAccount.objects.filter(user=token.user, source=DirectorySource.LDAP).first()
    if account is None:
        return
    if not still_allowed(token.user, account):
        account.refresh_from_db(fields=["refused_reason"])
        raise KeyRefused(account.refused_reason or "User inactive or deleted.")

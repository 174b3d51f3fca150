"""Accounts that the studio's directory owns.

A user with a `DirectoryAccount` signed in through LDAP or OpenID Connect at least once: the
directory, not this product, says who they are (name, e-mail), whether they may sign in and as
what (their groups). Users without one are local accounts (the break-glass admin, demo users),
which the directory never touches.

A `UserSession` is one browser signed in as a user (identity/sessions.py keeps them).
"""

from datetime import timedelta

from django.conf import settings
from django.db import models
from django.db.models import Q
from django.utils import timezone


class DirectorySource(models.TextChoices):
    LDAP = "ldap", "LDAP / Active Directory"
    OIDC = "oidc", "OpenID Connect"


class DirectoryAccount(models.Model):
    """The link between a product user and their entry in the studio's directory."""

    user = models.OneToOneField(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="directory_account")
    source = models.CharField(max_length=10, choices=DirectorySource.choices)
    subject = models.CharField(max_length=500, help_text="The entry's DN (LDAP) or the subject claim (OIDC)")
    groups = models.JSONField(default=list, blank=True, help_text="The groups the directory reported last")
    role = models.CharField(max_length=10, blank=True, help_text="admin, artist, or empty: no access")
    first_sign_in_at = models.DateTimeField(default=timezone.now)
    last_sign_in_at = models.DateTimeField(null=True, blank=True)
    last_synced_at = models.DateTimeField(null=True, blank=True, help_text="When the directory was last asked")
    refused_reason = models.CharField(max_length=300, blank=True, help_text="Why access ended, if it did")

    class Meta:
        ordering = ["user__username"]
        constraints = [
            models.CheckConstraint(condition=Q(source__in=DirectorySource.values),
                                   name="directory_account_source_valid"),
            models.CheckConstraint(condition=Q(role__in=["", "admin", "artist"]), name="directory_account_role_valid"),
        ]

    def __str__(self):
        return f"{self.user} ({self.get_source_display()})"


class UserSessionQuerySet(models.QuerySet):
    def live(self, now=None):
        """Sessions that are neither idle past SESSION_IDLE_TIMEOUT_MINUTES nor older than
        SESSION_MAX_AGE_HOURS: the ones the next request of their browser would still be let in with."""
        now = now or timezone.now()
        return self.filter(last_seen_at__gt=now - timedelta(minutes=settings.SESSION_IDLE_TIMEOUT_MINUTES),
                           signed_in_at__gt=now - timedelta(hours=settings.SESSION_MAX_AGE_HOURS))


class UserSession(models.Model):
    """One signed-in browser session of a user, kept beside the session engine's own record.

    The engine (SESSION_ENGINE) stores a session under its key and cannot list a user's sessions;
    this row can, so that `identity.sessions.end_sessions` signs a user out of every browser at
    once and the admin site shows where someone is signed in. Written when the user signs in,
    removed when they sign out, time out or are signed out everywhere. `last_seen_at` is the last
    request the user made themselves (pages polling on their own do not count), to the minute.
    """

    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="user_sessions")
    session_key = models.CharField(max_length=40, unique=True, help_text="The session engine's key")
    signed_in_at = models.DateTimeField()
    last_seen_at = models.DateTimeField(help_text="The user's last request of their own, to the minute")
    address = models.GenericIPAddressField(null=True, blank=True, help_text="The client's address at sign-in")
    user_agent = models.CharField(max_length=200, blank=True, help_text="The browser, as it named itself")
    backend = models.CharField(max_length=200, blank=True, help_text="The authentication backend that signed them in")

    objects = UserSessionQuerySet.as_manager()

    class Meta:
        ordering = ["-last_seen_at", "pk"]
        # identity.sessions.sweep deletes by last_seen_at at every sign-in.
        indexes = [models.Index(fields=["last_seen_at"], name="user_session_last_seen")]

    def __str__(self):
        return f"{self.user} since {self.signed_in_at:%Y-%m-%d %H:%M}"

    @property
    def method(self) -> str:
        """How they signed in, in words: "Local password", "LDAP", "OpenID Connect"."""
        return method_of(self.backend)


def method_of(backend: str) -> str:
    """A sign-in method in words, from the dotted path of the backend that authenticated the user.

    By name, so that backends added later (identity/ldap*.py, identity/oidc*.py, a package's)
    read right without being listed: "oidc" or "openid" anywhere in the path is OpenID Connect,
    "ldap" is LDAP; Django's model backend and the sign-in throttle's (config.lockout, which the
    test client's force_login picks) check a password stored here. Anything else is its class name.
    """
    lowered = backend.lower()
    if "oidc" in lowered or "openid" in lowered:
        return "OpenID Connect"
    if "ldap" in lowered:
        return "LDAP"
    if not backend:
        return "Unknown"
    if lowered.endswith("modelbackend") or backend == "config.lockout.SignInThrottleBackend":
        return "Local password"
    return backend.rsplit(".", 1)[-1]

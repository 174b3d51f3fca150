"""Accounts that the studio's directory owns.

A user with a `DirectoryAccount` signed in through LDAP or OpenID Connect at least once: the
directory, not this product, says who they are (name, e-mail), whether they may sign in and as
what (their groups). Users without one are local accounts (the break-glass admin, demo users),
which the directory never touches.
"""

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

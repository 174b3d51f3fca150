"""Ask the studio's directory about every directory account now (what beat does every
AUTH_LDAP_SYNC_INTERVAL_S): names, e-mail, roles; users it no longer gives a role are deactivated.

    manage.py directory_sync

Fails (exit status 1) when directory sign-in is off or the directory cannot be reached; an
unreachable directory changes no one.
"""

from __future__ import annotations

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError


class Command(BaseCommand):
    help = "Keep every directory account in step with the LDAP directory now."

    def handle(self, *args, **options):
        if not getattr(settings, "AUTH_LDAP_ENABLED", False):
            raise CommandError("Directory sign-in is off: set AUTH_LDAP_SERVER_URI (docs/operations.md).")
        from identity.ldap_backend import sync_accounts

        report = sync_accounts()
        if report.error:
            raise CommandError(f"Directory sync stopped after {report.checked} accounts, changing no one "
                               f"further: {report.error}")
        self.stdout.write(f"{report.checked} directory accounts checked, {report.changed} changed, "
                          f"{report.refused} without access.")

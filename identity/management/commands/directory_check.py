"""Check the directory settings before anyone signs in: connect and bind as AUTH_LDAP_BIND_DN,
then, for each user name given, show the entry found, its groups and the role they grant.

    manage.py directory_check                 connection and bind only
    manage.py directory_check alice bob       ...and what alice and bob would be

Changes nothing. Exit status 1 when the directory cannot be reached or a user is not found.
"""

from __future__ import annotations

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError


class Command(BaseCommand):
    help = "Connect to the LDAP directory and show what it says about the given users (changes nothing)."

    def add_arguments(self, parser):
        parser.add_argument("usernames", nargs="*", help="user names to look up")

    def handle(self, *args, usernames: list[str], **options):
        if not getattr(settings, "AUTH_LDAP_ENABLED", False):
            raise CommandError("Directory sign-in is off: set AUTH_LDAP_SERVER_URI (docs/operations.md).")
        from identity.ldap_backend import Directory, DirectoryUnavailable

        bind = settings.AUTH_LDAP_BIND_DN or "anonymous"
        try:
            with Directory() as directory:
                self.stdout.write(f"Connected to {settings.AUTH_LDAP_SERVER_URI} "
                                  f"({'StartTLS' if settings.AUTH_LDAP_START_TLS else 'as the URI says'}), "
                                  f"bound as {bind}.")
                missing = [name for name in usernames if not self.show(directory, name)]
        except DirectoryUnavailable as error:
            raise CommandError(f"Cannot use the directory at {settings.AUTH_LDAP_SERVER_URI} as {bind}: "
                               f"{error}") from None
        if missing:
            raise CommandError(f"Not found in the directory (or found more than once): {', '.join(missing)}")

    def show(self, directory, username: str) -> bool:
        found = directory.lookup(username)
        if found is None:
            return False
        identity, reason = found
        self.stdout.write(f"\n{username}: {identity.subject}")
        self.stdout.write(f"  name: {identity.first_name} {identity.last_name}  e-mail: {identity.email or '-'}")
        for group in identity.groups or ("(no groups)",):
            self.stdout.write(f"  group: {group}")
        self.stdout.write(f"  role: {identity.role or 'none: ' + reason}")
        return True

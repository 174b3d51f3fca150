"""Sign a user out of every browser at once: `manage.py signout_user USERNAME [--reason TEXT]`.

The same as the admin site's "Sign out everywhere" (identity.sessions.end_sessions), for an
admin at the console: a laptop left signed in, a leaver whose account is being closed. Their
API tokens keep working (`manage.py api_token revoke`), and they may sign in again unless the
account is deactivated.
"""

from __future__ import annotations

from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand, CommandError

from identity import sessions


class Command(BaseCommand):
    help = "End every session of a user now: their next request, in any browser, is signed out."

    def add_arguments(self, parser):
        parser.add_argument("username", help="the user to sign out")
        parser.add_argument("--reason", default="", help="why, kept in the audit log (default: this command)")

    def handle(self, *args, username: str, reason: str, **options):
        User = get_user_model()
        try:
            user = User.objects.get(**{User.USERNAME_FIELD: username})
        except User.DoesNotExist:
            raise CommandError(f"No user named {username!r}.") from None
        ended = sessions.end_sessions(user, reason=reason or "manage.py signout_user")
        self.stdout.write(sessions.ended_message(ended, [user.get_username()]))

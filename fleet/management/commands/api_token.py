"""Issue, list and revoke the API tokens scripts sign in with (`Authorization: Token <key>`).

    manage.py api_token create <username> [--name NAME] [--scope read|write|ingest] [--expires WHEN]
                                                          prints the key, once
    manage.py api_token list [<username>]                 prefix, name, scope, expiry, last use, state
    manage.py api_token revoke <id-or-prefix> [--reason TEXT]

`create` writes the key alone on stdout (so `KEY=$(manage.py api_token create ci-bot)` works)
and what it did on stderr. Only the key's digest is stored: a lost key is revoked and a new
one issued. `--scope` defaults to write (what tokens could always do); `--expires` takes a
lifetime (90d, 12h, 2w) or an ISO 8601 date or time (a date is its 00:00 in TIME_ZONE), and
without it the token never expires. A revoked token stays listed, so whoever presents its key
is told when and why it was revoked.
"""

from __future__ import annotations

from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand, CommandError
from django.utils import timezone

from config.parsing import ParseError
from fleet import api_tokens, token_rules
from fleet.choices import TokenScope
from fleet.models import ApiToken


def _when(value) -> str:
    return timezone.localtime(value).strftime("%Y-%m-%d %H:%M") if value else "never"


class Command(BaseCommand):
    help = "Issue (create), list or revoke API tokens for `Authorization: Token <key>`."

    def add_arguments(self, parser):
        actions = parser.add_subparsers(dest="action", required=True, metavar="{create,list,revoke}")
        create = actions.add_parser("create", help="issue a token and print its key (shown this once)")
        create.add_argument("username", help="the user the token acts as")
        create.add_argument("--name", default="", help="what the token is for, e.g. 'render farm sync'")
        create.add_argument("--scope", default=TokenScope.WRITE.value, choices=TokenScope.values,
                            help="read: reads only; write: reads and writes (default); ingest: pushing samples only")
        create.add_argument("--expires", default="", metavar="WHEN",
                            help=f"when the token stops working: {token_rules.EXPIRY_HELP}; default: never")
        listing = actions.add_parser("list", help="list tokens (never their keys)")
        listing.add_argument("username", nargs="?", help="only this user's tokens")
        revoke = actions.add_parser("revoke", help="revoke a token: its key stops working at once")
        revoke.add_argument("token", help="the token's id or its 8-character prefix (see `list`)")
        revoke.add_argument("--reason", default="", help="why, shown to whoever presents the key afterwards")

    def handle(self, *args, action: str, **options):
        if action == "create":
            self.create_token(options["username"], options["name"], options["scope"], options["expires"])
        elif action == "list":
            self.list_tokens(options["username"])
        else:
            self.revoke_token(options["token"], options["reason"])

    def _user(self, username: str):
        User = get_user_model()
        try:
            return User.objects.get(**{User.USERNAME_FIELD: username})
        except User.DoesNotExist:
            raise CommandError(f"No user named {username!r}.") from None

    def create_token(self, username: str, name: str, scope: str, expires: str) -> None:
        expires_at = None
        if expires.strip():
            try:
                expires_at = token_rules.parse_expiry(expires, now=timezone.now(),
                                                      default_tz=timezone.get_current_timezone())
            except ParseError as error:
                raise CommandError(f"--expires: {error}") from None
        user = self._user(username)
        if not user.is_active:
            raise CommandError(f"User {username!r} is inactive: a token would be refused. Activate the user first.")
        max_name = ApiToken._meta.get_field("name").max_length
        if len(name) > max_name:
            raise CommandError(f"--name is {len(name)} characters long; at most {max_name}.")
        token, key = api_tokens.issue_token(user, name, scope=scope, expires_at=expires_at)
        self.stdout.write(key)
        until = f", expires {_when(expires_at)}" if expires_at else ", never expires"
        self.stderr.write(f"Token {token.prefix} (id {token.pk}, scope {scope}{until}) issued for {username}. "
                          f"Copy the key now: it is not stored and cannot be shown again.")

    def list_tokens(self, username: str | None) -> None:
        tokens = ApiToken.objects.select_related("user").order_by("user__username", "created_at", "pk")
        if username:
            tokens = tokens.filter(user=self._user(username))
        now = timezone.now()
        rows = [(str(t.pk), t.prefix, t.user.get_username(), t.name or "-", t.scope, _when(t.created_at),
                 _when(t.expires_at), _when(t.last_used_at), t.state(now)) for t in tokens]
        if not rows:
            self.stderr.write("No API tokens.")
            return
        header = ("ID", "PREFIX", "USER", "NAME", "SCOPE", "CREATED", "EXPIRES", "LAST USED", "STATE")
        widths = [max(len(row[i]) for row in [header, *rows]) for i in range(len(header))]
        for row in [header, *rows]:
            self.stdout.write("  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)).rstrip())

    def revoke_token(self, id_or_prefix: str, reason: str) -> None:
        if len(reason.strip()) > api_tokens.MAX_REASON:
            raise CommandError(f"--reason is {len(reason.strip())} characters long; at most {api_tokens.MAX_REASON}.")
        try:
            token = api_tokens.find_to_revoke(id_or_prefix)
            api_tokens.revoke_token(token, reason=reason)
        except (api_tokens.TokenNotFound, api_tokens.AlreadyRevoked) as error:
            raise CommandError(str(error)) from None
        self.stdout.write(f"Revoked token {token.prefix} ({token.name or 'unnamed'}) of {token.user.get_username()}.")

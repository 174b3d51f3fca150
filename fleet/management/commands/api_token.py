"""Issue, list and revoke the API tokens scripts sign in with (`Authorization: Token <key>`).

    manage.py api_token create <username> [--name NAME]   prints the key, once
    manage.py api_token list [<username>]                 prefix, name, created, last used
    manage.py api_token revoke <id-or-prefix>

`create` writes the key alone on stdout (so `KEY=$(manage.py api_token create ci-bot)` works)
and what it did on stderr. Only the key's digest is stored: a lost key is revoked and a new
one issued.
"""

from __future__ import annotations

from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand, CommandError
from django.utils import timezone

from fleet import api_tokens
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
        listing = actions.add_parser("list", help="list tokens (never their keys)")
        listing.add_argument("username", nargs="?", help="only this user's tokens")
        revoke = actions.add_parser("revoke", help="revoke a token: its key stops working at once")
        revoke.add_argument("token", help="the token's id or its 8-character prefix (see `list`)")

    def handle(self, *args, action: str, **options):
        if action == "create":
            self.create_token(options["username"], options["name"])
        elif action == "list":
            self.list_tokens(options["username"])
        else:
            self.revoke_token(options["token"])

    def _user(self, username: str):
        User = get_user_model()
        try:
            return User.objects.get(**{User.USERNAME_FIELD: username})
        except User.DoesNotExist:
            raise CommandError(f"No user named {username!r}.") from None

    def create_token(self, username: str, name: str) -> None:
        user = self._user(username)
        if not user.is_active:
            raise CommandError(f"User {username!r} is inactive: a token would be refused. Activate the user first.")
        max_name = ApiToken._meta.get_field("name").max_length
        if len(name) > max_name:
            raise CommandError(f"--name is {len(name)} characters long; at most {max_name}.")
        token, key = api_tokens.issue_token(user, name)
        self.stdout.write(key)
        self.stderr.write(f"Token {token.prefix} (id {token.pk}) issued for {username}. Copy the key now: "
                          f"it is not stored and cannot be shown again.")

    def list_tokens(self, username: str | None) -> None:
        tokens = ApiToken.objects.select_related("user").order_by("user__username", "created_at", "pk")
        if username:
            tokens = tokens.filter(user=self._user(username))
        rows = [(str(t.pk), t.prefix, t.user.get_username(), t.name or "-", _when(t.created_at), _when(t.last_used_at))
                for t in tokens]
        if not rows:
            self.stderr.write("No API tokens.")
            return
        header = ("ID", "PREFIX", "USER", "NAME", "CREATED", "LAST USED")
        widths = [max(len(row[i]) for row in [header, *rows]) for i in range(len(header))]
        for row in [header, *rows]:
            self.stdout.write("  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)).rstrip())

    def revoke_token(self, id_or_prefix: str) -> None:
        try:
            token = api_tokens.find_to_revoke(id_or_prefix)
        except api_tokens.TokenNotFound as error:
            raise CommandError(str(error)) from None
        api_tokens.revoke_token(token)
        self.stdout.write(f"Revoked token {token.prefix} ({token.name or 'unnamed'}) of {token.user.get_username()}.")

"""API tokens of scripts: issuing, finding by key, revoking (`fleet.models.ApiToken`).

A key is shown once, by whoever issues it (`manage.py api_token create`, the admin site, the
`api-tokens/` API), and kept only as its SHA-256. A presented key is found by the digest of
what was presented, so the lookup compares digests, never keys, and its timing says nothing
about any stored key. Issuing, revoking and deleting leave an audit event that names the token
by prefix, never by digest.

Revoking keeps the row (when, why, by whom): a script that presents a revoked key is told
"Token revoked on ... (reason)", and one whose token expired "Token expired on ...", rather
than the "Invalid token." of a key nobody issued. What a token may do (its scope) is checked
per request by `fleet.api.authentication` with `fleet.token_rules`.
"""

from __future__ import annotations

import hashlib
import secrets
from collections.abc import Iterable
from datetime import datetime, timedelta

from django.db import transaction
from django.db.models import Q, QuerySet
from django.dispatch import Signal
from django.utils import timezone

from config import read_cache
from fleet import audit
from fleet.choices import TokenScope, TokenState
from fleet.models import ApiToken

KEY_BYTES = 24  # 192 random bits, 48 hex characters
PREFIX_CHARS = 8
#: `last_used_at` is written at most this often per token, so reads do not each cost a write.
LAST_USED_EVERY = timedelta(minutes=1)

#: A token as events show it: whose, what for, which prefix, what it may do and until when.
TOKEN_FIELDS = ["user", "name", "prefix", "scope", "expires_at"]
#: ... and, around a revocation, when, why and by whom.
REVOKED_FIELDS = [*TOKEN_FIELDS, "revoked_at", "revoked_reason", "revoked_by"]
MAX_REASON = ApiToken._meta.get_field("revoked_reason").max_length


#: Sent with `token` once a presented key has passed every check here; a receiver refuses the
#: request by raising KeyRefused (the directory does, for a user it no longer gives a role).
presented = Signal()


class TokenNotFound(Exception):
    """No token, or more than one, matches what names the token to revoke."""


class AlreadyRevoked(Exception):
    """The token was revoked before (the message says when and why); nothing changed."""


class KeyRefused(Exception):
    """A presented key that signs no one in; the message says why, as a 401 shows it."""


def key_digest(key: str) -> str:
    """The SHA-256 (hex) under which a key is stored."""
    return hashlib.sha256(key.encode()).hexdigest()


def token_snapshot(token: ApiToken | None, fields: list[str] = TOKEN_FIELDS) -> dict | None:
    return audit.snapshot(token, fields)


def issue_key(token: ApiToken) -> str:
    """Give an unsaved token (its user, name, scope and expiry set) a fresh key, save it, record
    "api_token.create", and return the key: the caller shows it once, nothing keeps it."""
    key = secrets.token_hex(KEY_BYTES)
    token.prefix = key[:PREFIX_CHARS]
    token.token_sha256 = key_digest(key)
    with transaction.atomic():
        token.save(force_insert=True)
        audit.record("api_token.create", token, after=token_snapshot(token),
                     comment=f"for {token.user.get_username()}")
    return key


def issue_token(user, name: str = "", *, scope: str = TokenScope.WRITE,
                expires_at: datetime | None = None) -> tuple[ApiToken, str]:
    """A new token of `user` and its key (shown once). Tokens are read-write and never expire
    unless told otherwise, as they were before scopes and expiry existed."""
    token = ApiToken(user=user, name=name, scope=scope, expires_at=expires_at)
    return token, issue_key(token)


def revoke_token(token: ApiToken, *, reason: str = "", by=None) -> ApiToken:
    """Revoke the token (its key stops working at the next request), keeping the row with when,
    why (`reason`) and by whom (`by`, a user or None for a command), and record "api_token.revoke".

    The row is claimed by a conditional update, so of two revokes racing one wins; the other,
    like any revoke of a revoked token, raises AlreadyRevoked saying when it was revoked.
    """
    reason = reason.strip()[:MAX_REASON]
    now = timezone.now()
    with transaction.atomic():
        before = token_snapshot(token, REVOKED_FIELDS)
        claimed = ApiToken.objects.filter(pk=token.pk, revoked_at__isnull=True).update(
            revoked_at=now, revoked_reason=reason, revoked_by=by)
        if not claimed:
            token.refresh_from_db(fields=["revoked_at", "revoked_reason", "revoked_by"])
            raise AlreadyRevoked(f"Token {token.prefix} was already revoked: {token.refusal()}")
        token.revoked_at, token.revoked_reason, token.revoked_by = now, reason, by
        comment = f"of {token.user.get_username()}" + (f": {reason}" if reason else "")
        audit.record("api_token.revoke", token, before=before, after=token_snapshot(token, REVOKED_FIELDS),
                     comment=comment)
    return token


def revoke_tokens(tokens: Iterable[ApiToken], *, reason: str = "", by=None) -> tuple[int, int]:
    """Revoke each token not revoked yet (the admin's bulk action): (revoked, already revoked)."""
    revoked = skipped = 0
    with transaction.atomic():
        for token in tokens:
            try:
                revoke_token(token, reason=reason, by=by)
            except AlreadyRevoked:
                skipped += 1
            else:
                revoked += 1
    return revoked, skipped


def delete_token(token: ApiToken) -> None:
    """Delete the token's row and record "api_token.delete" (the admin site's clean-up of old
    tokens). Its key then reads as "Invalid token.", like one never issued: revoke to say why."""
    with transaction.atomic():
        event = audit.event("api_token.delete", token, before=token_snapshot(token, REVOKED_FIELDS),
                            comment=f"of {token.user.get_username()}")
        token.delete()
        audit.record_many([event])


def in_state(tokens: QuerySet[ApiToken], state: str, now: datetime | None = None) -> QuerySet[ApiToken]:
    """The tokens of `tokens` in `state` (`TokenState`) at `now`, as `ApiToken.state` tells it."""
    now = now or timezone.now()
    if state == TokenState.REVOKED:
        return tokens.filter(revoked_at__isnull=False)
    if state == TokenState.EXPIRED:
        return tokens.filter(expires_at__lte=now, revoked_at__isnull=True)
    return tokens.filter(Q(expires_at__isnull=True) | Q(expires_at__gt=now), revoked_at__isnull=True)


def find_by_key(key: str, along: Iterable[str] = ()) -> ApiToken | None:
    """The token whose key is `key`, with its user, or None.

    Scripts send a request after another with one key, so the lookup goes through the read cache
    (config/read_cache.py): reused until the token's or the user's row is written (a revoke, a
    deactivation, a password change), so a revoked key fails on its next request. An expiry
    needs no write: `authenticate` compares it with the clock on every request. Misses are not
    kept, so keys tried at random cannot fill the cache; nor is the user's password hash.
    `along`: read-cache keys the request asks for next, fetched in the same round trip.
    """
    digest = key_digest(key)

    def find() -> ApiToken | None:
        return ApiToken.objects.select_related("user").defer("user__password").filter(token_sha256=digest).first()

    return read_cache.cached(f"api-token:{digest}", find, max_age_s=60, should_store=lambda token: token is not None,
                             along=along)


def authenticate(key: str, along: Iterable[str] = ()) -> ApiToken:
    """The token of a presented key, stamped as used; KeyRefused when no token has that key
    ("Invalid token."), it is revoked or expired (saying when, and why it was revoked), or its
    user is inactive. The one check behind every `Token <key>`; its scope is the caller's to
    apply (`fleet.token_rules.scope_refusal`). `along`: as for `find_by_key`."""
    token = find_by_key(key, along) if key else None
    if token is None:
        raise KeyRefused("Invalid token.")
    refusal = token.refusal()
    if refusal is not None:
        raise KeyRefused(refusal)
    if not token.user.is_active:
        raise KeyRefused("User inactive or deleted.")
    presented.send(sender=ApiToken, token=token)
    mark_used(token)
    return token


def mark_used(token: ApiToken) -> None:
    """Stamp the token's `last_used_at`, unless it was stamped within LAST_USED_EVERY. The
    condition is in the UPDATE too, so concurrent requests of one script write it once."""
    now = timezone.now()
    if token.last_used_at is not None and now - token.last_used_at < LAST_USED_EVERY:
        return
    ApiToken.objects.filter(Q(last_used_at__isnull=True) | Q(last_used_at__lte=now - LAST_USED_EVERY),
                            pk=token.pk).update(last_used_at=now)
    token.last_used_at = now


def find_to_revoke(id_or_prefix: str) -> ApiToken:
    """The one token named by its id (digits, shorter than a prefix) or its full prefix.

    Raises TokenNotFound when none matches, or when several share the prefix (then their ids
    are given, to name one by id)."""
    text = id_or_prefix.strip()
    rows: QuerySet[ApiToken] = ApiToken.objects.select_related("user").order_by("pk")
    if text.isascii() and text.isdigit() and len(text) < PREFIX_CHARS:  # "²".isdigit() too
        rows = rows.filter(pk=int(text))
    elif len(text) == PREFIX_CHARS:
        rows = rows.filter(prefix=text.lower())
    else:
        raise TokenNotFound(f"{text!r} is neither a token id nor a {PREFIX_CHARS}-character prefix "
                            f"(see `manage.py api_token list`).")
    found = list(rows[:10])
    if not found:
        raise TokenNotFound(f"No API token has the id or prefix {text!r}.")
    if len(found) > 1:
        ids = ", ".join(str(token.pk) for token in found)
        raise TokenNotFound(f"Several API tokens have the prefix {text!r} (ids {ids}): name one by its id.")
    return found[0]

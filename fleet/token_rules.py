"""What an API token may do, and until when: its scope and its expiry, as pure rules.

Scopes (`fleet.choices.TokenScope`):

- `read`: GET, HEAD and OPTIONS of every API view the user may read; any write is refused.
- `write`: whatever the user may do through the API (tokens issued before scopes existed).
- `ingest`: only the views that take pushed samples (those with `api_token_ingest = True`,
  e.g. `POST /api/v1/ingest/nvidia-smi/`); every other view is refused, reads included, so a
  key left on a host that pushes telemetry reads nothing of the fleet.

`fleet.api.authentication` applies `scope_refusal` to every API request signed with a token,
before the view's own permissions, so no view can leave it out; `/metrics` applies it too.

Expiry is typed as a lifetime (`90d`, `12h`, `2w`) or an ISO 8601 date or time: a date means
its 00:00 in the server's time zone, as every other date the product reads (`config.parsing`).

Pure: no ORM, so the rules are tested without a database.
"""

from __future__ import annotations

import re
from datetime import datetime, timedelta, tzinfo

from config.parsing import ParseError, parse_time, shown
from fleet.choices import TokenScope

#: Methods a read token may use (DRF's SAFE_METHODS).
SAFE_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})
#: The scopes each scope may hand on (a token may create tokens no broader than itself).
_COVERS = {
    TokenScope.WRITE: frozenset(TokenScope.values),
    TokenScope.READ: frozenset({TokenScope.READ}),
    TokenScope.INGEST: frozenset({TokenScope.INGEST}),
}
_UNITS = {"h": ("hours", timedelta(hours=1)), "d": ("days", timedelta(days=1)), "w": ("weeks", timedelta(weeks=1))}
#: The longest lifetime in any unit (10,000 weeks is 190 years): the expiry stays a datetime.
MAX_LIFETIME_UNITS = 10_000
_LIFETIME = re.compile(r"([0-9]+)\s*([hdw])", re.ASCII | re.IGNORECASE)
_BARE_NUMBER = re.compile(r"[0-9]+", re.ASCII)
LIFETIME_HELP = "a lifetime such as 90d, 12h or 2w (days, hours, weeks)"
ISO_HELP = "an ISO 8601 date or time (2026-06-30, 2026-06-30T18:00)"
EXPIRY_HELP = f"{LIFETIME_HELP}, or {ISO_HELP}"


def scope_refusal(scope: str, method: str, *, ingest_view: bool) -> str | None:
    """Why a token of `scope` may not send `method` to a view (None: it may). `ingest_view`:
    the view takes pushed samples. The message names the scope, for the 403 a script shows."""
    if scope == TokenScope.INGEST:
        if ingest_view:
            return None
        return ("This API token's scope is ingest: it may only push samples (POST /api/v1/ingest/...), "
                "not read or change anything else.")
    if scope == TokenScope.READ and method.upper() not in SAFE_METHODS:
        return (f"This API token's scope is read: it may read (GET, HEAD, OPTIONS) but not {method.upper()}. "
                f"Use a token with scope write.")
    if scope not in _COVERS:
        return f"This API token has an unknown scope {scope!r}: issue a new token."
    return None


def covers(scope: str, other: str) -> bool:
    """Whether a token of `scope` may create a token of scope `other` (no broader than itself)."""
    return other in _COVERS.get(scope, ())


def parse_lifetime(raw: str) -> timedelta:
    """`90d`, `12h`, `2w` -> the timedelta; ParseError saying what to write otherwise."""
    text = raw.strip()
    match = _LIFETIME.fullmatch(text) if len(text) <= 12 else None
    if match is None:
        if _BARE_NUMBER.fullmatch(text) and len(text) <= 12:
            raise ParseError(f"{shown(raw)} has no unit: write {text}d (days), {text}h (hours) or {text}w (weeks).")
        raise ParseError(f"{shown(raw)} is not {LIFETIME_HELP}.")
    count, unit = int(match[1]), match[2].lower()
    name, one = _UNITS[unit]
    if not 1 <= count <= MAX_LIFETIME_UNITS:
        raise ParseError(f"{shown(raw)}: a lifetime is 1 to {MAX_LIFETIME_UNITS:,} {name}.")
    return count * one


def parse_expiry(raw: str, *, now: datetime, default_tz: tzinfo) -> datetime:
    """When a token typed as `raw` expires: `now` plus a lifetime, or an ISO 8601 date or time
    (without an offset: in `default_tz`; a date alone: its 00:00 there). ParseError when it is
    neither, or not after `now`."""
    text = raw.strip()
    if _LIFETIME.fullmatch(text) or _BARE_NUMBER.fullmatch(text):
        return now + parse_lifetime(text)
    try:
        moment = parse_time(text, default_tz=default_tz)
    except ParseError:
        raise ParseError(f"{shown(raw)} is neither {LIFETIME_HELP} nor {ISO_HELP}.") from None
    if moment <= now:
        midnight = " (a date means 00:00 of that day)" if "T" not in text.upper() and " " not in text else ""
        raise ParseError(f"{shown(raw)}{midnight} is in the past: a token must expire in the future.")
    return moment


def when(moment: datetime, tz: tzinfo) -> str:
    """A moment as messages and lists show it: "2026-06-30 18:00 UTC" in `tz`."""
    return moment.astimezone(tz).strftime("%Y-%m-%d %H:%M %Z").strip()


def check_expiry(expires_at: datetime | None, *, now: datetime, tz: tzinfo, ceiling: datetime | None = None) -> None:
    """ParseError when an expiry chosen as a datetime is not after `now`, or is later than
    `ceiling` (the expiry of the token a request that creates one is signed with), or absent
    while there is a ceiling: a token cannot outlive the token that created it."""
    if expires_at is not None and expires_at <= now:
        raise ParseError("The expiry is in the past: a token must expire in the future.")
    if ceiling is not None and (expires_at is None or expires_at > ceiling):
        raise ParseError(f"The API token this request is signed with expires on {when(ceiling, tz)}: a token it "
                         f"creates must expire by then (set an expiry no later).")

"""Signed-in sessions: how long one lasts, the record of each, and ending a user's all at once.

Two limits (config/settings.py): a session ends after SESSION_IDLE_TIMEOUT_MINUTES without a
request of the user's own, and SESSION_MAX_AGE_HOURS after sign-in however active it was. The
session carries its own stamps (signed in, last seen), so checking them costs no query:
`identity.middleware.SessionTimeoutMiddleware` calls `check_session` at every request and signs
out a session past either limit, and the sign-in page says which (`message_for`).

A page that refreshes itself is not the user: htmx elements polling with `hx-trigger="every Ns"`
send the `X-Fleet-Poll` header (static/js/polling.js adds it to every request of such an
element's own trigger), and those requests leave the last-seen stamp alone, so an overview left
open on a screen over the weekend still times out. The stamp is written at most once a minute
(SEEN_EVERY_S): a session save and one UPDATE, not a write per request.

The session engine cannot list a user's sessions, so each signed-in session also has a
`UserSession` row, written on `user_logged_in` (`on_sign_in`) and removed on `user_logged_out`
(`on_sign_out`, which the middleware's time-out goes through too). `end_sessions` reads them to
delete every session of a user through the engine's SessionStore, whichever SESSION_ENGINE is
configured (one keeping sessions on the server: `check_session_engine` refuses signed cookies).
Rows of sessions that simply stopped (the browser never came back) are swept at each sign-in
once the engine has forgotten them too (`sweep`).

For other apps: `end_sessions(user, reason)` when someone must lose access now (a directory
removing them), `live_sessions(user)` to show where someone is signed in.
"""

from __future__ import annotations

import enum
import logging
import time
from datetime import UTC, datetime, timedelta
from importlib import import_module

from django.conf import settings
from django.contrib.auth import BACKEND_SESSION_KEY, SESSION_KEY
from django.contrib.sessions.backends import signed_cookies
from django.core import checks
from django.db import transaction
from django.db.models import QuerySet
from django.utils import timezone

from config.lockout import client_address
from fleet import audit
from identity.models import UserSession

logger = logging.getLogger(__name__)

#: Session data: when the session signed in and when its user last made a request, Unix seconds;
#: the engine key the UserSession row was written under (to follow `cycle_key`).
SIGNED_IN = "_identity_signed_in"
SEEN = "_identity_seen"
ROW_KEY = "_identity_row_key"
#: The last-seen stamp is written at most this often (seconds), in the session and its row.
SEEN_EVERY_S = 60
#: What a page's own polling says about itself (static/js/polling.js); as a header it comes in META as:
POLL_HEADER = "X-Fleet-Poll"
POLL_META = "HTTP_X_FLEET_POLL"
USER_AGENT_CHARS = UserSession._meta.get_field("user_agent").max_length


class Ended(enum.StrEnum):
    """Why a session was signed out."""

    IDLE = "idle"
    LIFETIME = "lifetime"


# --- the rules (pure) -----------------------------------------------------------------------------

def idle_s() -> int:
    return settings.SESSION_IDLE_TIMEOUT_MINUTES * 60


def lifetime_s() -> int:
    return settings.SESSION_MAX_AGE_HOURS * 3600


def ended_because(signed_in: float, seen: float, now: float) -> Ended | None:
    """Why a session signed in at `signed_in` and last active at `seen` is over at `now` (Unix
    seconds), or None while it lasts. The lifetime first: a session both old and idle reached its
    limit whatever the user did. A clock set back (now before the stamps) ends nothing."""
    if now - signed_in >= lifetime_s():
        return Ended.LIFETIME
    if now - seen >= idle_s():
        return Ended.IDLE
    return None


def _count(number: int, unit: str) -> str:
    return f"{number} {unit}" if number == 1 else f"{number} {unit}s"


def duration_words(minutes: int) -> str:
    """`minutes` as a person says it: "8 hours", "30 minutes", "1 hour 30 minutes"."""
    hours, rest = divmod(minutes, 60)
    parts = ([_count(hours, "hour")] if hours else []) + ([_count(rest, "minute")] if rest else [])
    return " ".join(parts) or _count(0, "minute")


def limit_words(hours: int) -> str:
    """A lifetime of `hours` as the adjective of "its ... limit": "7-day", "12-hour"."""
    return f"{hours // 24}-day" if hours % 24 == 0 else f"{hours}-hour"


def message_for(ended: Ended) -> str:
    """What the sign-in page (or the API's 401) tells someone whose session just ended."""
    if ended == Ended.LIFETIME:
        return f"Your session reached its {limit_words(settings.SESSION_MAX_AGE_HOURS)} limit; sign in again."
    return f"You were signed out after {duration_words(settings.SESSION_IDLE_TIMEOUT_MINUTES)} without activity."


def ended_message(ended: int, usernames: list[str]) -> str:
    """What an admin is told after signing `usernames` out everywhere, `ended` sessions in all."""
    sessions = _count(ended, "session")
    if len(usernames) == 1:
        if not ended:
            return f"{usernames[0]} had no active session; nothing to end."
        return f"Signed {usernames[0]} out everywhere: {sessions} ended."
    return f"Signed {_count(len(usernames), 'user')} out everywhere: {sessions} ended."


def is_background(request) -> bool:
    """Whether the page made this request on its own (polling), not its user."""
    return bool(request.META.get(POLL_META))


# --- the engine -----------------------------------------------------------------------------------

def session_store():
    """The SessionStore class of SESSION_ENGINE."""
    return import_module(settings.SESSION_ENGINE).SessionStore


def check_session_engine(app_configs=None, **kwargs) -> list[checks.CheckMessage]:
    """A system check: the engine must keep sessions on the server, or they cannot be ended."""
    if issubclass(session_store(), signed_cookies.SessionStore):
        return [checks.Error(
            f"SESSION_ENGINE={settings.SESSION_ENGINE!r} keeps each session in the browser's cookie, so the "
            f"server cannot end it: signing a user out everywhere would leave their browsers signed in.",
            hint="Use a server-side engine: django.contrib.sessions.backends.db (the default), cache or cached_db.",
            id="identity.E001")]
    return []


# --- sign-in, sign-out, and every request -----------------------------------------------------------

def _aware(stamp: float) -> datetime:
    return datetime.fromtimestamp(stamp, UTC)


def register(request, user, signed_in: float | None = None) -> UserSession:
    """Stamp the request's session as signed in (now, unless `signed_in` says when) and seen now,
    and write its UserSession row."""
    session = request.session
    if session.session_key is None:  # flushed by login() (another user's session): give it its key now
        session.save()
    now = time.time()
    signed_in = now if signed_in is None else signed_in
    session[SIGNED_IN], session[SEEN] = int(signed_in), int(now)
    session[ROW_KEY] = session.session_key
    row, _ = UserSession.objects.update_or_create(session_key=session.session_key, defaults={
        "user": user, "signed_in_at": _aware(signed_in), "last_seen_at": _aware(now),
        "address": client_address(request),
        "user_agent": request.META.get("HTTP_USER_AGENT", "")[:USER_AGENT_CHARS],
        "backend": session.get(BACKEND_SESSION_KEY, ""),
    })
    return row


def on_sign_in(sender, request, user, **kwargs) -> None:
    """user_logged_in: record the session, and sweep rows of sessions gone for good."""
    if request is None or not hasattr(request, "session"):
        return
    register(request, user)
    sweep()


def on_sign_out(sender, request, user, **kwargs) -> None:
    """user_logged_out (a sign-out, or the middleware ending a session): forget the session's row."""
    session = getattr(request, "session", None)
    if session is None:
        return
    keys = {key for key in (session.get(ROW_KEY), session.session_key) if key}
    if keys:
        UserSession.objects.filter(session_key__in=keys).delete()


def check_session(request) -> Ended | None:
    """Why the request's session must end now (the middleware then signs it out), or None.

    Costs no query beyond loading the session (none without a session cookie), but for the
    once-a-minute stamp of a user's own request. A signed-in session without stamps (signed in
    before this check existed) is registered as signed in now."""
    if settings.SESSION_COOKIE_NAME not in request.COOKIES:
        return None
    session = request.session
    if SESSION_KEY not in session:
        return None
    now = time.time()
    signed_in, seen = session.get(SIGNED_IN), session.get(SEEN)
    if signed_in is None or seen is None:
        if request.user.is_authenticated:
            register(request, request.user)
        return None
    ended = ended_because(signed_in, seen, now)
    if ended is None and not is_background(request) and now - seen >= SEEN_EVERY_S:
        _mark_seen(request, signed_in, now)
    return ended


def _mark_seen(request, signed_in: float, now: float) -> None:
    session = request.session
    session[SEEN] = int(now)
    if UserSession.objects.filter(session_key=session.session_key).update(last_seen_at=_aware(now)):
        return
    # No row: swept while the session lay idle under longer limits than today's, or lost. Written
    # again so that `end_sessions` finds it, unless the session itself is gone (ended everywhere
    # while this request ran: its save then fails, and no row must outlive it).
    if session_store()().exists(session.session_key) and request.user.is_authenticated:
        register(request, request.user, signed_in=signed_in)


def follow_key(request) -> None:
    """After a view gave the session a new key (`cycle_key`: a password change keeps the user
    signed in under a new key), move its row to that key, so `end_sessions` still finds it."""
    session = getattr(request, "session", None)
    if session is None or not session.accessed:
        return
    old = session.get(ROW_KEY)
    if old and session.session_key and old != session.session_key:
        UserSession.objects.filter(session_key=old).update(session_key=session.session_key)
        session[ROW_KEY] = session.session_key


# --- reading and ending ---------------------------------------------------------------------------

def live_sessions(user) -> QuerySet[UserSession]:
    """`user`'s sessions that their browsers could still use, the latest active first."""
    return UserSession.objects.filter(user=user).live()


def end_sessions(user, reason: str = "") -> int:
    """Sign `user` out of every browser now; return how many live sessions that ended.

    Each session is deleted through the configured engine, so the user's next request, in any
    browser, is anonymous; their rows go too. An audit event "user.sign_out_everywhere" (by the
    current actor, `reason` as its comment) is written when a live session ended. API tokens
    are not sessions: revoke them, or deactivate the user, to stop scripts too.
    """
    store = session_store()
    with transaction.atomic():
        rows = list(UserSession.objects.filter(user=user).order_by("pk"))
        live = set(UserSession.objects.filter(pk__in=[row.pk for row in rows]).live().values_list("pk", flat=True))
        for row in rows:
            store(row.session_key).delete()
        UserSession.objects.filter(pk__in=[row.pk for row in rows]).delete()
        if live:
            audit.record("user.sign_out_everywhere", user, before={"sessions": len(live)}, after={"sessions": 0},
                         comment=reason)
    if live:
        logger.info("signed %s out everywhere: %d sessions ended%s", user.get_username(), len(live),
                    f" ({reason})" if reason else "")
    return len(live)


def sweep(now: datetime | None = None) -> int:
    """Delete the rows of sessions the engine has forgotten: last seen longer ago than a session
    cookie lasts (SESSION_COOKIE_AGE from the session's last save). Rows of sessions that are over
    but whose browser may still come back stay, so that `end_sessions` still ends them should the
    limits be raised meanwhile; pages show only `live_sessions`."""
    now = now or timezone.now()
    gone = now - timedelta(seconds=settings.SESSION_COOKIE_AGE + SEEN_EVERY_S)
    deleted, _ = UserSession.objects.filter(last_seen_at__lt=gone).delete()
    return deleted

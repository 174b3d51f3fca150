"""Read replicas: which database each query uses when DATABASE_REPLICA_URL names a PostgreSQL
standby (settings DATABASE_READ_REPLICA; docs/operations.md, "Scaling out").

What reads the replica: GET and HEAD requests (pages, API lists and details, charts) reading the
rows of fleet, telemetry and sizing, the bulk of what the web tier reads. Everything else uses
the primary:
- writes, and any request that may write (every method but GET and HEAD);
- reads inside a transaction (placement's row locks, services that read what they then change);
- sessions, users, API tokens, sign-in throttling (axes), content types, the beat schedule, and
  every app but the three above: they are read to let a request in, or to write;
- what the read cache computes to keep (config/read_cache.py): an entry stored with the table
  versions of now but computed from a replica a moment behind would be served over a write it
  never saw;
- Celery tasks, management commands and threads a request starts: no request, no replica.

Read-your-writes: a request that wrote fleet, telemetry or sizing rows reads the primary from
then on, and its client does for DATABASE_REPLICA_PIN_S seconds (15 by default, far above the lag
of a healthy standby) after any request but GET and HEAD: a browser through the cookie
`fleet_primary`, a script through a cache entry keyed by a hash of its Authorization header (its
API token). A client that drops the cookie only reads a replica a moment behind.

Without a replica the router answers None everywhere (Django's own choice: `default`), and the
middleware does nothing.
"""

from __future__ import annotations

import hashlib
import logging
from contextvars import ContextVar
from dataclasses import dataclass

from django.conf import settings
from django.core.cache import cache
from django.db import DEFAULT_DB_ALIAS, connections

from config import read_cache

log = logging.getLogger(__name__)

#: The alias of the replica in DATABASES (settings; config/test_settings.py mirrors it).
REPLICA_ALIAS = "replica"
#: Apps whose rows the pages read from the replica.
REPLICA_APPS = frozenset({"fleet", "telemetry", "sizing"})
#: Models of those apps read from the primary all the same: API tokens let a request in (and
#: their revocation must hold at once).
PRIMARY_MODELS = frozenset({"fleet.apitoken"})
#: The cookie that keeps a browser on the primary after it wrote.
PIN_COOKIE = "fleet_primary"
_PIN_KEY_PREFIX = "db-primary:"
READ_ONLY_METHODS = ("GET", "HEAD")


@dataclass
class RequestReads:
    """Where the current request's reads of replicated rows go, and whether it wrote any."""

    replica: bool
    wrote: bool = False


_request: ContextVar[RequestReads | None] = ContextVar("db_router_request", default=None)


def read_replica() -> str | None:
    """The alias pages read from, or None when every read goes to the primary."""
    return settings.DATABASE_READ_REPLICA or None


def replicated(model) -> bool:
    """Whether the rows of `model` may be read from the replica."""
    return model._meta.app_label in REPLICA_APPS and model._meta.label_lower not in PRIMARY_MODELS


class ReplicaRouter:
    """Sends a request's reads of fleet, telemetry and sizing rows to the replica (see the module)."""

    def db_for_read(self, model, **hints):
        replica = read_replica()
        if replica is None:
            return None
        state = _request.get()
        if (state is not None and state.replica and replicated(model) and not read_cache.computing()
                and not connections[DEFAULT_DB_ALIAS].in_atomic_block):
            return replica
        return DEFAULT_DB_ALIAS

    def db_for_write(self, model, **hints):
        if read_replica() is None:
            return None
        state = _request.get()
        if state is not None and replicated(model):
            # Whatever this request reads from now on must see what it wrote.
            state.replica = False
            state.wrote = True
        return DEFAULT_DB_ALIAS

    def allow_relation(self, obj1, obj2, **hints):
        replica = read_replica()
        if replica is not None and {obj1._state.db, obj2._state.db} <= {DEFAULT_DB_ALIAS, replica}:
            return True  # the same rows, one of them read from the standby
        return None

    def allow_migrate(self, db, app_label, model_name=None, **hints):
        # The standby replays the primary's migrations; nothing is ever migrated on it.
        return False if db == REPLICA_ALIAS else None


def _pin_key(authorization: str) -> str:
    return _PIN_KEY_PREFIX + hashlib.sha256(authorization.encode()).hexdigest()[:40]


def _pinned(request) -> bool:
    """Whether this client wrote lately (its reads then go to the primary)."""
    if PIN_COOKIE in request.COOKIES:
        return True
    authorization = request.META.get("HTTP_AUTHORIZATION", "")
    if not authorization:
        return False
    try:
        return cache.get(_pin_key(authorization)) is not None
    except Exception as exc:  # noqa: BLE001 - without the cache, the primary is the safe answer
        read_cache.cache_failed(exc)
        return True


def _pin(request, response) -> None:
    """Keep this client on the primary for DATABASE_REPLICA_PIN_S seconds."""
    seconds = settings.DATABASE_REPLICA_PIN_S
    authorization = request.META.get("HTTP_AUTHORIZATION", "")
    if authorization:
        try:
            cache.set(_pin_key(authorization), 1, timeout=seconds)
        except Exception as exc:  # noqa: BLE001 - the write is done; the next read may be a moment behind
            read_cache.cache_failed(exc)
        return
    response.set_cookie(PIN_COOKIE, "1", max_age=seconds, httponly=True, samesite="Lax",
                        secure=settings.SESSION_COOKIE_SECURE)


class ReplicaReadsMiddleware:
    """Lets a GET or HEAD request of a client that has not written lately read the replica, and
    keeps a client that wrote on the primary for a while (see the module)."""

    def __init__(self, get_response):
        self.get_response = get_response

    def __call__(self, request):
        if read_replica() is None:
            return self.get_response(request)
        read_only = request.method in READ_ONLY_METHODS
        state = RequestReads(replica=read_only and not _pinned(request))
        token = _request.set(state)
        try:
            response = self.get_response(request)
        finally:
            _request.reset(token)
        if state.wrote or not read_only:
            _pin(request, response)
        return response

"""The session engine: sessions kept in the database, and read through the cache when the cache is
Redis, as Django's cached_db does, so that a page costs a Redis GET instead of a query for its
session. With any other cache (the embedded mode's folder, a test's process memory) the store is
Django's database store: a copy in a cache only one process sees, or one slower than the database,
would be no gain.

The database stays the record: every save and delete goes to it first, then to the cache. Two
differences from Django's cached_db:

- A cache that cannot be reached costs its speed, never the page. Django's store reads the
  session from the database when the cache fails, then lets the failed write of what it read
  raise; here a failed cache call falls back to the database alone, and the cache is left
  alone for BACKOFF_S (a cache that times out would otherwise cost each page its timeout).
- A session stays in the cache at most CACHE_S seconds. Signing out, a session timing out and
  `identity.sessions.end_sessions` delete the cached copy with the row; if that delete fails (the
  cache unreachable at that moment, then back with its data), the copy that still signs the user
  in outlives the row by at most CACHE_S, instead of until the session's own expiry.
"""

from __future__ import annotations

import logging
import time

from django.contrib.sessions.backends import cached_db
from django.contrib.sessions.backends.db import SessionStore as DatabaseStore

from config.redis_cache import RedisCache

logger = logging.getLogger(__name__)

#: Longest a session is read from the cache without asking the database (seconds).
CACHE_S = 60
#: After a failed cache call, the sessions use the database alone for this long (seconds).
BACKOFF_S = 10
_skip_until = 0.0


def _cache_usable() -> bool:
    return time.monotonic() >= _skip_until


def _cache_failed(what: str, exc: Exception) -> None:
    global _skip_until
    if _cache_usable():
        logger.warning("session cache unreachable (%s, %s: %s): sessions use the database alone for %d s", what,
                       type(exc).__name__, exc, BACKOFF_S)
    _skip_until = time.monotonic() + BACKOFF_S


class SessionStore(cached_db.SessionStore):
    def __init__(self, session_key=None):
        super().__init__(session_key)
        self._through_cache = isinstance(self._cache, RedisCache)

    def load(self):
        if not self._through_cache:
            return DatabaseStore.load(self)
        data = None
        if _cache_usable():
            try:
                data = self._cache.get(self.cache_key)
            except Exception as exc:  # noqa: BLE001 - the database answers instead
                _cache_failed("read", exc)
        if data is not None:
            return data
        row = self._get_session_from_db()
        if row is None:
            return {}
        data = self.decode(row.session_data)
        self._keep(data, self.get_expiry_age(expiry=row.expire_date))
        return data

    def exists(self, session_key):
        if session_key and self._through_cache and _cache_usable():
            try:
                if (self.cache_key_prefix + session_key) in self._cache:
                    return True
            except Exception as exc:  # noqa: BLE001
                _cache_failed("read", exc)
        return DatabaseStore.exists(self, session_key)

    def save(self, must_create=False):
        DatabaseStore.save(self, must_create)
        self._keep(self._session, self.get_expiry_age())

    def delete(self, session_key=None):
        DatabaseStore.delete(self, session_key)
        session_key = session_key or self.session_key
        if session_key is None or not self._through_cache:
            return
        try:  # tried even while backing off: a copy left behind would sign the user in
            self._cache.delete(self.cache_key_prefix + session_key)
        except Exception as exc:  # noqa: BLE001 - the row is gone; the copy expires within CACHE_S
            _cache_failed("delete", exc)

    def _keep(self, data: dict, expiry_age: int) -> None:
        if not self._through_cache or not _cache_usable():
            return
        try:
            self._cache.set(self.cache_key, data, min(CACHE_S, expiry_age))
        except Exception as exc:  # noqa: BLE001
            _cache_failed("write", exc)

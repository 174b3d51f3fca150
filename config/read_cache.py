"""The read cache: costly reads (API list pages, the overview's figures) are reused until a table
they read changes.

Why: at a studio's scale (1,000 hosts, 7,000 VMs) one overview costs half a second of CPU and an
API list page several milliseconds, while the rows behind them change a few times a minute.
Dashboards left open and scripts polling the lists would otherwise keep a small server's cores
busy recomputing the same answer.

How it stays right: every SQL write Django makes in any process (ORM saves and deletes, bulk
operations, `QuerySet.update`, raw cursors) passes a database execute wrapper, which gives the
written table a new version in the shared cache when the statement runs and again once its
transaction commits. An entry records each table its computation read, with the table's
version read just *before* the table was first read. It is served only while all those versions
are unchanged, so a change is seen by the first read after its commit, in any process sharing
the cache (Redis in production; see settings CACHES). Versions are random tokens: a flushed or
evicted version reads as changed, never as unchanged.

Limits: writes made outside Django (psql by hand) are not seen, so entries also expire after
`max_age_s`; with no shared cache (locmem), each process sees only its own writes. If the
cache cannot be reached (Redis down), reads are computed as if nothing were cached and the page
keeps working.
"""

from __future__ import annotations

import logging
import re
import threading
import time
import uuid
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any, TypeVar

from django.conf import settings
from django.core.cache import cache, caches
from django.core.cache.backends.redis import RedisCache
from django.db import connections, transaction

log = logging.getLogger(__name__)
T = TypeVar("T")

# SQLite writes bulk_create(ignore_conflicts=True) as INSERT OR IGNORE INTO.
_WRITE_VERB = r"(?:INSERT\s+(?:OR\s+\w+\s+)?INTO|UPDATE|DELETE\s+FROM)"
_TABLE = r'\s+"?(\w+)"?'
_WRITE = re.compile(rf"\s*(?:{_WRITE_VERB}|TRUNCATE(?:\s+TABLE)?){_TABLE}", re.IGNORECASE)
# A statement of common table expressions may write in any of them (the collector stores its
# samples with WITH staged AS (DELETE ...), stored AS (INSERT INTO ...) SELECT ...).
_WITH = re.compile(r"\s*WITH\b", re.IGNORECASE)
_WRITE_IN_WITH = re.compile(rf"\b{_WRITE_VERB}{_TABLE}", re.IGNORECASE)
_READ = re.compile(r'\b(?:FROM|JOIN)\s+"?(\w+)"?', re.IGNORECASE)
_VERSION_PREFIX = "read-cache:version:"
#: Starts a version a write gave inside a transaction not committed yet (see the module's doc).
_UNCOMMITTED = "uncommitted:"
_ENTRY_PREFIX = "read-cache:entry:"
#: After the cache failed, skip it this long: a hung Redis must not add its timeout to every query.
_FAILURE_BACKOFF_S = 5.0
#: How long one request may hold the right to refresh an entry while others serve or await it.
_REFRESH_LOCK_S = 60
#: How long a request waits for the entry another request is computing, and how often it looks.
_COALESCE_WAIT_S = 3.0
_COALESCE_POLL_S = 0.02

_local = threading.local()
_failed_until = 0.0


def computing() -> bool:
    """Whether this thread is computing an entry to keep: its reads must see every committed write
    (config/db_router.py reads the primary then), or the entry would outlive a write it missed."""
    return getattr(_local, "recording", None) is not None


def enabled() -> bool:
    return settings.READ_CACHE_ENABLED and time.monotonic() >= _failed_until


def _cache_failed(exc: Exception) -> None:
    global _failed_until
    if time.monotonic() >= _failed_until:
        log.warning("read cache unreachable, reading without it for %.0f s: %s", _FAILURE_BACKOFF_S,
                    type(exc).__name__)
    _failed_until = time.monotonic() + _FAILURE_BACKOFF_S


# Table versions ------------------------------------------------------------------------------


#: Tables written while the cache could not be reached: bumped as soon as it answers again, so
#: entries stored before the outage are not served over writes made during it.
_unbumped: set[str] = set()
_unbumped_lock = threading.Lock()


def bump(tables: Iterable[str]) -> None:
    """Give each table a new version: entries that read it are no longer served."""
    _bump(tables)


def _bump(tables: Iterable[str], *, uncommitted: bool = False) -> dict[str, str]:
    """Bump `tables` (their versions marked `_UNCOMMITTED` if asked), and the tables written while
    the cache could not be reached; the new versions of `tables`, {} if they could not be set."""
    if not settings.READ_CACHE_ENABLED:
        return {}
    tables = set(tables)
    with _unbumped_lock:
        earlier = _unbumped - tables
    if not enabled():
        with _unbumped_lock:
            _unbumped.update(tables)
        return {}
    new = {table: uuid.uuid4().hex for table in earlier}
    mine = {table: (_UNCOMMITTED if uncommitted else "") + uuid.uuid4().hex for table in tables}
    try:
        cache.set_many({_VERSION_PREFIX + table: version for table, version in {**new, **mine}.items()}, timeout=None)
    except Exception as exc:  # noqa: BLE001 - an unreachable cache must not fail the write
        with _unbumped_lock:
            _unbumped.update(tables, earlier)
        _cache_failed(exc)
        return {}
    with _unbumped_lock:
        _unbumped.difference_update(tables, earlier)
    return mine


def versions(tables: Iterable[str]) -> dict[str, str]:
    """The current version of each table; a table without one gets one (set only if still absent,
    so a concurrent bump is never overwritten)."""
    keys = {_VERSION_PREFIX + table: table for table in tables}
    found = cache.get_many(list(keys))
    for key in keys.keys() - found.keys():
        cache.add(key, uuid.uuid4().hex, timeout=None)
        found[key] = cache.get(key)
    return {keys[key]: value for key, value in found.items()}


def pending_bumps() -> bool:
    """Whether writes this process made while the cache was unreachable are still not bumped (tried
    again now): until they are, nothing cached may be trusted over them."""
    if _unbumped:
        bump(())
    return bool(_unbumped)


def cache_failed(exc: Exception) -> None:
    """Note that the cache could not be reached: it is left alone for a few seconds."""
    _cache_failed(exc)


@dataclass
class _PendingBumps:
    """Tables written in the current transaction; bumped again by `flush` once it commits.
    `versions`: those its writes gave, marked uncommitted, which this transaction alone must
    not read through."""

    tables: set[str] = field(default_factory=set)
    versions: set[str] = field(default_factory=set)

    def flush(self) -> None:
        bump(self.tables)


def _own_uncommitted_versions() -> set[str]:
    """The uncommitted versions written by this thread's open transactions."""
    own: set[str] = set()
    for connection in connections.all(initialized_only=True):
        pending = connection.__dict__.get("_read_cache_pending")
        if pending is not None and connection.in_atomic_block:
            own |= pending.versions
    return own


def _written(connection, tables: list[str]) -> None:
    """Bump `tables` now (one cache round trip for them all) and, inside a transaction, again once it commits."""
    if not tables:
        return
    if not connection.in_atomic_block:
        bump(tables)
        return
    pending = connection.__dict__.get("_read_cache_pending")
    # The callback leaves run_on_commit when the transaction ends or its savepoint rolls back.
    if pending is None or not any(func == pending.flush for _, func, _ in connection.run_on_commit):
        pending = _PendingBumps()
        connection.__dict__["_read_cache_pending"] = pending
        transaction.on_commit(pending.flush, using=connection.alias)
    pending.tables.update(tables)
    # At once as well, for each statement: a read in this transaction, between two writes, must
    # not be served the rows before the second. Marked uncommitted: other readers go on being
    # served what they were until the commit.
    pending.versions.update(_bump(tables, uncommitted=True).values())


def written(connection, tables: Iterable[str]) -> None:
    """Note writes the execute wrapper cannot see (COPY through the driver): the tables get new
    versions now and again once the transaction commits, as for any other write."""
    _written(connection, list(tables))


def written_tables(sql: str) -> list[str]:
    """The tables a statement writes ([] for a read)."""
    write = _WRITE.match(sql)
    if write:
        return [write.group(1)]
    return _WRITE_IN_WITH.findall(sql) if _WITH.match(sql) else []


def execute_wrapper(execute, sql, params, many, context):
    """Sees every statement: bumps the tables written, and notes the tables read by a computation
    being cached, with their versions taken before the read."""
    if isinstance(sql, str):
        written = written_tables(sql)
        if written:
            _written(context["connection"], written)
        else:
            recording = getattr(_local, "recording", None)
            if recording is not None:
                new = set(_READ.findall(sql)) - recording.keys()
                if new:
                    try:
                        recording.update(versions(new))
                    except Exception as exc:  # noqa: BLE001 - the read goes on; its result is not kept
                        _cache_failed(exc)
                        _local.unkept = True
    return execute(sql, params, many, context)


def install(connection, **kwargs) -> None:
    """Add the wrapper to a new database connection (the `connection_created` signal)."""
    if execute_wrapper not in connection.execute_wrappers:
        connection.execute_wrappers.append(execute_wrapper)


# Entries -------------------------------------------------------------------------------------


@dataclass
class _Entry:
    value: Any
    versions: dict[str, str]
    computed_at: float  # time.time()


def cached(key: str, compute: Callable[[], T], *, max_age_s: float, lazy_prefixes: tuple[str, ...] = (),
           should_store: Callable[[T], bool] = lambda value: True, along: Iterable[str] = ()) -> T:
    """`compute()`, or its earlier value if no table it read has changed since and it is younger
    than `max_age_s`.

    Tables whose names start with one of `lazy_prefixes` (telemetry written by every poll) do
    not make the entry stale; only its age does. While one request refreshes an entry that is
    merely old, the others are served the old value rather than all computing it at once. An
    entry whose tables changed is never served (a write not committed yet changes nothing for
    the readers outside its transaction): requests arriving while another computes it wait for
    that result (taken only if it holds the current versions) instead, one of them computing it
    again if it came already stale.

    `along`: keys of entries the same request will ask for next (an API token's, then the list
    page of its user): fetched in the same round trip and kept for this thread until asked for
    or `forget_fetched_along()`, which the request must call when it ends.
    """
    if not enabled() or computing():
        return compute()
    entry_key = _ENTRY_PREFIX + key
    if _unbumped:
        bump(())
        if _unbumped:
            return compute()
    lock_key = entry_key + ":refreshing"
    locked = False
    try:
        entry, current = _entry_and_versions(entry_key, [_ENTRY_PREFIX + other for other in along])
        still_true = entry is not None and (_unchanged(entry, current, lazy_prefixes)
                                            or _changed_only_by_others_uncommitted(entry, current, lazy_prefixes))
        if still_true and time.time() - entry.computed_at < max_age_s:
            return entry.value
        locked = cache.add(lock_key, 1, timeout=_REFRESH_LOCK_S)
        if not locked:
            if still_true:
                return entry.value  # merely old: served while another request refreshes it
            # Changed or missing, and another request is computing it: take its result rather
            # than compute the same at the same time, if it holds the current versions.
            waited, locked = _wait_for_refresh(entry_key, lock_key, lazy_prefixes, max_age_s)
            if waited is not None:
                return waited.value
    except Exception as exc:  # noqa: BLE001 - an unreachable cache means computing, not failing
        _cache_failed(exc)
        return compute()

    try:
        return _compute_and_keep(entry_key, compute, max_age_s, should_store)
    finally:
        if locked:
            try:
                cache.delete(lock_key)
            except Exception as exc:  # noqa: BLE001
                _cache_failed(exc)


def _unchanged(entry: _Entry, current: dict[str, str], lazy_prefixes: tuple[str, ...]) -> bool:
    return all(current.get(table) == version or table.startswith(lazy_prefixes)
               for table, version in entry.versions.items())


def _changed_only_by_others_uncommitted(entry: _Entry, current: dict[str, str], lazy_prefixes: tuple[str, ...]) -> bool:
    """Whether every table whose version changed since `entry` was computed was last written by a
    transaction not committed yet, of another thread or process: for this reader the rows are
    still those the entry was computed from."""
    changed = [current.get(table) for table, version in entry.versions.items()
               if current.get(table) != version and not table.startswith(lazy_prefixes)]
    if not all(version is not None and version.startswith(_UNCOMMITTED) for version in changed):
        return False
    return not _own_uncommitted_versions().intersection(changed)


def _wait_for_refresh(entry_key: str, lock_key: str, lazy_prefixes: tuple[str, ...],
                      max_age_s: float) -> tuple[_Entry | None, bool]:
    """The entry another request is computing, once stored with the current versions, or (None,
    True) once this request took over the right to compute it: the other one gave up or stored
    a result already stale (a write during its computation), and of the requests waiting, one
    computes it again while the others go on waiting. (None, False) if nothing comes within
    _COALESCE_WAIT_S: computed here then."""
    deadline = time.monotonic() + _COALESCE_WAIT_S
    while time.monotonic() < deadline:
        time.sleep(_COALESCE_POLL_S)
        entry, current = _entry_and_versions(entry_key)
        if entry is not None and _unchanged(entry, current, lazy_prefixes) and \
                time.time() - entry.computed_at < max_age_s:
            return entry, False
        if cache.get(lock_key) is None and cache.add(lock_key, 1, timeout=_REFRESH_LOCK_S):
            return None, True
    return None, False


def _compute_and_keep(entry_key: str, compute: Callable[[], T], max_age_s: float,
                      should_store: Callable[[T], bool]) -> T:
    _local.recording, _local.unkept = {}, False
    computed_at = time.time()
    try:
        value = compute()
        recorded, unkept = _local.recording, _local.unkept
    finally:
        _local.recording = None
    if should_store(value) and not unkept:
        try:
            cache.set(entry_key, _Entry(value, recorded, computed_at), timeout=max(int(max_age_s) * 4, 60))
            if len(_tables_of) >= _TABLES_OF_MAX:  # paths with ever new queries must not grow it forever
                _tables_of.clear()
            _tables_of[entry_key] = tuple(recorded)
        except Exception as exc:  # noqa: BLE001
            _cache_failed(exc)
    return value


#: The tables each entry read, as last seen by this process: the entry and their versions are
#: then fetched in one round trip.
_tables_of: dict[str, tuple[str, ...]] = {}
_TABLES_OF_MAX = 10_000


def _entry_and_versions(entry_key: str, along: list[str] | None = None) -> tuple[_Entry | None, dict[str, str]]:
    """The entry under `entry_key` and the current versions of the tables it read; with `along`,
    the entries under those keys and their tables' versions too, in the same round trip, kept
    for this thread's next asking."""
    found = _fetch(entry_key, along)
    entry = found.get(entry_key)
    if entry is None:
        return None, {}
    if set(entry.versions) != set(_tables_of.get(entry_key, ())):  # first sight here, or it reads other tables now
        _tables_of[entry_key] = tuple(entry.versions)
        return entry, versions(entry.versions)
    return entry, _versions_found(entry.versions, found)


def _fetch(entry_key: str, along: list[str] | None) -> dict[str, Any]:
    """In one round trip, the entry under `entry_key`, those under `along`, and the versions of
    the tables each read when this process last saw it; or, for a key an earlier call fetched
    along, what that round trip found (once)."""
    fetched = getattr(_local, "fetched_along", None)
    if fetched and entry_key in fetched:
        return fetched.pop(entry_key)
    keys = [entry_key, *(along or ())]
    found = cache.get_many([*keys, *(_VERSION_PREFIX + table for key in keys for table in _tables_of.get(key, ()))])
    if along:
        _local.fetched_along = dict.fromkeys(along, found)
    return found


def _versions_found(tables: Iterable[str], found: dict[str, Any]) -> dict[str, str]:
    return {table: found[_VERSION_PREFIX + table] for table in tables if _VERSION_PREFIX + table in found}


def forget_fetched_along() -> None:
    """Drop what `cached(along=...)` fetched for this thread and nobody asked for: a later request
    must read the versions of its own time."""
    _local.fetched_along = None


def clear(**signal_kwargs) -> None:
    """Forget every entry and version, and this process's memory of them: after `migrate` (new
    code must not serve what the previous release computed), for tests, and for operators after
    a change made outside Django (SQL by hand).

    In Redis only this deployment's read-cache keys go: the database may be the broker's too
    (CACHE_URL defaults to REDIS_URL), where emptying it would drop the queued tasks.
    """
    global _failed_until
    _failed_until = 0.0
    with _unbumped_lock:
        _unbumped.clear()
    _tables_of.clear()
    if isinstance(caches["default"], RedisCache):
        backend = caches["default"]
        client = backend._cache.get_client(write=True)
        keys = list(client.scan_iter(match=backend.make_key("read-cache:*"), count=1000))
        for start in range(0, len(keys), 500):
            client.delete(*keys[start:start + 500])
    else:
        cache.clear()


def clear_after_migrate(**signal_kwargs) -> None:
    """`post_migrate`: start an upgraded release with an empty read cache. A cache that cannot be
    reached is no reason to fail the migration: its entries expire by themselves."""
    try:
        clear()
    except Exception as exc:  # noqa: BLE001
        log.warning("read cache not emptied after migrate (%s); entries of the previous release expire within "
                    "a minute", type(exc).__name__)

"""Fixtures of the fault tests: one private PostgreSQL cluster per run (a migrated template database,
copied for each test), a private Redis per test, and a `Stack` of the dashboard's processes
against them.

The test process reads and writes the test's database through Django's ORM: the `default`
connection is pointed at it for the duration of the test (and the content type cache
cleared, since ids differ from the run's own test database).
"""

from __future__ import annotations

import contextlib
import secrets
import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path

import dj_database_url
import pytest

from config.settings import cache_backend, cache_key_prefix
from faults.services import PostgresCluster, RedisServer, child_env, python
from faults.stack import POLL_INTERVAL_S, STALE_AFTER_S, TEMPLATE_DB, Stack, orm_on


@pytest.fixture(scope="session")
def pg_cluster() -> Iterator[PostgresCluster]:
    cluster = PostgresCluster()
    cluster.init()
    cluster.start()
    try:
        cluster.sql(f"CREATE DATABASE {TEMPLATE_DB}")
        env = child_env(DATABASE_URL=cluster.url(TEMPLATE_DB), TELEMETRY_POLL_INTERVAL_S=str(POLL_INTERVAL_S),
                        DJANGO_SETTINGS_MODULE="faults.settings", SECRET_KEY="migrate-only")
        done = subprocess.run([python(), "manage.py", "migrate", "--noinput"], env=env, capture_output=True,
                              text=True, cwd=Path(__file__).resolve().parent.parent)
        assert done.returncode == 0, done.stdout + done.stderr
        yield cluster
    finally:
        with contextlib.suppress(RuntimeError):
            cluster.stop()
        cluster.remove()


@pytest.fixture
def stack(pg_cluster, tmp_path, settings, django_db_blocker) -> Iterator[Stack]:
    """A fresh database copied from the migrated template, a private Redis, and the ORM on that database."""
    database = f"faults_{uuid.uuid4().hex[:10]}"
    pg_cluster.sql(f"CREATE DATABASE {database} TEMPLATE {TEMPLATE_DB}")
    redis = RedisServer(tmp_path)
    redis.start()
    # The children derive agent tokens from the same key as this process.
    secret = secrets.token_urlsafe(32)
    settings.SECRET_KEY = settings.AGENT_TOKEN_KEY = secret
    settings.TELEMETRY_POLL_INTERVAL_S = POLL_INTERVAL_S
    settings.TELEMETRY_STALE_AFTER_S = STALE_AFTER_S
    result = Stack(tmp_path, pg_cluster, database, redis, secret)
    # This process writes to the stack's database too: its writes must reach the read cache the
    # stack's web server reads (config/read_cache.py), under the keys the children use.
    settings.CACHES = {"default": {**cache_backend(redis.url),
                                   "KEY_PREFIX": cache_key_prefix(dj_database_url.parse(result.database_url))}}
    try:
        with django_db_blocker.unblock(), orm_on(result.database_url):
            yield result
    finally:
        result.stop()
        redis.stop()
        pg_cluster.ensure_running()
        with contextlib.suppress(Exception):
            pg_cluster.sql(f"DROP DATABASE IF EXISTS {database} WITH (FORCE)")

"""Sessions read through a real Redis (identity/session_store.py, the engine of a deployment whose
cache is Redis), which stops and comes back.

What must hold: a signed-in browser's pages read its session from Redis, not the database; signing
out and `end_sessions` refuse the session at once though Redis held a copy; with Redis down,
pages answer and signing out works, from the database alone; a copy that a failed delete left in
Redis signs nobody in past CACHE_S.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator

import pytest
from django.conf import settings
from django.contrib.sessions.models import Session
from django.db import connection
from django.test import Client
from django.test.utils import CaptureQueriesContext

from config.redis_cache import RedisCache
from config.settings import cache_backend
from faults.services import RedisServer
from fleet.tests.factories import UserFactory
from identity import session_store, sessions
from identity.tests.sessions_world import sign_in, signed_in

pytestmark = [pytest.mark.faults, pytest.mark.django_db]


@pytest.fixture
def redis_server(settings, tmp_path, monkeypatch) -> Iterator[RedisServer]:
    server = RedisServer(tmp_path)
    server.start()
    settings.CACHES = {"default": {**cache_backend(server.url), "KEY_PREFIX": "sessions-test"}}
    settings.SESSION_ENGINE = "identity.session_store"
    monkeypatch.setattr(session_store, "_skip_until", 0.0)
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def ana(db):
    return UserFactory(username="ana")


def same_session(client: Client) -> Client:
    """Another client holding `client`'s session cookie (a second tab, or a stolen cookie)."""
    other = Client()
    other.cookies[settings.SESSION_COOKIE_NAME] = client.cookies[settings.SESSION_COOKIE_NAME].value
    return other


def session_queries(captured: CaptureQueriesContext) -> list[str]:
    return [query["sql"] for query in captured.captured_queries if "django_session" in query["sql"]]


def test_a_signed_in_page_reads_its_session_from_redis_and_signing_out_ends_it_at_once(redis_server, ana):
    browser = sign_in("ana")
    assert signed_in(browser)
    with CaptureQueriesContext(connection) as captured:
        assert signed_in(browser)
    assert session_queries(captured) == []  # read from Redis

    copy = same_session(browser)
    assert signed_in(copy)
    assert browser.post("/logout/").status_code == 302
    assert not signed_in(copy)
    assert not Session.objects.exists()


def test_ending_every_session_of_a_user_refuses_sessions_redis_held(redis_server, ana):
    desk, laptop = sign_in("ana"), sign_in("ana")
    assert signed_in(desk)
    assert signed_in(laptop)

    assert sessions.end_sessions(ana) == 2

    assert not signed_in(desk)
    assert not signed_in(laptop)


def test_with_redis_down_pages_answer_and_signing_out_works_from_the_database(redis_server, ana, caplog):
    desk, laptop = sign_in("ana"), sign_in("ana")
    assert signed_in(desk)
    assert signed_in(laptop)

    redis_server.stop()
    with caplog.at_level(logging.WARNING, logger="identity.session_store"):
        assert signed_in(desk)
        assert signed_in(laptop)
        assert sessions.end_sessions(ana) == 2
        assert not signed_in(desk)
        late = sign_in("ana")  # signing in needs no Redis either
        assert signed_in(late)
    assert "session cache unreachable" in caplog.text

    redis_server.start()  # empty, as a restarted Redis without persistence
    session_store._skip_until = 0.0  # the back-off over, as BACKOFF_S later
    assert not signed_in(laptop)
    assert signed_in(late)


def test_a_copy_a_failed_delete_left_in_redis_signs_nobody_in_past_cache_s(redis_server, ana, monkeypatch):
    monkeypatch.setattr(session_store, "CACHE_S", 1)
    browser = sign_in("ana")
    assert signed_in(browser)

    def unreachable(*args, **kwargs):
        raise ConnectionError("Error 111 connecting to redis. Connection refused.")

    with monkeypatch.context() as outage:
        outage.setattr(RedisCache, "delete", unreachable)  # Redis unreachable just as the session ends
        assert sessions.end_sessions(ana) == 1
    session_store._skip_until = 0.0  # Redis answers again, still holding the copy
    assert not Session.objects.exists()
    assert signed_in(browser)  # the copy, for now

    time.sleep(session_store.CACHE_S + 0.2)
    assert not signed_in(browser)

"""Read replicas (config/db_router.py): a page's reads of fleet rows go to the replica alias, writes
and what lets a request in to the primary, a client that wrote reads the primary for a while, and
without DATABASE_REPLICA_URL there is no replica at all.

The test settings define `replica` as a mirror of the test database (config/test_settings.py),
with routing off; these tests turn it on. A mirror is a second connection, which sees only
committed rows, as a standby does: the tests that read through it commit what they write
(transaction=True; serialized_rollback gives the catalog back afterwards).
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
from django.core.cache import cache
from django.db import connections, transaction
from django.http import HttpResponse
from django.test import Client, RequestFactory
from django.test.utils import CaptureQueriesContext

from config import db_router
from fleet.api_tokens import issue_token, mark_used
from fleet.models import Host
from fleet.tests.factories import HostFactory, UserFactory
from telemetry import tasks
from telemetry.tests.loopback import polled_agent

ROOT = Path(__file__).resolve().parents[1]
BOTH = ["default", "replica"]
#: The test settings mirror the test database as `replica` on PostgreSQL only (replicas are a
#: PostgreSQL deployment's: DATABASE_REPLICA_URL needs DATABASE_URL); on SQLite a second connection
#: to the test database would close and lock the first one's.
POSTGRES_ONLY = pytest.mark.skipif("replica" not in connections.settings,
                                   reason="a replica mirrors a PostgreSQL test database only")


def COMMITTED(test):  # noqa: N802 - a mark, named as one
    return POSTGRES_ONLY(pytest.mark.django_db(transaction=True, serialized_rollback=True, databases=BOTH)(test))


@pytest.fixture
def replica_reads(settings):
    """Routing on, as DATABASE_REPLICA_URL turns it on in production."""
    settings.DATABASE_READ_REPLICA = "replica"
    settings.DATABASE_REPLICA_PIN_S = 15


@contextlib.contextmanager
def queries():
    """The statements sent to each alias meanwhile: .primary and .replica (lists of SQL)."""
    with CaptureQueriesContext(connections["default"]) as primary, \
            CaptureQueriesContext(connections["replica"]) as replica:
        seen = SimpleNamespace(primary=[], replica=[])
        yield seen
    seen.primary[:] = [query["sql"] for query in primary.captured_queries]
    seen.replica[:] = [query["sql"] for query in replica.captured_queries]


def read_tables(statements: list[str]) -> set[str]:
    return {table for sql in statements for table in re.findall(r'\bFROM "(\w+)"', sql)}


def written_tables(statements: list[str]) -> set[str]:
    return {table for sql in statements for table in re.findall(r'^\s*(?:INSERT INTO|UPDATE|DELETE FROM) "(\w+)"', sql)}


@pytest.fixture
def browser(db):
    """A signed-in admin's browser (session cookie)."""
    client = Client()
    client.force_login(UserFactory(username="admin", is_staff=True, is_superuser=True))
    return client


# -- pages and the API with a replica --------------------------------------------------------------


@COMMITTED
@pytest.mark.usefixtures("replica_reads")
def test_a_pages_fleet_rows_are_read_from_the_replica_and_who_signed_in_from_the_primary(browser):
    HostFactory(name="render-07")

    with queries() as seen:
        response = browser.get("/hosts/")

    assert response.status_code == 200
    assert "render-07" in response.content.decode()
    assert "fleet_host" in read_tables(seen.replica)
    assert "fleet_host" not in read_tables(seen.primary)
    # the session and the user let the request in: always the primary's
    assert {"django_session", "auth_user"} <= read_tables(seen.primary)
    assert not {"django_session", "auth_user"} & read_tables(seen.replica)
    assert db_router.PIN_COOKIE not in response.cookies, "a read keeps the browser on the replica"


@COMMITTED
@pytest.mark.usefixtures("replica_reads")
def test_a_write_goes_to_the_primary_and_keeps_the_browser_there_for_15_s(browser):
    HostFactory(name="render-07")

    with queries() as seen:
        created = browser.post("/api/v1/hosts/", {"name": "render-08", "cpu_threads": 64, "ram_gib": 512},
                               content_type="application/json")

    assert created.status_code == 201
    assert "fleet_host" in written_tables(seen.primary)
    assert seen.replica == [], "nothing of a write's request reads the replica"
    cookie = created.cookies[db_router.PIN_COOKIE]
    assert cookie["max-age"] == 15
    assert cookie["httponly"]

    # Its next page shows the host it just created, read from the primary (read-your-writes).
    with queries() as seen:
        page = browser.get("/hosts/")
    assert "render-08" in page.content.decode()
    assert "fleet_host" in read_tables(seen.primary)
    assert seen.replica == []

    # Once the cookie lapses, its pages read the replica again.
    browser.cookies.pop(db_router.PIN_COOKIE)
    with queries() as seen:
        page = browser.get("/hosts/")
    assert "render-08" in page.content.decode()
    assert "fleet_host" in read_tables(seen.replica)


@COMMITTED
@pytest.mark.usefixtures("replica_reads")
def test_an_api_token_that_wrote_reads_the_primary_for_a_while_and_other_tokens_the_replica():
    admin = UserFactory(username="automation", is_staff=True, is_superuser=True)
    _, writer_key = issue_token(admin, "writer")
    _, reader_key = issue_token(admin, "reader")
    host = HostFactory(name="render-07")
    writer = Client(HTTP_AUTHORIZATION=f"Token {writer_key}")
    reader = Client(HTTP_AUTHORIZATION=f"Token {reader_key}")
    detail = f"/api/v1/hosts/{host.pk}/"

    with queries() as seen:
        assert writer.get(detail).json()["name"] == "render-07"
    assert "fleet_host" in read_tables(seen.replica)
    assert "fleet_apitoken" in read_tables(seen.primary), "a token is checked on the primary"
    assert "fleet_apitoken" not in read_tables(seen.replica)

    created = writer.post("/api/v1/hosts/", {"name": "render-08", "cpu_threads": 64, "ram_gib": 512},
                          content_type="application/json")
    assert created.status_code == 201
    assert db_router.PIN_COOKIE not in created.cookies, "a script's pin is kept by its token, not a cookie"

    with queries() as seen:
        assert writer.get(f"/api/v1/hosts/{created.json()['id']}/").status_code == 200
    assert "fleet_host" in read_tables(seen.primary)
    assert seen.replica == []

    with queries() as seen:
        assert reader.get(detail).status_code == 200
    assert "fleet_host" in read_tables(seen.replica), "another token did not write: the replica serves it"

    cache.clear()  # the writer's pin lapsed
    with queries() as seen:
        assert writer.get(detail).status_code == 200
    assert "fleet_host" in read_tables(seen.replica)


@COMMITTED
@pytest.mark.usefixtures("replica_reads")
def test_what_the_read_cache_keeps_is_computed_from_the_primary(browser):
    """An API list is kept in the read cache with the tables' versions of now: computed from a
    standby a moment behind, it would be served over a write it never saw."""
    HostFactory(name="render-07")
    with queries() as seen:
        response = browser.get("/api/v1/hosts/")
    assert [row["name"] for row in response.json()["results"]] == ["render-07"]
    assert "fleet_host" in read_tables(seen.primary)
    assert "fleet_host" not in read_tables(seen.replica)


@COMMITTED
@pytest.mark.usefixtures("replica_reads")
def test_a_get_that_writes_fleet_rows_pins_its_client_and_other_writes_do_not():
    """Writes of rows the pages read from the replica pin the client; a session's or a token's
    bookkeeping on a GET (read from the primary anyway) does not."""
    admin = UserFactory(username="automation", is_staff=True)
    token, _ = issue_token(admin, "script")

    def writes_a_host(request):
        Host.objects.create(name="made-by-a-get", cpu_threads=8, ram_gib=64)
        with queries() as seen:
            assert Host.objects.filter(name="made-by-a-get").exists()
        assert seen.replica == [], "after its write, the request reads the primary"
        return HttpResponse("ok")

    def stamps_its_token(request):
        mark_used(token)
        return HttpResponse("ok")

    wrote = db_router.ReplicaReadsMiddleware(writes_a_host)(RequestFactory().get("/"))
    assert wrote.cookies[db_router.PIN_COOKIE]["max-age"] == 15
    stamped = db_router.ReplicaReadsMiddleware(stamps_its_token)(RequestFactory().get("/"))
    assert db_router.PIN_COOKIE not in stamped.cookies


@COMMITTED
@pytest.mark.usefixtures("replica_reads")
def test_reads_inside_a_transaction_go_to_the_primary():
    """A service reading what it then changes (placement's row locks) reads the primary."""
    HostFactory(name="render-07")
    reads = db_router.RequestReads(replica=True)
    context = db_router._request.set(reads)
    try:
        with queries() as outside:
            assert Host.objects.get().name == "render-07"
        with queries() as inside, transaction.atomic():
            assert Host.objects.select_for_update().get().name == "render-07"
    finally:
        db_router._request.reset(context)
    assert "fleet_host" in read_tables(outside.replica)
    assert "fleet_host" in read_tables(inside.primary)
    assert inside.replica == []


@COMMITTED
@pytest.mark.usefixtures("replica_reads")
def test_celery_tasks_and_commands_read_the_primary():
    """No request, no replica: a task claims and reads agents on the primary."""
    polled_agent("render-07", "http://127.0.0.1:9")
    with queries() as seen:
        summary = tasks.poll_agents.run()
        assert Host.objects.count() == 0
    assert summary["agents"] == 1
    assert "telemetry_agent" in read_tables(seen.primary)
    assert seen.replica == []


# -- without a replica ---------------------------------------------------------------------------


@POSTGRES_ONLY
@pytest.mark.django_db(databases=BOTH)
def test_without_a_replica_every_read_and_write_is_the_primarys_and_nothing_is_pinned(browser):
    """The test settings' default, as a deployment without DATABASE_REPLICA_URL."""
    HostFactory(name="render-07")
    with queries() as seen:
        page = browser.get("/hosts/")
        created = browser.post("/api/v1/hosts/", {"name": "render-08", "cpu_threads": 64, "ram_gib": 512},
                               content_type="application/json")
    assert page.status_code == 200
    assert "render-07" in page.content.decode()
    assert created.status_code == 201
    assert "fleet_host" in read_tables(seen.primary)
    assert seen.replica == []
    assert db_router.PIN_COOKIE not in page.cookies
    assert db_router.PIN_COOKIE not in created.cookies


# Prints what the settings made of the environment, or the error that stopped them.
SHOW_DATABASES = """
import json
from django.core.exceptions import ImproperlyConfigured
try:
    from config import settings
except ImproperlyConfigured as exc:
    print(json.dumps({"error": str(exc)}))
else:
    replica = settings.DATABASES.get("replica")
    print(json.dumps({"aliases": sorted(settings.DATABASES), "read_replica": settings.DATABASE_READ_REPLICA,
                      "replica": replica and {key: replica.get(key)
                                              for key in ("HOST", "NAME", "PASSWORD", "OPTIONS", "TEST")},
                      "routers": settings.DATABASE_ROUTERS}))
"""


def databases_of(**env: str | None) -> dict:
    environment = {k: v for k, v in os.environ.items()
                   if not k.startswith(("DATABASE_", "POSTGRES_", "DJANGO_")) and k != "DEBUG"}
    environment.update(DEBUG="true", PYTHONPATH=str(ROOT))
    environment.update({k: v for k, v in env.items() if v is not None})
    result = subprocess.run([sys.executable, "-c", SHOW_DATABASES], cwd=ROOT, env=environment, capture_output=True,
                            text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout.strip().splitlines()[-1])


def test_without_database_replica_url_there_is_no_replica_alias():
    shown = databases_of(DATABASE_URL="postgres://fleet@db:5432/fleet")
    assert shown["aliases"] == ["default"]
    assert shown["read_replica"] is None


def test_database_replica_url_adds_a_read_only_replica_the_tests_never_create():
    shown = databases_of(DATABASE_URL="postgres://fleet@db:5432/fleet",
                         DATABASE_REPLICA_URL="postgres://fleet@db-replica:5432/fleet", POSTGRES_PASSWORD="s3cret")
    assert shown["aliases"] == ["default", "replica"]
    assert shown["read_replica"] == "replica"
    replica = shown["replica"]
    assert (replica["HOST"], replica["NAME"]) == ("db-replica", "fleet")
    assert replica["PASSWORD"] == "s3cret", "the server's password serves the standby too"
    assert replica["OPTIONS"]["options"] == "-c default_transaction_read_only=on"
    assert replica["TEST"] == {"MIRROR": "default"}
    assert shown["routers"] == ["config.db_router.ReplicaRouter"]


def test_a_replica_without_a_primary_postgresql_stops_start_up():
    shown = databases_of(DATABASE_REPLICA_URL="postgres://fleet@db-replica:5432/fleet")
    assert shown["error"].startswith("DATABASE_REPLICA_URL is set but DATABASE_URL is not")

"""The read cache (config/read_cache.py): lists and the overview are reused, and never shown
stale after a write, however the write was made."""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import threading
import time

import pytest
from django.core.cache import cache, caches
from django.db import connection, transaction
from django.test.utils import CaptureQueriesContext

from config import read_cache
from fleet.models import Host
from fleet.tests.factories import HostFactory
from telemetry.models import GpuSample

pytestmark = pytest.mark.django_db

HOSTS = "/api/v1/hosts/"


def host_names(client) -> list[str]:
    response = client.get(HOSTS)
    assert response.status_code == 200
    return [row["name"] for row in response.json()["results"]]


def queries_of(client, path: str) -> int:
    with CaptureQueriesContext(connection) as captured:
        assert client.get(path).status_code == 200
    return len(captured)


def test_a_list_read_twice_is_served_without_reading_the_database_again(admin_api):
    HostFactory(name="gpu-01")
    assert queries_of(admin_api, HOSTS) > 0
    assert queries_of(admin_api, HOSTS) == 0
    assert host_names(admin_api) == ["gpu-01"]


@pytest.mark.parametrize("write", ["orm", "queryset_update", "bulk_create", "raw_sql", "api"])
def test_every_kind_of_write_is_seen_by_the_next_read(admin_api, write):
    host = HostFactory(name="gpu-01")
    assert host_names(admin_api) == ["gpu-01"]
    if write == "orm":
        host.name = "gpu-renamed"
        host.save()
    elif write == "queryset_update":
        Host.objects.filter(pk=host.pk).update(name="gpu-renamed")
    elif write == "bulk_create":
        Host.objects.bulk_create([HostFactory.build(name="gpu-renamed")])
        Host.objects.filter(pk=host.pk).delete()

    elif write == "raw_sql":
        with connection.cursor() as cursor:
            cursor.execute(f"UPDATE {Host._meta.db_table} SET name = %s WHERE id = %s", ["gpu-renamed", host.pk])
    else:
        assert admin_api.patch(f"{HOSTS}{host.pk}/", {"name": "gpu-renamed"}, format="json").status_code == 200
    assert host_names(admin_api) == ["gpu-renamed"]


def test_rows_added_ignoring_conflicts_are_seen(admin_api):
    """How the collector stores what agents discover (INSERT OR IGNORE on SQLite, ON CONFLICT DO
    NOTHING on PostgreSQL)."""
    HostFactory(name="gpu-01")
    assert host_names(admin_api) == ["gpu-01"]
    Host.objects.bulk_create([HostFactory.build(name="gpu-02")], ignore_conflicts=True)
    assert host_names(admin_api) == ["gpu-01", "gpu-02"]


@pytest.mark.parametrize(("sql", "tables"), [
    ('INSERT INTO "fleet_host" ("name") VALUES (%s)', ["fleet_host"]),
    ('INSERT OR IGNORE INTO "fleet_host" ("name") VALUES (?)', ["fleet_host"]),
    ('UPDATE "fleet_gpu" SET "mode" = %s', ["fleet_gpu"]),
    ('DELETE FROM "fleet_vgpu" WHERE "id" IN (%s)', ["fleet_vgpu"]),
    ("WITH staged_0 AS (DELETE FROM ingest_telemetry_gpusample RETURNING gpu_id), stored_0 AS ("
     "INSERT INTO telemetry_gpusample (gpu_id) SELECT gpu_id FROM staged_0 ON CONFLICT DO NOTHING RETURNING 1) "
     "SELECT (SELECT count(*) FROM stored_0)", ["ingest_telemetry_gpusample", "telemetry_gpusample"]),
    ('SELECT "fleet_host"."name" FROM "fleet_host" WHERE "fleet_host"."name" = %s', []),
    ("WITH x AS (SELECT 1) SELECT * FROM x", []),
])
def test_every_form_of_write_the_product_sends_names_its_table(sql, tables):
    assert read_cache.written_tables(sql) == tables


def test_a_write_to_a_table_the_list_reads_through_a_join_is_seen(admin_api):
    """The hosts list shows each host's GPU count: adding a GPU changes the page."""
    from fleet.tests.factories import GpuFactory

    host = HostFactory(name="gpu-01")
    first = admin_api.get(HOSTS).json()["results"][0]
    GpuFactory(host=host)
    again = admin_api.get(HOSTS).json()["results"][0]
    assert again != first


def test_a_write_in_a_transaction_is_seen_in_it_before_the_commit(admin_api):
    host = HostFactory(name="gpu-01")
    host_names(admin_api)
    with transaction.atomic():
        Host.objects.filter(pk=host.pk).update(name="gpu-renamed")
        assert host_names(admin_api) == ["gpu-renamed"]
        Host.objects.filter(pk=host.pk).update(name="gpu-renamed-again")  # a second write, same transaction
        assert host_names(admin_api) == ["gpu-renamed-again"]


def test_a_commit_gives_the_tables_written_a_new_version_again(django_capture_on_commit_callbacks):
    """Another process may have read the old rows between the write and the commit, and cached
    them under the version the write gave: the commit must move the version on once more."""
    table = Host._meta.db_table
    with django_capture_on_commit_callbacks(execute=True):
        HostFactory(name="gpu-01")
        during = read_cache.versions([table])[table]
    assert read_cache.versions([table])[table] != during


def test_a_rolled_back_savepoint_leaves_later_writes_bumping_at_commit(django_capture_on_commit_callbacks):
    table = Host._meta.db_table
    with contextlib.suppress(RuntimeError), transaction.atomic():  # its on-commit callbacks go with it
        HostFactory(name="gpu-01")
        raise RuntimeError("abandoned")
    with django_capture_on_commit_callbacks(execute=True):
        HostFactory(name="gpu-02")
        during = read_cache.versions([table])[table]
    assert read_cache.versions([table])[table] != during


def test_lists_are_kept_apart_per_user_and_role(admin_api, admin_user, artist_api, api):
    HostFactory(name="gpu-01")
    assert host_names(admin_api) == ["gpu-01"]
    # An artist sees only the hosts of their own VMs, cached page or not.
    assert host_names(artist_api) == []
    # An admin demoted keeps their id but loses the whole fleet at once.
    admin_user.is_staff = False
    admin_user.save()
    api.force_authenticate(admin_user)
    assert host_names(api) == []


def test_only_json_answers_of_200_are_kept(admin_api):
    HostFactory(name="gpu-01")
    assert admin_api.get(HOSTS, {"ordering": "no_such_field"}).status_code == 200  # ignored field: still a page
    bad = admin_api.get("/api/v1/vms/", {"host": "not-a-number"})
    assert bad.status_code == 400
    assert admin_api.get("/api/v1/vms/", {"host": "not-a-number"}).status_code == 400
    browsable = admin_api.get(HOSTS, HTTP_ACCEPT="text/html")
    assert browsable.status_code == 200
    assert b"<html" in browsable.content


def test_an_unreachable_cache_leaves_the_lists_working_and_correct(admin_api, monkeypatch):
    HostFactory(name="gpu-01")
    host_names(admin_api)

    def refuse(*args, **kwargs):
        raise ConnectionError("Error 111 connecting to redis:6379. Connection refused.")

    for name in ("get", "get_many", "set", "set_many", "add", "delete"):
        monkeypatch.setattr(caches["default"], name, refuse)  # the backend itself: the proxy follows settings
    monkeypatch.setattr(read_cache, "_failed_until", 0.0)
    HostFactory(name="gpu-02")  # its version cannot be bumped: the cache is gone
    assert host_names(admin_api) == ["gpu-01", "gpu-02"]
    assert queries_of(admin_api, HOSTS) > 0  # computed each time, nothing served from the dead cache


def test_writes_made_while_the_cache_was_unreachable_are_seen_once_it_is_back(admin_api, monkeypatch):
    """Redis unreachable for a while but not restarted: its entries from before the outage must
    not hide the changes made during it."""
    host = HostFactory(name="gpu-01")
    assert host_names(admin_api) == ["gpu-01"]
    with monkeypatch.context() as outage:
        def refuse(*args, **kwargs):
            raise ConnectionError("Error 111 connecting to redis:6379. Connection refused.")

        outage.setattr(caches["default"], "set_many", refuse)
        Host.objects.filter(pk=host.pk).update(name="gpu-renamed")
    monkeypatch.setattr(read_cache, "_failed_until", 0.0)  # the back-off is over
    assert host_names(admin_api) == ["gpu-renamed"]
    assert read_cache._unbumped == set()


def test_the_overview_shows_an_inventory_change_at_once(client, admin_user):
    client.force_login(admin_user)
    HostFactory(name="gpu-01")
    assert b"gpu-02" not in client.get("/").content
    first = client.get("/overview/live/").content
    HostFactory(name="gpu-02")
    assert client.get("/overview/live/").content != first


def test_the_overview_refreshes_telemetry_only_once_its_interval_has_passed(client, admin_user, settings,
                                                                           monkeypatch):
    """Samples arrive with every poll: they age the overview's figures instead of discarding them,
    so a fleet being polled does not recompute half a second of figures on every page view."""
    settings.DASHBOARD_REFRESH_S = 15
    client.force_login(admin_user)
    HostFactory(name="gpu-01")
    clock = [1_000_000.0]
    monkeypatch.setattr(read_cache.time, "time", lambda: clock[0])
    first = client.get("/overview/live/").content
    read_cache.bump([GpuSample._meta.db_table])
    clock[0] += 5
    assert client.get("/overview/live/").content == first
    clock[0] += 11
    assert client.get("/overview/live/").content != first  # "Updated <time>" moved on at least


def test_an_old_entry_is_served_while_another_request_refreshes_it(monkeypatch):
    clock = [1_000_000.0]
    monkeypatch.setattr(read_cache.time, "time", lambda: clock[0])
    computed = []

    def compute():
        computed.append(1)
        return list(Host.objects.values_list("name", flat=True))

    HostFactory(name="gpu-01")
    assert read_cache.cached("names", compute, max_age_s=10) == ["gpu-01"]
    clock[0] += 11
    cache.add(read_cache._ENTRY_PREFIX + "names:refreshing", 1)  # another request is refreshing it
    assert read_cache.cached("names", compute, max_age_s=10) == ["gpu-01"]
    assert len(computed) == 1
    cache.delete(read_cache._ENTRY_PREFIX + "names:refreshing")
    assert read_cache.cached("names", compute, max_age_s=10) == ["gpu-01"]
    assert len(computed) == 2


def test_requests_arriving_while_another_computes_a_changed_entry_take_its_result():
    """A host edited while 50 dashboards are open: one request recomputes the overview, the others
    wait for it rather than each spending half a second of CPU on the same figures."""
    # Computed before a host was edited: its version of the hosts table is gone.
    cache.set(read_cache._ENTRY_PREFIX + "figures", read_cache._Entry(
        "before", {Host._meta.db_table: "a version long gone"}, time.time()))
    lock = read_cache._ENTRY_PREFIX + "figures:refreshing"
    assert cache.add(lock, 1)  # another request is computing it

    def other_request():
        time.sleep(0.1)
        read_cache._compute_and_keep(read_cache._ENTRY_PREFIX + "figures", lambda: "computed by the other",
                                     60, lambda value: True)
        cache.delete(lock)

    other = threading.Thread(target=other_request)
    other.start()
    mine = []
    assert read_cache.cached("figures", lambda: mine.append(1) or "computed here", max_age_s=60) == \
        "computed by the other"
    other.join()
    assert mine == []


def test_a_waiting_request_computes_itself_if_the_result_it_awaited_is_already_stale():
    HostFactory(name="gpu-01")
    table = Host._meta.db_table
    lock = read_cache._ENTRY_PREFIX + "names:refreshing"
    assert cache.add(lock, 1)

    def other_request():  # stores what it read before a write this request already sees
        time.sleep(0.1)
        cache.set(read_cache._ENTRY_PREFIX + "names", read_cache._Entry(["stale"], {table: "before the write"},
                                                                        time.time()))
        cache.delete(lock)

    other = threading.Thread(target=other_request)
    other.start()
    names = read_cache.cached("names", lambda: list(Host.objects.values_list("name", flat=True)), max_age_s=60)
    other.join()
    assert names == ["gpu-01"]


def test_a_changed_table_is_never_served_even_while_another_request_refreshes(monkeypatch):
    HostFactory(name="gpu-01")
    compute = lambda: list(Host.objects.values_list("name", flat=True))  # noqa: E731
    assert read_cache.cached("names", compute, max_age_s=10) == ["gpu-01"]
    cache.add(read_cache._ENTRY_PREFIX + "names:refreshing", 1)
    HostFactory(name="gpu-02")
    assert read_cache.cached("names", compute, max_age_s=10) == ["gpu-01", "gpu-02"]


def test_a_lost_version_reads_as_a_change(admin_api):
    """Redis restarted or evicted a key: the entry is recomputed, not trusted."""
    HostFactory(name="gpu-01")
    host_names(admin_api)
    cache.delete(read_cache._VERSION_PREFIX + Host._meta.db_table)
    assert queries_of(admin_api, HOSTS) > 0


def cache_settings(**env) -> subprocess.CompletedProcess:
    code = ("from django.conf import settings; c = settings.CACHES['default']; "
            "print(c['BACKEND'], c['KEY_PREFIX'], c.get('LOCATION'))")
    base = {name: value for name, value in os.environ.items() if name not in ("CACHE_URL", "REDIS_URL")}
    return subprocess.run([sys.executable, "-c", f"import django; django.setup(); {code}"], capture_output=True,
                          text=True, env={**base, "DJANGO_SETTINGS_MODULE": "config.settings", **env})


def test_without_redis_every_process_of_the_embedded_mode_shares_one_folder():
    """runfleet's web server and worker and any manage.py command (api_token revoke) must see
    each other's writes: one process's memory would let a revoked key work on."""
    from django.conf import settings

    result = cache_settings()
    assert result.returncode == 0, result.stderr
    backend, _, location = result.stdout.split()
    assert backend == "django.core.cache.backends.filebased.FileBasedCache"
    assert location == str(settings.BASE_DIR / "var" / "cache")


def test_deployments_sharing_one_redis_keep_apart_by_database():
    one = cache_settings(DATABASE_URL="postgres://u@db:5432/studio_a", CACHE_URL="redis://redis:6379/0")
    two = cache_settings(DATABASE_URL="postgres://u@db:5432/studio_b", CACHE_URL="redis://redis:6379/0")
    assert one.returncode == two.returncode == 0, one.stderr + two.stderr
    assert one.stdout.split()[0] == "config.redis_cache.RedisCache"
    assert one.stdout.split()[1] != two.stdout.split()[1]


def test_a_cache_url_of_an_unknown_kind_stops_the_start_with_a_clear_message():
    result = cache_settings(CACHE_URL="memcached://cache:11211")
    assert result.returncode != 0
    assert "CACHE_URL must start with redis://" in result.stderr


@pytest.mark.parametrize("change", ["revoke", "deactivate", "delete_user"])
def test_a_key_used_a_moment_ago_stops_working_at_once_when_its_token_or_user_changes(admin_user, api, change):
    """The token lookup is cached between a script's requests; a revoke must not wait for it."""
    from fleet import api_tokens

    token, key = api_tokens.issue_token(admin_user, "nightly report")
    api.credentials(HTTP_AUTHORIZATION=f"Token {key}")
    assert api.get(HOSTS).status_code == 200
    assert api.get(HOSTS).status_code == 200  # the lookup now comes from the cache
    if change == "revoke":
        api_tokens.revoke_token(token)
    elif change == "deactivate":
        admin_user.is_active = False
        admin_user.save()
    else:
        admin_user.delete()
    assert api.get(HOSTS).status_code == 401


def test_a_migration_is_not_failed_by_an_unreachable_cache(monkeypatch, caplog):
    def refuse(*args, **kwargs):
        raise ConnectionError("Error 111 connecting to redis:6379. Connection refused.")

    monkeypatch.setattr(caches["default"], "clear", refuse)
    read_cache.clear_after_migrate(sender=None)
    assert "read cache not emptied after migrate (ConnectionError)" in caplog.text


def test_a_write_not_committed_yet_elsewhere_leaves_the_page_served_until_its_commit(admin_api):
    """Another process's transaction wrote the hosts table and has not committed: for every other
    reader the rows are still those of the kept page, so it is served, not computed from the same
    rows again (and again at the commit); the commit's version makes the next read compute it."""
    HostFactory(name="gpu-01")
    host_names(admin_api)
    table = Host._meta.db_table
    cache.set(read_cache._VERSION_PREFIX + table, read_cache._UNCOMMITTED + "of-another-process", timeout=None)
    assert queries_of(admin_api, HOSTS) == 0
    read_cache.bump([table])  # its commit
    assert queries_of(admin_api, HOSTS) > 0


def test_of_the_requests_awaiting_a_result_that_came_stale_one_computes_it_again():
    """The request they waited for stored a result made stale by a write during its computation:
    one waiting request computes it (holding the right to), not each of them at once."""
    HostFactory(name="gpu-01")
    table = Host._meta.db_table
    lock = read_cache._ENTRY_PREFIX + "names:refreshing"
    assert cache.add(lock, 1)

    def other_request():  # stores what it read before a write, and gives up the right to compute
        time.sleep(0.1)
        cache.set(read_cache._ENTRY_PREFIX + "names", read_cache._Entry(["stale"], {table: "before the write"},
                                                                        time.time()))
        cache.delete(lock)

    held_while_computing = []

    def compute():
        held_while_computing.append(cache.get(lock) is not None)
        return list(Host.objects.values_list("name", flat=True))

    other = threading.Thread(target=other_request)
    other.start()
    names = read_cache.cached("names", compute, max_age_s=60)
    other.join()
    assert names == ["gpu-01"]
    assert held_while_computing == [True]
    assert cache.get(lock) is None  # given up once computed


@pytest.mark.parametrize("accept", ["application/json", "application/json; indent=4"])
def test_a_kept_page_is_the_json_the_client_asked_for(admin_api, accept):
    HostFactory(name="gpu-01")
    first = admin_api.get(HOSTS, HTTP_ACCEPT=accept)
    again = admin_api.get(HOSTS, HTTP_ACCEPT=accept)
    assert again.content == first.content
    assert again["Content-Type"] == first["Content-Type"] == "application/json"
    assert again.json()["results"][0]["name"] == "gpu-01"
    assert (b'\n    "count"' in again.content) == ("indent" in accept)


def test_a_token_of_an_artist_never_gets_the_page_kept_for_an_admin_token(admin_user, artist):
    from rest_framework.test import APIClient

    from fleet.api_tokens import issue_token

    HostFactory(name="gpu-01")
    admin, ana = APIClient(), APIClient()
    admin.credentials(HTTP_AUTHORIZATION=f"Token {issue_token(admin_user, 'script')[1]}")
    ana.credentials(HTTP_AUTHORIZATION=f"Token {issue_token(artist.user, 'script')[1]}")
    assert host_names(admin) == ["gpu-01"]
    assert host_names(ana) == []
    assert host_names(admin) == ["gpu-01"]
    HostFactory(name="gpu-02")  # seen at the next request of each
    assert host_names(admin) == ["gpu-01", "gpu-02"]
    assert host_names(ana) == []


def test_a_script_polling_a_list_costs_one_cache_round_trip_a_request(admin_user, artist, monkeypatch):
    """The token and the page it asked for last time are fetched together; the page is taken only
    if the token is still its user's, in the same role (a demoted admin gets their own list)."""
    from rest_framework.test import APIClient

    from fleet.api_tokens import issue_token

    HostFactory(name="gpu-01")
    script = APIClient()
    script.credentials(HTTP_AUTHORIZATION=f"Token {issue_token(admin_user, 'script')[1]}")
    assert host_names(script) == ["gpu-01"]
    assert host_names(script) == ["gpu-01"]
    round_trips = []
    backend = type(caches["default"])
    get_many = backend.get_many
    monkeypatch.setattr(backend, "get_many",
                        lambda self, keys, **kwargs: round_trips.append(keys) or get_many(self, keys, **kwargs))
    assert queries_of(script, HOSTS) == 0
    assert len(round_trips) == 1
    admin_user.is_staff = admin_user.is_superuser = False
    admin_user.save()
    assert host_names(script) == []

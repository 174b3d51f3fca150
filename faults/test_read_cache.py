"""The read cache (config/read_cache.py) between processes, on a real Redis that stops.

What must hold: a list the web server keeps in Redis is never served after another process
(here this test, as a worker or an admin's script would) changed a table it read; a revoked
API token fails on the next request though its lookup was cached; while Redis is down every
page and list still answers, read from the database; once Redis is back (empty), the cache
fills again.
"""

from __future__ import annotations

import json

import pytest
import redis

from faults.world import api, browser, build_world
from fleet import api_tokens
from fleet.models import ApiToken, Host

pytestmark = pytest.mark.faults


def host_names(client) -> list[str]:
    status, body, _ = client.get("/api/v1/hosts/?limit=100")
    assert status == 200, body
    return sorted(row["name"] for row in json.loads(body)["results"])


def test_lists_kept_in_redis_follow_writes_made_by_other_processes_and_survive_redis_stopping(stack):
    world = build_world()
    web = browser(stack.start_web(), world)
    automation = api(web, world)

    assert host_names(automation) == ["render-01", "studio-01"]
    entries = redis.Redis.from_url(stack.redis.url).keys("*read-cache:entry:api-list:*/api/v1/hosts/*")
    assert len(entries) == 1  # the web server keeps the page in Redis
    assert host_names(automation) == ["render-01", "studio-01"]
    # Another process (this one) renames a host: the web server's entry is stale at once.
    Host.objects.filter(name="render-01").update(name="render-02")
    assert host_names(automation) == ["render-02", "studio-01"]

    # A token used a moment ago (its lookup cached in Redis) is revoked elsewhere: refused at once.
    _, second_key = api_tokens.issue_token(world.request.vm.artist.user, "script")
    script = api(web, world)
    script.headers["Authorization"] = f"Token {second_key}"
    assert script.get("/api/v1/vms/")[0] == 200
    assert script.get("/api/v1/vms/")[0] == 200
    api_tokens.revoke_token(ApiToken.objects.get(prefix=second_key[:api_tokens.PREFIX_CHARS]))
    assert script.get("/api/v1/vms/")[0] == 401

    stack.redis.stop()
    # Redis gone: the overview and the lists answer from the database, changes included.
    status, body, _ = web.get("/")
    assert status == 200, body
    Host.objects.filter(name="studio-01").update(name="studio-02")
    assert host_names(automation) == ["render-02", "studio-02"]
    assert "read cache unreachable" in stack.web_child.output

    stack.redis.start()  # empty, as a restarted Redis without persistence
    assert host_names(automation) == ["render-02", "studio-02"]
    Host.objects.filter(name="studio-02").update(name="studio-03")
    assert host_names(automation) == ["render-02", "studio-03"]


def test_migrate_empties_the_read_cache_and_nothing_else_of_a_redis_the_broker_shares(stack):
    """CACHE_URL defaults to REDIS_URL: emptying the read cache (after migrate, or by an operator)
    must not drop the tasks queued in the same Redis database."""
    from django.core.management import call_command

    from config import read_cache

    client = redis.Redis.from_url(stack.redis.url)
    client.rpush("celery", "a queued task")
    Host.objects.create(name="gpu-01", cpu_threads=64, ram_gib=256)
    assert read_cache.cached("names", lambda: list(Host.objects.values_list("name", flat=True)), max_age_s=60) == [
        "gpu-01"]
    assert client.keys("*read-cache:*")

    call_command("migrate", verbosity=0)

    assert client.keys("*read-cache:*") == []
    assert client.lrange("celery", 0, -1) == [b"a queued task"]

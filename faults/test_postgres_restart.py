"""PostgreSQL restarted under a running dashboard: web server (gunicorn), worker, beat and agents.

What users expect: while the database is down, pages and API calls fail at once with a 503
that says the database is unreachable and to try again (no traceback, no hang); once it is
back, everything works again without restarting anything: the web server's first request
reconnects (CONN_HEALTH_CHECKS), beat ticks again and the worker's next poll stores samples.
"""

from __future__ import annotations

import json
import time
from datetime import UTC, datetime

import pytest
from django.db import connection

from faults.services import wait_for
from faults.world import api, assert_no_duplicates, browser, build_world, sample_keys, start_collecting
from telemetry.models import GpuSample

pytestmark = pytest.mark.faults


def test_the_dashboard_answers_503_while_postgres_is_down_and_recovers_without_a_restart(stack):
    world = build_world()
    gpus = start_collecting(stack, world)
    web = browser(stack.start_web(), world)
    automation = api(web, world)
    status, body, _ = web.get("/")
    assert status == 200, body[-2000:]  # the web server now holds a persistent connection

    # A restart nobody notices: the first request after it reconnects instead of failing.
    connection.close()
    stack.cluster.stop()
    stack.cluster.start()
    status, body, _ = web.get("/")
    assert status == 200, f"{body[-2000:]}\n{stack.outputs()}"

    # While the database is down: a clear 503, for the pages and for the API.
    before = sample_keys()
    connection.close()
    stack.cluster.stop()
    # Failing, not hanging: each answer comes within the client's timeout (a hang raises).
    status, body, headers = web.get("/", timeout_s=10)
    assert status == 503, body
    assert "cannot reach its database" in body
    assert "Traceback" not in body
    assert headers["Retry-After"] == "30"
    status, body, _ = automation.get("/api/v1/hosts/", timeout_s=10)
    assert status == 503, body
    assert json.loads(body)["detail"].startswith("The dashboard cannot reach its database")
    time.sleep(4)  # two of beat's ticks fail meanwhile
    assert all(child.alive for child in stack.children), stack.outputs()

    stack.cluster.start()
    up_at = datetime.fromtimestamp(time.time(), tz=UTC)
    status, body, _ = web.get("/")
    assert status == 200, f"{body[-2000:]}\n{stack.outputs()}"
    status, body, _ = automation.get("/api/v1/hosts/")
    assert status == 200, body

    def stored_again() -> bool:
        return set(GpuSample.objects.filter(ts__gt=up_at).values_list("gpu_id", flat=True).distinct()) == gpus

    assert wait_for(stored_again, 60), f"the worker stored nothing after the restart\n{stack.outputs()}"
    assert before <= sample_keys()
    assert_no_duplicates()
    assert stack.web_child.count("database unavailable, answered 503 to GET /") >= 1
    assert "Traceback" not in stack.web_child.output

"""Redis (the Celery broker) stopped and restarted while beat and a worker poll two real agents.

What must hold: the samples stored before stay; an admin can approve a resize request while
Redis is down (approval writes only to PostgreSQL, and its notification e-mail failing is
logged, never the request's failure); the pages keep serving; starting an optimizer run, which
needs the broker, is answered within seconds with why it did not start, never a server error;
once Redis is back, beat and the worker reconnect on their own, collection resumes with no
duplicate sample, and a run started again is computed.
"""

from __future__ import annotations

import json
import time

import pytest

from faults.services import wait_for
from faults.stack import POLL_INTERVAL_S
from faults.world import (
    api,
    assert_no_duplicates,
    browser,
    build_world,
    sample_keys,
    start_collecting,
)
from fleet.choices import ResizeStatus
from fleet.models import ResizeRequest
from sizing.models import OptimizerRun, OptimizerStatus
from telemetry.models import GpuSample

pytestmark = pytest.mark.faults


def test_collection_resumes_after_redis_restarts_and_nothing_stored_or_approved_is_lost(stack):
    world = build_world()
    gpus = start_collecting(stack, world)
    web = browser(stack.start_web(), world)
    automation = api(web, world)

    stack.redis.stop()
    down_at = time.time()
    before = sample_keys()

    # The pages keep serving: neither uses the broker.
    status, body, _ = web.get("/")
    assert status == 200, body[-2000:]
    status, body, _ = web.get("/agents/")
    assert status == 200, body[-2000:]
    assert "studio-01" in body
    # A decision needs only PostgreSQL; the admin's notification e-mail cannot be sent (no mail
    # server either) and is logged, the approval stands.
    status, body, _ = automation.post(f"/api/v1/resize-requests/{world.request.pk}/approve/",
                                      {"comment": "approved during the broker outage"})
    assert status == 200, body
    assert ResizeRequest.objects.get(pk=world.request.pk).status == ResizeStatus.APPROVED
    assert wait_for(lambda: stack.web_child.count("could not send mail") >= 1, 15), stack.outputs()
    # An optimizer run needs the worker: the answer comes within seconds and says why the run did
    # not start; the run is kept, failed with that reason, and its page shows it.
    status, body, _ = automation.post("/api/v1/optimizer-runs/", {}, timeout_s=15)  # a hang raises
    assert status == 503, body
    answer = json.loads(body)
    assert answer["detail"] == ("Could not queue the run: the task queue (Redis) is unreachable; start it again "
                                "once it is back.")
    failed = OptimizerRun.objects.get(pk=answer["run"])
    assert (failed.status, failed.error) == (OptimizerStatus.FAILED, answer["detail"])
    status, body, _ = web.get(f"/sizing/optimizer/{failed.pk}/")
    assert status == 200, body[-2000:]
    assert "Could not queue the run: the task queue (Redis) is unreachable" in body
    assert stack.web_child.count("could not queue sizing.tasks.run_optimizer: the task queue is unreachable") == 1

    # Outage of a few poll intervals: nothing stored is lost; beat and the worker stay up.
    time.sleep(3 * POLL_INTERVAL_S)
    assert before <= sample_keys()
    assert all(child.alive for child in stack.children), stack.outputs()

    stack.redis.start()
    up_at = time.time()

    def resumed() -> bool:
        fresh = GpuSample.objects.filter(ts__gt=_aware(up_at)).values_list("gpu_id", flat=True).distinct()
        return set(fresh) == gpus

    assert wait_for(resumed, 90), f"collection did not resume after Redis came back\n{stack.outputs()}"
    # Started again once Redis is back (the web server's broker connection is renewed on its own).
    status, body, _ = automation.post("/api/v1/optimizer-runs/", {})
    assert status == 201, body
    again = json.loads(body)["id"]
    assert wait_for(lambda: OptimizerRun.objects.get(pk=again).status == OptimizerStatus.DONE, 60), stack.outputs()
    assert before <= sample_keys()
    assert_no_duplicates()
    assert ResizeRequest.objects.get(pk=world.request.pk).status == ResizeStatus.APPROVED
    # Samples cover the time before and after the outage; the outage itself is a gap, not a backlog.
    assert GpuSample.objects.filter(ts__lt=_aware(down_at)).exists()
    status, _, _ = web.get("/")
    assert status == 200


def _aware(epoch_s: float):
    from datetime import UTC, datetime

    return datetime.fromtimestamp(epoch_s, tz=UTC)

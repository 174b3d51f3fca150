"""An agent flapping: up, down, up, down, up, while beat and a worker poll it and a steady second agent.

What the admin must see on the agents page: the agent's status goes ok -> error (with its last
error and the count of consecutive failed polls) -> ok (the error marked "since recovered"),
and the steady agent stays ok throughout. What must not happen: a sample stored twice, the
steady agent's collection held up, or a flood of notifications (a failed poll is one log
line and the agents page; nobody is messaged).
"""

from __future__ import annotations

import re
from datetime import UTC, datetime

import pytest

from faults.services import wait_for
from faults.world import assert_no_duplicates, browser, build_world, start_collecting
from fleet.models import AuditEvent, Gpu, Notification
from telemetry.models import Agent, AgentStatus, Drift, GpuSample

pytestmark = pytest.mark.faults


def agent_row(web, name: str) -> str:
    """The agents page's table row of agent `name`."""
    status, body, _ = web.get("/agents/")
    assert status == 200, body[-2000:]
    rows = [row for row in body.split("<tr>") if f">{name}</a>" in row]
    assert len(rows) == 1, body[-3000:]
    return rows[0].split("</tr>")[0]


def failures_shown(row: str) -> int:
    return int(re.findall(r'<td class="num">(\d+)</td>', row)[0])


def test_a_flapping_agent_goes_error_then_ok_on_the_agents_page_without_duplicates_or_alerts(stack):
    world = build_world()
    start_collecting(stack, world)
    web = browser(stack.start_web(), world)
    studio, render = Agent.objects.get(name="studio-01"), Agent.objects.get(name="render-01")
    render_gpu = Gpu.objects.get(host__name="render-01")
    notifications, drifts, events = Notification.objects.count(), Drift.objects.count(), AuditEvent.objects.count()
    assert 'badge ok">ok<' in agent_row(web, "studio-01")

    for _ in range(2):
        stack.stop_agent("studio-01")
        down_at = datetime.now(tz=UTC)
        assert wait_for(lambda: Agent.objects.get(pk=studio.pk).consecutive_failures >= 2, 30), stack.outputs()
        row = agent_row(web, "studio-01")
        assert 'badge error">error<' in row
        assert "connection refused" in row
        assert failures_shown(row) >= 2
        # The steady agent is polled all the while, in the same batches.
        assert wait_for(lambda since=down_at: GpuSample.objects.filter(gpu=render_gpu, ts__gt=since).count() >= 2, 30)
        assert Agent.objects.get(pk=render.pk).status == AgentStatus.OK

        stack.start_agent("studio-01")
        up_at = datetime.now(tz=UTC).replace(microsecond=0)  # samples are stamped to the second
        assert wait_for(lambda: Agent.objects.get(pk=studio.pk).consecutive_failures == 0, 30), stack.outputs()
        assert Agent.objects.get(pk=studio.pk).status == AgentStatus.OK
        assert GpuSample.objects.filter(gpu__host__name="studio-01", ts__gte=up_at).exists()
        row = agent_row(web, "studio-01")
        assert 'badge ok">ok<' in row
        assert "(since recovered)" in row
        assert failures_shown(row) == 0

    assert_no_duplicates()
    # Nobody is messaged about a flapping agent, no drift is opened and no audit event written.
    assert Notification.objects.count() == notifications
    assert Drift.objects.count() == drifts
    assert AuditEvent.objects.count() == events
    worker = next(child for child in stack.children if child.name == "worker")
    assert worker.count("agent studio-01: connection refused") >= 4
    assert "Traceback" not in worker.output

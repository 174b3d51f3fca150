"""An admin approves a resize request while another applies an optimizer plan that carries out
the same request and moves the same VM, each arriving while the other is half-way through
(`fleet.tests.lock_race`). Both lock in `fleet.locks`' order, so they never deadlock (approval
used to lock the request, then the VM; the plan the VM, then the request: PostgreSQL aborted
one, a 503): the second waits, then answers 409 naming the decision that beat it, and writes
nothing. Run on PostgreSQL and on SQLite, as fleet/tests/test_concurrency.py is.
"""

from __future__ import annotations

import pytest
from rest_framework.test import APIClient

from fleet.choices import ResizeStatus
from fleet.models import AuditEvent, ResizeRequest, Vgpu
from fleet.tests.factories import UserFactory
from fleet.tests.lock_race import first_then_second
from sizing import optimizer_runs, tasks
from sizing.models import OptimizerRun, OptimizerStatus
from sizing.tests.optimizer_world import fleet_with_request, placements

pytestmark = pytest.mark.django_db(transaction=True, serialized_rollback=True)


def api_as(user) -> APIClient:
    client = APIClient()
    client.force_authenticate(user)
    return client


@pytest.fixture
def planned(admin_user, monkeypatch):
    """The optimizer world (ws-anim-c asks to go from 24Q down to 12Q, which lets three GPUs'
    work fit on two) with a finished plan that carries out that request; two admins."""
    monkeypatch.setattr(optimizer_runs, "enqueue", lambda run_id: None)
    world = fleet_with_request(admin_user)
    run = optimizer_runs.start_run(admin_user)
    assert tasks.run_optimizer(run.pk) == OptimizerStatus.DONE
    world.run = OptimizerRun.objects.get(pk=run.pk)
    assert world.run.result["plan"]["moves"]
    assert world.request.pk in optimizer_runs.included_request_ids(world.run)
    world.approver = UserFactory(username="approver", is_staff=True)
    world.planner = UserFactory(username="planner", is_staff=True)
    world.mark = AuditEvent.objects.order_by("-pk").values_list("pk", flat=True).first()
    return world


def approving(world):
    return lambda: api_as(world.approver).post(f"/api/v1/resize-requests/{world.request.pk}/approve/",
                                               {"comment": "go"}, format="json")


def applying(world):
    return lambda: api_as(world.planner).post(f"/api/v1/optimizer-runs/{world.run.pk}/apply/", format="json")


def actions_since(mark: int) -> list[str]:
    return sorted(AuditEvent.objects.filter(pk__gt=mark).values_list("action", flat=True))


def test_an_approval_that_waited_for_the_plan_carrying_it_out_is_a_conflict(planned):
    applied, approved = first_then_second(applying(planned), approving(planned))

    assert (applied.status_code, approved.status_code) == (200, 409), [applied.content, approved.content]
    assert approved.json()["detail"] == (f"The request is approved already by planner: Applied by optimizer run "
                                         f"#{planned.run.pk}.")
    request = ResizeRequest.objects.get(pk=planned.request.pk)
    assert (request.status, request.decided_by.username) == (ResizeStatus.APPROVED, "planner")
    assert OptimizerRun.objects.get(pk=planned.run.pk).status == OptimizerStatus.APPLIED
    expected = sorted((a["vm_id"], a["gpu_id"], a["profile_id"]) for a in planned.run.result["plan"]["assignments"])
    assert sorted(Vgpu.objects.values_list("vm_id", "gpu_id", "profile_id")) == expected
    approvals = AuditEvent.objects.filter(pk__gt=planned.mark, action="resize_request.approve")
    comment = f"Applied by optimizer run #{planned.run.pk}"
    assert [(e.actor_name, e.comment) for e in approvals] == [("planner", comment)]
    assert "optimizer_run.apply" in actions_since(planned.mark)


def test_a_plan_that_waited_for_an_approval_of_its_request_is_a_conflict(planned):
    before = placements()
    approved, applied = first_then_second(approving(planned), applying(planned))

    assert (approved.status_code, applied.status_code) == (200, 409), [approved.content, applied.content]
    assert applied.json()["detail"] == (
        f"Resize request #{planned.request.pk} was decided since this plan was computed "
        f"(#{planned.request.pk} approved and applied by approver); run the optimizer again.")
    request = ResizeRequest.objects.get(pk=planned.request.pk)
    assert (request.status, request.decided_by.username, request.decision_comment) == (
        ResizeStatus.APPROVED, "approver", "go")
    assert OptimizerRun.objects.get(pk=planned.run.pk).status == OptimizerStatus.DONE
    # The approval resized ws-anim-c on its own GPU; nothing of the plan was applied.
    after = placements()
    assert [p for p in after if p[0] != "ws-anim-c"] == [p for p in before if p[0] != "ws-anim-c"]
    assert [p[2] for p in after if p[0] == "ws-anim-c"] == ["RTX6000-12Q"]
    assert actions_since(planned.mark) == ["resize_request.approve", "vgpu.place", "vgpu.remove"]

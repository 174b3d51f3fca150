"""The `optimizer-runs/` API: who may use it, starting runs, bad input, lists, applying plans."""

from __future__ import annotations

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from fleet import services
from fleet.choices import ResizeStatus
from fleet.tests.factories import GpuFactory, VirtualMachineFactory, profile
from sizing import optimizer_runs, tasks
from sizing.models import OptimizerRun, OptimizerStatus
from sizing.tests.optimizer_world import fleet_with_request, fragmented_fleet, gpus_in_use, make_runs, placements

pytestmark = pytest.mark.django_db

RUNS = "/api/v1/optimizer-runs/"


@pytest.fixture
def queued(monkeypatch):
    sent: list[int] = []
    monkeypatch.setattr(optimizer_runs, "enqueue", sent.append)
    return sent


def finished(admin_user) -> OptimizerRun:
    run = optimizer_runs.start_run(admin_user)
    tasks.run_optimizer(run.pk)
    return OptimizerRun.objects.get(pk=run.pk)


# Roles -----------------------------------------------------------------------------------------


def test_anonymous_callers_are_refused_everything(api, admin_user):
    run = make_runs(1, admin_user)[0]
    assert api.get(RUNS).status_code == 401
    assert api.get(f"{RUNS}{run.pk}/").status_code == 401
    assert api.post(RUNS, {}).status_code == 401
    assert api.post(f"{RUNS}{run.pk}/apply/").status_code == 401
    assert OptimizerRun.objects.count() == 1


def test_artists_are_refused_everything(artist_api, admin_user, queued):
    run = make_runs(1, admin_user)[0]
    for response in (artist_api.get(RUNS), artist_api.get(f"{RUNS}{run.pk}/"),
                     artist_api.post(RUNS, {}), artist_api.post(f"{RUNS}{run.pk}/apply/")):
        assert response.status_code == 403, response.content
        assert "Only fleet admins" in response.json()["detail"]
    assert OptimizerRun.objects.count() == 1
    assert queued == []


# Starting a run ----------------------------------------------------------------------------------


def test_admins_start_a_run_and_a_second_start_is_409(admin_api, admin_user, queued,
                                                      django_capture_on_commit_callbacks):
    world = fleet_with_request(admin_user)
    with django_capture_on_commit_callbacks(execute=True):
        response = admin_api.post(RUNS, {"include_requests": True, "include_suggestions": False})
    assert response.status_code == 201, response.content
    body = response.json()
    assert body["status"] == "pending"
    assert body["created_by"] == "admin"
    assert body["params"]["changes"][0]["source"] == f"resize-request:{world.request.pk}"
    assert queued == [body["id"]]

    again = admin_api.post(RUNS, {})
    assert again.status_code == 409
    assert again.json()["run"] == body["id"]
    assert "is queued" in again.json()["detail"]
    assert OptimizerRun.objects.count() == 1


# The run is sent once committed, so this test commits (and gets the catalog back afterwards).
@pytest.mark.django_db(transaction=True, serialized_rollback=True)
def test_while_the_task_queue_is_down_a_start_is_503_and_the_run_says_why(admin_api, admin_user, broker_down):
    fragmented_fleet()
    message = "Could not queue the run: the task queue (Redis) is unreachable; start it again once it is back."

    response = admin_api.post(RUNS, {"include_requests": True})

    assert response.status_code == 503, response.content
    run = OptimizerRun.objects.get()
    assert response.json() == {"detail": message, "run": run.pk}
    shown = admin_api.get(f"{RUNS}{run.pk}/").json()
    assert (shown["status"], shown["error"]) == ("failed", message)
    # Started again (the queue still down): the failed run does not count as one in progress.
    assert admin_api.post(RUNS, {}).status_code == 503
    assert broker_down == ["sizing.tasks.run_optimizer"] * 2


def test_a_what_if_change_is_planned(admin_api, admin_user, queued):
    world = fragmented_fleet()
    response = admin_api.post(RUNS, {"include_requests": False, "changes": [
        {"vm": world.vm_a.pk, "profile": profile("RTX6000-24Q").pk, "vgpus": 1},
    ]})
    assert response.status_code == 201, response.content
    run_id = response.json()["id"]
    tasks.run_optimizer(run_id)
    body = admin_api.get(f"{RUNS}{run_id}/").json()
    assert body["status"] == "done"
    moves = {m["vm_id"]: m for m in body["result"]["plan"]["moves"]}
    assert moves[world.vm_a.pk]["to_profile_id"] == profile("RTX6000-24Q").pk
    assert body["result"]["summary"]["gpus_after"] == 2, "a whole-GPU 24Q beside a 12Q: still two GPUs"


@pytest.mark.parametrize(("payload", "field", "message"), [
    ({"include_requests": "perhaps"}, "include_requests", "Must be a valid boolean."),
    ({"include_suggestion": True}, "include_suggestion", "Unknown field."),
    ({"changes": [{"vm": 999999, "profile": 1}]}, "changes", 'Invalid pk "999999" - object does not exist.'),
    ({"changes": "all"}, "changes", 'Expected a list of items but got type "str".'),
])
def test_bad_input_is_a_400_naming_the_field(admin_api, admin_user, queued, payload, field, message):
    response = admin_api.post(RUNS, payload)
    assert response.status_code == 400, response.content
    assert message in str(response.json()[field])
    assert OptimizerRun.objects.count() == 0
    assert queued == []


def test_too_many_vgpus_and_a_vm_named_twice_are_400(admin_api, admin_user, queued):
    world = fragmented_fleet()
    q24 = profile("RTX6000-24Q").pk
    response = admin_api.post(RUNS, {"changes": [{"vm": world.vm_a.pk, "profile": q24, "vgpus": 5}]})
    assert response.status_code == 400, response.content
    assert response.json()["changes"]["0"]["vgpus"] == ["Ensure this value is less than or equal to 4."]
    twice = admin_api.post(RUNS, {"changes": [{"vm": world.vm_a.pk, "profile": q24},
                                               {"vm": world.vm_a.pk, "profile": q24}]})
    assert twice.status_code == 400
    assert twice.json()["changes"] == ["Name each VM at most once."]
    assert OptimizerRun.objects.count() == 0


# Reading runs --------------------------------------------------------------------------------------


def test_the_list_is_paginated_newest_first_with_summaries_not_plans(admin_api, admin_user):
    runs = make_runs(3, admin_user)
    body = admin_api.get(RUNS, {"limit": 2}).json()
    assert set(body) == {"count", "next", "previous", "results"}
    assert body["count"] == 3
    assert [row["id"] for row in body["results"]] == [runs[2].pk, runs[1].pk]
    row = body["results"][0]
    assert row["summary"]["gpus_freed"] == 1
    assert "result" not in row
    assert "params" not in row
    assert row["created_by"] == "admin"


@pytest.mark.parametrize("rows", [2, 12])
def test_the_list_costs_the_same_queries_for_2_and_12_runs(admin_api, admin_user, rows):
    make_runs(rows, admin_user)
    make_runs(1, admin_user, status=OptimizerStatus.FAILED)
    with CaptureQueriesContext(connection) as queries:
        response = admin_api.get(RUNS)
    assert response.json()["count"] == rows + 1
    # The count, then the page (with who started and who applied each run joined in).
    assert len(queries) == 2, [q["sql"] for q in queries]


def test_a_run_shows_its_changes_and_plan(admin_api, admin_user, queued):
    fragmented_fleet()
    run = finished(admin_user)
    body = admin_api.get(f"{RUNS}{run.pk}/").json()
    assert body["status"] == "done"
    assert body["progress"] == 1.0
    assert body["params"]["include_requests"] is True
    assert body["result"]["summary"]["gpus_after"] == 1
    assert len(body["result"]["plan"]["assignments"]) == 2
    assert admin_api.get(f"{RUNS}999999/").status_code == 404


# Applying --------------------------------------------------------------------------------------


def test_apply_carries_the_plan_out(admin_api, admin_user, queued):
    world = fleet_with_request(admin_user)
    run = finished(admin_user)
    response = admin_api.post(f"{RUNS}{run.pk}/apply/")
    assert response.status_code == 200, response.content
    assert response.json()["status"] == "applied"
    assert response.json()["applied_by"] == "admin"
    assert gpus_in_use() == 2
    world.request.refresh_from_db()
    assert world.request.status == ResizeStatus.APPROVED


def test_apply_is_409_when_the_fleet_changed_and_changes_nothing(admin_api, admin_user, queued):
    world = fragmented_fleet()
    run = finished(admin_user)
    services.place_vgpu(VirtualMachineFactory(), GpuFactory(host=world.host), profile("RTX6000-24Q"))
    before = placements()
    response = admin_api.post(f"{RUNS}{run.pk}/apply/")
    assert response.status_code == 409
    assert response.json() == {"detail": optimizer_runs.FLEET_CHANGED, "violations": []}
    assert placements() == before
    assert OptimizerRun.objects.get(pk=run.pk).status == OptimizerStatus.DONE


def test_apply_of_a_run_still_queued_is_409(admin_api, admin_user, queued):
    fragmented_fleet()
    run = optimizer_runs.start_run(admin_user)
    response = admin_api.post(f"{RUNS}{run.pk}/apply/")
    assert response.status_code == 409
    assert "only a finished plan can be applied" in response.json()["detail"]
    assert admin_api.post(f"{RUNS}999999/apply/").status_code == 404

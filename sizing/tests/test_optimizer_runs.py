"""Optimizer runs end to end on real ORM fleets: starting one, the task that computes the plan
(progress, claims, failures) and applying the plan to the fleet."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from fleet import services
from fleet.choices import ResizeStatus
from fleet.models import Gpu, Host, ResizeRequest, Vgpu, VirtualMachine
from fleet.placement import Rule, Violation
from fleet.queries import fleet_snapshot
from fleet.tests.factories import GpuFactory, VirtualMachineFactory, profile
from fleet.tests.lock_race import assert_lock_order, record_locks
from sizing import optimizer, optimizer_runs, tasks
from sizing.models import OptimizerRun, OptimizerStatus, SuggestionAction
from sizing.tests.optimizer_world import (
    fleet_with_request,
    fragmented_fleet,
    gpus_in_use,
    placements,
    suggestion,
)
from telemetry.tests.test_worker import LAND_TIMEOUT_S, wait_for, worker  # noqa: F401 - worker is a fixture

pytestmark = pytest.mark.django_db


@pytest.fixture
def queued(monkeypatch):
    """Run ids sent to the worker, instead of a broker."""
    sent: list[int] = []
    monkeypatch.setattr(optimizer_runs, "enqueue", sent.append)
    return sent


def finished_run(user=None, **options) -> OptimizerRun:
    """Start a run and compute it the way the worker does."""
    run = optimizer_runs.start_run(user, **options)
    assert tasks.run_optimizer(run.pk) == OptimizerStatus.DONE
    run.refresh_from_db()
    return run


# Starting a run --------------------------------------------------------------------------------


def test_a_run_is_sent_to_the_worker_only_once_committed(admin_user, queued, django_capture_on_commit_callbacks):
    world = fleet_with_request(admin_user)
    with django_capture_on_commit_callbacks(execute=False) as callbacks:
        run = optimizer_runs.start_run(admin_user)
    assert queued == []
    for callback in callbacks:
        callback()
    assert queued == [run.pk]
    assert run.status == OptimizerStatus.PENDING
    assert run.created_by == admin_user
    assert run.params["changes"] == [{"vm_id": world.vm_c.pk, "profile_id": world.q12.pk, "vgpus": 1,
                                      "source": f"resize-request:{world.request.pk}"}]


def test_requests_can_be_left_out(admin_user, queued):
    fleet_with_request(admin_user)
    run = optimizer_runs.start_run(admin_user, include_requests=False)
    assert run.params["changes"] == []
    assert run.params["include_requests"] is False


def test_a_second_start_while_one_is_queued_names_the_queued_run(admin_user, queued):
    fragmented_fleet()
    first = optimizer_runs.start_run(admin_user)
    with pytest.raises(optimizer_runs.RunInProgress) as refused:
        optimizer_runs.start_run(admin_user)
    assert refused.value.run == first
    assert OptimizerRun.objects.count() == 1
    tasks.run_optimizer(first.pk)
    second = optimizer_runs.start_run(admin_user)
    assert second.pk != first.pk


def test_a_run_lost_by_its_worker_does_not_block_the_next_one(admin_user, queued):
    fragmented_fleet()
    lost = optimizer_runs.start_run(admin_user)
    OptimizerRun.objects.filter(pk=lost.pk).update(
        created_at=timezone.now() - timedelta(seconds=optimizer_runs.ABANDONED_AFTER_S + 5),
    )
    fresh = optimizer_runs.start_run(admin_user)
    lost.refresh_from_db()
    assert lost.status == OptimizerStatus.FAILED
    assert "is a Celery worker running?" in lost.error
    assert fresh.status == OptimizerStatus.PENDING


def test_a_run_the_task_queue_cannot_take_fails_at_once_saying_why(admin_user, broker_down, caplog,
                                                                   django_capture_on_commit_callbacks):
    fragmented_fleet()
    with caplog.at_level("WARNING", logger="config.celery"), django_capture_on_commit_callbacks(execute=True):
        run = optimizer_runs.start_run(admin_user)

    assert broker_down == ["sizing.tasks.run_optimizer"]
    message = "Could not queue the run: the task queue (Redis) is unreachable; start it again once it is back."
    assert (run.status, run.error) == (OptimizerStatus.FAILED, message), "the caller sees it at once"
    stored = OptimizerRun.objects.get(pk=run.pk)
    assert (stored.status, stored.error, stored.stage) == (OptimizerStatus.FAILED, message, "Failed")
    assert stored.finished_at is not None
    assert ("could not queue sizing.tasks.run_optimizer: the task queue is unreachable (OperationalError: "
            "Error 111 connecting to 127.0.0.1:6379. Connection refused.)") in caplog.text
    # Not left queued, where it would refuse every start until abandoned minutes later.
    with django_capture_on_commit_callbacks(execute=True):
        again = optimizer_runs.start_run(admin_user)
    assert again.pk != run.pk
    assert OptimizerRun.objects.filter(status=OptimizerStatus.FAILED).count() == 2


def test_changes_one_per_vm_the_most_deliberate_wins(admin_user):
    world = fleet_with_request(admin_user)
    newer = ResizeRequest.objects.create(vm=world.vm_c, requested_profile=profile("RTX6000-8Q"))
    suggestion(world.vm_c, profile("RTX6000-6Q"))
    suggestion(world.vm_a, profile("RTX6000-24Q"), SuggestionAction.UPSIZE)
    suggestion(world.vm_b, profile("RTX6000-6Q"), dismissed=True)

    changes, superseded = optimizer_runs.gather_changes(include_requests=True, include_suggestions=True)

    by_vm = {c["vm_id"]: c for c in changes}
    assert set(by_vm) == {world.vm_a.pk, world.vm_c.pk}, "a dismissed suggestion is left out"
    assert by_vm[world.vm_c.pk]["source"] == f"resize-request:{newer.pk}", "the newest request wins"
    assert by_vm[world.vm_a.pk]["profile_id"] == profile("RTX6000-24Q").pk
    assert by_vm[world.vm_a.pk]["vgpus"] == 1, "a suggestion without a count keeps the VM's count"
    assert {s["source"].split(":")[0] for s in superseded} == {"resize-request", "suggestion"}
    assert {s["superseded_by"] for s in superseded} == {f"resize-request:{newer.pk}"}


def test_a_what_if_change_wins_over_a_request(admin_user):
    world = fleet_with_request(admin_user)
    what_if = optimizer.Change(world.vm_c.pk, profile("RTX6000-24Q").pk, 1)
    changes, superseded = optimizer_runs.gather_changes(vm_changes=[what_if])
    assert changes == [{"vm_id": world.vm_c.pk, "profile_id": profile("RTX6000-24Q").pk, "vgpus": 1,
                        "source": "manual"}]
    assert superseded[0]["source"] == f"resize-request:{world.request.pk}"


# The task --------------------------------------------------------------------------------------


def test_the_task_plans_a_fragmented_fleet_onto_one_gpu(admin_user, queued):
    world = fragmented_fleet()
    before = placements()
    run = finished_run(admin_user)

    assert run.status == OptimizerStatus.DONE
    assert run.progress == 1.0
    assert run.started_at is not None
    assert run.finished_at >= run.started_at
    assert run.fleet_fingerprint == fleet_snapshot().fingerprint()
    summary = run.result["summary"]
    assert (summary["gpus_before"], summary["gpus_after"], summary["gpus_freed"], summary["vms_moved"]) == (2, 1, 1, 1)
    plan = run.result["plan"]
    freed = plan["freed_gpu_ids"][0]
    assert freed in (world.gpu_a.pk, world.gpu_b.pk)
    names = run.result["names"]
    assert names["gpus"][str(freed)]["host"] == "studio-01"
    assert names["gpus"][str(freed)]["label"] in ("00000000:3B:00.0", "00000000:5E:00.0")
    moved = plan["moves"][0]["vm_id"]
    assert names["vms"][str(moved)] in ("ws-modeling-a", "ws-modeling-b")
    assert placements() == before, "computing a plan changes nothing"


def test_progress_is_written_while_the_optimizer_runs(admin_user, queued, monkeypatch):
    fragmented_fleet()
    run = optimizer_runs.start_run(admin_user)
    seen = []
    real_optimize = optimizer.optimize

    def observed(snapshot, changes=(), *, progress=None, time_limit_s=10.0, drained=()):
        progress(0.42, "Draining half-empty GPUs")
        seen.append(OptimizerRun.objects.values_list("status", "progress", "stage").get(pk=run.pk))
        return real_optimize(snapshot, changes, progress=progress, time_limit_s=time_limit_s, drained=drained)

    monkeypatch.setattr(optimizer, "optimize", observed)
    optimizer_runs.execute_run(run.pk, progress_interval_s=0)

    assert seen == [(OptimizerStatus.RUNNING, 0.42, "Draining half-empty GPUs")]
    run.refresh_from_db()
    assert (run.status, run.progress, run.stage) == (OptimizerStatus.DONE, 1.0, "Done")


def test_progress_writes_are_spaced_and_never_go_backwards(admin_user, queued):
    fragmented_fleet()
    run = optimizer_runs.start_run(admin_user)
    optimizer_runs.claim_run(run.pk)
    now = [0.0]
    writer = optimizer_runs.ProgressWriter(run.pk, interval_s=0.5, clock=lambda: now[0])

    for at, fraction in [(0.0, 0.1), (0.1, 0.2), (0.2, 0.3), (0.6, 0.25), (0.7, 0.9), (1.2, 1.7)]:
        now[0] = at
        writer(fraction, f"at {at}")

    assert writer.writes == 3, "at 0, 0.6 and 1.2 s; the calls between are not written"
    run.refresh_from_db()
    assert run.progress == 1.0, "never past 1"
    assert run.stage == "at 1.2"
    now[0] = 2.0
    writer(0.1, "late")
    run.refresh_from_db()
    assert run.progress == 1.0, "never backwards"


def test_a_task_delivered_twice_plans_once(admin_user, queued, monkeypatch):
    fragmented_fleet()
    run = optimizer_runs.start_run(admin_user)
    calls = []
    real_optimize = optimizer.optimize

    def counted(*args, **kwargs):
        calls.append(1)
        return real_optimize(*args, **kwargs)

    monkeypatch.setattr(optimizer, "optimize", counted)
    assert tasks.run_optimizer(run.pk) == OptimizerStatus.DONE
    first = OptimizerRun.objects.get(pk=run.pk)
    assert tasks.run_optimizer(run.pk) == "skipped"
    assert len(calls) == 1
    again = OptimizerRun.objects.get(pk=run.pk)
    assert (again.status, again.result, again.finished_at) == (OptimizerStatus.DONE, first.result, first.finished_at)


def test_a_failing_optimizer_fails_the_run_with_its_message(admin_user, queued, monkeypatch):
    fragmented_fleet()
    run = optimizer_runs.start_run(admin_user)

    def broken(*args, **kwargs):
        raise RuntimeError("no GPU model named 'Quadro RTX 6000'")

    monkeypatch.setattr(optimizer, "optimize", broken)
    assert tasks.run_optimizer(run.pk) == OptimizerStatus.FAILED
    run.refresh_from_db()
    assert run.status == OptimizerStatus.FAILED
    assert run.error == "RuntimeError: no GPU model named 'Quadro RTX 6000'"
    assert "Traceback" not in run.error
    assert run.finished_at is not None
    assert run.result is None
    assert optimizer_runs.start_run(admin_user).status == OptimizerStatus.PENDING, "a failed run blocks nothing"


def test_a_plan_that_breaks_a_rule_is_discarded(admin_user, queued, monkeypatch):
    fragmented_fleet()
    run = optimizer_runs.start_run(admin_user)
    monkeypatch.setattr(optimizer, "verify", lambda snapshot, plan: [
        Violation(Rule.FRAME_BUFFER, "RTX6000-12Q needs 12288 MiB; GPU 00000000:3B:00.0 has 0 MiB free"),
    ])
    tasks.run_optimizer(run.pk)
    run.refresh_from_db()
    assert run.status == OptimizerStatus.FAILED
    assert run.result is None
    assert "[frame_buffer] RTX6000-12Q needs 12288 MiB" in run.error


def test_a_change_for_a_vm_deleted_since_the_start_is_listed_not_planned(admin_user, queued):
    world = fleet_with_request(admin_user)
    gone = VirtualMachineFactory(name="ws-gone")
    request = ResizeRequest.objects.create(vm=gone, requested_profile=world.q12)
    run = optimizer_runs.start_run(admin_user)
    gone_id = gone.pk
    gone.delete()
    tasks.run_optimizer(run.pk)
    run.refresh_from_db()
    assert run.status == OptimizerStatus.DONE
    assert run.result["dropped"] == [[gone_id, f"resize-request:{request.pk}: the VM no longer exists"]]
    assert run.result["summary"]["unplaced"] == 1


# Applying a plan -------------------------------------------------------------------------------


def test_applying_moves_the_vgpus_and_approves_the_requests(admin_user, queued):
    world = fleet_with_request(admin_user)
    run = finished_run(admin_user)
    plan = run.result["plan"]
    assert plan["gpus_before"] == 3
    assert plan["gpus_after"] == 2

    outcome = optimizer_runs.apply_run(run, admin_user)

    expected = sorted((a["vm_id"], a["gpu_id"], a["profile_id"]) for a in plan["assignments"])
    assert sorted(Vgpu.objects.values_list("vm_id", "gpu_id", "profile_id")) == expected
    assert gpus_in_use() == 2
    assert Vgpu.objects.get(vm=world.vm_c).profile == world.q12
    world.request.refresh_from_db()
    assert world.request.status == ResizeStatus.APPROVED
    assert world.request.decided_by == admin_user
    assert world.request.decision_comment == f"Applied by optimizer run #{run.pk}"
    run.refresh_from_db()
    assert (run.status, run.applied_by) == (OptimizerStatus.APPLIED, admin_user)
    assert outcome.approved_request_ids == [world.request.pk]
    assert outcome.vms_moved == len(plan["moves"])
    assert fleet_snapshot().gpus_in_use() == 2


def test_applying_locks_every_row_in_the_fleets_lock_order(admin_user, queued, monkeypatch):
    """Hosts, GPUs, VMs, vGPUs, then the requests and the run: the services it calls then only
    lock rows it holds, so a plan never deadlocks with an approval or an edit (test_optimizer_race)."""
    fleet_with_request(admin_user)
    run = finished_run(admin_user)
    calls = record_locks(monkeypatch)
    optimizer_runs.apply_run(run, admin_user)
    assert_lock_order(calls)
    assert [model for model, _ in calls[:6]] == [Host, Gpu, VirtualMachine, Vgpu, ResizeRequest, OptimizerRun]


def test_a_plan_is_refused_once_the_fleet_changed(admin_user, queued):
    world = fleet_with_request(admin_user)
    run = finished_run(admin_user)
    newcomer = VirtualMachineFactory(name="ws-newcomer")
    services.place_vgpu(newcomer, GpuFactory(host=world.host), profile("RTX6000-24Q"))
    before = placements()

    with pytest.raises(optimizer_runs.PlanConflict) as refused:
        optimizer_runs.apply_run(run, admin_user)

    assert refused.value.message == "The fleet changed since this plan was computed; run the optimizer again."
    assert placements() == before
    world.request.refresh_from_db()
    assert world.request.status == ResizeStatus.PENDING
    run.refresh_from_db()
    assert run.status == OptimizerStatus.DONE


def test_a_refusal_halfway_rolls_the_whole_plan_back(admin_user, queued, monkeypatch):
    world = fleet_with_request(admin_user)
    run = finished_run(admin_user)
    before = placements()
    real_place = services.place_vgpu
    placed = []

    def refuse_the_last(vm, gpu, profile_row):
        if len(placed) + 1 == len(todo):
            raise services.FleetConflict([Violation(Rule.MAX_PER_GPU, f"GPU {gpu.label} is full")])
        placed.append(vm.pk)
        return real_place(vm, gpu, profile_row)

    replaced = {m["vm_id"] for m in run.result["plan"]["moves"]}
    todo = [a for a in run.result["plan"]["assignments"] if a["vm_id"] in replaced]
    monkeypatch.setattr(services, "place_vgpu", refuse_the_last)

    with pytest.raises(optimizer_runs.PlanConflict) as refused:
        optimizer_runs.apply_run(run, admin_user)

    assert [v.rule for v in refused.value.violations] == [Rule.MAX_PER_GPU]
    assert "nothing was changed" in refused.value.message
    assert placements() == before
    world.request.refresh_from_db()
    assert world.request.status == ResizeStatus.PENDING
    assert OptimizerRun.objects.get(pk=run.pk).status == OptimizerStatus.DONE


def test_only_a_finished_plan_is_applied_and_only_once(admin_user, queued):
    fragmented_fleet()
    pending = optimizer_runs.start_run(admin_user)
    with pytest.raises(optimizer_runs.PlanConflict, match="is queued; only a finished plan can be applied"):
        optimizer_runs.apply_run(pending, admin_user)
    tasks.run_optimizer(pending.pk)
    optimizer_runs.apply_run(pending, admin_user)
    after = placements()
    with pytest.raises(optimizer_runs.PlanConflict, match="was applied already"):
        optimizer_runs.apply_run(pending, admin_user)
    assert placements() == after


def test_a_request_decided_since_the_plan_stops_it(admin_user, queued):
    world = fleet_with_request(admin_user)
    run = finished_run(admin_user)
    ResizeRequest.objects.filter(pk=world.request.pk).update(status=ResizeStatus.REJECTED)
    before = placements()
    with pytest.raises(optimizer_runs.PlanConflict, match=f"#{world.request.pk} was decided"):
        optimizer_runs.apply_run(run, admin_user)
    assert placements() == before



# With a real worker ----------------------------------------------------------------------------


# The worker is another process: what the test writes must be committed (transaction=True);
# serialized_rollback gives the catalog and the presets, loaded at migrate, back afterwards.
@pytest.mark.django_db(transaction=True, serialized_rollback=True)
def test_a_real_worker_computes_a_queued_run(worker, admin_user, monkeypatch):  # noqa: F811 - fixture
    process, publisher, queue = worker
    fragmented_fleet()
    monkeypatch.setattr(optimizer_runs, "enqueue", lambda run_id: publisher.send_task(
        "sizing.tasks.run_optimizer", args=[run_id], queue=queue,
    ))

    run = optimizer_runs.start_run(admin_user)

    def done() -> bool:
        return OptimizerRun.objects.get(pk=run.pk).status == OptimizerStatus.DONE

    assert wait_for(done, LAND_TIMEOUT_S), f"the run did not finish:\n{process.output}"
    run.refresh_from_db()
    assert run.result["summary"]["gpus_after"] == 1
    assert wait_for(lambda: f"run_optimizer: run {run.pk} done" in process.output, 5), process.output

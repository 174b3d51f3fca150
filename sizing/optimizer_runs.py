"""Runs of the fleet placement optimizer: start one, carry it out in a worker, apply its plan.

The optimizer itself is pure (`sizing.optimizer`); this module is its Django side:

- `start_run` gathers the pending changes (pending resize requests, optionally the current
  right-sizing suggestions, optionally what-if changes) and the GPUs to drain, if any, stores
  them in the run's `params` and queues `sizing.tasks.run_optimizer` once the run is committed. One run at a time may
  be queued or running: a plan is computed against the whole fleet, so two at once would
  only race each other for the worker. A run the task queue (Redis) cannot take is marked
  failed at once, saying so, rather than left queued where it would block every later run.
- `execute_run` is the task's body: it claims the run by a conditional update, plans on a
  snapshot of the fleet (a drain plans only the moves off the drained GPUs, see
  `sizing.optimizer.drain`), writes its progress as it goes (its own autocommitted UPDATEs, so
  the page's progress bar moves while the worker computes), checks the plan against every
  placement rule and stores it with the names the page shows.
- `apply_run` is the only way a plan reaches the fleet, and only at an admin's request: it
  refuses a plan whose fleet has changed since, then replays the plan's moves through
  `fleet.services` (which re-checks every rule under row locks) in one transaction, so a
  refusal leaves the fleet exactly as it was. A move on hosts linked to their hypervisor
  becomes an operation (`hypervisors.operations`) in that same transaction, so the host
  follows the plan: one per VM, run one after another in an order where a VM arrives on a GPU
  only after the VMs leaving it have left. Moves between unlinked hosts change the inventory
  only, as before (the admin carries them out); a move between a linked and an unlinked host
  refuses the whole plan, naming the host, as an approval would.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from datetime import timedelta

from celery import current_app
from celery.exceptions import SoftTimeLimitExceeded
from django.db import connection, transaction
from django.db.models import Count, F, Q, QuerySet
from django.db.models.fields.json import KeyTransform
from django.utils import timezone

from config.celery import QueueUnavailable, send_from_request
from fleet import audit, locks, services
from fleet import requests as fleet_requests
from fleet.choices import ResizeStatus
from fleet.models import Gpu, ResizeRequest, Vgpu, VgpuProfile, VirtualMachine
from fleet.placement import PlacementError, Violation
from fleet.queries import fleet_snapshot
from fleet.snapshot import FleetSnapshot
from hypervisors import operations
from hypervisors.choices import OperationKind, OperationStatus
from hypervisors.models import Operation
from sizing import optimizer
from sizing.models import OptimizerRun, OptimizerStatus, Suggestion, SuggestionAction

logger = logging.getLogger(__name__)

#: Seconds the optimizer may search; it returns its best plan so far when they run out.
SEARCH_TIME_LIMIT_S = 30.0
#: Celery's limits for the task: the search, plus reading the fleet and checking the plan.
#: The Celery task that carries a run out (sizing.tasks.run_optimizer).
RUN_OPTIMIZER_TASK = "sizing.tasks.run_optimizer"
TASK_SOFT_TIME_LIMIT_S = 150
TASK_TIME_LIMIT_S = 180
#: A run still queued or running this long after it started was lost (a worker died or none
#: is running); the next start marks it failed instead of waiting for it forever.
ABANDONED_AFTER_S = TASK_TIME_LIMIT_S + 60
#: The progress bar is refreshed every second; writing more often than this only adds load.
PROGRESS_INTERVAL_S = 0.5
ACTIVE_STATUSES = (OptimizerStatus.PENDING, OptimizerStatus.RUNNING)
#: Longest error text kept on a run (the model's TextField has no limit; the page has).
MAX_ERROR_CHARS = 2000

REQUEST_SOURCE = "resize-request"
SUGGESTION_SOURCE = "suggestion"
MANUAL_SOURCE = "manual"

FLEET_CHANGED = "The fleet changed since this plan was computed; run the optimizer again."
QUEUE_UNREACHABLE = ("Could not queue the run: the task queue (Redis) is unreachable; start it again once it is "
                     "back.")

# A key of the PostgreSQL advisory lock that serializes `start_run` (the letters "OPTR").
_START_LOCK_KEY = 0x4F505452


class RunInProgress(Exception):
    """A run is already queued or running; `run` is that one."""

    def __init__(self, run: OptimizerRun):
        self.run = run
        super().__init__(f"Optimizer run #{run.pk} is {run.get_status_display().lower()}; wait for it to finish.")


class PlanConflict(Exception):
    """The plan cannot be applied now: `message` says why, `violations` lists the rules the
    fleet refused (empty when the refusal is about the run or the fleet as a whole)."""

    def __init__(self, message: str, violations: Iterable[Violation] = ()):
        self.message = message
        self.violations = list(violations)
        super().__init__(message)


# Reads ----------------------------------------------------------------------------------------


def pending_requests() -> QuerySet[ResizeRequest]:
    """Resize requests still waiting for a decision, newest first: the "pending changes" a
    plan includes by default. A request that also changes the VM's vCPUs or RAM is left to its
    own approval: a plan places vGPUs only, and approving it with the plan would drop the size."""
    return ResizeRequest.objects.filter(status=ResizeStatus.PENDING, requested_vcpus__isnull=True,
                                        requested_ram_gib__isnull=True).order_by("-created_at", "-id")


def actionable_suggestions() -> QuerySet[Suggestion]:
    """Upsize and downsize suggestions with a target profile that no admin dismissed (a
    dismissal counts while the evidence it saw is unchanged)."""
    dismissed = ~Q(dismissed_key="") & Q(dismissed_key=F("evidence_key"))
    return (
        Suggestion.objects.filter(
            action__in=(SuggestionAction.UPSIZE, SuggestionAction.DOWNSIZE), suggested_profile__isnull=False,
        )
        .exclude(dismissed)
        .order_by("vm_id")
    )


def active_run() -> OptimizerRun | None:
    """The run queued or running now, if any."""
    return OptimizerRun.objects.filter(status__in=ACTIVE_STATUSES).order_by("created_at", "id").first()


def recent_runs(limit: int = 20) -> QuerySet[OptimizerRun]:
    """The newest runs with who started them and the summary of their plan, without loading
    plans or parameters (a plan of a large fleet holds every vGPU's assignment)."""
    return (
        OptimizerRun.objects.select_related("created_by", "applied_by")
        .defer("result", "params")
        .annotate(summary=KeyTransform("summary", "result"))
        .order_by("-created_at", "-id")[:limit]
    )


def fleet_changed_since(run: OptimizerRun, snapshot: FleetSnapshot | None = None) -> bool:
    """Whether placements, host capacity or VM sizes changed since the run read the fleet
    (the plan would then rest on a fleet that no longer exists)."""
    snapshot = snapshot or fleet_snapshot()
    return snapshot.fingerprint() != run.fleet_fingerprint


# Starting a run -------------------------------------------------------------------------------


def _change_dict(vm_id: int, profile_id: int | None, vgpus: int, source: str) -> dict:
    return {"vm_id": vm_id, "profile_id": profile_id, "vgpus": vgpus, "source": source}


def gather_changes(include_requests: bool = True, include_suggestions: bool = False,
                   vm_changes: Iterable[optimizer.Change] = ()) -> tuple[list[dict], list[dict]]:
    """The pending changes a new plan must include, one per VM, and the ones left out.

    Returns (changes, superseded) as JSON-ready dicts. When several changes name one VM the
    most deliberate one wins: an explicit what-if change, then the newest resize request
    (someone asked for it), then a right-sizing suggestion; `superseded` lists the others with
    the source that won, so the page can say why a request was not part of the plan.
    """
    chosen: dict[int, dict] = {}
    superseded: list[dict] = []

    def offer(change: dict) -> None:
        winner = chosen.get(change["vm_id"])
        if winner is None:
            chosen[change["vm_id"]] = change
        else:
            superseded.append({**change, "superseded_by": winner["source"]})

    for change in vm_changes:
        offer(_change_dict(change.vm_id, change.profile_id, change.vgpus, change.source or MANUAL_SOURCE))
    if include_requests:
        for request_id, vm_id, profile_id, vgpus in pending_requests().values_list(
            "pk", "vm_id", "requested_profile_id", "requested_vgpus",
        ):
            offer(_change_dict(vm_id, profile_id, vgpus, f"{REQUEST_SOURCE}:{request_id}"))
    if include_suggestions:
        suggestions = list(actionable_suggestions().values_list("pk", "vm_id", "suggested_profile_id",
                                                                "suggested_vgpus"))
        held = dict(
            Vgpu.objects.filter(vm_id__in=[vm_id for _, vm_id, _, _ in suggestions])
            .order_by().values("vm_id").annotate(n=Count("id")).values_list("vm_id", "n")
        )
        for suggestion_id, vm_id, profile_id, vgpus in suggestions:
            # A suggestion without a count keeps the VM's number of vGPUs.
            count = vgpus or held.get(vm_id) or 1
            offer(_change_dict(vm_id, profile_id, count, f"{SUGGESTION_SOURCE}:{suggestion_id}"))
    return sorted(chosen.values(), key=lambda c: c["vm_id"]), superseded


def _serialize_starts() -> None:
    """Make concurrent `start_run` calls take turns, so two cannot both find no active run.

    SQLite needs nothing: its IMMEDIATE transactions already hold the write lock from BEGIN.
    """
    if connection.vendor == "postgresql":
        with connection.cursor() as cursor:
            cursor.execute("SELECT pg_advisory_xact_lock(%s)", [_START_LOCK_KEY])


def abandon_lost_runs(now=None) -> int:
    """Mark failed the runs queued or running for longer than any run can take; returns how
    many. Without this a worker that died mid-run would block every later run."""
    now = now or timezone.now()
    cutoff = now - timedelta(seconds=ABANDONED_AFTER_S)
    lost = OptimizerRun.objects.filter(status__in=ACTIVE_STATUSES).filter(
        Q(started_at__lt=cutoff) | Q(started_at__isnull=True, created_at__lt=cutoff),
    )
    return lost.update(
        status=OptimizerStatus.FAILED, finished_at=now,
        error=f"No worker finished this run within {ABANDONED_AFTER_S} s (is a Celery worker running?); "
              f"it was abandoned so a new run could start.",
    )


#: What an audit event keeps of a run: its state and who started and applied it (the plan itself
#: is on the run's page; the event's comment says what it included).
AUDITED_FIELDS = ["status", "stage", "created_by", "created_at", "applied_by", "applied_at"]


def start_run(user, include_requests: bool = True, include_suggestions: bool = False,
              vm_changes: Iterable[optimizer.Change] = (), drain_gpu_ids: Iterable[int] = ()) -> OptimizerRun:
    """Create a queued run with the pending changes it must include and send it to a worker.

    With `drain_gpu_ids` the run is a drain: its plan moves every VM off those GPUs and nothing
    onto them, and no other VM (the changes aside); `params` keeps their ids and names (the page
    names them even once a GPU is gone). ValueError for an id that is not a GPU of the fleet.

    Raises RunInProgress (carrying that run) while another run is queued or running: the
    caller shows it rather than starting a second one. The task is sent only once the run
    is committed, so the worker always finds the row. When the task queue cannot take it,
    the run comes back failed with QUEUE_UNREACHABLE as its error (see `send_run`).
    """
    with transaction.atomic():
        _serialize_starts()
        abandon_lost_runs()
        running = active_run()
        if running is not None:
            raise RunInProgress(running)
        changes, superseded = gather_changes(include_requests, include_suggestions, vm_changes)
        drained = _drained_gpus(drain_gpu_ids)
        run = OptimizerRun.objects.create(
            created_by=user if user is not None and user.is_authenticated else None,
            params={
                "include_requests": include_requests,
                "include_suggestions": include_suggestions,
                "time_limit_s": SEARCH_TIME_LIMIT_S,
                "changes": changes,
                "superseded": superseded,
                "drain_gpu_ids": sorted(drained),
                "drain_gpus": {str(pk): name for pk, name in sorted(drained.items())},
            },
            stage="Queued",
        )
        comment = (f"{len(changes)} pending change(s); resize requests "
                   f"{'included' if include_requests else 'left out'}, suggestions "
                   f"{'included' if include_suggestions else 'left out'}")
        if drained:
            comment += f"; drain of GPU {', '.join(name for _, name in sorted(drained.items()))}"
        audit.record("optimizer_run.start", run, after=audit.snapshot(run, AUDITED_FIELDS), comment=comment)
        transaction.on_commit(lambda: send_run(run))
    return run


def _drained_gpus(gpu_ids: Iterable[int]) -> dict[int, str]:
    """{id: name} of the GPUs a run drains; ValueError naming an id that is no GPU."""
    wanted = set(gpu_ids)
    found = {gpu.pk: str(gpu) for gpu in Gpu.objects.filter(pk__in=wanted).select_related("host", "gpu_model")}
    missing = sorted(wanted - set(found))
    if missing:
        raise ValueError(f"No GPU #{missing[0]} in the fleet: it cannot be drained.")
    return found


def drained_gpus(run: OptimizerRun) -> list[str]:
    """The names of the GPUs `run` drains (empty for a run that drains none)."""
    names = run.params.get("drain_gpus", {})
    return [names.get(str(pk), f"GPU #{pk}") for pk in run.params.get("drain_gpu_ids", [])]


def enqueue(run_id: int) -> None:
    """Send the run to a Celery worker (a function of its own so tests can intercept it);
    raises QueueUnavailable when the broker cannot be reached."""
    # By name: sizing.tasks imports this module to carry the run out.
    send_from_request(current_app.tasks[RUN_OPTIMIZER_TASK], run_id)


def send_run(run: OptimizerRun) -> None:
    """Send a committed run to a worker; when the task queue is unreachable, mark it failed
    with QUEUE_UNREACHABLE, in the database and on `run` (its starter shows it at once).

    Left queued, a run no worker will ever receive would block every later run until
    `abandon_lost_runs` gave up on it minutes later.
    """
    try:
        enqueue(run.pk)
    except QueueUnavailable:
        now = timezone.now()
        OptimizerRun.objects.filter(pk=run.pk, status=OptimizerStatus.PENDING).update(
            status=OptimizerStatus.FAILED, error=QUEUE_UNREACHABLE, finished_at=now, stage="Failed",
        )
        run.status, run.error, run.finished_at, run.stage = OptimizerStatus.FAILED, QUEUE_UNREACHABLE, now, "Failed"


# Carrying a run out ---------------------------------------------------------------------------


class ProgressWriter:
    """The optimizer's progress callback: writes the fraction done and the stage to the run.

    Each write is its own UPDATE outside any transaction (the task runs in autocommit), so
    the page polling the run sees it at once. Writes are spaced at least `interval_s` apart
    (the optimizer may report far more often), and the fraction never goes backwards nor
    past 1 (the column's check constraint).
    """

    def __init__(self, run_id: int, *, interval_s: float = PROGRESS_INTERVAL_S,
                 clock: Callable[[], float] = time.monotonic):
        self.run_id = run_id
        self.interval_s = interval_s
        self.clock = clock
        self.fraction = 0.0
        self.writes = 0
        self._last_write_at: float | None = None

    def __call__(self, fraction: float, stage: str) -> None:
        self.fraction = min(max(float(fraction), self.fraction), 1.0)
        now = self.clock()
        if self._last_write_at is not None and now - self._last_write_at < self.interval_s:
            return
        self.write(self.fraction, stage)
        self._last_write_at = now

    def write(self, fraction: float, stage: str) -> None:
        OptimizerRun.objects.filter(pk=self.run_id, status=OptimizerStatus.RUNNING).update(
            progress=fraction, stage=stage[:120],
        )
        self.writes += 1


def claim_run(run_id: int) -> bool:
    """Turn a queued run into a running one; False when it is not queued (already claimed by
    another delivery of the same message, finished, or abandoned), so a task delivered twice
    computes the plan once."""
    return bool(OptimizerRun.objects.filter(pk=run_id, status=OptimizerStatus.PENDING).update(
        status=OptimizerStatus.RUNNING, started_at=timezone.now(), progress=0.0, stage="Reading the fleet",
    ))


def changes_for(params: dict, snapshot: FleetSnapshot) -> tuple[list[optimizer.Change], list[tuple[int, str]]]:
    """The run's changes as optimizer Changes, and (vm_id, reason) for those that name a VM or
    profile deleted since the run was started (they cannot be planned; the page lists them)."""
    changes, dropped = [], []
    for item in params.get("changes", []):
        if item["vm_id"] not in snapshot.vms:
            dropped.append((item["vm_id"], f"{item['source']}: the VM no longer exists"))
        elif item["profile_id"] is not None and item["profile_id"] not in snapshot.profiles:
            dropped.append((item["vm_id"], f"{item['source']}: the profile no longer exists"))
        else:
            changes.append(optimizer.Change(item["vm_id"], item["profile_id"], item["vgpus"], item["source"]))
    return changes, dropped


def result_names(snapshot: FleetSnapshot, plan: optimizer.Plan, changes: Iterable[optimizer.Change]) -> dict:
    """Names of the VMs, GPUs, hosts and profiles the plan and its changes mention, keyed by id
    (as strings: JSON object keys), so the run page renders the diff without reading the
    fleet again, and still reads right after the fleet has changed."""
    changes = list(changes)
    vm_ids = {m.vm_id for m in plan.moves} | {vm_id for vm_id, _ in plan.unplaced} | {c.vm_id for c in changes}
    gpu_ids = set(plan.freed_gpu_ids) | set(plan.newly_used_gpu_ids) | set(plan.drained)
    profile_ids = {c.profile_id for c in changes}
    for move in plan.moves:
        gpu_ids.update(move.from_gpu_ids)
        gpu_ids.update(move.to_gpu_ids)
        profile_ids.update((move.from_profile_id, move.to_profile_id))
    gpus = {}
    for gpu_id in sorted(gpu_ids):
        gpu = snapshot.gpus.get(gpu_id)
        if gpu is not None:
            host = snapshot.hosts.get(gpu.host_id)
            gpus[str(gpu_id)] = {"label": gpu.label, "host_id": gpu.host_id,
                                 "host": host.name if host else "", "model": gpu.model.name}
    return {
        "vms": {str(i): snapshot.vms[i].name for i in sorted(vm_ids) if i in snapshot.vms},
        "gpus": gpus,
        "hosts": {str(h.id): h.name for h in snapshot.hosts.values()
                  if h.id in {g["host_id"] for g in gpus.values()}},
        "profiles": {str(i): snapshot.profiles[i].name for i in sorted(p for p in profile_ids if p is not None)
                     if i in snapshot.profiles},
    }


def plan_summary(plan: optimizer.Plan, dropped: list) -> dict:
    """The figures the list of runs shows without loading the plan."""
    return {
        "gpus_before": plan.gpus_before,
        "gpus_after": plan.gpus_after,
        "lower_bound": plan.lower_bound,
        "gpus_freed": len(plan.freed_gpu_ids),
        "gpus_newly_used": len(plan.newly_used_gpu_ids),
        "vms_moved": len(plan.moves),
        "unplaced": len(plan.unplaced) + len(dropped),
        "seconds": round(plan.seconds, 3),
    }


def _fail(run_id: int, error: str) -> None:
    OptimizerRun.objects.filter(pk=run_id, status=OptimizerStatus.RUNNING).update(
        status=OptimizerStatus.FAILED, error=error[:MAX_ERROR_CHARS], finished_at=timezone.now(),
        stage="Failed",
    )


def execute_run(run_id: int, *, progress_interval_s: float = PROGRESS_INTERVAL_S) -> str:
    """Carry out a queued run: claim it, plan, verify, store. Returns the run's status after
    (or "skipped" when the run was not queued, e.g. a second delivery of the task).

    A plan that breaks any placement rule is never stored as done: the run fails and lists
    the violations. Other failures keep only the exception's type and message (the full
    traceback goes to the worker's log, not to the page).
    """
    if not claim_run(run_id):
        return "skipped"
    run = OptimizerRun.objects.only("params").get(pk=run_id)
    try:
        snapshot = fleet_snapshot()
        fingerprint = snapshot.fingerprint()
        OptimizerRun.objects.filter(pk=run_id).update(fleet_fingerprint=fingerprint)
        changes, dropped = changes_for(run.params, snapshot)
        drained = run.params.get("drain_gpu_ids", [])
        gone = [pk for pk in drained if pk not in snapshot.gpus]
        if gone:
            _fail(run_id, f"{drained_gpus(run)[drained.index(gone[0])]} is no longer in the fleet: there is "
                          f"nothing to drain.")
            return OptimizerStatus.FAILED
        writer = ProgressWriter(run_id, interval_s=progress_interval_s)
        writer(0.0, "Planning")
        plan = optimizer.optimize(
            snapshot, changes, progress=writer,
            time_limit_s=float(run.params.get("time_limit_s", SEARCH_TIME_LIMIT_S)), drained=drained,
        )
        writer.write(writer.fraction, "Checking the plan against every placement rule")
        violations = optimizer.verify(snapshot, plan)
        if violations:
            _fail(run_id, "The optimizer returned a plan that breaks placement rules, so it was discarded:\n"
                  + "\n".join(f"- [{v.rule}] {v.message}" for v in violations))
            return OptimizerStatus.FAILED
        result = {
            "summary": plan_summary(plan, dropped),
            "plan": plan.to_json(),
            "names": result_names(snapshot, plan, changes),
            "dropped": [[vm_id, reason] for vm_id, reason in dropped],
        }
    except SoftTimeLimitExceeded:
        _fail(run_id, f"The run took longer than {TASK_SOFT_TIME_LIMIT_S} s and was stopped.")
        return OptimizerStatus.FAILED
    except Exception as exc:
        logger.exception("optimizer run %s failed", run_id)
        _fail(run_id, f"{type(exc).__name__}: {exc}")
        return OptimizerStatus.FAILED
    stored = OptimizerRun.objects.filter(pk=run_id, status=OptimizerStatus.RUNNING).update(
        status=OptimizerStatus.DONE, result=result, progress=1.0, stage="Done", finished_at=timezone.now(),
    )
    # Not stored when the run was abandoned meanwhile (it overran ABANDONED_AFTER_S).
    return OptimizerStatus.DONE if stored else "abandoned"


# Applying a plan ------------------------------------------------------------------------------


@dataclass
class PlannedVgpu:
    """One vGPU of the plan's target layout, read back from the stored plan."""

    vm_id: int
    gpu_id: int
    profile_id: int


@dataclass
class ApplyOutcome:
    """What applying a plan did: VMs re-placed, vGPUs created, requests approved."""

    run: OptimizerRun
    vms_moved: int = 0
    vgpus_placed: int = 0
    approved_request_ids: list[int] = field(default_factory=list)
    #: The operations that make linked hosts' hypervisors follow the plan, in the order they run.
    operation_ids: list[int] = field(default_factory=list)
    #: Requests being applied by those operations (APPLYING; approved once theirs succeeds).
    applying_request_ids: list[int] = field(default_factory=list)


def operation_order(moves: dict[int, tuple[set[int], set[int]]]) -> list[int]:
    """The VMs of `moves` ({vm id: (GPU ids it leaves, GPU ids it arrives on)}, in the plan's
    order) in the order their operations run: a VM arrives on a GPU only after every VM that
    leaves that GPU has left (the room it needs may be theirs, and an equal-size GPU changes
    its vGPU size only once empty). PlanConflict for VMs that exchange GPUs: one VM at a time,
    neither could go first."""
    leaving: dict[int, set[int]] = {}
    for vm_id, (sources, _) in moves.items():
        for gpu_id in sources:
            leaving.setdefault(gpu_id, set()).add(vm_id)
    after = {vm_id: {other for gpu_id in targets for other in leaving.get(gpu_id, ()) if other != vm_id}
             for vm_id, (_, targets) in moves.items()}
    ordered: list[int] = []
    done: set[int] = set()
    while len(ordered) < len(moves):
        ready = [vm_id for vm_id in moves if vm_id not in done and after[vm_id] <= done]
        if not ready:
            stuck = sorted(vm_id for vm_id in moves if vm_id not in done)
            raise PlanConflict(stuck_message(stuck))
        ordered.append(ready[0])
        done.add(ready[0])
    return ordered


def stuck_message(vm_ids: list[int]) -> str:
    names = dict(VirtualMachine.objects.filter(pk__in=vm_ids).values_list("pk", "name"))
    return (f"The plan exchanges GPUs between {', '.join(names.get(i, f'VM {i}') for i in vm_ids)} on hosts linked "
            "to their hypervisor: each must leave its GPU before another arrives, so none can go first. Nothing was "
            "changed; move one of them by hand (or with a resize request), then run the optimizer again.")


def _planned_vgpus(run: OptimizerRun) -> list[PlannedVgpu]:
    return [PlannedVgpu(a["vm_id"], a["gpu_id"], a["profile_id"]) for a in run.result["plan"]["assignments"]]


def _vms_to_replace(run: OptimizerRun, planned: list[PlannedVgpu]) -> set[int]:
    """VMs whose vGPUs the plan changes: the plan's moves, and (as a safeguard) any VM whose
    GPUs or profiles in the plan differ from what it holds now."""
    moved = {m["vm_id"] for m in run.result["plan"]["moves"]}
    wanted: dict[int, list] = {}
    for item in planned:
        wanted.setdefault(item.vm_id, []).append((item.gpu_id, item.profile_id))
    held: dict[int, list] = {}
    for vm_id, gpu_id, profile_id in Vgpu.objects.filter(vm_id__in=wanted).values_list("vm_id", "gpu_id",
                                                                                         "profile_id"):
        held.setdefault(vm_id, []).append((gpu_id, profile_id))
    return moved | {vm_id for vm_id, pairs in wanted.items() if sorted(pairs) != sorted(held.get(vm_id, []))}


def _lock_in_service_order(run: OptimizerRun, planned: list[PlannedVgpu], replaced: set[int],
                           request_ids: list[int]) -> locks.Locked:
    """Lock every host, GPU, VM and vGPU the plan touches, the resize requests it carries out and
    the run itself, in `fleet.locks`' order, before the first removal: the services then lock only
    rows already held. (Locking a VM for a removal, then waiting for a host that an approval
    holds while it waits for that VM, is the deadlock this prevents.)"""
    gpu_ids = set(Vgpu.objects.filter(vm_id__in=replaced).values_list("gpu_id", flat=True))
    gpu_ids |= {item.gpu_id for item in planned if item.vm_id in replaced}
    host_ids = set(Gpu.objects.filter(pk__in=gpu_ids).values_list("host_id", flat=True))
    host_ids |= set(VirtualMachine.objects.filter(pk__in=replaced, host__isnull=False).values_list("host_id",
                                                                                                    flat=True))
    try:
        return locks.lock_for_change(hosts=host_ids, gpus=gpu_ids, vms=replaced,
                                     vgpus=Vgpu.objects.filter(vm_id__in=replaced), requests=request_ids,
                                     then=[OptimizerRun.objects.filter(pk=run.pk)])
    except services.FleetConflict as exc:
        raise PlanConflict(f"{exc} Nothing was changed; run the optimizer again.") from exc


def _check_appliable(run: OptimizerRun) -> None:
    if run.status == OptimizerStatus.APPLIED:
        raise PlanConflict(f"Optimizer run #{run.pk} was applied already.")
    if run.status != OptimizerStatus.DONE:
        raise PlanConflict(
            f"Optimizer run #{run.pk} is {run.get_status_display().lower()}; only a finished plan can be applied.",
        )


def included_request_ids(run: OptimizerRun) -> list[int]:
    """The resize requests the plan carries out: those among its changes that were placed."""
    unplaced = {vm_id for vm_id, _ in run.result["plan"]["unplaced"]} | {vm_id for vm_id, _ in
                                                                        run.result.get("dropped", [])}
    return sorted(
        int(c["source"].split(":", 1)[1]) for c in run.params.get("changes", [])
        if c["source"].startswith(f"{REQUEST_SOURCE}:") and c["vm_id"] not in unplaced
    )


def apply_run(run: OptimizerRun, user) -> ApplyOutcome:
    """Carry out a finished plan on the fleet, all of it or nothing; admins only (the caller
    checks the role).

    Refuses (PlanConflict) a run that is not done, a fleet that changed since the plan was
    computed, and resize requests decided meanwhile. Otherwise, in one transaction: removes
    the vGPUs of every VM the plan changes, places them again where the plan says, in the
    plan's order, through `fleet.services.place_vgpu` (every rule re-checked under row locks),
    marks the included resize requests approved and the run applied. Any refusal rolls all of
    it back and raises PlanConflict with the violations.
    """
    run = OptimizerRun.objects.get(pk=run.pk)  # locked below, after the fleet's rows
    _check_appliable(run)
    planned = _planned_vgpus(run)
    replaced = _vms_to_replace(run, planned)
    request_ids = included_request_ids(run)
    with transaction.atomic():
        locked = _lock_in_service_order(run, planned, replaced, request_ids)
        if not locked.then[0]:
            raise PlanConflict(f"Optimizer run #{run.pk} was deleted meanwhile.")
        run = locked.then[0][0]
        _check_appliable(run)  # applied by another admin while this one waited
        requests = [locked.requests[pk] for pk in request_ids]
        decided = [r for r in requests if r.status != ResizeStatus.PENDING]
        if decided:
            which = ", ".join(f"#{r.pk}" for r in decided)
            how = ", ".join(f"#{r.pk} {r.get_status_display().lower()}{f' by {r.decided_by}' if r.decided_by else ''}"
                            for r in decided)
            raise PlanConflict(f"Resize request {which} was decided since this plan was computed ({how}); "
                               f"run the optimizer again.")
        if fleet_changed_since(run):
            raise PlanConflict(FLEET_CHANGED)

        held = {vm_id: fleet_requests.vgpu_rows(vm_id) for vm_id in sorted(replaced)}
        services.remove_vgpus(Vgpu.objects.filter(vm_id__in=replaced).order_by("vm_id", "pk"))
        todo = [item for item in planned if item.vm_id in replaced]
        placed: dict[int, list[Vgpu]] = {vm_id: [] for vm_id in sorted(replaced)}
        vms = VirtualMachine.objects.in_bulk({item.vm_id for item in todo})
        gpus = Gpu.objects.select_related("host", "gpu_model").in_bulk({item.gpu_id for item in todo})
        profiles = VgpuProfile.objects.select_related("gpu_model").in_bulk({item.profile_id for item in todo})
        try:
            for item in todo:
                placed[item.vm_id].append(
                    services.place_vgpu(vms[item.vm_id], gpus[item.gpu_id], profiles[item.profile_id]))
        except PlacementError as exc:
            raise PlanConflict(
                f"The fleet refused the plan ({exc}); nothing was changed. Run the optimizer again.", exc.violations,
            ) from exc
        except KeyError as exc:
            raise PlanConflict(f"An object of the plan no longer exists ({exc}); nothing was changed.") from exc

        now = timezone.now()
        comment = f"Applied by optimizer run #{run.pk}"
        by_vm = {request.vm_id: request for request in requests}
        created = _create_operations(run, user, run.result["plan"]["moves"], held, placed, by_vm)
        applying = {op.request_id for op in created if op.request_id}
        events = []
        for request in requests:
            before = audit.snapshot(request)
            request.status = ResizeStatus.APPLYING if request.pk in applying else ResizeStatus.APPROVED
            request.decided_by, request.decided_at = user, now
            request.decision_comment, request.last_error = comment, ""
            request.save(update_fields=["status", "decided_by", "decided_at", "decision_comment", "last_error",
                                        "updated_at"])
            events.append(audit.event("resize_request.approve", request, before=before,
                                      after=audit.snapshot(request), comment=comment))
        audit.record_many(events)
        before = audit.snapshot(run, AUDITED_FIELDS)
        run.status = OptimizerStatus.APPLIED
        run.applied_by = user
        run.applied_at = now
        run.stage = "Applied"
        run.save(update_fields=["status", "applied_by", "applied_at", "stage"])
        audit.record("optimizer_run.apply", run, before=before, after=audit.snapshot(run, AUDITED_FIELDS),
                     comment=f"{len(replaced)} VM(s) moved, {len(todo)} vGPU(s) placed, "
                             f"{len(request_ids) - len(applying)} resize request(s) approved, "
                             f"{len(created)} operation(s) created on the hypervisors")
    return ApplyOutcome(run=run, vms_moved=len(replaced), vgpus_placed=len(todo),
                        approved_request_ids=[pk for pk in request_ids if pk not in applying],
                        operation_ids=[op.pk for op in created], applying_request_ids=sorted(applying))


def _create_operations(run: OptimizerRun, user, moves: list[dict], held: dict[int, list[dict]],
                       placed: dict[int, list[Vgpu]], requests: dict[int, ResizeRequest]) -> list[Operation]:
    """One operation per VM the plan moves on linked hosts, in `operation_order`, as one batch;
    PlanConflict (the caller's transaction then undoes the whole plan) when a VM would move
    between a linked and an unlinked host, or when it or a GPU is under another operation."""
    plan_order = [m["vm_id"] for m in moves if m["vm_id"] in placed]
    plan_order += [vm_id for vm_id in placed if vm_id not in plan_order]
    gpu_ids = {row["gpu_id"] for rows in held.values() for row in rows} | {
        vgpu.gpu_id for vgpus in placed.values() for vgpu in vgpus}
    linked_gpus = set(Gpu.objects.filter(pk__in=gpu_ids).exclude(host__hypervisor_uri="").values_list("pk", flat=True))
    linked_moves = {vm_id: ({row["gpu_id"] for row in held[vm_id]}, {vgpu.gpu_id for vgpu in placed[vm_id]})
                    for vm_id in plan_order}
    linked_moves = {vm_id: gpus for vm_id, gpus in linked_moves.items() if (gpus[0] | gpus[1]) & linked_gpus}
    # Moves between unlinked hosts come last: they create nothing, unless one crosses to a linked host.
    order = operation_order(linked_moves) + [vm_id for vm_id in plan_order if vm_id not in linked_moves]
    created = []
    try:
        for index, vm_id in enumerate(order):
            request = requests.get(vm_id)
            resized = sorted(row["profile_id"] for row in held[vm_id]) != sorted(v.profile_id for v in placed[vm_id])
            operation = operations.create_for_placement(
                vm_id, held[vm_id], placed[vm_id], request=request, actor=user,
                kind=OperationKind.RESIZE if request or resized else OperationKind.MOVE,
                origin=f"optimizer run #{run.pk}" + (f" (resize request #{request.pk})" if request else ""),
                batch=batch_key(run), batch_index=index)
            if operation is not None:
                created.append(operation)
    except services.FleetConflict as exc:
        raise PlanConflict(f"{exc} Nothing was changed.", exc.violations) from exc
    return created


# The operations a plan created ---------------------------------------------------------------


def batch_key(run: OptimizerRun) -> str:
    """What the operations applying `run` carry as their batch (`hypervisors.operations`)."""
    return f"optimizer-run:{run.pk}"


def operations_of(run: OptimizerRun) -> list[Operation]:
    """The operations applying `run` created, in the order they run, with what the page shows."""
    found = (Operation.objects.filter(after__batch=batch_key(run))
             .select_related("vm", "host", "target_host").prefetch_related("steps"))
    return sorted(found, key=lambda op: op.after.get("batch_index", 0))


def run_operations_now(run: OptimizerRun, user) -> list[int]:
    """An admin's "run now" for every pending operation of the plan; they still run one at a
    time, in order. Returns the ids asked to run (those that ended or started meanwhile are left)."""
    started = []
    for operation in operations_of(run):
        if operation.status != OperationStatus.PENDING:
            continue
        try:
            operations.run_now(operation, user)
        except services.FleetConflict:
            continue  # it started or ended since the page was read
        started.append(operation.pk)
    return started

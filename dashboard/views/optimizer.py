"""The placement optimizer's pages, staff only.

`/sizing/optimizer/` explains what the optimizer does, starts a run (with or without the
pending resize requests and the right-sizing suggestions) and lists recent runs.
`/sizing/optimizer/<id>/` follows one run: while it is queued or running, its body re-fetches
itself every second through htmx (the progress bar); once done, the same body, now without
the polling trigger, shows the plan as a diff against the fleet and the Apply button, which
is disabled (with the reason) when the fleet changed since the plan was computed. A drain
(started from a health alert's page) names the GPU it empties and lists what stays on it.
Applying is a POST to `/sizing/optimizer/<id>/apply/` and needs an explicit confirmation.
Moves on hosts linked to their hypervisor become operations; the applied run lists them (each
linking to `/operations/<id>/`), keeps polling while they are under way, and offers "Run them
all now" (a POST to `/sizing/optimizer/<id>/run-operations/`).
"""

from __future__ import annotations

from django import forms
from django.contrib import messages
from django.shortcuts import get_object_or_404, redirect, render
from django.urls import reverse
from django.views.decorators.http import require_POST
from django_htmx.http import HttpResponseClientRefresh

from config.roles import is_fleet_admin
from dashboard.access import staff_required
from fleet.models import Gpu, Host
from hypervisors.choices import OperationStatus
from hypervisors.models import ACTIVE as ACTIVE_OPERATIONS
from sizing import optimizer_runs
from sizing.models import OptimizerRun, OptimizerStatus

POLL_INTERVAL_S = 1


class StartRunForm(forms.Form):
    """What a new run includes besides consolidating the fleet as it is."""

    include_requests = forms.BooleanField(required=False, initial=True, label="Include pending resize requests")
    include_suggestions = forms.BooleanField(
        required=False, initial=False, label="Include right-sizing suggestions (upsize and downsize)",
    )
    # Set by a drain's "Run again": the GPU whose VMs the plan moves away.
    drain_gpu = forms.ModelChoiceField(queryset=Gpu.objects.all(), required=False, widget=forms.HiddenInput)


class ApplyForm(forms.Form):
    """The confirmation of the plan shown, with the fingerprint of the fleet it was computed on."""

    confirm = forms.BooleanField(
        required=True, label="I understand that the moved VMs must be shut down and started on their new GPUs",
        error_messages={"required": "Tick the confirmation to apply the plan."},
    )
    fingerprint = forms.CharField(
        max_length=64, error_messages={"required": "Tick the confirmation to apply the plan."},
    )


@staff_required
def optimizer(request):
    """The optimizer's home: what it does, a start form, recent runs. POST starts a run."""
    form = StartRunForm(request.POST if request.method == "POST" else None)
    if request.method == "POST" and form.is_valid():
        try:
            drain_gpu = form.cleaned_data["drain_gpu"]
            run = optimizer_runs.start_run(
                request.user, include_requests=form.cleaned_data["include_requests"],
                include_suggestions=form.cleaned_data["include_suggestions"],
                drain_gpu_ids=[drain_gpu.pk] if drain_gpu else (),
            )
        except optimizer_runs.RunInProgress as exc:
            # Worded for after the fact: the message stays on the page while the run below finishes.
            messages.info(request,
                          f"No new run was started: run #{exc.run.pk} had not finished. Its progress is below.")
            return redirect("sizing:optimizer-run", pk=exc.run.pk)
        if run.status == OptimizerStatus.FAILED:
            # The run's page says why (its error); the message only says that it did not start.
            messages.error(request, f"Optimizer run #{run.pk} was not queued; the reason is below.")
            return redirect("sizing:optimizer-run", pk=run.pk)
        # No "queued" message: it would outlive the state it names; the run's body says where it is.
        return redirect("sizing:optimizer-run", pk=run.pk)
    context = {
        "form": form,
        "pending_requests": optimizer_runs.pending_requests().count(),
        "suggestions": optimizer_runs.actionable_suggestions().count(),
        "runs": list(optimizer_runs.recent_runs()),
        "active": optimizer_runs.active_run(),
    }
    return render(request, "sizing/optimizer.html", context)


def optimizer_run(request, pk: int):
    """One run: its progress while it runs, then its plan.

    A poll from a page whose session has ended (signed out, expired, no longer staff) reloads
    the whole page, whose own checks then send the browser to the login page, rather than
    swapping a login form into the progress bar.
    """
    if request.htmx and not is_fleet_admin(request.user):
        return HttpResponseClientRefresh()
    return _optimizer_run(request, pk)


@staff_required
def _optimizer_run(request, pk: int):
    run = get_object_or_404(OptimizerRun.objects.select_related("created_by", "applied_by"), pk=pk)
    context = run_context(run, apply_form=ApplyForm())
    template = "sizing/partials/optimizer_run_body.html" if request.htmx else "sizing/optimizer_run.html"
    return render(request, template, context)


@require_POST
@staff_required
def apply_plan(request, pk: int):
    """Apply a finished plan (confirmed by the admin), then show the run with the outcome."""
    run = get_object_or_404(OptimizerRun, pk=pk)
    form = ApplyForm(request.POST)
    if not form.is_valid():
        messages.error(request, next(iter(form.errors.values()))[0])
        return redirect("sizing:optimizer-run", pk=run.pk)
    if form.cleaned_data["fingerprint"] != run.fleet_fingerprint:
        messages.error(request, f"Not applied: {optimizer_runs.FLEET_CHANGED}")
        return redirect("sizing:optimizer-run", pk=run.pk)
    try:
        outcome = optimizer_runs.apply_run(run, request.user)
    except optimizer_runs.PlanConflict as exc:
        detail = "".join(f" {v.message}." for v in exc.violations[:5])
        messages.error(request, f"Not applied: {exc.message}{detail}")
        return redirect("sizing:optimizer-run", pk=run.pk)
    approved, applying = len(outcome.approved_request_ids), len(outcome.applying_request_ids)
    created = len(outcome.operation_ids)
    messages.success(
        request,
        f"Plan applied: {outcome.vms_moved} VM{'s' if outcome.vms_moved != 1 else ''} re-placed"
        + (f", {approved} resize request{'s' if approved != 1 else ''} approved" if approved else "")
        + (f", {applying} resize request{'s' if applying != 1 else ''} being applied" if applying else "")
        + (f"; {created} operation{'s' if created != 1 else ''} created on the hypervisors: run them below"
           if created else "") + ".",
    )
    return redirect("sizing:optimizer-run", pk=run.pk)


@require_POST
@staff_required
def run_operations(request, pk: int):
    """Run now every pending operation that applying the plan created (one after another)."""
    run = get_object_or_404(OptimizerRun, pk=pk)
    started = optimizer_runs.run_operations_now(run, request.user)
    if started:
        messages.success(request, f"Running {len(started)} operation{'s' if len(started) != 1 else ''} now, one after "
                                  "another: " + ", ".join(f"#{pk}" for pk in started) + ".")
    else:
        messages.info(request, "No operation of this plan was waiting to run.")
    return redirect("sizing:optimizer-run", pk=run.pk)


# What the run page shows ----------------------------------------------------------------------


SOURCE_LABELS = {
    optimizer_runs.REQUEST_SOURCE: "Resize request #{}",
    optimizer_runs.SUGGESTION_SOURCE: "Right-sizing suggestion #{}",
}
REASON_LABELS = {
    "consolidation": "Consolidation: frees a GPU",
    "drain": "Drain: off the drained GPU",
    optimizer_runs.MANUAL_SOURCE: "What-if change",
}


def describe_source(source: str) -> str:
    """"resize-request:12" -> "Resize request #12"; a move's other reasons in words."""
    kind, _, ident = source.partition(":")
    if kind in SOURCE_LABELS and ident:
        return SOURCE_LABELS[kind].format(ident)
    return REASON_LABELS.get(source, source.replace("-", " ").replace("_", " ").capitalize())


def _gpu_place(names: dict, gpu_ids) -> list[dict]:
    gpus = names.get("gpus", {})
    return [gpus.get(str(gpu_id), {"label": f"GPU {gpu_id}", "host": "", "model": ""}) for gpu_id in gpu_ids]


def describe_plan(run: OptimizerRun) -> dict | None:
    """The plan of a finished run as the page shows it: figures, GPUs freed and newly used,
    moves with names, changes and what could not be placed. None before the run is done."""
    if not run.result:
        return None
    plan, names = run.result["plan"], run.result.get("names", {})
    vm_name = names.get("vms", {})
    profile_name = names.get("profiles", {})

    def profile(profile_id) -> str:
        return profile_name.get(str(profile_id), "none") if profile_id is not None else "none"

    moves = []
    for move in plan["moves"]:
        moves.append({
            "vm_id": move["vm_id"],
            "vm": move.get("vm_name") or vm_name.get(str(move["vm_id"]), f"VM {move['vm_id']}"),
            "from": _gpu_place(names, move["from_gpu_ids"]),
            "to": _gpu_place(names, move["to_gpu_ids"]),
            "from_profile": profile(move["from_profile_id"]),
            "to_profile": profile(move["to_profile_id"]),
            "from_count": len(move["from_gpu_ids"]),
            "to_count": len(move["to_gpu_ids"]),
            "resized": (move["from_profile_id"] != move["to_profile_id"]
                        or len(move["from_gpu_ids"]) != len(move["to_gpu_ids"])),
            "reason": describe_source(move["reason"]),
            # Every move stops the VM: a vGPU is created or removed only while its VM is powered off.
            "shutdown": True,
        })
    unplaced = [
        {"vm": vm_name.get(str(vm_id), f"VM {vm_id}"), "reason": reason}
        for vm_id, reason in [*plan["unplaced"], *run.result.get("dropped", [])]
    ]
    changes = [
        {"vm": vm_name.get(str(c["vm_id"]), f"VM {c['vm_id']}"), "profile": profile(c["profile_id"]),
         "vgpus": c["vgpus"], "source": describe_source(c["source"])}
        for c in run.params.get("changes", [])
    ]
    superseded = [
        {"vm": vm_name.get(str(c["vm_id"]), f"VM {c['vm_id']}"), "source": describe_source(c["source"]),
         "by": describe_source(c["superseded_by"])}
        for c in run.params.get("superseded", [])
    ]
    return {
        "gpus_before": plan["gpus_before"],
        "gpus_after": plan["gpus_after"],
        "lower_bound": plan["lower_bound"],
        "seconds": plan["seconds"],
        "freed": _gpu_place(names, plan["freed_gpu_ids"]),
        "newly_used": _gpu_place(names, plan["newly_used_gpu_ids"]),
        "moves": moves,
        "unplaced": unplaced,
        "changes": changes,
        "superseded": superseded,
        "shutdowns": [move["vm"] for move in moves if move["shutdown"]],
        "gpus_saved": plan["gpus_before"] - plan["gpus_after"],
        "gpus_added": plan["gpus_after"] - plan["gpus_before"],
        "drained": optimizer_runs.drained_gpus(run),
    }


def _mark_operations(plan: dict) -> None:
    """Flag the moves that touch a host linked to its hypervisor: applying makes operations of
    them, so the admin does not shut those VMs down by hand."""
    host_ids = {gpu.get("host_id") for move in plan["moves"] for gpu in move["from"] + move["to"]} - {None}
    linked = set(Host.objects.filter(pk__in=host_ids).exclude(hypervisor_uri="").values_list("pk", flat=True))
    for move in plan["moves"]:
        move["operation"] = any(gpu.get("host_id") in linked for gpu in move["from"] + move["to"])
    plan["shutdowns"] = [move["vm"] for move in plan["moves"] if not move["operation"]]
    plan["operations"] = [move["vm"] for move in plan["moves"] if move["operation"]]


def run_context(run: OptimizerRun, apply_form: ApplyForm | None = None) -> dict:
    """Everything the run body needs; reads the fleet's fingerprint only for a finished plan
    (to say whether it can still be applied), and the operations of an applied one."""
    plan = describe_plan(run) if run.status in (OptimizerStatus.DONE, OptimizerStatus.APPLIED) else None
    if plan:
        _mark_operations(plan)
    operations = optimizer_runs.operations_of(run) if run.status == OptimizerStatus.APPLIED else []
    for operation in operations:
        steps = list(operation.steps.all())
        operation.progress = f"{sum(1 for s in steps if s.status in ('done', 'skipped'))}/{len(steps)}"
    operations_active = any(op.status in ACTIVE_OPERATIONS for op in operations)
    active = run.status in (OptimizerStatus.PENDING, OptimizerStatus.RUNNING) or operations_active
    fleet_changed = run.status == OptimizerStatus.DONE and optimizer_runs.fleet_changed_since(run)
    can_apply = run.status == OptimizerStatus.DONE and not fleet_changed and bool(plan and plan["moves"])
    if run.status != OptimizerStatus.DONE:
        blocked_reason = ""
    elif fleet_changed:
        blocked_reason = optimizer_runs.FLEET_CHANGED
    elif not (plan and plan["moves"]):
        blocked_reason = "Nothing to apply: the plan moves no VM."
    else:
        blocked_reason = ""
    return {
        "run": run,
        "active": active,
        "poll_s": POLL_INTERVAL_S,
        "progress_pct": round(run.progress * 100),
        "plan": plan,
        "fleet_changed": fleet_changed,
        "can_apply": can_apply,
        "blocked_reason": blocked_reason,
        "apply_form": apply_form,
        "self_url": reverse("sizing:optimizer-run", args=[run.pk]),
        "operations": operations,
        "can_run_operations": any(op.status == OperationStatus.PENDING for op in operations),
        "drained": optimizer_runs.drained_gpus(run),
        "drain_gpu_ids": run.params.get("drain_gpu_ids", []),
    }

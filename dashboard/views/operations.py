"""/operations/: what the product does on the hypervisors, and each operation's steps.

The list is for fleet admins; an operation's page is also open to the artist whose VM it
changes. While an operation is pending or running its body refreshes itself through htmx, so
the admin who approved a request watches it go from step to step; "Run now" starts a pending
one whatever its window.
"""

from __future__ import annotations

from django import forms
from django.conf import settings
from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.db.models import QuerySet
from django.shortcuts import get_object_or_404, redirect, render
from django.utils import timezone
from django.views.decorators.http import require_POST
from django_htmx.http import HttpResponseClientRefresh

from config.roles import is_fleet_admin
from dashboard import tables
from dashboard.access import staff_required
from dashboard.forms import field_errors
from dashboard.listing import TableListView
from fleet.locks import FleetConflict
from hypervisors import operations
from hypervisors.filtersets import OperationFilterSet
from hypervisors.models import Operation
from hypervisors.queries import operations_for

#: How often an operation's page asks for its state while it is under way.
POLL_S = 2


def _progress(operation: Operation) -> str:
    steps = list(operation.steps.all())
    finished = sum(1 for step in steps if step.status in ("done", "skipped"))
    return f"{finished}/{len(steps)}"


class OperationListView(TableListView):
    """Every operation, newest first, with the API's filters."""

    table_class = tables.OperationTable
    filterset_class = OperationFilterSet
    template_name = "hypervisors/operation_list.html"
    filter_fields = ("status", "kind", "vm", "host")
    noun = "operations"
    csv_name = None  # the API exports them: /api/v1/operations/?format=csv

    def get_queryset(self) -> QuerySet:
        return operations_for(self.request.user)

    def decorate(self, rows: list) -> None:
        for row in rows:
            row.progress = _progress(row)

    def get_extra_context(self) -> dict:
        return {"title": "Operations", "empty_title": "No operations yet",
                "empty_message": "An operation is created when an admin approves a resize request for a VM on a host "
                                 "linked to its hypervisor (a host's hypervisor URI)."}


@login_required
def operation_detail(request, pk: int):
    """One operation and its steps; the body alone for the page's own polling."""
    if request.htmx and not request.user.is_authenticated:
        return HttpResponseClientRefresh()
    operation = get_object_or_404(operations_for(request.user), pk=pk)
    window_closed = bool(operation.not_after and operation.not_after <= timezone.now())
    context = {"op": operation, "steps": list(operation.steps.all()), "active": operation.is_active,
               "window_closed": window_closed,
               "poll_s": POLL_S, "can_run": is_fleet_admin(request.user), "self_url": request.path,
               "shutdown_timeout_s": settings.HYPERVISOR_SHUTDOWN_TIMEOUT_S}
    template = "hypervisors/partials/operation_body.html" if request.htmx else "hypervisors/operation_detail.html"
    return render(request, template, context)


class CancelForm(forms.Form):
    reason = forms.CharField(required=False, max_length=500)


@require_POST
@staff_required
def operation_cancel(request, pk: int):
    """An admin's "Cancel the change" for a pending operation: nothing on the hypervisor was
    touched; the inventory goes back and the request is marked failed with the reason."""
    operation = get_object_or_404(Operation, pk=pk)
    form = CancelForm(request.POST)
    if not form.is_valid():
        messages.error(request, f"Operation #{pk} was not cancelled: {field_errors(form)}")
        return redirect("hypervisors:operation-detail", pk=pk)
    try:
        operations.cancel(operation, request.user, form.cleaned_data["reason"])
        messages.success(request, f"Operation #{pk} was cancelled; {operation.vm.name} keeps its vGPU.")
    except FleetConflict as exc:
        messages.error(request, f"Operation #{pk} was not cancelled: {exc}")
    return redirect("hypervisors:operation-detail", pk=pk)


@require_POST
@staff_required
def operation_run(request, pk: int):
    """An admin's "Run now" for a pending operation."""
    operation = get_object_or_404(Operation, pk=pk)
    try:
        operations.run_now(operation, request.user)
        messages.success(request, f"Operation #{pk} is starting.")
    except FleetConflict as exc:
        messages.error(request, f"Operation #{pk} was not started: {exc}")
    return redirect("hypervisors:operation-detail", pk=pk)

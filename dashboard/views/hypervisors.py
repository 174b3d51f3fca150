"""The host page's hypervisor actions: check the connection now, read the hypervisor (sync) and
apply what the admin chose of its diff. POSTs only, admins only; each comes back to the host
page with a message. The page itself (`details.host_detail`) only reads stored rows."""

from __future__ import annotations

from django.contrib import messages
from django.shortcuts import get_object_or_404, redirect
from django.urls import reverse
from django.views.decorators.http import require_POST

from dashboard.access import staff_required
from dashboard.forms import HypervisorSyncForm, field_errors
from fleet.models import Host
from hypervisors import services
from hypervisors.models import SyncTrigger


def _back(host: Host):
    return redirect(reverse("fleet:host-detail", args=[host.pk]) + "#hypervisor")


@staff_required
@require_POST
def host_hypervisor_check(request, pk: int):
    host = get_object_or_404(Host, pk=pk)
    status = services.check_host(host)
    (messages.success if status.ok else messages.error)(request, f"Hypervisor check: {status.message}")
    return _back(host)


@staff_required
@require_POST
def host_hypervisor_sync(request, pk: int):
    host = get_object_or_404(Host, pk=pk)
    form = HypervisorSyncForm(request.POST)
    if not form.is_valid():
        messages.error(request, f"Sync not started: {field_errors(form)}")
        return _back(host)
    if not host.hypervisor_uri:
        messages.error(request, f"{host.name} has no hypervisor URI: link it first (admin site).")
        return _back(host)
    try:
        report, outcomes = services.sync_and_apply(host, form.choice(), user=request.user, trigger=SyncTrigger.PAGE)
    except services.UnknownEntries as exc:
        messages.error(request, f"{exc} The diff below is the hypervisor as it is now.")
        return _back(host)
    if not report.ok:
        messages.error(request, f"The hypervisor could not be read: {report.error}")
    elif not outcomes:
        count = len(report.differences)
        messages.success(request, f"Read the hypervisor: {count} difference(s) with the inventory."
                         if count else "Read the hypervisor: in step with the inventory.")
    for outcome in outcomes:
        level = messages.success if outcome["ok"] else messages.warning
        level(request, f"{outcome['name']}: {' '.join(outcome['messages'])}")
    return _back(host)

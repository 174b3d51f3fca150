"""Resize request pages: the admin queue (/requests/) and the artist's form and list on /me/.

Plain POST forms with CSRF; every write goes through `fleet.requests`, so the pages and the API
apply the same rules, messages and locks.
"""

from __future__ import annotations

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.core.exceptions import PermissionDenied
from django.http import Http404
from django.shortcuts import get_object_or_404, redirect, render
from django.utils import timezone
from django.utils.dateparse import parse_datetime
from django.views.decorators.http import require_POST

from fleet import requests as service
from fleet.choices import ResizeStatus
from fleet.models import Notification, ResizeRequest, VgpuProfile, VirtualMachine
from fleet.queries import is_fleet_admin
from fleet.services import FleetConflict


def _evidence(request: ResizeRequest) -> str:
    """The VM's latest right-sizing suggestion in one line, if the product has one."""
    from sizing.models import Suggestion

    suggestion = Suggestion.objects.filter(vm=request.vm).order_by("-pk").first()
    if suggestion is None:
        return "No usage evidence yet."
    return f"Right-sizing suggests {suggestion.get_action_display()}: {getattr(suggestion, 'reason', '')}".strip()


@login_required
def request_list(request):
    """Pending requests first, with evidence and where each fits now; decided ones below (filter ?status=)."""
    if not is_fleet_admin(request.user):
        raise PermissionDenied
    qs = ResizeRequest.objects.select_related("vm", "requested_profile", "current_profile", "requested_by")
    status = request.GET.get("status", "")
    pending = [(r, service.fits(r), _evidence(r)) for r in qs.filter(status=ResizeStatus.PENDING)]
    decided = qs.exclude(status=ResizeStatus.PENDING)
    if status:
        decided = decided.filter(status=status)
    return render(request, "fleet/request_list.html", {
        "pending": pending, "decided": decided[:200], "status": status, "statuses": ResizeStatus.choices,
    })


@login_required
@require_POST
def request_decide(request, pk: int, verb: str):
    """Approve or reject (admins), cancel (the artist or an admin); back to where the form was."""
    if verb not in ("approve", "reject", "cancel"):
        raise Http404
    obj = get_object_or_404(ResizeRequest.objects.select_related("vm__artist"), pk=pk)
    comment = request.POST.get("comment", "")
    try:
        if verb == "cancel":
            service.cancel(obj, request.user)
        elif not is_fleet_admin(request.user):
            raise PermissionDenied
        elif verb == "approve":
            service.approve(obj, request.user, comment)
        else:
            service.reject(obj, request.user, comment)
        messages.success(request, f"Request #{pk}: {verb} done.")
    except PermissionError as exc:
        raise PermissionDenied(str(exc)) from exc
    except FleetConflict as exc:
        messages.error(request, f"Request #{pk} could not be applied: {exc}")
    return redirect(request.POST.get("next") or "fleet:requests")


@login_required
@require_POST
def request_file(request, vm_pk: int):
    """The /me/ form: a target profile or one more/less vGPU, a reason, an optional window."""
    vm = get_object_or_404(VirtualMachine.objects.select_related("artist"), pk=vm_pk)
    current, count = service._current(vm)
    change = request.POST.get("change", "profile")
    try:
        if change in ("more", "less") and current is not None:
            profile, vgpus = current, count + (1 if change == "more" else -1)
        else:
            profile = get_object_or_404(VgpuProfile, pk=request.POST.get("requested_profile") or 0)
            vgpus = count or 1
        service.file_request(vm, request.user, profile, vgpus, request.POST.get("reason", ""),
                             parse_datetime(request.POST.get("wished_from") or "") or None,
                             parse_datetime(request.POST.get("wished_until") or "") or None)
        messages.success(request, f"Request for {vm.name} filed.")
    except PermissionError as exc:
        raise PermissionDenied(str(exc)) from exc
    except service.RequestError as exc:
        for message in exc.errors.values():
            messages.error(request, message)
    return redirect("fleet:workstation")


@login_required
def notification_list(request):
    """The user's notifications, newest first; opening the page marks them read."""
    items = list(Notification.objects.filter(user=request.user)[:100])
    Notification.objects.filter(user=request.user, read_at__isnull=True).update(read_at=timezone.now())
    return render(request, "fleet/notification_list.html", {"items": items})

"""Resize request pages: the admin queue (/requests/), the artist's form on /me/ and the
notifications page.

Plain POST forms with CSRF; every write goes through `fleet.requests`, so the pages and the API
apply the same rules, messages and locks. Messages show once, in the base template.
"""

from __future__ import annotations

from django import forms
from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.core.exceptions import PermissionDenied, ValidationError
from django.http import Http404
from django.shortcuts import get_object_or_404, redirect, render
from django.utils import timezone
from django.views.decorators.http import require_POST

from config import parsing
from config.roles import is_fleet_admin
from dashboard.forms import DecisionForm, NextForm
from fleet import request_preview
from fleet import requests as service
from fleet.choices import ResizeStatus
from fleet.models import Notification, ResizeRequest, VgpuProfile, VirtualMachine
from fleet.services import FleetConflict
from hypervisors.queries import active_operation_of
from sizing import room

BAD_WINDOW = "Enter the wished window as a date and time, e.g. 2026-12-01 09:00."
NO_PROFILE = "Choose a target profile of the VM's GPU model."
BAD_CHANGE = ("Change: choose a target profile, one vGPU more, one vGPU less or the same vGPUs with other vCPUs or RAM "
              "(not %(value)s).")
BAD_NUMBER = "Enter the %s as a whole number."
DONE = {"approve": "approved and applied", "reject": "rejected", "cancel": "cancelled"}


@login_required
def request_list(request):
    """Pending requests first, each with the VM's right-sizing evidence and where it fits now;
    decided ones below (filter ?status=)."""
    if not is_fleet_admin(request.user):
        raise PermissionDenied
    qs = ResizeRequest.objects.select_related(
        "vm__host", "vm__suggestion__suggested_profile", "requested_profile", "current_profile", "requested_by",
        "decided_by",
    )
    controls = RequestListForm(request.GET)
    refused = not controls.is_valid()
    status = "" if refused else controls.cleaned_data["status"]
    rows = list(qs.filter(status=ResizeStatus.PENDING))
    # One snapshot for the whole queue: no lock and no write on a GET.
    pending = [(r, fit, service.evidence_of(r.vm, r)) for r, fit in zip(rows, service.fits_all(rows), strict=True)]
    decided = qs.exclude(status=ResizeStatus.PENDING)
    if refused:
        messages.error(request, f"Unknown status {request.GET.get('status', '')!r}: showing every decided "
                                "request instead.")
    elif status:
        decided = decided.filter(status=status)
    return render(request, "fleet/request_list.html", {
        "pending": pending, "decided": decided[:200], "status": status, "statuses": ResizeStatus.choices,
    }, status=400 if refused else 200)


class RequestListForm(forms.Form):
    """The queue's filter of decided requests (`?status=`)."""

    status = forms.ChoiceField(choices=[("", "all"), *ResizeStatus.choices], required=False)


class ApproveForm(forms.Form):
    """The confirm step's answer: the admin ticked the confirmation of the changes shown, whose
    fingerprint comes back with it."""

    confirm = forms.BooleanField(error_messages={"required": request_preview.NOT_CONFIRMED})
    fingerprint = forms.CharField(max_length=64, error_messages={"required": request_preview.NOT_CONFIRMED})
    run_now = forms.BooleanField(required=False)


@login_required
def request_review(request, pk: int):
    """The confirm step of an approval: which VM changes, from and to which GPUs and host, that
    it must be shut down; the form posts the confirmation to request_decide."""
    if not is_fleet_admin(request.user):
        raise PermissionDenied
    obj = get_object_or_404(ResizeRequest.objects.select_related("vm__host", "requested_profile", "current_profile"),
                            pk=pk)
    host = obj.vm.host
    return render(request, "fleet/request_review.html", {
        "r": obj, "preview": request_preview.preview(obj), "comment": request.GET.get("comment", "")[:1000],
        "linked": bool(host and host.hypervisor_uri), "host": host,
    })


@login_required
def request_room(request, pk: int):
    """The queue's lazy fragment for a request that fits nowhere as the fleet stands: whether
    it fits if other VMs move (how many, which), with the optimizer run one click away. Not for
    a request that changes the VM's vCPUs or RAM: the optimizer places vGPUs of VMs as they are."""
    if not is_fleet_admin(request.user):
        raise PermissionDenied
    obj = get_object_or_404(ResizeRequest, pk=pk)
    answer = None
    if obj.status == ResizeStatus.PENDING and not obj.changes_size:
        answer = room.room_for(obj.vm_id, obj.requested_profile_id, obj.requested_vgpus)
    return render(request, "fleet/partials/request_room.html", {"r": obj, "room": answer})


def _confirmed(request, obj: ResizeRequest) -> tuple[str, bool]:
    """Why the approval posted is not the one the admin confirmed ("" when it is), and whether
    the admin asked for the change to be carried out now."""
    form = ApproveForm(request.POST)
    if not form.is_valid():
        return request_preview.NOT_CONFIRMED, False
    if form.cleaned_data["fingerprint"] != request_preview.preview(obj).fingerprint:
        return request_preview.FLEET_CHANGED, False
    return "", form.cleaned_data["run_now"]


@login_required
@require_POST
def request_decide(request, pk: int, verb: str):
    """Approve or reject (admins; a rejection needs a comment), cancel (the artist or an admin);
    back to where the form was."""
    if verb not in DONE:
        raise Http404
    obj = get_object_or_404(ResizeRequest.objects.select_related("vm__artist", "requested_profile"), pk=pk)
    try:
        if verb == "cancel":
            service.cancel(obj, request.user)
        elif not is_fleet_admin(request.user):
            raise PermissionDenied
        elif verb == "approve":
            refusal, run_now = _confirmed(request, obj)
            if refusal:
                messages.error(request, f"Request #{pk} was not approved: {refusal}")
                return redirect("fleet:request-review", pk=pk)
            obj = service.approve(obj, request.user, _comment(request), run_now=run_now)
        else:
            service.reject(obj, request.user, _comment(request))
        if obj.status == ResizeStatus.APPLYING:
            operation = active_operation_of(obj.vm_id)
            messages.success(request, f"Request #{pk} for {obj.vm.name} ({service.describe(obj)}) approved: operation "
                                      f"#{operation.pk} carries it out on {operation.target_host.name}.")
            return redirect("hypervisors:operation-detail", pk=operation.pk)
        messages.success(request, f"Request #{pk} for {obj.vm.name} ({service.describe(obj)}) {DONE[verb]}.")
    except PermissionError as exc:
        raise PermissionDenied(str(exc)) from exc
    except service.RequestError as exc:
        for message in exc.errors.values():
            messages.error(request, f"Request #{pk} was not {DONE[verb].split()[0]}: {message}")
    except FleetConflict as exc:
        messages.error(request, f"Request #{pk} could not be {DONE[verb].split()[0]}: {exc}")
    default = "/requests/" if verb != "cancel" or is_fleet_admin(request.user) else "/me/"
    return redirect(NextForm(request.POST).next_url(request, default))


def _comment(request) -> str:
    """The decision's comment, read by DecisionForm; a refused one (a NUL character, which
    PostgreSQL cannot store) is a RequestError naming the field."""
    form = DecisionForm(request.POST)
    if not form.is_valid():
        raise service.RequestError({name: " ".join(errors) for name, errors in form.errors.items()})
    return form.cleaned_data["comment"]


class WishedTimeField(forms.CharField):
    """A datetime-local field's value as an aware datetime (a naive one is in the studio's time
    zone); None when empty."""

    def to_python(self, value):
        value = super().to_python(value)
        if not value.strip():
            return None
        try:
            return parsing.parse_time(value, default_tz=timezone.get_current_timezone())
        except parsing.ParseError as exc:
            raise ValidationError(f"{BAD_WINDOW} ({exc})", code="invalid") from None


class RequestFileForm(forms.Form):
    """The artist's request on /me/: a target profile, one vGPU more or less of the current one,
    or the same vGPUs (`change`), other vCPUs or RAM (empty: unchanged), a reason and an optional
    wished window. `clean` turns the choice into `profile` and `vgpus` for the VM's current
    vGPUs; the numbers' bounds are the service's (`fleet.requests.validate`)."""

    change = forms.ChoiceField(choices=[("profile", "profile"), ("more", "more"), ("less", "less"),
                                        ("size", "size")],
                               required=False, error_messages={"invalid_choice": BAD_CHANGE})
    requested_profile = forms.CharField(required=False, max_length=40)
    requested_vcpus = forms.IntegerField(required=False, error_messages={"invalid": BAD_NUMBER % "vCPUs"})
    requested_ram_gib = forms.IntegerField(required=False, error_messages={"invalid": BAD_NUMBER % "RAM (GiB)"})
    reason = forms.CharField(required=False, strip=False)
    wished_from = WishedTimeField(required=False, strip=False)
    wished_until = WishedTimeField(required=False, strip=False)

    def __init__(self, data, *, current: VgpuProfile | None, count: int):
        super().__init__(data)
        self.current, self.count = current, count

    def clean(self):
        data = super().clean()
        if data.get("change") in ("more", "less") and self.current is not None:
            data["profile"] = self.current
            data["vgpus"] = self.count + (1 if data["change"] == "more" else -1)
            return data
        if data.get("change") == "size" and self.current is not None:
            data["profile"], data["vgpus"] = self.current, self.count
            return data
        try:
            chosen = parsing.parse_int(data.get("requested_profile") or "")
        except parsing.ParseError:
            chosen = None
        data["profile"] = VgpuProfile.objects.filter(pk=chosen).first() if chosen is not None else None
        if data["profile"] is None:
            self.add_error("requested_profile", NO_PROFILE)
        data["vgpus"] = self.count or 1
        return data


@login_required
@require_POST
def request_file(request, vm_pk: int):
    """The /me/ form: a target profile, or one more or one less vGPU of the current profile, other
    vCPUs or RAM, a reason and an optional wished window."""
    vm = get_object_or_404(VirtualMachine.objects.select_related("artist"), pk=vm_pk)
    if not is_fleet_admin(request.user) and getattr(vm.artist, "user_id", None) != request.user.pk:
        raise PermissionDenied("You may only request changes for your own workstation.")
    current, count = service.current_vgpus(vm)
    form = RequestFileForm(request.POST, current=current, count=count)
    try:
        if not form.is_valid():
            raise service.RequestError({name: " ".join(errors) for name, errors in form.errors.items()})
        data = form.cleaned_data
        filed = service.file_request(vm, request.user, data["profile"], data["vgpus"], data["reason"],
                                     data["wished_from"], data["wished_until"], requested_vcpus=data["requested_vcpus"],
                                     requested_ram_gib=data["requested_ram_gib"])
        messages.success(request, f"Request for {vm.name} ({service.describe(filed)}) filed; "
                                  "you will be notified of the decision.")
    except PermissionError as exc:
        raise PermissionDenied(str(exc)) from exc
    except service.RequestError as exc:
        for message in exc.errors.values():
            messages.error(request, message)
    return redirect("fleet:workstation")


@login_required
def notification_list(request):
    """The user's notifications, newest first. Opening the page marks them read (what a bell
    menu does); the ones that were unread stay highlighted on this visit."""
    items = list(Notification.objects.filter(user=request.user)[:100])
    service.mark_read(request.user)
    return render(request, "fleet/notification_list.html", {"items": items})

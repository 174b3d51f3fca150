"""Resize requests: filing, deciding and applying them (the service layer of issue 6, part 1).

Approval applies through `fleet.services` (which re-checks every placement rule under row
locks) inside one transaction that first locks the request row, so two approvals of the same
request, or of two requests competing for the last slot, never both succeed: the loser raises
`FleetConflict` (HTTP 409) and its request stays pending with the reason in `last_error`.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from django.conf import settings
from django.contrib.auth import get_user_model
from django.core.mail import send_mail
from django.db import transaction
from django.utils import timezone

from fleet import audit, placement, services
from fleet.choices import ResizeStatus
from fleet.models import Gpu, Notification, ResizeRequest, Vgpu, VgpuProfile, VirtualMachine
from fleet.placement import PlacementError, Violation
from fleet.queries import is_fleet_admin

log = logging.getLogger(__name__)


class RequestError(ValueError):
    """Bad input for a request, as {field: message}; the API answers 400."""

    def __init__(self, errors: dict[str, str]):
        super().__init__("; ".join(errors.values()))
        self.errors = errors


@dataclass(frozen=True)
class Fit:
    """Where a request fits now: "same_gpu", "other_gpu", "other_host" or "nowhere", and on what."""

    where: str
    gpus: tuple[str, ...] = ()
    host: str = ""
    reason: str = ""

    @property
    def label(self) -> str:
        return self.where.replace("_", " ")


def _current(vm: VirtualMachine) -> tuple[VgpuProfile | None, int]:
    vgpus = list(Vgpu.objects.filter(vm=vm).select_related("profile"))
    return (vgpus[0].profile if vgpus else None), len(vgpus)


def validate(vm: VirtualMachine, user, profile: VgpuProfile, vgpus: int, wished_from=None, wished_until=None) -> None:
    """Raise RequestError when the request may not be filed (the messages the form and the API show)."""
    errors: dict[str, str] = {}
    if not is_fleet_admin(user) and getattr(getattr(vm, "artist", None), "user_id", None) != user.pk:
        raise PermissionError("You may only request changes for your own workstation.")
    current, count = _current(vm)
    if current is not None and profile.gpu_model_id != current.gpu_model_id:
        errors["requested_profile"] = (f"{profile.name} is not a profile of {current.gpu_model.name}, "
                                       "the GPU model this VM runs on.")
    elif current is not None and profile.series != current.series and count > 1:
        errors["requested_profile"] = "A VM with several vGPUs keeps its profile series."
    if not 1 <= vgpus <= placement.MAX_VGPUS_PER_VM:
        errors["requested_vgpus"] = f"A VM holds 1 to {placement.MAX_VGPUS_PER_VM} vGPUs."
    elif vgpus > 1 and vgpus > profile.max_per_vm:
        errors["requested_vgpus"] = f"{profile.name} allows at most {profile.max_per_vm} vGPU(s) per VM."
    if current is not None and profile.pk == current.pk and vgpus == count:
        errors["requested_profile"] = "The VM already has this profile and number of vGPUs."
    if wished_from and wished_until and wished_until <= wished_from:
        errors["wished_until"] = "The wished window must end after it starts."
    if ResizeRequest.objects.filter(vm=vm, status=ResizeStatus.PENDING).exists():
        errors["vm"] = "This VM already has a pending request; cancel it or wait for the decision."
    if errors:
        raise RequestError(errors)


def file_request(vm: VirtualMachine, user, requested_profile: VgpuProfile, requested_vgpus: int = 1,
                 reason: str = "", wished_from=None, wished_until=None) -> ResizeRequest:
    """File a pending request for `vm` and tell the admins."""
    with transaction.atomic():
        vm = services._locked(VirtualMachine, vm.pk, "artist")
        validate(vm, user, requested_profile, requested_vgpus, wished_from, wished_until)
        current, count = _current(vm)
        request = ResizeRequest.objects.create(
            vm=vm, current_profile=current, current_vgpus=count, requested_profile=requested_profile,
            requested_vgpus=requested_vgpus, reason=reason, requested_by=user,
            wished_from=wished_from, wished_until=wished_until,
        )
        audit.record("resize_request.file", request, after=audit.snapshot(request))
        admins = get_user_model().objects.filter(is_staff=True, is_active=True).exclude(email="")
        _notify(list(admins), f"Resize request for {vm.name}: {describe(request)}", "/requests/")
    return request


def describe(request: ResizeRequest) -> str:
    return f"{request.requested_vgpus} x {request.requested_profile.name}"


def _gpu_order(request: ResizeRequest) -> list[list[Gpu]]:
    """Candidate GPU lists, best first: the VM's own GPUs (then the rest of its host), then each other host."""
    own = list(Gpu.objects.filter(vgpus__vm=request.vm).distinct().order_by("pk"))
    model = request.requested_profile.gpu_model_id
    host_id = own[0].host_id if own else request.vm.host_id
    groups = []
    if host_id:
        rest = list(Gpu.objects.filter(host_id=host_id, gpu_model_id=model).exclude(pk__in=[g.pk for g in own])
                    .order_by("pk"))
        groups.append([g for g in own if g.gpu_model_id == model] + rest)
    others = Gpu.objects.filter(gpu_model_id=model).exclude(host_id=host_id).select_related("host").order_by(
        "host_id", "pk")
    by_host: dict[int, list[Gpu]] = {}
    for gpu in others:
        by_host.setdefault(gpu.host_id, []).append(gpu)
    groups.extend(by_host.values())
    return groups


def _place_all(request: ResizeRequest) -> list[Vgpu]:
    """Remove the VM's vGPUs and place the requested ones on the first host whose GPUs take them all."""
    for vgpu in Vgpu.objects.filter(vm=request.vm):
        before = audit.snapshot(vgpu)
        services.remove_vgpu(vgpu)
        audit.record("vgpu.remove", None, before=before, object_type="vgpu", object_id=vgpu.pk,
                     object_repr=str(vgpu), comment=f"resize request #{request.pk}")
    vm = VirtualMachine.objects.get(pk=request.vm_id)
    for gpus in _gpu_order(request):
        placed: list[Vgpu] = []
        try:
            with transaction.atomic():
                for _ in range(request.requested_vgpus):
                    for gpu in gpus:
                        try:
                            placed.append(services.place_vgpu(vm, gpu, request.requested_profile))
                            break
                        except PlacementError:
                            continue
                    else:
                        raise PlacementError([Violation(placement.Rule.PLACEMENT_SLOT, "no room")])
        except PlacementError:
            continue
        for vgpu in placed:
            audit.record("vgpu.place", vgpu, after=audit.snapshot(vgpu), comment=f"resize request #{request.pk}")
        return placed
    raise services.FleetConflict([Violation(
        placement.Rule.PLACEMENT_SLOT,
        f"No GPU has room for {describe(request)} for {vm.name} now; free capacity or reject the request.",
    )])


def approve(request: ResizeRequest, admin, comment: str = "") -> ResizeRequest:
    """Apply `request` in one transaction, or raise FleetConflict leaving it pending with `last_error`."""
    try:
        with transaction.atomic():
            locked = ResizeRequest.objects.select_for_update().select_related(
                "vm", "requested_profile").get(pk=request.pk)
            if locked.status != ResizeStatus.PENDING:
                raise services.FleetConflict([Violation(
                    placement.Rule.PLACEMENT_SLOT, f"The request is {locked.status} already.")])
            before = audit.snapshot(locked)
            _place_all(locked)
            locked.status, locked.decided_by, locked.decided_at = ResizeStatus.APPROVED, admin, timezone.now()
            locked.decision_comment, locked.last_error = comment, ""
            locked.save()
            audit.record("resize_request.approve", locked, before=before, after=audit.snapshot(locked),
                         comment=comment)
            _notify_artist(locked, f"Your request for {locked.vm.name} ({describe(locked)}) was approved and applied.")
            return locked
    except services.FleetConflict as exc:
        ResizeRequest.objects.filter(pk=request.pk, status=ResizeStatus.PENDING).update(
            last_error=str(exc), updated_at=timezone.now())
        raise


def _decide(request: ResizeRequest, user, status: str, verb: str, comment: str) -> ResizeRequest:
    with transaction.atomic():
        locked = ResizeRequest.objects.select_for_update().select_related("vm", "requested_profile").get(pk=request.pk)
        if locked.status != ResizeStatus.PENDING:
            raise services.FleetConflict([Violation(
                placement.Rule.PLACEMENT_SLOT, f"The request is {locked.status} already.")])
        before = audit.snapshot(locked)
        locked.status, locked.decided_by, locked.decided_at = status, user, timezone.now()
        locked.decision_comment = comment
        locked.save()
        audit.record(f"resize_request.{verb}", locked, before=before, after=audit.snapshot(locked), comment=comment)
        if verb == "reject":
            _notify_artist(locked, f"Your request for {locked.vm.name} ({describe(locked)}) was rejected: {comment}")
        return locked


def reject(request: ResizeRequest, admin, comment: str = "") -> ResizeRequest:
    return _decide(request, admin, ResizeStatus.REJECTED, "reject", comment)


def cancel(request: ResizeRequest, user) -> ResizeRequest:
    """The artist (or an admin) withdraws a pending request."""
    if not is_fleet_admin(user) and request.requested_by_id != user.pk and \
            getattr(getattr(request.vm, "artist", None), "user_id", None) != user.pk:
        raise PermissionError("Only the requesting artist or an admin may cancel this request.")
    return _decide(request, user, ResizeStatus.CANCELLED, "cancel", "")


def _notify_artist(request: ResizeRequest, message: str) -> None:
    user = getattr(getattr(request.vm, "artist", None), "user", None)
    if user is not None:
        _notify([user], message, "/me/")


def _notify(users, message: str, url: str) -> None:
    """An in-app Notification now, and an e-mail once the transaction commits (a failure is logged only)."""
    for user in users:
        Notification.objects.create(user=user, message=message[:500], url=url)
    recipients = [u.email for u in users if u.email]
    if not recipients:
        return

    def send():
        try:
            send_mail("vGPU fleet: " + message[:80], message, settings.DEFAULT_FROM_EMAIL, recipients)
        except Exception:  # noqa: BLE001 - mail must never lose the decision
            log.exception("could not send mail to %s", recipients)

    transaction.on_commit(send)


def fits(request: ResizeRequest) -> Fit:
    """Where the request would go now, without writing: approval applies the same order under locks."""
    if request.status != ResizeStatus.PENDING:
        return Fit("n/a")
    try:
        old_gpus = {g.label for g in Gpu.objects.filter(vgpus__vm=request.vm)}
        with transaction.atomic():
            placed = _place_all(ResizeRequest.objects.select_related("vm", "requested_profile").get(pk=request.pk))
            gpus = tuple(sorted({v.gpu.label for v in placed}))
            host = placed[0].gpu.host.name
            raise _Rollback(gpus, host, old_gpus)
    except _Rollback as result:
        old = result.old
        where = "same_gpu" if set(result.gpus) <= old else (
            "other_gpu" if request.vm.host and request.vm.host.name == result.host else "other_host")
        return Fit(where, result.gpus, result.host)
    except PlacementError as exc:
        return Fit("nowhere", reason=str(exc))


class _Rollback(Exception):
    def __init__(self, gpus, host, old):
        super().__init__("dry run")
        self.gpus, self.host, self.old = gpus, host, old

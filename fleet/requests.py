"""Resize requests: filing, deciding and applying them, and the notifications they send.

Approval applies through `fleet.services` (which re-checks every placement rule under row
locks) inside one transaction that first locks, in the order of `fleet.locks`, every host,
GPU and VM it may write and then the request row, so two approvals of the same request, or
of two requests competing for the last slot, never both succeed, and an approval never
deadlocks with a VM edit or an optimizer plan touching the same rows: the loser raises
`FleetConflict` (HTTP 409) naming what changed, and its request stays pending with the
reason in `last_error`.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, field

from django.conf import settings
from django.contrib.auth import get_user_model
from django.core.mail import send_mail
from django.db import connections, router, transaction
from django.db.models import Count, IntegerField, OuterRef, Subquery, Value
from django.db.models.functions import Coalesce
from django.utils import timezone

from config.roles import is_fleet_admin
from fleet import audit, fit, locks, placement, services, signals
from fleet.choices import ResizeStatus
from fleet.models import Gpu, Notification, ResizeRequest, Vgpu, VgpuProfile, VirtualMachine
from fleet.placement import PlacementError, Violation
from fleet.queries import fleet_snapshot
from fleet.snapshot import FleetSnapshot

log = logging.getLogger(__name__)


class RequestError(ValueError):
    """Bad input for a request, as {field: message}; the API answers 400."""

    def __init__(self, errors: dict[str, str]):
        super().__init__("; ".join(errors.values()))
        self.errors = errors


@dataclass(frozen=True)
class Fit:
    """Where a request fits now: "same_gpu", "other_gpu", "other_host" or "nowhere" ("n/a" once
    decided), on which GPUs of which host, and in words: `detail` (what approval would do) and,
    for "nowhere", `reason` (why each of the best candidate hosts refuses)."""

    where: str
    gpus: tuple[str, ...] = ()
    host: str = ""
    reason: str = ""
    detail: str = ""

    @property
    def label(self) -> str:
        return self.where.replace("_", " ")

    @property
    def hint(self) -> str:
        """What the artist's form says of a choice: whether it fits now and whether it moves the VM."""
        return HINTS.get(self.where, "")


HINTS = {"same_gpu": "fits on its GPU now", "other_gpu": "fits now, on another GPU of its host",
         "other_host": "fits now, on another host", "nowhere": "no room now"}


def current_vgpus(vm: VirtualMachine) -> tuple[VgpuProfile | None, int]:
    """The profile of the VM's vGPUs (None without any) and how many it holds."""
    vgpus = list(Vgpu.objects.filter(vm=vm).select_related("profile"))
    return (vgpus[0].profile if vgpus else None), len(vgpus)


def several_vgpus_refusal(profile: VgpuProfile, model, vgpus: int) -> str:
    """Why `vgpus` vGPUs of `profile` may not share one VM on GPU `model` ("" when they may).

    The placement rule (`Rule.MULTI_VGPU_FULL_ONLY`) would refuse it at approval anyway; saying
    so when the request is filed spares the artist a request no admin can approve.
    """
    if vgpus > 1 and model.multi_vgpu_full_only and profile.fb_mib < model.fb_mib:
        return (f"On {model.name} a VM with several vGPUs may only use full-GPU profiles "
                f"({_gib(model.fb_mib)} GiB); {profile.name} is smaller.")
    return ""


REASON_REQUIRED = "Say why the VM needs the change (the scenes, the deadline): the admin decides on it."
NOTHING_CHANGES = ("The VM already has this profile and number of vGPUs; ask for another profile, another number "
                   "of vGPUs, or other vCPUs or RAM.")
BAD_VCPUS = f"A VM has 1 to {placement.MAX_VCPUS_PER_VM} vCPUs."
BAD_RAM = f"A VM has 1 to {placement.MAX_RAM_GIB_PER_VM} GiB of RAM."
COMMENT_REQUIRED = "Give a reason for the rejection: the artist reads it in the notification."


def validate(vm: VirtualMachine, user, profile: VgpuProfile, vgpus: int, wished_from=None, wished_until=None,
             reason: str = "", vcpus: int | None = None, ram_gib: int | None = None) -> None:
    """Raise RequestError when the request may not be filed (the messages the form and the API show).

    `vcpus` and `ram_gib` None keep the VM's; whether the host can give more is approval's
    question (as whether a GPU has room is), asked of the fleet as it is then."""
    errors: dict[str, str] = {}
    if not is_fleet_admin(user) and getattr(getattr(vm, "artist", None), "user_id", None) != user.pk:
        raise PermissionError("You may only request changes for your own workstation.")
    current, count = current_vgpus(vm)
    if current is not None and profile.gpu_model_id != current.gpu_model_id:
        errors["requested_profile"] = (f"{profile.name} is not a profile of {current.gpu_model.name}, "
                                       "the GPU model this VM runs on.")
    elif current is not None and profile.series != current.series and count > 1:
        errors["requested_profile"] = "A VM with several vGPUs keeps its profile series."
    if not 1 <= vgpus <= placement.MAX_VGPUS_PER_VM:
        errors["requested_vgpus"] = f"A VM holds 1 to {placement.MAX_VGPUS_PER_VM} vGPUs."
    elif vgpus > 1 and vgpus > profile.max_per_vm:
        errors["requested_vgpus"] = f"{profile.name} allows at most {profile.max_per_vm} vGPU(s) per VM."
    elif refusal := several_vgpus_refusal(profile, profile.gpu_model, vgpus):
        errors["requested_vgpus"] = refusal
    if vcpus is not None and not 1 <= vcpus <= placement.MAX_VCPUS_PER_VM:
        errors["requested_vcpus"] = BAD_VCPUS
    if ram_gib is not None and not 1 <= ram_gib <= placement.MAX_RAM_GIB_PER_VM:
        errors["requested_ram_gib"] = BAD_RAM
    same_size = vcpus in (None, vm.vcpus) and ram_gib in (None, vm.ram_gib)
    if current is not None and profile.pk == current.pk and vgpus == count and same_size:
        errors["requested_profile"] = NOTHING_CHANGES
        if vcpus is not None:
            errors["requested_vcpus"] = f"{vm.name} has {vcpus} vCPUs already."
        if ram_gib is not None:
            errors["requested_ram_gib"] = f"{vm.name} has {ram_gib} GiB of RAM already."
    if wished_from and wished_until and wished_until <= wished_from:
        errors["wished_until"] = "The wished window must end after it starts."
    if not reason.strip():
        errors["reason"] = REASON_REQUIRED
    pending = ResizeRequest.objects.filter(vm=vm, status=ResizeStatus.PENDING).order_by("created_at", "pk").first()
    if pending is not None:
        errors["vm"] = (f"This VM already has a pending request (#{pending.pk}); cancel it or wait for the "
                        "decision.")
    if errors:
        raise RequestError(errors)


def file_request(vm: VirtualMachine, user, requested_profile: VgpuProfile | None, requested_vgpus: int | None = 1,
                 reason: str = "", wished_from=None, wished_until=None, *, requested_vcpus: int | None = None,
                 requested_ram_gib: int | None = None, comment: str = "") -> ResizeRequest:
    """File a pending request for `vm` and tell the admins: the one way a request is filed (the
    artist's form, the API, an admin accepting a right-sizing suggestion). `comment` goes on the
    audit event (e.g. which suggestion it came from).

    `requested_profile` None keeps the VM's profile, `requested_vgpus` None its number of vGPUs
    (a change of vCPUs or RAM alone); `requested_vcpus` or `requested_ram_gib` equal to what
    the VM has are recorded as unchanged."""
    with transaction.atomic():
        vm = locks.lock_for_change(vms=[vm]).vms[vm.pk]
        current, count = current_vgpus(vm)
        if requested_profile is None and current is None:
            raise RequestError({"requested_profile": f"Choose a target profile: {vm.name} holds no vGPU."})
        requested_profile = requested_profile or current
        requested_vgpus = count if requested_vgpus is None else requested_vgpus
        validate(vm, user, requested_profile, requested_vgpus, wished_from, wished_until, reason,
                 requested_vcpus, requested_ram_gib)
        request = ResizeRequest.objects.create(
            vm=vm, current_profile=current, current_vgpus=count, requested_profile=requested_profile,
            requested_vgpus=requested_vgpus, reason=reason.strip(), requested_by=user,
            wished_from=wished_from, wished_until=wished_until, current_vcpus=vm.vcpus, current_ram_gib=vm.ram_gib,
            requested_vcpus=None if requested_vcpus == vm.vcpus else requested_vcpus,
            requested_ram_gib=None if requested_ram_gib == vm.ram_gib else requested_ram_gib,
        )
        audit.record("resize_request.file", request, after=audit.snapshot(request), comment=comment)
        # Every admin sees it in the app; those with an address also get the e-mail (`_notify`).
        admins = get_user_model().objects.filter(is_staff=True, is_active=True).order_by("pk")
        _notify(list(admins), f"Resize request for {vm.name}: {describe(request)}", "/requests/")
    return request


def describe(request: ResizeRequest) -> str:
    """What the request asks, e.g. "1 x RTX6000-24Q", "8 -> 4 vCPUs, 32 -> 16 GiB" or both."""
    vgpus = f"{request.requested_vgpus} x {request.requested_profile.name}"
    if not request.changes_size:
        return vgpus
    return f"{vgpus}, {request.size_change}" if request.changes_vgpus else request.size_change


def keeps_vgpus(request: ResizeRequest, profile_ids: list[int]) -> bool:
    """Whether `request` leaves alone a VM whose vGPUs have profiles `profile_ids` (a change of
    vCPUs or RAM alone): approval then keeps them where they are rather than placing them again."""
    return (bool(profile_ids) and len(profile_ids) == request.requested_vgpus
            and all(profile_id == request.requested_profile_id for profile_id in profile_ids))


def size_of(request: ResizeRequest, vm) -> tuple[int, int]:
    """The vCPUs and RAM (GiB) the VM `vm` (a VirtualMachine or a VmState) has once `request` applies."""
    return (vm.vcpus if request.requested_vcpus is None else request.requested_vcpus,
            vm.ram_gib if request.requested_ram_gib is None else request.requested_ram_gib)


def _impact(snapshot: FleetSnapshot, request: ResizeRequest) -> fit.Impact:
    """The one answer to where `request` goes (`fleet.fit`), asked by the queue, the API and approval;
    a VM whose vCPUs or RAM change is judged at its new size."""
    profile = snapshot.profiles[request.requested_profile_id]
    snapshot = fit.resized(snapshot, request.vm_id, *size_of(request, snapshot.vms[request.vm_id]))
    return fit.ImpactCalculator(snapshot).impact(request.vm_id, profile, request.requested_vgpus)


@dataclass(frozen=True)
class Plan:
    """What approving a request does on the fleet of a snapshot: `impact` (None when the VM keeps
    its vGPUs), the host it ends on, and `violations`, why it cannot be applied (empty when it can)."""

    impact: fit.Impact | None
    host_id: int | None
    violations: tuple[Violation, ...] = ()


def plan(snapshot: FleetSnapshot, request: ResizeRequest) -> Plan:
    """Where `request` goes and whether its host can give the VM's new vCPUs and RAM: the one
    answer the queue shows and approval follows."""
    vm = snapshot.vms[request.vm_id]
    impact, host_id = None, vm.host_id
    if not keeps_vgpus(request, [v.profile.id for v in vm.vgpus]):
        impact = _impact(snapshot, request)
        if impact.fits == fit.NOWHERE:
            return Plan(impact, None, (Violation(placement.Rule.PLACEMENT_SLOT, _no_room(request, impact)),))
        host_id = impact.host_id
    if request.changes_size and host_id is not None:
        refused = fit.size_refusals(snapshot, request.vm_id, host_id, *size_of(request, vm))
        if refused:
            return Plan(impact, host_id, tuple(refused))
    return Plan(impact, host_id)


def _no_room(request: ResizeRequest, impact: fit.Impact) -> str:
    """Why `request` fits nowhere now, in the words the queue shows and a failed approval keeps."""
    return " ".join([f"No GPU has room for {describe(request)} for {request.vm.name} now.", *impact.refusals,
                     "Free capacity or reject the request."])


def _place_all(request: ResizeRequest) -> tuple[list[Vgpu], bool]:
    """Give the VM its new vCPUs and RAM, then remove its vGPUs and place the requested ones where
    `fleet.fit` says (or keep them, when only its size changes), on a snapshot read under
    `_lock_for_approval`'s locks (so it is the fleet the writes meet); FleetConflict when it fits
    nowhere or its host cannot give the size. Returns the VM's vGPUs and whether they were kept.

    The size is written first so that `fleet.services` checks each vGPU it places against the
    host with the VM at its new size. Call it with those locks held: it locks nothing they do not cover.
    """
    planned = plan(fleet_snapshot(), request)
    if planned.violations:
        raise services.FleetConflict(list(planned.violations))
    if request.changes_size:
        set_size(request.vm_id, *size_of(request, VirtualMachine.objects.get(pk=request.vm_id)))
    if planned.impact is None:
        return list(Vgpu.objects.filter(vm_id=request.vm_id).select_related("gpu", "profile").order_by("pk")), True
    return _replace_vgpus(request.vm_id,
                          [(gpu_id, request.requested_profile_id, "") for gpu_id in planned.impact.gpu_ids]), False


def set_size(vm_id: int, vcpus: int, ram_gib: int) -> None:
    """Write the VM's vCPUs and RAM with a "vm.update" event of both, before and after. Unchecked:
    approval checked them against the host (`plan`), and a rollback puts back what the hypervisor
    holds again. Call it with the VM's row locked."""
    vm = VirtualMachine.objects.get(pk=vm_id)
    if (vm.vcpus, vm.ram_gib) == (vcpus, ram_gib):
        return
    before = audit.snapshot(vm)
    vm.vcpus, vm.ram_gib = vcpus, ram_gib
    vm.save(update_fields=["vcpus", "ram_gib"])
    audit.record("vm.update", vm, before=before, after=audit.snapshot(vm), object_type="vm")


def _replace_vgpus(vm_id: int, placements: list[tuple[int, int, str]]) -> list[Vgpu]:
    """Remove the VM's vGPUs, then place one vGPU per (GPU id, profile id, device id) in order;
    a placement refused is a FleetConflict naming why.

    services.remove_vgpus / place_vgpu record vgpu.remove / vgpu.place themselves, and check every
    rule again: a disagreement with what the caller decided is refused, never written."""
    services.remove_vgpus(Vgpu.objects.filter(vm_id=vm_id).order_by("pk"))
    vm = VirtualMachine.objects.get(pk=vm_id)
    gpus = Gpu.objects.select_related("host", "gpu_model").in_bulk([gpu_id for gpu_id, _, _ in placements])
    profiles = VgpuProfile.objects.select_related("gpu_model").in_bulk([profile for _, profile, _ in placements])
    placed = []
    try:
        for gpu_id, profile_id, device_id in placements:
            vgpu = services.place_vgpu(vm, gpus[gpu_id], profiles[profile_id])
            if device_id:
                Vgpu.objects.filter(pk=vgpu.pk).update(device_id=device_id)
            placed.append(vgpu)
            vm = vgpu.vm
    except services.FleetConflict:
        raise
    except PlacementError as exc:
        raise services.FleetConflict(exc.violations) from exc
    return placed


def _touched(request: ResizeRequest) -> dict[str, set]:
    """The hosts, GPUs and VM that applying `request` may write, as `lock_for_change` takes them:
    the VM, the GPUs its vGPUs are on and their hosts, and every GPU of the requested model
    (each a candidate of `fleet.fit`) with its host. Ids, but the VM itself: a conflict names it."""
    vm = VirtualMachine.objects.filter(pk=request.vm_id).only("name", "host_id").first()
    held = Vgpu.objects.filter(vm_id=request.vm_id).values_list("gpu_id", "gpu__host_id")
    candidates = Gpu.objects.filter(gpu_model_id=request.requested_profile.gpu_model_id).values_list("pk", "host_id")
    pairs = [*held, *candidates]
    return {"hosts": {host for _, host in pairs} | ({vm.host_id} - {None} if vm else set()),
            "gpus": {gpu for gpu, _ in pairs}, "vms": {vm or request.vm_id}}


def _pending(request: ResizeRequest) -> ResizeRequest:
    """`request` (locked), or FleetConflict when it was decided already, saying by whom and why."""
    if request.status != ResizeStatus.PENDING:
        by = f" by {request.decided_by}" if request.decided_by else ""
        comment = f": {request.decision_comment}" if request.decision_comment else ""
        raise locks.conflict(f"The request is {request.status} already{by}{comment}.", placement.Rule.PLACEMENT_SLOT)
    return request


def _lock_for_approval(request: ResizeRequest, touched: dict[str, set]) -> ResizeRequest:
    """Lock what applying `request` writes (`touched`, read before the transaction, then the VM's
    vGPUs as they are once the VM is held), then the request, and return the request as it is now.

    FleetConflict, naming what changed, when the request was decided meanwhile, or when the
    fleet changed so that applying it would write rows that are not locked (the VM's vGPUs
    moved to other GPUs, a GPU of the requested model was added): another attempt reads the
    fleet again.
    """
    locked = _pending(locks.lock_for_change(**touched, vgpus=Vgpu.objects.filter(vm_id=request.vm_id),
                                            requests=[request]).requests[request.pk])
    now = _touched(locked)
    if any(not now[group] <= touched[group] for group in now):
        raise locks.conflict(f"The vGPUs of {locked.vm.name} or the GPUs of {locked.requested_profile.gpu_model.name} "
                             "changed while the approval waited for them; try again.")
    return locked


def approve(request: ResizeRequest, admin, comment: str = "", *, run_now: bool = False) -> ResizeRequest:
    """Apply `request` in one transaction, or raise FleetConflict leaving it pending with `last_error`.

    On a host linked to its hypervisor, a receiver of `signals.change_approved` takes the change
    on as an operation: the request is then APPLYING until the operation ends (`mark_applied` or
    `revert_approval`); otherwise it is APPROVED, and the inventory change is all there is.
    `run_now` asks the operation to start at once rather than in the request's wished window
    (or when an admin runs it)."""
    try:
        touched = _touched(request)
        with transaction.atomic():
            locked = _lock_for_approval(request, touched)
            before = audit.snapshot(locked)
            held = vgpu_rows(locked.vm_id)
            size_before = VirtualMachine.objects.filter(pk=locked.vm_id).values("vcpus", "ram_gib").get()
            with audit.because(f"resize request #{locked.pk}"):
                placed, kept = _place_all(locked)
            carried = [answer for _, answer in signals.change_approved.send(
                sender=ResizeRequest, request=locked, before=held, placed=placed, actor=admin, run_now=run_now,
                size_before=size_before, vgpus_kept=kept)
                if answer]
            locked.status = ResizeStatus.APPLYING if carried else ResizeStatus.APPROVED
            locked.decided_by, locked.decided_at = admin, timezone.now()
            locked.decision_comment, locked.last_error = comment, ""
            locked.save()
            audit.record("resize_request.approve", locked, before=before, after=audit.snapshot(locked),
                         comment=comment)
            if carried:
                _notify_artist(locked, f"Your request for {locked.vm.name} ({describe(locked)}) was approved: "
                                       f"{carried[0]}")
            else:
                _notify_artist(locked, f"Your request for {locked.vm.name} ({describe(locked)}) was approved and "
                                       "applied.")
            return locked
    except services.FleetConflict as exc:
        ResizeRequest.objects.filter(pk=request.pk, status=ResizeStatus.PENDING).update(
            last_error=str(exc), updated_at=timezone.now())
        raise


#: What `vgpu_rows` keeps of a vGPU.
VGPU_ROW = ("gpu_id", "profile_id", "placement_id", "device_id")


def vgpu_rows(vm_id: int) -> list[dict]:
    """The VM's vGPUs as plain values (what an operation keeps to put them back)."""
    return list(Vgpu.objects.filter(vm_id=vm_id).order_by("pk").values(*VGPU_ROW))


def mark_applied(request: ResizeRequest, note: str = "") -> ResizeRequest:
    """The operation carrying out `request` succeeded: APPLYING becomes APPROVED, and the artist
    is told (`note`, for the audit log, says how it was verified). A request in any other state
    is left as it is."""
    with transaction.atomic():
        locked = locks.lock_for_change(requests=[request]).requests[request.pk]
        if locked.status != ResizeStatus.APPLYING:
            return locked
        before = audit.snapshot(locked)
        locked.status, locked.last_error = ResizeStatus.APPROVED, ""
        locked.save(update_fields=["status", "last_error", "updated_at"])
        audit.record("resize_request.applied", locked, before=before, after=audit.snapshot(locked), comment=note)
        _notify_artist(locked, f"{locked.vm.name} now has {describe(locked)}: the change is applied.")
        return locked


def revert_approval(request: ResizeRequest, before: list[dict], reason: str,
                    size: tuple[int, int] | None = None) -> ResizeRequest:
    """The operation carrying out `request` failed and undid its work on the hypervisor: put the
    VM's vCPUs and RAM back to `size` (when given and the request changed them) and its vGPUs as
    `before` lists them (through placement, as any change; left alone when they are as `before`
    lists them, as after a change of size alone), mark the request FAILED
    with `reason`, and tell the artist. FleetConflict when the old vGPUs no longer fit (the
    reason then says so, and the inventory keeps the approved state for the admin to fix)."""
    with transaction.atomic():
        locked = locks.lock_for_change(requests=[request]).requests[request.pk]
        if locked.status != ResizeStatus.APPLYING:
            return locked
        with audit.because(f"resize request #{locked.pk} failed to apply"):
            # The size first: the hypervisor holds the old definition again, and the old vGPUs
            # are checked against their host with the VM at the size it has there.
            if size is not None and locked.changes_size:
                set_size(locked.vm_id, *size)
            if vgpu_rows(locked.vm_id) != [{key: row.get(key) for key in VGPU_ROW} for row in before]:
                restore_vgpus(locked.vm, before)
        previous = audit.snapshot(locked)
        locked.status, locked.last_error = ResizeStatus.FAILED, reason[:2000]
        locked.save(update_fields=["status", "last_error", "updated_at"])
        audit.record("resize_request.failed", locked, before=previous, after=audit.snapshot(locked), comment=reason)
        _notify_artist(locked, f"Your request for {locked.vm.name} ({describe(locked)}) could not be applied and "
                               f"was rolled back: {reason}")
        return locked


def restore_vgpus(vm: VirtualMachine, rows: list[dict]) -> list[Vgpu]:
    """Replace the VM's vGPUs with `rows` (from `vgpu_rows`), each checked by placement again."""
    return _replace_vgpus(vm.pk, [(row["gpu_id"], row["profile_id"], row.get("device_id") or "") for row in rows])


def _decide(request: ResizeRequest, user, status: str, verb: str, comment: str) -> ResizeRequest:
    with transaction.atomic():
        locked = _pending(locks.lock_for_change(requests=[request]).requests[request.pk])
        before = audit.snapshot(locked)
        locked.status, locked.decided_by, locked.decided_at = status, user, timezone.now()
        locked.decision_comment = comment
        locked.save()
        audit.record(f"resize_request.{verb}", locked, before=before, after=audit.snapshot(locked), comment=comment)
        if verb == "reject":
            _notify_artist(locked, f"Your request for {locked.vm.name} ({describe(locked)}) was rejected: {comment}")
        return locked


def reject(request: ResizeRequest, admin, comment: str = "") -> ResizeRequest:
    """Reject a pending request; the comment is required, since it is all the artist learns of why."""
    if not comment.strip():
        raise RequestError({"comment": COMMENT_REQUIRED})
    return _decide(request, admin, ResizeStatus.REJECTED, "reject", comment.strip())


def cancel(request: ResizeRequest, user) -> ResizeRequest:
    """The artist (or an admin) withdraws a pending request."""
    if not is_fleet_admin(user) and request.requested_by_id != user.pk and \
            getattr(getattr(request.vm, "artist", None), "user_id", None) != user.pk:
        raise PermissionError("Only the requesting artist or an admin may cancel this request.")
    return _decide(request, user, ResizeStatus.CANCELLED, "cancel", "")


def _notify_artist(request: ResizeRequest, message: str) -> None:
    notify_artist(request.vm, message)


def notify_artist(vm: VirtualMachine, message: str, url: str = "/me/") -> None:
    """Tell the VM's artist (in the app, and by mail once the transaction commits), pointing to
    `url`; nobody to tell for a VM without one."""
    user = getattr(getattr(vm, "artist", None), "user", None)
    if user is not None:
        _notify([user], message, url)


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


def fit_of(request: ResizeRequest, snapshot: FleetSnapshot) -> Fit:
    """Where `request` would go on the fleet of `snapshot`: the answer approval follows
    (`_place_all`), without a lock or a write."""
    if request.status != ResizeStatus.PENDING:
        return Fit("n/a")
    if request.vm_id not in snapshot.vms or request.requested_profile_id not in snapshot.profiles:
        return Fit("nowhere", reason="The VM or the profile was deleted meanwhile.")
    planned = plan(snapshot, request)
    if planned.violations:
        return Fit("nowhere", reason=" ".join(str(v).rstrip(".") + "." for v in planned.violations),
                   detail=planned.impact.detail if planned.impact else "")
    if planned.impact is None:
        vm = snapshot.vms[request.vm_id]
        labels = tuple(sorted({snapshot.gpus[v.gpu_id].label for v in vm.vgpus}))
        host = snapshot.hosts[vm.host_id].name if vm.host_id in snapshot.hosts else ""
        return Fit("same_gpu", labels, host, detail=f"Its vGPUs stay; host {host} has room for {request.size_change}")
    return _fit(snapshot, request.vm_id, planned.impact)


def choice_fits(vm: VirtualMachine, choices, snapshot: FleetSnapshot) -> list[Fit]:
    """Where each of `choices` ((profile, vGPUs) the artist's form offers for `vm`) would go now,
    by the answer the queue shows and approval follows; the form says it next to each choice."""
    calculator = fit.ImpactCalculator(snapshot)
    fits_now = []
    for profile, vgpus in choices:
        if vm.pk not in snapshot.vms or profile.pk not in snapshot.profiles:
            fits_now.append(Fit("n/a"))
            continue
        impact = calculator.impact(vm.pk, snapshot.profiles[profile.pk], vgpus)
        fits_now.append(Fit("nowhere", detail=impact.detail) if impact.fits == fit.NOWHERE else
                        _fit(snapshot, vm.pk, impact))
    return fits_now


def _fit(snapshot: FleetSnapshot, vm_id: int, impact: fit.Impact) -> Fit:
    # Compared by id: PCI bus ids repeat from host to host.
    vm = snapshot.vms[vm_id]
    own = {v.gpu_id for v in vm.vgpus}
    home = vm.vgpus[0].host_id if vm.vgpus else vm.host_id
    where = ("same_gpu" if set(impact.gpu_ids) <= own else
             "other_gpu" if impact.host_id == home else "other_host")
    labels = tuple(sorted({snapshot.gpus[g].label for g in impact.gpu_ids}))
    return Fit(where, labels, snapshot.hosts[impact.host_id].name, detail=impact.detail)


def fits(request: ResizeRequest) -> Fit:
    """Where the request would go now (`fit_of` on a fresh snapshot); see `fits_all` for a list."""
    return fit_of(request, fleet_snapshot())


def fits_all(requests) -> list[Fit]:
    """`fit_of` for each of `requests`, over one snapshot: a fixed number of queries for a queue
    of any length, and no lock or write (the queue is read on every visit)."""
    requests = list(requests)
    if not any(r.status == ResizeStatus.PENDING for r in requests):
        return [Fit("n/a") for _ in requests]
    snapshot = fleet_snapshot()
    return [fit_of(r, snapshot) for r in requests]


# Evidence ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Evidence:
    """What the right-sizing engine has seen of a VM's usage, as the request pages and the API
    show it next to a request: the suggestion's kind and reason, the figures it rests on, and
    whether it asks for what the request asks (the admin's quickest check)."""

    action: str = ""  # a SuggestionAction value, "" when the VM has no suggestion yet
    label: str = "No usage evidence yet"
    suggested: str = ""  # e.g. "RTX6000-24Q" or "2 x RTX6000-24Q"
    reason: str = ""
    figures: str = ""  # one sentence of frame buffer and utilization figures
    matches_request: bool | None = None  # None when there is no request or no resize suggested
    from_suggestion: bool = False  # the request was filed by an admin accepting this suggestion

    def as_dict(self) -> dict:
        return {"action": self.action, "label": self.label, "suggested": self.suggested, "reason": self.reason,
                "figures": self.figures, "matches_request": self.matches_request,
                "from_suggestion": self.from_suggestion}


def _gib(mib) -> str:
    return f"{mib / 1024:.1f}".removesuffix(".0")


def usage_figures(evidence: dict) -> str:
    """One sentence of the figures a suggestion rests on, e.g. "Over 14 days: frame buffer p95
    11.2 of 12 GiB (93%), peak 100%, mean 74%; GPU utilization p95 40%." ("" without figures)."""
    parts = []
    p95_mib, profile_mib = evidence.get("fb_p95_mib"), evidence.get("profile_fb_mib")
    if p95_mib is not None and profile_mib:
        frame_buffer = f"frame buffer p95 {_gib(p95_mib)} of {_gib(profile_mib)} GiB"
        if evidence.get("fb_p95_pct") is not None:
            frame_buffer += f" ({evidence['fb_p95_pct']:.0f}%)"
        frame_buffer += "".join(f", {label} {evidence[key]:.0f}%" for label, key in
                                (("peak", "fb_peak_pct"), ("mean", "fb_mean_pct")) if evidence.get(key) is not None)
        parts.append(frame_buffer)
    if evidence.get("util_gpu_p95_pct") is not None:
        parts.append(f"GPU utilization p95 {evidence['util_gpu_p95_pct']:.0f}%")
    if not parts:
        return ""
    days = evidence.get("window_days")
    return (f"Over {days} days: " if days else "") + "; ".join(parts) + "."


#: A suggestion's actions that advise a change (sizing's SuggestionAction values).
RESIZE_ACTIONS = ("upsize", "downsize")


def _matches(suggestion, request: ResizeRequest) -> bool | None:
    """Whether `request` asks what the suggestion advises, part by part: the vGPUs where it changes
    them (against the suggested profile and number), its vCPUs and RAM where it changes them
    (against the suggested size; advice to keep it differs from any change). None when the
    suggestion says nothing about any part the request changes."""
    checks = []
    target = suggestion.suggested_profile
    if (request.changes_vgpus or not request.changes_size) and target is not None:
        wanted_vgpus = suggestion.suggested_vgpus or request.current_vgpus
        checks.append(target.pk == request.requested_profile_id and wanted_vgpus == request.requested_vgpus)
    for action, suggested, requested in (
        (suggestion.cpu_action, suggestion.suggested_vcpus, request.requested_vcpus),
        (suggestion.ram_action, suggestion.suggested_ram_gib, request.requested_ram_gib),
    ):
        if requested is not None and action in (*RESIZE_ACTIONS, "keep"):
            checks.append(action in RESIZE_ACTIONS and suggested == requested)  # "keep" advises no change
    return all(checks) if checks else None


def evidence_of(vm: VirtualMachine, request: ResizeRequest | None = None) -> Evidence:
    """The VM's right-sizing evidence, compared with `request` when given.

    Reads `vm.suggestion` (select_related("vm__suggestion__suggested_profile") keeps a list of
    requests at a fixed number of queries). The impact part of the evidence (which GPUs and
    hosts a move would use) is left out: artists see this too, and where a request fits is the
    queue's own column.
    """
    suggestion = getattr(vm, "suggestion", None)  # the reverse one-to-one raises AttributeError when missing
    if suggestion is None:
        return Evidence()
    target = suggestion.suggested_profile
    suggested = ""
    if target is not None:
        suggested = f"{suggestion.suggested_vgpus} x {target.name}" if suggestion.suggested_vgpus else target.name
    matches = _matches(suggestion, request) if request is not None else None
    return Evidence(
        action=suggestion.action, label=suggestion.get_action_display(), suggested=suggested,
        reason=suggestion.reason, figures=usage_figures(suggestion.evidence or {}), matches_request=matches,
        from_suggestion=request is not None and suggestion.resize_request_id == request.pk,
    )


# Notifications -----------------------------------------------------------------------------


def mark_read(user, ids: list[int] | None = None) -> int:
    """Mark `user`'s unread notifications (all, or those of `ids`) read; returns how many changed."""
    unread = Notification.objects.filter(user=user, read_at__isnull=True)
    if ids is not None:
        unread = unread.filter(pk__in=ids)
    return unread.update(read_at=timezone.now())


@dataclass(frozen=True)
class BadgeCounts:
    """The navigation's badges: the user's unread notifications and, for admins, pending requests."""

    unread: int = 0
    pending: int = 0
    # Counts of the apps above (e.g. alerts firing), asked for by the caller: {name: count}.
    more: dict = field(default_factory=dict)


#: The badge query per (database, admin or not, names of the admin counts): its SQL and where the
#: user's id goes in its parameters. Building it through the ORM (up to four subqueries) cost more
#: CPU than the rest of a page served from the read cache, and only the user's id changes from one
#: page to the next, so each process compiles it once.
_badge_sql: dict[tuple[str, bool, tuple[str, ...]], tuple[str, tuple, int]] = {}
#: The user id the query is compiled with, then replaced by the user's: no user has it.
_ANY_USER_PK = -1_987_654_321  # in the range of an integer column


def _badge_query(user_pk: int, admin: bool, admin_counts: dict[str, Callable]):
    unread = Notification.objects.filter(user=OuterRef("pk"), read_at__isnull=True).order_by().values(
        "user").annotate(n=Count("pk")).values("n")
    annotations = {"unread": Coalesce(Subquery(unread, output_field=IntegerField()), Value(0))}
    if admin:
        pending = ResizeRequest.objects.filter(status=ResizeStatus.PENDING).order_by().values(
            "status").annotate(n=Count("pk")).values("n")
        annotations["pending"] = Coalesce(Subquery(pending, output_field=IntegerField()), Value(0))
        for name, count in admin_counts.items():
            annotations[name] = Coalesce(Subquery(count(), output_field=IntegerField()), Value(0))
    return get_user_model().objects.filter(pk=user_pk).annotate(**annotations).values(*annotations)


def _compiled_badge_query(database: str, admin: bool, admin_counts: dict[str, Callable]) -> tuple[str, tuple, int]:
    key = (database, admin, tuple(admin_counts))
    compiled = _badge_sql.get(key)
    if compiled is None:
        sql, params = _badge_query(_ANY_USER_PK, admin, admin_counts).query.get_compiler(using=database).as_sql()
        (at,) = (i for i, param in enumerate(params) if param == _ANY_USER_PK)  # exactly once, or fail loudly
        compiled = _badge_sql[key] = (sql, tuple(params), at)
    return compiled


def badge_counts(user, admin_counts: dict[str, Callable] | None = None) -> BadgeCounts:
    """Both badge counts in one query (two indexed subqueries on the user's row); admins only
    pay for the pending count, and for `admin_counts` ({name: a function returning a subquery of
    one count}) that apps above fleet add to the same query. The query is compiled once per
    process for each set of names: a name stands for the same count on every call."""
    if not (user and user.is_authenticated):
        return BadgeCounts()
    admin = is_fleet_admin(user)
    admin_counts = (admin_counts or {}) if admin else {}
    database = router.db_for_read(get_user_model())
    sql, params, at = _compiled_badge_query(database, admin, admin_counts)
    with connections[database].cursor() as cursor:
        cursor.execute(sql, (*params[:at], user.pk, *params[at + 1:]))
        columns = [column[0] for column in cursor.description]
        row = dict(zip(columns, cursor.fetchone() or (), strict=False))
    return BadgeCounts(unread=row.get("unread", 0), pending=row.get("pending", 0),
                       more={name: row.get(name, 0) for name in admin_counts})

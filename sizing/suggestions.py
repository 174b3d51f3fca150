"""Right-sizing suggestions: refreshed from the hourly rollups, then accepted, dismissed or restored.

`refresh_suggestions` is the hourly beat task's work (`sizing.tasks`): it reads the fleet once
(`fleet.queries.fleet_snapshot`), streams every VM's hourly rollups over the window in one
query (and its guest CPU and memory rollups in another, for `sizing.guest_engine`'s vCPU and
RAM advice and the combined reading, and its artist's ratings in a third, which move the
advice's confidence), asks the pure engine (`sizing.engine.advise`) what each VM
should hold and, for a resize, where the new size would fit (`fleet.fit.ImpactCalculator`, the
answer approval follows), then upserts one `Suggestion` per VM. The query count is the same for
ten VMs as for ten thousand (apart from the insert batches), and memory holds one VM's rollups at
a time.

A dismissal hides a suggestion while its `evidence_key` (a coarse digest of the advice and its
figures, `sizing.engine.evidence_key`) stays what it was dismissed on; once a refresh changes the
evidence, the dismissal is cleared, so the suggestion comes back for good and not only until the
figures drift back.

Accepting a suggestion files a `fleet.models.ResizeRequest` for an admin to approve (approval
re-checks placement and applies it); nothing here changes a VM's vGPUs.
"""

from __future__ import annotations

import logging
import threading
from collections import Counter
from collections.abc import Iterable, Iterator
from datetime import datetime, timedelta
from itertools import groupby
from operator import itemgetter

from django.conf import settings
from django.db import transaction
from django.db.models import F, Q
from django.utils import timezone

from fleet import audit, locks
from fleet import requests as resize_requests
from fleet.fit import ImpactCalculator
from fleet.models import ResizeRequest, Vgpu
from fleet.queries import fleet_snapshot
from fleet.snapshot import FleetSnapshot
from sizing import engine, feedback, feedback_rules, guest_engine
from sizing.models import Suggestion, SuggestionAction
from telemetry.aggregation import bucket_floor
from telemetry.models import GuestRollup, VmRollup

logger = logging.getLogger(__name__)

HOURLY = 3600
#: Rows per INSERT ... ON CONFLICT statement of a refresh.
WRITE_BATCH = 500
#: Rollup rows fetched per round trip while streaming the window.
CHUNK_ROWS = 5000
RESIZE_ACTIONS = (SuggestionAction.UPSIZE, SuggestionAction.DOWNSIZE)
REASON_MAX_CHARS = Suggestion._meta.get_field("reason").max_length
#: The columns a refresh writes; the dismissal and the filed request are the admin's.
REFRESHED_FIELDS = [
    "current_profile", "suggested_profile", "suggested_vgpus", "action", "reason", "evidence", "evidence_key",
    "fits", "gpus_delta", "window_start", "window_end", "computed_at", "cpu_action", "suggested_vcpus",
    "ram_action", "suggested_ram_gib", "combined",
]
_ROLLUP_COLUMNS = (
    "vm_id", "bucket", "samples", "fb_used_mib_avg", "fb_used_mib_max", "fb_used_mib_p95", "util_gpu_avg",
    "util_gpu_p95", "enc_util_avg", "enc_util_max", "profile_fb_mib", "partial",
)


class SuggestionConflict(Exception):
    """The suggestion cannot be acted on as it stands (nothing to resize, a request already
    pending, evidence or vGPUs changed since it was shown); the API answers 409."""


def thresholds() -> engine.Thresholds:
    """The engine's thresholds with the window of SIZING_WINDOW_DAYS (default 14 days)."""
    return engine.Thresholds(window_days=settings.SIZING_WINDOW_DAYS)


def window_bounds(now: datetime, window_days: int) -> tuple[datetime, datetime]:
    """The complete hourly buckets of the last `window_days` days before `now`: [start, end),
    end being the start of the hour in progress (never half an hour of data)."""
    end = bucket_floor(now, HOURLY)
    return end - timedelta(days=window_days), end


# Refresh -----------------------------------------------------------------------------------


def _usage_hours(start: datetime, end: datetime, vm_ids: list[int] | None) -> Iterator[tuple[int, list]]:
    """(vm_id, [UsageHour, ...]) for every VM with hourly rollups in [start, end), by VM id and
    bucket: one query, streamed, one VM's hours in memory at a time."""
    rows = VmRollup.objects.filter(step_s=HOURLY, bucket__gte=start, bucket__lt=end)
    if vm_ids is not None:
        rows = rows.filter(vm_id__in=vm_ids)
    stream = rows.order_by("vm_id", "bucket").values_list(*_ROLLUP_COLUMNS).iterator(chunk_size=CHUNK_ROWS)
    # Local time: the evidence's daily series groups hours by the calendar day of `start`.
    zone = timezone.get_current_timezone()
    for vm_id, group in groupby(stream, key=itemgetter(0)):
        yield vm_id, [
            engine.UsageHour(
                start=bucket.astimezone(zone), samples=samples, fb_used_mib_avg=fb_avg, fb_used_mib_max=fb_max,
                fb_used_mib_p95=fb_p95, util_gpu_avg=util_avg, util_gpu_p95=util_p95, enc_util_avg=enc_avg,
                enc_util_max=enc_max, profile_fb_mib=profile_fb, partial=partial,
            )
            for (_, bucket, samples, fb_avg, fb_max, fb_p95, util_avg, util_p95, enc_avg, enc_max, profile_fb,
                 partial) in group
        ]


_GUEST_COLUMNS = (
    "vm_id", "bucket", "samples", "vcpus", "ram_mib", "vcpu_util_avg", "vcpu_util_p95", "vcpu_max_util_p95",
    "vcpu_max_util_max", "cpu_steal_pct_avg", "ram_used_mib_p95", "ram_used_mib_max",
)


def _guest_hours(start: datetime, end: datetime, vm_ids: list[int] | None) -> Iterator[tuple[int, list]]:
    """(vm_id, [GuestHour, ...]) for every VM with hourly guest rollups in [start, end), by VM id
    and bucket: one query, streamed, like `_usage_hours`."""
    rows = GuestRollup.objects.filter(step_s=HOURLY, bucket__gte=start, bucket__lt=end)
    if vm_ids is not None:
        rows = rows.filter(vm_id__in=vm_ids)
    stream = rows.order_by("vm_id", "bucket").values_list(*_GUEST_COLUMNS).iterator(chunk_size=CHUNK_ROWS)
    for vm_id, group in groupby(stream, key=itemgetter(0)):
        yield vm_id, [guest_engine.GuestHour(*row[1:]) for row in group]


def _hours_per_vm(vm_ids: list[int], streamed: Iterable[tuple[int, list]]) -> Iterator[tuple[int, list]]:
    """Pairs each of `vm_ids` (ascending) with its hours from `streamed` (ascending by VM), or
    with no hours: a VM without rollups still gets a suggestion ("not enough data")."""
    stream = iter(streamed)
    pending = next(stream, None)
    for vm_id in vm_ids:
        while pending is not None and pending[0] < vm_id:
            pending = next(stream, None)
        if pending is not None and pending[0] == vm_id:
            yield vm_id, pending[1]
            pending = next(stream, None)
        else:
            yield vm_id, []


def _room(snapshot: FleetSnapshot, vm_id: int) -> guest_engine.HostRoom | None:
    """What the VM's host can still give it, under its overcommit (None for a VM on no host)."""
    host = snapshot.hosts.get(snapshot.vms[vm_id].host_id)
    if host is None:
        return None
    return guest_engine.HostRoom(host.name, vcpus=host.vcpu_capacity - host.allocated_vcpus,
                                 ram_gib=host.ram_capacity_gib - host.allocated_ram_gib)


def _guest(snapshot: FleetSnapshot, vm_id: int, guest_hours: list, advice: engine.Advice):
    """(guest advice, combined reading) of one VM: its vCPUs and RAM, and what they say beside its vGPU's advice."""
    vm = snapshot.vms[vm_id]
    guest = guest_engine.advise_guest(guest_hours, vm.vcpus, vm.ram_gib, room=_room(snapshot, vm_id))
    combined = guest_engine.combine(advice.action, advice.evidence.get("util_gpu_p95_pct"), guest,
                                    fb_pressure=advice.action == engine.UPSIZE)
    return guest, combined


def _suggestion(snapshot: FleetSnapshot, impacts: ImpactCalculator, vm_id: int, hours: list,
                limits: engine.Thresholds, window: tuple[datetime, datetime], now: datetime,
                guest_hours: list | None = None, ratings: list | None = None) -> Suggestion:
    """The unsaved suggestion for one VM: the engine's advice and, for a resize, its impact; its
    vCPU and RAM advice from `guest_hours` and the combined reading; its artist's `ratings` and
    how they move the confidence of the advice (`sizing.feedback_rules.confidence`)."""
    vm = snapshot.vms[vm_id]
    current = snapshot.vm_profile(vm_id)
    options = snapshot.profiles_for(current.gpu_model, current.series)
    board = snapshot.models.get(current.gpu_model)
    advice = engine.advise(current, len(vm.vgpus), hours, options, limits,
                           multi_vgpu_full_only=bool(board and board.multi_vgpu_full_only))
    evidence = dict(advice.evidence)
    fits, gpus_delta = "", 0
    if advice.action in RESIZE_ACTIONS and advice.suggested is not None:
        impact = impacts.impact(vm_id, advice.suggested, advice.suggested_vgpus)
        fits, gpus_delta = impact.fits, impact.gpus_delta
        evidence["impact"] = {
            "fits": impact.fits, "detail": impact.detail, "violations": [str(v) for v in impact.violations],
            "gpu_ids": list(impact.gpu_ids), "host_id": impact.host_id, "gpus_delta": impact.gpus_delta,
            "refusals": list(impact.refusals), "frees_by_moving": impact.frees_by_moving,
        }
    guest, combined = _guest(snapshot, vm_id, guest_hours or [], advice)
    evidence["guest"] = {**guest.evidence, "reasons": list(guest.reasons),
                         "single_thread_bound": guest.single_thread_bound, "steal_high": guest.steal_high}
    evidence["combined"] = ({"kind": combined.kind, "message": combined.message, "keep_vgpu": combined.keep_vgpu}
                            if combined else None)
    rated = feedback_rules.feedback_summary(ratings or [])
    evidence["feedback"] = rated
    evidence["confidence"] = feedback_rules.confidence(advice.action, rated)
    return Suggestion(
        vm_id=vm_id, current_profile_id=current.id,
        suggested_profile_id=advice.suggested.id if advice.suggested is not None else None,
        suggested_vgpus=advice.suggested_vgpus, action=advice.action, reason=advice.reason[:REASON_MAX_CHARS],
        evidence=evidence, evidence_key=guest_engine.evidence_key(engine.evidence_key(advice), guest, combined),
        fits=fits, gpus_delta=gpus_delta, window_start=window[0], window_end=window[1], computed_at=now,
        cpu_action=guest.cpu_action, suggested_vcpus=guest.suggested_vcpus, ram_action=guest.ram_action,
        suggested_ram_gib=guest.suggested_ram_gib, combined=combined.kind if combined else "",
    )


def refresh_suggestions(now: datetime | None = None, vm_ids: Iterable[int] | None = None) -> dict[str, int]:
    """Recompute the suggestion of every VM holding vGPUs (or of `vm_ids` only) from its hourly
    rollups over the window, and delete those of VMs that hold none any more.

    Returns how many suggestions of each action were written, `removed` and `failed` (a VM the
    engine could not judge is logged and keeps its previous suggestion: one odd VM must not stop
    the fleet's refresh). Safe to run twice or at once: rows are upserted on their VM.
    """
    now = now or timezone.now()
    limits = thresholds()
    window = window_bounds(now, limits.window_days)
    wanted = None if vm_ids is None else sorted(set(vm_ids))
    snapshot = fleet_snapshot()
    chosen = None if wanted is None else set(wanted)
    subjects = sorted(vm_id for vm_id, vm in snapshot.vms.items()
                      if vm.vgpus and (chosen is None or vm_id in chosen))
    counts: Counter[str] = Counter({action: 0 for action in SuggestionAction.values})
    counts.update(removed=0, failed=0)
    rows = []
    impacts = ImpactCalculator(snapshot)
    streamed = _usage_hours(*window, vm_ids=wanted)
    guests = _hours_per_vm(subjects, _guest_hours(*window, vm_ids=wanted))
    ratings = feedback.ratings_by_vm(timezone.localdate(window[0]), wanted)
    for (vm_id, hours), (_, guest_hours) in zip(_hours_per_vm(subjects, streamed), guests, strict=True):
        try:
            row = _suggestion(snapshot, impacts, vm_id, hours, limits, window, now, guest_hours,
                              ratings.get(vm_id))
        except Exception:
            logger.exception("right-sizing of VM %s (id %d) failed", snapshot.vms[vm_id].name, vm_id)
            counts["failed"] += 1
            continue
        rows.append(row)
        counts[row.action] += 1
    with transaction.atomic():
        Suggestion.objects.bulk_create(
            rows, batch_size=WRITE_BATCH, update_conflicts=True, unique_fields=["vm"], update_fields=REFRESHED_FIELDS,
        )
        scope = Suggestion.objects.all() if wanted is None else Suggestion.objects.filter(vm_id__in=wanted)
        # New evidence ends a dismissal for good (see the module docstring).
        scope.exclude(dismissed_key="").exclude(dismissed_key=F("evidence_key")).update(
            dismissed_key="", dismissed_by=None, dismissed_at=None,
        )
        # A filed request stays linked while the suggestion still asks for what it requested.
        scope.filter(resize_request__isnull=False).filter(
            Q(suggested_profile__isnull=True) | ~Q(suggested_profile=F("resize_request__requested_profile")),
        ).update(resize_request=None)
        removed, _ = scope.exclude(vm_id__in=Vgpu.objects.values("vm_id")).delete()
    counts["removed"] = removed
    return dict(counts)


# After a VM's vGPUs change -----------------------------------------------------------------

#: VM ids whose vGPUs were written in this thread since the last flush (`vgpus_written`).
_written = threading.local()
_CHUNK = 500


def outdated(vm_ids: Iterable[int]) -> list[int]:
    """The VMs among `vm_ids` whose suggestion was computed on other vGPUs than they hold now
    (another profile or count, or none any more): their advice and figures quote the old size."""
    wanted = sorted(set(vm_ids))
    stale = []
    for start in range(0, len(wanted), _CHUNK):
        chunk = wanted[start:start + _CHUNK]
        held: dict[int, list[int]] = {}
        for vm_id, profile_id in Vgpu.objects.filter(vm_id__in=chunk).values_list("vm_id", "profile_id"):
            held.setdefault(vm_id, []).append(profile_id)
        for vm_id, profile_id, evidence in Suggestion.objects.filter(vm_id__in=chunk).values_list(
                "vm_id", "current_profile_id", "evidence"):
            profiles = held.get(vm_id, [])
            count = evidence.get("vgpus") if isinstance(evidence, dict) else None
            if profile_id not in profiles or (count is not None and count != len(profiles)):
                stale.append(vm_id)
    return stale


def refresh_outdated(vm_ids: Iterable[int]) -> int:
    """Recompute at once the suggestions of `vm_ids` that quote vGPUs the VM no longer holds,
    so the VM's page, the artist's page and the lists show the new size right after an approval
    or an applied plan rather than at the next hourly refresh; returns how many were outdated.
    A suggestion that cannot be recomputed is deleted: no advice beats advice about the old size."""
    stale = outdated(vm_ids)
    if not stale:
        return 0
    try:
        refresh_suggestions(vm_ids=stale)
    except Exception:  # noqa: BLE001 - the change is committed; stale advice must still go
        logger.exception("could not recompute the suggestions of VMs %s after their vGPUs changed", stale)
    left = outdated(stale)
    if left:
        Suggestion.objects.filter(vm_id__in=left).delete()
    return len(stale)


def _flush_written() -> None:
    vm_ids = getattr(_written, "vm_ids", None)
    if vm_ids:
        _written.vm_ids = set()
        refresh_outdated(vm_ids)


def vgpus_written(sender, instance, **kwargs) -> None:
    """post_save / post_delete of a `Vgpu`: once the transaction commits, the suggestions of the
    VMs whose vGPUs changed are brought up to date (`refresh_outdated`). A rolled-back change
    leaves its VM in the set, where the next flush finds its suggestion still current."""
    if not hasattr(_written, "vm_ids"):
        _written.vm_ids = set()
    _written.vm_ids.add(instance.vm_id)
    transaction.on_commit(_flush_written)


# Accept, dismiss, restore ------------------------------------------------------------------


def _fmt_gib(mib) -> str:
    value = mib / 1024
    return f"{value:.0f}" if abs(value - round(value)) < 0.05 else f"{value:.1f}"


def resize_reason(suggestion: Suggestion) -> str:
    """The reason a filed request carries, from the evidence, e.g. "Right-sizing: fb p95 11.2 GiB
    = 93% of 12 GiB over 14 days (peak 100%, mean 74%); RTX6000-12Q -> RTX6000-24Q"."""
    evidence = suggestion.evidence or {}
    parts = ["Right-sizing:"]
    p95_mib, profile_mib = evidence.get("fb_p95_mib"), evidence.get("profile_fb_mib")
    if p95_mib is not None and profile_mib:
        days = evidence.get("window_days", settings.SIZING_WINDOW_DAYS)
        parts.append(f"fb p95 {_fmt_gib(p95_mib)} GiB = {evidence.get('fb_p95_pct', 0):.0f}% of "
                     f"{_fmt_gib(profile_mib)} GiB over {days} days")
        extra = [f"{label} {evidence[key]:.0f}%" for label, key in (("peak", "fb_peak_pct"), ("mean", "fb_mean_pct"))
                 if evidence.get(key) is not None]
        if extra:
            parts.append(f"({', '.join(extra)});")
    target = suggestion.suggested_profile.name if suggestion.suggested_profile else "?"
    count = suggestion.suggested_vgpus
    parts.append(f"{suggestion.current_profile.name if suggestion.current_profile else '?'} -> "
                 f"{f'{count} x ' if count else ''}{target}.")
    detail = (evidence.get("impact") or {}).get("detail")
    if detail:
        parts.append(detail.rstrip(".") + ".")
    return " ".join(parts)


#: What an audit event keeps of a suggestion: the advice and what admins did with it (the
#: evidence itself is recomputed hourly and would make every event a page long).
AUDITED_FIELDS = ["vm", "action", "current_profile", "suggested_profile", "suggested_vgpus", "evidence_key",
                  "dismissed_key", "dismissed_by", "dismissed_at", "resize_request"]


def _record(verb: str, suggestion: Suggestion, before: dict, comment: str = "") -> None:
    audit.record(f"suggestion.{verb}", suggestion, before=before,
                 after=audit.snapshot(suggestion, AUDITED_FIELDS), comment=comment)


def _locked_suggestion(suggestion: Suggestion) -> Suggestion:
    """The suggestion's row, locked, after its VM's row (`fleet.locks`' order: the VM before what
    hangs off it), so two admins acting on one VM queue up."""
    rows = locks.lock_for_change(vms=[suggestion.vm_id], then=[Suggestion.objects.select_related(
        "vm", "current_profile", "suggested_profile").filter(pk=suggestion.pk)]).then[0]
    if not rows:
        raise Suggestion.DoesNotExist(f"suggestion #{suggestion.pk} was deleted")
    return rows[0]


def _check_shown(suggestion: Suggestion, evidence_key: str) -> None:
    if evidence_key and evidence_key != suggestion.evidence_key:
        raise SuggestionConflict(
            f"The suggestion for {suggestion.vm.name} was recomputed since it was shown (new evidence); "
            "review it again.",
        )


def guest_reason(suggestion: Suggestion, vcpus: int | None, ram_gib: int | None) -> str:
    """The vCPU and RAM part of a filed request's reason: the change, then the guest's figures
    behind it, e.g. "vCPUs 8 -> 4; RAM 32 -> 16 GiB. vCPUs: p95 12 % of its 8 vCPUs; ..."."""
    vm = suggestion.vm
    changes = ([f"vCPUs {vm.vcpus} -> {vcpus}"] if vcpus is not None else []) + (
        [f"RAM {vm.ram_gib} -> {ram_gib} GiB"] if ram_gib is not None else [])
    guest = (suggestion.evidence or {}).get("guest") or {}
    return " ".join(["; ".join(changes) + ".", *guest.get("reasons", ())])


def accept_suggestion(suggestion: Suggestion, user, *, evidence_key: str = "", note: str = "") -> ResizeRequest:
    """File a pending resize request for what the suggestion advises for the VM, by `user`,
    linked from the suggestion; returns it: the suggested profile (and vGPU count) when the
    vGPU advice is a resize, the suggested vCPUs and RAM where their advice is.

    The request is filed through `fleet.requests.file_request`, so it is validated, audited and
    announced to the admins exactly as one filed by the artist. Raises SuggestionConflict when
    there is nothing to resize (keep, not enough data), when the VM's vGPUs changed since the
    suggestion was computed, when `evidence_key` (what the admin was shown) is no longer the
    evidence, or when filing refuses the request (a request for the VM already pending, a
    vGPU count the profile does not allow...), in filing's words.
    """
    with transaction.atomic():
        suggestion = _locked_suggestion(suggestion)
        vm = suggestion.vm
        _check_shown(suggestion, evidence_key)
        resizes_vgpus = suggestion.action in RESIZE_ACTIONS and suggestion.suggested_profile is not None
        vcpus, ram_gib = suggestion.advised_size()
        if not resizes_vgpus and vcpus is None and ram_gib is None:
            raise SuggestionConflict(
                f"The suggestion for {vm.name} is \"{suggestion.get_action_display()}\": there is nothing to resize.",
            )
        profiles = list(Vgpu.objects.filter(vm=vm).values_list("profile_id", flat=True))
        if resizes_vgpus and suggestion.current_profile_id not in profiles:
            raise SuggestionConflict(
                f"The vGPUs of {vm.name} changed since this suggestion was computed; refresh the suggestions.",
            )
        reason = resize_reason(suggestion) if resizes_vgpus else "Right-sizing:"
        if vcpus is not None or ram_gib is not None:
            reason = " ".join([reason, guest_reason(suggestion, vcpus, ram_gib)])
        if note:
            reason = f"{reason}\n\n{note}"
        try:
            # Filed as the artist's form and the API file one: same validation, audit and notifications.
            request = resize_requests.file_request(
                vm, user, suggestion.suggested_profile if resizes_vgpus else None,
                (suggestion.suggested_vgpus or len(profiles)) if resizes_vgpus else None, reason,
                requested_vcpus=vcpus, requested_ram_gib=ram_gib,
                comment=f"from the right-sizing suggestion for {vm.name}",
            )
        except resize_requests.RequestError as exc:
            raise SuggestionConflict(f"No request was filed for {vm.name}: {' '.join(exc.errors.values())}") from exc
        before = audit.snapshot(suggestion, AUDITED_FIELDS)
        suggestion.resize_request = request
        suggestion.save(update_fields=["resize_request"])
        _record("accept", suggestion, before, comment=f"filed resize request #{request.pk}")
    return request


def dismiss_suggestion(suggestion: Suggestion, user, *, evidence_key: str = "") -> Suggestion:
    """Hide the suggestion until its evidence changes; returns it. Raises SuggestionConflict
    when `evidence_key` (what the admin was shown) is no longer the evidence: dismissing would
    hide evidence nobody looked at."""
    with transaction.atomic():
        suggestion = _locked_suggestion(suggestion)
        _check_shown(suggestion, evidence_key)
        before = audit.snapshot(suggestion, AUDITED_FIELDS)
        suggestion.dismissed_key = suggestion.evidence_key
        suggestion.dismissed_by = user
        suggestion.dismissed_at = timezone.now()
        suggestion.save(update_fields=["dismissed_key", "dismissed_by", "dismissed_at"])
        _record("dismiss", suggestion, before)
    return suggestion


def restore_suggestion(suggestion: Suggestion) -> Suggestion:
    """Show a dismissed suggestion again; returns it (unchanged when it was not dismissed)."""
    with transaction.atomic():
        suggestion = _locked_suggestion(suggestion)
        before = audit.snapshot(suggestion, AUDITED_FIELDS)
        suggestion.dismissed_key = ""
        suggestion.dismissed_by = None
        suggestion.dismissed_at = None
        suggestion.save(update_fields=["dismissed_key", "dismissed_by", "dismissed_at"])
        after = audit.snapshot(suggestion, AUDITED_FIELDS)
        if audit.changed(before, after):  # restoring one that was not dismissed changes nothing
            _record("restore", suggestion, before)
    return suggestion

"""One evaluation of the alert rules: gather facts, judge them, and reconcile with the open
alerts (fire new ones, keep the rest up to date, resolve those whose condition ended), then tell
people: the admins' channels (`notify.dispatch`) and, about their own VM only, the artists.

One evaluation runs at a time (`EvaluationLease`); the reconcile is one transaction and the
notifications are durable deliveries queued when it commits, so a worker killed half-way leaves
the alerts as they were and the next run (beat, every ALERTS_EVALUATION_INTERVAL_S) redoes it.
"""

from __future__ import annotations

import logging
import secrets
import time
from dataclasses import dataclass
from datetime import datetime, timedelta

from django.conf import settings
from django.db import transaction
from django.db.models import Q
from django.urls import reverse

from alerts import rules as rulebook
from alerts.gather import gather, utc_now
from alerts.models import (
    OPEN_STATES,
    Alert,
    AlertRule,
    AlertState,
    Evaluation,
    EvaluationLease,
    LicenceUsage,
    Silence,
)
from fleet.locks import lock_rows
from fleet.models import VirtualMachine
from notify.messages import Message
from notify.services import dispatch_many, tell_artists

log = logging.getLogger(__name__)

# Rules whose alert means something is wrong with an artist's own VM or the GPU under it: the
# artist gets a note (about their VM only) when one fires.
ARTIST_RULES = {"xid", "ecc_uncorrectable", "row_remap", "vgpu_unlicensed", "vgpu_fb_full", "throttling"}


@dataclass(slots=True)
class Outcome:
    evaluation: Evaluation | None
    fired: list[Alert]
    resolved: list[Alert]


def ensure_rules() -> dict[str, AlertRule]:
    """Every rule of the catalogue as a row (created with its defaults the first time)."""
    rows = {row.kind: row for row in AlertRule.objects.all()}
    missing = [AlertRule(kind=slug, severity=kind.severity, params={})
               for slug, kind in rulebook.RULES.items() if slug not in rows]
    if missing:
        AlertRule.objects.bulk_create(missing, ignore_conflicts=True)
        rows = {row.kind: row for row in AlertRule.objects.all()}
    return rows


def _take_lease(now: datetime, ttl_s: float) -> str | None:
    token = secrets.token_hex(8)
    EvaluationLease.objects.get_or_create(pk=1)
    taken = EvaluationLease.objects.filter(pk=1).filter(Q(until__isnull=True) | Q(until__lt=now)).update(
        holder=token, until=now + timedelta(seconds=ttl_s))
    return token if taken else None


def _drop_lease(token: str) -> None:
    EvaluationLease.objects.filter(pk=1, holder=token).update(holder="", until=None)


def evaluate(now: datetime | None = None) -> Outcome:
    """Run the rules once; Outcome(None, [], []) when another evaluation holds the lease."""
    now = now or utc_now()
    token = _take_lease(now, settings.ALERTS_LEASE_S)
    if token is None:
        return Outcome(None, [], [])
    started = time.perf_counter()
    run = Evaluation.objects.create(started_at=now)
    try:
        rows = ensure_rules()
        enabled = {slug: (row.severity, row.effective_params) for slug, row in rows.items() if row.enabled}
        facts = gather(now, enabled)
        findings = rulebook.evaluate(facts, enabled)
        with transaction.atomic():
            fired, resolved = reconcile(findings, rows, now)
            record_licence_usage(facts, now)
        run.findings, run.fired, run.resolved = len(findings), len(fired), len(resolved)
        return Outcome(run, fired, resolved)
    except Exception as exc:
        run.error = f"{type(exc).__name__}: {exc}"[:2000]
        log.exception("alert evaluation failed")
        raise
    finally:
        run.finished_at = utc_now()
        run.duration_s = time.perf_counter() - started
        run.save()
        _drop_lease(token)


def active_silences(now: datetime) -> list[Silence]:
    return list(Silence.objects.filter(starts_at__lte=now, ends_at__gt=now).select_related("alert"))


def silenced(silences: list[Silence], rule_id: int, key: str, host_id: int | None, gpu_id: int | None) -> bool:
    return any(s.matches(rule_id, key, host_id, gpu_id) for s in silences)


def reconcile(findings: list[rulebook.Finding], rules: dict[str, AlertRule], now: datetime
              ) -> tuple[list[Alert], list[Alert]]:
    """Open, refresh and resolve alerts so the open ones are exactly `findings`; returns (fired, resolved)."""
    silences = active_silences(now)
    open_alerts = {a.key: a for a in lock_rows(Alert.objects.filter(state__in=OPEN_STATES))}
    by_key = {f.key: f for f in findings}
    fired, kept, changed_ids = [], [], set()
    for key, finding in by_key.items():
        rule = rules[finding.rule]
        quiet = silenced(silences, rule.pk, key, finding.host_id, finding.gpu_id)
        alert = open_alerts.get(key)
        if alert is None:
            fired.append((Alert(rule=rule, key=key, severity=finding.severity, title=finding.title[:200],
                                summary=finding.summary, details=finding.details, host_id=finding.host_id,
                                gpu_id=finding.gpu_id, first_seen=now, last_seen=now, silenced=quiet),
                          finding))
        else:
            new_values = (finding.severity, finding.title[:200], finding.summary, finding.details, quiet)
            if (alert.severity, alert.title, alert.summary, alert.details, alert.silenced) != new_values:
                changed_ids.add(alert.pk)
                alert.severity, alert.title, alert.summary, alert.details, alert.silenced = new_values
            alert.last_seen = now
            kept.append(alert)
    if kept:
        # Most evaluations change nothing but `last_seen`: one UPDATE for those, a bulk update of
        # the few whose text, severity or silence changed.
        Alert.objects.filter(pk__in=[alert.pk for alert in kept]).update(last_seen=now)
        changed = [alert for alert in kept if alert.pk in changed_ids]
        if changed:
            Alert.objects.bulk_update(changed, ["severity", "title", "summary", "details", "silenced"])
    new = Alert.objects.bulk_create([alert for alert, _ in fired])
    links = [Alert.vms.through(alert_id=alert.pk, virtualmachine_id=vm_id)
             for alert, (_, finding) in zip(new, fired, strict=True) for vm_id in finding.vm_ids]
    Alert.vms.through.objects.bulk_create(links, ignore_conflicts=True)
    gone = [alert for key, alert in open_alerts.items() if key not in by_key]
    for alert in gone:
        alert.state, alert.resolved_at = AlertState.RESOLVED, now
        alert.silenced = silenced(silences, alert.rule_id, alert.key, alert.host_id, alert.gpu_id)
    if gone:
        Alert.objects.bulk_update(gone, ["state", "resolved_at", "silenced"])
    announce([(alert, "firing", finding.vm_ids) for alert, (_, finding) in zip(new, fired, strict=True)
              if not alert.silenced] + [(alert, "resolved", ()) for alert in gone if not alert.silenced])
    return new, gone


def alert_url(alert: Alert) -> str:
    return reverse("alerts:alert", args=[alert.pk])


def message_of(alert: Alert, event: str, vm_ids: tuple[int, ...]) -> Message:
    title = alert.title if event == "firing" else f"Resolved: {alert.title}"
    return Message(key=f"alert:{alert.pk}", event=event, severity=alert.severity, rule=alert.rule.kind,
                   title=title, body=alert.summary, url=alert_url(alert),
                   data={"alert": alert.pk, "rule": alert.rule.kind, "state": alert.state, "key": alert.key,
                         "host": alert.host_id, "gpu": alert.gpu_id, "vms": list(vm_ids),
                         "first_seen": alert.first_seen.isoformat(), "details": alert.details})


def announce(events: list[tuple[Alert, str, tuple[int, ...]]]) -> None:
    """The admins' channels for every event (one batch of deliveries); and for each VM under a
    firing alert of ARTIST_RULES, one note to its artist about that VM only (the first such alert
    of this evaluation names the problem: an alert storm is one note per VM, not one per alert)."""
    if not events:
        return
    dispatch_many([message_of(alert, event, vm_ids) for alert, event, vm_ids in events])
    note_of_vm: dict[int, str] = {}
    for alert, event, vm_ids in events:
        if event == "firing" and alert.rule.kind in ARTIST_RULES:
            for vm_id in vm_ids:
                note_of_vm.setdefault(vm_id, _artist_note(alert))
    if not note_of_vm:
        return
    by_note: dict[str, list[VirtualMachine]] = {}
    for vm in VirtualMachine.objects.filter(pk__in=note_of_vm, artist__user__isnull=False).select_related(
            "artist__user"):
        by_note.setdefault(note_of_vm[vm.pk], []).append(vm)
    for note, vms in by_note.items():
        tell_artists(vms, note)


def _artist_note(alert: Alert) -> str:
    """What an artist reads about a problem under their VM: what happens to them, no other VM named."""
    kind = alert.rule.kind
    if kind == "vgpu_fb_full":
        return ("Your VM {vm} is nearly out of GPU memory (frame buffer). Save your work; IT has been told and can "
                "give the VM a larger profile.")
    if kind == "vgpu_unlicensed":
        return ("Your VM {vm} runs without a GPU licence, so it is slowed down. IT has been told and is on it.")
    return ("The GPU under your VM {vm} reported a problem (" + rulebook.RULES[kind].title.lower() + "). IT has been "
            "told; save your work, you may be moved to another GPU.")


def record_licence_usage(facts: rulebook.Facts, now: datetime) -> None:
    """One point a minute per edition of the licence-use series (from this evaluation's counts)."""
    counts = dict(facts.licence_counts)
    for pool in facts.pools:
        counts.setdefault(pool.edition, (0, 0))
    if not counts:
        return
    minute = now.replace(second=0, microsecond=0)
    LicenceUsage.objects.bulk_create(
        [LicenceUsage(ts=minute, edition=edition, in_use=used, unlicensed=lapsed)
         for edition, (used, lapsed) in counts.items()], ignore_conflicts=True)


#: Evaluations are kept a day: enough to see how long they take and whether one failed.
KEEP_EVALUATIONS = timedelta(days=1)


def prune(now: datetime | None = None) -> dict[str, int]:
    """Delete resolved alerts and licence-use points older than ALERTS_KEEP_DAYS, and evaluations
    older than a day. Open alerts are never deleted, however old."""
    now = now or utc_now()
    horizon = now - timedelta(days=settings.ALERTS_KEEP_DAYS)
    alerts, _ = Alert.objects.filter(state=AlertState.RESOLVED, resolved_at__lt=horizon).delete()
    usage, _ = LicenceUsage.objects.filter(ts__lt=horizon).delete()
    evaluations, _ = Evaluation.objects.filter(started_at__lt=now - KEEP_EVALUATIONS).delete()
    return {"alerts": alerts, "licence_usage": usage, "evaluations": evaluations}

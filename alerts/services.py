"""What admins do to alerts, each recorded in the audit log: acknowledge, tune a rule, silence,
end a silence, and set how many licences the studio owns. Views and the API call these."""

from __future__ import annotations

from datetime import datetime

from django.db import transaction
from django.utils import timezone

from alerts.models import OPEN_STATES, Alert, AlertRule, AlertState, LicencePool, Silence
from config.errors import ConflictRefusal
from fleet import audit
from fleet.locks import lock_rows

RULE_FIELDS = ["kind", "enabled", "severity", "params"]
SILENCE_FIELDS = ["rule", "host", "gpu", "alert", "reason", "starts_at", "ends_at"]
ALERT_FIELDS = ["state", "acknowledged_at", "acknowledged_by", "note"]


def acknowledge(alert: Alert, user, note: str = "") -> Alert:
    """Mark an open alert as taken by `user` (it stays open until its condition ends)."""
    with transaction.atomic():
        (alert,) = lock_rows(Alert.objects.filter(pk=alert.pk))
        if alert.state not in OPEN_STATES:
            raise ConflictRefusal(f"This alert was resolved at {alert.resolved_at:%Y-%m-%d %H:%M} UTC; there is "
                                  f"nothing to acknowledge.")
        before = audit.snapshot(alert, ALERT_FIELDS)
        alert.state, alert.acknowledged_at, alert.acknowledged_by = AlertState.ACKNOWLEDGED, timezone.now(), user
        alert.note = note.strip() or alert.note
        alert.save(update_fields=["state", "acknowledged_at", "acknowledged_by", "note"])
        audit.record("alert.acknowledge", alert, before=before, after=audit.snapshot(alert, ALERT_FIELDS))
    return alert


def update_rule(rule: AlertRule, *, enabled: bool | None = None, severity: str | None = None,
                params: dict | None = None) -> AlertRule:
    """Change a rule's switch, severity or thresholds (checked against the rule's bounds)."""
    before = audit.snapshot(rule, RULE_FIELDS)
    if enabled is not None:
        rule.enabled = enabled
    if severity is not None:
        rule.severity = severity
    if params is not None:
        rule.params = {**(rule.params or {}), **params}
    rule.full_clean()
    with transaction.atomic():
        rule.save()
        after = audit.snapshot(rule, RULE_FIELDS)
        if audit.changed(before, after):
            audit.record("alert_rule.update", rule, before=before, after=after)
    return rule


def create_silence(user, *, reason: str, ends_at: datetime, rule: AlertRule | None = None, host=None, gpu=None,
                   alert: Alert | None = None, starts_at: datetime | None = None) -> Silence:
    silence = Silence(rule=rule, host=host, gpu=gpu, alert=alert, reason=(reason or "").strip(),
                      starts_at=starts_at or timezone.now(), ends_at=ends_at, created_by=user)
    silence.full_clean()
    with transaction.atomic():
        silence.save()
        audit.record("silence.create", silence, after=audit.snapshot(silence, SILENCE_FIELDS))
    return silence


def end_silence(silence: Silence) -> Silence:
    """End a silence now (kept, for the record); one that already ended is left as it was."""
    now = timezone.now()
    if silence.ends_at <= now:
        return silence
    before = audit.snapshot(silence, SILENCE_FIELDS)
    silence.ends_at = max(now, silence.starts_at + timezone.timedelta(microseconds=1))
    with transaction.atomic():
        silence.save(update_fields=["ends_at"])
        audit.record("silence.end", silence, before=before, after=audit.snapshot(silence, SILENCE_FIELDS))
    return silence


def set_pool(edition: str, owned: int, note: str = "") -> LicencePool:
    pool = LicencePool.objects.filter(edition=edition).first()
    before = audit.snapshot(pool) if pool else None
    pool = pool or LicencePool(edition=edition)
    pool.owned, pool.note = owned, note
    pool.full_clean(validate_unique=False)
    with transaction.atomic():
        pool.save()
        after = audit.snapshot(pool)
        if audit.changed(before, after):
            audit.record("licence_pool.create" if before is None else "licence_pool.update", pool,
                         before=before, after=after)
    return pool

"""The alerts app's beat entry, created once after migrate (as `telemetry.schedules` does): an
entry that exists is the admin's to change."""

from __future__ import annotations

from django.conf import settings
from django.db import DEFAULT_DB_ALIAS

from fleet.beat import beat_tables_ready, ensure_periodic_task

EVALUATE_ALERTS = "evaluate_alerts"
PRUNE_ALERTS = "prune_alerts"
PRUNE_EVERY_S = 3600


def ensure_default_schedules(using: str = DEFAULT_DB_ALIAS, **kwargs) -> None:
    """post_migrate hook: `evaluate_alerts` every ALERTS_EVALUATION_INTERVAL_S and `prune_alerts`
    hourly, each expiring before its next run."""
    if not beat_tables_ready(using):
        return
    every = settings.ALERTS_EVALUATION_INTERVAL_S
    ensure_periodic_task(EVALUATE_ALERTS, "alerts.tasks.evaluate_alerts", every, expires_s=every * 0.9)
    ensure_periodic_task(PRUNE_ALERTS, "alerts.tasks.prune_alerts", PRUNE_EVERY_S, expires_s=PRUNE_EVERY_S * 0.9)

"""The notify app's beat entries, created once after migrate (`fleet.beat`): an entry that exists
is the admin's to change."""

from __future__ import annotations

from django.db import DEFAULT_DB_ALIAS

from fleet.beat import beat_tables_ready, ensure_periodic_task

SEND_DUE_DELIVERIES = "send_due_deliveries"
PRUNE_DELIVERIES = "prune_deliveries"
#: How often beat hands out due retries and deliveries whose worker was lost.
SEND_DUE_EVERY_S = 30
PRUNE_EVERY_S = 3600


def ensure_default_schedules(using: str = DEFAULT_DB_ALIAS, **kwargs) -> None:
    """post_migrate hook: `send_due_deliveries` every SEND_DUE_EVERY_S and `prune_deliveries`
    hourly, each expiring before its next run."""
    if not beat_tables_ready(using):
        return
    ensure_periodic_task(SEND_DUE_DELIVERIES, "notify.tasks.send_due_deliveries", SEND_DUE_EVERY_S,
                         expires_s=SEND_DUE_EVERY_S - 5)
    ensure_periodic_task(PRUNE_DELIVERIES, "notify.tasks.prune_deliveries", PRUNE_EVERY_S,
                         expires_s=PRUNE_EVERY_S - 300)

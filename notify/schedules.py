"""The notify app's beat entries, created once after migrate (like `telemetry.schedules`, which
this app sits below and so cannot import): an entry that exists is the admin's to change."""

from __future__ import annotations

from django.db import DEFAULT_DB_ALIAS, connections, transaction

SEND_DUE_DELIVERIES = "send_due_deliveries"
PRUNE_DELIVERIES = "prune_deliveries"
#: How often beat hands out due retries and deliveries whose worker was lost.
SEND_DUE_EVERY_S = 30
PRUNE_EVERY_S = 3600


def _ensure(name: str, task: str, every_s: int, expires_s: int) -> None:
    from django_celery_beat.models import IntervalSchedule, PeriodicTask

    with transaction.atomic():
        if PeriodicTask.objects.filter(name=name).exists():
            return
        interval, _ = IntervalSchedule.objects.get_or_create(every=every_s, period=IntervalSchedule.SECONDS)
        PeriodicTask.objects.create(name=name, task=task, interval=interval, expire_seconds=expires_s,
                                    description=f"Created by notify.schedules; interval {every_s} s by default.")


def ensure_default_schedules(using: str = DEFAULT_DB_ALIAS, **kwargs) -> None:
    """post_migrate hook: `send_due_deliveries` every SEND_DUE_EVERY_S and `prune_deliveries`
    hourly, each expiring before its next run."""
    from django_celery_beat.models import PeriodicTask

    if using != DEFAULT_DB_ALIAS or PeriodicTask._meta.db_table not in connections[using].introspection.table_names():
        return
    _ensure(SEND_DUE_DELIVERIES, "notify.tasks.send_due_deliveries", SEND_DUE_EVERY_S, SEND_DUE_EVERY_S - 5)
    _ensure(PRUNE_DELIVERIES, "notify.tasks.prune_deliveries", PRUNE_EVERY_S, PRUNE_EVERY_S - 300)

"""Beat entries (django-celery-beat's PeriodicTask rows) that each app creates after migrate:
one helper for all of them, below every app that has periodic tasks. An entry that exists is
the admin's to change, so a later migrate never resets an interval an admin edited, nor
re-enables a task they switched off.
"""

from __future__ import annotations

import math

from django.db import DEFAULT_DB_ALIAS, connections, transaction

from fleet import locks


def ensure_periodic_task(name: str, task: str, every_s: float, expires_s: float | None = None):
    """Create the periodic task `name` (running `task` every `every_s` seconds, each run
    discarded if not started within `expires_s`) unless it exists; return (PeriodicTask, created).

    Beat entries must expire before their next run (STYLE.md), so a backlog after a worker
    outage does not replay every missed run at once: `expires_s` defaults to 90% of the
    interval. An existing entry keeps its schedule; only a renamed `task` path is updated.
    """
    from django_celery_beat.models import IntervalSchedule, PeriodicTask

    every = max(1, math.ceil(every_s))
    if expires_s is None:
        expires_s = every * 0.9
    with transaction.atomic():
        existing = next(iter(locks.lock_rows(PeriodicTask.objects.filter(name=name))), None)
        if existing is not None:
            if existing.task != task:
                existing.task = task
                existing.save(update_fields=["task"])
            return existing, False
        interval, _ = IntervalSchedule.objects.get_or_create(every=every, period=IntervalSchedule.SECONDS)
        periodic = PeriodicTask.objects.create(
            name=name, task=task, interval=interval, expire_seconds=max(1, int(expires_s)),
            description=f"Created by {task.split('.')[0]}.schedules; interval {every} s by default.",
        )
        return periodic, True


def beat_tables_ready(using: str) -> bool:
    """Whether a post_migrate hook of `using` may write beat entries: only on the default
    database, and only once django_celery_beat's tables exist (`migrate` of a single app may
    run before them)."""
    from django_celery_beat.models import PeriodicTask

    return using == DEFAULT_DB_ALIAS and PeriodicTask._meta.db_table in connections[using].introspection.table_names()

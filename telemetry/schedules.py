"""Periodic tasks of the telemetry app, kept in the database so admins edit them in the admin site.

Beat runs with django-celery-beat's DatabaseScheduler. `ensure_default_schedules` runs after
every `migrate` (connected in `TelemetryConfig.ready`) and creates the entries that are
missing; an entry that exists is the admin's to change, so a later migrate never resets an
interval an admin edited, nor re-enables a task they switched off.
"""

from __future__ import annotations

import math

from django.conf import settings
from django.db import DEFAULT_DB_ALIAS, connections, transaction

from fleet import locks

POLL_AGENTS = "poll_agents"
BUILD_ROLLUPS_EVERY_S = 60
PRUNE_SAMPLES_EVERY_S = 3600


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
            description=f"Created by telemetry.schedules; interval {every} s by default.",
        )
        return periodic, True


def beat_tables_ready(using: str) -> bool:
    """Whether a post_migrate hook of `using` may write beat entries: only on the default
    database, and only once django_celery_beat's tables exist (`migrate` of a single app may
    run before them)."""
    from django_celery_beat.models import PeriodicTask

    return using == DEFAULT_DB_ALIAS and PeriodicTask._meta.db_table in connections[using].introspection.table_names()


def ensure_default_schedules(using: str = DEFAULT_DB_ALIAS, **kwargs) -> None:
    """post_migrate hook: the telemetry app's periodic tasks, created once (see module doc).

    Other telemetry features add their entries here with `ensure_periodic_task`.
    """
    if not beat_tables_ready(using):
        return
    interval = settings.TELEMETRY_POLL_INTERVAL_S
    ensure_periodic_task(POLL_AGENTS, "telemetry.tasks.poll_agents", interval, expires_s=interval * 0.9)
    ensure_rollup_schedules()


def ensure_rollup_schedules() -> None:
    """The beat entries of the rollups (every minute) and retention (hourly), created once; each
    expires before its next run so a backlog never replays missed runs."""
    ensure_periodic_task("build_rollups", "telemetry.rollup_tasks.build_rollups", BUILD_ROLLUPS_EVERY_S,
                         expires_s=BUILD_ROLLUPS_EVERY_S - 5)
    ensure_periodic_task("prune_samples", "telemetry.rollup_tasks.prune_samples", PRUNE_SAMPLES_EVERY_S,
                         expires_s=PRUNE_SAMPLES_EVERY_S - 300)

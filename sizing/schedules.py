"""Periodic tasks of sizing, created after `migrate` (connected in `SizingConfig.ready`).

Like telemetry's (`telemetry.schedules`), an entry is created once and is then the admin's to
change in the admin site: a later migrate never resets its interval nor re-enables it.
"""

from __future__ import annotations

from django.db import DEFAULT_DB_ALIAS, connections

from fleet.beat import ensure_periodic_task

REFRESH_SUGGESTIONS = "refresh_suggestions"
REFRESH_SUGGESTIONS_TASK = "sizing.tasks.refresh_suggestions"
#: Hourly: the rollups the suggestions read are hourly too.
REFRESH_SUGGESTIONS_EVERY_S = 3600
#: A run not started within 55 minutes is dropped; the next one is due soon after.
REFRESH_SUGGESTIONS_EXPIRES_S = REFRESH_SUGGESTIONS_EVERY_S - 300


def ensure_default_schedules(using: str = DEFAULT_DB_ALIAS, **kwargs) -> None:
    """post_migrate hook: the hourly refresh of the right-sizing suggestions, created once."""
    from django_celery_beat.models import PeriodicTask

    if using != DEFAULT_DB_ALIAS:
        return
    # `migrate` of a single app may run before django_celery_beat's tables exist.
    if PeriodicTask._meta.db_table not in connections[using].introspection.table_names():
        return
    ensure_periodic_task(REFRESH_SUGGESTIONS, REFRESH_SUGGESTIONS_TASK, REFRESH_SUGGESTIONS_EVERY_S,
                         expires_s=REFRESH_SUGGESTIONS_EXPIRES_S)

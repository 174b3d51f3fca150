"""Periodic tasks of the telemetry app, kept in the database so admins edit them in the admin site.

Beat runs with django-celery-beat's DatabaseScheduler. `ensure_default_schedules` runs after
every `migrate` (connected in `TelemetryConfig.ready`) and creates the entries that are
missing; an entry that exists is the admin's to change, so a later migrate never resets an
interval an admin edited, nor re-enables a task they switched off.
"""

from __future__ import annotations

from django.conf import settings
from django.db import DEFAULT_DB_ALIAS

from fleet.beat import beat_tables_ready, ensure_periodic_task

POLL_AGENTS = "poll_agents"
BUILD_ROLLUPS_EVERY_S = 60
PRUNE_SAMPLES_EVERY_S = 3600
# Cheap when nothing is missing (a catalog read); hourly, so a restarted beat catches up soon.
CREATE_PARTITIONS_EVERY_S = 3600


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
    """The beat entries of the rollups (every minute), retention and the sample partitions
    created ahead (hourly), created once; each expires before its next run so a backlog never
    replays missed runs."""
    ensure_periodic_task("build_rollups", "telemetry.rollup_tasks.build_rollups", BUILD_ROLLUPS_EVERY_S,
                         expires_s=BUILD_ROLLUPS_EVERY_S - 5)
    ensure_periodic_task("prune_samples", "telemetry.rollup_tasks.prune_samples", PRUNE_SAMPLES_EVERY_S,
                         expires_s=PRUNE_SAMPLES_EVERY_S - 300)
    ensure_periodic_task("create_sample_partitions", "telemetry.rollup_tasks.create_sample_partitions",
                         CREATE_PARTITIONS_EVERY_S, expires_s=CREATE_PARTITIONS_EVERY_S - 300)

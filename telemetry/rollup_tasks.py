"""Celery tasks of the rollups and retention: thin wrappers of `telemetry.rollups` and
`telemetry.retention`, loaded by the worker through CELERY_IMPORTS; their beat entries are telemetry.schedules'.

`create_sample_partitions` keeps the raw sample tables' day partitions ahead of time
(PostgreSQL; `telemetry.partitions`).

All are safe to run twice or at once: rollups are upserted and their checkpoints only move
forward; retention deletes by age in small committed batches or drops whole expired day
partitions; a partition that exists is not created again. A run cut short by its soft time
limit keeps what it committed (whole buckets, whole batches) and the next run goes on.
"""

from __future__ import annotations

import logging

from celery import shared_task
from celery.exceptions import SoftTimeLimitExceeded
from django.utils import timezone

from telemetry import heatmap, partitions, retention, rollups
from telemetry.models import ROLLUP_STEPS_S

logger = logging.getLogger(__name__)


@shared_task(ignore_result=True, soft_time_limit=45, time_limit=55)
def build_rollups(step_s: int | None = None) -> dict:
    """Build the complete 5-minute and hourly buckets not built yet (or only `step_s`'s);
    returns per series what it did (for logs and tests; results are not stored)."""
    steps = ROLLUP_STEPS_S if step_s is None else (int(step_s),)
    done = {}
    try:
        for step in steps:
            done[str(step)] = rollups.build_rollups(step).as_dict()
    except SoftTimeLimitExceeded:
        # The bucket in progress rolled back with its transaction; its checkpoint did not move.
        logger.warning("build_rollups hit its time limit after %s; the next run goes on", sorted(done))
        return done
    if any(series["rows"] for result in done.values() for series in result["series"]):
        _warm_heatmap()
    return done


def _warm_heatmap() -> None:
    """The heatmap page's first view, computed now that the rollups moved (its cached answer was
    just made stale), so admins opening the page get it at once. A failure here is logged: the
    rollups are built and the page computes the heatmap itself."""
    try:
        heatmap.warm_page_heatmap(timezone.now())
    except SoftTimeLimitExceeded:
        logger.warning("build_rollups: no time left to warm the heatmap page")
    except Exception:
        logger.exception("build_rollups: warming the heatmap page failed")


@shared_task(ignore_result=True, soft_time_limit=900, time_limit=960)
def prune_samples() -> dict:
    """Delete raw samples and rollups past their retention, in batches; returns rows deleted."""
    try:
        return retention.prune_samples()
    except SoftTimeLimitExceeded:
        logger.warning("prune_samples hit its time limit; the next run goes on")
        return {}


@shared_task(ignore_result=True, soft_time_limit=300, time_limit=330)
def create_sample_partitions() -> dict:
    """PostgreSQL: create the raw sample tables' day partitions up to
    TELEMETRY_PARTITION_DAYS_AHEAD days ahead, and give rows waiting in the DEFAULT partition
    their day's; returns what it created and moved (nothing on SQLite)."""
    return partitions.ensure_partitions()

"""Retention: raw samples and rollups older than their settings are deleted, in batches.

- raw GPU, vGPU and guest samples: TELEMETRY_RETENTION_RAW_DAYS, but never a sample that a rollup
  series has not passed yet (its 5-minute and hourly checkpoints, less the late window those
  series still rebuild), so a stalled rollup task loses no data: retention waits for it;
- XID errors (`XidError`): TELEMETRY_RETENTION_RAW_DAYS after they arrived, like the raw
  samples they happened among; nothing rolls them up, so no checkpoint holds them back;
- 5-minute rollups: TELEMETRY_RETENTION_5M_DAYS, and with them the heatmap strips of the UTC
  days they covered (`telemetry.strips`); hourly rollups: TELEMETRY_RETENTION_1H_DAYS;
- audit events: AUDIT_RETENTION_DAYS when above 0; by default (0) the log is kept forever, as
  an audit trail usually must be.

Each statement deletes at most TELEMETRY_PRUNE_BATCH rows picked by id
(`DELETE ... WHERE id IN (SELECT id ... LIMIT n)`) and commits on its own, so pruning a month
of backlog never holds a long lock against ingest or the rollup build.

On PostgreSQL the raw sample tables are partitioned by day (`telemetry.partitions`): a day
partition is dropped whole once it ends at or before the raw cutoff above (age and rollup
checkpoints alike), so a day of samples goes in one statement instead of millions of row
deletes; rows of the DEFAULT partition (samples that arrived before their day had a partition)
are deleted in batches. Raw samples are kept up to a day longer than
TELEMETRY_RETENTION_RAW_DAYS there, until their whole day has expired.
"""

from __future__ import annotations

import logging
from datetime import datetime, timedelta

from django.conf import settings
from django.db.models import Model, QuerySet
from django.utils import timezone

from fleet.models import AuditEvent
from telemetry import partitions, strips
from telemetry.aggregation import bucket_floor
from telemetry.models import (
    ROLLUP_STEPS_S,
    GpuRollup,
    GpuSample,
    GuestRollup,
    GuestSample,
    RollupCheckpoint,
    VgpuSample,
    VmRollup,
    XidError,
)
from telemetry.rollups import checkpoint_name

logger = logging.getLogger(__name__)


def delete_in_batches(queryset: QuerySet, batch_size: int, max_batches: int | None = None) -> int:
    """Delete the rows of `queryset`, `batch_size` ids per statement (each its own transaction);
    return how many went. Stops after `max_batches` statements when given."""
    model: type[Model] = queryset.model
    deleted = batches = 0
    ids = queryset.order_by().values("pk")
    while max_batches is None or batches < max_batches:
        # The models pruned here (samples, XID errors, rollups, audit events) have no dependents and no signals,
        # so this is one plain DELETE.
        count, _ = model.objects.filter(pk__in=ids[:batch_size]).delete()
        deleted += count
        batches += 1
        if count < batch_size:
            break
    return deleted


def raw_cutoff(kind: str, now: datetime) -> datetime | None:
    """Raw samples of `kind` ("gpu", "vm" or "guest") stamped before this may go: the older of the age
    limit and what every rollup series of that kind has finished. None when a series has never
    run (nothing is rolled up, nothing may go)."""
    # Whole hours, so a bucket is never left half pruned (a rewound rebuild would then undercount).
    cutoff = bucket_floor(now - timedelta(days=settings.TELEMETRY_RETENTION_RAW_DAYS), max(ROLLUP_STEPS_S))
    late = timedelta(seconds=settings.TELEMETRY_ROLLUP_LATE_S)
    done = dict(RollupCheckpoint.objects.filter(
        name__in=[checkpoint_name(kind, step) for step in ROLLUP_STEPS_S],
    ).values_list("name", "done_until"))
    for step_s in ROLLUP_STEPS_S:
        until = done.get(checkpoint_name(kind, step_s))
        if until is None:
            return None
        # The series still rebuilds the bucket that closed within the late window: keep its samples.
        cutoff = min(cutoff, bucket_floor(until - late, step_s) if late else until)
    return cutoff


def prune_samples(now: datetime | None = None, batch_size: int | None = None,
                  max_batches: int | None = None) -> dict[str, int]:
    """Delete what retention allows (see the module docstring); return rows deleted per kind,
    and on PostgreSQL the day partitions of samples dropped whole (`gpu_sample_partitions`,
    `vgpu_sample_partitions`; their rows are not counted, which would cost a scan of each)."""
    now = now or timezone.now()
    batch_size = batch_size or settings.TELEMETRY_PRUNE_BATCH
    deleted = {}
    for name, model, kind in (("gpu_samples", GpuSample, "gpu"), ("vgpu_samples", VgpuSample, "vm"),
                              ("guest_samples", GuestSample, "guest")):
        cutoff = raw_cutoff(kind, now)
        table = model._meta.db_table
        if partitions.is_partitioned(table):
            deleted[f"{name[:-1]}_partitions"] = partitions.drop_partitions_before(table, cutoff) if cutoff else 0
            deleted[name] = partitions.delete_from_default(table, cutoff, batch_size, max_batches) if cutoff else 0
            continue
        deleted[name] = (
            delete_in_batches(model.objects.filter(ts__lt=cutoff), batch_size, max_batches) if cutoff else 0
        )
    # By arrival, not by the agent's stamp: a host with a wrong clock must not keep its errors
    # forever or lose them at once (and `received_at` is indexed for this).
    deleted["xid_errors"] = delete_in_batches(XidError.objects.filter(
        received_at__lt=now - timedelta(days=settings.TELEMETRY_RETENTION_RAW_DAYS)), batch_size, max_batches)
    for step_s, days in ((300, settings.TELEMETRY_RETENTION_5M_DAYS), (3600, settings.TELEMETRY_RETENTION_1H_DAYS)):
        cutoff = now - timedelta(days=days)
        for name, model in (("gpu_rollups", GpuRollup), ("vm_rollups", VmRollup), ("guest_rollups", GuestRollup)):
            key = f"{name}_{step_s}"
            deleted[key] = delete_in_batches(
                model.objects.filter(step_s=step_s, bucket__lt=cutoff), batch_size, max_batches,
            )
        if step_s == 300:
            deleted["gpu_strips"] = delete_in_batches(strips.expired(cutoff), batch_size, max_batches)
            strips.uncover_before(cutoff)
    deleted["audit_events"] = 0
    if settings.AUDIT_RETENTION_DAYS > 0:
        cutoff = now - timedelta(days=settings.AUDIT_RETENTION_DAYS)
        deleted["audit_events"] = delete_in_batches(AuditEvent.objects.filter(at__lt=cutoff), batch_size, max_batches)
    if any(deleted.values()):
        logger.info("retention deleted %s", deleted)
    return deleted

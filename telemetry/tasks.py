"""Celery tasks of telemetry collection (logic in `telemetry.collect`).

STYLE.md, Celery tasks: ids and primitives in, JSON on the wire, no result kept, time limits
on every task, safe to run twice (claims by conditional update, conflict-ignoring inserts).
`poll_agents` is beat's entry (created by `telemetry.schedules`, expiring before the next
tick); each `poll_batch` it sends expires before the next tick too, so after a worker outage
the queue does not replay a backlog of stale polls: the claim lapses and the next tick
polls afresh. With TELEMETRY_COLLECT_SHARDS above 1 the batches of each shard go to that shard's
queue (`telemetry.shards`), consumed by the workers given it. Time limits apply under the
prefork pool; the thread pool of `make run` ignores them, which is why every fetch also
enforces its own deadline.
"""

from __future__ import annotations

import logging

from celery import shared_task
from django.conf import settings
from django.db import transaction

from telemetry import collect, shards

logger = logging.getLogger(__name__)


@shared_task(name="telemetry.tasks.poll_agents", ignore_result=True, soft_time_limit=30, time_limit=60)
def poll_agents() -> dict:
    """Claim the agents due now and send one poll_batch per TELEMETRY_BATCH_SIZE of them, each to
    its shard's queue when collection is sharded (else to the default queue)."""
    ids = collect.claim_due_agents()
    count = settings.TELEMETRY_COLLECT_SHARDS
    if count == 1:
        messages = [(batch, {}) for batch in collect.shard(ids)]
    else:
        messages = [(batch, {"queue": shards.queue_name(settings.CELERY_TASK_DEFAULT_QUEUE, shard)})
                    for shard, share in shards.split(ids, count).items() for batch in collect.shard(share)]
    expires = collect.poll_interval_s() * collect.CLAIM_FRACTION

    def send():
        for batch, routing in messages:
            poll_batch.apply_async(args=[batch], expires=expires, **routing)

    # The claim is committed (claim_due_agents' own transaction) before any batch is sent.
    transaction.on_commit(send)
    if ids:
        logger.info("poll_agents: %d agents in %d batch(es) over %d shard(s)", len(ids), len(messages), count)
    return {"agents": len(ids), "batches": len(messages)}


@shared_task(name="telemetry.tasks.poll_batch", ignore_result=True, soft_time_limit=60, time_limit=90)
def poll_batch(agent_ids: list[int]) -> dict:
    """Poll these agents concurrently and store their samples in one call; see collect.poll_batch."""
    result = collect.poll_batch(agent_ids)
    for name, error in sorted(result.errors.items()):
        logger.warning("agent %s: %s", name, error)
    logger.info("poll_batch: %d agents, %d ok, %d failed, %d GPU and %d vGPU samples",
                result.polled, result.ok, result.failed, result.gpu_samples, result.vgpu_samples)
    return result.as_dict()

"""Celery tasks of the notify app (logic in `notify.services`).

`deliver` sends one delivery (a second run finds it taken or done and does nothing);
`send_due_deliveries` (beat, every SEND_DUE_EVERY_S) hands out due retries and deliveries whose
worker was lost; `prune_deliveries` (beat, hourly) deletes sent ones older than NOTIFY_KEEP_DAYS.
"""

from __future__ import annotations

import logging

from celery import shared_task

from notify import services

logger = logging.getLogger(__name__)


@shared_task(name="notify.tasks.deliver", ignore_result=True, acks_late=True, reject_on_worker_lost=True,
             soft_time_limit=120, time_limit=150)
def deliver(delivery_id: int) -> None:
    """Send one delivery, or nothing when another worker has it or it is not due."""
    services.attempt(delivery_id)


@shared_task(name="notify.tasks.send_due_deliveries", ignore_result=True, soft_time_limit=20, time_limit=25)
def send_due_deliveries() -> int:
    """Enqueue the deliveries due now (retries, lost ones); returns how many."""
    ids = services.send_due()
    if ids:
        logger.info("send_due_deliveries: %d delivery(ies) handed out", len(ids))
    return len(ids)


@shared_task(name="notify.tasks.prune_deliveries", ignore_result=True, soft_time_limit=240, time_limit=300)
def prune_deliveries() -> int:
    """Delete sent deliveries older than NOTIFY_KEEP_DAYS; returns how many."""
    return services.prune_deliveries()

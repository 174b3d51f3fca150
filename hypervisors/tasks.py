"""Celery tasks of the hypervisors app: running operations, and resuming those whose time came or
whose worker was lost."""

from __future__ import annotations

from celery import shared_task

from hypervisors import operations

# An operation's own length is bounded by its steps (a shutdown waits at most
# HYPERVISOR_SHUTDOWN_TIMEOUT_S); the hard limit only stops a run that hangs in a call.
OPERATION_TIME_LIMIT_S = 3600


@shared_task(name="hypervisors.tasks.run_operation", ignore_result=True, acks_late=True,
             reject_on_worker_lost=True, soft_time_limit=OPERATION_TIME_LIMIT_S - 60,
             time_limit=OPERATION_TIME_LIMIT_S)
def run_operation(operation_id: int) -> None:
    """Run or resume one operation; a second delivery finds it taken (or ended) and does nothing."""
    operations.run(operation_id)


@shared_task(name="hypervisors.tasks.resume_operations", ignore_result=True, soft_time_limit=20, time_limit=30)
def resume_operations() -> int:
    """Enqueue the operations due now (window opened, run asked) or left by a lost worker."""
    return len(operations.resume_due())

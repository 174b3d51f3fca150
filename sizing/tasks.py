"""Celery tasks of sizing (logic in `sizing.suggestions` and `sizing.optimizer_runs`).

STYLE.md, Celery tasks: ids and primitives in, JSON on the wire, no result kept, time limits
on every task, safe to run twice.
"""

from __future__ import annotations

import logging

from celery import shared_task
from celery.exceptions import SoftTimeLimitExceeded

from sizing import optimizer_runs, suggestions

logger = logging.getLogger(__name__)


# --- placement optimizer ---


@shared_task(
    name=optimizer_runs.RUN_OPTIMIZER_TASK, ignore_result=True,
    soft_time_limit=optimizer_runs.TASK_SOFT_TIME_LIMIT_S, time_limit=optimizer_runs.TASK_TIME_LIMIT_S,
)
def run_optimizer(run_id: int) -> str:
    """Compute the plan of one queued optimizer run; see optimizer_runs.execute_run.

    Safe to deliver twice: only the delivery that claims the queued run computes it.
    """
    status = optimizer_runs.execute_run(run_id)
    logger.info("run_optimizer: run %s %s", run_id, status)
    return status


# --- right-sizing suggestions ---


@shared_task(name="sizing.tasks.refresh_suggestions", ignore_result=True, soft_time_limit=900, time_limit=960)
def refresh_suggestions(vm_ids: list[int] | None = None) -> dict:
    """Recompute the right-sizing suggestions (of `vm_ids`, or of every VM holding vGPUs);
    returns the counts per action (for logs and tests; results are not stored).

    Beat's hourly entry (`sizing.schedules`). Safe to run twice or at once: suggestions are
    upserted on their VM. A run cut short by its soft time limit writes nothing (the writes come
    last, in one transaction) and the next run starts afresh.
    """
    try:
        counts = suggestions.refresh_suggestions(vm_ids=vm_ids)
    except SoftTimeLimitExceeded:
        logger.warning("refresh_suggestions hit its time limit before writing; the next run starts afresh")
        return {}
    logger.info("refresh_suggestions: %s", ", ".join(f"{n} {name}" for name, n in counts.items()))
    return counts

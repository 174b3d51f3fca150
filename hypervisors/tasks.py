"""Celery tasks of the hypervisors app (logic in `hypervisors.services` and `hypervisors.operations`).

`run_operation` runs or resumes one operation; `resume_operations` (beat) enqueues those whose
time came or whose worker was lost.

`sync_hypervisors` is beat's entry (created by `hypervisors.schedules` after migrate): every
linked host's hypervisor is checked and read, and its diff against the inventory stored for
the host page and the API; nothing is applied without an admin. `read_guest_stats` (beat) hands
the linked hosts to `read_guest_stats_hosts` tasks in chunks, which read the guest CPU and memory
of their running VMs (`hypervisors.guest_stats`). One host's failure is its own
report and status; the others go on. The soft limit stops the run between two hosts (those
left are read at the next run); the hard limit ends a run stuck in one host's call.
"""

from __future__ import annotations

import logging
import time

from celery import shared_task
from celery.exceptions import SoftTimeLimitExceeded
from django.conf import settings

from hypervisors import guest_stats, operations, services
from hypervisors.models import SyncTrigger

logger = logging.getLogger(__name__)

SOFT_TIME_LIMIT_S = 240
TIME_LIMIT_S = 300
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


@shared_task(name="hypervisors.tasks.sync_hypervisors", ignore_result=True, soft_time_limit=SOFT_TIME_LIMIT_S,
             time_limit=TIME_LIMIT_S)
def sync_hypervisors() -> dict:
    """Check and read every linked host's hypervisor; returns {"hosts", "ok", "failed"}."""
    done = {"hosts": 0, "ok": 0, "failed": 0}
    try:
        for host in services.linked_hosts():
            done["hosts"] += 1
            try:
                services.check_host(host)
                report = services.sync_host(host, trigger=SyncTrigger.TASK)
            except SoftTimeLimitExceeded:
                raise
            except Exception:  # noqa: BLE001 - one host's failure must not stop the others
                logger.exception("sync_hypervisors: %s failed", host.name)
                done["failed"] += 1
                continue
            if report.ok:
                done["ok"] += 1
            else:
                done["failed"] += 1
                logger.warning("sync_hypervisors: %s: %s", host.name, report.error)
    except SoftTimeLimitExceeded:
        logger.warning("sync_hypervisors: time limit reached after %d host(s); the rest wait for the next run",
                       done["hosts"])
    logger.info("sync_hypervisors: %(hosts)d host(s), %(ok)d read, %(failed)d failed", done)
    return done


#: Linked hosts a `read_guest_stats_hosts` task reads, one after the other: as many as are stored
#: in one transaction, so a task's readings are stored once.
GUEST_HOSTS_PER_TASK = guest_stats.HOSTS_PER_STORE


@shared_task(name="hypervisors.tasks.read_guest_stats", ignore_result=True, soft_time_limit=20, time_limit=30)
def read_guest_stats() -> dict:
    """Beat's entry: one `read_guest_stats_hosts` task per GUEST_HOSTS_PER_TASK linked hosts, so
    the workers read the fleet's hypervisors side by side and a slow one holds up only its share.
    Each expires before the next reading: after a worker outage no backlog of old readings runs."""
    ids = list(services.linked_hosts().values_list("pk", flat=True))
    chunks = [ids[start:start + GUEST_HOSTS_PER_TASK] for start in range(0, len(ids), GUEST_HOSTS_PER_TASK)]
    expires = settings.HYPERVISOR_GUEST_INTERVAL_S * 0.9
    for chunk in chunks:
        read_guest_stats_hosts.apply_async(args=[chunk], expires=expires)
    return {"hosts": len(ids), "tasks": len(chunks)}


@shared_task(name="hypervisors.tasks.read_guest_stats_hosts", ignore_result=True, soft_time_limit=SOFT_TIME_LIMIT_S,
             time_limit=TIME_LIMIT_S)
def read_guest_stats_hosts(host_ids: list[int]) -> dict:
    """Read these hosts' running VMs' guest CPU and memory; returns {"samples", "hosts", "failed"}."""
    try:
        # Hosts not started in time are left for the next run, well before the soft time limit.
        deadline = time.monotonic() + SOFT_TIME_LIMIT_S - 30
        return guest_stats.read_all(host_ids, deadline=deadline).as_dict()
    except SoftTimeLimitExceeded:
        logger.warning("read_guest_stats_hosts: time limit reached; the hosts left are read at the next run")
        return {"samples": 0, "hosts": [], "failed": 0}

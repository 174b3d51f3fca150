"""The hypervisors app's beat entries, created once after migrate (as `telemetry.schedules` does):
an entry that exists is the admin's to change."""

from __future__ import annotations

from django.conf import settings
from django.db import DEFAULT_DB_ALIAS

from fleet.beat import beat_tables_ready, ensure_periodic_task

SYNC_HYPERVISORS = "sync_hypervisors"
READ_GUEST_STATS = "read_guest_stats"
RESUME_OPERATIONS = "resume_operations"
#: How often beat looks for operations whose window opened or whose worker was lost.
RESUME_OPERATIONS_EVERY_S = 15


def ensure_default_schedules(using: str = DEFAULT_DB_ALIAS, **kwargs) -> None:
    """post_migrate hook: `sync_hypervisors` every HYPERVISOR_SYNC_INTERVAL_S, `read_guest_stats`
    every HYPERVISOR_GUEST_INTERVAL_S and
    `resume_operations` every RESUME_OPERATIONS_EVERY_S, each expiring before its next run."""
    if not beat_tables_ready(using):
        return
    every = settings.HYPERVISOR_SYNC_INTERVAL_S
    ensure_periodic_task(SYNC_HYPERVISORS, "hypervisors.tasks.sync_hypervisors", every, expires_s=every * 0.9)
    guests = settings.HYPERVISOR_GUEST_INTERVAL_S
    ensure_periodic_task(READ_GUEST_STATS, "hypervisors.tasks.read_guest_stats", guests, expires_s=guests * 0.9)
    ensure_periodic_task(RESUME_OPERATIONS, "hypervisors.tasks.resume_operations", RESUME_OPERATIONS_EVERY_S,
                         expires_s=RESUME_OPERATIONS_EVERY_S - 2)

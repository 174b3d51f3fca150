"""The identity app's beat entry, created once after migrate: an entry that exists is the admin's
to change. It runs whether or not the directory is configured (the task returns at once when it
is not), so connecting a directory later needs no migrate."""

from __future__ import annotations

from django.db import DEFAULT_DB_ALIAS

from fleet.beat import beat_tables_ready, ensure_periodic_task

SYNC_DIRECTORY = "sync_directory"
#: AUTH_LDAP_SYNC_INTERVAL_S's default; the settings hold it only while a directory is configured.
SYNC_EVERY_S = 900


def ensure_default_schedules(using: str = DEFAULT_DB_ALIAS, **kwargs) -> None:
    if not beat_tables_ready(using):
        return
    from django.conf import settings

    every = getattr(settings, "AUTH_LDAP_SYNC_INTERVAL_S", SYNC_EVERY_S)
    ensure_periodic_task(SYNC_DIRECTORY, "identity.tasks.sync_directory", every, expires_s=every * 0.9)

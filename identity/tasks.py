"""Beat's entry for the directory: every directory account kept in step (identity/ldap_backend.py)."""

from __future__ import annotations

import logging

from celery import shared_task
from django.conf import settings

logger = logging.getLogger(__name__)


@shared_task(name="identity.tasks.sync_directory", ignore_result=True, soft_time_limit=600, time_limit=660)
def sync_directory() -> dict | None:
    """One sync of every LDAP directory account; None when directory sign-in is off."""
    if not getattr(settings, "AUTH_LDAP_ENABLED", False):
        return None
    from identity.ldap_backend import sync_accounts

    report = sync_accounts()
    logger.info("Directory sync: %d checked, %d changed, %d without access%s", report.checked, report.changed,
                report.refused, f"; stopped: {report.error}" if report.error else "")
    return vars(report)

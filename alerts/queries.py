"""Small reads of the alerts app that pages elsewhere show (the menu's badge, a GPU's alerts)."""

from __future__ import annotations

from django.db.models import Count

from alerts.models import OPEN_STATES, Alert, AlertState


def firing_count() -> int:
    """Alerts firing now that nobody acknowledged and no silence keeps quiet."""
    return Alert.objects.filter(state=AlertState.FIRING, silenced=False).count()


def firing_count_query():
    """`firing_count` as a subquery of one value, for the menu's single badge query."""
    return (Alert.objects.filter(state=AlertState.FIRING, silenced=False).order_by().values("state")
            .annotate(n=Count("pk")).values("n"))


def open_alerts_of(*, gpu=None, host=None, vm=None):
    qs = Alert.objects.filter(state__in=OPEN_STATES).select_related("rule")
    if gpu is not None:
        qs = qs.filter(gpu=gpu)
    if host is not None:
        qs = qs.filter(host=host)
    if vm is not None:
        qs = qs.filter(vms=vm)
    return qs.order_by("-last_seen")

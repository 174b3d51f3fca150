"""Small reads of the alerts app that pages elsewhere show (the menu's badge, a GPU's alerts)."""

from __future__ import annotations

from django.db.models import Count

from alerts.models import OPEN_STATES, Alert, AlertState


def firing_count_query():
    """How many alerts fire now that nobody acknowledged and no silence keeps quiet, as a subquery
    of one value, for the menu's single badge query."""
    return (Alert.objects.filter(state=AlertState.FIRING, silenced=False).order_by().values("state")
            .annotate(n=Count("pk")).values("n"))


def open_alerts_of(gpu):
    """The open alerts about `gpu`, most recently seen first."""
    return Alert.objects.filter(state__in=OPEN_STATES, gpu=gpu).select_related("rule").order_by("-last_seen")

"""FilterSets of telemetry, shared by the agents API (`/api/v1/agents/`) and the agents page.

Parameters are those of `fleet.filtersets`: field names (`?kind=nvml&host=3&enabled=true`), an
unknown id or choice is a 400 (`?host=` takes an id or a name), `q` matches a part of the name or
URL. `?status=` filters on the status the collector's bookkeeping implies (`Agent.status`),
translated into a query so it filters in the database rather than in Python.
"""

from __future__ import annotations

import django_filters
from django.conf import settings
from django.db.models import F, Q, QuerySet
from django.utils import timezone

from fleet import queries
from fleet.filtersets import IdOrNameFilter, search_filter, visible_to_requester
from telemetry.models import Agent, AgentKind, AgentStatus


def status_filter(status_value: str) -> Q:
    """The rows whose `Agent.status` is `status_value`, as a query (mirrors the property)."""
    erred = Q(last_error_at__isnull=False) & (Q(last_seen__isnull=True) | Q(last_error_at__gt=F("last_seen")))
    fresh_since = timezone.now() - timezone.timedelta(seconds=settings.TELEMETRY_STALE_AFTER_S)
    enabled = Q(enabled=True)
    return {
        AgentStatus.DISABLED: Q(enabled=False),
        AgentStatus.ERROR: enabled & erred,
        AgentStatus.NEW: enabled & ~erred & Q(last_seen__isnull=True),
        AgentStatus.STALE: enabled & ~erred & Q(last_seen__lt=fresh_since),
        AgentStatus.OK: enabled & ~erred & Q(last_seen__gte=fresh_since),
    }[status_value]


class AgentFilterSet(django_filters.FilterSet):
    q = search_filter("name", "url", placeholder="Agent name or URL")
    name = django_filters.CharFilter(lookup_expr="icontains")
    kind = django_filters.ChoiceFilter(choices=AgentKind.choices)
    host = IdOrNameFilter(queryset=visible_to_requester(queries.visible_hosts))
    status = django_filters.ChoiceFilter(choices=AgentStatus.choices, method="filter_status", label="Status",
                                         help_text="Status (ok, stale, error, new, disabled)")

    class Meta:
        model = Agent
        fields = ["name", "kind", "host", "enabled", "status"]

    def filter_status(self, queryset: QuerySet, name: str, value: str) -> QuerySet:
        return queryset.filter(status_filter(value))

"""The agents page: every source of samples with its collection status, staff only.

The same FilterSet as `/api/v1/agents/` (kind, host, enabled, status, and `q` on name or URL),
sortable, 50 a page, exportable as CSV. The table refreshes itself through htmx every
DASHBOARD_REFRESH_S seconds (an htmx request gets the table alone), so an agent going stale
shows without a reload; a summary of the statuses of all agents heads it (one query).
"""

from __future__ import annotations

from django.conf import settings
from django.db.models import QuerySet
from django.urls import reverse

from dashboard import tables
from dashboard.listing import TableListView
from telemetry.filtersets import AgentFilterSet
from telemetry.models import Agent, AgentStatus
from telemetry.queries import agent_status_counts

#: Statuses in the order the summary lists them: the ones needing attention first.
SUMMARY_ORDER = (AgentStatus.ERROR, AgentStatus.STALE, AgentStatus.NEW, AgentStatus.OK, AgentStatus.DISABLED)



class AgentListView(TableListView):
    """Agents with status, last success, last error, failures in a row and clock skew."""

    table_class = tables.AgentTable
    filterset_class = AgentFilterSet
    template_name = "telemetry/agent_list.html"
    partial_template_name = "telemetry/partials/agent_table.html"
    noun = "agents"
    csv_name = "agents"
    filter_fields = ("q", "status", "kind", "host", "enabled")

    def get_queryset(self) -> QuerySet:
        return Agent.objects.select_related("host", "vm")

    def decorate(self, rows: list) -> None:
        for agent in rows:
            agent.status_now = agent.status
            agent.error_is_current = agent.status_now == AgentStatus.ERROR

    def get_extra_context(self) -> dict:
        counts = agent_status_counts()
        summary = [{"status": value, "label": AgentStatus(value).label, "count": counts[value]}
                   for value in SUMMARY_ORDER]
        return {
            "title": "Agents",
            "summary": summary,
            "total_agents": sum(counts.values()),
            "attention": counts[AgentStatus.ERROR] + counts[AgentStatus.STALE],
            "refresh_s": settings.DASHBOARD_REFRESH_S,
            "add_agent_url": reverse("admin:telemetry_agent_add"),
        }

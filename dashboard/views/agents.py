"""The agents page: every source of samples with its collection status, staff only.

The same FilterSet as `/api/v1/agents/` (kind, host, enabled, status, and `q` on name or URL),
sortable, 50 a page, exportable as CSV. The table refreshes itself through htmx every
DASHBOARD_REFRESH_S seconds (an htmx request gets the table alone), so an agent going stale
shows without a reload; a summary of the statuses of all agents heads it (one query).
"""

from __future__ import annotations

from datetime import UTC

from django.conf import settings
from django.db.models import QuerySet
from django.urls import reverse

from dashboard.listing import Column, CsvColumn, FilteredListView
from telemetry.filtersets import AgentFilterSet
from telemetry.models import Agent, AgentStatus
from telemetry.queries import agent_status_counts

#: Statuses in the order the summary lists them: the ones needing attention first.
SUMMARY_ORDER = (AgentStatus.ERROR, AgentStatus.STALE, AgentStatus.NEW, AgentStatus.OK, AgentStatus.DISABLED)


def _iso(moment) -> str | None:
    return moment.astimezone(UTC).isoformat() if moment else None


class AgentListView(FilteredListView):
    """Agents with status, last success, last error, failures in a row and clock skew."""

    filterset_class = AgentFilterSet
    template_name = "telemetry/agent_list.html"
    partial_template_name = "telemetry/partials/agent_table.html"
    noun = "agents"
    csv_name = "agents"
    filter_fields = ("q", "status", "kind", "host", "enabled")
    columns = (
        Column("Agent", "name"),
        Column("Kind", "kind"),
        Column("Host", "host", title="The host whose GPUs it reports, or the one VM an in-guest agent reports"),
        Column("URL", "url"),
        Column("Status", title="ok: polled recently; stale: not seen lately; error: the last attempt failed; "
                               "new: never seen; disabled"),
        Column("Last seen", "last_seen", title="Last successful collection"),
        Column("Last error"),
        Column("Failures", "consecutive_failures", num=True, title="Failed attempts in a row"),
        Column("Clock skew", "clock_skew_s", num=True, title="Agent clock minus ours at the last poll, seconds"),
    )
    orderings = {
        "name": ("name",),
        "kind": ("kind", "name"),
        "host": ("host__name", "name"),
        "url": ("url",),
        "last_seen": ("last_seen",),
        "consecutive_failures": ("consecutive_failures", "name"),
        "clock_skew_s": ("clock_skew_s", "name"),
    }
    csv_columns = (
        CsvColumn("name", lambda agent: agent.name),
        CsvColumn("kind", lambda agent: agent.kind),
        CsvColumn("host", lambda agent: agent.host.name if agent.host else None),
        CsvColumn("vm", lambda agent: agent.vm.name if agent.vm else None),
        CsvColumn("url", lambda agent: agent.url),
        CsvColumn("enabled", lambda agent: agent.enabled),
        CsvColumn("status", lambda agent: agent.status_now),
        CsvColumn("last_seen_utc", lambda agent: _iso(agent.last_seen)),
        CsvColumn("last_error", lambda agent: agent.last_error),
        CsvColumn("last_error_at_utc", lambda agent: _iso(agent.last_error_at)),
        CsvColumn("consecutive_failures", lambda agent: agent.consecutive_failures),
        CsvColumn("clock_skew_s", lambda agent: agent.clock_skew_s),
    )

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

"""/audit/: the audit log page for fleet admins, with the API's filters and a link to the API's
CSV export of the same events.

Each event shows its object by name, linked to its page while it exists, and its before/after
as a field-by-field diff whose ids read as names (`dashboard.audit_log`), so a reader sees what
changed without comparing two JSON blobs by eye or looking ids up.
"""

from __future__ import annotations

from django import forms
from django.conf import settings
from django.db.models import QuerySet

from dashboard import tables
from dashboard.audit_log import name_events
from dashboard.listing import TableListView, url_with
from fleet.filtersets import AuditEventFilter
from fleet.models import AuditEvent


class AuditListView(TableListView):
    """Every change to the fleet, newest first, 50 a page."""

    table_class = tables.AuditEventTable
    filterset_class = AuditEventFilter
    template_name = "fleet/audit_list.html"
    filter_fields = ("action", "object_type", "object_id", "actor", "source", "since", "until", "q")
    #: The export is the API's, which writes the same filters' events (see `csv_url`).
    csv_name = None
    noun = "events"

    def get_queryset(self) -> QuerySet:
        return AuditEvent.objects.select_related("actor")

    def decorate(self, rows: list) -> None:
        name_events(rows)

    def csv_url(self) -> str:
        return url_with("/api/v1/audit-events/", self.request.GET, drop=("page", "ordering"), format="csv")

    def errors(self, controls: forms.Form) -> list[str]:
        # Named by parameter, as the API's answers name them: "since: ... is not a time".
        return [f"{field.name}: {error}" for form in (self.filterset.form, controls) for field in form
                for error in field.errors]

    def get_extra_context(self) -> dict:
        return {"title": "Audit log", "retention_days": settings.AUDIT_RETENTION_DAYS,
                "empty_title": "No events yet",
                "empty_message": "Changes to hosts, GPUs, VMs, artists and requests are recorded here as they happen."}

"""/audit/: the audit log page for fleet admins, with the API's filters and a CSV export.

Each event shows its before/after as a field-by-field diff so a reader sees what changed
without comparing two JSON blobs by eye.
"""

from __future__ import annotations

from django.conf import settings
from django.core.paginator import Paginator
from django.shortcuts import render
from django.urls import NoReverseMatch, reverse

from config import parsing
from dashboard.access import staff_required
from fleet.filtersets import AuditEventFilter
from fleet.models import AuditEvent

PAGE_SIZE = 50
#: object_type -> detail page URL name, for links to objects that still exist.
DETAIL_PAGES = {"host": "fleet:host-detail", "gpu": "fleet:gpu-detail", "vm": "fleet:vm-detail",
                "artist": "fleet:artist-detail"}


def _fields(snapshot) -> dict:
    """A snapshot as fields: `audit.snapshot` writes objects; anything else stored (a bare value
    written by a script or an older release) shows as one field rather than breaking the page."""
    if snapshot is None:
        return {}
    return snapshot if isinstance(snapshot, dict) else {"value": snapshot}


def diff(before, after) -> list[dict]:
    """One row per field: its old and new value and whether it changed."""
    before, after = _fields(before), _fields(after)
    return [{"field": name, "before": before.get(name, ""), "after": after.get(name, ""),
             "changed": before.get(name) != after.get(name)}
            for name in sorted(set(before) | set(after))]


def object_url(event: AuditEvent) -> str | None:
    name = DETAIL_PAGES.get(event.object_type)
    if name is None or event.action.endswith(".delete"):
        return None
    try:
        return reverse(name, args=[parsing.parse_int(event.object_id, minimum=1)])
    except (parsing.ParseError, NoReverseMatch):
        return None


@staff_required
def audit_list(request):
    filterset = AuditEventFilter(request.GET, queryset=AuditEvent.objects.select_related("actor"))
    error, events, page = "", [], None
    errors = {field: " ".join(map(str, msgs)) for field, msgs in filterset.errors.items()}
    try:
        number = parsing.parse_page(request.GET.get("page"))
    except parsing.ParseError as exc:
        errors["page"] = str(exc)
    if errors:
        error = "; ".join(f"{field}: {message}" for field, message in errors.items())
    else:
        page = Paginator(filterset.qs, PAGE_SIZE).get_page(number)
        events = list(page.object_list)
    for event in events:
        event.diff = diff(event.before, event.after)
        event.url = object_url(event)
    query = request.GET.copy()
    query.pop("page", None)
    query["format"] = "csv"
    return render(request, "fleet/audit_list.html", {
        "events": events, "page": page, "filters": request.GET, "error": error,
        "csv_url": f"/api/v1/audit-events/?{query.urlencode()}",
        "retention_days": settings.AUDIT_RETENTION_DAYS,
    }, status=400 if error else 200)

"""The right-sizing suggestions page (`/sizing/suggestions/`) and its POST actions: staff only.

The list is a `dashboard.listing.TableListView` over `sizing.queries.suggestions_for` (its
columns, orderings and export: `dashboard.tables.SuggestionTable`),
filtered by the API's own `SuggestionFilterSet`, so the page and `GET /api/v1/suggestions/`
agree on what a filter means. Above it, fleet-wide figures (`sizing.queries.suggestion_summary`).
Each row's chart is drawn in the browser (static/js/suggestions.js) from the daily series of its
evidence, handed over in one `json_script` for the whole page: no request per chart.

Accept, dismiss, restore and "refresh now" are POST forms that call `sizing.suggestions` and
come back to the list they were sent from (its filters kept) with a message.
"""

from __future__ import annotations

from dataclasses import dataclass

from django.contrib import messages
from django.db.models import Case, IntegerField, QuerySet, Value, When
from django.http import HttpRequest, HttpResponseBadRequest, HttpResponseRedirect
from django.shortcuts import get_object_or_404
from django.urls import reverse
from django.views.decorators.http import require_POST

from config.celery import QueueUnavailable, send_from_request
from dashboard import tables
from dashboard.access import staff_required
from dashboard.forms import NextForm, SuggestionActionForm, field_errors
from dashboard.listing import TableListView
from fleet import requests as resize_requests
from fleet.choices import ResizeStatus
from fleet.models import ResizeRequest, Vgpu
from sizing import suggestions, tasks
from sizing.choices import Fits
from sizing.filtersets import SuggestionFilterSet
from sizing.models import SuggestionAction
from sizing.queries import suggestion_summary, suggestions_for

#: Fleets with at most this many VMs holding vGPUs are refreshed at once by "Refresh now";
#: larger ones are handed to the worker (the page would otherwise wait on the whole fleet).
SYNC_REFRESH_MAX_VMS = 300
#: Rows first: VMs short of frame buffer suffer now, oversized ones only cost money.
ACTION_RANK = {SuggestionAction.UPSIZE: 0, SuggestionAction.DOWNSIZE: 1, SuggestionAction.INSUFFICIENT_DATA: 2,
               SuggestionAction.KEEP: 3}
FB_HIGH_PCT = 90


def _pct(value) -> str:
    return "—" if value is None else f"{value:.0f}%"


@dataclass(frozen=True)
class Figures:
    """The figures of one row, read from its evidence (absent ones are None)."""

    fb_p95_pct: float | None
    fb_peak_pct: float | None
    fb_mean_pct: float | None
    fb_p95_mib: float | None
    fb_peak_mib: float | None
    fb_mean_mib: float | None
    util_gpu_p95_pct: float | None
    enc_util_max_pct: float | None
    covered_hours: int | None
    active_hours: int | None

    @classmethod
    def of(cls, evidence: dict) -> Figures:
        return cls(**{name: evidence.get(name) for name in cls.__dataclass_fields__})

    @property
    def fb_text(self) -> str:
        return f"p95 {_pct(self.fb_p95_pct)} · peak {_pct(self.fb_peak_pct)} · mean {_pct(self.fb_mean_pct)}"

    @property
    def fb_high(self) -> bool:
        return self.fb_p95_pct is not None and self.fb_p95_pct > FB_HIGH_PCT


def _chart(suggestion) -> dict:
    """What static/js/suggestions.js draws for one row: daily frame buffer p95 and peak against
    the profile and the 90% / 70% lines (MiB; the script shows GiB)."""
    evidence = suggestion.evidence or {}
    thresholds = evidence.get("thresholds") or {}
    return {
        "vm": suggestion.vm.name,
        "daily": evidence.get("daily") or [],
        "profile_fb_mib": evidence.get("profile_fb_mib"),
        "suggested_fb_mib": evidence.get("suggested_fb_mib"),
        "high_pct": thresholds.get("fb_high_pct", 90.0),
        "avg_high_pct": thresholds.get("fb_avg_high_pct", 70.0),
    }


def _next(form: NextForm, request: HttpRequest) -> HttpResponseRedirect:
    """Back to the list the form was sent from (its filters kept), or to the list."""
    return HttpResponseRedirect(form.next_url(request, reverse("sizing:suggestion-list")))


def _refused(form) -> HttpResponseBadRequest:
    return HttpResponseBadRequest(f"Refused: {field_errors(form)}", content_type="text/plain; charset=utf-8")


class SuggestionListView(TableListView):
    """Every VM's right-sizing suggestion: the advice, the figures behind it, where the new size
    fits and what it frees, with Accept and Dismiss."""

    table_class = tables.SuggestionTable
    filterset_class = SuggestionFilterSet
    template_name = "sizing/suggestion_list.html"
    title = "Right-sizing"
    noun = "suggestions"
    csv_name = "suggestions"
    filter_fields = ("action", "host", "artist", "fits", "dismissed")

    def get_queryset(self) -> QuerySet:
        rank = Case(*(When(action=action, then=Value(n)) for action, n in ACTION_RANK.items()),
                    default=Value(len(ACTION_RANK)), output_field=IntegerField())
        return suggestions_for(self.request.user).annotate(action_rank=rank)

    def decorate(self, rows: list) -> None:
        """Each row's figures, and the pending resize request of its VM if any (one query)."""
        pending = {}
        if rows:
            for request_id, vm_id in ResizeRequest.objects.filter(
                vm_id__in=[row.vm_id for row in rows], status=ResizeStatus.PENDING,
            ).order_by("created_at", "id").values_list("pk", "vm_id"):
                pending.setdefault(vm_id, request_id)
        for row in rows:
            row.figures = Figures.of(row.evidence or {})
            row.impact = (row.evidence or {}).get("impact") or {}
            row.pending_request_id = pending.get(row.vm_id)
            row.fits_label = Fits(row.fits).label if row.fits in Fits.values else ""
            row.can_accept = (row.action in suggestions.RESIZE_ACTIONS and row.suggested_profile_id is not None
                              or row.advises_size)
        self.charts = charts_of(rows)

    def get_extra_context(self) -> dict:
        summary = suggestion_summary()
        return {
            "title": self.title,
            "summary": summary,
            "empty_title": "No suggestions yet",
            "empty_message": "Suggestions are computed every hour from the last two weeks of each VM's hourly "
                             "rollups; refresh them now to compute them from the data already collected.",
            "refresh_url": reverse("sizing:suggestion-refresh"),
            "charts": getattr(self, "charts", {}),
        }


def charts_of(rows: list) -> dict:
    """{suggestion id: chart} of a page's rows, for one json_script."""
    return {str(row.pk): _chart(row) for row in rows}


@require_POST
@staff_required
def accept(request: HttpRequest, pk: int):
    """File a resize request for what the suggestion advises: the profile, the vCPUs, the RAM."""
    suggestion = get_object_or_404(suggestions_for(request.user), pk=pk)
    form = SuggestionActionForm(request.POST)
    if not form.is_valid():
        return _refused(form)
    try:
        filed = suggestions.accept_suggestion(suggestion, request.user, evidence_key=form.cleaned_data["evidence_key"])
    except suggestions.SuggestionConflict as exc:
        messages.error(request, str(exc))
    else:
        messages.success(request, f"Request #{filed.pk} filed for {suggestion.vm.name}: "
                                  f"{resize_requests.describe(filed)}, pending approval.")
    return _next(form, request)


@require_POST
@staff_required
def dismiss(request: HttpRequest, pk: int):
    """Hide the suggestion until its evidence changes."""
    suggestion = get_object_or_404(suggestions_for(request.user), pk=pk)
    form = SuggestionActionForm(request.POST)
    if not form.is_valid():
        return _refused(form)
    try:
        suggestions.dismiss_suggestion(suggestion, request.user, evidence_key=form.cleaned_data["evidence_key"])
    except suggestions.SuggestionConflict as exc:
        messages.error(request, str(exc))
    else:
        messages.success(request, f"Suggestion for {suggestion.vm.name} dismissed until its evidence changes.")
    return _next(form, request)


@require_POST
@staff_required
def restore(request: HttpRequest, pk: int):
    """Show a dismissed suggestion again."""
    suggestion = get_object_or_404(suggestions_for(request.user), pk=pk)
    form = NextForm(request.POST)
    suggestions.restore_suggestion(suggestion)
    messages.success(request, f"Suggestion for {suggestion.vm.name} restored.")
    return _next(form, request)


@require_POST
@staff_required
def refresh(request: HttpRequest):
    """Recompute every suggestion now (small fleets) or hand the work to the worker (large ones)."""
    form = NextForm(request.POST)
    subjects = Vgpu.objects.values("vm_id").distinct().count()
    if subjects <= SYNC_REFRESH_MAX_VMS:
        counts = suggestions.refresh_suggestions()
        written = sum(counts[action] for action in SuggestionAction.values)
        messages.success(request, f"Suggestions refreshed: {written} VM{'s' if written != 1 else ''} judged "
                                  f"({counts[SuggestionAction.UPSIZE]} upsize, {counts[SuggestionAction.DOWNSIZE]} "
                                  f"downsize).")
    else:
        # Sent at once (nothing was written to wait for), so the page can say when the queue is down.
        try:
            send_from_request(tasks.refresh_suggestions)
        except QueueUnavailable:
            messages.error(request, "Could not queue the refresh: the task queue (Redis) is unreachable. The "
                                    "suggestions below are unchanged; refresh again once it is back.")
        else:
            messages.success(request, f"Refreshing the suggestions of {subjects} VMs in the background; reload "
                                      "this page in a minute.")
    return _next(form, request)

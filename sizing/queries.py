"""Reads for sizing: the right-sizing suggestions. (The fleet snapshot the pure sizing code
works on is `fleet.queries.fleet_snapshot`.)"""

from __future__ import annotations

from django.db.models import BooleanField, Count, ExpressionWrapper, F, Max, Q, QuerySet, Sum

from config.roles import is_fleet_admin
from sizing.models import Suggestion, SuggestionAction

# Right-sizing suggestions -------------------------------------------------------------------

#: A suggestion is dismissed while the evidence it was dismissed on is still its evidence.
DISMISSED = ~Q(dismissed_key="") & Q(dismissed_key=F("evidence_key"))


def suggestions_for(user) -> QuerySet[Suggestion]:
    """Suggestions `user` may see (all for staff, those of their own VMs for an artist; none for
    anonymous), annotated with `dismissed`, with VM, artist, host, both profiles and the filed
    request loaded, ordered by VM name. One query for a list of any length."""
    if not (user and user.is_authenticated):
        return Suggestion.objects.none()
    queryset = Suggestion.objects.all()
    if not is_fleet_admin(user):
        queryset = queryset.filter(vm__artist__user=user)
    return queryset.annotate(
        dismissed=ExpressionWrapper(DISMISSED, output_field=BooleanField()),
    ).select_related(
        "vm__artist", "vm__host", "current_profile", "suggested_profile", "resize_request",
    ).order_by("vm__name", "id")


def suggestion_summary() -> dict:
    """Fleet-wide figures of the suggestions shown by default (those not dismissed): how many of
    each action, how many are dismissed, when they were last computed, and the GPUs the resizes
    would free and need if each were applied on its own (`gpus_delta` is each one's effect on
    today's fleet, so the totals are not what applying them all together would do). One query."""
    shown = ~DISMISSED
    resize = shown & Q(action__in=[SuggestionAction.UPSIZE, SuggestionAction.DOWNSIZE])
    figures = Suggestion.objects.aggregate(
        **{action: Count("pk", filter=shown & Q(action=action)) for action in SuggestionAction.values},
        dismissed=Count("pk", filter=DISMISSED),
        gpus_freed=Sum("gpus_delta", filter=resize & Q(gpus_delta__lt=0)),
        gpus_needed=Sum("gpus_delta", filter=resize & Q(gpus_delta__gt=0)),
        computed_at=Max("computed_at"),
    )
    figures["gpus_freed"] = -(figures["gpus_freed"] or 0)
    figures["gpus_needed"] = figures["gpus_needed"] or 0
    figures["gpus_net_freed"] = figures["gpus_freed"] - figures["gpus_needed"]
    figures["total"] = sum(figures[action] for action in SuggestionAction.values) + figures["dismissed"]
    return figures

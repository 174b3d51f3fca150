"""FilterSets of sizing, shared by the REST API and the HTML pages (as `fleet.filtersets`).

Query parameters follow the suggestion's own fields: `?action=downsize&host=3&fits=move`, `?vm=12`.
Foreign keys take an id or a name (`?host=gpu-node-01`, `?artist=Ana Artist`), and the choices
of `host` and `artist` are what the requesting user may see (`fleet.queries.visible_*`), so
naming another artist is the same 400 as naming nobody.
"""

import django_filters
from django.db.models import QuerySet

from fleet import queries as fleet_queries
from fleet.choices import Workflow
from fleet.filtersets import IdOrNameFilter, visible_to_requester
from sizing.choices import Fits
from sizing.models import Feedback, Suggestion, SuggestionAction

#: `?dismissed=`: hidden unless asked for, since a dismissal means "stop showing me this".
HIDE_DISMISSED = "false"
ONLY_DISMISSED = "true"
WITH_DISMISSED = "all"
DISMISSED_CHOICES = [
    (HIDE_DISMISSED, "Hidden"),
    (ONLY_DISMISSED, "Only dismissed"),
    (WITH_DISMISSED, "Shown with the others"),
]


class SuggestionFilterSet(django_filters.FilterSet):
    """Right-sizing suggestions by action, host, artist, where the target fits and dismissal.

    Dismissed suggestions (dismissed while their evidence stays the same) are left out unless
    `dismissed` says otherwise: the default of the page and of the API alike.
    """

    vm = IdOrNameFilter(label="VM", queryset=visible_to_requester(fleet_queries.visible_vms))
    action = django_filters.ChoiceFilter(choices=SuggestionAction.choices)
    host = IdOrNameFilter(
        field_name="vm__host", label="Host", queryset=visible_to_requester(fleet_queries.visible_hosts),
    )
    artist = IdOrNameFilter(
        field_name="vm__artist", label="Artist", queryset=visible_to_requester(fleet_queries.visible_artists),
    )
    fits = django_filters.ChoiceFilter(choices=Fits.choices, label="Fits")
    # No empty choice: the default is "Hidden", which the form then shows as selected.
    dismissed = django_filters.ChoiceFilter(
        choices=DISMISSED_CHOICES, method="filter_dismissed", label="Dismissed", empty_label=None,
    )

    class Meta:
        model = Suggestion
        fields = ["vm", "action", "host", "artist", "fits", "dismissed"]

    def filter_dismissed(self, queryset: QuerySet, name: str, value: str) -> QuerySet:
        # Applied in filter_queryset (it must also run when the parameter is absent).
        return queryset

    def filter_queryset(self, queryset: QuerySet) -> QuerySet:
        queryset = super().filter_queryset(queryset)
        wanted = self.form.cleaned_data.get("dismissed") or HIDE_DISMISSED
        if wanted == HIDE_DISMISSED:
            return queryset.filter(dismissed=False)
        if wanted == ONLY_DISMISSED:
            return queryset.filter(dismissed=True)
        return queryset


class FeedbackFilterSet(django_filters.FilterSet):
    """Artists' ratings by VM, artist, the artist's workflow, the host of the day rated, and from
    a day on (`?since=2026-11-01`). VM, artist and host choices are what the requester may see,
    so an artist naming someone else's VM gets the same 400 as naming nobody."""

    vm = IdOrNameFilter(label="VM", queryset=visible_to_requester(fleet_queries.visible_vms))
    artist = IdOrNameFilter(label="Artist", queryset=visible_to_requester(fleet_queries.visible_artists))
    workflow = django_filters.ChoiceFilter(field_name="artist__workflow", choices=Workflow.choices,
                                           label="Workflow")
    host = IdOrNameFilter(label="Host", queryset=visible_to_requester(fleet_queries.visible_hosts))
    since = django_filters.DateFilter(field_name="session_date", lookup_expr="gte", label="Since",
                                      help_text="First day rated, YYYY-MM-DD")

    class Meta:
        model = Feedback
        fields = ["vm", "artist", "workflow", "host", "since"]

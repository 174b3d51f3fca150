"""FilterSets of the alerts app, shared by the API and the pages (as `fleet.filtersets`)."""

import django_filters
from django.db.models import Q
from django.utils import timezone

from alerts.models import Alert, AlertState, Severity, Silence
from alerts.rules import RULES
from fleet.filtersets import IdOrNameFilter
from fleet.models import Gpu, Host


class AlertFilterSet(django_filters.FilterSet):
    """Alerts by state (`open` = firing or acknowledged), severity, rule, host and GPU."""

    state = django_filters.ChoiceFilter(choices=[("open", "Open (firing or acknowledged)"), *AlertState.choices],
                                        method="filter_state")
    severity = django_filters.ChoiceFilter(choices=Severity.choices)
    rule = django_filters.ChoiceFilter(field_name="rule__kind", choices=[(s, k.title) for s, k in RULES.items()])
    host = IdOrNameFilter(label="Host", queryset=Host.objects.order_by("name"))
    gpu = django_filters.ModelChoiceFilter(label="GPU", queryset=Gpu.objects.all())

    class Meta:
        model = Alert
        fields = ["state", "severity", "rule", "host", "gpu"]

    def filter_state(self, queryset, name, value):
        if value == "open":
            return queryset.filter(state__in=[AlertState.FIRING, AlertState.ACKNOWLEDGED])
        return queryset.filter(state=value)


class SilenceFilterSet(django_filters.FilterSet):
    """Silences by whether they hold now."""

    active = django_filters.BooleanFilter(method="filter_active", label="In force now")

    class Meta:
        model = Silence
        fields = ["active"]

    def filter_active(self, queryset, name, value):
        now = timezone.now()
        held = Q(starts_at__lte=now, ends_at__gt=now)
        return queryset.filter(held) if value else queryset.exclude(held)

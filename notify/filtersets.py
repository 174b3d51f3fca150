"""FilterSets of the notify app, shared by the API and the pages."""

import django_filters

from notify.choices import ChannelKind, DeliveryStatus, Severity
from notify.models import Delivery, NotificationChannel


class NotificationChannelFilterSet(django_filters.FilterSet):
    kind = django_filters.ChoiceFilter(choices=ChannelKind.choices)
    enabled = django_filters.BooleanFilter()

    class Meta:
        model = NotificationChannel
        fields = ["kind", "enabled"]


class DeliveryFilterSet(django_filters.FilterSet):
    """Deliveries by channel, status, severity, rule and message key."""

    channel = django_filters.ModelChoiceFilter(queryset=NotificationChannel.objects.order_by("name"))
    status = django_filters.ChoiceFilter(choices=DeliveryStatus.choices)
    severity = django_filters.ChoiceFilter(choices=Severity.choices)
    rule = django_filters.CharFilter(max_length=64)
    key = django_filters.CharFilter(max_length=200)

    class Meta:
        model = Delivery
        fields = ["channel", "status", "severity", "rule", "key"]

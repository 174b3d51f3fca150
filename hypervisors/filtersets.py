"""FilterSets of the hypervisors app, shared by the API and the pages (as `fleet.filtersets`)."""

import django_filters

from fleet import queries as fleet_queries
from fleet.filtersets import IdOrNameFilter, visible_to_requester
from hypervisors.choices import OperationKind, OperationStatus
from hypervisors.models import Operation


class OperationFilterSet(django_filters.FilterSet):
    """Operations by status, kind, VM, host (where it started or ends) and resize request."""

    status = django_filters.ChoiceFilter(choices=OperationStatus.choices)
    kind = django_filters.ChoiceFilter(choices=OperationKind.choices)
    vm = IdOrNameFilter(label="VM", queryset=visible_to_requester(fleet_queries.visible_vms))
    host = IdOrNameFilter(label="Host", queryset=visible_to_requester(fleet_queries.visible_hosts),
                          method="filter_host")
    request = django_filters.NumberFilter(field_name="request_id", label="Resize request")

    class Meta:
        model = Operation
        fields = ["status", "kind", "vm", "host", "request"]

    def filter_host(self, queryset, name, value):
        return queryset.filter(host=value) | queryset.filter(target_host=value)

"""FilterSets of the hypervisors app, shared by the API and the pages (as `fleet.filtersets`)."""

import django_filters
from django import forms

from fleet import queries as fleet_queries
from fleet.filtersets import IdOrNameField, IdOrNameFilter, visible_to_requester
from fleet.models import Host
from hypervisors import drift
from hypervisors.choices import OperationKind, OperationStatus
from hypervisors.models import Operation


class OperationFilterSet(django_filters.FilterSet):
    """Operations by status, kind, VM, host (where it started or ends) and resize request."""

    status = django_filters.ChoiceFilter(choices=OperationStatus.choices)
    kind = django_filters.ChoiceFilter(choices=OperationKind.choices)
    vm = IdOrNameFilter(label="VM", queryset=visible_to_requester(fleet_queries.visible_vms))
    host = IdOrNameFilter(label="Host", queryset=visible_to_requester(fleet_queries.visible_hosts),
                          method="filter_host")
    request = django_filters.NumberFilter(field_name="request_id", label="Resize request", min_value=1,
                                          max_value=2**63 - 1, decimal_places=0)

    class Meta:
        model = Operation
        fields = ["status", "kind", "vm", "host", "request"]

    def filter_host(self, queryset, name, value):
        return queryset.filter(host=value) | queryset.filter(target_host=value)


class KindsField(forms.MultipleChoiceField):
    """Repeated `?kind=`; an empty one means no filter, as with every other list's empty filter."""

    def to_python(self, value):
        return [item for item in super().to_python(value) if item != ""]


class DriftFilterForm(forms.Form):
    """The filters of the drift list, shared by `GET /api/v1/drift/` and the /drift/ page: kinds
    (repeat `kind` for several), host by id or name (matches either side of a VM found on two
    hosts) and severity. Drift is computed, not a queryset, hence a form and not a FilterSet."""

    kind = KindsField(choices=drift.Kind.CHOICES, required=False)
    host = IdOrNameField(queryset=Host.objects.order_by("name"), required=False, label="Host")
    severity = forms.ChoiceField(choices=[("", "Any"), *drift.Severity.CHOICES], required=False)

    def selected(self, items: list[drift.Drift]) -> list[drift.Drift]:
        """The items the valid form's values choose."""
        data = self.cleaned_data
        host = data.get("host")
        return drift.select(items, kinds=data.get("kind") or (), host_id=host.pk if host else None,
                            severity=data.get("severity") or "")

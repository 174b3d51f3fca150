"""The `drift/` resource of the v1 API: where the inventory, the hosts' hypervisors (their last
read) and the agents' recent readings disagree, per VM and GPU (`hypervisors.drift`).

Staff only, reading included: it shows the whole fleet and its hypervisors. Computed on each
request from stored rows (`hypervisors.drift_queries`, a fixed number of queries), never from
the network; filtered by `?kind=` (repeatable), `?host=` (id or name) and `?severity=`, and
paginated like every list. Each item names what to do and, where the API can do it, the
address: the host's `sync/` to read and apply, its agents, the operation to follow.
"""

from __future__ import annotations

from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiParameter, extend_schema
from rest_framework import serializers, viewsets
from rest_framework.exceptions import ValidationError
from rest_framework.response import Response
from rest_framework.reverse import reverse

from config.api.filters import KnownParametersFilter
from config.api.permissions import IsFleetAdmin
from hypervisors import drift
from hypervisors.drift_queries import fleet_drift
from hypervisors.filtersets import DriftFilterForm


class IsDriftAdmin(IsFleetAdmin):
    message = "Only fleet admins (staff) may see drift between the inventory, the hypervisors and the agents."


class DriftActionSerializer(serializers.Serializer):
    code = serializers.ChoiceField(choices=[drift.Do.SYNC_AND_APPLY, drift.Do.SYNC, drift.Do.CHECK_AGENT,
                                            drift.Do.FIX_HYPERVISOR, drift.Do.FIX_INVENTORY,
                                            drift.Do.FOLLOW_OPERATION])
    text = serializers.CharField(help_text="What to do, in words")
    host = serializers.IntegerField(allow_null=True, help_text="The host whose page or sync it takes place on")
    operation = serializers.IntegerField(allow_null=True, help_text="The operation to follow, if any")
    url = serializers.URLField(allow_null=True, help_text="The API address that does it or shows it: the host's "
                                                          "sync/ (POST), its agents, the operation; null: by hand")


class DriftSerializer(serializers.Serializer):
    """One disagreement, with the three views side by side."""

    kind = serializers.ChoiceField(choices=drift.Kind.CHOICES)
    kind_label = serializers.CharField()
    severity = serializers.ChoiceField(choices=drift.Severity.CHOICES)
    message = serializers.CharField()
    action = DriftActionSerializer()
    host = serializers.IntegerField(allow_null=True, help_text="The host it is about (the hypervisor's, for a VM "
                                                               "found on another host)")
    host_name = serializers.CharField(allow_blank=True)
    other_host = serializers.IntegerField(allow_null=True, help_text="The second host of a VM found on two")
    other_host_name = serializers.CharField(allow_blank=True)
    vm = serializers.IntegerField(allow_null=True, help_text="null: a domain the inventory does not know")
    vm_name = serializers.CharField(allow_blank=True)
    vm_uuid = serializers.CharField(allow_blank=True)
    gpu = serializers.IntegerField(allow_null=True)
    gpu_bus_id = serializers.CharField(allow_blank=True)
    inventory = serializers.CharField(help_text="What the inventory says")
    hypervisor = serializers.CharField(help_text="What the host's hypervisor said when last read")
    telemetry = serializers.CharField(help_text="What the agents read lately")


def _action_url(action: drift.Action, request) -> str | None:
    if action.code == drift.Do.FOLLOW_OPERATION and action.operation_id:
        return reverse("operation-detail", args=[action.operation_id], request=request)
    if action.host_id is None:
        return None
    if action.code in (drift.Do.SYNC, drift.Do.SYNC_AND_APPLY):
        return reverse("host-sync", args=[action.host_id], request=request)
    if action.code == drift.Do.CHECK_AGENT:
        return reverse("agent-list", request=request) + f"?host={action.host_id}"
    return None


def as_row(item: drift.Drift, request) -> dict:
    action = item.action
    return {
        "kind": item.kind, "kind_label": item.kind_label, "severity": item.severity, "message": item.message,
        "action": {"code": action.code, "text": action.text, "host": action.host_id,
                   "operation": action.operation_id, "url": _action_url(action, request)},
        "host": item.host_id, "host_name": item.host_name, "other_host": item.other_host_id,
        "other_host_name": item.other_host_name, "vm": item.vm_id, "vm_name": item.vm_name,
        "vm_uuid": item.vm_uuid, "gpu": item.gpu_id, "gpu_bus_id": item.gpu_bus_id,
        "inventory": item.inventory, "hypervisor": item.hypervisor, "telemetry": item.telemetry,
    }


@extend_schema(parameters=[
    OpenApiParameter("kind", OpenApiTypes.STR, many=True, enum=[k for k, _ in drift.Kind.CHOICES],
                     description="Only these kinds (repeat for several)"),
    OpenApiParameter("host", OpenApiTypes.STR, description="A host by id or name: items about it, on either side"),
    OpenApiParameter("severity", OpenApiTypes.STR, enum=[s for s, _ in drift.Severity.CHOICES]),
])
class DriftViewSet(viewsets.GenericViewSet):
    """Drift between the inventory, the hypervisors' last reads and the agents' recent readings,
    most severe first."""

    permission_classes = [IsDriftAdmin]
    serializer_class = DriftSerializer
    filter_backends = [KnownParametersFilter]
    extra_query_params = tuple(DriftFilterForm.base_fields)

    def get_queryset(self):
        """Drift is computed, not stored: no rows (the browsable API asks for them)."""
        return []

    def list(self, request, format=None):
        self.filter_queryset([])  # unknown parameters are a 400 (config.api.filters)
        form = DriftFilterForm(request.query_params)
        if not form.is_valid():
            raise ValidationError(form.errors)
        rows = [as_row(item, request) for item in form.selected(fleet_drift())]
        page = self.paginate_queryset(rows)
        if page is not None:
            return self.get_paginated_response(self.get_serializer(page, many=True).data)
        return Response(self.get_serializer(rows, many=True).data)  # ?format=csv: every row

"""The `operations/` resource of the v1 API: changes carried out on hypervisors.

Read by every signed-in user, scoped like VMs (an artist sees the operations of their own VMs,
a 404 for the rest); each operation lists its steps with their state, times and error, so a
script can follow one to its end. `POST {id}/run/` (admins) runs a pending operation now,
whatever its window; `POST {id}/cancel/` withdraws one that has not started. Operations are
created by approvals and optimizer plans, never here.
"""

from __future__ import annotations

from drf_spectacular.utils import OpenApiResponse, extend_schema
from rest_framework import serializers, status, viewsets
from rest_framework.decorators import action
from rest_framework.response import Response

from config.api.permissions import IsFleetAdminOrReadOnly
from config.api.serializers import DetailSerializer
from hypervisors import operations
from hypervisors.filtersets import OperationFilterSet
from hypervisors.models import Operation, OperationStep
from hypervisors.queries import operations_for


class IsOperationAdmin(IsFleetAdminOrReadOnly):
    message = "Only fleet admins (staff) may run operations."


class OperationStepSerializer(serializers.ModelSerializer):
    name = serializers.CharField(source="get_kind_display", read_only=True)

    class Meta:
        model = OperationStep
        fields = ["index", "kind", "name", "status", "started_at", "finished_at", "error", "result"]
        read_only_fields = fields


class OperationSerializer(serializers.ModelSerializer):
    """An operation with its steps in order (`result` keeps what a step made, such as a created
    vGPU device; a saved definition is left out of it)."""

    vm_name = serializers.CharField(source="vm.name", read_only=True)
    host_name = serializers.CharField(source="host.name", read_only=True)
    target_host_name = serializers.CharField(source="target_host.name", read_only=True)
    created_by = serializers.SlugRelatedField(slug_field="username", read_only=True, allow_null=True)
    steps = serializers.SerializerMethodField()

    class Meta:
        model = Operation
        fields = ["id", "kind", "status", "vm", "vm_name", "host", "host_name", "target_host", "target_host_name",
                  "request", "origin", "not_before", "not_after", "run_now", "created_by", "created_at", "started_at",
                  "finished_at", "heartbeat_at", "error", "steps"]
        read_only_fields = fields

    @staticmethod
    def _public(step: OperationStep) -> dict:
        data = OperationStepSerializer(step).data
        data["result"] = {key: value for key, value in (step.result or {}).items() if key != "definition"}
        return data

    def get_steps(self, obj) -> list[dict]:
        return [self._public(step) for step in obj.steps.all()]


class CancelSerializer(serializers.Serializer):
    reason = serializers.CharField(required=False, allow_blank=True, default="", max_length=500,
                                   help_text="Why, for the artist (their request is marked failed with it)")


class OperationViewSet(viewsets.ReadOnlyModelViewSet):
    serializer_class = OperationSerializer
    permission_classes = [IsOperationAdmin]
    filterset_class = OperationFilterSet
    ordering_fields = ["created_at", "status", "id"]
    ordering = ["-created_at", "-id"]

    def get_queryset(self):
        return operations_for(self.request.user)

    @extend_schema(request=CancelSerializer,
                   responses={200: OperationSerializer, 409: OpenApiResponse(DetailSerializer)})
    @action(detail=True, methods=["post"])
    def cancel(self, request, pk=None, format=None):
        """Cancel a pending operation (nothing on the hypervisor was touched): the inventory goes back,
        the request is marked failed with the reason; 409 once a worker took it."""
        body = CancelSerializer(data=request.data)
        body.is_valid(raise_exception=True)
        operation = operations.cancel(self.get_object(), request.user, body.validated_data["reason"])
        return Response(self.get_serializer(operation).data)

    @extend_schema(request=None, responses={202: OperationSerializer, 409: OpenApiResponse(DetailSerializer)})
    @action(detail=True, methods=["post"])
    def run(self, request, pk=None, format=None):
        """Run a pending operation now (its window is ignored); 409 when it is not pending."""
        operation = operations.run_now(self.get_object(), request.user)
        return Response(self.get_serializer(operation).data, status=status.HTTP_202_ACCEPTED)

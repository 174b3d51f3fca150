"""`resize-requests/`: artists file and cancel requests for their own VMs; admins approve or reject them.

Every row carries `evidence`: the VM's right-sizing suggestion (kind, target, reason, figures)
and whether it asks for what the request asks, read in the list's own query.
"""

from __future__ import annotations

from django.db.models import QuerySet
from drf_spectacular.utils import extend_schema, extend_schema_field
from rest_framework import mixins, serializers, status, viewsets
from rest_framework.decorators import action
from rest_framework.exceptions import PermissionDenied, ValidationError
from rest_framework.permissions import IsAuthenticated
from rest_framework.response import Response

from config.api.caching import CachedListMixin
from config.api.permissions import IsFleetAdmin
from config.api.serializers import ExpandableMixin
from config.roles import is_fleet_admin
from fleet import requests as service
from fleet.models import ResizeRequest, VgpuProfile
from fleet.queries import visible_vms


class ResizeRequestSerializer(ExpandableMixin, serializers.ModelSerializer):
    expandable_fields = ("vm", "current_profile", "requested_profile", "requested_by", "decided_by")
    fits = serializers.SerializerMethodField(help_text="Where the request fits now: same_gpu, other_gpu, "
                                                       "other_host or nowhere (n/a once decided)")
    requested_profile = serializers.PrimaryKeyRelatedField(
        queryset=VgpuProfile.objects.all(), required=False,
        help_text="The target profile; omitted: the VM's own (a change of vCPUs or RAM alone)")
    evidence = serializers.SerializerMethodField(help_text="The VM's right-sizing evidence next to the request")

    class Meta:
        model = ResizeRequest
        fields = ["id", "vm", "current_profile", "current_vgpus", "requested_profile", "requested_vgpus", "reason",
                  "status", "requested_by", "decided_by", "decided_at", "decision_comment", "wished_from",
                  "wished_until", "last_error", "created_at", "fits", "evidence", "current_vcpus", "current_ram_gib",
                  "requested_vcpus", "requested_ram_gib"]
        read_only_fields = ["current_profile", "current_vgpus", "status", "requested_by", "decided_by",
                            "decided_at", "decision_comment", "last_error", "created_at", "current_vcpus",
                            "current_ram_gib"]

    @extend_schema_field({"type": "object", "properties": {
        "where": {"type": "string"}, "gpus": {"type": "array", "items": {"type": "string"}},
        "host": {"type": "string"}, "reason": {"type": "string"}, "detail": {"type": "string"}}})
    def get_fits(self, obj: ResizeRequest) -> dict:
        if self.context.get("view") is None or self.context["view"].action != "retrieve":
            return {"where": "", "gpus": [], "host": "", "reason": "see the request's detail", "detail": ""}
        fit = service.fits(obj)
        return {"where": fit.where, "gpus": list(fit.gpus), "host": fit.host, "reason": fit.reason,
                "detail": fit.detail}

    @extend_schema_field({"type": "object", "properties": {
        "action": {"type": "string", "description": "upsize, downsize, keep, insufficient_data; empty without one"},
        "label": {"type": "string"}, "suggested": {"type": "string"}, "reason": {"type": "string"},
        "figures": {"type": "string"}, "matches_request": {"type": "boolean", "nullable": True},
        "from_suggestion": {"type": "boolean"}}})
    def get_evidence(self, obj: ResizeRequest) -> dict:
        return service.evidence_of(obj.vm, obj).as_dict()

    def validate_vm(self, vm):
        if not visible_vms(self.context["request"].user).filter(pk=vm.pk).exists():
            raise PermissionDenied("You may only request changes for your own workstation.")
        return vm


class DecisionSerializer(serializers.Serializer):
    comment = serializers.CharField(required=False, allow_blank=True, default="",
                                    help_text="Optional for approve; required for reject (the artist reads it)")


class ApprovalSerializer(DecisionSerializer):
    run_now = serializers.BooleanField(
        required=False, default=False,
        help_text="On a host linked to its hypervisor: start the operation that carries the change out now, rather "
                  "than in the request's wished window or when an admin runs it (see /api/v1/operations/)")


class ResizeRequestViewSet(CachedListMixin, mixins.ListModelMixin, mixins.RetrieveModelMixin, mixins.CreateModelMixin,
                           viewsets.GenericViewSet):
    """Artists see and file requests for their own VMs only; approve/reject are for admins."""

    serializer_class = ResizeRequestSerializer
    permission_classes = [IsAuthenticated]
    filterset_fields = {"status": ["exact"], "vm": ["exact"], "vm__artist": ["exact"]}

    def get_queryset(self) -> QuerySet[ResizeRequest]:
        qs = ResizeRequest.objects.select_related(
            "vm__host", "vm__suggestion__suggested_profile", "requested_profile").order_by("-created_at", "-id")
        user = self.request.user
        if getattr(self, "swagger_fake_view", False):
            return qs.none()
        return qs if is_fleet_admin(user) else qs.filter(vm__artist__user=user)

    def perform_create(self, serializer):
        data = serializer.validated_data
        try:
            profile = data.get("requested_profile")
            serializer.instance = service.file_request(
                data["vm"], self.request.user, profile, data.get("requested_vgpus", 1 if profile else None),
                data.get("reason", ""), data.get("wished_from"), data.get("wished_until"),
                requested_vcpus=data.get("requested_vcpus"), requested_ram_gib=data.get("requested_ram_gib"))
        except service.RequestError as exc:
            raise ValidationError(exc.errors) from exc

    def _decision(self, request, fn, body_class=DecisionSerializer):
        body = body_class(data=request.data)
        body.is_valid(raise_exception=True)
        options = {name: value for name, value in body.validated_data.items() if name != "comment"}
        try:
            result = fn(self.get_object(), request.user, body.validated_data["comment"], **options)
        except service.RequestError as exc:
            raise ValidationError(exc.errors) from exc
        return Response(ResizeRequestSerializer(result, context=self.get_serializer_context()).data)

    @extend_schema(request=ApprovalSerializer, responses={200: ResizeRequestSerializer})
    @action(detail=True, methods=["post"], permission_classes=[IsFleetAdmin])
    def approve(self, request, pk=None, format=None):
        """Apply the request now (409 with the reason when nothing takes it; it stays pending). On a host
        linked to its hypervisor the request becomes `applying` and an operation carries it out."""
        return self._decision(request, service.approve, ApprovalSerializer)

    @extend_schema(request=DecisionSerializer, responses={200: ResizeRequestSerializer})
    @action(detail=True, methods=["post"], permission_classes=[IsFleetAdmin])
    def reject(self, request, pk=None, format=None):
        """Reject the request with a comment (400 without one; the artist is told why)."""
        return self._decision(request, service.reject)

    @extend_schema(request=None, responses={200: ResizeRequestSerializer})
    @action(detail=True, methods=["post"])
    def cancel(self, request, pk=None, format=None):
        """Withdraw a pending request (its artist or an admin; 409 once decided)."""
        try:
            result = service.cancel(self.get_object(), request.user)
        except PermissionError as exc:
            raise PermissionDenied(str(exc)) from exc
        return Response(ResizeRequestSerializer(result, context=self.get_serializer_context()).data,
                        status=status.HTTP_200_OK)

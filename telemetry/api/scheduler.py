"""Scheduler policies in the v1 API: gpus/{id}/scheduler/ (GET, PUT, DELETE), its apply/ action,
and the host and GPU model defaults (hosts/{id}/scheduler/, gpu-models/{id}/scheduler/).

Staff only, reading included: the scheduler is fleet administration, and an artist's own GPU
is shared with other artists' vGPUs, so an artist gets 403 here (DESIGN.md roles).
Thin: parsing in the serializers, rules in `fleet.scheduler`, writes in `fleet.scheduler_policies`.
"""

from __future__ import annotations

from django.shortcuts import get_object_or_404
from django.urls import path
from drf_spectacular.utils import OpenApiResponse, extend_schema
from rest_framework import serializers, status
from rest_framework.response import Response
from rest_framework.views import APIView

from config.api.permissions import IsFleetAdmin
from fleet import scheduler, scheduler_policies
from fleet.choices import SchedulerApplyState, SchedulerPolicyName, SchedulerScope
from fleet.models import Gpu, GpuModel, Host, SchedulerPolicy
from telemetry import scheduler_apply


class IsSchedulerAdmin(IsFleetAdmin):
    message = "Only fleet admins (staff) may see or change GPU scheduler policies."


class SchedulerSettingsSerializer(serializers.Serializer):
    """The settings an admin sends; ranges and combinations are checked by `fleet.scheduler.validate`
    so the API and the page give the same messages."""

    policy = serializers.ChoiceField(choices=SchedulerPolicyName.choices)
    arr = serializers.BooleanField(default=False, help_text="adaptive round-robin (equal/fixed share only)")
    frequency_hz = serializers.IntegerField(required=False, allow_null=True, default=None,
                                            help_text="63-960 Hz, with ARR; null for the driver's default")
    avg_factor = serializers.IntegerField(required=False, allow_null=True, default=None,
                                          help_text="1-60, with ARR; null for the driver's default (33)")
    timeslice_ms = serializers.IntegerField(required=False, allow_null=True, default=None,
                                            help_text="1-30 ms, without ARR; null for the driver's default")

    def to_settings(self) -> scheduler.SchedulerSettings:
        return scheduler.SchedulerSettings(**self.validated_data)


class PersistentLineSerializer(serializers.Serializer):
    label = serializers.CharField()
    line = serializers.CharField()


class CommandsSerializer(serializers.Serializer):
    runtime = serializers.CharField(help_text="nvidia-smi line for the running driver (not persistent)")
    rmpvmrl = serializers.CharField(help_text="RmPVMRL registry value")
    persistent = PersistentLineSerializer(many=True)
    notes = serializers.ListField(child=serializers.CharField())


class GpuSchedulerSerializer(serializers.Serializer):
    gpu = serializers.IntegerField()
    desired = SchedulerSettingsSerializer()
    desired_with_defaults = SchedulerSettingsSerializer()
    source = serializers.ChoiceField(choices=["gpu", "host", "gpu_model", "driver"],
                                     help_text="where the desired policy comes from")
    reported = serializers.DictField(allow_null=True, help_text="the agent's last scheduler reading")
    reported_at = serializers.DateTimeField(allow_null=True)
    drift = serializers.ListField(child=serializers.CharField(), help_text="fields where reported differs")
    vgpu_count = serializers.IntegerField()
    apply_state = serializers.ChoiceField(choices=SchedulerApplyState.choices)
    apply_detail = serializers.CharField(allow_blank=True)
    applied_at = serializers.DateTimeField(allow_null=True)
    agent_can_apply = serializers.BooleanField(
        help_text="apply/ can work: the host's agent reports a write token (--write-token-file) and the GPU has a "
                  "UUID; otherwise apply the commands by hand")
    commands = CommandsSerializer()


class DefaultSerializer(serializers.Serializer):
    scope = serializers.ChoiceField(choices=SchedulerScope.choices)
    target = serializers.IntegerField()
    policy = SchedulerSettingsSerializer(allow_null=True)
    updated_at = serializers.DateTimeField(allow_null=True)


class ErrorSerializer(serializers.Serializer):
    detail = serializers.CharField()


def gpu_scheduler_data(view: scheduler_policies.GpuScheduler) -> dict:
    commands = view.commands
    row = view.row if view.source == SchedulerScope.GPU else None
    return {
        "gpu": view.gpu.pk,
        "desired": view.desired.as_dict(),
        "desired_with_defaults": view.shown.as_dict(),
        "source": view.source,
        "reported": view.reported,
        "reported_at": view.gpu.scheduler_reported_at,
        "drift": view.drift,
        "vgpu_count": view.vgpu_count,
        "apply_state": view.apply_state,
        "apply_detail": view.apply_detail,
        "applied_at": row.applied_at if row else None,
        "agent_can_apply": scheduler_apply.agent_can_apply(view.gpu, scheduler_apply.agent_for(view.gpu)),
        "commands": {"runtime": commands.runtime, "rmpvmrl": commands.rmpvmrl,
                     "persistent": [{"label": label, "line": line} for label, line in commands.persistent],
                     "notes": commands.notes},
    }


def _invalid(exc: scheduler_policies.SchedulerValidationError) -> Response:
    return Response(exc.errors, status=status.HTTP_400_BAD_REQUEST)


def _parsed(request) -> scheduler.SchedulerSettings:
    serializer = SchedulerSettingsSerializer(data=request.data)
    serializer.is_valid(raise_exception=True)
    return serializer.to_settings()


class GpuSchedulerView(APIView):
    """One GPU's scheduler: desired (and where it comes from), reported, drift, and the commands."""

    permission_classes = [IsSchedulerAdmin]

    def _gpu(self, pk: int) -> Gpu:
        return get_object_or_404(Gpu.objects.select_related("host", "gpu_model"), pk=pk)

    def _answer(self, gpu: Gpu, code: int = status.HTTP_200_OK) -> Response:
        gpu.refresh_from_db(fields=["scheduler_reported", "scheduler_reported_at"])
        return Response(gpu_scheduler_data(scheduler_policies.gpu_scheduler(gpu)), status=code)

    @extend_schema(responses=GpuSchedulerSerializer)
    def get(self, request, pk: int):
        scheduler_policies.release_staged()
        return self._answer(self._gpu(pk))

    @extend_schema(request=SchedulerSettingsSerializer, responses={
        200: GpuSchedulerSerializer, 400: OpenApiResponse(description="field messages")})
    def put(self, request, pk: int):
        gpu = self._gpu(pk)
        try:
            scheduler_policies.set_gpu_policy(gpu, _parsed(request), request.user)
        except scheduler_policies.SchedulerValidationError as exc:
            return _invalid(exc)
        return self._answer(gpu)

    @extend_schema(responses=GpuSchedulerSerializer)
    def delete(self, request, pk: int):
        """Drop the GPU's own policy: its host's or model's default (or the driver's) applies again."""
        gpu = self._gpu(pk)
        row = SchedulerPolicy.objects.filter(gpu=gpu).first()
        if row is not None:
            scheduler_policies.clear_policy(row)
        return self._answer(gpu)


class GpuSchedulerApplyView(APIView):
    """Apply the GPU's desired policy through its host's agent (needs the agent's write token)."""

    permission_classes = [IsSchedulerAdmin]

    @extend_schema(request=None, responses={
        200: GpuSchedulerSerializer, 409: OpenApiResponse(ErrorSerializer, description="no agent can apply it")})
    def post(self, request, pk: int):
        gpu = get_object_or_404(Gpu.objects.select_related("host", "gpu_model"), pk=pk)
        try:
            scheduler_apply.apply_through_agent(gpu, request.user)
        except scheduler_apply.AgentUnavailable as exc:
            return Response({"detail": str(exc)}, status=status.HTTP_409_CONFLICT)
        gpu.refresh_from_db(fields=["scheduler_reported", "scheduler_reported_at"])
        return Response(gpu_scheduler_data(scheduler_policies.gpu_scheduler(gpu)))


class _DefaultView(APIView):
    """The scheduler default of a host or a GPU model, for its GPUs without their own policy."""

    permission_classes = [IsSchedulerAdmin]
    model: type = Host
    scope = SchedulerScope.HOST

    def _data(self, target) -> dict:
        row = SchedulerPolicy.objects.filter(**{self.scope: target}).first()
        return {"scope": self.scope, "target": target.pk,
                "policy": scheduler_policies.settings_of(row).as_dict() if row else None,
                "updated_at": row.updated_at if row else None}

    @extend_schema(responses=DefaultSerializer)
    def get(self, request, pk: int):
        return Response(self._data(get_object_or_404(self.model, pk=pk)))

    @extend_schema(request=SchedulerSettingsSerializer, responses={
        200: DefaultSerializer, 400: OpenApiResponse(description="field messages")})
    def put(self, request, pk: int):
        target = get_object_or_404(self.model, pk=pk)
        try:
            scheduler_policies.set_default(target, _parsed(request), request.user)
        except scheduler_policies.SchedulerValidationError as exc:
            return _invalid(exc)
        return Response(self._data(target))

    @extend_schema(responses=DefaultSerializer)
    def delete(self, request, pk: int):
        target = get_object_or_404(self.model, pk=pk)
        row = SchedulerPolicy.objects.filter(**{self.scope: target}).first()
        if row is not None:
            scheduler_policies.clear_policy(row)
        return Response(self._data(target))


class HostSchedulerDefaultView(_DefaultView):
    model = Host
    scope = SchedulerScope.HOST


class GpuModelSchedulerDefaultView(_DefaultView):
    model = GpuModel
    scope = SchedulerScope.GPU_MODEL


#: Mounted by fleet/api/urls.py before the router, so gpus/{id}/scheduler/ is not taken for a GPU action.
urlpatterns = [
    path("gpus/<int:pk>/scheduler/", GpuSchedulerView.as_view(), name="gpu-scheduler"),
    path("gpus/<int:pk>/scheduler/apply/", GpuSchedulerApplyView.as_view(), name="gpu-scheduler-apply"),
    path("hosts/<int:pk>/scheduler/", HostSchedulerDefaultView.as_view(), name="host-scheduler-default"),
    path("gpu-models/<int:pk>/scheduler/", GpuModelSchedulerDefaultView.as_view(),
         name="gpumodel-scheduler-default"),
]

"""The GPU resource of the v1 API (`/api/v1/gpus/`): the inventory's GPUs (fleet.api.views), whose
detail adds the newest telemetry reading and health. Routed here because the detail reads
telemetry, which the inventory's API below it may not import. Also `/api/v1/hosts/{id}/driver/`,
the NVIDIA software a host's agent reports, for the same reason."""

from __future__ import annotations

from django.shortcuts import get_object_or_404
from django.urls import path
from drf_spectacular.utils import extend_schema, extend_schema_field
from rest_framework import serializers
from rest_framework.response import Response
from rest_framework.views import APIView

from fleet import queries
from fleet.api import views as fleet_views
from fleet.api.serializers import GpuSerializer
from fleet.models import Gpu
from telemetry.payload import THROTTLE_NAMES
from telemetry.queries import RECENT_XIDS, gpu_health, host_driver, latest_gpu_samples


class GpuSampleSerializer(serializers.Serializer):
    """The newest telemetry sample of a GPU (metrics the GPU does not report are null)."""

    ts = serializers.DateTimeField()
    util_gpu = serializers.FloatField(allow_null=True, help_text="3D/compute utilization, %")
    util_mem = serializers.FloatField(allow_null=True, help_text="Memory controller utilization, %")
    fb_used_mib = serializers.IntegerField(allow_null=True)
    fb_total_mib = serializers.IntegerField(allow_null=True)
    enc_util = serializers.FloatField(allow_null=True, help_text="Encoder utilization, %")
    dec_util = serializers.FloatField(allow_null=True, help_text="Decoder utilization, %")
    temp_c = serializers.FloatField(allow_null=True)
    power_w = serializers.FloatField(allow_null=True)
    sm_clock_mhz = serializers.IntegerField(allow_null=True)


class XidErrorSerializer(serializers.Serializer):
    code = serializers.IntegerField(help_text="XID code (NVIDIA's Xid catalogue), e.g. 79: fallen off the bus")
    at = serializers.DateTimeField(help_text="When the driver raised it, by the host's clock (whole seconds)")


class GpuHealthSerializer(serializers.Serializer):
    """A GPU's latest health reading. Null fields: not reported; those the GPU or driver does not
    support are named in `unsupported` (never 0)."""

    ecc_mode = serializers.ChoiceField(choices=["enabled", "disabled"], allow_null=True)
    ecc_corrected_volatile = serializers.IntegerField(allow_null=True, help_text="Since the last driver load")
    ecc_uncorrected_volatile = serializers.IntegerField(allow_null=True)
    ecc_corrected_aggregate = serializers.IntegerField(allow_null=True, help_text="Over the GPU's lifetime")
    ecc_uncorrected_aggregate = serializers.IntegerField(allow_null=True)
    retired_pages_sbe = serializers.IntegerField(allow_null=True, help_text="Pages retired for single-bit errors")
    retired_pages_dbe = serializers.IntegerField(allow_null=True, help_text="Pages retired for double-bit errors")
    retired_pages_pending = serializers.BooleanField(allow_null=True, help_text="A retirement waits for a reset")
    remapped_rows_correctable = serializers.IntegerField(allow_null=True)
    remapped_rows_uncorrectable = serializers.IntegerField(allow_null=True)
    remapped_rows_pending = serializers.BooleanField(allow_null=True, help_text="A remap waits for a reset")
    remapped_rows_failure = serializers.BooleanField(allow_null=True, help_text="A row could not be remapped")
    throttle_reasons = serializers.ListField(
        child=serializers.ChoiceField(choices=sorted(THROTTLE_NAMES)), allow_null=True,
        help_text="Why the clocks are held back (NVML clocks event reasons); [] when they are not")
    pcie_replay_counter = serializers.IntegerField(allow_null=True)
    fan_speed_pct = serializers.FloatField(allow_null=True)
    temp_slowdown_c = serializers.FloatField(allow_null=True, help_text="Temperature where the GPU slows down")
    temp_shutdown_c = serializers.FloatField(allow_null=True, help_text="Temperature where the GPU shuts down")
    power_limit_w = serializers.FloatField(allow_null=True, help_text="Enforced power limit, watts")
    performance_state = serializers.CharField(allow_null=True, help_text="P0 (fastest) .. P15")
    unsupported = serializers.ListField(child=serializers.CharField(),
                                        help_text="Fields the GPU or its driver does not support")
    changed_at = serializers.DateTimeField(allow_null=True,
                                           help_text="When the reading last changed (null: only XIDs known)")
    xid_errors = XidErrorSerializer(many=True, help_text=f"The {RECENT_XIDS} newest XID errors, newest first")


class GpuDetailSerializer(GpuSerializer):
    latest = serializers.SerializerMethodField(
        help_text="Newest telemetry sample of this GPU, or null when none was collected yet. Also null for an "
                  "artist where other workstations share the GPU: its readings would show their usage",
    )
    health = serializers.SerializerMethodField(
        help_text="The GPU's latest health reading and newest XID errors, or null when its agent reports no "
                  "health (older agents, sources without it). Null for an artist where `latest` is",
    )

    class Meta(GpuSerializer.Meta):
        fields = [*GpuSerializer.Meta.fields, "latest", "health"]

    def _may_read(self, gpu: Gpu) -> bool:
        """Whether the caller may read this GPU's readings (`queries.gpu_telemetry_visible`), asked once."""
        request = self.context.get("request")
        if request is None:
            return False
        asked = self.context.setdefault("may_read", {})
        if gpu.pk not in asked:
            asked[gpu.pk] = queries.may_read_gpu_telemetry(request.user, gpu.pk)
        return asked[gpu.pk]

    @extend_schema_field(GpuSampleSerializer(allow_null=True))
    def get_latest(self, gpu: Gpu) -> dict | None:
        """The GPU's newest sample however old (the detail shows when it was taken), or None (also
        where the caller may not read this GPU's readings: `queries.gpu_telemetry_visible`)."""
        if not self._may_read(gpu):
            return None
        sample = latest_gpu_samples([gpu.pk]).get(gpu.pk)
        return GpuSampleSerializer(sample).data if sample else None

    @extend_schema_field(GpuHealthSerializer(allow_null=True))
    def get_health(self, gpu: Gpu) -> dict | None:
        if not self._may_read(gpu):
            return None
        health = gpu_health(gpu.pk)
        return GpuHealthSerializer(health).data if health else None


class GpuViewSet(fleet_views.GpuViewSet):
    __doc__ = fleet_views.GpuViewSet.__doc__

    def get_serializer_class(self):
        if self.action == "retrieve":
            return GpuDetailSerializer
        return super().get_serializer_class()


class HostDriverSerializer(serializers.Serializer):
    """The NVIDIA software the host's agent last reported; null fields were not reported, those
    the host does not have (no vGPU manager on a bare-metal host) are named in `unsupported`."""

    host = serializers.IntegerField()
    driver_version = serializers.CharField(allow_null=True, help_text="e.g. 580.159.04")
    vgpu_manager_version = serializers.CharField(allow_null=True, help_text="vGPU software release, e.g. 19.2")
    nvml_version = serializers.CharField(allow_null=True)
    cuda_driver_version = serializers.IntegerField(allow_null=True, help_text="e.g. 13000 for CUDA 13.0")
    unsupported = serializers.ListField(child=serializers.CharField())
    changed_at = serializers.DateTimeField(allow_null=True, help_text="When the versions last changed; null: "
                                                                      "the host's agent never reported them")


class HostDriverView(APIView):
    """The driver and vGPU manager versions of a host, as its agent reports them (read-only). Seen by
    whoever may see the host (an artist: the hosts of their own VMs; others are 404)."""

    @extend_schema(responses=HostDriverSerializer)
    def get(self, request, pk: int):
        host = get_object_or_404(queries.visible_hosts(request.user), pk=pk)
        driver = host_driver(host.pk) or {"unsupported": [], "changed_at": None}
        return Response(HostDriverSerializer({"host": host.pk, **driver}).data)


urlpatterns = [
    path("hosts/<int:pk>/driver/", HostDriverView.as_view(), name="host-driver"),
]

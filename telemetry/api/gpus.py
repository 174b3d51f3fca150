"""The GPU resource of the v1 API (`/api/v1/gpus/`): the inventory's GPUs (fleet.api.views), whose
detail adds the newest telemetry reading. Routed here because the detail reads telemetry, which
the inventory's API below it may not import."""

from __future__ import annotations

from drf_spectacular.utils import extend_schema_field
from rest_framework import serializers

from fleet import queries
from fleet.api import views as fleet_views
from fleet.api.serializers import GpuSerializer
from fleet.models import Gpu
from telemetry.queries import latest_gpu_samples


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


class GpuDetailSerializer(GpuSerializer):
    latest = serializers.SerializerMethodField(
        help_text="Newest telemetry sample of this GPU, or null when none was collected yet. Also null for an "
                  "artist where other workstations share the GPU: its readings would show their usage",
    )

    class Meta(GpuSerializer.Meta):
        fields = [*GpuSerializer.Meta.fields, "latest"]

    @extend_schema_field(GpuSampleSerializer(allow_null=True))
    def get_latest(self, gpu: Gpu) -> dict | None:
        """The GPU's newest sample however old (the detail shows when it was taken), or None (also
        where the caller may not read this GPU's readings: `queries.gpu_telemetry_visible`)."""
        request = self.context.get("request")
        if request is None or not queries.may_read_gpu_telemetry(request.user, gpu.pk):
            return None
        sample = latest_gpu_samples([gpu.pk]).get(gpu.pk)
        return GpuSampleSerializer(sample).data if sample else None


class GpuViewSet(fleet_views.GpuViewSet):
    __doc__ = fleet_views.GpuViewSet.__doc__

    def get_serializer_class(self):
        if self.action == "retrieve":
            return GpuDetailSerializer
        return super().get_serializer_class()

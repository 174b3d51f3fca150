"""Serializers of the v1 inventory API (DESIGN.md, "REST API contract (v1)").

They parse and render; writes that the placement rules govern are handed to `fleet.services`
(which raise `PlacementError`, turned into 400/409 by `fleet.api.exceptions`). Read-only
figures (`allocated_vcpus`, `used_fb_mib`, ...) come from annotations of `fleet.queries`, so a
list costs the same number of queries whatever its length.
"""

from drf_spectacular.extensions import OpenApiSerializerExtension
from drf_spectacular.utils import extend_schema_field
from rest_framework import serializers

from fleet import queries, services
from fleet.models import Artist, Gpu, GpuModel, Host, Vgpu, VgpuProfile, VirtualMachine
from telemetry.queries import latest_gpu_samples


class GpuModelSerializer(serializers.ModelSerializer):
    class Meta:
        model = GpuModel
        fields = ["id", "name", "code", "fb_mib", "gpus_per_board", "mixed_size_capable", "multi_vgpu_full_only"]
        extra_kwargs = {"fb_mib": {"min_value": 1}, "gpus_per_board": {"min_value": 1}}


class VgpuProfileSerializer(serializers.ModelSerializer):
    class Meta:
        model = VgpuProfile
        fields = ["id", "name", "gpu_model", "series", "fb_mib", "max_per_gpu", "max_per_gpu_mixed", "max_per_vm"]
        extra_kwargs = {"fb_mib": {"min_value": 1}, "max_per_gpu": {"min_value": 1},
                        "max_per_gpu_mixed": {"min_value": 1}}


class HostSerializer(serializers.ModelSerializer):
    """A GPU server. Its capacity (threads and RAM times overcommit) cannot shrink below what
    the VMs on it claim. Changes are saved through `services.update_host`."""

    allocated_vcpus = serializers.IntegerField(read_only=True, help_text="vCPUs claimed by the VMs on this host")
    allocated_ram_gib = serializers.IntegerField(read_only=True, help_text="RAM claimed by the VMs on this host, GiB")
    gpu_count = serializers.IntegerField(read_only=True, help_text="Physical GPUs in this host")

    class Meta:
        model = Host
        fields = ["id", "name", "hypervisor", "cpu_model", "cpu_threads", "ram_gib", "vcpu_overcommit",
                  "ram_overcommit", "multi_vgpu_same_gpu", "allocated_vcpus", "allocated_ram_gib", "gpu_count"]
        extra_kwargs = {"cpu_threads": {"min_value": 1}, "ram_gib": {"min_value": 1}}

    def create(self, validated_data):
        return services.update_host(Host(**validated_data))

    def update(self, instance, validated_data):
        return services.update_host(instance, **validated_data)


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


class GpuSerializer(serializers.ModelSerializer):
    """A physical GPU. Its mode, size mode, host and model change only while it holds no vGPU
    (saved through `services.update_gpu`)."""

    used_fb_mib = serializers.IntegerField(read_only=True, help_text="Frame buffer taken by its vGPUs, MiB")
    vgpu_count = serializers.IntegerField(read_only=True, help_text="vGPUs placed on this GPU")

    class Meta:
        model = Gpu
        fields = ["id", "host", "gpu_model", "uuid", "pci_bus_id", "mode", "size_mode", "used_fb_mib", "vgpu_count"]

    def create(self, validated_data):
        return services.update_gpu(Gpu(**validated_data))

    def update(self, instance, validated_data):
        return services.update_gpu(instance, **validated_data)


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


class ArtistSerializer(serializers.ModelSerializer):
    class Meta:
        model = Artist
        fields = ["id", "user", "name", "workflow", "user_type"]
        extra_kwargs = {"user": {"help_text": "The login of this artist (one artist per user), or null"}}


class VmVgpuSerializer(serializers.ModelSerializer):
    """A vGPU as listed inside its VM."""

    class Meta:
        model = Vgpu
        fields = ["id", "gpu", "profile"]
        read_only_fields = fields


class VirtualMachineSerializer(serializers.ModelSerializer):
    """A virtual workstation. Its host is set by placing its first vGPU (read-only here); a
    change of vCPUs or RAM must fit the host's capacity (saved through `services.update_vm`)."""

    vgpus = VmVgpuSerializer(many=True, read_only=True)

    class Meta:
        model = VirtualMachine
        fields = ["id", "name", "uuid", "artist", "vcpus", "ram_gib", "host", "vgpus"]
        read_only_fields = ["host"]
        extra_kwargs = {"vcpus": {"min_value": 1}, "ram_gib": {"min_value": 1}}

    def update(self, instance, validated_data):
        return services.update_vm(instance, **validated_data)


class VgpuSerializer(serializers.ModelSerializer):
    """A vGPU of a VM on a physical GPU. Created by placement (`services.place_vgpu`), which
    checks the rules and picks the placement ID (its slot on the GPU)."""

    class Meta:
        model = Vgpu
        fields = ["id", "vm", "gpu", "profile", "placement_id"]
        read_only_fields = ["placement_id"]

    def create(self, validated_data):
        return services.place_vgpu(validated_data["vm"], validated_data["gpu"], validated_data["profile"])


class ViolationSerializer(serializers.Serializer):
    rule = serializers.CharField(help_text="Stable code of the rule, e.g. frame_buffer, max_per_gpu, host_vcpu")
    message = serializers.CharField(help_text="The refusal with the numbers behind it")


class PlacementErrorSerializer(serializers.Serializer):
    """Body of a 400 (a placement rule refused) or 409 (the fleet changed under the request)."""

    detail = serializers.CharField()
    violations = ViolationSerializer(many=True)


class DetailSerializer(serializers.Serializer):
    """Body of a plain error, e.g. a 409 when a deleted object is still referred to."""

    detail = serializers.CharField()


class InvalidOrRefusedSerializer(serializers.Serializer):
    """Body of a 400 on a write the placement rules govern: DRF's field messages (invalid input),
    its `detail` alone (an unreadable body), or a rule's refusal (`PlacementErrorSerializer`).
    Documented by `InvalidOrRefusedSchema`: a client must expect all three shapes."""


class InvalidOrRefusedSchema(OpenApiSerializerExtension):
    """Schema of `InvalidOrRefusedSerializer`: any of the three bodies a 400 of such a write has."""

    target_class = InvalidOrRefusedSerializer

    def map_serializer(self, auto_schema, direction):
        field_messages = {"type": "object", "description": "Messages by field name (`non_field_errors`: the whole)",
                          "additionalProperties": {"type": "array", "items": {"type": "string"}}}
        return {"anyOf": [
            auto_schema.resolve_serializer(PlacementErrorSerializer, direction).ref,
            auto_schema.resolve_serializer(DetailSerializer, direction).ref,
            field_messages,
        ]}

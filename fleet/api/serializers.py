"""Serializers of the v1 inventory API (DESIGN.md, "REST API contract (v1)").

They parse and render; writes that the placement rules govern are handed to `fleet.services`
(which raise `PlacementError`, turned into 400/409 by `config.api.exceptions`). Read-only
figures (`allocated_vcpus`, `used_fb_mib`, ...) come from annotations of `fleet.queries`, so a
list costs the same number of queries whatever its length.
"""

from rest_framework import serializers

from config.api.serializers import ExpandableMixin
from fleet import hypervisor_link, services
from fleet.models import Artist, Gpu, GpuModel, Host, Vgpu, VgpuProfile, VirtualMachine
from fleet.pci import InvalidPciBusId, normalize_pci_bus_id


class GpuModelSerializer(serializers.ModelSerializer):
    class Meta:
        model = GpuModel
        fields = ["id", "name", "code", "fb_mib", "gpus_per_board", "mixed_size_capable", "multi_vgpu_full_only"]
        extra_kwargs = {"fb_mib": {"min_value": 1}, "gpus_per_board": {"min_value": 1}}


class VgpuProfileSerializer(ExpandableMixin, serializers.ModelSerializer):
    expandable_fields = ("gpu_model",)

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
        # hypervisor_secret_ref is the name of a file in the secrets folder, never the secret.
        fields = ["id", "name", "hypervisor", "cpu_model", "cpu_threads", "ram_gib", "vcpu_overcommit",
                  "ram_overcommit", "multi_vgpu_same_gpu", "hypervisor_uri", "hypervisor_secret_ref",
                  "allocated_vcpus", "allocated_ram_gib", "gpu_count"]
        extra_kwargs = {"cpu_threads": {"min_value": 1}, "ram_gib": {"min_value": 1}}

    def validate(self, attrs):
        """The link must be of the hypervisor the host runs (`hypervisor_link.check_kind`)."""
        current = self.instance or Host()
        uri = attrs.get("hypervisor_uri", current.hypervisor_uri)
        hypervisor = attrs.get("hypervisor", current.hypervisor)
        try:
            hypervisor_link.check_kind(uri, hypervisor)
        except hypervisor_link.InvalidLink as exc:
            raise serializers.ValidationError({"hypervisor_uri": [str(exc)]}) from None
        return attrs

    def create(self, validated_data):
        return services.update_host(Host(**validated_data))

    def update(self, instance, validated_data):
        return services.update_host(instance, **validated_data)


class GpuSerializer(ExpandableMixin, serializers.ModelSerializer):
    """A physical GPU. Its mode, size mode, host and model change only while it holds no vGPU
    (saved through `services.update_gpu`)."""

    expandable_fields = ("host", "gpu_model")
    used_fb_mib = serializers.IntegerField(read_only=True, help_text="Frame buffer taken by its vGPUs, MiB")
    vgpu_count = serializers.IntegerField(read_only=True, help_text="vGPUs placed on this GPU")

    class Meta:
        model = Gpu
        fields = ["id", "host", "gpu_model", "uuid", "pci_bus_id", "mode", "size_mode", "used_fb_mib", "vgpu_count"]

    def validate_pci_bus_id(self, value: str) -> str:
        """NVML's form (`fleet.pci`), before the unique check of (host, pci_bus_id) compares it."""
        try:
            return normalize_pci_bus_id(value)
        except InvalidPciBusId as exc:
            raise serializers.ValidationError(str(exc)) from None

    def create(self, validated_data):
        return services.update_gpu(Gpu(**validated_data))

    def update(self, instance, validated_data):
        return services.update_gpu(instance, **validated_data)


class ArtistSerializer(ExpandableMixin, serializers.ModelSerializer):
    expandable_fields = ("user",)

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


class VirtualMachineSerializer(ExpandableMixin, serializers.ModelSerializer):
    """A virtual workstation. Its host is set by placing its first vGPU (read-only here); a
    change of vCPUs or RAM must fit the host's capacity (saved through `services.update_vm`)."""

    expandable_fields = ("artist", "host")
    vgpus = VmVgpuSerializer(many=True, read_only=True)

    class Meta:
        model = VirtualMachine
        fields = ["id", "name", "uuid", "artist", "vcpus", "ram_gib", "host", "vgpus"]
        read_only_fields = ["host"]
        extra_kwargs = {"vcpus": {"min_value": 1}, "ram_gib": {"min_value": 1}}

    def update(self, instance, validated_data):
        return services.update_vm(instance, **validated_data)


class VgpuSerializer(ExpandableMixin, serializers.ModelSerializer):
    """A vGPU of a VM on a physical GPU. Created by placement (`services.place_vgpu`), which
    checks the rules and picks the placement ID (its slot on the GPU)."""

    expandable_fields = ("vm", "gpu", "profile")

    class Meta:
        model = Vgpu
        fields = ["id", "vm", "gpu", "profile", "placement_id", "device_id", "reported_device_id",
                  "reported_device_at"]
        # device_id: the vGPU instance on the host (mdev UUID or VF address), written by
        # hypervisor sync and operations, never through this resource. reported_device_*: the
        # mdev UUID the host agent reads for it and when that last changed, written by ingest.
        read_only_fields = ["placement_id", "device_id", "reported_device_id", "reported_device_at"]

    def create(self, validated_data):
        return services.place_vgpu(validated_data["vm"], validated_data["gpu"], validated_data["profile"])



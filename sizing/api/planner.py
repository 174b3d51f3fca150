"""The density planner and the workflow presets in the v1 API.

`POST /api/v1/sizing/plan/` (DESIGN.md contract): a server configuration and an artist mix (or
`from_measurements`: the fleet's VMs with their suggested profiles) give the servers needed and
a per-server, per-GPU layout. `workflow-presets/`: what each workflow gets by default; admins
read and edit them. Both are admin tools (staff and automation tokens of staff users): planning
shows the whole fleet's VMs in "from measurements" mode, and presets drive every plan. Artists
get 403.
"""

from __future__ import annotations

from django.db.models import QuerySet
from drf_spectacular.utils import OpenApiResponse, extend_schema, extend_schema_view
from rest_framework import mixins, serializers, viewsets
from rest_framework.response import Response
from rest_framework.views import APIView

from config.api.filters import KnownParametersFilter
from config.api.permissions import IsFleetAdmin
from fleet import placement
from fleet.choices import Series, SizeMode, Workflow
from fleet.models import GpuModel, VgpuProfile
from sizing import planner, planning
from sizing.models import WorkflowPreset
from sizing.presets import save_preset

MAX_ARTIST_ROWS = 100
MAX_HOSTS = 1000
#: The largest vGPU profile in NVIDIA's catalog (A100/H100 80C) bounds a preset's frame buffer.
MAX_PRESET_FB_MIB = 80 * 1024


class IsPlannerAdmin(IsFleetAdmin):
    message = "Only fleet admins (staff) may use the density planner and its presets."


# Request -------------------------------------------------------------------------------------


class ServerInputSerializer(serializers.Serializer):
    """One server configuration; the plan uses as many identical servers as it needs."""

    gpu_model = serializers.PrimaryKeyRelatedField(queryset=GpuModel.objects.all(), help_text="GPU model id")
    gpus = serializers.IntegerField(min_value=1, max_value=planner.MAX_GPUS_PER_SERVER, help_text="GPUs per server")
    cpu_threads = serializers.IntegerField(min_value=1, max_value=4096, help_text="Hardware threads per server")
    ram_gib = serializers.IntegerField(min_value=1, max_value=65536, help_text="RAM per server available to VMs, GiB")
    vcpu_overcommit = serializers.FloatField(min_value=0.1, max_value=16, default=1.0,
                                             help_text="vCPUs the VMs may claim per hardware thread")
    ram_overcommit = serializers.FloatField(min_value=0.1, max_value=4, default=1.0,
                                            help_text="RAM the VMs may claim per GiB installed")
    size_mode = serializers.ChoiceField(choices=SizeMode.choices, default=SizeMode.EQUAL)

    def validate(self, attrs):
        error = planning.size_mode_error(attrs["gpu_model"], attrs["size_mode"])
        if error:
            raise serializers.ValidationError({"size_mode": [error]})
        return attrs


class ArtistInputSerializer(serializers.Serializer):
    """A row of the artist mix: a workflow (its preset) or an explicit profile of the server's board."""

    workflow = serializers.ChoiceField(choices=Workflow.choices, required=False,
                                       help_text="Plan with this workflow's preset")
    profile = serializers.IntegerField(min_value=1, required=False,
                                       help_text="vGPU profile id (of the server's GPU model)")
    count = serializers.IntegerField(min_value=1, max_value=planner.MAX_ARTISTS)
    vcpus = serializers.IntegerField(min_value=1, max_value=1024, required=False,
                                     help_text=f"Default: the preset's, or {planning.DEFAULT_VCPUS} for a profile")
    ram_gib = serializers.IntegerField(min_value=1, max_value=16384, required=False,
                                       help_text=f"Default: the preset's, or {planning.DEFAULT_RAM_GIB} for a profile")
    vgpus = serializers.IntegerField(min_value=1, max_value=placement.MAX_VGPUS_PER_VM, required=False,
                                     help_text="vGPUs per VM (multi-vGPU); default: the preset's, or 1")
    label = serializers.CharField(max_length=60, required=False, allow_blank=True,
                                  help_text="Name of the row in the layout (default: workflow or profile name)")

    def validate(self, attrs):
        if ("workflow" in attrs) == ("profile" in attrs):
            raise serializers.ValidationError("Give either a workflow or a profile, not both.")
        return attrs


class PlanRequestSerializer(serializers.Serializer):
    #: The presets read while validating the rows, for the plan to reuse (no second query).
    presets: dict[str, WorkflowPreset] | None = None

    server = ServerInputSerializer()
    artists = ArtistInputSerializer(many=True, required=False, max_length=MAX_ARTIST_ROWS)
    from_measurements = serializers.BooleanField(
        default=False, help_text="Plan the fleet's VMs with their suggested (else current) profiles",
    )
    hosts = serializers.ListField(
        child=serializers.IntegerField(min_value=1), required=False, max_length=MAX_HOSTS,
        help_text="With from_measurements: only the VMs on these hosts",
    )
    measured_cpu_ram = serializers.BooleanField(
        default=False,
        help_text="vCPUs and RAM from the fleet's measurements: per workflow, the 75th percentile of the "
                  "right-sized vCPUs and RAM of its measured VMs instead of the preset's (rows' own values still "
                  "win); with from_measurements, each VM's own right-sized vCPUs and RAM",
    )

    def validate(self, attrs):
        rows = attrs.get("artists") or []
        if attrs["from_measurements"]:
            if rows:
                raise serializers.ValidationError({"artists": [
                    "Leave artists out with from_measurements: the fleet's VMs are the artists."]})
            unknown = planning.host_ids_unknown(attrs.get("hosts", []))
            if unknown:
                raise serializers.ValidationError({"hosts": [
                    f"Unknown host id{'s' if len(unknown) > 1 else ''}: {', '.join(map(str, unknown))}."]})
            return attrs
        if attrs.get("hosts"):
            raise serializers.ValidationError({"hosts": ["Hosts choose VMs only with from_measurements."]})
        if not rows:
            raise serializers.ValidationError({"artists": ["Give at least one artist row, or from_measurements."]})
        error = planning.total_artists_error(row["count"] for row in rows)
        if error:
            raise serializers.ValidationError({"artists": [error]})
        attrs["artists"] = self._resolve(rows, attrs["server"]["gpu_model"])
        return attrs

    def _resolve(self, rows: list[dict], gpu_model: GpuModel) -> list[planning.ArtistRow]:
        """Rows with their profiles loaded and checked against the server's board (one query for
        all profiles, one for the presets)."""
        ids = {row["profile"] for row in rows if "profile" in row}
        profiles = VgpuProfile.objects.select_related("gpu_model").in_bulk(ids) if ids else {}
        presets = planning.presets_by_workflow() if any("workflow" in row for row in rows) else {}
        self.presets = presets
        errors, resolved = [], []
        for row in rows:
            error = {}
            profile = None
            if "profile" in row:
                profile = profiles.get(row["profile"])
                message = (f"Unknown profile id {row['profile']}." if profile is None
                           else planning.profile_board_error(profile, gpu_model))
                if message:
                    error["profile"] = [message]
            elif row["workflow"] not in presets:
                error["workflow"] = [f"No preset for {row['workflow']}: add one under workflow presets."]
            errors.append(error)
            resolved.append(planning.ArtistRow(
                count=row["count"], workflow=row.get("workflow"), profile=profile, vcpus=row.get("vcpus"),
                ram_gib=row.get("ram_gib"), vgpus=row.get("vgpus"), label=row.get("label", ""),
            ))
        if any(errors):  # keyed by row index, as DRF keys the nested errors of a list
            raise serializers.ValidationError({"artists": {str(i): e for i, e in enumerate(errors) if e}})
        return resolved

    def plan_request(self) -> planning.PlanRequest:
        data = self.validated_data
        return planning.PlanRequest(
            **data["server"], artists=tuple(data.get("artists") or ()),
            from_measurements=data["from_measurements"], host_ids=tuple(data.get("hosts", ())),
            measured_cpu_ram=data["measured_cpu_ram"],
        )


# Response ------------------------------------------------------------------------------------


class PlannedVgpuSerializer(serializers.Serializer):
    profile = serializers.CharField(source="profile.name", help_text="Profile name, e.g. RTX6000-12Q")
    profile_id = serializers.IntegerField(source="profile.id")
    fb_mib = serializers.IntegerField(source="profile.fb_mib")
    workflow = serializers.CharField(allow_null=True)
    artist = serializers.CharField(source="label", help_text="The artist row's label")
    row = serializers.IntegerField(help_text="Index of the artist row (or VM) in the request's order, from 0")
    artist_number = serializers.IntegerField(source="artist", help_text="Artist number within the row, from 1")
    vm = serializers.IntegerField(help_text="VM number in the plan; the vGPUs of one multi-vGPU VM share it")
    placement_id = serializers.IntegerField(help_text="Slot on the GPU, as the inventory would record it")


class PlannedGpuSerializer(serializers.Serializer):
    index = serializers.IntegerField()
    fb_used_mib = serializers.IntegerField()
    fb_total_mib = serializers.IntegerField()
    vgpus = PlannedVgpuSerializer(many=True)


class PlannedServerSerializer(serializers.Serializer):
    server = serializers.IntegerField(source="index", help_text="Server number, from 1")
    artists = serializers.IntegerField()
    vcpus_used = serializers.IntegerField()
    vcpu_capacity = serializers.IntegerField()
    ram_gib_used = serializers.IntegerField()
    ram_capacity_gib = serializers.IntegerField()
    gpus = PlannedGpuSerializer(many=True)


class UnplacedSerializer(serializers.Serializer):
    artist = serializers.CharField(source="label")
    workflow = serializers.CharField(allow_null=True)
    count = serializers.IntegerField()
    rule = serializers.CharField(help_text="A placement rule code, or vm_gpus / no_profile")
    reason = serializers.CharField()


class DemandSerializer(serializers.Serializer):
    """What each row was planned with, after presets were translated to the server's board."""

    artist = serializers.CharField(source="label")
    workflow = serializers.CharField(allow_null=True)
    profile = serializers.CharField(source="profile.name", allow_null=True, default=None)
    profile_id = serializers.IntegerField(source="profile.id", allow_null=True, default=None)
    vgpus = serializers.IntegerField()
    vcpus = serializers.IntegerField()
    ram_gib = serializers.IntegerField()
    count = serializers.IntegerField()
    note = serializers.CharField(help_text="How a preset was translated to the board, or why it could not be")


class MeasuredVmSerializer(serializers.Serializer):
    vm = serializers.IntegerField(source="vm_id")
    vm_name = serializers.CharField()
    host = serializers.CharField(allow_null=True)
    workflow = serializers.CharField(allow_null=True)
    current_profile = serializers.CharField()
    vgpus = serializers.IntegerField()
    source = serializers.ChoiceField(choices=[planning.SOURCE_SUGGESTED, planning.SOURCE_CURRENT],
                                     help_text="Planned with the suggested profile or the current one")
    source_profile = serializers.CharField(help_text="The profile the plan starts from")
    planned_profile = serializers.CharField(allow_null=True, help_text="Its equivalent on the server's board")
    reason = serializers.CharField()


class LowerBoundsSerializer(serializers.Serializer):
    gpus = serializers.IntegerField(help_text="Servers the GPUs alone need")
    vcpus = serializers.IntegerField(help_text="Servers the vCPUs alone need")
    ram = serializers.IntegerField(help_text="Servers the RAM alone needs")


class UsageSerializer(serializers.Serializer):
    gpus = serializers.FloatField(help_text="Frame buffer of the planned GPUs taken by vGPUs, %")
    vcpus = serializers.FloatField(help_text="vCPU capacity claimed, %")
    ram = serializers.FloatField(help_text="RAM capacity claimed, %")


class ServerSummarySerializer(serializers.Serializer):
    gpu_model = serializers.CharField(source="gpu_model.name")
    fb_per_gpu_mib = serializers.IntegerField(source="gpu_model.fb_mib")
    gpus = serializers.IntegerField()
    vcpu_capacity = serializers.IntegerField()
    ram_capacity_gib = serializers.IntegerField()
    size_mode = serializers.CharField()


class PlanSerializer(serializers.Serializer):
    """The density plan. `layout` lists each server, its GPUs and the vGPUs on them."""

    servers = serializers.IntegerField(source="plan.servers", help_text="Servers needed")
    lower_bound_servers = serializers.IntegerField(source="plan.lower_bound_servers")
    optimal = serializers.BooleanField(source="plan.optimal", help_text="servers equals the lower bound")
    lower_bounds = LowerBoundsSerializer(source="plan.lower_bounds")
    limited_by = serializers.ListField(child=serializers.CharField(), source="plan.limited_by",
                                       help_text="Resources whose bound is the highest (gpus, vcpus, ram)")
    usage_pct = UsageSerializer(source="plan.usage_pct",
                                help_text="Share of the planned servers' frame buffer, vCPUs and RAM in use")
    method = serializers.CharField(source="plan.method", help_text="The heuristic whose plan was kept")
    artists_placed = serializers.IntegerField(source="plan.artists_placed")
    artists_per_server = serializers.FloatField(source="plan.artists_per_server", allow_null=True)
    server = ServerSummarySerializer()
    layout = PlannedServerSerializer(source="plan.layout", many=True)
    unplaced = UnplacedSerializer(source="plan.unplaced", many=True)
    demands = DemandSerializer(many=True)
    planned_with = MeasuredVmSerializer(source="measured", many=True, allow_null=True,
                                        help_text="From measurements only: the profile each VM was planned with")


@extend_schema(
    summary="Plan servers for a mix of artists",
    request=PlanRequestSerializer,
    responses={200: PlanSerializer, 400: OpenApiResponse(description="Invalid input, with field messages")},
)
class PlanView(APIView):
    """How many servers of one configuration a mix of artists needs, and the layout of each."""

    permission_classes = [IsPlannerAdmin]

    def post(self, request):
        body = PlanRequestSerializer(data=request.data)
        body.is_valid(raise_exception=True)
        try:
            result = planning.run_plan(body.plan_request(), presets=body.presets)
        except planning.TooManyVms as exc:
            raise serializers.ValidationError({"hosts": [str(exc)]}) from exc
        return Response(PlanSerializer(result).data)


# Workflow presets ----------------------------------------------------------------------------


class WorkflowPresetSerializer(serializers.ModelSerializer):
    """What an artist of one workflow gets by default, sized in frame buffer so any board can
    serve it (the planner takes the smallest profile of `series` with at least `fb_mib`)."""

    fb_mib = serializers.IntegerField(min_value=1024, max_value=MAX_PRESET_FB_MIB,
                                      help_text="Frame buffer per vGPU, MiB (12288 = a 12Q)")
    series = serializers.ChoiceField(choices=Series.choices)
    vgpus = serializers.IntegerField(min_value=1, max_value=placement.MAX_VGPUS_PER_VM)
    vcpus = serializers.IntegerField(min_value=1, max_value=1024)
    ram_gib = serializers.IntegerField(min_value=1, max_value=16384)

    class Meta:
        model = WorkflowPreset
        fields = ["id", "workflow", "fb_mib", "series", "vgpus", "vcpus", "ram_gib", "note", "updated_at"]
        read_only_fields = ["id", "workflow", "updated_at"]


@extend_schema_view(
    list=extend_schema(summary="List workflow presets"),
    retrieve=extend_schema(summary="One workflow preset"),
    update=extend_schema(summary="Change a workflow preset"),
    partial_update=extend_schema(summary="Change part of a workflow preset"),
)
class WorkflowPresetViewSet(mixins.ListModelMixin, mixins.RetrieveModelMixin, mixins.UpdateModelMixin,
                            viewsets.GenericViewSet):
    """Workflow presets, one per workflow (seeded from NVIDIA's sizing guide); admins edit them."""

    permission_classes = [IsPlannerAdmin]
    serializer_class = WorkflowPresetSerializer
    # Nothing to filter: unknown parameters are still a 400, as on every list.
    filter_backends = [KnownParametersFilter]

    def get_queryset(self) -> QuerySet:
        return WorkflowPreset.objects.order_by("workflow", "id")

    def perform_update(self, serializer) -> None:
        serializer.instance = save_preset(serializer.instance, **serializer.validated_data)

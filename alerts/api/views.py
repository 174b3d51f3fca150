"""The alerts resources of the v1 API: alerts/, alert-rules/, silences/, licence-pools/ and
licences/. Staff only, reading included: alerts name hosts, GPUs, VMs and their artists (an
artist learns of a problem under their own VM through an in-app note, never through this list).
`POST alerts/{id}/drain/` starts an optimizer run that moves every VM off the alert's GPU.
"""

from __future__ import annotations

from django.core.exceptions import ValidationError as DjangoValidationError
from django.urls import reverse
from drf_spectacular.utils import OpenApiResponse, extend_schema
from rest_framework import mixins, serializers, status, viewsets
from rest_framework.decorators import action
from rest_framework.exceptions import ValidationError
from rest_framework.response import Response
from rest_framework.views import APIView

from alerts import drain as gpu_drain
from alerts import licences, services
from alerts.evaluate import ensure_rules
from alerts.filtersets import AlertFilterSet
from alerts.models import Alert, AlertRule, LicencePool, Silence
from alerts.rules import RULES
from config.api.permissions import IsFleetAdmin
from config.api.serializers import DetailSerializer
from fleet.models import Gpu, Host
from sizing.models import OptimizerStatus


class IsAlertAdmin(IsFleetAdmin):
    message = "Only fleet admins (staff) may see or change alerts, their rules, silences and licences."


def _django_errors(exc: DjangoValidationError) -> ValidationError:
    return ValidationError(exc.message_dict if hasattr(exc, "error_dict") else {"non_field_errors": exc.messages})


class AffectedSerializer(serializers.Serializer):
    id = serializers.IntegerField()
    name = serializers.CharField()
    artist = serializers.CharField(allow_null=True)


class AlertSerializer(serializers.ModelSerializer):
    """An alert with what it affects: host, GPU and the VMs (with their artists) on it."""

    rule = serializers.SlugRelatedField(slug_field="kind", read_only=True)
    rule_title = serializers.CharField(source="rule.title", read_only=True)
    host_name = serializers.CharField(source="host.name", read_only=True, default=None)
    gpu_uuid = serializers.CharField(source="gpu.uuid", read_only=True, default=None)
    acknowledged_by = serializers.SlugRelatedField(slug_field="username", read_only=True)
    affected_vms = serializers.SerializerMethodField()

    class Meta:
        model = Alert
        fields = ["id", "rule", "rule_title", "key", "state", "severity", "title", "summary", "details", "host",
                  "host_name", "gpu", "gpu_uuid", "affected_vms", "first_seen", "last_seen", "resolved_at",
                  "acknowledged_at", "acknowledged_by", "note", "silenced"]
        read_only_fields = fields

    @extend_schema(responses=AffectedSerializer(many=True))
    def get_affected_vms(self, obj) -> list[dict]:
        return [{"id": vm.pk, "name": vm.name, "artist": vm.artist.name if vm.artist else None}
                for vm in obj.vms.all()]


class AcknowledgeSerializer(serializers.Serializer):
    note = serializers.CharField(required=False, allow_blank=True, default="", max_length=2000)


class DrainStartedSerializer(serializers.Serializer):
    run = serializers.IntegerField(help_text="The optimizer run planning the drain (/api/v1/optimizer-runs/{run}/)")
    url = serializers.CharField(help_text="The run's page, where the plan is reviewed and applied")


class DrainNotQueuedSerializer(serializers.Serializer):
    detail = serializers.CharField()
    run = serializers.IntegerField(help_text="The run that was stored and marked failed")


class AlertViewSet(viewsets.ReadOnlyModelViewSet):
    serializer_class = AlertSerializer
    permission_classes = [IsAlertAdmin]
    filterset_class = AlertFilterSet
    ordering_fields = ["last_seen", "first_seen", "severity", "id"]
    ordering = ["-last_seen", "-id"]

    def get_queryset(self):
        return Alert.objects.select_related("rule", "host", "gpu", "acknowledged_by").prefetch_related(
            "vms__artist")

    @extend_schema(request=AcknowledgeSerializer, responses={200: AlertSerializer,
                                                             409: OpenApiResponse(DetailSerializer)})
    @action(detail=True, methods=["post"])
    def acknowledge(self, request, pk=None, format=None):
        """Take an open alert: it stays open until its condition ends, marked as someone's; 409 once resolved."""
        body = AcknowledgeSerializer(data=request.data)
        body.is_valid(raise_exception=True)
        alert = services.acknowledge(self.get_object(), request.user, body.validated_data["note"])
        return Response(self.get_serializer(self.get_queryset().get(pk=alert.pk)).data)

    @extend_schema(
        request=None,
        responses={
            202: DrainStartedSerializer,
            409: OpenApiResponse(DetailSerializer, description="The alert is about no GPU or has ended, the GPU "
                                                               "runs no vGPU, or the optimizer is busy"),
            503: OpenApiResponse(DrainNotQueuedSerializer,
                                 description="The task queue is unreachable; the run was stored as failed"),
        },
    )
    @action(detail=True, methods=["post"])
    def drain(self, request, pk=None, format=None):
        """Plan moving every VM off the alert's GPU, onto the fleet's other GPUs (never onto it),
        moving no other VM: an optimizer run, computed by a worker. Review the plan on the run's
        page (or /api/v1/optimizer-runs/{run}/) and apply it there."""
        try:
            run = gpu_drain.start_for_alert(self.get_object(), request.user)
        except gpu_drain.DrainRefused as exc:
            return Response({"detail": str(exc)}, status=status.HTTP_409_CONFLICT)
        if run.status == OptimizerStatus.FAILED:
            return Response({"detail": run.error, "run": run.pk}, status=status.HTTP_503_SERVICE_UNAVAILABLE)
        return Response({"run": run.pk, "url": reverse("sizing:optimizer-run", args=[run.pk])},
                        status=status.HTTP_202_ACCEPTED)


class AlertRuleSerializer(serializers.ModelSerializer):
    """A rule: `params` are its thresholds in force (defaults filled in); `defaults` and `bounds`
    say what each accepts. A PATCH of `params` changes only the names it gives."""

    title = serializers.CharField(read_only=True)
    help = serializers.SerializerMethodField()
    params = serializers.JSONField(source="effective_params", required=False)
    defaults = serializers.SerializerMethodField()

    class Meta:
        model = AlertRule
        fields = ["id", "kind", "title", "help", "enabled", "severity", "params", "defaults", "updated_at"]
        read_only_fields = ["id", "kind", "title", "help", "defaults", "updated_at"]

    def get_help(self, obj) -> str:
        return RULES[obj.kind].help

    def get_defaults(self, obj) -> dict:
        return {p.name: {"default": p.default, "min": p.low, "max": p.high, "unit": p.unit, "help": p.help}
                for p in RULES[obj.kind].params}

    def validate_params(self, value):
        if not isinstance(value, dict):
            raise ValidationError("Expected an object of parameter names and numbers.")
        return value

    def update(self, instance, validated_data):
        try:
            return services.update_rule(instance, enabled=validated_data.get("enabled"),
                                        severity=validated_data.get("severity"),
                                        params=validated_data.get("effective_params"))
        except DjangoValidationError as exc:
            raise _django_errors(exc) from None


class AlertRuleViewSet(mixins.ListModelMixin, mixins.RetrieveModelMixin, mixins.UpdateModelMixin,
                       viewsets.GenericViewSet):
    serializer_class = AlertRuleSerializer
    permission_classes = [IsAlertAdmin]
    # The schema reads the model from here: get_queryset writes rows, and runs without a database
    # at `manage.py check`.
    queryset = AlertRule.objects.all()
    ordering = ["kind"]
    ordering_fields = ["kind"]

    def get_queryset(self):
        ensure_rules()  # every rule of the catalogue has its row, with its defaults, before it is listed
        return AlertRule.objects.all()


class RuleSlugField(serializers.SlugRelatedField):
    """A rule by its slug (`xid`), checked against the catalogue before any query, so text no
    rule could have (a NUL byte, a 10 kB string) is the field's error, not the database's."""

    def to_internal_value(self, data):
        if not isinstance(data, str) or data not in RULES:
            self.fail("does_not_exist", slug_name=self.slug_field, value=str(data)[:80])
        return super().to_internal_value(data)


class SilenceSerializer(serializers.ModelSerializer):
    rule = RuleSlugField(slug_field="kind", queryset=AlertRule.objects.all(), required=False, allow_null=True,
                         help_text="The rule's slug, e.g. xid")
    host = serializers.PrimaryKeyRelatedField(queryset=Host.objects.all(), required=False, allow_null=True)
    gpu = serializers.PrimaryKeyRelatedField(queryset=Gpu.objects.all(), required=False, allow_null=True)
    alert = serializers.PrimaryKeyRelatedField(queryset=Alert.objects.all(), required=False, allow_null=True)
    created_by = serializers.SlugRelatedField(slug_field="username", read_only=True)
    active = serializers.SerializerMethodField()

    class Meta:
        model = Silence
        fields = ["id", "rule", "host", "gpu", "alert", "reason", "starts_at", "ends_at", "active", "created_by",
                  "created_at"]
        read_only_fields = ["id", "active", "created_by", "created_at"]
        extra_kwargs = {"starts_at": {"required": False}}

    def get_active(self, obj) -> bool:
        return obj.is_active()

    def create(self, validated_data):
        try:
            return services.create_silence(self.context["request"].user, **validated_data)
        except DjangoValidationError as exc:
            raise _django_errors(exc) from None


class SilenceViewSet(mixins.CreateModelMixin, viewsets.ReadOnlyModelViewSet):
    """Silences: POST one (a matcher, a reason, an end); `POST {id}/end/` ends it now (kept for the record)."""

    serializer_class = SilenceSerializer
    permission_classes = [IsAlertAdmin]
    queryset = Silence.objects.select_related("rule", "created_by")
    ordering = ["-ends_at", "-id"]
    ordering_fields = ["ends_at", "starts_at", "id"]

    @extend_schema(request=None, responses=SilenceSerializer)
    @action(detail=True, methods=["post"])
    def end(self, request, pk=None, format=None):
        """End the silence now: matching alerts notify again from the next evaluation."""
        return Response(self.get_serializer(services.end_silence(self.get_object())).data)


class LicencePoolSerializer(serializers.ModelSerializer):
    class Meta:
        model = LicencePool
        fields = ["id", "edition", "owned", "note", "updated_at"]
        read_only_fields = ["id", "updated_at"]

    def create(self, validated_data):
        if LicencePool.objects.filter(edition=validated_data["edition"]).exists():
            raise ValidationError({"edition": ["This edition has its pool already: change that one."]})
        return services.set_pool(validated_data["edition"], validated_data["owned"], validated_data.get("note", ""))

    def update(self, instance, validated_data):
        if validated_data.get("edition", instance.edition) != instance.edition:
            raise ValidationError({"edition": ["A pool's edition does not change: create one for the other edition."]})
        return services.set_pool(instance.edition, validated_data.get("owned", instance.owned),
                                 validated_data.get("note", instance.note))


class LicencePoolViewSet(mixins.CreateModelMixin, mixins.UpdateModelMixin, viewsets.ReadOnlyModelViewSet):
    """How many licences of each edition the studio owns."""

    serializer_class = LicencePoolSerializer
    permission_classes = [IsAlertAdmin]
    queryset = LicencePool.objects.all()
    ordering = ["edition"]
    ordering_fields = ["edition"]


class LicenceRangeSerializer(serializers.Serializer):
    days = serializers.IntegerField(min_value=1, max_value=400, default=30, required=False,
                                    help_text="How far back the peak and the series reach")


class LicencesView(APIView):
    """Per edition: licences owned, in use now, unlicensed now, peak and forecast over `?days=`;
    and the vGPUs running unlicensed now, with their VM and artist."""

    permission_classes = [IsAlertAdmin]

    @extend_schema(parameters=[LicenceRangeSerializer], responses={200: OpenApiResponse(
        description="{editions: [{edition, label, owned, in_use, unlicensed, peak, peak_at, forecast_peak, "
                    "series: [[ts, in_use, unlicensed]]}], unlicensed: [{vm, vm_name, artist, host, gpu, type, "
                    "edition}]}")})
    def get(self, request, format=None):
        query = LicenceRangeSerializer(data=request.query_params)
        query.is_valid(raise_exception=True)
        return Response(licences.overview(days=query.validated_data.get("days", 30)), status=status.HTTP_200_OK)



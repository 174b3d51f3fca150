"""The `optimizer-runs/` resource of the v1 API: runs of the fleet placement optimizer.

Staff only, reads included: a plan describes the whole fleet. POST starts a run (it is
computed by a Celery worker; poll the run for `progress`), `POST {id}/apply/` carries a
finished plan out. Lists leave the plan out (a large fleet's plan holds every vGPU's
assignment) and give its `summary`; a single run has the whole `result`.
"""

from __future__ import annotations

from django.db.models import QuerySet
from django.db.models.fields.json import KeyTransform
from drf_spectacular.utils import OpenApiResponse, extend_schema, extend_schema_view
from rest_framework import mixins, serializers, status, viewsets
from rest_framework.decorators import action
from rest_framework.response import Response

from config.api.permissions import IsFleetAdmin
from config.api.serializers import PlacementErrorSerializer
from fleet.models import VgpuProfile, VirtualMachine
from fleet.placement import MAX_VGPUS_PER_VM
from sizing import optimizer, optimizer_runs
from sizing.models import OptimizerRun, OptimizerStatus


class IsOptimizerAdmin(IsFleetAdmin):
    message = "Only fleet admins (staff) may see or run the placement optimizer."


class SummarySerializer(serializers.Serializer):
    gpus_before = serializers.IntegerField(help_text="GPUs holding at least one vGPU now")
    gpus_after = serializers.IntegerField(help_text="GPUs holding at least one vGPU after the plan")
    lower_bound = serializers.IntegerField(help_text="No plan can use fewer GPUs than this")
    gpus_freed = serializers.IntegerField()
    gpus_newly_used = serializers.IntegerField()
    vms_moved = serializers.IntegerField()
    unplaced = serializers.IntegerField(help_text="Pending changes no GPU can take")
    seconds = serializers.FloatField(help_text="Seconds the search took")


class OptimizerRunSerializer(serializers.ModelSerializer):
    """A run as listed: its state and the summary of its plan (null until done)."""

    # Null for a run not applied yet, and once the user who started or applied it is deleted.
    created_by = serializers.SlugRelatedField(slug_field="username", read_only=True, allow_null=True)
    applied_by = serializers.SlugRelatedField(slug_field="username", read_only=True, allow_null=True)
    summary = SummarySerializer(read_only=True, allow_null=True)

    class Meta:
        model = OptimizerRun
        fields = ["id", "status", "progress", "stage", "summary", "created_by", "created_at", "started_at",
                  "finished_at", "error", "applied_by", "applied_at"]
        read_only_fields = fields


class OptimizerRunDetailSerializer(OptimizerRunSerializer):
    """A run with what it was asked (`params`: the pending changes) and its plan (`result`)."""

    params = serializers.JSONField(read_only=True, help_text="Options and the pending changes the plan includes")
    result = serializers.JSONField(
        read_only=True, allow_null=True,
        help_text="summary; plan (assignments, moves, gpus_before, gpus_after, lower_bound, freed_gpu_ids, "
                  "newly_used_gpu_ids, unplaced, seconds); names of the VMs, GPUs, hosts and profiles it "
                  "mentions; dropped changes",
    )

    class Meta(OptimizerRunSerializer.Meta):
        fields = [*OptimizerRunSerializer.Meta.fields, "params", "result", "fleet_fingerprint"]
        read_only_fields = fields


class ChangeSerializer(serializers.Serializer):
    """A what-if change: give this VM this many vGPUs of this profile."""

    vm = serializers.PrimaryKeyRelatedField(queryset=VirtualMachine.objects.all())
    profile = serializers.PrimaryKeyRelatedField(queryset=VgpuProfile.objects.all())
    vgpus = serializers.IntegerField(min_value=1, max_value=MAX_VGPUS_PER_VM, default=1)


class StartRunSerializer(serializers.Serializer):
    """What a new run should plan for besides consolidating the fleet."""

    include_requests = serializers.BooleanField(default=True, help_text="Include pending resize requests")
    include_suggestions = serializers.BooleanField(
        default=False, help_text="Include current upsize/downsize suggestions (not dismissed ones)",
    )
    changes = ChangeSerializer(many=True, required=False, default=list,
                               help_text="What-if changes, one per VM; they win over requests and suggestions")

    def validate_changes(self, changes):
        vm_ids = [c["vm"].pk for c in changes]
        if len(vm_ids) != len(set(vm_ids)):
            raise serializers.ValidationError("Name each VM at most once.")
        return changes

    def validate(self, attrs):
        unknown = sorted(set(self.initial_data) - set(self.fields)) if isinstance(self.initial_data, dict) else []
        if unknown:
            raise serializers.ValidationError({name: "Unknown field." for name in unknown})
        return attrs


class RunInProgressSerializer(serializers.Serializer):
    detail = serializers.CharField()
    run = serializers.IntegerField(help_text="The run queued or running now")


class RunNotQueuedSerializer(serializers.Serializer):
    detail = serializers.CharField()
    run = serializers.IntegerField(help_text="The run that was stored and marked failed")


CONFLICT = OpenApiResponse(
    PlacementErrorSerializer,
    description="The plan cannot be applied: not finished, applied already, the fleet changed since it was "
                "computed, or a placement rule refused a move (`violations`); nothing was changed",
)


@extend_schema_view(
    list=extend_schema(summary="List optimizer runs", description="Newest first; the plan itself is left out."),
    retrieve=extend_schema(summary="An optimizer run with its plan"),
)
class OptimizerRunViewSet(mixins.ListModelMixin, mixins.RetrieveModelMixin, viewsets.GenericViewSet):
    """Runs of the fleet placement optimizer; staff only."""

    permission_classes = [IsOptimizerAdmin]
    ordering_fields = ["id", "created_at", "status"]
    ordering = ["-created_at", "-id"]

    def get_queryset(self) -> QuerySet:
        queryset = OptimizerRun.objects.select_related("created_by", "applied_by").annotate(
            summary=KeyTransform("summary", "result"),
        ).order_by("-created_at", "-id")
        if self.action == "list":
            queryset = queryset.defer("result", "params")
        return queryset

    def get_serializer_class(self):
        if self.action == "list":
            return OptimizerRunSerializer
        if self.action == "create":
            return StartRunSerializer
        return OptimizerRunDetailSerializer

    def _fresh(self, run: OptimizerRun) -> dict:
        run = self.get_queryset().get(pk=run.pk)
        return OptimizerRunDetailSerializer(run, context=self.get_serializer_context()).data

    @extend_schema(
        summary="Start an optimizer run",
        description="Queues a run; a Celery worker computes the plan. Poll the run for `progress` and `status`. "
                    "Only one run may be queued or running at a time. While the task queue (Redis) is "
                    "unreachable the answer is 503: the run is stored as failed, saying why; start another "
                    "once the queue is back.",
        request=StartRunSerializer,
        responses={
            201: OptimizerRunDetailSerializer,
            400: OpenApiResponse(description="Invalid input (field messages)"),
            409: OpenApiResponse(RunInProgressSerializer, description="Another run is queued or running"),
            503: OpenApiResponse(RunNotQueuedSerializer,
                                 description="The task queue is unreachable; the run was stored as failed"),
        },
    )
    def create(self, request, *args, **kwargs):
        serializer = StartRunSerializer(data=request.data)
        serializer.is_valid(raise_exception=True)
        data = serializer.validated_data
        changes = [optimizer.Change(c["vm"].pk, c["profile"].pk, c["vgpus"], optimizer_runs.MANUAL_SOURCE)
                   for c in data["changes"]]
        try:
            run = optimizer_runs.start_run(request.user, include_requests=data["include_requests"],
                                           include_suggestions=data["include_suggestions"], vm_changes=changes)
        except optimizer_runs.RunInProgress as exc:
            return Response({"detail": str(exc), "run": exc.run.pk}, status=status.HTTP_409_CONFLICT)
        if run.status == OptimizerStatus.FAILED:
            # Not 201: a script that only checks for success must not poll a run that never ran.
            return Response({"detail": run.error, "run": run.pk}, status=status.HTTP_503_SERVICE_UNAVAILABLE)
        return Response(self._fresh(run), status=status.HTTP_201_CREATED)

    @extend_schema(
        summary="Apply a finished plan",
        description="Moves the VMs as the plan says, all or nothing, re-checking every placement rule; marks the "
                    "resize requests it carries out approved. Moves on hosts linked to their hypervisor become "
                    "operations (/api/v1/operations/, origin \"optimizer run #<id>\"), pending until run; their "
                    "requests stay applying until the operation ends.",
        request=None,
        responses={200: OptimizerRunDetailSerializer, 404: OpenApiResponse(description="No such run"),
                   409: CONFLICT},
    )
    @action(detail=True, methods=["post"])
    def apply(self, request, pk=None, format=None):
        run = self.get_object()
        try:
            outcome = optimizer_runs.apply_run(run, request.user)
        except optimizer_runs.PlanConflict as exc:
            body = {"detail": exc.message, "violations": [{"rule": v.rule, "message": v.message}
                                                          for v in exc.violations]}
            return Response(body, status=status.HTTP_409_CONFLICT)
        return Response(self._fresh(outcome.run))

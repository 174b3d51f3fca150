"""The suggestions resource of the v1 API (DESIGN.md, `suggestions/`): right-sizing advice per VM.

Read by every signed-in user, scoped by `sizing.queries.suggestions_for` (an artist sees the
suggestions of their own VMs, a 404 for the rest); dismissed ones are left out unless
`?dismissed=` asks for them. Only admins act on them: `accept/` files a resize request for the
suggested profile, `dismiss/` hides the suggestion until its evidence changes, `restore/` shows
it again. The rows themselves are written by the hourly refresh, never through the API.
"""

from __future__ import annotations

from django.db.models import QuerySet
from drf_spectacular.utils import OpenApiResponse, extend_schema, extend_schema_view
from rest_framework import serializers, status, viewsets
from rest_framework.decorators import action
from rest_framework.response import Response

from config.api.exceptions import Conflict
from config.api.permissions import IsFleetAdminOrReadOnly
from config.api.serializers import DetailSerializer, ExpandableMixin
from fleet.models import ResizeRequest
from sizing import suggestions
from sizing.choices import Fits
from sizing.filtersets import SuggestionFilterSet
from sizing.models import GUEST_ADVICE_CHOICES, CombinedKind, Suggestion
from sizing.queries import suggestions_for

NOTE_MAX_CHARS = 2000


class IsFleetAdminOrReadOnlySuggestions(IsFleetAdminOrReadOnly):
    message = "Only fleet admins (staff) may accept, dismiss or restore suggestions."


class FiledRequestSerializer(serializers.ModelSerializer):
    """The resize request filed when an admin accepted the suggestion."""

    class Meta:
        model = ResizeRequest
        fields = ["id", "status", "requested_profile", "requested_vgpus", "reason", "created_at", "requested_vcpus",
                  "requested_ram_gib"]
        read_only_fields = fields


class SuggestionSerializer(ExpandableMixin, serializers.ModelSerializer):
    """One VM's right-sizing advice with the figures it rests on (`evidence`: frame buffer p95,
    peak and mean in MiB and as % of the current profile, GPU and encoder use, coverage, a daily
    series, and for a resize `impact`: where it fits and why not on the VM's GPU); its vCPU and RAM
    advice from the guest's CPU and memory read through the hypervisor (`cpu_action`,
    `suggested_vcpus`, `ram_action`, `suggested_ram_gib`, figures in `evidence.guest`), and
    `combined`: what the GPU's and CPU's figures say together when they disagree
    (`evidence.combined.message`)."""

    expandable_fields = ("vm", "current_profile", "suggested_profile")

    vm_name = serializers.CharField(source="vm.name", read_only=True)
    artist = serializers.IntegerField(source="vm.artist_id", read_only=True, allow_null=True)
    host = serializers.IntegerField(source="vm.host_id", read_only=True, allow_null=True)
    current_profile_name = serializers.CharField(source="current_profile.name", read_only=True, default=None)
    suggested_profile_name = serializers.CharField(source="suggested_profile.name", read_only=True, default=None)
    fits = serializers.ChoiceField(
        choices=[("", "No resize"), *Fits.choices], read_only=True,
        help_text="Where the suggested profile fits now: same_gpu (on the VM's own GPU), move (on another "
                  "GPU), nowhere; empty for keep and not enough data",
    )
    dismissed = serializers.BooleanField(
        read_only=True, help_text="Dismissed by an admin, and the evidence has not changed since",
    )
    resize_request = FiledRequestSerializer(read_only=True, allow_null=True)
    cpu_action = serializers.ChoiceField(
        choices=GUEST_ADVICE_CHOICES, read_only=True,
        help_text="vCPU advice from the guest's CPU read through the hypervisor; empty before its first refresh",
    )
    ram_action = serializers.ChoiceField(
        choices=GUEST_ADVICE_CHOICES, read_only=True,
        help_text="RAM advice from the guest's memory read through the hypervisor; empty before its first refresh",
    )
    combined = serializers.ChoiceField(
        choices=[("", "Nothing to add"), *CombinedKind.choices], read_only=True,
        help_text="What the GPU's and the CPU's figures say together when they disagree "
                  "(evidence.combined.message says it in words); empty when they agree",
    )

    class Meta:
        model = Suggestion
        fields = ["id", "vm", "vm_name", "artist", "host", "current_profile", "current_profile_name",
                  "suggested_profile", "suggested_profile_name", "suggested_vgpus", "action", "reason", "evidence",
                  "evidence_key", "fits", "gpus_delta", "window_start", "window_end", "computed_at", "dismissed",
                  "dismissed_at", "resize_request", "cpu_action", "suggested_vcpus", "ram_action",
                  "suggested_ram_gib", "combined"]
        read_only_fields = fields


class ShownEvidenceSerializer(serializers.Serializer):
    """What the admin acted on. With `evidence_key`, the action is refused (409) if the suggestion
    was recomputed on other evidence since it was shown."""

    evidence_key = serializers.CharField(
        required=False, allow_blank=True, max_length=64,
        help_text="The suggestion's `evidence_key` as it was shown",
    )


class AcceptSerializer(ShownEvidenceSerializer):
    note = serializers.CharField(
        required=False, allow_blank=True, max_length=NOTE_MAX_CHARS,
        help_text="Added to the request's generated reason",
    )


CONFLICT = OpenApiResponse(
    DetailSerializer,
    description="Nothing to resize (keep, not enough data), a request for the VM is already pending, or the "
                "suggestion or the VM's vGPUs changed since it was shown",
)


@extend_schema_view(
    list=extend_schema(summary="List right-sizing suggestions"),
    retrieve=extend_schema(summary="One VM's right-sizing suggestion"),
)
class SuggestionViewSet(viewsets.ReadOnlyModelViewSet):
    """Right-sizing suggestions, one per VM holding vGPUs, refreshed hourly from its rollups.
    Dismissed ones are hidden unless `?dismissed=true` (only them) or `?dismissed=all`."""

    permission_classes = [IsFleetAdminOrReadOnlySuggestions]
    serializer_class = SuggestionSerializer
    filterset_class = SuggestionFilterSet
    ordering_fields = ["id", "vm__name", "action", "fits", "gpus_delta", "computed_at"]

    def get_queryset(self) -> QuerySet:
        if getattr(self, "swagger_fake_view", False):  # schema generation: no real user
            return Suggestion.objects.none()
        return suggestions_for(self.request.user)

    def filter_queryset(self, queryset: QuerySet) -> QuerySet:
        # Filters choose the rows of the list; a suggestion's own URL answers, dismissed or not.
        if self.action != "list":
            return queryset
        return super().filter_queryset(queryset)

    def _act(self, request, serializer_class, act, status_code=status.HTTP_200_OK):
        """Validate the body (400 with field messages), act on the suggestion (409 on a
        SuggestionConflict) and answer with the suggestion as it is now."""
        suggestion = self.get_object()
        body = serializer_class(data=request.data)
        body.is_valid(raise_exception=True)
        try:
            act(suggestion, body.validated_data)
        except suggestions.SuggestionConflict as exc:
            raise Conflict(str(exc)) from exc
        fresh = self.get_queryset().get(pk=suggestion.pk)
        return Response(self.get_serializer(fresh).data, status=status_code)

    @extend_schema(
        summary="Accept: file a resize request",
        description="Files a pending resize request for the suggested profile and vGPU count (when the vGPU "
                    "advice is a resize) and the suggested vCPUs and RAM (where their advice is), with a reason "
                    "generated from the evidence; an admin approves it as any other request.",
        request=AcceptSerializer,
        responses={201: SuggestionSerializer, 409: CONFLICT},
    )
    @action(detail=True, methods=["post"])
    def accept(self, request, pk=None, format=None):
        return self._act(request, AcceptSerializer, lambda suggestion, data: suggestions.accept_suggestion(
            suggestion, request.user, evidence_key=data.get("evidence_key", ""), note=data.get("note", ""),
        ), status_code=status.HTTP_201_CREATED)

    @extend_schema(
        summary="Dismiss until the evidence changes",
        request=ShownEvidenceSerializer,
        responses={200: SuggestionSerializer, 409: CONFLICT},
    )
    @action(detail=True, methods=["post"])
    def dismiss(self, request, pk=None, format=None):
        return self._act(request, ShownEvidenceSerializer, lambda suggestion, data: suggestions.dismiss_suggestion(
            suggestion, request.user, evidence_key=data.get("evidence_key", ""),
        ))

    @extend_schema(summary="Show a dismissed suggestion again", request=None, responses={200: SuggestionSerializer})
    @action(detail=True, methods=["post"])
    def restore(self, request, pk=None, format=None):
        return self._act(request, serializers.Serializer, lambda suggestion, data: suggestions.restore_suggestion(
            suggestion,
        ))

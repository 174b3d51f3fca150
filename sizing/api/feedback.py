"""The feedback resource of the v1 API: artists rate a working day on their own VMs (1 to 5, quick
tags, a note); admins read every rating and the trends per workflow and per host.

An artist files only for their own VM (403 otherwise, as for resize requests) and lists only the
ratings they filed; another's rating is a 404. Filing twice for the same VM and day replaces the
day's rating (200 instead of 201). `trends/` is for admins and names no artist. `?format=csv`
exports the list with its filters, like every list of the API.
"""

from __future__ import annotations

from django.db.models import QuerySet
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiParameter, OpenApiResponse, extend_schema, extend_schema_view
from rest_framework import mixins, serializers, status, viewsets
from rest_framework.decorators import action
from rest_framework.exceptions import PermissionDenied, ValidationError
from rest_framework.permissions import IsAuthenticated
from rest_framework.response import Response

from config.api.permissions import IsFleetAdmin
from config.api.serializers import DetailSerializer, ExpandableMixin
from fleet.models import VirtualMachine
from sizing import feedback as service
from sizing import feedback_rules
from sizing.filtersets import FeedbackFilterSet
from sizing.models import Feedback

TAGS_HELP = "Quick tags, any of: " + ", ".join(feedback_rules.TAGS) + " (`fine` alone, not with a problem)"


class IsFleetAdminForTrends(IsFleetAdmin):
    message = "Only fleet admins (staff) may read the feedback trends."


class FeedbackSerializer(ExpandableMixin, serializers.ModelSerializer):
    """One day's rating of one VM by its artist (admins see every artist's, with the name)."""

    expandable_fields = ("vm", "artist", "host")

    vm_name = serializers.CharField(source="vm.name", read_only=True)
    artist_name = serializers.CharField(source="artist.name", read_only=True)
    workflow = serializers.CharField(source="artist.workflow", read_only=True)
    host_name = serializers.CharField(source="host.name", read_only=True, default=None)
    tags = serializers.ListField(child=serializers.CharField(), read_only=True, help_text=TAGS_HELP)

    class Meta:
        model = Feedback
        fields = ["id", "vm", "vm_name", "artist", "artist_name", "workflow", "host", "host_name", "session_date",
                  "rating", "tags", "note", "created_at", "updated_at"]
        read_only_fields = fields


class FeedbackFileSerializer(serializers.Serializer):
    """What an artist sends: the VM, a rating, tags, a note and (optionally) the day rated."""

    vm = serializers.PrimaryKeyRelatedField(queryset=VirtualMachine.objects.all(), help_text="Your own VM")
    rating = serializers.IntegerField(help_text="1 (could not work) to 5 (smooth)")
    tags = serializers.ListField(child=serializers.CharField(max_length=40), required=False, default=list,
                                 max_length=len(feedback_rules.TAGS), help_text=TAGS_HELP)
    note = serializers.CharField(required=False, allow_blank=True, default="", trim_whitespace=False,
                                 help_text=f"Optional, at most {feedback_rules.NOTE_MAX_CHARS} characters")
    session_date = serializers.DateField(
        required=False, allow_null=True, default=None,
        help_text=f"The working day rated (default today); up to {service.MAX_DAYS_BACK} days back",
    )


class TrendsQuerySerializer(serializers.Serializer):
    group = serializers.ChoiceField(choices=service.GROUPS, default="workflow")
    since = serializers.DateField(required=False, allow_null=True, default=None,
                                  help_text="First day (default: four weeks ago)")
    until = serializers.DateField(required=False, allow_null=True, default=None, help_text="Last day (default today)")

    def validate(self, attrs):
        since, until = attrs.get("since"), attrs.get("until")
        if since and until and since > until:
            raise ValidationError({"since": [f"The first day ({since}) comes after the last ({until})."]})
        return attrs


TREND_ROW = {"type": "object", "properties": {
    "key": {"type": "string"}, "label": {"type": "string"}, "count": {"type": "integer"},
    "mean": {"type": "number", "nullable": True}, "low_share": {"type": "number"}, "high_share": {"type": "number"},
    "tags": {"type": "object", "additionalProperties": {"type": "number"}},
    "weeks": {"type": "array", "items": {"type": "object"}}}}


@extend_schema_view(
    list=extend_schema(summary="List ratings (an artist: their own)"),
    retrieve=extend_schema(summary="One rating"),
    create=extend_schema(
        summary="Rate a working day on your own VM",
        description="A second rating of the same VM and day replaces the first (answered 200, the first 201).",
        request=FeedbackFileSerializer,
        responses={201: FeedbackSerializer, 200: FeedbackSerializer,
                   403: OpenApiResponse(DetailSerializer, description="Not your own VM")},
    ),
)
class FeedbackViewSet(mixins.ListModelMixin, mixins.RetrieveModelMixin, mixins.CreateModelMixin,
                      viewsets.GenericViewSet):
    """Artists' ratings of their working days. Artists see and file their own; admins see all."""

    serializer_class = FeedbackSerializer
    permission_classes = [IsAuthenticated]
    filterset_class = FeedbackFilterSet
    ordering_fields = ["id", "session_date", "rating", "vm__name"]

    def get_queryset(self) -> QuerySet[Feedback]:
        if getattr(self, "swagger_fake_view", False):
            return Feedback.objects.none()
        return service.feedback_for(self.request.user)

    def create(self, request, *args, **kwargs):
        body = FeedbackFileSerializer(data=request.data)
        body.is_valid(raise_exception=True)
        data = body.validated_data
        try:
            feedback, created = service.file_feedback(request.user, data["vm"], data["rating"], data["tags"],
                                                      data["note"], data["session_date"])
        except PermissionError as exc:
            raise PermissionDenied(str(exc)) from exc
        except service.FeedbackError as exc:
            raise ValidationError({name: [message] for name, message in exc.errors.items()}) from exc
        fresh = self.get_queryset().get(pk=feedback.pk)
        return Response(self.get_serializer(fresh).data,
                        status=status.HTTP_201_CREATED if created else status.HTTP_200_OK)

    @extend_schema(
        summary="Ratings per workflow or per host (admins)",
        parameters=[
            OpenApiParameter("group", OpenApiTypes.STR, enum=list(service.GROUPS),
                             description="workflow (the artist's) or host (the VM's on the day rated)"),
            OpenApiParameter("since", OpenApiTypes.DATE, description="First day (default: four weeks ago)"),
            OpenApiParameter("until", OpenApiTypes.DATE, description="Last day (default today)"),
        ],
        responses={200: {"type": "object", "properties": {
            "group": {"type": "string"}, "since": {"type": "string", "format": "date"},
            "until": {"type": "string", "format": "date"}, "results": {"type": "array", "items": TREND_ROW}}}},
    )
    @action(detail=False, methods=["get"], permission_classes=[IsFleetAdminForTrends], pagination_class=None,
            filterset_class=None)
    def trends(self, request, format=None):
        """Count, mean rating, share of ratings at 1-2 and 4-5 stars and of each tag, overall and
        per week, for each workflow or host. No artist names."""
        query = TrendsQuerySerializer(data=request.query_params)
        query.is_valid(raise_exception=True)
        group, since, until = (query.validated_data[name] for name in ("group", "since", "until"))
        since, until = service.trend_window(since, until)
        rows = service.trends(group, since, until)
        return Response({"group": group, "since": since.isoformat(), "until": until.isoformat(),
                         "results": [row.as_dict() for row in rows]})

"""The agents resource of the v1 API (DESIGN.md, `agents/`): the sources we collect from.

Staff only, reads included: an agent's URL and errors describe the studio's network, and
its token is a credential. The bearer token is derived, never stored (`Agent.token`); it
appears in exactly two responses, the one creating the agent and the one rotating its token,
so a script that registers an agent can write the token file right away and nobody can read
it back later. Writes go through `telemetry.services`, which records them in the audit log.

`host` and `vm` bind the agent's token to what it may write (`telemetry.ingest`, "Scope"):
a host agent to its host, an in-guest push agent (kind nvidia-smi) to its one VM, never both.
"""

from __future__ import annotations

from django.db.models import QuerySet
from drf_spectacular.utils import OpenApiResponse, extend_schema, extend_schema_view
from rest_framework import serializers, status, viewsets
from rest_framework.decorators import action
from rest_framework.response import Response

from config.api.caching import CachedListMixin
from config.api.permissions import IsFleetAdmin
from config.api.serializers import ExpandableMixin
from telemetry import services
from telemetry.filtersets import AgentFilterSet
from telemetry.models import Agent, AgentKind, AgentStatus

POLLED_KINDS = (AgentKind.NVML, AgentKind.DCGM_EXPORTER)
MAX_TIMEOUT_S = 60.0


class IsAgentAdmin(IsFleetAdmin):
    message = "Only fleet admins (staff) may see or manage agents."


class AgentSerializer(ExpandableMixin, serializers.ModelSerializer):
    """An agent as admins see it; collection figures are read-only (the collector writes them)."""

    expandable_fields = ("host", "vm")

    status = serializers.ChoiceField(
        choices=AgentStatus.choices, read_only=True,
        help_text="ok: polled recently; stale: not seen for TELEMETRY_STALE_AFTER_S; error: the last attempt "
                  "failed (see last_error); new: never seen; disabled",
    )

    class Meta:
        model = Agent
        fields = ["id", "name", "url", "kind", "host", "vm", "enabled", "timeout_s", "last_seen", "status",
                  "last_error", "last_error_at", "consecutive_failures", "scheduler_write"]
        read_only_fields = ["last_seen", "last_error", "last_error_at", "consecutive_failures", "scheduler_write"]
        extra_kwargs = {
            "timeout_s": {"min_value": 0.1, "max_value": MAX_TIMEOUT_S,
                          "help_text": "Seconds a poll may take in all; keep it below the poll interval"},
        }

    def validate(self, attrs):
        instance = self.instance
        kind = attrs.get("kind", instance.kind if instance else AgentKind.NVML)
        url = attrs.get("url", instance.url if instance else "")
        if kind in POLLED_KINDS and not url:
            raise serializers.ValidationError(
                {"url": f"An agent of kind {kind} is polled: give the URL to poll "
                        f"(http://host:9410 for the agent, http://host:9400/metrics for dcgm-exporter)."}
            )
        host = attrs.get("host", instance.host if instance else None)
        vm = attrs.get("vm", instance.vm if instance else None)
        if vm is not None and host is not None:
            raise serializers.ValidationError(
                {"vm": "An agent is bound to a host or to a VM, not to both: leave host empty for an agent that "
                       "pushes from inside a VM."})
        if vm is not None and kind != AgentKind.NVIDIA_SMI:
            raise serializers.ValidationError(
                {"vm": f"Only nvidia-smi agents (documents pushed from inside the VM) are bound to a VM; an agent of "
                       f"kind {kind} reports a host."})
        return attrs


class AgentWithTokenSerializer(AgentSerializer):
    """An agent and its bearer token: only in the response that creates it."""

    token = serializers.CharField(
        read_only=True,
        help_text="Bearer token the agent must expect (write it to its --token-file). Shown only in this "
                  "response; POST rotate-token/ for a new one.",
    )

    class Meta(AgentSerializer.Meta):
        fields = [*AgentSerializer.Meta.fields, "token"]


class AgentTokenSerializer(serializers.Serializer):
    """A newly issued token of one agent; the previous one stops working at once."""

    id = serializers.IntegerField(read_only=True)
    name = serializers.CharField(read_only=True)
    token = serializers.CharField(read_only=True, help_text="Shown only in this response")


@extend_schema_view(
    create=extend_schema(
        summary="Register an agent",
        description="The response is the only one that carries the agent's bearer `token`.",
        responses={201: AgentWithTokenSerializer},
    ),
)
class AgentViewSet(CachedListMixin, viewsets.ModelViewSet):
    """Agents and other sources of samples, with their collection status; staff only."""

    #: "stale" follows the clock, not a write: a page is at most this old.
    read_cache_max_age_s = 5

    permission_classes = [IsAgentAdmin]
    serializer_class = AgentSerializer
    filterset_class = AgentFilterSet
    ordering_fields = ["id", "name", "kind", "host", "enabled", "last_seen", "consecutive_failures"]
    ordering = ["name", "id"]

    def get_queryset(self) -> QuerySet:
        return Agent.objects.select_related("host", "vm").order_by("name", "id")

    def perform_update(self, serializer) -> None:
        serializer.instance = services.save_agent(serializer.instance, **serializer.validated_data)

    def perform_destroy(self, instance) -> None:
        services.delete_agent(instance)

    def create(self, request, *args, **kwargs):
        serializer = self.get_serializer(data=request.data)
        serializer.is_valid(raise_exception=True)
        agent = services.save_agent(Agent(), **serializer.validated_data)
        return Response(AgentWithTokenSerializer(agent, context=self.get_serializer_context()).data,
                        status=status.HTTP_201_CREATED)

    @extend_schema(
        summary="Issue a new token",
        description="Replaces the agent's bearer token; the old one stops working at once. The new token is "
                    "shown only in this response.",
        request=None,
        responses={200: AgentTokenSerializer, 404: OpenApiResponse(description="No such agent")},
    )
    @action(detail=True, methods=["post"], url_path="rotate-token")
    def rotate_token(self, request, pk=None, format=None):
        agent = self.get_object()
        token = services.rotate_token(agent)
        return Response(AgentTokenSerializer({"id": agent.pk, "name": agent.name, "token": token}).data)

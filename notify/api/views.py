"""The notification channels and deliveries of the v1 API (`notification-channels/`,
`deliveries/`): staff only, reads included, since targets and errors describe the studio's
mail and chat. Writes go through `notify.services`, which records them in the audit log; a
webhook's secret is written, never read back, except once in the response creating it when
the product generated it. `POST notification-channels/{id}/test/` sends a test message at once
and answers with the delivery: 200 when sent, 502 (same body) when the channel failed.
"""

from __future__ import annotations

from django.db.models import QuerySet
from drf_spectacular.utils import OpenApiResponse, extend_schema, extend_schema_view
from rest_framework import status, viewsets
from rest_framework.decorators import action
from rest_framework.response import Response

from config.api.permissions import IsFleetAdmin
from notify import queries, services
from notify.api.serializers import (
    DeliverySerializer,
    NotificationChannelCreatedSerializer,
    NotificationChannelSerializer,
)
from notify.choices import DeliveryStatus
from notify.filtersets import DeliveryFilterSet, NotificationChannelFilterSet
from notify.models import NotificationChannel


class IsNotifyAdmin(IsFleetAdmin):
    message = "Only fleet admins (staff) may see or manage notification channels and deliveries."


@extend_schema_view(
    create=extend_schema(
        summary="Create a channel",
        description="For a webhook created without a secret, the response is the only one that carries the "
                    "generated `secret`.",
        responses={201: NotificationChannelCreatedSerializer},
    ),
)
class NotificationChannelViewSet(viewsets.ModelViewSet):
    """Where alerts and other messages go: e-mail, signed webhooks, chat webhooks, in-app."""

    permission_classes = [IsNotifyAdmin]
    serializer_class = NotificationChannelSerializer
    filterset_class = NotificationChannelFilterSet
    ordering_fields = ["id", "name", "kind", "enabled", "created_at"]
    ordering = ["name", "id"]

    def get_queryset(self) -> QuerySet:
        return NotificationChannel.objects.order_by("name", "id")

    def create(self, request, *args, **kwargs):
        serializer = self.get_serializer(data=request.data)
        serializer.is_valid(raise_exception=True)
        channel, generated = services.save_channel(NotificationChannel(), **serializer.validated_data)
        data = NotificationChannelCreatedSerializer(channel, context=self.get_serializer_context()).data
        data["secret"] = generated
        return Response(data, status=status.HTTP_201_CREATED)

    def perform_update(self, serializer) -> None:
        serializer.instance, _ = services.save_channel(serializer.instance, **serializer.validated_data)

    def perform_destroy(self, instance) -> None:
        services.delete_channel(instance)

    @extend_schema(summary="Send a test message", request=None, responses={
        200: DeliverySerializer,
        502: OpenApiResponse(DeliverySerializer, description="The channel failed; the delivery says why and "
                                                             "when it is tried again")})
    @action(detail=True, methods=["post"])
    def test(self, request, pk=None, format=None):
        """Send a test message through the channel now (even when disabled) and answer with the delivery."""
        delivery = services.send_test(self.get_object())
        code = status.HTTP_200_OK if delivery.status == DeliveryStatus.SENT else status.HTTP_502_BAD_GATEWAY
        return Response(DeliverySerializer(delivery).data, status=code)

    @extend_schema(summary="The channel's deliveries", responses=DeliverySerializer(many=True),
                   filters=False)
    @action(detail=True, methods=["get"])
    def deliveries(self, request, pk=None, format=None):
        """The channel's deliveries, newest first, paginated."""
        rows = queries.deliveries().filter(channel=self.get_object())
        page = self.paginate_queryset(rows)
        if page is not None:
            return self.get_paginated_response(DeliverySerializer(page, many=True).data)
        return Response(DeliverySerializer(rows, many=True).data)  # ?format=csv: every row


class DeliveryViewSet(viewsets.ReadOnlyModelViewSet):
    """Every message sent (or being sent) to every channel, newest first; filter by channel and status."""

    permission_classes = [IsNotifyAdmin]
    serializer_class = DeliverySerializer
    filterset_class = DeliveryFilterSet
    ordering_fields = ["id", "created_at", "status", "attempts"]
    ordering = ["-created_at", "-id"]

    def get_queryset(self) -> QuerySet:
        return queries.deliveries()

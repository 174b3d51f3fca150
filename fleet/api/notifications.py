"""`notifications/`: the signed-in user's own in-app notifications, and marking them read.

Everyone, admins included, sees only their own: a notification is a message to one person.
`?read=false` lists the unread ones (what a bell shows); `POST read-all/` and
`POST {id}/read/` mark them read, as opening the notifications page does.
"""

from __future__ import annotations

import django_filters
from django.db.models import QuerySet
from drf_spectacular.utils import extend_schema, inline_serializer
from rest_framework import mixins, serializers, viewsets
from rest_framework.decorators import action
from rest_framework.permissions import IsAuthenticated
from rest_framework.response import Response

from fleet import requests as service
from fleet.models import Notification


class NotificationSerializer(serializers.ModelSerializer):
    read = serializers.SerializerMethodField(help_text="Whether the user has read it")

    class Meta:
        model = Notification
        fields = ["id", "created_at", "message", "url", "read", "read_at"]
        read_only_fields = fields

    def get_read(self, obj: Notification) -> bool:
        return obj.read_at is not None


class NotificationFilterSet(django_filters.FilterSet):
    # A choice, not a BooleanFilter: that one reads "?read=maybe" as no filter at all, and a
    # script asking for unread ones with a typo would mark everything read it was shown.
    read = django_filters.ChoiceFilter(choices=[("true", "read"), ("false", "unread")], method="filter_read",
                                       help_text="true: read ones only; false: unread ones only")

    class Meta:
        model = Notification
        fields = ["read"]

    def filter_read(self, queryset, name, value):
        return queryset.filter(read_at__isnull=value == "false")


class NotificationViewSet(mixins.ListModelMixin, mixins.RetrieveModelMixin, viewsets.GenericViewSet):
    """The signed-in user's notifications, newest first; another user's are 404."""

    serializer_class = NotificationSerializer
    permission_classes = [IsAuthenticated]
    filterset_class = NotificationFilterSet
    ordering_fields = ["created_at"]

    def get_queryset(self) -> QuerySet[Notification]:
        if getattr(self, "swagger_fake_view", False):
            return Notification.objects.none()
        return Notification.objects.filter(user=self.request.user).order_by("-created_at", "-id")

    @extend_schema(request=None, responses={200: inline_serializer(
        "NotificationsMarkedRead", {"marked": serializers.IntegerField(help_text="How many were unread")})})
    @action(detail=False, methods=["post"], url_path="read-all")
    def read_all(self, request, format=None):
        """Mark all of the user's notifications read."""
        return Response({"marked": service.mark_read(request.user)})

    @extend_schema(request=None, responses={200: NotificationSerializer})
    @action(detail=True, methods=["post"])
    def read(self, request, pk=None, format=None):
        """Mark one notification read."""
        notification = self.get_object()
        service.mark_read(request.user, [notification.pk])
        notification.refresh_from_db(fields=["read_at"])
        return Response(self.get_serializer(notification).data)

"""Reads of the notify app shared by the pages and the API."""

from __future__ import annotations

from django.db.models import OuterRef, QuerySet, Subquery

from notify.models import Delivery, NotificationChannel


def channels_with_last_delivery() -> QuerySet:
    """Channels by name, each with `last_status`, `last_at` and `last_error` of its newest
    delivery (None without any), in one query."""
    newest = Delivery.objects.filter(channel=OuterRef("pk")).order_by("-created_at", "-id")
    return NotificationChannel.objects.annotate(
        last_status=Subquery(newest.values("status")[:1]),
        last_at=Subquery(newest.values("created_at")[:1]),
        last_error=Subquery(newest.values("last_error")[:1]),
    ).order_by("name", "id")


def deliveries() -> QuerySet:
    return Delivery.objects.select_related("channel").order_by("-created_at", "-id")

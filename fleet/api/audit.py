"""`audit-events/`: the audit log, read-only and for fleet admins only.

Artists get 403: events carry other people's names and rows. `?format=csv` streams every
matching event (the same filters, no pagination) so an export of a long log needs no memory
proportional to its length.
"""

from __future__ import annotations

import csv
import json

import django_filters
from django import forms
from django.db.models import Q
from django.http import StreamingHttpResponse
from django.utils import timezone
from rest_framework import serializers, viewsets
from rest_framework.renderers import BaseRenderer, BrowsableAPIRenderer, JSONRenderer

from config import parsing
from fleet.api.caching import CachedListMixin
from fleet.api.permissions import IsFleetAdmin
from fleet.choices import AuditSource
from fleet.models import AuditEvent

CSV_COLUMNS = ("at", "actor", "source", "action", "object_type", "object_id", "object", "before", "after", "comment")


class TimeField(forms.CharField):
    """A time as `config.parsing` reads it: ISO 8601 (a naive time is in the server's zone) or Unix
    seconds, like the rest of the API; anything else is the filter's form error (a 400 naming it)."""

    def to_python(self, value):
        text = super().to_python(value)
        if not text:
            return None
        try:
            return parsing.parse_time(text, default_tz=timezone.get_current_timezone())
        except parsing.ParseError as exc:
            raise forms.ValidationError(str(exc), code="invalid") from None


class TimeFilter(django_filters.CharFilter):
    field_class = TimeField


class AuditEventFilter(django_filters.FilterSet):
    action = django_filters.CharFilter()
    object_type = django_filters.CharFilter()
    object_id = django_filters.CharFilter()
    source = django_filters.ChoiceFilter(choices=AuditSource.choices)
    actor = django_filters.CharFilter(method="filter_actor", help_text="user id or username")
    since = TimeFilter(field_name="at", lookup_expr="gte", help_text="ISO 8601 or Unix seconds")
    until = TimeFilter(field_name="at", lookup_expr="lt", help_text="ISO 8601 or Unix seconds")
    q = django_filters.CharFilter(method="filter_q", help_text="text in the object's name or the comment")

    class Meta:
        model = AuditEvent
        fields = ["action", "object_type", "object_id", "source"]

    def filter_actor(self, qs, name, value):
        try:
            return qs.filter(actor_id=parsing.parse_int(value))
        except parsing.ParseError:  # not an id: a user name
            return qs.filter(Q(actor__username=value) | Q(actor_name=value))

    def filter_q(self, qs, name, value):
        return qs.filter(Q(object_repr__icontains=value) | Q(comment__icontains=value))


class AuditObjectSerializer(serializers.Serializer):
    """What the event is about, in one field (the v1 contract's `object`)."""

    type = serializers.CharField(source="object_type")
    id = serializers.CharField(source="object_id")
    repr = serializers.CharField(source="object_repr")


class AuditEventSerializer(serializers.ModelSerializer):
    object = AuditObjectSerializer(source="*", read_only=True)

    class Meta:
        model = AuditEvent
        fields = ["id", "at", "actor", "actor_name", "source", "action", "object", "object_type", "object_id",
                  "object_repr", "before", "after", "comment"]
        read_only_fields = fields


class CsvRenderer(BaseRenderer):
    """Declares `?format=csv` to content negotiation; the view streams the body itself."""

    media_type = "text/csv"
    format = "csv"

    def render(self, data, accepted_media_type=None, renderer_context=None):
        return json.dumps(data).encode() if data is not None else b""


class _Echo:
    def write(self, value):
        return value


def csv_cell(value):
    return "" if value is None else json.dumps(value, sort_keys=True)


def csv_rows(queryset):
    writer = csv.writer(_Echo())
    yield writer.writerow(CSV_COLUMNS)
    for event in queryset.iterator(chunk_size=500):
        yield writer.writerow([
            event.at.isoformat(), event.actor_name, event.source, event.action, event.object_type,
            event.object_id, event.object_repr, csv_cell(event.before), csv_cell(event.after), event.comment,
        ])


class AuditEventViewSet(CachedListMixin, viewsets.ReadOnlyModelViewSet):
    """The audit log, newest first; `?format=csv` exports every matching event."""

    queryset = AuditEvent.objects.all()
    serializer_class = AuditEventSerializer
    permission_classes = [IsFleetAdmin]
    filterset_class = AuditEventFilter
    renderer_classes = [JSONRenderer, BrowsableAPIRenderer, CsvRenderer]
    ordering_fields = ["at", "id"]
    ordering = ["-at", "-id"]

    def list(self, request, *args, **kwargs):
        if getattr(request.accepted_renderer, "format", None) == "csv":
            queryset = self.filter_queryset(self.get_queryset())
            response = StreamingHttpResponse(csv_rows(queryset), content_type="text/csv; charset=utf-8")
            response["Content-Disposition"] = f'attachment; filename="audit-{timezone.localdate()}.csv"'
            return response
        return super().list(request, *args, **kwargs)

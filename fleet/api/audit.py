"""`audit-events/`: the audit log, read-only and for fleet admins only.

Artists get 403: events carry other people's names and rows. `?format=csv` streams every
matching event (the same filters, no pagination) so an export of a long log needs no memory
proportional to its length. Every cell, before/after JSON included, is made safe for a
spreadsheet by `config.csv_export`; `?format=csv` on one event or on an error answers
`field,value` rows made safe the same way.
"""

from __future__ import annotations

import json

import django_filters
from django import forms
from django.db.models import Q
from django.utils import timezone
from rest_framework import serializers, viewsets
from rest_framework.renderers import BrowsableAPIRenderer, JSONRenderer

from config import parsing
from config.csv_export import CsvRenderer, chunked, csv_response
from fleet.api.caching import CachedListMixin
from fleet.api.permissions import IsFleetAdmin
from fleet.choices import AuditSource
from fleet.models import AuditEvent

CSV_CHUNK_ROWS = 500
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


def csv_value(value) -> str | None:
    """A before/after snapshot as the JSON text of one cell (None: empty)."""
    return None if value is None else json.dumps(value, sort_keys=True)


def csv_chunks(queryset):
    for chunk in chunked(queryset.iterator(chunk_size=CSV_CHUNK_ROWS), CSV_CHUNK_ROWS):
        yield [
            [event.at.isoformat(), event.actor_name, event.source, event.action, event.object_type, event.object_id,
             event.object_repr, csv_value(event.before), csv_value(event.after), event.comment]
            for event in chunk
        ]


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
            return csv_response(f"audit-{timezone.localdate()}.csv", CSV_COLUMNS, csv_chunks(queryset))
        return super().list(request, *args, **kwargs)

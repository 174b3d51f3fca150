"""`audit-events/`: the audit log, read-only and for fleet admins only.

Artists get 403: events carry other people's names and rows. `?format=csv` streams every
matching event (the same filters, no pagination) so an export of a long log needs no memory
proportional to its length. Every cell, before/after JSON included, is made safe for a
spreadsheet by `config.csv_export`; `?format=csv` on one event or on an error answers
`field,value` rows made safe the same way.
"""

from __future__ import annotations

import json

from django.utils import timezone
from rest_framework import serializers, viewsets
from rest_framework.renderers import BrowsableAPIRenderer, JSONRenderer

from config.api.caching import CachedListMixin
from config.api.permissions import IsFleetAdmin
from config.csv_export import CsvRenderer, chunked, csv_response
from fleet.filtersets import AuditEventFilter
from fleet.models import AuditEvent

CSV_CHUNK_ROWS = 500
CSV_COLUMNS = ("at", "actor", "source", "action", "object_type", "object_id", "object", "before", "after", "comment")


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

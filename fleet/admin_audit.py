"""Audit events for admin pages that save rows themselves rather than through a service.

Pages whose forms save through `fleet.services` (hosts, GPUs, VMs, vGPUs) are recorded by the
service; every other admin page writes "<type>.create", "<type>.update" and "<type>.delete"
here, with the row before and after. The actor and the "admin" source come from the request
(`fleet.audit.AuditMiddleware`). The bulk "Delete selected" action writes one event per row,
so a row's history shows its deletion whatever page removed it.
"""

from __future__ import annotations

from django.contrib import admin
from django.db import router, transaction

from config.admin_input import SafeInputAdminMixin
from fleet import audit
from fleet.models import AuditEvent


def stored_snapshot(obj) -> dict | None:
    """The row as the database holds it now (the admin form has already changed `obj` in memory)."""
    if obj.pk is None:
        return None
    stored = type(obj)._default_manager.filter(pk=obj.pk).first()
    return audit.snapshot(stored)


def deletion_event(obj) -> AuditEvent:
    """The "<type>.delete" event of a row about to go: its id and name are kept in the event."""
    return audit.event(f"{audit.object_type_of(obj)}.delete", obj, before=audit.snapshot(obj))


class AuditedDeleteMixin:
    """Records deletions from the change form and from the "Delete selected" action."""

    def delete_model(self, request, obj):
        event = deletion_event(obj)
        with transaction.atomic(using=router.db_for_write(type(obj))):
            super().delete_model(request, obj)
            audit.record_many([event])

    def delete_queryset(self, request, queryset):
        with transaction.atomic(using=router.db_for_write(queryset.model)):
            events = [deletion_event(obj) for obj in queryset]
            super().delete_queryset(request, queryset)
            audit.record_many(events)


class AuditedAdmin(SafeInputAdminMixin, AuditedDeleteMixin, admin.ModelAdmin):
    """A ModelAdmin whose saves and deletions write audit events (a save that changed nothing,
    like a list_editable row left alone, writes none); bad input in its filters and autocomplete
    fields is refused as the admin refuses any (config.admin_input)."""

    def save_model(self, request, obj, form, change):
        before = stored_snapshot(obj) if change else None
        super().save_model(request, obj, form, change)
        after = audit.snapshot(obj)
        object_type = audit.object_type_of(obj)
        if before is None:
            audit.record(f"{object_type}.create", obj, after=after)
        elif audit.changed(before, after):
            audit.record(f"{object_type}.update", obj, before=before, after=after)

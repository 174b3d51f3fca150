"""The audit log: one AuditEvent per change to the fleet, written with the change.

Call `record(...)` inside the transaction that makes the change: an event exists exactly when
the change committed. Who made it and from where come from the request being served
(`AuditMiddleware` keeps it in a context variable, and DRF's token authentication sets the
user on that same request), so services need not pass them along; workers and commands run
outside a request and are recorded as "system" unless they say otherwise with `acting_as`.

`snapshot(obj)` turns a model row into the JSON kept as "before" and "after": concrete fields
only, foreign keys as ids, times as ISO 8601.
"""

from __future__ import annotations

import contextvars
import datetime
import decimal
import uuid
from contextlib import contextmanager
from typing import Any

from django.db import models
from django.utils import timezone

from fleet.choices import AuditSource
from fleet.models import AuditEvent

_request: contextvars.ContextVar = contextvars.ContextVar("audit_request", default=None)
_override: contextvars.ContextVar = contextvars.ContextVar("audit_override", default=None)
_suppressed: contextvars.ContextVar = contextvars.ContextVar("audit_suppressed", default=False)

#: Fields never copied into an event (secrets and noise).
SKIPPED_FIELDS = frozenset({"password", "token_hash", "token", "last_login"})


def source_of(path: str) -> str:
    """Where a request came from, by its path: the API, the admin site or a page."""
    if path.startswith("/api/"):
        return AuditSource.API
    if path.startswith("/admin/"):
        return AuditSource.ADMIN
    return AuditSource.WEB


class AuditMiddleware:
    """Keeps the request being served where `record` finds it (a context variable, so each
    thread and each async task sees its own)."""

    def __init__(self, get_response):
        self.get_response = get_response

    def __call__(self, request):
        token = _request.set(request)
        try:
            return self.get_response(request)
        finally:
            _request.reset(token)


@contextmanager
def acting_as(user=None, source: str = AuditSource.SYSTEM, name: str = ""):
    """Record the changes made inside the block as `user` (or `name`, e.g. an agent's) from
    `source`, whatever request is being served: for workers, commands and tests."""
    token = _override.set((user, source, name))
    try:
        yield
    finally:
        _override.reset(token)


@contextmanager
def suppressed():
    """Write no per-row events inside the block: for bulk paths (demo seeding) that record
    one summary event instead of thousands nobody would read."""
    token = _suppressed.set(True)
    try:
        yield
    finally:
        _suppressed.reset(token)


def current_actor() -> tuple[Any, str, str]:
    """(user or None, source, display name) of whoever is making changes now."""
    override = _override.get()
    if override is not None:
        user, source, name = override
        return user, source, name or (user.get_username() if user is not None else "system")
    request = _request.get()
    if request is None:
        return None, AuditSource.SYSTEM, "system"
    user = getattr(request, "user", None)
    if user is None or not user.is_authenticated:
        return None, source_of(request.path), "anonymous"
    return user, source_of(request.path), user.get_username()


def _json_value(value: Any) -> Any:
    if isinstance(value, datetime.datetime | datetime.date | datetime.time):
        return value.isoformat()
    if isinstance(value, decimal.Decimal | uuid.UUID):
        return str(value)
    return value


def snapshot(obj: models.Model | None, fields: list[str] | None = None) -> dict[str, Any] | None:
    """A row's concrete fields as JSON (foreign keys as `<name>_id` ids), or None for no row."""
    if obj is None:
        return None
    data = {}
    for field in obj._meta.concrete_fields:
        if field.name in SKIPPED_FIELDS or (fields is not None and field.name not in fields):
            continue
        data[field.attname] = _json_value(getattr(obj, field.attname))
    return data


def changed(before: dict | None, after: dict | None) -> bool:
    """True when an update changed something worth an event."""
    return before != after


def record(action: str, obj: models.Model | None = None, *, before: dict | None = None, after: dict | None = None,
           comment: str = "", object_type: str | None = None, object_id: Any = None,
           object_repr: str | None = None) -> AuditEvent | None:
    """Write one event for `action` ("<object type>.<verb>", e.g. "vgpu.place") on `obj`.

    `object_type`, `object_id` and `object_repr` default to the row's model name, primary key
    and str(); pass them for an object that no longer exists (after a delete)."""
    if _suppressed.get():  # inside suppressed(): a bulk path records its own summary
        return None
    user, source, name = current_actor()
    if obj is not None:
        object_type = object_type or obj._meta.model_name
        object_id = obj.pk if object_id is None else object_id
        object_repr = str(obj) if object_repr is None else object_repr
    return AuditEvent.objects.create(
        at=timezone.now(), actor=user, actor_name=name[:150], source=source, action=action[:60],
        object_type=(object_type or "")[:40], object_id="" if object_id is None else str(object_id)[:40],
        object_repr=(object_repr or "")[:200], before=before, after=after, comment=comment,
    )

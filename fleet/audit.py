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
_because: contextvars.ContextVar = contextvars.ContextVar("audit_because", default="")

#: Fields never copied into an event (secrets and noise). An agent's token is derived from its
#: salt, and its SHA-256 lets anyone holding it test guesses: neither goes into the log.
SKIPPED_FIELDS = frozenset({"password", "token_hash", "token", "token_salt", "token_sha256", "last_login"})

#: Object types of models whose model name is not the one the log uses.
OBJECT_TYPES = {"virtualmachine": "vm", "gpumodel": "gpu_model", "vgpuprofile": "vgpu_profile",
                "workflowpreset": "workflow_preset", "optimizerrun": "optimizer_run",
                "resizerequest": "resize_request", "schedulerpolicy": "scheduler_policy",
                "apitoken": "api_token"}


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


@contextmanager
def because(comment: str):
    """Events recorded inside the block without a comment of their own get `comment`: the vGPU
    moves of an approved resize request say which request made them."""
    token = _because.set(comment)
    try:
        yield
    finally:
        _because.reset(token)


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
    """A row's concrete fields as JSON (foreign keys as `<name>_id` ids), or None for no row.

    "Last modified" stamps (auto_now) are left out: the event's own time says when, and a
    save that changed nothing else must compare equal (no event)."""
    if obj is None:
        return None
    data = {}
    for field in obj._meta.concrete_fields:
        if field.name in SKIPPED_FIELDS or (fields is not None and field.name not in fields):
            continue
        if getattr(field, "auto_now", False):
            continue
        data[field.attname] = _json_value(getattr(obj, field.attname))
    return data


def object_type_of(obj_or_model) -> str:
    """The log's name for a row's (or model's) type: "vm", "gpu_model", "host"."""
    name = obj_or_model._meta.model_name
    return OBJECT_TYPES.get(name, name)


def changed_fields(before: dict | None, after: dict | None) -> list[str]:
    """The fields whose value differs between two snapshots, in field order."""
    before, after = before or {}, after or {}
    return [name for name in {**before, **after} if before.get(name) != after.get(name)]


def summary(before: dict | None, after: dict | None, limit: int = 4) -> str:
    """One line saying what an event changed, for the history boxes: "created", "deleted", or
    the changed fields with old and new values ("name: a -> b; vcpus: 8 -> 16")."""
    if before is None and after is None:
        return ""
    if before is None:
        return "created"
    if after is None:
        return "deleted"
    names = changed_fields(before, after)
    parts = [f"{name}: {_short(before.get(name))} -> {_short(after.get(name))}" for name in names[:limit]]
    if len(names) > limit:
        parts.append(f"{len(names) - limit} more")
    return "; ".join(parts) or "no field changed"


def _short(value: Any, width: int = 40) -> str:
    text = "-" if value in (None, "") else str(value)
    return text if len(text) <= width else text[: width - 1] + "…"


def changed(before: dict | None, after: dict | None) -> bool:
    """True when an update changed something worth an event."""
    return before != after


def event(action: str, obj: models.Model | None = None, *, before: dict | None = None,
          after: dict | None = None, comment: str = "", object_type: str | None = None, object_id: Any = None,
          object_repr: str | None = None) -> AuditEvent:
    """An unsaved event for `action` by the current actor (see `record`), for `record_many`."""
    user, source, name = current_actor()
    if obj is not None:
        object_type = object_type or object_type_of(obj)
        object_id = obj.pk if object_id is None else object_id
        object_repr = str(obj) if object_repr is None else object_repr
    return AuditEvent(
        at=timezone.now(), actor=user, actor_name=name[:150], source=source, action=action[:60],
        object_type=(object_type or "")[:40], object_id="" if object_id is None else str(object_id)[:40],
        object_repr=(object_repr or "")[:200], before=before, after=after, comment=comment,
    )


def record_many(events: list[AuditEvent]) -> list[AuditEvent]:
    """Write events built with `event` in one statement: for paths that change many rows at
    once (an agent's discovery, a bulk admin action) and must not pay one INSERT per row."""
    if _suppressed.get() or not events:
        return []
    return AuditEvent.objects.bulk_create(events)


def record(action: str, obj: models.Model | None = None, *, before: dict | None = None, after: dict | None = None,
           comment: str = "", object_type: str | None = None, object_id: Any = None,
           object_repr: str | None = None) -> AuditEvent | None:
    """Write one event for `action` ("<object type>.<verb>", e.g. "vgpu.place") on `obj`.

    `object_type`, `object_id` and `object_repr` default to the row's model name, primary key
    and str(); pass them for an object that no longer exists (after a delete)."""
    if _suppressed.get():  # inside suppressed(): a bulk path records its own summary
        return None
    row = event(action, obj, before=before, after=after, comment=comment or _because.get(), object_type=object_type,
                object_id=object_id, object_repr=object_repr)
    row.save(force_insert=True)
    return row

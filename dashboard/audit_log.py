"""What the audit list shows of its events: the object of each event and every id inside its
before/after snapshots as a name, linked to the object's page where there is one.

Snapshots store foreign keys as ids (`gpu_id: 4`, `profile_id: 17`, see `fleet.audit.snapshot`);
a reader wants "render-01 · 00000000:3B:00.0", not 4. `name_events` collects the ids of a page
of events by kind and looks each kind up once (one query per kind on the page, never per row).
An id whose row is gone stays a bare id, marked as gone.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from django.contrib.auth import get_user_model
from django.db.models import Model
from django.urls import reverse

from fleet.models import Artist, Gpu, GpuModel, Host, ResizeRequest, VgpuProfile, VirtualMachine
from hypervisors.models import Operation


@dataclass(frozen=True)
class Kind:
    """A kind of object an event or a snapshot field can name: its model, how its name reads,
    and its page (None: it has none)."""

    model: Callable[[], type[Model]]
    label: Callable[[Any], str]
    url: Callable[[int], str] | None = None
    select_related: tuple[str, ...] = ()


KINDS: dict[str, Kind] = {
    "host": Kind(lambda: Host, lambda host: host.name, lambda pk: reverse("fleet:host-detail", args=[pk])),
    "gpu": Kind(lambda: Gpu, lambda gpu: f"{gpu.host.name} · {gpu.pci_bus_id}",
                lambda pk: reverse("fleet:gpu-detail", args=[pk]), ("host",)),
    "vm": Kind(lambda: VirtualMachine, lambda vm: vm.name, lambda pk: reverse("fleet:vm-detail", args=[pk])),
    "artist": Kind(lambda: Artist, lambda artist: artist.name, lambda pk: reverse("fleet:artist-detail", args=[pk])),
    "resize_request": Kind(lambda: ResizeRequest,
                           lambda r: f"Request #{r.pk}: {r.vm.name} to {r.requested_vgpus} × "
                                     f"{r.requested_profile.name}" + (f", {r.size_change}" if r.changes_size else ""),
                           lambda pk: reverse("fleet:requests"), ("vm", "requested_profile")),
    "operation": Kind(lambda: Operation, lambda op: f"Operation #{op.pk}: {op.get_kind_display().lower()} {op.vm.name}",
                      lambda pk: reverse("hypervisors:operation-detail", args=[pk]), ("vm",)),
    "vgpu_profile": Kind(lambda: VgpuProfile, lambda profile: profile.name),
    "gpu_model": Kind(lambda: GpuModel, lambda model: model.name),
    "user": Kind(get_user_model, lambda user: user.username),
}

#: Snapshot field -> the kind of object its id names.
FIELD_KINDS = {
    "host_id": "host", "gpu_id": "gpu", "vm_id": "vm", "artist_id": "artist",
    "profile_id": "vgpu_profile", "current_profile_id": "vgpu_profile", "requested_profile_id": "vgpu_profile",
    "suggested_profile_id": "vgpu_profile", "gpu_model_id": "gpu_model",
    "user_id": "user", "requested_by_id": "user", "decided_by_id": "user", "applied_by_id": "user",
    "created_by_id": "user", "resize_request_id": "resize_request",
}


@dataclass(frozen=True)
class Named:
    """An id as a reader sees it: the object's name and its page, or the bare id when it is gone."""

    pk: int
    text: str
    url: str | None = None
    gone: bool = False


def _fields(snapshot) -> dict:
    """A snapshot as fields: `audit.snapshot` writes objects; anything else stored (a bare value
    written by a script or an older release) shows as one field rather than breaking the page."""
    if snapshot is None:
        return {}
    return snapshot if isinstance(snapshot, dict) else {"value": snapshot}


def _pk(value) -> int | None:
    """`value` as a row id, or None (ids are positive whole numbers; bools are not ids)."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value if value > 0 else None
    if isinstance(value, str) and value.isascii() and value.isdigit() and len(value) < 19:
        return int(value) or None
    return None


def diff(before, after) -> list[dict]:
    """One row per field: its old and new value and whether it changed."""
    before, after = _fields(before), _fields(after)
    return [{"field": name, "before": before.get(name, ""), "after": after.get(name, ""),
             "changed": before.get(name) != after.get(name)}
            for name in sorted(set(before) | set(after))]


def lookup(wanted: dict[str, set[int]]) -> dict[str, dict[int, Named]]:
    """{kind: {id: Named}} of the ids wanted, one query per kind; an id not found is gone."""
    found: dict[str, dict[int, Named]] = {}
    for kind_name, ids in wanted.items():
        kind = KINDS[kind_name]
        rows = kind.model().objects.select_related(*kind.select_related).filter(pk__in=ids)
        found[kind_name] = {row.pk: Named(row.pk, kind.label(row), kind.url(row.pk) if kind.url else None)
                            for row in rows}
        for pk in ids - found[kind_name].keys():
            found[kind_name][pk] = Named(pk, f"#{pk}", gone=True)
    return found


def name_events(events: Iterable) -> None:
    """Give each event `diff` (rows with `before_named` / `after_named` where the field names an
    object) and `object_named` (its object, linked while it exists and the event is no delete)."""
    events = list(events)
    wanted: dict[str, set[int]] = defaultdict(set)
    for event in events:
        event.diff = diff(event.before, event.after)
        pk = _pk(event.object_id)
        if event.object_type in KINDS and pk is not None:
            wanted[event.object_type].add(pk)
        for row in event.diff:
            kind = FIELD_KINDS.get(row["field"])
            for side in ("before", "after"):
                side_pk = _pk(row[side]) if kind else None
                if side_pk is not None:
                    wanted[kind].add(side_pk)
    found = lookup(wanted)
    for event in events:
        pk = _pk(event.object_id)
        named = found.get(event.object_type, {}).get(pk) if pk is not None else None
        event.object_named = None if named is None or named.gone or event.action.endswith(".delete") else named
        for row in event.diff:
            kind = FIELD_KINDS.get(row["field"])
            row["label"] = row["field"].removesuffix("_id") if kind else row["field"]
            for side in ("before", "after"):
                side_pk = _pk(row[side]) if kind else None
                row[f"{side}_named"] = found[kind].get(side_pk) if side_pk is not None else None

"""The one order in which writers lock rows, so that two writers never deadlock.

A transaction that changes the fleet takes row locks in this order, and only in this order:

1. hosts,
2. GPUs,
3. virtual machines,
4. vGPUs,
5. resize requests,
6. then the rows that hang off these and lock nothing after themselves (a right-sizing
   suggestion, a scheduler policy, an optimizer run) and rows outside the fleet (agents,
   drift, presets, beat entries), in the order the caller names them,

each group in ascending primary key. Two writers that keep to it may queue behind each
other but never wait for each other in a circle. PostgreSQL breaks such a circle after a
second by aborting one of the two transactions ("deadlock detected", an OperationalError),
which reached the user as a 503 "cannot reach its database". On SQLite nothing here locks:
IMMEDIATE transactions (config/settings.py) take the database's write lock at BEGIN, so
writers run one at a time and cannot deadlock.

How a writer keeps to it:

- Everything it may write is locked in one `lock_for_change` call, before the first write.
  A service called inside that transaction (a resize approval calls `remove_vgpu` and
  `place_vgpu` several times) locks its rows again: rows already held cost one query and
  never wait, so the outer call must hold every row the inner ones lock (an approval locks
  every GPU of the requested model and its host up front, not the next candidate host after
  the VM).
- It reads first, without locks, to learn what to lock (the VM's host, the GPUs its vGPUs
  are on); once the locks are held it reads again, and what differs changed while it waited:
  `FleetConflict`, which the API answers with 409 and the pages show on the form, naming
  what changed. A row that was deleted meanwhile is such a conflict (`lock_for_change`
  raises it).
- Plain UPDATE and DELETE statements lock their rows too: a writer updates or deletes only
  rows it locked here first, or rows of a later group than everything it locked.
- Locks are FOR NO KEY UPDATE: they exclude each other and deletion, but not the FOR KEY
  SHARE lock PostgreSQL's foreign-key check takes on a row when a row referring to it is
  inserted (a telemetry sample of a GPU, a vGPU of a VM), so ingest never queues behind a
  placement and cannot close a circle with one.

A deadlock that still happens (a writer outside this code, a manual SQL session) is answered
409 "try again", not 503, by `config.db_outage`: see docs/concurrency.md.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

from django.db.models import Model, QuerySet

from config.errors import ConflictRefusal
from fleet.models import Gpu, Host, ResizeRequest, Vgpu, VirtualMachine
from fleet.placement import PlacementError, Rule, Violation


class FleetConflict(PlacementError, ConflictRefusal):
    """The fleet changed between the check and the write; trying again may give another answer."""


def conflict(message: str, rule: str = Rule.FLEET_CHANGED) -> FleetConflict:
    """A FleetConflict of one violation: what changed while the writer waited, in a sentence."""
    return FleetConflict([Violation(rule, message)])


#: The fleet's groups in lock order: keyword of `lock_for_change`, model, the rows it reads along
#: (joined, not locked: locking a GpuModel row would queue every placement on GPUs of that model),
#: and what a message calls one row.
ORDER: tuple[tuple[str, type[Model], tuple[str, ...], str], ...] = (
    ("hosts", Host, (), "Host"),
    ("gpus", Gpu, ("gpu_model",), "GPU"),
    ("vms", VirtualMachine, ("artist",), "VM"),
    ("vgpus", Vgpu, ("profile", "gpu", "vm"), "vGPU"),
    ("requests", ResizeRequest, ("vm", "requested_profile"), "Resize request"),
)

Rows = Iterable[Model | int | None] | QuerySet


@dataclass
class Locked:
    """The rows `lock_for_change` holds, by group and id, and the rows of each `then` queryset."""

    hosts: dict[int, Host] = field(default_factory=dict)
    gpus: dict[int, Gpu] = field(default_factory=dict)
    vms: dict[int, VirtualMachine] = field(default_factory=dict)
    vgpus: dict[int, Vgpu] = field(default_factory=dict)
    requests: dict[int, ResizeRequest] = field(default_factory=dict)
    then: list[list[Model]] = field(default_factory=list)


def lock_rows(queryset: QuerySet) -> list[Model]:
    """The rows of `queryset`, locked in ascending id until the transaction ends; joined rows
    (select_related) are read, not locked. For rows outside the fleet's groups: lock them alone,
    or through `lock_for_change(then=...)` after the fleet's rows."""
    return list(queryset.select_for_update(of=("self",), no_key=True).order_by("pk"))


def lock_for_change(*, hosts: Rows = (), gpus: Rows = (), vms: Rows = (), vgpus: Rows = (), requests: Rows = (),
                    then: Iterable[QuerySet] = ()) -> Locked:
    """Lock the given rows in the order of this module's docstring, then the rows of each `then`
    queryset, and return them all.

    Each group is given as model instances or ids (None is left out), or as a queryset of the
    group's model, whose rows are locked whatever they are by then (e.g. "the vGPUs of this VM",
    after the VM's lock has made that set stable).

    Raises FleetConflict naming a row given by instance or id that no longer exists: it was
    deleted after the caller read it, possibly while this call waited for its lock.
    """
    wanted = {"hosts": hosts, "gpus": gpus, "vms": vms, "vgpus": vgpus, "requests": requests}
    locked = Locked()
    for name, model, related, noun in ORDER:
        if isinstance(wanted[name], QuerySet):
            setattr(locked, name, {row.pk: row for row in lock_rows(wanted[name].select_related(*related))})
            continue
        labels = _labels(wanted[name])
        if not labels:
            continue
        rows = {row.pk: row for row in lock_rows(model.objects.filter(pk__in=labels).select_related(*related))}
        gone = [labels[pk] for pk in sorted(labels) if pk not in rows]
        if gone:
            raise conflict(f"{noun} {', '.join(gone)} was deleted meanwhile; reload and try again.")
        setattr(locked, name, rows)
    locked.then = [lock_rows(queryset) for queryset in then]
    return locked


def noun(model: type[Model]) -> str:
    """What a message calls a row of `model` ("GPU", "VM"; its verbose name outside the groups)."""
    return next((label for _, each, _, label in ORDER if each is model), str(model._meta.verbose_name))


def _labels(rows: Rows) -> dict[int, str]:
    """{id: how a message names the row}: its name where an instance was given, else "#id"."""
    labels: dict[int, str] = {}
    for row in rows:
        if row is None:
            continue
        if isinstance(row, Model):
            labels[row.pk] = _name(row)
        else:
            labels.setdefault(int(row), f"#{int(row)}")
    return labels


def _name(row: Model) -> str:
    if isinstance(row, Gpu):
        return row.label
    if isinstance(row, Vgpu | ResizeRequest):
        return f"#{row.pk}"
    return str(row)

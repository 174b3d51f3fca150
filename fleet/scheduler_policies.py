"""Scheduler policies of the fleet: what each GPU should run, staging, drift, and applying.

The rules (validation, RmPVMRL, the commands, drift) are pure and live in `fleet.scheduler`;
this module reads and writes `SchedulerPolicy` rows around them:

- a GPU's effective desired policy is its own row, else its host's default, else its GPU
  model's default, else the driver's default (best effort);
- a change to a GPU that holds vGPUs is kept but `staged` (the driver changes the scheduler only
  on an empty GPU); `release_staged` turns staged rows back into `desired` once their GPU is
  empty, and into `applied` once the agent reports them in force (e.g. after a driver reload
  with the RmPVMRL key). It runs on the read paths (the scheduler page and API), not from a
  hook where vGPUs are removed, because that code belongs to the placement services;
- applying through the host's agent lives with the agents, in `telemetry.scheduler_apply`.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from django.db import transaction
from django.db.models import Count, Min
from django.utils import timezone

from fleet import audit, locks, scheduler
from fleet.choices import AuditSource, GpuMode, SchedulerApplyState, SchedulerScope
from fleet.models import Gpu, GpuModel, Host, SchedulerPolicy, Vgpu
from fleet.scheduler import FieldError, SchedulerSettings

SOURCE_LABELS = {
    SchedulerScope.GPU: "this GPU",
    SchedulerScope.HOST: "host default",
    SchedulerScope.GPU_MODEL: "GPU model default",
    "driver": "driver default",
}
SETTING_FIELDS = ("policy", "arr", "frequency_hz", "avg_factor", "timeslice_ms")


class SchedulerValidationError(Exception):
    """Settings that break a rule; `errors` maps each field to its messages (the API's 400 body)."""

    def __init__(self, errors: list[FieldError]):
        self.errors: dict[str, list[str]] = {}
        for error in errors:
            self.errors.setdefault(error.field, []).append(error.message)
        super().__init__("; ".join(e.message for e in errors))


def settings_of(row: SchedulerPolicy | None) -> SchedulerSettings:
    """A row's settings; the driver's default (best effort) for no row."""
    if row is None:
        return SchedulerSettings()
    return SchedulerSettings(policy=row.policy, arr=row.arr, frequency_hz=row.frequency_hz,
                             avg_factor=row.avg_factor, timeslice_ms=row.timeslice_ms)


@dataclass
class GpuScheduler:
    """Everything the page and the API show about one GPU's scheduler."""

    gpu: Gpu
    desired: SchedulerSettings
    source: str
    row: SchedulerPolicy | None
    vgpu_count: int
    max_count: int | None
    reported: dict | None
    drift: list[str] = field(default_factory=list)
    apply_state: str = SchedulerApplyState.DESIRED
    apply_detail: str = ""

    @property
    def source_label(self) -> str:
        return SOURCE_LABELS[self.source]

    @property
    def shown(self) -> SchedulerSettings:
        """The desired settings with the driver's defaults filled in, for reading."""
        return scheduler.with_defaults(self.desired, self.max_count)

    @property
    def commands(self) -> scheduler.Commands:
        return scheduler.commands(self.desired, self.gpu.pci_bus_id, self.gpu.host.hypervisor,
                                  pci_bus_id=self.gpu.pci_bus_id)

    @property
    def has_drift(self) -> bool:
        return bool(self.drift)


def _defaults_by(scope: str) -> dict[int, SchedulerPolicy]:
    key = "host_id" if scope == SchedulerScope.HOST else "gpu_model_id"
    return {getattr(row, key): row for row in SchedulerPolicy.objects.filter(scope=scope)}


def gpu_schedulers(gpus) -> list[GpuScheduler]:
    """The scheduler view of each GPU in `gpus` in three queries whatever their number: own rows,
    host and model defaults, and per-GPU vGPU counts with the resident type's max count."""
    gpus = list(gpus)
    ids = [g.pk for g in gpus]
    own = {row.gpu_id: row for row in SchedulerPolicy.objects.filter(scope=SchedulerScope.GPU, gpu_id__in=ids)}
    host_defaults = _defaults_by(SchedulerScope.HOST)
    model_defaults = _defaults_by(SchedulerScope.GPU_MODEL)
    counts = {
        row["gpu_id"]: row
        for row in Vgpu.objects.filter(gpu_id__in=ids).values("gpu_id").annotate(
            n=Count("id"), max_count=Min("profile__max_per_gpu"))
    }
    result = []
    for gpu in gpus:
        row, source = own.get(gpu.pk), SchedulerScope.GPU
        if row is None:
            row, source = host_defaults.get(gpu.host_id), SchedulerScope.HOST
        if row is None:
            row, source = model_defaults.get(gpu.gpu_model_id), SchedulerScope.GPU_MODEL
        if row is None:
            source = "driver"
        usage = counts.get(gpu.pk, {"n": 0, "max_count": None})
        desired = settings_of(row)
        item = GpuScheduler(gpu=gpu, desired=desired, source=source, row=row, vgpu_count=usage["n"],
                            max_count=usage["max_count"], reported=gpu.scheduler_reported,
                            drift=scheduler.drift(desired, gpu.scheduler_reported))
        if source == SchedulerScope.GPU:
            item.apply_state, item.apply_detail = row.apply_state, row.apply_detail
        elif item.drift and item.vgpu_count:
            # An inherited default has no per-GPU row to stage; say why it is not in force yet.
            item.apply_state = SchedulerApplyState.STAGED
            item.apply_detail = scheduler.staging_reason(item.vgpu_count)
        result.append(item)
    return result


def gpu_scheduler(gpu: Gpu) -> GpuScheduler:
    return gpu_schedulers([gpu])[0]


def vgpu_mode_gpus():
    return Gpu.objects.filter(mode=GpuMode.VGPU).select_related("host", "gpu_model")


def _validated(values: SchedulerSettings, size_mode: str) -> SchedulerSettings:
    errors = scheduler.validate(values, size_mode)
    if errors:
        raise SchedulerValidationError(errors)
    return values


def _write(row: SchedulerPolicy, values: SchedulerSettings, user, state: str, detail: str) -> SchedulerPolicy:
    before = audit.snapshot(row) if row.pk else None
    for name in SETTING_FIELDS:
        setattr(row, name, getattr(values, name))
    row.apply_state, row.apply_detail = state, detail
    if user is not None and getattr(user, "is_authenticated", False):
        row.updated_by = user
    row.save()
    audit.record("scheduler_policy.update", row, before=before, after=audit.snapshot(row))
    return row


def set_gpu_policy(gpu: Gpu, values: SchedulerSettings, user=None) -> SchedulerPolicy:
    """Make `values` the GPU's own desired policy (validated against its size mode).

    Staged with the reason when the GPU holds vGPUs (the driver refuses a change then); the GPU
    row is locked so a placement cannot slip in between the count and the write.
    """
    with transaction.atomic():
        locked = locks.lock_for_change(gpus=[gpu]).gpus[gpu.pk]
        if locked.mode != GpuMode.VGPU:
            raise SchedulerValidationError([FieldError("policy", "The GPU is in passthrough mode; only a GPU in "
                                                                 "vGPU mode has a vGPU scheduler.")])
        _validated(values, locked.size_mode)
        reason = scheduler.staging_reason(Vgpu.objects.filter(gpu=locked).count())
        row = SchedulerPolicy.objects.filter(gpu=locked).first() or SchedulerPolicy(scope=SchedulerScope.GPU,
                                                                                   gpu=locked)
        state = SchedulerApplyState.STAGED if reason else SchedulerApplyState.DESIRED
        return _write(row, values, user, state, reason)


def set_default(target: Host | GpuModel, values: SchedulerSettings, user=None) -> SchedulerPolicy:
    """Make `values` the default of a host or a GPU model, for its GPUs without their own policy.

    Fixed share is refused when a GPU it would govern runs in mixed-size mode.
    """
    scope = SchedulerScope.HOST if isinstance(target, Host) else SchedulerScope.GPU_MODEL
    governed = Gpu.objects.filter(mode=GpuMode.VGPU, scheduler_policy__isnull=True,
                                  **{"host" if scope == SchedulerScope.HOST else "gpu_model": target})
    size_mode = "mixed" if governed.filter(size_mode="mixed").exists() else "equal"
    _validated(values, size_mode)
    with transaction.atomic():
        lookup = {"host": target} if scope == SchedulerScope.HOST else {"gpu_model": target}
        row = next(iter(locks.lock_rows(SchedulerPolicy.objects.filter(**lookup))), None) or SchedulerPolicy(
            scope=scope, **lookup)
        return _write(row, values, user, SchedulerApplyState.DESIRED, "")


def clear_policy(row: SchedulerPolicy) -> None:
    """Delete a GPU's own policy or a default, so the next level applies again."""
    with transaction.atomic():
        before = audit.snapshot(row)
        audit.record("scheduler_policy.delete", row, before=before, after=None)
        row.delete()


def release_staged() -> int:
    """Move staged GPU rows on: `applied` where the agent reports them in force, `desired` where the
    GPU is empty now (ready to apply). Returns how many rows changed; each gets an audit event
    from the system. Cheap when nothing is staged (one query)."""
    changed = 0
    staged = list(SchedulerPolicy.objects.filter(scope=SchedulerScope.GPU, apply_state=SchedulerApplyState.STAGED)
                  .select_related("gpu"))
    if not staged:
        return 0
    busy = set(Vgpu.objects.filter(gpu_id__in=[r.gpu_id for r in staged]).values_list("gpu_id", flat=True))
    with audit.acting_as(None, AuditSource.SYSTEM, "scheduler"), transaction.atomic():
        for row in staged:
            reported = row.gpu.scheduler_reported
            if reported and not scheduler.drift(settings_of(row), reported):
                state, detail = SchedulerApplyState.APPLIED, "the agent reports this policy in force"
            elif row.gpu_id not in busy:
                state, detail = SchedulerApplyState.DESIRED, "the GPU is empty now; ready to apply"
            else:
                continue
            before = audit.snapshot(row)
            updated = SchedulerPolicy.objects.filter(pk=row.pk, apply_state=SchedulerApplyState.STAGED).update(
                apply_state=state, apply_detail=detail,
                applied_at=timezone.now() if state == SchedulerApplyState.APPLIED else row.applied_at)
            if updated:
                row.refresh_from_db()
                audit.record("scheduler_policy.update", row, before=before, after=audit.snapshot(row),
                             comment=detail)
                changed += 1
    return changed

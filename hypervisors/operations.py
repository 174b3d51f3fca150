"""Operations: an approved change carried out on the hypervisor, step by step.

Approving a resize request for a VM on a linked host (`Host.hypervisor_uri`) reserves the change
in the inventory, as any approval does, and creates an Operation here (`on_change_approved`,
a receiver of `fleet.signals.change_approved`, in the approval's own transaction). The operation
then makes the hypervisor match: notify the artist, shut the VM down, remove its old vGPU
devices, move it when its new GPUs are on another host, create the new ones on the GPUs
placement chose, redefine the VM, start it, verify. An optimizer plan's moves come the same
way (`create_for_placement`, without a request), one operation per VM.

Safety, in the order it matters:
- One operation per VM and per GPU at a time: `OperationClaim`'s partial unique constraints
  refuse a second, so an approval touching a busy GPU is refused whole.
- Every step is idempotent and judged by the state it finds (a VM already off is not shut down
  again; a device created with the UUID the step chose beforehand is found, not made twice), so
  a run killed at any point is resumed by the next (`resume_due`, from the beat schedule) and
  ends where an uninterrupted run would.
- A failure undoes everything by state, not by bookkeeping: the hypervisor is put back as
  `Operation.before` describes it (old devices, saved definition, host, power state) and then
  the inventory (`fleet.requests.revert_approval`); the request is marked failed with the
  reason. An unreachable hypervisor is not a failure: the run stops, says so, and is taken again
  every HYPERVISOR_RETRY_S until the hypervisor answers (neither going on nor undoing can work
  without it).
- Every step leaves an AuditEvent.
"""

from __future__ import annotations

import logging
import time
import uuid as uuidlib
from dataclasses import dataclass
from datetime import timedelta

from celery import current_app
from django.conf import settings
from django.db import IntegrityError, transaction
from django.db.models import Q
from django.utils import timezone

from fleet import audit, locks
from fleet import requests as fleet_requests
from fleet.hypervisor_link import is_simulated
from fleet.models import Gpu, Host, ResizeRequest, Vgpu, VirtualMachine
from fleet.pci import canonical_pci_bus_id
from fleet.placement import Rule
from fleet.services import FleetConflict
from hypervisors import matching
from hypervisors.agent_devices import AgentDeviceManager, device_agent
from hypervisors.backends import open_backend
from hypervisors.backends.base import (
    Backend,
    DeviceKind,
    DomainNotFound,
    DomainSpec,
    HypervisorError,
    PowerState,
    ShutdownTimeout,
    Unreachable,
    VgpuDevice,
)
from hypervisors.choices import OperationKind, OperationStatus, StepKind, StepStatus
from hypervisors.models import ACTIVE, Operation, OperationClaim, OperationStep
from telemetry.models import VgpuSample

log = logging.getLogger(__name__)

#: The Celery task that runs an operation (hypervisors.tasks.run_operation).
RUN_OPERATION_TASK = "hypervisors.tasks.run_operation"
#: How long one call to the hypervisor's shutdown waits, at most, before the run says it is alive again.
SHUTDOWN_SLICE_S = 10.0


# Creating an operation -------------------------------------------------------------------------


def linked(host: Host | None) -> bool:
    return bool(host and host.hypervisor_uri)


def on_change_approved(sender, request: ResizeRequest, before: list[dict], placed: list[Vgpu], actor=None,
                       run_now: bool = False, size_before: dict | None = None, vgpus_kept: bool = False,
                       **kwargs) -> str | None:
    """Receiver of `fleet.signals.change_approved`: an Operation for a VM whose host is linked,
    and what the artist is told about it; None (nothing to carry out) when neither host is."""
    operation = create_for_placement(request.vm_id, before, placed, request=request, actor=actor, run_now=run_now,
                                     not_before=request.wished_from, not_after=request.wished_until,
                                     size_before=size_before, vgpus_kept=vgpus_kept)
    if operation is None:
        return None
    vm = operation.vm
    if run_now:
        return f"the change is being applied now (operation #{operation.pk}); {vm.name} is shut down for it."
    if operation.not_before:
        return (f"the change will be applied in the window you asked for, from "
                f"{timezone.localtime(operation.not_before):%Y-%m-%d %H:%M} (operation #{operation.pk}).")
    return f"the change will be applied when an admin runs operation #{operation.pk}."


def create_for_placement(vm_id: int, before: list[dict], placed: list[Vgpu], *, request: ResizeRequest | None = None,
                         actor=None, run_now: bool = False, not_before=None, not_after=None,
                         kind: str = OperationKind.RESIZE, origin: str = "", batch: str = "",
                         batch_index: int = 0, size_before: dict | None = None,
                         vgpus_kept: bool = False) -> Operation | None:
    """The operation that makes the hypervisor follow a change the inventory already shows: the
    VM's vGPUs were `before` (rows of `fleet.requests.vgpu_rows`) and are now `placed`, its vCPUs
    and RAM were `size_before` ({"vcpus", "ram_gib"}; None: unchanged) and are now the VM's;
    `vgpus_kept`: the vGPUs were left as they were (a change of size alone). None when neither
    the VM's old host nor its new one is linked (the inventory is all there is).

    Without a request (an optimizer plan's move), a rollback puts the inventory back from
    `before` itself. `batch` names operations that carry out one plan: they run one at a time in
    `batch_index` order, share their GPUs' claims until the last of them ends, and when one
    fails, it and the ones after it are rolled back (an earlier one may have made the room a
    later one needs). FleetConflict when the VM would move between a linked and an unlinked
    host, or when it or one of the GPUs is in another active operation."""
    gpus = Gpu.objects.select_related("host").in_bulk([row["gpu_id"] for row in before] +
                                                      [vgpu.gpu_id for vgpu in placed])
    vm = VirtualMachine.objects.select_related("host").get(pk=vm_id)
    target = gpus[placed[0].gpu_id].host if placed else vm.host
    source = gpus[before[0]["gpu_id"]].host if before else (vm.host or target)
    target = target or source
    if not linked(source) and not linked(target):
        return None
    for host in (source, target):
        if not linked(host):
            raise locks.conflict(f"{vm.name} would move between {source.name} and {target.name}, but {host.name} "
                                 "has no hypervisor link: link it, or approve a change that stays on one host.",
                                 Rule.VM_HOST)
    return create(vm, source, target, before=before, placed=placed, gpus=gpus, request=request, actor=actor,
                  not_before=not_before, not_after=not_after, run_now=run_now, kind=kind, origin=origin,
                  batch=batch, batch_index=batch_index, size_before=size_before, vgpus_kept=vgpus_kept)


def create(vm: VirtualMachine, source: Host, target: Host, *, before: list[dict], placed: list[Vgpu], gpus: dict,
           request: ResizeRequest | None = None, actor=None, not_before=None, not_after=None,
           run_now: bool = False, kind: str = OperationKind.RESIZE, origin: str = "", batch: str = "",
           batch_index: int = 0, size_before: dict | None = None, vgpus_kept: bool = False) -> Operation:
    """An operation with its steps and claims, inside the caller's transaction; FleetConflict
    when the VM or one of the GPUs is in another active operation (see `create_for_placement`
    for `batch`, `size_before` and `vgpus_kept`).

    A change of vCPUs and RAM alone keeps the VM's vGPU devices: it shuts the VM down, redefines
    it with its devices and the new size, and starts it (`after["keeps_vgpus"]`)."""
    size = size_before or {"vcpus": vm.vcpus, "ram_gib": vm.ram_gib}
    vgpus_before = [{**row, "gpu_bus_id": gpus[row["gpu_id"]].pci_bus_id} for row in before]
    vgpus_after = [{"vgpu_id": vgpu.pk, "gpu_id": vgpu.gpu_id, "gpu_bus_id": vgpu.gpu.pci_bus_id,
                    "profile": vgpu.profile.name} for vgpu in placed]
    operation = Operation.objects.create(
        kind=kind, vm=vm, host=source, target_host=target, request=request,
        origin=origin or (f"resize request #{request.pk}" if request else ""),
        before={"vcpus": size["vcpus"], "ram_mib": size["ram_gib"] * 1024, "vgpus": vgpus_before},
        after={"vcpus": vm.vcpus, "ram_mib": vm.ram_gib * 1024, "vgpus": vgpus_after,
               **({"keeps_vgpus": True} if vgpus_kept else {}),
               **({"batch": batch, "batch_index": batch_index} if batch else {})},
        not_before=not_before, not_after=not_after, run_now=run_now, created_by=actor,
    )
    # A move goes cold and before the new vGPUs: they are made on the target host, and the
    # domain is redefined there, where its devices exist.
    if vgpus_kept:
        kinds = [StepKind.NOTIFY, StepKind.SHUTDOWN, StepKind.REDEFINE, StepKind.START, StepKind.VERIFY]
    else:
        kinds = [StepKind.NOTIFY, StepKind.SHUTDOWN, StepKind.REMOVE_VGPU]
        kinds += [StepKind.MOVE_DOMAIN] if target.pk != source.pk else []
        kinds += [StepKind.CREATE_VGPU] * len(vgpus_after)
        kinds += [StepKind.REDEFINE, StepKind.START, StepKind.VERIFY]
    created = iter(vgpus_after)
    steps = []
    for index, step_kind in enumerate(kinds):
        args = {}
        if step_kind == StepKind.CREATE_VGPU:
            # The id is chosen now, so a retried step finds the device it made (mdev layout).
            args = {**next(created), "device_id": str(uuidlib.uuid4())}
        steps.append(OperationStep(operation=operation, index=index, kind=step_kind, args=args))
    OperationStep.objects.bulk_create(steps)
    # A change of size alone leaves the GPUs as they are: the VM's claim is all it needs.
    gpu_ids = set() if vgpus_kept else {row["gpu_id"] for row in vgpus_before} | {row["gpu_id"] for row in vgpus_after}
    if batch:
        # The batch holds a GPU once, under the first of its operations that touches it.
        gpu_ids -= set(OperationClaim.objects.filter(active=True, gpu__isnull=False, operation__after__batch=batch)
                       .values_list("gpu_id", flat=True))
    _claim(operation, vm, gpu_ids, gpus)
    audit.record("operation.create", operation, after=_summary(operation))
    if (run_now or _due(operation, timezone.now())) and not _waiting(operation):
        transaction.on_commit(lambda: enqueue(operation.pk))
    return operation


def _claim(operation: Operation, vm: VirtualMachine, gpu_ids: set[int], gpus: dict) -> None:
    claims = [OperationClaim(operation=operation, vm=vm)]
    claims += [OperationClaim(operation=operation, gpu_id=gpu_id) for gpu_id in sorted(gpu_ids)]
    try:
        with transaction.atomic():
            OperationClaim.objects.bulk_create(claims)
    except IntegrityError:
        busy = (OperationClaim.objects.filter(active=True).filter(Q(vm=vm) | Q(gpu_id__in=gpu_ids))
                .exclude(operation=operation).select_related("operation", "gpu").first())
        what = f"GPU {busy.gpu.label}" if busy and busy.gpu_id else vm.name
        number = f" #{busy.operation_id}" if busy else ""
        raise locks.conflict(f"{what} is being changed by operation{number}: try again once it has ended.",
                             Rule.PLACEMENT_SLOT) from None


def _summary(operation: Operation) -> dict:
    return {"status": operation.status, "kind": operation.kind, "vm": operation.vm_id,
            "host": operation.host_id, "target_host": operation.target_host_id, "origin": operation.origin}


# Running -----------------------------------------------------------------------------------------


def enqueue(operation_id: int) -> None:
    """Hand the operation to a worker (a broker outage leaves it for `resume_due` to pick up)."""
    try:
        # By name: hypervisors.tasks imports this module to carry the operation out.
        current_app.tasks[RUN_OPERATION_TASK].delay(operation_id)
    except Exception:  # noqa: BLE001 - the beat's resume_due enqueues it again
        log.warning("could not enqueue operation %s; the periodic resume will", operation_id, exc_info=True)


def _due(operation: Operation, now) -> bool:
    in_window = (operation.not_before is not None and operation.not_before <= now
                 and (operation.not_after is None or now < operation.not_after))
    return operation.run_now or in_window


def _runnable(now) -> Q:
    """Operations a worker may take now: pending ones asked to run now or inside their window
    (a window that closed unused waits for an admin), and running ones whose worker went silent."""
    in_window = Q(not_before__lte=now) & (Q(not_after__isnull=True) | Q(not_after__gt=now))
    lost = Q(heartbeat_at__lt=stale_before(now)) | Q(heartbeat_at__isnull=True)
    return (Q(status=OperationStatus.PENDING) & (Q(run_now=True) | in_window)
            | Q(status=OperationStatus.RUNNING) & lost)


def _waiting(operation: Operation) -> bool:
    """Whether an earlier operation of its batch is still pending or running (it runs after)."""
    batch = operation.after.get("batch")
    return bool(batch) and Operation.objects.filter(
        after__batch=batch, after__batch_index__lt=operation.after.get("batch_index", 0), status__in=ACTIVE,
    ).exclude(pk=operation.pk).exists()


def batch_of(operation: Operation) -> list[Operation]:
    """The operations carrying out one plan with `operation`, in the order they run (itself alone
    outside a batch)."""
    batch = operation.after.get("batch")
    if not batch:
        return [operation]
    return sorted(Operation.objects.filter(after__batch=batch), key=lambda op: op.after.get("batch_index", 0))


def stale_before(now):
    """A running operation whose heartbeat is older than this has lost its worker."""
    return now - timedelta(seconds=settings.HYPERVISOR_HEARTBEAT_STALE_S)


def run_now(operation: Operation, actor) -> Operation:
    """An admin's "run now": a pending operation runs at once, whatever its window."""
    with transaction.atomic():
        if not Operation.objects.filter(pk=operation.pk, status=OperationStatus.PENDING).update(run_now=True):
            operation.refresh_from_db(fields=["status"])
            raise locks.conflict(f"Operation #{operation.pk} is {operation.get_status_display().lower()} already.")
        operation.refresh_from_db()
        audit.record("operation.run_now", operation, after=_summary(operation))
        transaction.on_commit(lambda: enqueue(operation.pk))
    return operation


def cancel(operation: Operation, actor, reason: str = "") -> Operation:
    """An admin withdraws a pending operation before it touched the hypervisor: the inventory is
    put back as it was, the request marked failed with who cancelled it and why; in a plan's
    batch, the operations after it (which may need the room it was to make) are withdrawn too.
    FleetConflict once a worker has taken it (it then ends, or rolls back, on its own)."""
    why = f"Cancelled by {getattr(actor, 'username', None) or 'an admin'} before it started"
    why += f": {reason.strip()}" if reason.strip() else "."
    with transaction.atomic():
        # Taken from the workers first (a conditional update), so none starts it meanwhile.
        if not Operation.objects.filter(pk=operation.pk, status=OperationStatus.PENDING).update(
                status=OperationStatus.ROLLED_BACK, finished_at=timezone.now(), error=why):
            operation.refresh_from_db(fields=["status"])
            raise locks.conflict(f"Operation #{operation.pk} is {operation.get_status_display().lower()}: only a "
                                 "pending operation can be cancelled.")
        operation.refresh_from_db()
        later = [other for other in batch_of(operation) if other.after.get("batch_index", 0) >
                 operation.after.get("batch_index", 0) and other.status == OperationStatus.PENDING]
        for other in reversed(later):
            other.steps.update(status=StepStatus.SKIPPED)
            _end_rolled_back(other, f"Not run: operation #{operation.pk} of the same plan was cancelled.", [],
                             undone="")
        operation.steps.update(status=StepStatus.SKIPPED)
        _end_rolled_back(operation, why, [], undone="")
        audit.record("operation.cancel", operation, after=_summary(operation), comment=why)
    return operation


def resume_due(now=None) -> list[int]:
    """Operations a worker should run now: pending ones whose time came, running ones whose
    worker went silent (killed, or stopped on an unreachable hypervisor). Enqueues them."""
    now = now or timezone.now()
    due = Operation.objects.filter(_runnable(now))
    ids = [operation.pk for operation in due.only("pk", "after") if not _waiting(operation)]
    for pk in ids:
        enqueue(pk)
    return ids


def _take(operation_id: int, now) -> Operation | None:
    """Claim the run by a conditional update: None when another worker runs it (a fresh
    heartbeat), it ended, its time has not come, or an earlier operation of its batch is under way."""
    waiting = Operation.objects.filter(pk=operation_id).only("pk", "after").first()
    if waiting is None or _waiting(waiting):
        return None
    taken = Operation.objects.filter(pk=operation_id).filter(_runnable(now)).update(
        status=OperationStatus.RUNNING, heartbeat_at=now)
    if not taken:
        return None
    operation = Operation.objects.select_related("vm__artist__user", "host", "target_host", "request").get(
        pk=operation_id)
    if operation.started_at is None:
        operation.started_at = now
        operation.save(update_fields=["started_at"])
        audit.record("operation.run", operation, after=_summary(operation))
    return operation


@dataclass
class Run:
    """One worker's run of an operation: its links to the source and target hypervisors."""

    operation: Operation
    source: Backend
    target: Backend

    def beat(self) -> None:
        Operation.objects.filter(pk=self.operation.pk).update(heartbeat_at=timezone.now())

    @property
    def uuid(self) -> str:
        return str(self.operation.vm.uuid)

    def where(self) -> Backend:
        """The backend the domain is defined on now (after a move, the target)."""
        if self.operation.target_host_id == self.operation.host_id:
            return self.source
        try:
            self.target.domain(self.uuid)
            return self.target
        except DomainNotFound:
            return self.source

    def close(self) -> None:
        for backend in {id(self.source): self.source, id(self.target): self.target}.values():
            backend.close()


def backend_for(host: Host) -> Backend:
    """An open link to the host's hypervisor, with the host agent's device action where the
    hypervisor cannot create vGPUs itself."""
    return open_backend(host.hypervisor_uri, secret_ref=host.hypervisor_secret_ref, devices=device_manager_for(host))


def device_manager_for(host: Host) -> AgentDeviceManager | None:
    """The host agent's vGPU device action, for a host whose hypervisor cannot create vGPUs
    itself (libvirt uses its node-device API first where it can); None for a simulated host,
    or one without an enabled agent (creating a vGPU then says what to configure)."""
    if is_simulated(host.hypervisor_uri) or device_agent(host) is None:
        return None
    return AgentDeviceManager.for_host(host)


def run(operation_id: int, now=None) -> Operation | None:
    """Run (or resume) one operation to its end: succeeded, or rolled back (failed when even the
    rollback could not finish). An unreachable hypervisor leaves it running for `resume_due`."""
    operation = _take(operation_id, now or timezone.now())
    if operation is None:
        return None
    try:
        current = Run(operation, backend_for(operation.host), backend_for(operation.target_host))
    except HypervisorError as exc:
        return _interrupted(operation, None, exc)
    step = None
    try:
        for step in operation.steps.exclude(status__in=(StepStatus.DONE, StepStatus.SKIPPED)).order_by("index"):
            _do(current, step)
        _succeed(current)
    except Unreachable as exc:
        return _interrupted(operation, step, exc)
    except HypervisorError as exc:
        _fail_step(step, str(exc))
        _roll_back(current, f"{step.get_kind_display() if step else 'The operation'} failed: {exc}")
    except Exception as exc:
        log.exception("operation %s failed", operation.pk)
        _fail_step(step, f"Unexpected error: {exc}")
        _roll_back(current, f"{step.get_kind_display() if step else 'The operation'} failed unexpectedly: {exc}")
    finally:
        current.close()
    return Operation.objects.get(pk=operation.pk)


def _interrupted(operation: Operation, step: OperationStep | None, exc: Exception) -> Operation:
    """The hypervisor went away mid-run: keep the operation running, with the reason shown, for
    `resume_due` to take again after HYPERVISOR_RETRY_S. Neither going on nor rolling back can
    work without the hypervisor, and a half-done change must not be left: it waits for it."""
    now = timezone.now()
    message = (f"The hypervisor is unreachable ({exc}); the operation goes on when it answers "
               f"(next try in {settings.HYPERVISOR_RETRY_S:g} s).")
    if step is not None:
        OperationStep.objects.filter(pk=step.pk).update(error=str(exc)[:4000])
    # A heartbeat that turns stale after the retry interval hands it to the next resume_due.
    heartbeat = stale_before(now) + timedelta(seconds=settings.HYPERVISOR_RETRY_S)
    Operation.objects.filter(pk=operation.pk).update(error=message, heartbeat_at=min(heartbeat, now))
    audit.record("operation.interrupted", operation, comment=message)
    return Operation.objects.get(pk=operation.pk)


def _fail_step(step: OperationStep | None, message: str) -> None:
    if step is not None:
        step.status, step.error, step.finished_at = StepStatus.FAILED, message[:4000], timezone.now()
        step.save(update_fields=["status", "error", "finished_at"])
        audit.record("operation.step_failed", step.operation, comment=f"{step}: {message}")


def _do(current: Run, step: OperationStep) -> None:
    step.status, step.started_at = StepStatus.RUNNING, step.started_at or timezone.now()
    step.save(update_fields=["status", "started_at"])
    current.beat()
    result, skipped = STEPS[step.kind](current, step)
    step.status = StepStatus.SKIPPED if skipped else StepStatus.DONE
    step.result, step.finished_at, step.error = result, timezone.now(), ""
    step.save(update_fields=["status", "result", "finished_at", "error"])
    audit.record(f"operation.{step.kind}", current.operation, after={"step": step.index, **result},
                 comment=f"{step}: {step.get_status_display().lower()}")
    current.beat()


# The steps: each returns (result, skipped) and is safe to run again --------------------------------


def _notify(current: Run, step: OperationStep):
    op = current.operation
    fleet_requests.notify_artist(op.vm, f"{op.vm.name} is being shut down now to apply {op.origin or 'a change'}; "
                                        "it starts again when the change is made.")
    return {}, False


def shutdown_slice_s() -> float:
    """How long one call to the hypervisor's shutdown may wait before the run beats again: well
    within HYPERVISOR_HEARTBEAT_STALE_S, or `resume_due` would take the running operation for a
    lost one and hand it to a second worker while the first still waits for the guest."""
    return max(0.5, min(SHUTDOWN_SLICE_S, settings.HYPERVISOR_HEARTBEAT_STALE_S / 3))


def _shutdown(current: Run, step: OperationStep):
    op = current.operation
    backend = current.where()
    domain = backend.domain(current.uuid)
    result = dict(step.result)
    if "was_running" not in result:
        # What rollback puts back: the definition and power state as found the first time.
        result = {"was_running": domain.state == PowerState.RUNNING, "definition": backend.definition(current.uuid),
                  "devices": [_device_dict(d) for d in domain.vgpus]}
        OperationStep.objects.filter(pk=step.pk).update(result=result)
        Operation.objects.filter(pk=op.pk).update(before={**op.before, "definition": result["definition"],
                                                          "devices": result["devices"],
                                                          "was_running": result["was_running"]})
        op.refresh_from_db(fields=["before"])
    if domain.state == PowerState.SHUT_OFF:
        return result, not result["was_running"]
    deadline = timezone.now() + timedelta(seconds=settings.HYPERVISOR_SHUTDOWN_TIMEOUT_S)
    slice_s = shutdown_slice_s()
    while True:
        remaining = (deadline - timezone.now()).total_seconds()
        try:
            backend.shutdown(current.uuid, timeout_s=max(0.0, min(slice_s, remaining)))
            return result, False
        except ShutdownTimeout:
            current.beat()
            if remaining <= slice_s:
                raise ShutdownTimeout(
                    f"{op.vm.name} did not power off within {settings.HYPERVISOR_SHUTDOWN_TIMEOUT_S:g} s; it was left "
                    "running and nothing was changed. Ask the artist to save and shut down, then run it again.",
                ) from None


def _remove_vgpus(current: Run, step: OperationStep):
    backend = current.where()
    devices = [_device(d) for d in current.operation.before.get("devices", [])]
    backend.redefine(current.uuid, _spec(current, backend, ()))  # the definition lets go of them first
    for device in devices:
        backend.remove_vgpu(device)
    return {"removed": [_device_dict(d) for d in devices]}, not devices


def _create_vgpu(current: Run, step: OperationStep):
    backend = current.target
    args = step.args
    gpu_bus_id = canonical_pci_bus_id(args["gpu_bus_id"])
    existing = _find(backend, args["device_id"])
    if existing is not None:
        return {"device": _device_dict(existing)}, False
    type_name = matching.host_type_name(args["profile"], sorted({t.name for t in backend.vgpu_types()
                                                               if t.gpu_bus_id == gpu_bus_id}))
    if type_name is None:
        raise HypervisorError(f"GPU {gpu_bus_id} of {current.operation.target_host.name} offers no vGPU type "
                              f"{args['profile']} now (the host's driver names none like it).")
    device = backend.create_vgpu(gpu_bus_id, type_name, device_id=args["device_id"])
    return {"device": _device_dict(device)}, False


def _created(current: Run) -> list[VgpuDevice]:
    steps = current.operation.steps.filter(kind=StepKind.CREATE_VGPU).order_by("index")
    return [_device(step.result["device"]) for step in steps if step.result.get("device")]


def _wanted(current: Run) -> list[VgpuDevice]:
    """The devices the VM is to hold: those the operation created, or, for a change of vCPUs and
    RAM alone, those it held when it was shut down."""
    if current.operation.after.get("keeps_vgpus"):
        return [_device(d) for d in current.operation.before.get("devices", [])]
    return _created(current)


def _redefine(current: Run, step: OperationStep):
    backend = current.where()
    created = _wanted(current)
    backend.redefine(current.uuid, _spec(current, backend, tuple(created)))
    held = _named(created, backend.domain(current.uuid).vgpus)
    renamed = {old: new for old, new in held.items() if old != new}
    return {"vgpus": [held[d.id] for d in created], "named": renamed}, False


def _named(created: list[VgpuDevice], held: tuple[VgpuDevice, ...]) -> dict[str, str]:
    """Each created device's id as the VM's definition now holds it. Most hypervisors keep the id a
    device was made with; Proxmox VE names a vGPU itself when the definition takes it (its slot and
    the VM's id make the UUID), so a device not found by id is the held one on the same GPU, of the
    same type, that no other created device is."""
    named = {d.id: d.id for d in created if any(h.id == d.id for h in held)}
    spare = [h for h in held if h.id not in named.values() and h.id not in {d.id for d in created}]
    for device in created:
        if device.id in named:
            continue
        match = next((h for h in spare if (h.gpu_bus_id, h.type_name) == (device.gpu_bus_id, device.type_name)),
                     None)
        if match is not None:
            spare.remove(match)
            named[device.id] = match.id
        else:
            named[device.id] = device.id  # not held at all: the verify step says so
    return named


def _held_ids(current: Run) -> dict[str, str]:
    """Created device id -> the id the hypervisor holds it under (see `_named`)."""
    result = current.operation.steps.filter(kind=StepKind.REDEFINE).values_list("result", flat=True).first() or {}
    return result.get("named", {})


def _move(current: Run, step: OperationStep):
    if current.where() is current.target:
        return {}, True
    current.source.move_to(current.uuid, current.target)
    return {"to": current.operation.target_host.name}, False


def _start(current: Run, step: OperationStep):
    backend = current.target
    if not current.operation.before.get("was_running", True):
        return {"left_off": True}, True
    if backend.domain(current.uuid).state == PowerState.RUNNING:
        return {}, True
    backend.start(current.uuid)
    return {}, False


def _verify(current: Run, step: OperationStep):
    """The hypervisor must show the new devices (and the VM running, if it ran before); the
    agent's confirmation is recorded when it comes within HYPERVISOR_VERIFY_WAIT_S."""
    op = current.operation
    domain = current.target.domain(current.uuid)
    named = _held_ids(current)
    expected = {named.get(d.id, d.id) for d in _wanted(current)}
    found = {d.id for d in domain.vgpus}
    if found != expected:
        raise HypervisorError(f"{op.vm.name} holds vGPU devices {sorted(found) or 'none'} after the change; "
                              f"expected {sorted(expected)}.")
    size = {"vcpus": op.after.get("vcpus"), "ram_mib": op.after.get("ram_mib")}
    if size != {"vcpus": op.before.get("vcpus"), "ram_mib": op.before.get("ram_mib")} and \
            (domain.vcpus, domain.ram_mib) != (size["vcpus"], size["ram_mib"]):
        raise HypervisorError(f"{op.vm.name} has {domain.vcpus} vCPUs and {domain.ram_mib} MiB of RAM after the "
                              f"change; expected {size['vcpus']} and {size['ram_mib']} MiB.")
    if op.before.get("was_running", True) and domain.state != PowerState.RUNNING:
        raise HypervisorError(f"{op.vm.name} is {domain.state.replace('_', ' ')} after the change; expected running.")
    return {"agent": _agent_confirmation(current)}, False


def _agent_confirmation(current: Run) -> str:
    op = current.operation
    gpu_ids = {row["gpu_id"] for row in op.after.get("vgpus", [])}
    since = op.steps.filter(kind=StepKind.START).values_list("finished_at", flat=True).first() or op.started_at
    if not gpu_ids or not op.before.get("was_running", True):
        return "not asked (the VM is off)"
    if not VgpuSample.objects.filter(gpu__host=op.target_host).exists():
        return "not confirmed: the host's agent reports no vGPUs"
    deadline = timezone.now() + timedelta(seconds=settings.HYPERVISOR_VERIFY_WAIT_S)
    while True:
        seen = set(VgpuSample.objects.filter(vm=op.vm, gpu_id__in=gpu_ids, ts__gte=since)
                   .values_list("gpu_id", flat=True).distinct())
        if seen == gpu_ids:
            return "confirmed by the agent"
        if timezone.now() >= deadline:
            return (f"not confirmed by the agent within {settings.HYPERVISOR_VERIFY_WAIT_S:g} s "
                    "(the drift report will show it if it stays so)")
        current.beat()
        time.sleep(1.0)


STEPS = {
    StepKind.NOTIFY: _notify,
    StepKind.SHUTDOWN: _shutdown,
    StepKind.REMOVE_VGPU: _remove_vgpus,
    StepKind.CREATE_VGPU: _create_vgpu,
    StepKind.REDEFINE: _redefine,
    StepKind.MOVE_DOMAIN: _move,
    StepKind.START: _start,
    StepKind.VERIFY: _verify,
}


def _spec(current: Run, backend: Backend, vgpus: tuple[VgpuDevice, ...]) -> DomainSpec:
    domain = backend.domain(current.uuid)
    after = current.operation.after
    return DomainSpec(vcpus=after.get("vcpus", domain.vcpus), ram_mib=after.get("ram_mib", domain.ram_mib),
                      vgpus=vgpus)


def _device_dict(device: VgpuDevice) -> dict:
    return {"kind": device.kind, "id": device.id, "gpu_bus_id": device.gpu_bus_id, "type_name": device.type_name}


def _device(row: dict) -> VgpuDevice:
    return VgpuDevice(kind=row.get("kind", DeviceKind.MDEV), id=row["id"], gpu_bus_id=row.get("gpu_bus_id", ""),
                      type_name=row.get("type_name", ""))


def _find(backend: Backend, device_id: str) -> VgpuDevice | None:
    return next((d for d in backend.vgpu_devices() if d.id == device_id), None)


# Ending ------------------------------------------------------------------------------------------


def _release(operation: Operation) -> None:
    """Let go of the operation's claims; in a batch, of its VM only until the batch's last
    operation ends (the GPUs stay held for the ones still to run)."""
    batch = operation.after.get("batch")
    if not batch:
        OperationClaim.objects.filter(operation=operation).update(active=False)
        return
    OperationClaim.objects.filter(operation=operation, vm__isnull=False).update(active=False)
    if not Operation.objects.filter(after__batch=batch, status__in=ACTIVE).exclude(pk=operation.pk).exists():
        OperationClaim.objects.filter(operation__after__batch=batch, active=True).update(active=False)


def _next_in_batch(operation: Operation) -> None:
    """Once an operation of a batch succeeded, the next one runs if an admin asked to run it now."""
    following = [op for op in batch_of(operation) if op.after.get("batch_index", 0) >
                 operation.after.get("batch_index", 0) and op.status == OperationStatus.PENDING]
    if following and _due(following[0], timezone.now()):
        transaction.on_commit(lambda: enqueue(following[0].pk))


def _succeed(current: Run) -> None:
    op = current.operation
    named = _held_ids(current)
    devices = {step.args["vgpu_id"]: named.get(step.result["device"]["id"], step.result["device"]["id"])
               for step in op.steps.filter(kind=StepKind.CREATE_VGPU) if step.result.get("device")}
    verify = op.steps.filter(kind=StepKind.VERIFY).values_list("result", flat=True).first() or {}
    with transaction.atomic():
        for vgpu_id, device_id in devices.items():
            Vgpu.objects.filter(pk=vgpu_id).update(device_id=device_id)
        _release(op)
        Operation.objects.filter(pk=op.pk).update(status=OperationStatus.SUCCEEDED, finished_at=timezone.now(),
                                                  error="")
        op.refresh_from_db()
        audit.record("operation.succeeded", op, after=_summary(op), comment=verify.get("agent", ""))
        if op.request_id:
            fleet_requests.mark_applied(op.request, verify.get("agent", ""))
        _next_in_batch(op)


def _roll_back(current: Run, reason: str) -> None:
    """Put the hypervisor back as `before` describes it, then the inventory; ROLLED_BACK, or
    FAILED naming what could not be undone."""
    op = current.operation
    op.refresh_from_db()
    left = []
    try:
        _undo_on_hypervisor(current)
    except HypervisorError as exc:
        left.append(f"the hypervisor could not be put back: {str(exc).rstrip('.')}; check {op.vm.name} by hand")
    with transaction.atomic():
        # The batch's later operations have not run: they may need room this one was to make, so
        # their inventory is put back first (last first), then this one's.
        later = [other for other in batch_of(op) if other.after.get("batch_index", 0) >
                 op.after.get("batch_index", 0) and other.status == OperationStatus.PENDING]
        for other in reversed(later):
            _end_rolled_back(other, f"Not run: operation #{op.pk} of the same plan failed before it ({reason})", [])
        op.steps.filter(status__in=(StepStatus.DONE, StepStatus.RUNNING)).update(status=StepStatus.UNDONE)
        _end_rolled_back(op, reason, left)


def _end_rolled_back(op: Operation, reason: str, left: list[str], undone: str = " Rolled back.") -> None:
    """Put the inventory back as `op.before` lists it (through the request, when there is one),
    release the claims and mark the operation ROLLED_BACK, or FAILED naming what is left."""
    before = op.before.get("vgpus", [])
    try:
        if op.request_id:
            fleet_requests.revert_approval(op.request, before, reason,
                                           size=(op.before["vcpus"], op.before["ram_mib"] // 1024)
                                           if "vcpus" in op.before else None)
        else:
            with transaction.atomic(), audit.because(f"{op} failed to apply"):
                fleet_requests.restore_vgpus(op.vm, before)
    except FleetConflict as exc:
        left.append(f"the inventory could not be put back: {str(exc).rstrip('.')}")
    _release(op)
    status = OperationStatus.FAILED if left else OperationStatus.ROLLED_BACK
    error = reason + (undone if not left else " Not all was undone: " + "; ".join(left) + ".")
    Operation.objects.filter(pk=op.pk).update(status=status, finished_at=timezone.now(), error=error[:4000])
    op.refresh_from_db()
    audit.record(f"operation.{'rolled_back' if not left else 'failed'}", op, after=_summary(op), comment=error)


#: Steps that change the hypervisor beyond the VM's power state.
CHANGING = (StepKind.REMOVE_VGPU, StepKind.CREATE_VGPU, StepKind.REDEFINE, StepKind.MOVE_DOMAIN, StepKind.START)


def _undo_on_hypervisor(current: Run) -> None:
    """Make the host match `before`: the old devices, the saved definition, the old host, and
    the VM running if it ran. Judged by what is there, so it also finishes an undo cut short."""
    op = current.operation
    if "definition" not in op.before:
        return  # the shutdown step never read the VM: nothing on the hypervisor was touched
    backend = current.where()
    domain = backend.domain(current.uuid)
    touched = op.steps.filter(kind__in=CHANGING).exclude(status=StepStatus.PENDING).exists()
    if touched:
        if domain.state == PowerState.RUNNING:
            backend.shutdown(current.uuid, timeout_s=settings.HYPERVISOR_SHUTDOWN_TIMEOUT_S)
        empty = DomainSpec(vcpus=domain.vcpus, ram_mib=domain.ram_mib, vgpus=())
        if backend is current.target and current.target is not current.source:
            backend.redefine(current.uuid, empty)
            current.target.move_to(current.uuid, current.source)
            backend = current.source
        backend.redefine(current.uuid, empty)
        old = [_device(d) for d in op.before.get("devices", [])]
        keep = {d.id for d in old}
        created = [_device(step.result.get("device") or {"id": step.args["device_id"],
                                                         "gpu_bus_id": step.args["gpu_bus_id"]})
                   for step in op.steps.filter(kind=StepKind.CREATE_VGPU)]
        for device in created:
            if device.id not in keep and _find(current.target, device.id) is not None:
                current.target.remove_vgpu(device)
        present = {d.id for d in backend.vgpu_devices()}
        for device in old:
            if device.id not in present:
                backend.create_vgpu(device.gpu_bus_id, device.type_name, device_id=device.id)
        backend.restore(current.uuid, op.before["definition"])
    if op.before.get("was_running") and backend.domain(current.uuid).state != PowerState.RUNNING:
        backend.start(current.uuid)


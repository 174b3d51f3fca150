"""Writes to the fleet inventory that the placement rules govern.

Every function here reads what the change rests on, checks it, then locks the rows involved
through `fleet.locks` (in its one order: host, GPU, VM, vGPU, request; SQLite runs IMMEDIATE
transactions, which serialize writers), checks again and writes only what `fleet.placement`
accepts.

A refusal found before the locks are taken is a plain rule violation (`PlacementError`, 400);
one that appears only once the locks are held means another request changed the fleet in
between (took the last slot, moved the VM, deleted a row) and is a `FleetConflict` naming
what changed, which the API answers with 409.
"""

from __future__ import annotations

from collections.abc import Callable

from django.db import IntegrityError, transaction
from django.db.models import Count, Sum

from fleet import audit, locks, placement
from fleet.locks import FleetConflict, conflict
from fleet.models import Gpu, Host, Vgpu, VgpuProfile, VirtualMachine
from fleet.placement import PlacementError, Rule, Violation


def _refuse(violations: list[Violation], *, locked: bool, host: str = "") -> None:
    """Raise for `violations`, if any: PlacementError when found before the locks (the change
    itself is refused), FleetConflict when found only under them (the fleet changed meanwhile);
    `host`: the host they were found on, which the refusal names."""
    if violations:
        raise (FleetConflict if locked else PlacementError)(violations, host=host)


def gpu_state(gpu: Gpu) -> placement.GpuState:
    vgpus = Vgpu.objects.filter(gpu=gpu).select_related("profile__gpu_model")
    return placement.GpuState(
        id=gpu.pk, label=gpu.label, host_id=gpu.host_id, model=gpu.gpu_model.to_spec(),
        mode=gpu.mode, size_mode=gpu.size_mode,
        vgpus=tuple(placement.PlacedVgpu(v.profile.to_spec(), v.vm_id, v.placement_id) for v in vgpus),
    )


def vm_state(vm: VirtualMachine) -> placement.VmState:
    vgpus = Vgpu.objects.filter(vm=vm).select_related("profile__gpu_model", "gpu")
    return placement.VmState(
        id=vm.pk, name=vm.name, vcpus=vm.vcpus, ram_gib=vm.ram_gib, host_id=vm.host_id,
        vgpus=tuple(placement.VmVgpu(v.profile.to_spec(), v.gpu_id, v.gpu.host_id) for v in vgpus),
    )


def host_state(host: Host, exclude_vm_id: int | None = None) -> placement.HostState:
    """The host's capacity and what its VMs claim, leaving out `exclude_vm_id` (the VM being changed)."""
    claims = VirtualMachine.objects.filter(host=host).exclude(pk=exclude_vm_id).aggregate(
        vcpus=Sum("vcpus"), ram_gib=Sum("ram_gib"),
    )
    return placement.HostState(
        id=host.pk, name=host.name, cpu_threads=host.cpu_threads, ram_gib=host.ram_gib,
        vcpu_overcommit=host.vcpu_overcommit, ram_overcommit=host.ram_overcommit,
        allocated_vcpus=claims["vcpus"] or 0, allocated_ram_gib=claims["ram_gib"] or 0,
        multi_vgpu_same_gpu=host.multi_vgpu_same_gpu,
    )


def check_vgpu(vm: VirtualMachine, gpu: Gpu, profile: VgpuProfile) -> placement.Decision:
    """Whether a vGPU of `profile` for `vm` fits on `gpu` now (no locks, no write): for forms and previews."""
    return placement.check_placement(
        gpu_state(gpu), profile.to_spec(), vm_state(vm), host_state(gpu.host, exclude_vm_id=vm.pk),
    )


def _record_save(object_type: str, obj, before: dict | None) -> None:
    """An "<type>.create" event for a new row, "<type>.update" for a changed one; a save that
    changed nothing leaves no event (the log lists changes, not form submissions)."""
    after = audit.snapshot(obj)
    if before is None:
        audit.record(f"{object_type}.create", obj, after=after, object_type=object_type)
    elif audit.changed(before, after):
        audit.record(f"{object_type}.update", obj, before=before, after=after, object_type=object_type)


def place_vgpu(vm: VirtualMachine, gpu: Gpu, profile: VgpuProfile) -> Vgpu:
    """Create a vGPU of `profile` on `gpu` for `vm`, or raise PlacementError / FleetConflict.

    The VM moves onto the GPU's host with its first vGPU.
    """
    # `gpu` may have been loaded before the GPU moved to another host (an open form): ask about,
    # and lock, the host it is on now, or the VM would be recorded on the old one.
    gpu = _stored(gpu, "host", "gpu_model")
    check_vgpu(vm, gpu, profile).raise_if_refused()
    try:
        with transaction.atomic():
            locked = locks.lock_for_change(hosts=[gpu.host], gpus=[gpu], vms=[vm])
            host, gpu, vm = locked.hosts[gpu.host_id], locked.gpus[gpu.pk], locked.vms[vm.pk]
            if gpu.host_id != host.pk:
                raise conflict(f"GPU {gpu.label} moved to another host meanwhile; try again", Rule.VM_HOST)
            decision = placement.check_placement(
                gpu_state(gpu), profile.to_spec(), vm_state(vm), host_state(host, exclude_vm_id=vm.pk),
            )
            _refuse(decision.violations, locked=True, host=host.name)
            if vm.host_id != host.pk:
                vm.host = host
                vm.save(update_fields=["host"])
            vgpu = Vgpu.objects.create(vm=vm, gpu=gpu, profile=profile, placement_id=decision.placement_id)
            audit.record("vgpu.place", vgpu, after=audit.snapshot(vgpu))
            return vgpu
    except IntegrityError as exc:
        raise conflict(f"GPU {gpu.label}: the slot was taken by another request meanwhile",
                       Rule.PLACEMENT_SLOT) from exc


def _lock_vgpus(vgpus) -> locks.Locked:
    """Lock `vgpus` with the hosts, GPUs and VMs their removal writes (in lock order); a vGPU
    removed meanwhile is a FleetConflict naming it."""
    rows = list(Vgpu.objects.filter(pk__in=[v.pk for v in vgpus]).values("pk", "vm_id", "vm__host_id", "gpu_id",
                                                                         "gpu__host_id"))
    found = {row["pk"] for row in rows}
    gone = [v for v in vgpus if v.pk not in found]
    if gone:
        raise conflict(f"vGPU {gone[0]} was removed meanwhile; reload and try again.")
    return locks.lock_for_change(
        hosts=[row[key] for row in rows for key in ("vm__host_id", "gpu__host_id")],
        gpus=[row["gpu_id"] for row in rows], vms=[row["vm_id"] for row in rows], vgpus=vgpus,
    )


def remove_vgpus(vgpus) -> None:
    """Delete `vgpus` (all or none); a VM left without vGPUs leaves its host (it no longer claims
    its capacity). Every row involved is locked first, in lock order, so removing several
    vGPUs never locks a host after a VM."""
    vgpus = list(vgpus)
    with transaction.atomic():
        locked = _lock_vgpus(vgpus)
        for vgpu in vgpus:
            vm = locked.vms[vgpu.vm_id]
            Vgpu.objects.filter(pk=vgpu.pk).delete()
            audit.record("vgpu.remove", vgpu, before=audit.snapshot(locked.vgpus[vgpu.pk]))
            if not Vgpu.objects.filter(vm=vm).exists() and vm.host_id is not None:
                vm.host = None
                vm.save(update_fields=["host"])


def remove_vgpu(vgpu: Vgpu) -> None:
    """Delete a vGPU; a VM left without vGPUs leaves its host. FleetConflict if it is gone already."""
    remove_vgpus([vgpu])


def check_vm_resize(vm: VirtualMachine, vcpus: int, ram_gib: int) -> list[Violation]:
    """Whether a VM may take this many vCPUs and this much RAM on the host it runs on."""
    if vm.host_id is None:
        return []
    return placement.check_vm_fits_host(vm.name, vcpus, ram_gib, host_state(vm.host, exclude_vm_id=vm.pk))


def _save_checked(obj, object_type: str, fields: dict, violations: Callable, lock: Callable, *related: str):
    """Save `obj` with `fields` applied and record it, refusing what `violations(row)` finds in
    its row (None for a new row): first as stored, unlocked (PlacementError), then as `lock(stored)`
    returns it, locked through `fleet.locks` (FleetConflict: the fleet changed meanwhile)."""
    stored = _stored(obj, *related)
    _refuse(violations(stored), locked=False)
    with transaction.atomic():
        before = None
        if stored is not None:
            current = lock(stored)
            _refuse(violations(current), locked=True)
            before = audit.snapshot(current)
        for name, value in fields.items():
            setattr(obj, name, value)
        obj.save()
        _record_save(object_type, obj, before)
    return obj


def _stored(obj, *related: str):
    """The row of `obj` as the database holds it now, unlocked (None for an object not saved yet);
    FleetConflict when it was saved once and is gone: it was deleted since the caller loaded it."""
    if obj.pk is None or obj._state.adding:
        return None
    stored = type(obj).objects.select_related(*related).filter(pk=obj.pk).first()
    if stored is None:
        raise conflict(f"{locks.noun(type(obj))} {obj} was deleted meanwhile; reload and try again.")
    return stored


def update_vm(vm: VirtualMachine, **fields) -> VirtualMachine:
    """Save changes to a VM, re-checking host capacity when its vCPUs or RAM change.

    What is checked is what is written: `vm` with `fields` applied. The host is placement's:
    it is read from the database and kept (unless `fields` names one), since `vm` may have
    been loaded before a placement moved the VM (an edit form left open); writing its host
    back would detach the VM from the host its vGPUs are on. The host read before the locks
    is the one locked: a VM that moved while the edit waited for it is a FleetConflict.
    """
    vcpus, ram_gib = fields.get("vcpus", vm.vcpus), fields.get("ram_gib", vm.ram_gib)

    def violations(current: VirtualMachine | None) -> list[Violation]:
        if current is None or (vcpus, ram_gib) == (current.vcpus, current.ram_gib):
            return []
        return check_vm_resize(current, vcpus, ram_gib)

    def lock(stored: VirtualMachine) -> VirtualMachine:
        locked = locks.lock_for_change(hosts=[stored.host_id], vms=[vm]).vms[vm.pk]
        if locked.host_id != stored.host_id:
            where = f"to host {locked.host.name}" if locked.host_id else "off its host"
            raise conflict(f"VM {locked.name} moved {where} meanwhile; try again", Rule.VM_HOST)
        vm.host_id = locked.host_id
        return locked

    return _save_checked(vm, "vm", fields, violations, lock, "host")


def update_gpu(gpu: Gpu, **fields) -> Gpu:
    """Create or change a GPU; its mode, size mode, host and model change only while it holds no vGPU."""
    # What is checked is what is written: `gpu` with `fields` applied (a caller may have set
    # them on the object already, or loaded it before another change it would write back).
    # Not fields.get(name, gpu.x): the default is evaluated even when unused, and a new
    # GPU whose model or host comes in `fields` has none yet (RelatedObjectDoesNotExist).
    model = fields["gpu_model"] if "gpu_model" in fields else gpu.gpu_model  # noqa: SIM401
    host = fields["host"] if "host" in fields else gpu.host  # noqa: SIM401

    def violations(current: Gpu | None) -> list[Violation]:
        state = gpu_state(current) if current is not None else placement.GpuState(
            id=0, label=fields.get("pci_bus_id", gpu.pci_bus_id), host_id=host.pk, model=model.to_spec(),
            mode=gpu.mode, size_mode=gpu.size_mode,
        )
        return placement.check_gpu_change(
            state, fields.get("mode", gpu.mode), fields.get("size_mode", gpu.size_mode),
            model=model.to_spec(), host_id=host.pk,
        )

    return _save_checked(gpu, "gpu", fields, violations, lambda _: locks.lock_for_change(gpus=[gpu]).gpus[gpu.pk],
                         "gpu_model")


CAPACITY_FIELDS = ("cpu_threads", "ram_gib", "vcpu_overcommit", "ram_overcommit")


def _stacked(host: Host) -> list[tuple[str, str]]:
    """(VM name, GPU PCI bus id) where a VM holds several vGPUs on one GPU of `host`."""
    rows = (Vgpu.objects.filter(gpu__host=host).order_by().values("vm__name", "gpu__pci_bus_id")
            .annotate(n=Count("pk")).filter(n__gt=1).order_by("vm__name", "gpu__pci_bus_id"))
    return [(row["vm__name"], row["gpu__pci_bus_id"]) for row in rows]


def update_host(host: Host, **fields) -> Host:
    """Save changes to a host, refusing capacity below what its VMs already claim.

    What is checked is what is written: `host` with `fields` applied. Only a change of
    capacity is checked, so a host already over capacity (say after its overcommit
    default changed) can still be renamed or given more capacity. A host stops letting a VM's
    vGPUs share a GPU only once no VM holds several vGPUs on one of its GPUs.
    """
    wanted = {name: fields.get(name, getattr(host, name)) for name in CAPACITY_FIELDS}
    sharing = fields.get("multi_vgpu_same_gpu", host.multi_vgpu_same_gpu)

    def violations(current: Host | None) -> list[Violation]:
        if current is None:
            return []
        found = []
        if any(wanted[name] < getattr(current, name) for name in CAPACITY_FIELDS):
            found += placement.check_host_capacity(host_state(current), **wanted)
        if current.multi_vgpu_same_gpu and not sharing:
            found += placement.check_sharing_off(current.name, _stacked(current))
        return found

    return _save_checked(host, "host", fields, violations,
                         lambda _: locks.lock_for_change(hosts=[host]).hosts[host.pk])


def delete_inventory(rows) -> None:
    """Delete hosts, GPUs or VMs (what refers to them goes with them or, where protected, stops
    the deletion with ProtectedError) and record "<type>.delete" for each.

    The rows are locked first, in lock order: a deletion removes what hangs off a row (a VM's
    vGPUs and requests) before the row itself, so without the lock it would hold those while
    waiting for a VM that an approval holds while it waits for them. Held first, a writer in
    flight finishes before the deletion starts, and one that comes after finds the row gone (409).
    """
    rows = list(rows)
    groups = {Host: "hosts", Gpu: "gpus", VirtualMachine: "vms"}
    wanted: dict[str, list] = {}
    for row in rows:
        wanted.setdefault(groups[type(row)], []).append(row)
    with transaction.atomic():
        locks.lock_for_change(**wanted)
        events = [audit.event(f"{audit.object_type_of(row)}.delete", row, before=audit.snapshot(row)) for row in rows]
        for row in rows:
            row.delete()
        audit.record_many(events)

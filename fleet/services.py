"""Writes to the fleet inventory that the placement rules govern.

Every function here loads the rows involved under row locks (SELECT ... FOR UPDATE on
PostgreSQL; SQLite runs IMMEDIATE transactions, which serialize writers), asks
`fleet.placement` and writes only what it accepts. Locks are always taken in the order
host, GPU, VM, so two placements never deadlock.

A refusal found before the locks are taken is a plain rule violation (`PlacementError`);
one that appears only once the locks are held means another request changed the fleet in
between (e.g. took the last slot) and is a `FleetConflict`, which the API answers with 409.
"""

from __future__ import annotations

from django.db import IntegrityError, transaction
from django.db.models import Sum

from fleet import audit, placement
from fleet.models import Gpu, Host, Vgpu, VgpuProfile, VirtualMachine
from fleet.placement import PlacementError, Violation


class FleetConflict(PlacementError):
    """The fleet changed between the check and the write; trying again may give another answer."""


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
    )


def check_vgpu(vm: VirtualMachine, gpu: Gpu, profile: VgpuProfile) -> placement.Decision:
    """Whether a vGPU of `profile` for `vm` fits on `gpu` now (no locks, no write): for forms and previews."""
    return placement.check_placement(
        gpu_state(gpu), profile.to_spec(), vm_state(vm), host_state(gpu.host, exclude_vm_id=vm.pk),
    )


def _locked(model, pk, *related: str):
    """The row, locked until the transaction ends; joined `related` rows are read, not locked
    (locking a GpuModel row would queue every placement on GPUs of that model)."""
    return model.objects.select_for_update(of=("self",)).select_related(*related).get(pk=pk)


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
    gpu = Gpu.objects.select_related("host", "gpu_model").get(pk=gpu.pk)
    check_vgpu(vm, gpu, profile).raise_if_refused()
    try:
        with transaction.atomic():
            host = _locked(Host, gpu.host_id)
            gpu = _locked(Gpu, gpu.pk, "gpu_model")
            if gpu.host_id != host.pk:
                raise FleetConflict([Violation(
                    placement.Rule.VM_HOST, f"GPU {gpu.label} moved to another host meanwhile; try again",
                )])
            vm = _locked(VirtualMachine, vm.pk)
            decision = placement.check_placement(
                gpu_state(gpu), profile.to_spec(), vm_state(vm), host_state(host, exclude_vm_id=vm.pk),
            )
            if not decision.ok:
                raise FleetConflict(decision.violations)
            if vm.host_id != host.pk:
                vm.host = host
                vm.save(update_fields=["host"])
            vgpu = Vgpu.objects.create(vm=vm, gpu=gpu, profile=profile, placement_id=decision.placement_id)
            audit.record("vgpu.place", vgpu, after=audit.snapshot(vgpu))
            return vgpu
    except IntegrityError as exc:
        raise FleetConflict([Violation(
            placement.Rule.PLACEMENT_SLOT, f"GPU {gpu.label}: the slot was taken by another request meanwhile",
        )]) from exc


def remove_vgpu(vgpu: Vgpu) -> None:
    """Delete a vGPU; a VM left without vGPUs leaves its host (it no longer claims its capacity)."""
    with transaction.atomic():
        vm = _locked(VirtualMachine, vgpu.vm_id)
        deleted, _ = Vgpu.objects.filter(pk=vgpu.pk).delete()
        if deleted:
            audit.record("vgpu.remove", vgpu, before=audit.snapshot(vgpu))
        if not Vgpu.objects.filter(vm=vm).exists() and vm.host_id is not None:
            vm.host = None
            vm.save(update_fields=["host"])


def check_vm_resize(vm: VirtualMachine, vcpus: int, ram_gib: int) -> list[Violation]:
    """Whether a VM may take this many vCPUs and this much RAM on the host it runs on."""
    if vm.host_id is None:
        return []
    return placement.check_vm_fits_host(vm.name, vcpus, ram_gib, host_state(vm.host, exclude_vm_id=vm.pk))


def update_vm(vm: VirtualMachine, **fields) -> VirtualMachine:
    """Save changes to a VM, re-checking host capacity when its vCPUs or RAM change.

    What is checked is what is written: `vm` with `fields` applied. The host is placement's:
    it is read from the database under lock and kept (unless `fields` names one), since `vm`
    may have been loaded before a placement moved the VM (an edit form left open); writing
    its host back would detach the VM from the host its vGPUs are on.
    """
    with transaction.atomic():
        before = None
        row = VirtualMachine.objects.filter(pk=vm.pk).values("host_id").first() if vm.pk is not None else None
        if row is not None:
            if row["host_id"] is not None:
                _locked(Host, row["host_id"])  # lock order: host, then VM
            locked = _locked(VirtualMachine, vm.pk)
            if locked.host_id != row["host_id"]:
                raise FleetConflict([Violation(
                    placement.Rule.VM_HOST, f"VM {locked.name} moved to another host meanwhile; try again",
                )])
            vcpus, ram_gib = fields.get("vcpus", vm.vcpus), fields.get("ram_gib", vm.ram_gib)
            if (vcpus, ram_gib) != (locked.vcpus, locked.ram_gib):
                violations = check_vm_resize(locked, vcpus, ram_gib)
                if violations:
                    raise PlacementError(violations)
            vm.host_id = locked.host_id
            before = audit.snapshot(locked)
        for name, value in fields.items():
            setattr(vm, name, value)
        vm.save()
        _record_save("vm", vm, before)
    return vm


def update_gpu(gpu: Gpu, **fields) -> Gpu:
    """Create or change a GPU; its mode, size mode, host and model change only while it holds no vGPU."""
    with transaction.atomic():
        current, before = gpu, None
        if gpu.pk is not None:
            current = _locked(Gpu, gpu.pk, "gpu_model")
            before = audit.snapshot(current)
        # What is checked is what is written: `gpu` with `fields` applied (a caller may have set
        # them on the object already, or loaded it before another change it would write back).
        # Not fields.get(name, gpu.x): the default is evaluated even when unused, and a new
        # GPU whose model or host comes in `fields` has none yet (RelatedObjectDoesNotExist).
        model = fields["gpu_model"] if "gpu_model" in fields else gpu.gpu_model  # noqa: SIM401
        host = fields["host"] if "host" in fields else gpu.host  # noqa: SIM401
        state = gpu_state(current) if gpu.pk is not None else placement.GpuState(
            id=0, label=fields.get("pci_bus_id", gpu.pci_bus_id), host_id=host.pk, model=model.to_spec(),
            mode=gpu.mode, size_mode=gpu.size_mode,
        )
        violations = placement.check_gpu_change(
            state, fields.get("mode", gpu.mode), fields.get("size_mode", gpu.size_mode),
            model=model.to_spec(), host_id=host.pk,
        )
        if violations:
            raise PlacementError(violations)
        for name, value in fields.items():
            setattr(gpu, name, value)
        gpu.save()
        _record_save("gpu", gpu, before)
    return gpu


CAPACITY_FIELDS = ("cpu_threads", "ram_gib", "vcpu_overcommit", "ram_overcommit")


def update_host(host: Host, **fields) -> Host:
    """Save changes to a host, refusing capacity below what its VMs already claim.

    What is checked is what is written: `host` with `fields` applied. Only a change of
    capacity is checked, so a host already over capacity (say after its overcommit
    default changed) can still be renamed or given more capacity.
    """
    with transaction.atomic():
        before = None
        if host.pk is not None:
            locked = _locked(Host, host.pk)
            before = audit.snapshot(locked)
            wanted = {name: fields.get(name, getattr(host, name)) for name in CAPACITY_FIELDS}
            shrinks = any(wanted[name] < getattr(locked, name) for name in CAPACITY_FIELDS)
            violations = placement.check_host_capacity(host_state(locked), **wanted) if shrinks else []
            if violations:
                raise PlacementError(violations)
        for name, value in fields.items():
            setattr(host, name, value)
        host.save()
        _record_save("host", host, before)
    return host

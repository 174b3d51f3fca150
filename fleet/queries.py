"""Reusable reads of the fleet inventory, shared by the REST API and the HTML pages.

Each `<things>_for(user)` function returns the rows `user` may see, ordered (with an id
tiebreak, so pages never repeat or skip a row) and loaded with everything a list shows in a
fixed number of queries: related rows by `select_related`/`prefetch_related`, sums and counts
by correlated subqueries (a plain `Sum` over one join and `Count` over another would multiply
each other's rows).

Role scoping (DESIGN.md, "Roles"): staff see everything. Anyone else sees only what their own
VMs touch: their own artist record, their VMs and those VMs' vGPUs, and the hosts and GPUs that
carry those VMs. Figures of a host or GPU that an artist may see (allocated vCPUs, used frame
buffer) are totals over every VM on it: capacity, not another artist's data. Anonymous users
see nothing.

Telemetry of a whole GPU is narrower (`gpu_telemetry_visible`): a GPU's utilization and frame
buffer readings are the sum of every vGPU on it, so an artist sharing a GPU with anyone else
would read their co-tenants' usage from it. An artist reads a GPU's series and newest reading
only where every vGPU on it belongs to one of their own VMs; their own share is their VM's
series.
"""

from __future__ import annotations

from collections import defaultdict

from django.contrib.auth import get_user_model
from django.db.models import (
    Count,
    IntegerField,
    OuterRef,
    Prefetch,
    QuerySet,
    Subquery,
    Sum,
    Value,
)
from django.db.models.functions import Coalesce

from config.roles import is_fleet_admin
from fleet import placement
from fleet.models import Artist, Gpu, GpuModel, Host, Vgpu, VgpuProfile, VirtualMachine
from fleet.snapshot import FleetSnapshot


def _total(queryset: QuerySet, group_by: str, expression) -> Coalesce:
    """A correlated subquery of one aggregate per outer row, 0 where the outer row has no match."""
    aggregate = queryset.order_by().values(group_by).annotate(total=expression).values("total")
    return Coalesce(Subquery(aggregate, output_field=IntegerField()), Value(0))


def _own_vms(user) -> QuerySet[VirtualMachine]:
    return VirtualMachine.objects.filter(artist__user=user)


# Scoping alone: cheap querysets for choices and lookups (e.g. the choices of a filter). -----


def visible_hosts(user) -> QuerySet[Host]:
    """Hosts `user` may see: all for staff, those running one of their VMs for an artist."""
    if not (user and user.is_authenticated):
        return Host.objects.none()
    if is_fleet_admin(user):
        return Host.objects.all()
    return Host.objects.filter(pk__in=_own_vms(user).values("host_id"))


def visible_gpus(user) -> QuerySet[Gpu]:
    """GPUs `user` may see: all for staff, those holding a vGPU of one of their VMs for an artist."""
    if not (user and user.is_authenticated):
        return Gpu.objects.none()
    if is_fleet_admin(user):
        return Gpu.objects.all()
    return Gpu.objects.filter(pk__in=Vgpu.objects.filter(vm__in=_own_vms(user)).values("gpu_id"))


def gpu_telemetry_visible(user) -> QuerySet[Gpu]:
    """GPUs whose own readings (series, heatmap rows, newest sample) `user` may read: all for
    staff; for anyone else the GPUs they may see on which no one else is placed, i.e. every
    vGPU on it belongs to one of their VMs (see the module's docstring)."""
    if not (user and user.is_authenticated):
        return Gpu.objects.none()
    if is_fleet_admin(user):
        return Gpu.objects.all()
    others = Vgpu.objects.exclude(vm__in=_own_vms(user).values("pk")).values("gpu_id")
    return visible_gpus(user).exclude(pk__in=others)


def may_read_gpu_telemetry(user, gpu_id: int) -> bool:
    """Whether `user` may read the readings of the GPU `gpu_id` (`gpu_telemetry_visible`); no
    query for staff."""
    return is_fleet_admin(user) or gpu_telemetry_visible(user).filter(pk=gpu_id).exists()


def visible_artists(user) -> QuerySet[Artist]:
    """Artists `user` may see: all for staff, their own record for an artist."""
    if not (user and user.is_authenticated):
        return Artist.objects.none()
    if is_fleet_admin(user):
        return Artist.objects.all()
    return Artist.objects.filter(user=user)


def visible_users(user) -> QuerySet:
    """User accounts `user` may see: all for staff, only themselves otherwise."""
    users = get_user_model().objects
    if not (user and user.is_authenticated):
        return users.none()
    if is_fleet_admin(user):
        return users.all()
    return users.filter(pk=user.pk)


def visible_vms(user) -> QuerySet[VirtualMachine]:
    """VMs `user` may see: all for staff, their own for an artist."""
    if not (user and user.is_authenticated):
        return VirtualMachine.objects.none()
    if is_fleet_admin(user):
        return VirtualMachine.objects.all()
    return _own_vms(user)


def visible_vgpus(user) -> QuerySet[Vgpu]:
    """vGPUs `user` may see: all for staff, those of their own VMs for an artist."""
    if not (user and user.is_authenticated):
        return Vgpu.objects.none()
    if is_fleet_admin(user):
        return Vgpu.objects.all()
    return Vgpu.objects.filter(vm__artist__user=user)


# Lists and details: scoped, ordered, with everything they show loaded. ------------------


def gpu_models_for(user) -> QuerySet[GpuModel]:
    """GPU models: the public catalog, readable by every signed-in user."""
    if not (user and user.is_authenticated):
        return GpuModel.objects.none()
    return GpuModel.objects.order_by("name", "id")


def vgpu_profiles_for(user) -> QuerySet[VgpuProfile]:
    """vGPU profiles with their GPU model; the public catalog, readable by every signed-in user."""
    if not (user and user.is_authenticated):
        return VgpuProfile.objects.none()
    return VgpuProfile.objects.select_related("gpu_model").order_by("gpu_model__name", "-fb_mib", "series", "id")


def with_host_usage(queryset: QuerySet[Host]) -> QuerySet[Host]:
    """Hosts annotated with `allocated_vcpus` and `allocated_ram_gib` (claimed by the VMs on them)
    and `gpu_count`."""
    vms = VirtualMachine.objects.filter(host=OuterRef("pk"))
    return queryset.annotate(
        allocated_vcpus=_total(vms, "host", Sum("vcpus")),
        allocated_ram_gib=_total(vms, "host", Sum("ram_gib")),
        gpu_count=_total(Gpu.objects.filter(host=OuterRef("pk")), "host", Count("pk")),
    )


def hosts_for(user) -> QuerySet[Host]:
    """Hosts `user` may see, with their usage (see `with_host_usage`), ordered by name."""
    return with_host_usage(visible_hosts(user)).order_by("name", "id")


def with_gpu_usage(queryset: QuerySet[Gpu]) -> QuerySet[Gpu]:
    """GPUs annotated with `used_fb_mib` (sum of their vGPUs' profile frame buffers) and `vgpu_count`."""
    vgpus = Vgpu.objects.filter(gpu=OuterRef("pk"))
    return queryset.annotate(
        used_fb_mib=_total(vgpus, "gpu", Sum("profile__fb_mib")),
        vgpu_count=_total(vgpus, "gpu", Count("pk")),
    )


def gpus_for(user) -> QuerySet[Gpu]:
    """GPUs `user` may see, with host, model and usage, ordered by host name and PCI bus id."""
    queryset = visible_gpus(user).select_related("host", "gpu_model")
    return with_gpu_usage(queryset).order_by("host__name", "pci_bus_id", "id")


def artists_for(user) -> QuerySet[Artist]:
    """Artists `user` may see, with their user, ordered by name."""
    return visible_artists(user).select_related("user").order_by("name", "id")


def vms_for(user) -> QuerySet[VirtualMachine]:
    """VMs `user` may see, with artist, host and vGPUs (with profiles) loaded, ordered by name."""
    return visible_vms(user).select_related("artist", "host").prefetch_related(
        Prefetch("vgpus", queryset=Vgpu.objects.select_related("profile").order_by("id")),
    ).order_by("name", "id")


def vgpus_for(user) -> QuerySet[Vgpu]:
    """vGPUs `user` may see, with VM, GPU and profile loaded, ordered by GPU and slot."""
    return visible_vgpus(user).select_related("vm", "gpu", "profile").order_by("gpu_id", "placement_id", "id")


# The fleet as plain data ----------------------------------------------------------------------


def fleet_snapshot(gpu_model_ids=None) -> FleetSnapshot:
    """The whole fleet as `placement` dataclasses, in seven queries whatever its size: what the
    pure answers (`fleet.fit`, the sizing code) reason over. Reads without locking.

    `gpu_model_ids` (optional) keeps only the GPUs of those models and their vGPUs (every host,
    VM and profile stays, with the hosts' full claims): enough to ask where a profile of those
    models fits, for a page that need not read the whole fleet."""
    model_rows = list(GpuModel.objects.all())
    models = {m.name: m.to_spec() for m in model_rows}
    model_names = {m.pk: m.name for m in model_rows}
    profiles = {
        p.pk: placement.ProfileSpec(
            id=p.pk, name=p.name, gpu_model=model_names[p.gpu_model_id], series=p.series,
            fb_mib=p.fb_mib, max_per_gpu=p.max_per_gpu, max_per_gpu_mixed=p.max_per_gpu_mixed,
            max_per_vm=p.max_per_vm,
        )
        for p in VgpuProfile.objects.all()
    }
    claims = {
        row["host_id"]: row
        for row in VirtualMachine.objects.filter(host__isnull=False).order_by().values("host_id").annotate(
            vcpus=Sum("vcpus"), ram_gib=Sum("ram_gib"),
        )
    }
    hosts = {
        h.pk: placement.HostState(
            id=h.pk, name=h.name, cpu_threads=h.cpu_threads, ram_gib=h.ram_gib,
            vcpu_overcommit=h.vcpu_overcommit, ram_overcommit=h.ram_overcommit,
            allocated_vcpus=claims.get(h.pk, {}).get("vcpus") or 0,
            allocated_ram_gib=claims.get(h.pk, {}).get("ram_gib") or 0,
            multi_vgpu_same_gpu=h.multi_vgpu_same_gpu,
        )
        for h in Host.objects.all()
    }
    gpu_query, vgpu_query = Gpu.objects.all(), Vgpu.objects.all()
    if gpu_model_ids is not None:
        gpu_query = gpu_query.filter(gpu_model_id__in=gpu_model_ids)
        vgpu_query = vgpu_query.filter(gpu__gpu_model_id__in=gpu_model_ids)
    gpu_rows = list(gpu_query.values_list("pk", "pci_bus_id", "host_id", "gpu_model_id", "mode", "size_mode"))
    gpu_host = {pk: host_id for pk, _, host_id, *_ in gpu_rows}
    on_gpu: dict[int, list[placement.PlacedVgpu]] = defaultdict(list)
    on_vm: dict[int, list[placement.VmVgpu]] = defaultdict(list)
    for vm_id, gpu_id, profile_id, placement_id in vgpu_query.order_by("gpu_id", "placement_id").values_list(
        "vm_id", "gpu_id", "profile_id", "placement_id",
    ):
        profile = profiles[profile_id]
        on_gpu[gpu_id].append(placement.PlacedVgpu(profile, vm_id, placement_id))
        on_vm[vm_id].append(placement.VmVgpu(profile, gpu_id, gpu_host[gpu_id]))
    gpus = {
        pk: placement.GpuState(
            id=pk, label=bus, host_id=host_id, model=models[model_names[model_id]], mode=mode,
            size_mode=size_mode, vgpus=tuple(on_gpu.get(pk, ())),
        )
        for pk, bus, host_id, model_id, mode, size_mode in gpu_rows
    }
    vms = {
        pk: placement.VmState(
            id=pk, name=name, vcpus=vcpus, ram_gib=ram_gib, host_id=host_id, vgpus=tuple(on_vm.get(pk, ())),
        )
        for pk, name, vcpus, ram_gib, host_id in VirtualMachine.objects.values_list(
            "pk", "name", "vcpus", "ram_gib", "host_id",
        )
    }
    return FleetSnapshot(hosts=hosts, gpus=gpus, vms=vms, profiles=profiles, models=models)

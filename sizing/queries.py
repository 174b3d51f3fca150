"""Reads for sizing: the fleet snapshot the pure sizing code works on, and the suggestions."""

from __future__ import annotations

from collections import defaultdict

from django.db.models import BooleanField, Count, ExpressionWrapper, F, Max, Q, QuerySet, Sum

from config.roles import is_fleet_admin
from fleet import placement
from fleet.models import Gpu, GpuModel, Host, Vgpu, VgpuProfile, VirtualMachine
from sizing.models import Suggestion, SuggestionAction
from sizing.snapshot import FleetSnapshot


def fleet_snapshot() -> FleetSnapshot:
    """The whole fleet as `placement` dataclasses, in seven queries whatever its size."""
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
        )
        for h in Host.objects.all()
    }
    gpu_rows = list(Gpu.objects.values_list("pk", "pci_bus_id", "host_id", "gpu_model_id", "mode", "size_mode"))
    gpu_host = {pk: host_id for pk, _, host_id, *_ in gpu_rows}
    on_gpu: dict[int, list[placement.PlacedVgpu]] = defaultdict(list)
    on_vm: dict[int, list[placement.VmVgpu]] = defaultdict(list)
    for vm_id, gpu_id, profile_id, placement_id in Vgpu.objects.order_by("gpu_id", "placement_id").values_list(
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


# Right-sizing suggestions -------------------------------------------------------------------

#: A suggestion is dismissed while the evidence it was dismissed on is still its evidence.
DISMISSED = ~Q(dismissed_key="") & Q(dismissed_key=F("evidence_key"))


def suggestions_for(user) -> QuerySet[Suggestion]:
    """Suggestions `user` may see (all for staff, those of their own VMs for an artist; none for
    anonymous), annotated with `dismissed`, with VM, artist, host, both profiles and the filed
    request loaded, ordered by VM name. One query for a list of any length."""
    if not (user and user.is_authenticated):
        return Suggestion.objects.none()
    queryset = Suggestion.objects.all()
    if not is_fleet_admin(user):
        queryset = queryset.filter(vm__artist__user=user)
    return queryset.annotate(
        dismissed=ExpressionWrapper(DISMISSED, output_field=BooleanField()),
    ).select_related(
        "vm__artist", "vm__host", "current_profile", "suggested_profile", "resize_request",
    ).order_by("vm__name", "id")


def suggestion_summary() -> dict:
    """Fleet-wide figures of the suggestions shown by default (those not dismissed): how many of
    each action, how many are dismissed, when they were last computed, and the GPUs the resizes
    would free and need if each were applied on its own (`gpus_delta` is each one's effect on
    today's fleet, so the totals are not what applying them all together would do). One query."""
    shown = ~DISMISSED
    resize = shown & Q(action__in=[SuggestionAction.UPSIZE, SuggestionAction.DOWNSIZE])
    figures = Suggestion.objects.aggregate(
        **{action: Count("pk", filter=shown & Q(action=action)) for action in SuggestionAction.values},
        dismissed=Count("pk", filter=DISMISSED),
        gpus_freed=Sum("gpus_delta", filter=resize & Q(gpus_delta__lt=0)),
        gpus_needed=Sum("gpus_delta", filter=resize & Q(gpus_delta__gt=0)),
        computed_at=Max("computed_at"),
    )
    figures["gpus_freed"] = -(figures["gpus_freed"] or 0)
    figures["gpus_needed"] = figures["gpus_needed"] or 0
    figures["gpus_net_freed"] = figures["gpus_freed"] - figures["gpus_needed"]
    figures["total"] = sum(figures[action] for action in SuggestionAction.values) + figures["dismissed"]
    return figures

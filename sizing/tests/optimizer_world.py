"""Small fleets for the optimizer-run tests, built through `fleet.services` like real ones."""

from __future__ import annotations

from types import SimpleNamespace

from django.utils import timezone

from fleet import services
from fleet.models import ResizeRequest, Vgpu
from fleet.tests.factories import GpuFactory, HostFactory, VirtualMachineFactory, profile
from sizing.models import OptimizerRun, OptimizerStatus, Suggestion, SuggestionAction


def fragmented_fleet() -> SimpleNamespace:
    """One host with two Quadro RTX 6000 GPUs, each holding one RTX6000-12Q: two half-full GPUs
    where one would do (the sizing guide puts two 12Q artists on one GPU)."""
    host = HostFactory(name="studio-01")
    gpu_a = GpuFactory(host=host, pci_bus_id="00000000:3B:00.0")
    gpu_b = GpuFactory(host=host, pci_bus_id="00000000:5E:00.0")
    vm_a = VirtualMachineFactory(name="ws-modeling-a")
    vm_b = VirtualMachineFactory(name="ws-modeling-b")
    q12 = profile("RTX6000-12Q")
    services.place_vgpu(vm_a, gpu_a, q12)
    services.place_vgpu(vm_b, gpu_b, q12)
    return SimpleNamespace(host=host, gpu_a=gpu_a, gpu_b=gpu_b, vm_a=vm_a, vm_b=vm_b, q12=q12)


def fleet_with_request(user=None) -> SimpleNamespace:
    """The fragmented fleet plus an animator on a third GPU (24Q) who asked to go down to 12Q:
    with the request, three GPUs' worth of work fits on two."""
    world = fragmented_fleet()
    world.gpu_c = GpuFactory(host=world.host, pci_bus_id="00000000:AF:00.0")
    world.vm_c = VirtualMachineFactory(name="ws-anim-c")
    services.place_vgpu(world.vm_c, world.gpu_c, profile("RTX6000-24Q"))
    world.request = ResizeRequest.objects.create(
        vm=world.vm_c, current_profile=profile("RTX6000-24Q"), requested_profile=world.q12, requested_vgpus=1,
        reason="Lighter shots this month", requested_by=user,
    )
    return world


def suggestion(vm, suggested, action=SuggestionAction.DOWNSIZE, *, vgpus=None, dismissed=False) -> Suggestion:
    """A right-sizing suggestion as the refresh task stores it (figures left out)."""
    now = timezone.now()
    current = Vgpu.objects.filter(vm=vm).select_related("profile").first()
    return Suggestion.objects.create(
        vm=vm, current_profile=current.profile if current else None, suggested_profile=suggested,
        suggested_vgpus=vgpus, action=action, reason="test", evidence={}, evidence_key="k1",
        dismissed_key="k1" if dismissed else "", window_start=now, window_end=now, computed_at=now,
    )


def placements() -> list[tuple[str, str, str, int]]:
    """Every vGPU as (VM, GPU bus id, profile, placement ID), to compare the fleet before and after."""
    return sorted(Vgpu.objects.values_list("vm__name", "gpu__pci_bus_id", "profile__name", "placement_id"))


def gpus_in_use() -> int:
    return Vgpu.objects.values("gpu_id").distinct().count()


def make_runs(count: int, user=None, status=OptimizerStatus.DONE) -> list[OptimizerRun]:
    """Finished runs with a summary, as the list pages show them."""
    summary = {"gpus_before": 3, "gpus_after": 2, "lower_bound": 2, "gpus_freed": 1, "gpus_newly_used": 0,
               "vms_moved": 1, "unplaced": 0, "seconds": 0.01}
    return [
        OptimizerRun.objects.create(status=status, progress=1.0, stage="Done", created_by=user,
                                    params={"changes": []}, result={"summary": summary, "plan": {}})
        for _ in range(count)
    ]


def failing_gpu_fleet() -> SimpleNamespace:
    """studio-01 with three Quadro RTX 6000: the failing one full (two RTX6000-12Q, ws-fx-a and
    ws-fx-b), two others half full (ws-comp-c, ws-comp-d). A drain puts the failing GPU's VMs in
    the free halves; consolidation alone would put ws-comp-c and ws-comp-d together instead."""
    host = HostFactory(name="studio-01")
    failing = GpuFactory(host=host, pci_bus_id="00000000:3B:00.0")
    half_c = GpuFactory(host=host, pci_bus_id="00000000:5E:00.0")
    half_d = GpuFactory(host=host, pci_bus_id="00000000:AF:00.0")
    q12 = profile("RTX6000-12Q")
    leaving = [VirtualMachineFactory(name="ws-fx-a"), VirtualMachineFactory(name="ws-fx-b")]
    for vm in leaving:
        services.place_vgpu(vm, failing, q12)
    staying = [VirtualMachineFactory(name="ws-comp-c"), VirtualMachineFactory(name="ws-comp-d")]
    services.place_vgpu(staying[0], half_c, q12)
    services.place_vgpu(staying[1], half_d, q12)
    return SimpleNamespace(host=host, failing=failing, half_c=half_c, half_d=half_d, leaving=leaving,
                           staying=staying, q12=q12)

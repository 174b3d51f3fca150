"""A small fleet for the density planner's "from measurements" tests, with a right-sizing
suggestion of each kind, and the request bodies the API and page tests share."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from types import SimpleNamespace

from fleet import services
from fleet.models import VirtualMachine
from fleet.tests.factories import GpuFactory, HostFactory, VirtualMachineFactory, gpu_model, profile
from sizing.models import Suggestion, SuggestionAction

NOW = datetime(2026, 11, 20, 12, tzinfo=UTC)
GUIDE_WORKFLOWS = ("modeling", "shading", "animation", "lighting")


def guide_server(**overrides) -> dict:
    """The sizing guide's server: 3 x Quadro RTX 6000, 2 x Xeon Gold 6154 (72 threads), 384 GiB."""
    return {"gpu_model": gpu_model("Quadro RTX 6000").pk, "gpus": 3, "cpu_threads": 72, "ram_gib": 384, **overrides}


def suggest(vm: VirtualMachine, action: str, suggested: str | None = None, *, vgpus: int | None = None,
            dismissed: bool = False, reason: str = "", **guest) -> Suggestion:
    """A suggestion row as the hourly refresh would write it (the planner only reads them), in
    place of the VM's; `guest`: its vCPU and RAM advice (cpu_action, suggested_vcpus, ...)."""
    current = vm.vgpus.first().profile
    key = f"key-{vm.pk}-{action}"
    suggestion, _ = Suggestion.objects.update_or_create(vm=vm, defaults={
        "current_profile": current, "suggested_profile": profile(suggested) if suggested else None,
        "suggested_vgpus": vgpus, "action": action, "reason": reason, "evidence": {}, "evidence_key": key,
        "dismissed_key": key if dismissed else "", "window_start": NOW - timedelta(days=14), "window_end": NOW,
        "computed_at": NOW, **guest,
    })
    return suggestion


def measured_fleet() -> SimpleNamespace:
    """host-a (2 x Quadro RTX 6000): ws-down (12Q, downsize to 8Q suggested), ws-dismissed (12Q,
    upsize to 24Q dismissed), ws-keep (24Q, keep); host-b (1 x RTX 6000): ws-new (8Q, no
    suggestion yet), ws-heavy (24Q, upsize to 2 x 24Q); ws-idle holds no vGPU."""
    host_a, host_b = HostFactory(name="host-a"), HostFactory(name="host-b")
    a0 = GpuFactory(host=host_a, pci_bus_id="00000000:3B:00.0")
    a1 = GpuFactory(host=host_a, pci_bus_id="00000000:5E:00.0")
    b0 = GpuFactory(host=host_b, pci_bus_id="00000000:3B:00.0")
    b1 = GpuFactory(host=host_b, pci_bus_id="00000000:5E:00.0")
    vms = {}
    for name, gpu, profile_name, vcpus, ram_gib in (
        ("ws-down", a0, "RTX6000-12Q", 6, 24),
        ("ws-dismissed", a0, "RTX6000-12Q", 8, 32),
        ("ws-keep", a1, "RTX6000-24Q", 12, 64),
        ("ws-new", b0, "RTX6000-8Q", 4, 16),
        ("ws-heavy", b1, "RTX6000-24Q", 16, 96),
    ):
        vm = VirtualMachineFactory(name=name, vcpus=vcpus, ram_gib=ram_gib)
        services.place_vgpu(vm, gpu, profile(profile_name))
        vms[name] = vm
    suggest(vms["ws-down"], SuggestionAction.DOWNSIZE, "RTX6000-8Q", reason="p95 4.1 GiB = 34% of 12 GiB")
    suggest(vms["ws-dismissed"], SuggestionAction.UPSIZE, "RTX6000-24Q", dismissed=True)
    suggest(vms["ws-keep"], SuggestionAction.KEEP)
    suggest(vms["ws-heavy"], SuggestionAction.UPSIZE, "RTX6000-24Q", vgpus=2, reason="p95 23 GiB = 96% of 24 GiB")
    VirtualMachineFactory(name="ws-idle")
    return SimpleNamespace(host_a=host_a, host_b=host_b, vms=vms)


def more_vms(host_name: str, count: int) -> None:
    """`count` more VMs with one RTX6000-4Q each on a new host of 2 x Quadro RTX 6000."""
    host = HostFactory(name=host_name, cpu_threads=512, ram_gib=4096)
    gpus = [GpuFactory(host=host), GpuFactory(host=host)]
    for index in range(count):
        vm = VirtualMachineFactory(name=f"{host_name}-vm-{index:02d}", vcpus=4, ram_gib=16)
        services.place_vgpu(vm, gpus[index % 2], profile("RTX6000-4Q"))
        if index % 3 == 0:
            suggest(vm, SuggestionAction.DOWNSIZE, "RTX6000-2Q")

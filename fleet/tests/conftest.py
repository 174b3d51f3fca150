"""Fixtures of the fleet API tests: a small fleet with two artists on two hosts."""

from types import SimpleNamespace

import pytest

from fleet import services
from fleet.tests.factories import BUS, ArtistFactory, GpuFactory, HostFactory, VirtualMachineFactory, profile


@pytest.fixture
def fleet_world(artist):
    """Ana (the `artist` fixture, signed in by `artist_api`) and Bob, each with one VM holding one
    RTX6000-12Q vGPU, on separate hosts. Objects are reloaded so no test sees stale caches."""
    bob = ArtistFactory(name="Bob Artist")
    host_a = HostFactory(name="host-a")
    host_b = HostFactory(name="host-b")
    gpu_a = GpuFactory(host=host_a, pci_bus_id="00000000:3B:00.0")
    gpu_b = GpuFactory(host=host_b, pci_bus_id="00000000:3B:00.0")
    vm_a = VirtualMachineFactory(name="ws-ana", artist=artist)
    vm_b = VirtualMachineFactory(name="ws-bob", artist=bob)
    q12 = profile("RTX6000-12Q")
    vgpu_a = services.place_vgpu(vm_a, gpu_a, q12)
    vgpu_b = services.place_vgpu(vm_b, gpu_b, q12)
    return SimpleNamespace(
        ana=artist, bob=bob, host_a=host_a, host_b=host_b, gpu_a=gpu_a, gpu_b=gpu_b,
        vm_a=vm_a, vm_b=vm_b, vgpu_a=vgpu_a, vgpu_b=vgpu_b, profile_12q=q12,
    )


@pytest.fixture
def rtx():
    """A host with a Quadro RTX 6000 holding two RTX6000-8Q (8192 MiB left) and an empty one."""
    host = HostFactory(name="rtx-host")
    gpu = GpuFactory(host=host, pci_bus_id=BUS)
    for name in ("ws-8q-a", "ws-8q-b"):
        services.place_vgpu(VirtualMachineFactory(name=name), gpu, profile("RTX6000-8Q"))
    empty = GpuFactory(host=host, pci_bus_id="00000000:5E:00.0")
    return SimpleNamespace(host=host, gpu=gpu, empty=empty, vm=VirtualMachineFactory(name="ws-new"))

"""Helpers of the rollup, retention, metrics API and exposition tests: a small fleet and raw
samples written straight through the ORM, at times the tests choose."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from types import SimpleNamespace

from fleet import services
from fleet.tests.factories import ArtistFactory, GpuFactory, HostFactory, VirtualMachineFactory, gpu_model, profile
from telemetry.models import GpuSample, VgpuSample

#: A Monday 10:00 UTC: the start of a 5-minute and of an hourly bucket.
T0 = datetime(2026, 3, 2, 10, 0, tzinfo=UTC)
L40S = "NVIDIA L40S"


def at(seconds: float) -> datetime:
    return T0 + timedelta(seconds=seconds)


def gpu_samples(gpu, start: datetime, count: int, every_s: int = 10, **fields) -> list[GpuSample]:
    """`count` samples of `gpu` every `every_s` seconds from `start`. A field given as a list is
    taken in order (one value a sample), a callable is called with the sample's index, anything
    else is the same in every sample."""
    rows = []
    for i in range(count):
        values = {name: _value(value, i) for name, value in fields.items()}
        rows.append(GpuSample(gpu=gpu, ts=start + timedelta(seconds=i * every_s), **values))
    return GpuSample.objects.bulk_create(rows)


def vgpu_samples(vm, gpu, start: datetime, count: int, every_s: int = 10, **fields) -> list[VgpuSample]:
    """Like `gpu_samples`, for one vGPU of `vm` on `gpu`."""
    rows = []
    for i in range(count):
        values = {name: _value(value, i) for name, value in fields.items()}
        rows.append(VgpuSample(vm=vm, gpu=gpu, ts=start + timedelta(seconds=i * every_s), **values))
    return VgpuSample.objects.bulk_create(rows)


def _value(value, i):
    if callable(value):
        return value(i)
    if isinstance(value, list):
        return value[i]
    return value


def studio(artist=None) -> SimpleNamespace:
    """Two L40S GPUs on host `render-01`: `ws-ana` (of `artist`, or a new artist "Ana") holds an
    L40S-12Q on each (multi-vGPU), `ws-bob` (artist Bob) an L40S-12Q on the second GPU, and the
    GPU `gpu_idle` on host `render-02` holds nothing."""
    host = HostFactory(name="render-01")
    gpu_1 = GpuFactory(host=host, gpu_model=gpu_model(L40S), pci_bus_id="00000000:3B:00.0", uuid="GPU-aaaa-0001")
    gpu_2 = GpuFactory(host=host, gpu_model=gpu_model(L40S), pci_bus_id="00000000:5E:00.0", uuid="GPU-aaaa-0002")
    gpu_idle = GpuFactory(host=HostFactory(name="render-02"), gpu_model=gpu_model(L40S),
                          pci_bus_id="00000000:3B:00.0", uuid="GPU-bbbb-0001")
    ana = artist or ArtistFactory(name="Ana")
    bob = ArtistFactory(name="Bob")
    vm_ana = VirtualMachineFactory(name="ws-ana", artist=ana)
    vm_bob = VirtualMachineFactory(name="ws-bob", artist=bob)
    q12 = profile("L40S-12Q")
    services.place_vgpu(vm_ana, gpu_1, q12)
    services.place_vgpu(vm_ana, gpu_2, q12)
    services.place_vgpu(vm_bob, gpu_2, q12)
    return SimpleNamespace(host=host, gpu_1=gpu_1, gpu_2=gpu_2, gpu_idle=gpu_idle, ana=ana, bob=bob,
                           vm_ana=vm_ana, vm_bob=vm_bob, q12=q12)

"""Builders shared by the ingest tests: readings, reports, agents and a small L40S fleet."""

from __future__ import annotations

import uuid as uuid_lib
from pathlib import Path
from types import SimpleNamespace

from fleet import services
from fleet.tests.factories import GpuFactory, HostFactory, VirtualMachineFactory, gpu_model, profile
from telemetry.models import Agent, AgentKind
from telemetry.payload import GpuReading, Report, VgpuReading

OWN_FIXTURES = Path(__file__).parent / "fixtures"
# Verbatim copies of the real captures of ../shared/fixtures/nvidia-smi, kept in the
# repository so `make test` runs in a clone that has nothing beside it.
SHARED_CAPTURES = OWN_FIXTURES / "nvidia-smi"
SYNTHETIC_CAPTURES = {"l40s-vgpu-host-v13.xml", "l40s-2q-guest-v13.xml"}

T0 = 1_780_000_000.0  # 2026-05-28 20:26:40 UTC, a whole second


def gpu_reading(uuid: str, **fields) -> GpuReading:
    values = dict(
        uuid=uuid, index=0, name="NVIDIA L40S", pci_bus_id="00000000:41:00.0", fb_total_mib=46068,
        virtualization_mode="vgpu_host", util_gpu=38, util_mem=21, fb_used_mib=14336, enc_util=4, dec_util=0,
        temp_c=52, power_w=161.2, sm_clock_mhz=2490, vgpus=[],
    )
    values.update(fields)
    return GpuReading(**values)


def vgpu_reading(vm_uuid: str | None, vm_name: str | None = None, type_name: str = "NVIDIA L40S-12Q",
                 **fields) -> VgpuReading:
    values = dict(vgpu_uuid=str(uuid_lib.uuid4()), vm_uuid=vm_uuid, vm_name=vm_name, type_name=type_name,
                  fb_used_mib=9011, util_gpu=30, util_mem=15, enc_util=4, dec_util=0)
    values.update(fields)
    return VgpuReading(**values)


def report(hostname: str, gpus: list[GpuReading], collected_at: float = T0, **fields) -> Report:
    return Report(hostname=hostname, backend=fields.pop("backend", "nvml"), collected_at=collected_at, gpus=gpus,
                  **fields)


def make_agent(name: str, host=None, kind: str = AgentKind.NVML, **fields) -> Agent:
    url = "" if kind == AgentKind.NVIDIA_SMI else f"http://{name}:9410"
    return Agent.objects.create(name=name, kind=kind, url=url, host=host, **fields)


def l40s_world() -> SimpleNamespace:
    """Host render-01 with one L40S carrying VM ws-lighting-01's L40S-12Q, and an empty second L40S;
    VM ws-layout-02 with an L40S-4Q on the second GPU; host render-02 with its own L40S."""
    model = gpu_model("NVIDIA L40S")
    host = HostFactory(name="render-01")
    other_host = HostFactory(name="render-02")
    gpu = GpuFactory(host=host, gpu_model=model, pci_bus_id="00000000:41:00.0",
                     uuid="GPU-0c4f3a52-8f1e-4d6b-9a07-5b2d1e3c4f60")
    gpu_2 = GpuFactory(host=host, gpu_model=model, pci_bus_id="00000000:61:00.0",
                       uuid="GPU-1d5a4b63-9a2f-4e7c-8b18-6c3e2f4d5a71")
    far_gpu = GpuFactory(host=other_host, gpu_model=model, pci_bus_id="00000000:41:00.0",
                         uuid="GPU-2e6b5c74-ab30-4f8d-9c29-7d4f3a5e6b82")
    lighting = VirtualMachineFactory(name="ws-lighting-01", uuid=uuid_lib.UUID("6f1d5e8a-2b7c-4c1d-9e3f-0a1b2c3d4e5f"))
    layout = VirtualMachineFactory(name="ws-layout-02")
    idle = VirtualMachineFactory(name="ws-idle-03")
    vgpu = services.place_vgpu(lighting, gpu, profile("L40S-12Q"))
    layout_vgpu = services.place_vgpu(layout, gpu_2, profile("L40S-4Q"))
    agent = make_agent("agent-render-01", host=host)
    return SimpleNamespace(host=host, other_host=other_host, gpu=gpu, gpu_2=gpu_2, far_gpu=far_gpu,
                           lighting=lighting, layout=layout, idle=idle, vgpu=vgpu, layout_vgpu=layout_vgpu,
                           agent=agent, model=model)

"""A simulated hypervisor for a host of the inventory: the demo's, and tests' starting point.

`sim_state_for(host)` writes down what the host would run if the inventory were exact: a
domain per VM on it (same UUID, name, vCPUs and RAM, running), an mdev device per vGPU on the
right GPU with the type named as a current driver names the profile ("NVIDIA L40S-12Q"), and
per GPU the vGPU types of its model from the catalog with their maximum instances. A sync right
after `seed_host` finds no difference: the device ids it invents are recorded on the vGPUs.

Each domain's guest works as its artist's workflow says (`telemetry.guest_sim`, the demo's one
model of its guests), and the host's contention grows with its number of VMs
(`guest_sim.contention_for`). One guest of the whole inventory has no balloon driver, so the
product shows a VM whose memory use is not reported (`fleet.demo.no_balloon_vm_id`). The demo's
back-filled history (`telemetry.history`) gives each VM the same inputs, so it stores what
reading these hosts would have stored.
"""

from __future__ import annotations

import uuid

from fleet import services as fleet_services
from fleet.choices import GpuMode, Workflow
from fleet.demo import no_balloon_vm_id
from fleet.hypervisor_link import SIM_SCHEME, is_simulated
from fleet.models import Gpu, Host, Vgpu, VgpuProfile, VirtualMachine
from hypervisors import services
from hypervisors.backends import sim
from hypervisors.backends.base import HypervisorError
from hypervisors.discovery import MIB_PER_GIB
from hypervisors.matching import type_name_for
from telemetry import guest_sim

# Fixed, so a host's device ids come out the same each time it is seeded.
DEVICE_NAMESPACE = uuid.UUID("0f7c2d4e-8b1a-4e55-9c3d-6a2b1e0d4f71")


def sim_uri(host: Host) -> str:
    return f"{SIM_SCHEME}://{host.name}"


def sim_state_for(host: Host) -> tuple[dict, dict[int, str]]:
    """The simulated hypervisor's state for `host`, and the device ids given to vGPUs that had
    none ({vgpu id: device id})."""
    state = sim.empty_state(host.name)
    gpus = list(Gpu.objects.filter(host=host).select_related("gpu_model").order_by("pci_bus_id"))
    profiles: dict[int, list[tuple[str, int]]] = {}
    for name, model_id, max_per_gpu in VgpuProfile.objects.values_list("name", "gpu_model_id", "max_per_gpu"):
        profiles.setdefault(model_id, []).append((type_name_for(name), max_per_gpu))
    for gpu in gpus:
        types = profiles.get(gpu.gpu_model_id, []) if gpu.mode == GpuMode.VGPU else []
        sim.add_gpu(state, gpu.pci_bus_id, gpu.gpu_model.name, types)

    new_ids: dict[int, str] = {}
    devices: dict[int, list[str]] = {}
    vgpus = Vgpu.objects.filter(gpu__host=host).select_related("vm", "gpu", "profile").order_by("vm_id", "pk")
    for vgpu in vgpus:
        device_id = vgpu.device_id or str(uuid.uuid5(
            DEVICE_NAMESPACE, f"{host.name}/{vgpu.vm.uuid}/{vgpu.gpu.pci_bus_id}/{vgpu.placement_id}"))
        if not vgpu.device_id:
            new_ids[vgpu.pk] = device_id
        sim.add_device(state, vgpu.gpu.pci_bus_id, type_name_for(vgpu.profile.name), device_id)
        devices.setdefault(vgpu.vm_id, []).append(device_id)
    without_balloon = no_balloon_vm_id()
    vms = list(VirtualMachine.objects.filter(host=host).select_related("artist").order_by("name"))
    for vm in vms:
        sim.add_domain(state, str(vm.uuid), vm.name, vm.vcpus, vm.ram_gib * MIB_PER_GIB, devices.get(vm.pk, []),
                       workflow=vm.artist.workflow if vm.artist else Workflow.OTHER.value,
                       balloon=vm.pk != without_balloon)
    state["cpu_contention"] = guest_sim.contention_for(len(vms))
    return state, new_ids


def seed_host(host: Host) -> sim.SimBackend:
    """Write the simulated hypervisor of `host` (its own sim:// URI, or sim://<name> when it has
    none) from the inventory, replacing what was there, and record the device ids it gave."""
    uri = host.hypervisor_uri if host.hypervisor_uri and is_simulated(host.hypervisor_uri) else sim_uri(host)
    backend = sim.SimBackend.open(uri)
    state, new_ids = sim_state_for(host)
    backend.seed(state)
    for vgpu_id, device_id in new_ids.items():
        services.record_device_id(vgpu_id, device_id)
    return backend


def link_demo_hosts(hosts=None, *, reseed: bool = False) -> list[str]:
    """Link every host of `hosts` (all when None) that has no hypervisor URI to sim://<its name>,
    and seed the simulated hypervisors that have no state yet (every one with `reseed`). Hosts
    linked to a real hypervisor are left as they are. Returns one line per host."""
    lines = []
    for host in (hosts if hosts is not None else Host.objects.order_by("name")):
        if host.hypervisor_uri and not is_simulated(host.hypervisor_uri):
            lines.append(f"{host.name}: linked to {host.hypervisor_uri}, left as it is")
            continue
        try:
            backend = sim.SimBackend.open(host.hypervisor_uri or sim_uri(host))
        except HypervisorError as exc:
            lines.append(f"{host.name}: not linked: {exc}")
            continue
        if not host.hypervisor_uri:
            host = fleet_services.update_host(host, hypervisor_uri=backend.uri)
        if backend.exists() and not reseed:
            lines.append(f"{host.name}: {backend.uri} (simulated, state kept)")
            continue
        backend = seed_host(host)
        lines.append(f"{host.name}: {backend.uri} (simulated, seeded: {len(backend.list_domains())} domains)")
    return lines

"""Simulated agents for the demo fleet: scenario files from the inventory, Agent rows, token files.

`write_demo_agents()` is what `manage.py demo_agents` runs, and `manage.py runfleet` starts the
agents it lists (all of them in one process, `python -m telemetry.agent.simfleet`). Every host
of the demo gets an agent, so no GPU or VM of the demo is left without figures. Each scenario
is built from the inventory rows themselves (GPU UUIDs and PCI ids, VM UUIDs and names,
profiles, artists' workflows) and the catalog's board limits (power limit and highest SM clock
of each GPU model), so the samples the simulated agents serve map onto the demo's GPUs and
VMs and stay within what those boards can draw and run at; a second run writes the same files
and keeps each agent's token (tokens are derived from the agent's salt, which only a rotation
changes).
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass
from pathlib import Path
from urllib.parse import urlsplit

from django.conf import settings
from django.db import transaction

from fleet.catalog import catalog_model
from fleet.choices import GpuMode
from fleet.demo import POC_HOST, cpu_bound_vm_id
from fleet.hypervisor_link import is_simulated
from fleet.models import Gpu, Host, Vgpu
from telemetry.agent.scenario import build_scenario, dump_scenario
from telemetry.models import Agent, AgentKind

DEFAULT_DIR = Path(settings.BASE_DIR) / "var" / "agents"
DEFAULT_BASE_PORT = 9411
DEFAULT_LISTEN_HOST = "127.0.0.1"
MANIFEST_NAME = "agents.json"


class DemoAgentsError(Exception):
    """The inventory has no demo fleet to simulate (seed_demo has not run), or a host is unknown."""


@dataclass(frozen=True)
class DemoAgent:
    """One simulated agent as runfleet starts it."""

    name: str
    host: str
    listen: str
    url: str
    token_file: str
    scenario: str
    gpus: int
    vgpus: int


def demo_hosts() -> list[Host]:
    """Every host with a GPU in vGPU mode, the proof-of-concept host first, then by name: the
    hosts a simulated agent can report (a host whose GPUs all go whole to VMs has nothing its
    own driver sees)."""
    hosts = list(Host.objects.filter(gpus__mode=GpuMode.VGPU).distinct().order_by("name"))
    if not hosts:
        raise DemoAgentsError("no demo hosts with GPUs in vGPU mode: run `manage.py seed_demo` first")
    return sorted(hosts, key=lambda host: host.name != POC_HOST)


def host_scenario(host: Host, timezone: str | None = None) -> dict:
    """The sim scenario of `host` from its inventory rows. Passthrough GPUs are left out: the
    host's driver does not see a GPU handed whole to a VM, so no agent would report it. The
    demo's CPU-bound animator (`fleet.demo.cpu_bound_vm_id`) gets a light GPU."""
    cpu_bound = cpu_bound_vm_id()
    gpus = Gpu.objects.filter(host=host, mode=GpuMode.VGPU).select_related("gpu_model").order_by("pci_bus_id")
    vgpus = (
        Vgpu.objects.filter(gpu__in=gpus).select_related("profile", "vm__artist").order_by("gpu_id", "placement_id")
    )
    by_gpu: dict[int, list[Vgpu]] = {}
    for vgpu in vgpus:
        by_gpu.setdefault(vgpu.gpu_id, []).append(vgpu)
    scenario = build_scenario(
        host.name,
        [
            {
                "uuid": gpu.uuid or None,
                "name": gpu.gpu_model.name,
                "pci_bus_id": gpu.pci_bus_id,
                "fb_total_mib": gpu.gpu_model.fb_mib,
                "virtualization_mode": "vgpu_host",
                **board_limits(gpu.gpu_model.name),
                "vgpus": [
                    {
                        "vm_name": vgpu.vm.name,
                        "vm_uuid": str(vgpu.vm.uuid),
                        "type_name": vgpu.profile.name,
                        "fb_mib": vgpu.profile.fb_mib,
                        "workflow": vgpu.vm.artist.workflow if vgpu.vm.artist else "other",
                        "user_type": vgpu.vm.artist.user_type if vgpu.vm.artist else "medium",
                        "cpu_bound": vgpu.vm_id == cpu_bound,
                    }
                    for vgpu in by_gpu.get(gpu.pk, [])
                ],
            }
            for gpu in gpus
        ],
        timezone=timezone,
    )
    if is_simulated(host.hypervisor_uri):
        # The agent reports what the host's simulated hypervisor runs (sim_backend.following_hypervisor).
        name = urlsplit(host.hypervisor_uri).netloc
        scenario["hypervisor_state"] = str(Path(settings.HYPERVISOR_SIM_DIR) / f"{name}.json")
    return scenario


def board_limits(model_name: str) -> dict:
    """The scenario keys that hold a simulated GPU of `model_name` within its board's limits
    (catalog); none for a model the catalog lacks (the sim's defaults apply)."""
    model = catalog_model(model_name)
    if model is None:
        return {}
    return {"power_limit_w": model.power_limit_w, "max_sm_clock_mhz": model.max_sm_clock_mhz}


def _write_private(path: Path, text: str) -> None:
    """Write `text` to `path` readable by its owner only (the agent warns about anything wider)."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as out:
        out.write(text)
    os.chmod(path, 0o600)


def write_demo_agents(
    hosts: list[Host] | None = None,
    *,
    out_dir: Path = DEFAULT_DIR,
    base_port: int = DEFAULT_BASE_PORT,
    listen_host: str = DEFAULT_LISTEN_HOST,
    url_host: str | None = None,
) -> list[DemoAgent]:
    """Write a scenario and a token file per host, register its Agent (kind nvml: the sim serves
    protocol v1 like the real agent) and write the manifest runfleet reads; safe to run again.

    `url_host` is the name the collector reaches the agents by, when it differs from the
    address they listen on (docker-compose: listen on 0.0.0.0, polled as agent-sim)."""
    hosts = hosts if hosts is not None else demo_hosts()
    out_dir.mkdir(parents=True, exist_ok=True)
    os.chmod(out_dir, 0o700)
    timezone = settings.TIME_ZONE
    written = []
    with transaction.atomic():
        for offset, host in enumerate(hosts):
            scenario = host_scenario(host, timezone=timezone)
            port = base_port + offset
            url = f"http://{url_host or listen_host}:{port}"
            agent = Agent.objects.filter(name=host.name).first() or Agent(name=host.name)
            agent.kind, agent.url, agent.host, agent.enabled = AgentKind.NVML, url, host, True
            agent.save()
            scenario_path = out_dir / f"{host.name}.json"
            token_path = out_dir / f"{host.name}.token"
            scenario_path.write_text(dump_scenario(scenario), encoding="utf-8")
            _write_private(token_path, agent.token + "\n")
            written.append(DemoAgent(
                name=agent.name, host=host.name, listen=f"{listen_host}:{port}", url=url,
                token_file=str(token_path), scenario=str(scenario_path), gpus=len(scenario["gpus"]),
                vgpus=sum(len(gpu["vgpus"]) for gpu in scenario["gpus"]),
            ))
    (out_dir / MANIFEST_NAME).write_text(json.dumps([asdict(a) for a in written], indent=2) + "\n", encoding="utf-8")
    return written


def read_manifest(out_dir: Path = DEFAULT_DIR) -> list[DemoAgent]:
    """The agents the last `demo_agents` run wrote; [] when it has not run."""
    try:
        items = json.loads((out_dir / MANIFEST_NAME).read_text(encoding="utf-8"))
    except FileNotFoundError:
        return []
    return [DemoAgent(**item) for item in items]

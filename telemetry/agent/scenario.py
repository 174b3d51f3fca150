"""Scenario files of the simulated agent: build them from plain inventory data, validate, load.

A scenario describes one host as the sim backend should report it:
`{"hostname", "timezone"?, "gpus": [{"uuid", "name", "pci_bus_id", "fb_total_mib",
"virtualization_mode"?, "power_limit_w"?, "max_sm_clock_mhz"?, "scheduler"?,
"vgpus": [{"vgpu_uuid", "vm_uuid", "vm_name", "type_name", "fb_mib", "workflow", "user_type",
"mdev_uuid"?, "cpu_bound"?}]}]}`. `mdev_uuid`, where given, is reported as the instance's mdev UUID
(null without). `cpu_bound` true: the VM's work waits on one CPU core, so its GPU stays light.
`timezone` sets the studio's working hours: an IANA name, "UTC" or "UTC+09:00"; without it
the agent machine's local time.

`build_scenario` exists so the Django side can turn its inventory into scenario files
(one per host, for the demo fleet and docker-compose) without this package importing
Django: it takes lists of dicts and fills in stable UUIDs and PCI addresses where the
inventory has none, so regenerating a scenario gives the same identities and the
collected history keeps matching the same rows.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

WORKFLOWS = (
    "modeling",
    "texturing",
    "shading",
    "animation",
    "lighting",
    "rendering",
    "layout",
    "fx",
    "compositing",
    "other",
)
USER_TYPES = ("light", "medium", "heavy")
VIRTUALIZATION_MODES = ("none", "passthrough", "vgpu_guest", "vgpu_host", "vsga_host")

# Namespace of the UUIDs generated for inventory rows that have none: uuid5 of a stable
# name, so the same host/GPU/VM always gets the same UUID across regenerations.
_NAMESPACE = uuid.UUID("6f6c2a0e-8f0e-4c55-9a55-7e3d1c1f4a10")

POC_SCENARIO_PATH = Path(__file__).with_name("scenarios") / "poc.json"


class ScenarioError(ValueError):
    """A scenario that the sim backend cannot serve; the message names the offending entry."""


def _stable_uuid(*parts: object) -> str:
    return str(uuid.uuid5(_NAMESPACE, "/".join(str(p) for p in parts)))


def _pci_bus_id(index: int) -> str:
    """A plausible, unique PCI address per GPU slot (NVML's 8-digit domain form), 8 GPUs per domain."""
    return f"{index // 8:08X}:{0x1B + 0x20 * (index % 8):02X}:00.0"


def build_scenario(
    hostname: str,
    gpus: Iterable[Mapping[str, Any]],
    *,
    timezone: str | None = None,
) -> dict[str, Any]:
    """Return a validated scenario dict for one host from plain inventory data.

    `gpus` items: {"name", "fb_total_mib", "uuid"?, "pci_bus_id"?, "virtualization_mode"?,
    "power_limit_w"?, "max_sm_clock_mhz"?, "scheduler"?, "vgpus": [{"vm_name", "type_name",
    "fb_mib", "workflow"?, "user_type"?, "vm_uuid"?, "vgpu_uuid"?, "mdev_uuid"?, "cpu_bound"?}]}. Missing identities
    are derived from the hostname, GPU index and VM name (stable across calls); a VM that
    has vGPUs on several GPUs (multi-vGPU) keeps one vm_uuid because it is derived from
    its name. Raises ScenarioError when the result would be inconsistent.
    """
    try:
        built_gpus = [_build_gpu(hostname, index, gpu) for index, gpu in enumerate(gpus)]
    except KeyError as exc:
        raise ScenarioError(f"host {hostname!r}: a GPU or vGPU entry lacks {exc}") from None
    scenario: dict[str, Any] = {"hostname": hostname}
    if timezone:
        scenario["timezone"] = timezone
    scenario["gpus"] = built_gpus
    return validate_scenario(scenario)


def _build_gpu(hostname: str, index: int, gpu: Mapping[str, Any]) -> dict[str, Any]:
    """One scenario GPU with its vGPUs, identities filled in."""
    gpu_uuid = gpu.get("uuid") or "GPU-" + _stable_uuid(hostname, "gpu", index)
    built = {
        "uuid": gpu_uuid,
        "name": gpu["name"],
        "pci_bus_id": gpu.get("pci_bus_id") or _pci_bus_id(index),
        "fb_total_mib": int(gpu["fb_total_mib"]),
    }
    for optional in ("virtualization_mode", "power_limit_w", "max_sm_clock_mhz", "scheduler"):
        if gpu.get(optional) is not None:
            built[optional] = gpu[optional]
    built["vgpus"] = [
        {
            "vgpu_uuid": vgpu.get("vgpu_uuid") or _stable_uuid(hostname, "vgpu", gpu_uuid, position),
            "vm_uuid": vgpu.get("vm_uuid") or _stable_uuid(hostname, "vm", vgpu["vm_name"]),
            "vm_name": vgpu["vm_name"],
            "type_name": vgpu["type_name"],
            "fb_mib": int(vgpu["fb_mib"]),
            "workflow": vgpu.get("workflow") or "other",
            "user_type": vgpu.get("user_type") or "medium",
            **({"mdev_uuid": vgpu["mdev_uuid"]} if vgpu.get("mdev_uuid") else {}),
            **({"cpu_bound": True} if vgpu.get("cpu_bound") else {}),
        }
        for position, vgpu in enumerate(gpu.get("vgpus", ()))
    ]
    return built


def build_scenarios(hosts: Iterable[Mapping[str, Any]]) -> dict[str, dict[str, Any]]:
    """Return {hostname: scenario} for many hosts: items are {"hostname", "gpus", "timezone"?}.

    One agent serves one host, so a fleet is one scenario file per host.
    """
    scenarios: dict[str, dict[str, Any]] = {}
    for host in hosts:
        name = host["hostname"]
        if name in scenarios:
            raise ScenarioError(f"host {name!r} appears twice")
        scenarios[name] = build_scenario(name, host.get("gpus", ()), timezone=host.get("timezone"))
    return scenarios


def validate_scenario(data: Any) -> dict[str, Any]:
    """Return `data` unchanged if the sim backend can serve it, else raise ScenarioError.

    Checks what would otherwise surface as nonsense on the dashboard: a vGPU whose frame
    buffer exceeds its GPU's, vGPUs that together overflow the GPU, duplicate UUIDs (the
    collector maps samples to inventory rows by them), unknown workflows.
    """
    if not isinstance(data, dict):
        raise ScenarioError("a scenario is a JSON object")
    if not isinstance(data.get("hostname"), str) or not data["hostname"]:
        raise ScenarioError("scenario needs a non-empty 'hostname'")
    timezone = data.get("timezone")
    if timezone is not None and not isinstance(timezone, str):
        raise ScenarioError("'timezone' must be an IANA name such as 'Europe/Paris'")
    gpus = data.get("gpus")
    if not isinstance(gpus, list):
        raise ScenarioError("scenario needs a 'gpus' list")
    seen_gpus: set[str] = set()
    seen_vgpus: set[str] = set()
    for gpu_index, gpu in enumerate(gpus):
        where = f"gpus[{gpu_index}]"
        if not isinstance(gpu, dict):
            raise ScenarioError(f"{where} must be an object")
        for key, kind in (("uuid", str), ("name", str), ("pci_bus_id", str), ("fb_total_mib", int)):
            if not isinstance(gpu.get(key), kind) or isinstance(gpu.get(key), bool):
                raise ScenarioError(f"{where}.{key} is missing or not a {kind.__name__}")
        if gpu["fb_total_mib"] <= 0:
            raise ScenarioError(f"{where}.fb_total_mib must be positive")
        if gpu["uuid"] in seen_gpus:
            raise ScenarioError(f"{where}.uuid {gpu['uuid']} is used twice")
        seen_gpus.add(gpu["uuid"])
        mode = gpu.get("virtualization_mode", "vgpu_host")
        if mode not in VIRTUALIZATION_MODES:
            raise ScenarioError(f"{where}.virtualization_mode {mode!r} is not one of {', '.join(VIRTUALIZATION_MODES)}")
        vgpus = gpu.get("vgpus", [])
        if not isinstance(vgpus, list):
            raise ScenarioError(f"{where}.vgpus must be a list")
        if vgpus and mode != "vgpu_host":
            raise ScenarioError(f"{where} has vGPUs but virtualization_mode {mode!r}: only a vgpu_host GPU hosts vGPUs")
        total_fb = 0
        for vgpu_index, vgpu in enumerate(vgpus):
            vwhere = f"{where}.vgpus[{vgpu_index}]"
            if not isinstance(vgpu, dict):
                raise ScenarioError(f"{vwhere} must be an object")
            for key in ("vgpu_uuid", "vm_uuid", "vm_name", "type_name"):
                if not isinstance(vgpu.get(key), str) or not vgpu[key]:
                    raise ScenarioError(f"{vwhere}.{key} is missing or empty")
            mdev_uuid = vgpu.get("mdev_uuid")
            if mdev_uuid is not None and (not isinstance(mdev_uuid, str) or not mdev_uuid):
                raise ScenarioError(f"{vwhere}.mdev_uuid must be a non-empty string or absent")
            fb_mib = vgpu.get("fb_mib")
            if not isinstance(fb_mib, int) or isinstance(fb_mib, bool) or fb_mib <= 0:
                raise ScenarioError(f"{vwhere}.fb_mib must be a positive integer")
            if fb_mib > gpu["fb_total_mib"]:
                raise ScenarioError(f"{vwhere} needs {fb_mib} MiB but the GPU has {gpu['fb_total_mib']} MiB")
            total_fb += fb_mib
            if vgpu.get("workflow", "other") not in WORKFLOWS:
                raise ScenarioError(f"{vwhere}.workflow {vgpu.get('workflow')!r} is not one of {', '.join(WORKFLOWS)}")
            if vgpu.get("user_type", "medium") not in USER_TYPES:
                raise ScenarioError(
                    f"{vwhere}.user_type {vgpu.get('user_type')!r} is not one of {', '.join(USER_TYPES)}"
                )
            if not isinstance(vgpu.get("cpu_bound", False), bool):
                raise ScenarioError(f"{vwhere}.cpu_bound must be true, false or absent")
            if vgpu["vgpu_uuid"] in seen_vgpus:
                raise ScenarioError(f"{vwhere}.vgpu_uuid {vgpu['vgpu_uuid']} is used twice")
            seen_vgpus.add(vgpu["vgpu_uuid"])
        if total_fb > gpu["fb_total_mib"]:
            raise ScenarioError(f"{where} vGPUs need {total_fb} MiB together but the GPU has {gpu['fb_total_mib']} MiB")
    return data


def load_scenario(path: str | Path) -> dict[str, Any]:
    """Read and validate a scenario file; errors name the file so a misconfigured agent says why."""
    path = Path(path)
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ScenarioError(f"scenario file {path} does not exist") from None
    except (OSError, ValueError) as exc:
        raise ScenarioError(f"scenario file {path} cannot be read: {exc}") from None
    try:
        return validate_scenario(data)
    except ScenarioError as exc:
        raise ScenarioError(f"scenario file {path}: {exc}") from None


def dump_scenario(scenario: Mapping[str, Any]) -> str:
    """The canonical text of a scenario file: key order kept, indented, trailing newline, so diffs stay small."""
    return json.dumps(scenario, indent=2) + "\n"


def poc_scenario() -> dict[str, Any]:
    """The sizing guide's proof of concept (vgpu-facts.md section 5) as a scenario.

    One 2U server with three Quadro RTX 6000 (24 GB): modeling and texturing share GPU 0
    on two RTX6000-12Q, animation has GPU 1 as RTX6000-24Q, lighting GPU 2 as RTX6000-24Q:
    "four artists from three parts of the pipeline work at once on one 3-GPU server".
    `scenarios/poc.json` is this function's output.
    """
    rtx6000 = {"name": "Quadro RTX 6000", "fb_total_mib": 24576, "power_limit_w": 250, "max_sm_clock_mhz": 1770}
    return build_scenario(
        "vws-poc-01",
        [
            {
                **rtx6000,
                "vgpus": [
                    {"vm_name": "vws-modeling-01", "type_name": "RTX6000-12Q", "fb_mib": 12288, "workflow": "modeling"},
                    {
                        "vm_name": "vws-texturing-01",
                        "type_name": "RTX6000-12Q",
                        "fb_mib": 12288,
                        "workflow": "texturing",
                    },
                ],
            },
            {
                **rtx6000,
                "vgpus": [
                    {
                        "vm_name": "vws-animation-01",
                        "type_name": "RTX6000-24Q",
                        "fb_mib": 24576,
                        "workflow": "animation",
                    }
                ],
            },
            {
                **rtx6000,
                "vgpus": [
                    {
                        "vm_name": "vws-lighting-01",
                        "type_name": "RTX6000-24Q",
                        "fb_mib": 24576,
                        "workflow": "lighting",
                        "user_type": "heavy",
                    }
                ],
            },
        ],
    )


if __name__ == "__main__":  # regenerate the shipped example: python -m telemetry.agent.scenario
    POC_SCENARIO_PATH.parent.mkdir(exist_ok=True)
    POC_SCENARIO_PATH.write_text(dump_scenario(poc_scenario()), encoding="utf-8")
    print(f"wrote {POC_SCENARIO_PATH}")

"""Scenario files: the shipped proof of concept, building from inventory data, refusing nonsense."""

from __future__ import annotations

import json

import pytest

from telemetry.agent.scenario import (
    POC_SCENARIO_PATH,
    ScenarioError,
    build_scenario,
    build_scenarios,
    dump_scenario,
    load_scenario,
    poc_scenario,
)


def test_shipped_poc_file_is_the_sizing_guide_proof_of_concept():
    scenario = load_scenario(POC_SCENARIO_PATH)

    gpus = scenario["gpus"]
    assert [(g["name"], g["fb_total_mib"]) for g in gpus] == [("Quadro RTX 6000", 24576)] * 3
    layout = [[(v["type_name"], v["workflow"]) for v in g["vgpus"]] for g in gpus]
    assert layout == [
        [("RTX6000-12Q", "modeling"), ("RTX6000-12Q", "texturing")],
        [("RTX6000-24Q", "animation")],
        [("RTX6000-24Q", "lighting")],
    ]
    vms = {v["vm_uuid"] for g in gpus for v in g["vgpus"]}
    assert len(vms) == 4, "four artists, one VM each"


def test_shipped_poc_file_is_up_to_date_with_its_generator():
    assert POC_SCENARIO_PATH.read_text(encoding="utf-8") == dump_scenario(poc_scenario()), (
        "regenerate with: python -m telemetry.agent.scenario"
    )


def test_build_scenario_gives_stable_identities_and_keeps_a_multi_vgpu_vm_one_vm():
    gpus = [
        {"name": "NVIDIA L40S", "fb_total_mib": 46068, "vgpus": [
            {"vm_name": "lighting-07", "type_name": "L40S-48Q", "fb_mib": 46068, "workflow": "lighting"},
        ]},
        {"name": "NVIDIA L40S", "fb_total_mib": 46068, "vgpus": [
            {"vm_name": "lighting-07", "type_name": "L40S-48Q", "fb_mib": 46068, "workflow": "lighting"},
        ]},
    ]  # fmt: skip

    first = build_scenario("render-01", gpus)
    again = build_scenario("render-01", gpus)
    other_host = build_scenario("render-02", gpus)

    assert first == again
    assert first["gpus"][0]["uuid"] != other_host["gpus"][0]["uuid"]
    (a,), (b,) = (g["vgpus"] for g in first["gpus"])
    assert a["vm_uuid"] == b["vm_uuid"]
    assert a["vgpu_uuid"] != b["vgpu_uuid"]
    assert first["gpus"][0]["pci_bus_id"] != first["gpus"][1]["pci_bus_id"]
    assert (a["user_type"], first["gpus"][0]["uuid"][:4]) == ("medium", "GPU-")


def test_build_scenario_keeps_inventory_identities():
    scenario = build_scenario(
        "kvm-03",
        [
            {
                "name": "NVIDIA A16",
                "fb_total_mib": 16384,
                "uuid": "GPU-from-inventory",
                "pci_bus_id": "00000000:C1:00.0",
                "vgpus": [
                    {
                        "vm_name": "vpc-01",
                        "type_name": "A16-2B",
                        "fb_mib": 2048,
                        "vm_uuid": "vm-from-inventory",
                        "vgpu_uuid": "vgpu-from-inventory",
                        "workflow": "compositing",
                        "user_type": "light",
                    }
                ],
            }
        ],
    )
    gpu = scenario["gpus"][0]
    assert (gpu["uuid"], gpu["pci_bus_id"]) == ("GPU-from-inventory", "00000000:C1:00.0")
    assert (gpu["vgpus"][0]["vm_uuid"], gpu["vgpus"][0]["vgpu_uuid"]) == ("vm-from-inventory", "vgpu-from-inventory")


def test_build_scenarios_makes_one_scenario_per_host_and_refuses_duplicates():
    hosts = [{"hostname": "a", "gpus": []}, {"hostname": "b", "gpus": []}]
    assert list(build_scenarios(hosts)) == ["a", "b"]
    with pytest.raises(ScenarioError, match="'a' appears twice"):
        build_scenarios([*hosts, {"hostname": "a", "gpus": []}])


@pytest.mark.parametrize(
    ("gpu", "message"),
    [
        (
            {"name": "Quadro RTX 6000", "fb_total_mib": 24576, "vgpus": [
                {"vm_name": "a", "type_name": "RTX6000-24Q", "fb_mib": 24576},
                {"vm_name": "b", "type_name": "RTX6000-24Q", "fb_mib": 24576},
            ]},
            "need 49152 MiB together but the GPU has 24576 MiB",
        ),
        (
            {"name": "Tesla T4", "fb_total_mib": 16384, "vgpus": [
                {"vm_name": "a", "type_name": "RTX6000-24Q", "fb_mib": 24576},
            ]},
            "needs 24576 MiB but the GPU has 16384 MiB",
        ),
        (
            {"name": "Tesla T4", "fb_total_mib": 16384, "vgpus": [
                {"vm_name": "a", "type_name": "T4-4Q", "fb_mib": 4096, "workflow": "juggling"},
            ]},
            "workflow 'juggling' is not one of",
        ),
        (
            {"name": "Tesla T4", "fb_total_mib": 16384, "virtualization_mode": "passthrough", "vgpus": [
                {"vm_name": "a", "type_name": "T4-4Q", "fb_mib": 4096},
            ]},
            "only a vgpu_host GPU hosts vGPUs",
        ),
        ({"fb_total_mib": 16384}, "lacks 'name'"),
        (
            {"name": "Tesla T4", "fb_total_mib": 16384, "vgpus": [
                {"vm_name": "a", "type_name": "T4-4Q", "fb_mib": 4096, "mdev_uuid": 42},
            ]},
            r"vgpus\[0\]\.mdev_uuid must be a non-empty string",
        ),
    ],
    ids=["overfull", "vgpu-larger-than-gpu", "unknown-workflow", "vgpu-on-passthrough", "no-name", "bad-mdev-uuid"],
)  # fmt: skip
def test_inconsistent_scenarios_are_refused_with_the_reason(gpu, message):
    with pytest.raises(ScenarioError, match=message):
        build_scenario("bad-host", [gpu])


def test_duplicate_gpu_uuid_is_refused():
    gpu = {"name": "Tesla T4", "fb_total_mib": 16384, "uuid": "GPU-same"}
    with pytest.raises(ScenarioError, match="GPU-same is used twice"):
        build_scenario("dup-host", [gpu, gpu])


def test_load_scenario_names_the_file_it_cannot_use(tmp_path):
    missing = tmp_path / "nope.json"
    with pytest.raises(ScenarioError, match=f"{missing} does not exist"):
        load_scenario(missing)

    broken = tmp_path / "broken.json"
    broken.write_text("{not json", encoding="utf-8")
    with pytest.raises(ScenarioError, match="broken.json cannot be read"):
        load_scenario(broken)

    no_gpus = tmp_path / "no-gpus.json"
    no_gpus.write_text(json.dumps({"hostname": "x"}), encoding="utf-8")
    with pytest.raises(ScenarioError, match="no-gpus.json: scenario needs a 'gpus' list"):
        load_scenario(no_gpus)

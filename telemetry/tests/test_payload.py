"""Agent protocol v1 payloads: what the real agents send is accepted, anything else is refused
with a message naming the path of the bad value."""

from __future__ import annotations

import copy
import json
import math

import pytest

from telemetry.agent.nvml_backend import NvmlBackend
from telemetry.agent.scenario import poc_scenario
from telemetry.agent.server import AgentServer
from telemetry.agent.sim_backend import SimBackend
from telemetry.payload import (
    GpuReading,
    PayloadError,
    Report,
    VgpuReading,
    is_vgpu_profile_name,
    model_key,
    parse_agent_payload,
    profile_key,
)
from telemetry.tests.fake_nvml import MDEV_MODELING, MDEV_TEXTURING, FakeGpu, FakeNvml, vgpu_host


def _payload() -> dict:
    return {
        "agent": {"version": "1.0.0", "hostname": "vws-poc-01", "backend": "nvml"},
        "collected_at": 1_780_000_000.25,
        "gpus": [
            {
                "uuid": "GPU-4ec115a5-de1f-52aa-a320-718cfadf645b", "index": 0, "name": "Quadro RTX 6000",
                "pci_bus_id": "00000000:1B:00.0", "fb_total_mib": 24576, "virtualization_mode": "vgpu_host",
                "util_gpu": 37, "util_mem": 12, "fb_used_mib": 15360, "enc_util": 5, "dec_util": 2,
                "temp_c": 48, "power_w": 87.5, "sm_clock_mhz": 1770, "clocks_event_reasons": 4,
                "scheduler": {"policy": "best_effort"}, "errors": {},
                "vgpus": [
                    {"vgpu_uuid": "c25b935b-2fda-58de-839f-1bf62c8441fa",
                     "vm_uuid": "cb36e14e-3c36-5e11-a488-dc7dbdb6efe2", "vm_name": None,
                     "type_name": "GRID RTX6000-12Q", "fb_used_mib": 5632, "util_gpu": 30, "util_mem": 10,
                     "enc_util": 4, "dec_util": 0, "instance_id": 7, "enc_fps": 60},
                    {"vgpu_uuid": "2382e680-7059-5c74-8f68-aca74d872109",
                     "vm_uuid": "8148c024-5fb1-5039-b912-9cdbb5f57e4b", "vm_name": "vws-texturing-01",
                     "type_name": "GRID RTX6000-12Q", "fb_used_mib": 3072, "util_gpu": 7, "util_mem": 3,
                     "enc_util": None, "dec_util": None},
                ],
            },
            {
                "uuid": "GPU-5ed14eda-39c7-5c8b-a78b-9c53189cc029", "index": 1, "name": "Quadro RTX 6000",
                "pci_bus_id": "00000000:3B:00.0", "fb_total_mib": 24576, "virtualization_mode": "passthrough",
                "util_gpu": None, "util_mem": None, "fb_used_mib": None, "enc_util": None, "dec_util": None,
                "temp_c": None, "power_w": None, "sm_clock_mhz": None, "scheduler": None, "vgpus": [],
            },
        ],
    }


def test_valid_payload_becomes_a_report_with_every_value():
    report = parse_agent_payload(json.dumps(_payload()).encode())

    assert report.hostname == "vws-poc-01"
    assert report.backend == "nvml"
    assert report.collected_at == 1_780_000_000.25
    assert report.guest_vgpus == []
    first, second = report.gpus
    assert first == GpuReading(
        uuid="GPU-4ec115a5-de1f-52aa-a320-718cfadf645b", index=0, name="Quadro RTX 6000",
        pci_bus_id="00000000:1B:00.0", fb_total_mib=24576, virtualization_mode="vgpu_host", util_gpu=37,
        util_mem=12, fb_used_mib=15360, enc_util=5, dec_util=2, temp_c=48, power_w=87.5, sm_clock_mhz=1770,
        clocks_event_reasons=4,
        vgpus=[
            VgpuReading(vgpu_uuid="c25b935b-2fda-58de-839f-1bf62c8441fa",
                        vm_uuid="cb36e14e-3c36-5e11-a488-dc7dbdb6efe2", vm_name=None, type_name="GRID RTX6000-12Q",
                        fb_used_mib=5632, util_gpu=30, util_mem=10, enc_util=4, dec_util=0),
            VgpuReading(vgpu_uuid="2382e680-7059-5c74-8f68-aca74d872109",
                        vm_uuid="8148c024-5fb1-5039-b912-9cdbb5f57e4b", vm_name="vws-texturing-01",
                        type_name="GRID RTX6000-12Q", fb_used_mib=3072, util_gpu=7, util_mem=3, enc_util=None,
                        dec_util=None),
        ],
    )
    # Unsupported metrics stay null: a chart must show a gap, not a zero.
    assert (second.util_gpu, second.fb_used_mib, second.temp_c, second.power_w) == (None, None, None, None)


def test_agents_older_than_mdev_uuid_are_read_as_reporting_none():
    """The payload above is an agent from before `mdev_uuid`: its vGPUs are stored as ever."""
    report = parse_agent_payload(_payload())

    assert [v.mdev_uuid for v in report.gpus[0].vgpus] == [None, None]
    assert [v.vm_uuid for v in report.gpus[0].vgpus] == ["cb36e14e-3c36-5e11-a488-dc7dbdb6efe2",
                                                         "8148c024-5fb1-5039-b912-9cdbb5f57e4b"]


def test_a_vgpus_mdev_uuid_is_read_and_null_stays_none():
    data = _payload()
    data["gpus"][0]["vgpus"][0]["mdev_uuid"] = "0b5d1a3e-7c2f-4e8a-9d6b-3f1e2a4c5b7d"
    data["gpus"][0]["vgpus"][1]["mdev_uuid"] = None  # an SR-IOV vGPU: no mdev

    first, second = parse_agent_payload(data).gpus[0].vgpus

    assert first.mdev_uuid == "0b5d1a3e-7c2f-4e8a-9d6b-3f1e2a4c5b7d"
    assert second.mdev_uuid is None


def test_bytes_text_and_decoded_object_give_the_same_report():
    data = _payload()
    assert parse_agent_payload(json.dumps(data)) == parse_agent_payload(json.dumps(data).encode()) \
        == parse_agent_payload(copy.deepcopy(data))


def test_unknown_keys_are_ignored_so_agents_can_grow():
    data = _payload()
    data["agent"]["build"] = "abc"
    data["gpus"][0]["pcie_tx_kib_s"] = 1200
    data["gpus"][0]["vgpus"][0]["frame_rate_limit"] = 60
    data["future_section"] = {"anything": [1, 2]}
    assert parse_agent_payload(data) == parse_agent_payload(_payload())


def test_what_the_sim_agent_serves_is_accepted():
    server = AgentServer(("127.0.0.1", 0), SimBackend(poc_scenario()), "token", "vws-poc-01")
    try:
        body = server.metrics_body()
    finally:
        server.server_close()

    report = parse_agent_payload(body)

    assert report.backend == "sim"
    assert [gpu.pci_bus_id for gpu in report.gpus] == ["00000000:1B:00.0", "00000000:3B:00.0", "00000000:5B:00.0"]
    vgpus = report.gpus[0].vgpus
    assert [v.vm_name for v in vgpus] == ["vws-modeling-01", "vws-texturing-01"]
    assert all(0 <= v.fb_used_mib <= 24576 for v in vgpus)


def test_what_the_nvml_agent_reads_is_accepted():
    backend = NvmlBackend(nvml=FakeNvml([vgpu_host(), FakeGpu(uuid="GPU-bare", bus_id="00000000:5E:00.0")]))
    document = {"agent": {"version": "1", "hostname": "render-01", "backend": backend.name},
                "collected_at": 1_780_000_000.0, "gpus": backend.collect()}

    report = parse_agent_payload(json.dumps(document))

    host_gpu, bare_gpu = report.gpus
    assert host_gpu.virtualization_mode == "vgpu_host"
    assert [(v.vm_uuid, v.type_name, v.fb_used_mib, v.mdev_uuid) for v in host_gpu.vgpus] == [
        ("vm-uuid-modeling", "GRID RTX6000-12Q", 5632, MDEV_MODELING),
        ("vm-uuid-texturing", "GRID RTX6000-12Q", 3072, MDEV_TEXTURING)]
    assert bare_gpu.uuid == "GPU-bare"
    assert bare_gpu.vgpus == []


def test_a_guest_vms_gpu_is_reported_as_its_vgpu_not_as_a_gpu():
    data = _payload()
    guest = data["gpus"][1]
    guest.update(name="NVIDIA L40S-2Q", virtualization_mode="vgpu_guest", fb_total_mib=2048, fb_used_mib=612,
                 util_gpu=23)
    data["agent"]["hostname"] = "ws-lighting-01"

    report = parse_agent_payload(data)

    assert [gpu.uuid for gpu in report.gpus] == ["GPU-4ec115a5-de1f-52aa-a320-718cfadf645b"]
    assert report.guest_vgpus == [VgpuReading(
        vgpu_uuid="GPU-5ed14eda-39c7-5c8b-a78b-9c53189cc029", vm_uuid=None, vm_name="ws-lighting-01",
        type_name="L40S-2Q", fb_used_mib=612, util_gpu=23, util_mem=None, enc_util=None, dec_util=None)]


def _set(path: str, value):
    def mutate(data):
        *parents, last = path.split(".")
        target = data
        for part in parents:
            target = target[int(part)] if part.isdigit() else target[part]
        if last.isdigit():
            last = int(last)
        if value is _DELETE:
            del target[last]
        else:
            target[last] = value
    return mutate


_DELETE = object()


@pytest.mark.parametrize(("mutate", "message"), [
    (_set("gpus.1.util_gpu", "abc"), "gpus[1].util_gpu: expected a number 0..100 or null, got 'abc'"),
    (_set("gpus.0.util_mem", 100.5), "gpus[0].util_mem: expected a number 0..100 or null, got 100.5"),
    (_set("gpus.0.enc_util", -1), "gpus[0].enc_util: expected a number 0..100 or null, got -1"),
    (_set("gpus.0.dec_util", True), "gpus[0].dec_util: expected a number 0..100 or null, got True"),
    (_set("gpus.0.util_gpu", math.nan), "gpus[0].util_gpu: expected a number 0..100 or null, got nan"),
    (_set("gpus.0.fb_used_mib", 30000), "gpus[0].fb_used_mib: expected a number of MiB 0..24576 or null, got 30000"),
    (_set("gpus.0.fb_total_mib", "24 GB"), "gpus[0].fb_total_mib: expected a number of MiB or null, got '24 GB'"),
    (_set("gpus.0.temp_c", 1000), "gpus[0].temp_c: expected a number -100..200 or null, got 1000"),
    (_set("gpus.0.power_w", -3.5), "gpus[0].power_w: expected a number of watts 0..10000 or null, got -3.5"),
    (_set("gpus.0.sm_clock_mhz", "1770"), "gpus[0].sm_clock_mhz: expected a number of MHz 0..100000 or null, "
                                          "got '1770'"),
    (_set("gpus.1.util_gpu", _DELETE), "gpus[1].util_gpu: required key missing"),
    (_set("gpus.0.vgpus", _DELETE), "gpus[0].vgpus: required key missing"),
    (_set("gpus.0.uuid", None), "gpus[0].uuid: expected a non-empty string of at most 80 characters, got None"),
    (_set("gpus.0.uuid", ""), "gpus[0].uuid: expected a non-empty string of at most 80 characters, got ''"),
    (_set("gpus.0.name", 6000), "gpus[0].name: expected a non-empty string of at most 100 characters or null, "
                                "got 6000"),
    (_set("gpus.0.pci_bus_id", "0" * 33), "gpus[0].pci_bus_id: expected a non-empty string of at most 32 characters"),
    (_set("gpus.0.index", 1.0), "gpus[0].index: expected an integer >= 0, got 1.0"),
    (_set("gpus.0.index", -1), "gpus[0].index: expected an integer >= 0, got -1"),
    (_set("gpus.0.vgpus", {}), "gpus[0].vgpus: expected a list, got {}"),
    (_set("gpus.0.vgpus.1", "vgpu"), "gpus[0].vgpus[1]: expected an object, got 'vgpu'"),
    (_set("gpus.0.vgpus.1.util_gpu", 150), "gpus[0].vgpus[1].util_gpu: expected a number 0..100 or null, got 150"),
    (_set("gpus.0.vgpus.0.fb_used_mib", 99999), "gpus[0].vgpus[0].fb_used_mib: expected a number of MiB 0..24576"),
    (_set("gpus.0.vgpus.0.vm_uuid", 42), "gpus[0].vgpus[0].vm_uuid: expected a non-empty string"),
    (_set("gpus.0.vgpus.1.type_name", _DELETE), "gpus[0].vgpus[1].type_name: required key missing"),
    (_set("gpus.0.vgpus.0.mdev_uuid", 42), "gpus[0].vgpus[0].mdev_uuid: expected a non-empty string of at most 80 "
                                           "characters or null, got 42"),
    (_set("gpus.0.vgpus.1.mdev_uuid", ""), "gpus[0].vgpus[1].mdev_uuid: expected a non-empty string"),
    (_set("gpus.0.vgpus.0.mdev_uuid", "f" * 81), "gpus[0].vgpus[0].mdev_uuid: expected a non-empty string of at "
                                                 "most 80 characters"),
    (_set("gpus.1.uuid", "GPU-4ec115a5-de1f-52aa-a320-718cfadf645b"),
     "gpus[1].uuid: 'GPU-4ec115a5-de1f-52aa-a320-718cfadf645b' is already gpus[0]"),
    (_set("gpus", {"0": {}}), "gpus: expected a list, got {'0': {}}"),
    (_set("gpus.0", None), "gpus[0]: expected an object, got None"),
    (_set("collected_at", "2026-05-28T20:26:40Z"), "collected_at: expected Unix seconds (a positive number), "
                                                   "got '2026-05-28T20:26:40Z'"),
    (_set("collected_at", _DELETE), "payload.collected_at: required key missing"),
    (_set("agent", _DELETE), "payload.agent: required key missing"),
    (_set("agent.hostname", ""), "agent.hostname: expected a non-empty string of at most 100 characters, got ''"),
    (_set("agent.hostname", "h" * 101), "agent.hostname: expected a non-empty string of at most 100 characters"),
    (_set("agent.backend", _DELETE), "agent.backend: required key missing"),
    (_set("agent.version", 1), "agent.version: expected a non-empty string of at most 40 characters, got 1"),
])
def test_wrong_shape_or_type_is_refused_with_the_path(mutate, message):
    data = _payload()
    mutate(data)
    with pytest.raises(PayloadError) as refused:
        parse_agent_payload(data)
    assert str(refused.value).startswith(message)


@pytest.mark.parametrize(("body", "message"), [
    (b'{"agent": {', "invalid JSON: Expecting property name enclosed in double quotes at line 1 column 12"),
    (b"", "invalid JSON: Expecting value at line 1 column 1"),
    (b"\xff\xfe{}", "invalid JSON"),
    (b"[1, 2]", "payload: expected an object, got [1, 2]"),
    ("null", "payload: expected an object, got None"),
])
def test_invalid_json_is_a_payload_error(body, message):
    with pytest.raises(PayloadError) as refused:
        parse_agent_payload(body)
    assert str(refused.value).startswith(message)


def test_payload_error_is_a_value_error_so_callers_may_catch_either():
    assert issubclass(PayloadError, ValueError)
    assert isinstance(Report("h", "sim", 1.0, []), Report)


@pytest.mark.parametrize(("name", "expected"), [
    ("NVIDIA L40S-2Q", True), ("GRID T4-4Q", True), ("GRID RTX6000-12Q", True), ("NVIDIA RTX6000-Ada-4Q", True),
    ("NVIDIA A100D-20C", True), ("NVIDIA L40S", False), ("NVIDIA A100-SXM4-80GB", False), ("Tesla T4", False),
    ("NVIDIA GeForce RTX 3080", False), ("NVIDIA H100 PCIe", False), (None, False),
])
def test_vgpu_type_names_are_told_from_board_names(name, expected):
    assert is_vgpu_profile_name(name) is expected


def test_names_match_without_vendor_prefixes():
    assert model_key("NVIDIA L40S") == model_key("L40S") == model_key("nvidia  l40s")
    assert profile_key("GRID RTX6000-12Q") == profile_key("RTX6000-12Q") == profile_key("NVIDIA RTX6000-12Q")
    assert model_key("Tesla T4") != model_key("NVIDIA T4 Tensor")

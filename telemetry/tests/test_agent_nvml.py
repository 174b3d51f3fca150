"""The NVML backend against a fake pynvml: what a poll reports when NVML says no, and vGPU hosts."""

from __future__ import annotations

import datetime as dt
import json
import time

import pynvml
import pytest

from telemetry.agent.nvml_backend import NvmlBackend
from telemetry.tests.fake_nvml import GIB, MDEV_MODELING, MDEV_TEXTURING, MIB, FakeGpu, FakeNvml, FakeVgpu, vgpu_host

# NVML function -> protocol fields it feeds.
METRIC_CALLS = [
    ("nvmlDeviceGetUtilizationRates", ("util_gpu", "util_mem")),
    ("nvmlDeviceGetEncoderUtilization", ("enc_util",)),
    ("nvmlDeviceGetDecoderUtilization", ("dec_util",)),
    ("nvmlDeviceGetTemperature", ("temp_c",)),
    ("nvmlDeviceGetPowerUsage", ("power_w",)),
    ("nvmlDeviceGetClockInfo", ("sm_clock_mhz",)),
    ("nvmlDeviceGetCurrentClocksEventReasons", ("clocks_event_reasons",)),
    ("nvmlDeviceGetVirtualizationMode", ("virtualization_mode",)),
    ("nvmlDeviceGetMemoryInfo", ("fb_used_mib", "fb_total_mib")),
    ("nvmlDeviceGetUUID", ("uuid",)),
    ("nvmlDeviceGetName", ("name",)),
    ("nvmlDeviceGetPciInfo", ("pci_bus_id",)),
]
ALL_FIELDS = {field for _, fields in METRIC_CALLS for field in fields}


def poll(backend: NvmlBackend) -> dict:
    """One poll of the single GPU, through JSON as the collector will see it."""
    return json.loads(json.dumps(backend.collect()))[0]


def test_bare_metal_gpu_reports_every_metric_in_protocol_units():
    nvml = FakeNvml([FakeGpu()])
    gpu = poll(NvmlBackend(nvml))

    assert gpu == {
        "uuid": "GPU-11111111-2222-3333-4444-555555555555",
        "index": 0,
        "name": "Quadro RTX 6000",
        "pci_bus_id": "00000000:3B:00.0",
        "fb_total_mib": 24576,
        "virtualization_mode": "none",
        "util_gpu": 37,
        "util_mem": 12,
        "fb_used_mib": 3072,
        "fb_reserved_mib": 0,
        "enc_util": 5,
        "dec_util": 2,
        "temp_c": 48,
        "power_w": 87.5,
        "sm_clock_mhz": 1770,
        "clocks_event_reasons": 4,
        "health": {
            "ecc_mode": "enabled",
            "ecc_corrected_volatile": 0,
            "ecc_uncorrected_volatile": 0,
            "ecc_corrected_aggregate": 0,
            "ecc_uncorrected_aggregate": 0,
            "retired_pages_sbe": None,
            "retired_pages_dbe": None,
            "retired_pages_pending": None,
            "remapped_rows_correctable": 0,
            "remapped_rows_uncorrectable": 0,
            "remapped_rows_pending": False,
            "remapped_rows_failure": False,
            "throttle_reasons": ["sw_power_cap"],
            "pcie_replay_counter": 0,
            "fan_speed_pct": None,
            "temp_slowdown_c": 89.0,
            "temp_shutdown_c": 95.0,
            "power_limit_w": 250.0,
            "performance_state": "P0",
            "xid_events": [],
            "unsupported": ["retired_pages_sbe", "retired_pages_dbe", "retired_pages_pending", "fan_speed_pct"],
        },
        "scheduler": None,
        "vgpus": [],
        "errors": {},
    }
    # Not a vGPU host: no vGPU call is even attempted.
    assert not [name for name in nvml.calls if "Vgpu" in name]


@pytest.mark.parametrize(("function", "fields"), METRIC_CALLS, ids=[f for f, _ in METRIC_CALLS])
def test_not_supported_metric_is_null_and_never_asked_again(function, fields):
    nvml = FakeNvml([FakeGpu()])
    nvml.errors[function] = pynvml.NVML_ERROR_NOT_SUPPORTED
    backend = NvmlBackend(nvml)

    first = poll(backend)
    calls_after_first = nvml.calls[function]
    second = poll(backend)

    for snapshot in (first, second):
        for field in fields:
            assert snapshot[field] is None, f"{field} must be null, not {snapshot[field]!r}"
        others = ALL_FIELDS - set(fields)
        assert all(snapshot[f] is not None for f in others), {f: snapshot[f] for f in others}
        assert snapshot["errors"] == {}, "NOT_SUPPORTED is a property of the GPU, not an error"
    assert nvml.calls[function] == calls_after_first, "the unsupported call was retried"


def test_transient_error_loses_only_its_metric_and_is_retried():
    nvml = FakeNvml([FakeGpu()])
    nvml.errors["nvmlDeviceGetTemperature"] = pynvml.NVML_ERROR_GPU_IS_LOST
    backend = NvmlBackend(nvml)

    broken = poll(backend)
    assert broken["temp_c"] is None
    assert broken["errors"] == {"temp_c": "GPU is lost"}
    assert broken["util_gpu"] == 37
    assert broken["power_w"] == 87.5
    assert broken["fb_used_mib"] == 3072

    del nvml.errors["nvmlDeviceGetTemperature"]
    healed = poll(backend)
    assert healed["temp_c"] == 48
    assert healed["errors"] == {}


def test_error_on_one_gpu_leaves_the_other_gpu_complete():
    nvml = FakeNvml([FakeGpu(), FakeGpu(uuid="GPU-second", bus_id="00000000:5E:00.0")])
    nvml.errors[("nvmlDeviceGetPowerUsage", 0)] = pynvml.NVML_ERROR_NOT_SUPPORTED
    nvml.errors[("nvmlDeviceGetUtilizationRates", 0)] = pynvml.NVML_ERROR_UNKNOWN

    first, second = NvmlBackend(nvml).collect()

    assert first["power_w"] is None
    assert first["util_gpu"] is None
    assert first["temp_c"] == 48
    assert second["power_w"] == 87.5
    assert second["util_gpu"] == 37
    assert second["uuid"] == "GPU-second"


def test_older_driver_without_clocks_event_reasons_falls_back_to_throttle_reasons():
    nvml = FakeNvml([FakeGpu(clock_reasons=0x1)])
    nvml.errors["nvmlDeviceGetCurrentClocksEventReasons"] = pynvml.NVML_ERROR_FUNCTION_NOT_FOUND
    backend = NvmlBackend(nvml)

    poll(backend)
    gpu = poll(backend)

    assert gpu["clocks_event_reasons"] == 1
    assert nvml.calls["nvmlDeviceGetCurrentClocksEventReasons"] == 1
    assert nvml.calls["nvmlDeviceGetCurrentClocksThrottleReasons"] == 2


def test_older_pynvml_without_clocks_event_reasons_uses_throttle_reasons():
    class OldPynvml(FakeNvml):
        nvmlDeviceGetCurrentClocksEventReasons = None

    nvml = OldPynvml([FakeGpu(clock_reasons=0x4)])
    assert poll(NvmlBackend(nvml))["clocks_event_reasons"] == 4


def test_identity_is_read_once():
    nvml = FakeNvml([FakeGpu()])
    backend = NvmlBackend(nvml)
    for _ in range(3):
        poll(backend)

    assert nvml.calls["nvmlDeviceGetUUID"] == 1
    assert nvml.calls["nvmlDeviceGetPciInfo"] == 1
    assert nvml.calls["nvmlDeviceGetUtilizationRates"] == 3


def test_vgpu_host_reports_each_vgpu_with_its_vm_and_profile():
    nvml = FakeNvml([vgpu_host()])
    gpu = poll(NvmlBackend(nvml))

    assert gpu["virtualization_mode"] == "vgpu_host"
    assert gpu["scheduler"] == {
        "policy": "best_effort",
        "arr_mode": "disabled",
        "avg_factor": None,
        "timeslice_ms": 2.0,
        "frequency_hz": None,
    }
    assert gpu["vgpus"] == [
        {
            "instance_id": 7,
            "vgpu_uuid": "vgpu-aaaa",
            "mdev_uuid": MDEV_MODELING,
            "vm_uuid": "vm-uuid-modeling",
            "vm_id": "vm-uuid-modeling",
            "vm_id_type": "uuid",
            "vm_name": None,
            "type_name": "GRID RTX6000-12Q",
            "fb_used_mib": 5632,
            "util_gpu": 30,
            "util_mem": 10,
            "enc_util": 4,
            "dec_util": 0,
            "enc_sessions": 1,
            "enc_fps": 60,
            "enc_latency_us": 2800,
            "license_state": "licensed",
            "license_expiry": 1798761599.0,
            "guest_driver_version": "580.95.05",
            "frame_rate_limit": 60,
            "encoder_sessions": 1,
            "guest_info_state": "initialized",
            "unsupported": [],
        },
        {
            "instance_id": 9,
            "vgpu_uuid": "vgpu-bbbb",
            "mdev_uuid": MDEV_TEXTURING,
            "vm_uuid": "vm-uuid-texturing",
            "vm_id": "vm-uuid-texturing",
            "vm_id_type": "uuid",
            "vm_name": None,
            "type_name": "GRID RTX6000-12Q",
            "fb_used_mib": 3072,
            "util_gpu": 60,
            "util_mem": 20,
            "enc_util": 8,
            "dec_util": 1,
            "enc_sessions": 1,
            "enc_fps": 60,
            "enc_latency_us": 2800,
            "license_state": "licensed",
            "license_expiry": 1798761599.0,
            "guest_driver_version": "580.95.05",
            "frame_rate_limit": 60,
            "encoder_sessions": 1,
            "guest_info_state": "initialized",
            "unsupported": [],
        },
    ]
    assert gpu["errors"] == {}


def test_vgpu_utilization_is_read_incrementally_and_kept_when_no_new_sample():
    host = vgpu_host()
    nvml = FakeNvml([host])
    backend = NvmlBackend(nvml)

    first = poll(backend)
    second = poll(backend)  # NVML answers NOT_FOUND: nothing newer than timestamp 1000
    host.vgpu_samples.append((7, 2_000, 85, 40, 9, 2))  # only instance 7 has a new sample
    third = poll(backend)
    fourth = poll(backend)

    assert nvml.vgpu_utilization_since == [0, 1_000, 1_000, 2_000]
    utils = [[v["util_gpu"] for v in snapshot["vgpus"]] for snapshot in (first, second, third, fourth)]
    assert utils == [[30, 60], [30, 60], [85, 60], [85, 60]]
    assert third["vgpus"][0]["util_mem"] == 40
    assert all(snapshot["errors"] == {} for snapshot in (second, fourth)), "NOT_FOUND is no error"


def test_vgpu_frame_buffer_above_4_gib_is_not_wrapped():
    host = vgpu_host()
    host.vgpus[0].fb_usage_bytes = 20 * GIB + 5 * MIB  # a 24Q VM using 20 GiB
    nvml = FakeNvml([host])

    gpu = poll(NvmlBackend(nvml))

    assert gpu["vgpus"][0]["fb_used_mib"] == 20 * 1024 + 5
    # pynvml's own 32-bit wrapper would have said 5 MiB.
    assert nvml.nvmlVgpuInstanceGetFbUsage(7) // MIB == 5
    assert nvml.calls["C nvmlVgpuInstanceGetFbUsage"] == 2


def test_vgpu_metric_not_supported_is_null_without_losing_the_vgpu():
    nvml = FakeNvml([vgpu_host(scheduler=None)])
    nvml.errors["nvmlVgpuInstanceGetEncoderStats"] = pynvml.NVML_ERROR_NOT_SUPPORTED
    nvml.errors["nvmlVgpuInstanceGetFbUsage"] = pynvml.NVML_ERROR_NOT_SUPPORTED
    backend = NvmlBackend(nvml)

    poll(backend)
    gpu = poll(backend)

    assert gpu["scheduler"] is None
    modeling = gpu["vgpus"][0]
    assert modeling["vgpu_uuid"] == "vgpu-aaaa"
    assert modeling["util_gpu"] == 30
    assert modeling["fb_used_mib"] is None
    assert modeling["enc_sessions"] is None
    assert modeling["enc_fps"] is None
    assert nvml.calls["nvmlVgpuInstanceGetEncoderStats"] == 1, "unsupported: asked once, on the first vGPU"
    assert nvml.calls["C nvmlVgpuInstanceGetFbUsage"] == 1


def test_vgpu_utilization_not_supported_gives_null_utilization():
    nvml = FakeNvml([vgpu_host()])
    nvml.errors["nvmlDeviceGetVgpuUtilization"] = pynvml.NVML_ERROR_NOT_SUPPORTED

    gpu = poll(NvmlBackend(nvml))

    assert [v["util_gpu"] for v in gpu["vgpus"]] == [None, None]
    assert [v["fb_used_mib"] for v in gpu["vgpus"]] == [5632, 3072]


def test_vgpu_identity_is_cached_until_the_instance_goes_away():
    host = vgpu_host()
    nvml = FakeNvml([host])
    backend = NvmlBackend(nvml)
    poll(backend)
    poll(backend)
    assert nvml.calls["nvmlVgpuInstanceGetVmID"] == 2  # once per instance

    # The texturing VM stops; another VM starts and NVML reuses instance id 9.
    host.vgpus.pop(1)
    assert [v["vm_uuid"] for v in poll(backend)["vgpus"]] == ["vm-uuid-modeling"]
    host.vgpus.append(FakeVgpu(instance=9, uuid="vgpu-cccc", vm_id="vm-uuid-lighting"))
    gpu = poll(backend)

    assert [v["vm_uuid"] for v in gpu["vgpus"]] == ["vm-uuid-modeling", "vm-uuid-lighting"]
    assert gpu["vgpus"][1]["util_gpu"] is None, "the old VM's utilization must not carry over"


def test_sriov_vgpu_without_mdev_reports_null_mdev_uuid_and_is_not_asked_again():
    """vGPU 17+ on SR-IOV GPUs has no mdev: NVML says NOT_SUPPORTED, which is no error."""
    host = vgpu_host()
    for vgpu in host.vgpus:
        vgpu.mdev_uuid = None
    nvml = FakeNvml([host])
    backend = NvmlBackend(nvml)

    first = poll(backend)
    host.vgpus.append(FakeVgpu(instance=11, uuid="vgpu-cccc", vm_id="vm-uuid-lighting"))
    second = poll(backend)

    assert [v["mdev_uuid"] for v in second["vgpus"]] == [None, None, None]
    assert [v["vgpu_uuid"] for v in second["vgpus"]] == ["vgpu-aaaa", "vgpu-bbbb", "vgpu-cccc"]
    assert first["errors"] == second["errors"] == {}
    assert nvml.calls["nvmlVgpuInstanceGetMdevUUID"] == 1, "unsupported on this GPU: asked once"
    assert nvml.calls["nvmlVgpuInstanceGetVmID"] == 3, "identity still cached per instance"


def test_mdev_uuid_transient_error_is_reported_and_read_again_next_poll():
    nvml = FakeNvml([vgpu_host()])
    nvml.errors["nvmlVgpuInstanceGetMdevUUID"] = pynvml.NVML_ERROR_UNKNOWN
    backend = NvmlBackend(nvml)

    first = poll(backend)
    del nvml.errors["nvmlVgpuInstanceGetMdevUUID"]
    second = poll(backend)

    assert [v["mdev_uuid"] for v in first["vgpus"]] == [None, None]
    assert "vgpu_mdev_uuid" in first["errors"]
    assert [v["mdev_uuid"] for v in second["vgpus"]] == [MDEV_MODELING, MDEV_TEXTURING]
    assert second["errors"] == {}


def test_older_pynvml_without_the_mdev_call_reports_null_mdev_uuid():
    class OldPynvml(FakeNvml):
        nvmlVgpuInstanceGetMdevUUID = None

    gpu = poll(NvmlBackend(OldPynvml([vgpu_host()])))

    assert [v["mdev_uuid"] for v in gpu["vgpus"]] == [None, None]
    assert [v["vm_uuid"] for v in gpu["vgpus"]] == ["vm-uuid-modeling", "vm-uuid-texturing"]
    assert gpu["errors"] == {}


def test_domain_vm_ids_are_not_reported_as_vm_uuids():
    host = vgpu_host()
    host.vgpus[0].vm_id = "42"
    host.vgpus[0].vm_id_type = pynvml.NVML_VGPU_VM_ID_DOMAIN_ID

    vgpu = poll(NvmlBackend(FakeNvml([host])))["vgpus"][0]

    assert vgpu["vm_uuid"] is None
    assert (vgpu["vm_id"], vgpu["vm_id_type"]) == ("42", "domain")


def test_scheduler_with_adaptive_round_robin_reports_frequency_and_averaging_factor():
    host = vgpu_host(
        scheduler=(pynvml.NVML_VGPU_SCHEDULER_POLICY_EQUAL_SHARE, pynvml.NVML_VGPU_SCHEDULER_ARR_ENABLE, 33, 2_083_333)
    )

    scheduler = poll(NvmlBackend(FakeNvml([host])))["scheduler"]

    assert scheduler["policy"] == "equal_share"
    assert scheduler["arr_mode"] == "enabled"
    assert scheduler["avg_factor"] == 33
    assert scheduler["frequency_hz"] == 480
    assert scheduler["timeslice_ms"] == pytest.approx(2.083, abs=1e-3)


def test_poll_never_makes_blocking_calls():
    # The fake fails the test from inside nvmlDeviceGetPcieThroughput / nvmlDeviceGetSamples.
    nvml = FakeNvml([FakeGpu(), vgpu_host()])
    backend = NvmlBackend(nvml)
    for _ in range(3):
        backend.collect()
    assert "nvmlDeviceGetPcieThroughput" not in nvml.calls
    assert "nvmlDeviceGetSamples" not in nvml.calls


def test_close_shuts_nvml_down():
    nvml = FakeNvml([FakeGpu()])
    backend = NvmlBackend(nvml)
    assert nvml.initialized
    backend.close()
    assert not nvml.initialized


def test_gpu_that_cannot_be_opened_is_left_out_and_the_others_reported():
    class OneGpuLost(FakeNvml):
        def nvmlDeviceGetHandleByIndex(self, index):
            if index == 0:
                raise pynvml.NVMLError(pynvml.NVML_ERROR_GPU_IS_LOST)
            return super().nvmlDeviceGetHandleByIndex(index)

    nvml = OneGpuLost([FakeGpu(uuid="GPU-lost"), FakeGpu(uuid="GPU-fine")])
    (gpu,) = NvmlBackend(nvml).collect()

    assert (gpu["uuid"], gpu["index"]) == ("GPU-fine", 1)


def test_frame_buffer_used_leaves_out_driver_reserved_memory_like_nvidia_smi():
    """On a real H200 NVML's v1 call said 615 MiB used on an idle GPU where nvidia-smi said 0:
    the driver's reserved memory. Admins compare our figures with nvidia-smi, so we read v2."""
    nvml = FakeNvml([FakeGpu(fb_used_mib=0, fb_reserved_mib=615)])
    gpu = poll(NvmlBackend(nvml))
    assert gpu["fb_used_mib"] == 0
    assert gpu["fb_reserved_mib"] == 615


def test_frame_buffer_falls_back_to_v1_where_the_driver_lacks_v2():
    nvml = FakeNvml([FakeGpu(fb_used_mib=1000, fb_reserved_mib=600)])
    nvml.errors["nvmlDeviceGetMemoryInfo_v2"] = pynvml.NVML_ERROR_FUNCTION_NOT_FOUND
    gpu = poll(NvmlBackend(nvml))
    assert gpu["fb_used_mib"] == 1600, "v1 counts reserved memory as used; that is all an old driver gives"
    assert gpu["fb_reserved_mib"] is None
    assert gpu["errors"] == {}


# -- health (issue 19) ------------------------------------------------------------------------


def test_health_reports_injected_faults_and_names_throttle_flags():
    faulty = FakeGpu(
        clock_reasons=0x40 | 0x4,
        ecc_errors={(pynvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED, pynvml.NVML_VOLATILE_ECC): 3,
                    (pynvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED, pynvml.NVML_AGGREGATE_ECC): 7},
        remapped_rows=(2, 1, 1, 0),
        retired_pages={pynvml.NVML_PAGE_RETIREMENT_CAUSE_DOUBLE_BIT_ECC_ERROR: [0x1000, 0x2000]},
        retired_pages_pending=1,
        fan_pct=85,
        pstate=2,
    )
    health = poll(NvmlBackend(FakeNvml([faulty])))["health"]

    assert health["throttle_reasons"] == ["sw_power_cap", "hw_thermal_slowdown"]
    assert (health["ecc_uncorrected_volatile"], health["ecc_uncorrected_aggregate"]) == (3, 7)
    assert health["ecc_corrected_volatile"] == 0
    assert (health["retired_pages_sbe"], health["retired_pages_dbe"], health["retired_pages_pending"]) == (0, 2, True)
    assert health["remapped_rows_uncorrectable"] == 1
    assert health["remapped_rows_pending"] is True
    assert health["remapped_rows_failure"] is False
    assert health["fan_speed_pct"] == 85.0
    assert health["performance_state"] == "P2"
    assert health["unsupported"] == []


def test_unsupported_health_fields_are_null_listed_and_not_asked_again():
    nvml = FakeNvml([FakeGpu(ecc_mode=None, remapped_rows=None, xid_supported=False)])
    backend = NvmlBackend(nvml)
    first, second = poll(backend), poll(backend)

    for gpu in (first, second):
        health = gpu["health"]
        for field in ("ecc_mode", "ecc_uncorrected_volatile", "remapped_rows_failure", "xid_events", "fan_speed_pct"):
            assert health[field] is None, field
            assert field in health["unsupported"], field
        assert gpu["errors"] == {}
    assert nvml.calls["nvmlDeviceGetRemappedRows"] == 1
    assert nvml.calls["nvmlDeviceGetTotalEccErrors"] == 4


def test_transient_health_error_is_named_in_errors_and_retried():
    nvml = FakeNvml([FakeGpu()])
    backend = NvmlBackend(nvml)
    nvml.errors["nvmlDeviceGetRemappedRows"] = pynvml.NVML_ERROR_GPU_IS_LOST
    broken = poll(backend)
    del nvml.errors["nvmlDeviceGetRemappedRows"]
    healed = poll(backend)

    assert broken["health"]["remapped_rows_uncorrectable"] is None
    assert set(broken["errors"]) == {"remapped_rows_correctable", "remapped_rows_uncorrectable",
                                     "remapped_rows_pending", "remapped_rows_failure"}
    assert "remapped_rows_failure" not in broken["health"]["unsupported"]
    assert healed["health"]["remapped_rows_uncorrectable"] == 0
    assert healed["errors"] == {}


def test_fixed_health_values_are_read_once():
    nvml = FakeNvml([FakeGpu()])
    backend = NvmlBackend(nvml)
    for _ in range(3):
        assert poll(backend)["health"]["temp_shutdown_c"] == 95.0

    assert nvml.calls["nvmlDeviceGetEccMode"] == 1
    assert nvml.calls["nvmlDeviceGetTemperatureThreshold"] == 2
    assert nvml.calls["nvmlDeviceGetPcieReplayCounter"] == 3


def test_throttle_reasons_unsupported_with_the_clocks_event_reasons():
    nvml = FakeNvml([FakeGpu()])
    nvml.errors["nvmlDeviceGetCurrentClocksEventReasons"] = pynvml.NVML_ERROR_NOT_SUPPORTED
    nvml.errors["nvmlDeviceGetCurrentClocksThrottleReasons"] = pynvml.NVML_ERROR_NOT_SUPPORTED
    health = poll(NvmlBackend(nvml))["health"]

    assert health["throttle_reasons"] is None
    assert "throttle_reasons" in health["unsupported"]


def _polls_until_xids(backend: NvmlBackend, expected: int) -> list[dict]:
    """Poll until `expected` XIDs have been reported (the event thread hands them over within its
    200 ms wait); returns every poll's GPU dicts. Gives up after 5 s of polls."""
    polls, seen = [], 0
    deadline = time.monotonic() + 5
    while seen < expected and time.monotonic() < deadline:
        gpus = json.loads(json.dumps(backend.collect()))
        polls.append(gpus)
        seen += sum(len(gpu["health"]["xid_events"] or []) for gpu in gpus)
        time.sleep(0.02)
    return polls


def test_xid_events_are_reported_once_on_their_gpu():
    nvml = FakeNvml([FakeGpu(), FakeGpu(uuid="GPU-other", bus_id="00000000:5E:00.0")])
    backend = NvmlBackend(nvml)
    try:
        assert [gpu["health"]["xid_events"] for gpu in backend.collect()] == [[], []]
        before = time.time()
        nvml.xid(1, 79)
        nvml.xid(1, 48)
        polls = _polls_until_xids(backend, 2)
        polls += [json.loads(json.dumps(backend.collect())) for _ in range(2)]
    finally:
        backend.close()

    reported = [event for gpus in polls for event in gpus[1]["health"]["xid_events"]]
    assert [event["code"] for event in reported] == [79, 48], "each XID once, in order"
    assert all(before - 1 <= event["at"] <= time.time() + 1 for event in reported), "dated when they arrived"
    assert all(gpus[0]["health"]["xid_events"] == [] for gpus in polls), "only on the GPU that raised it"
    assert polls[-1][1]["health"]["xid_events"] == []
    assert nvml.registered == nvml.gpus
    assert nvml.event_set_freed


def test_xid_registration_not_supported_on_one_gpu_leaves_the_other_watched():
    nvml = FakeNvml([FakeGpu(xid_supported=False), FakeGpu(uuid="GPU-other", bus_id="00000000:5E:00.0")])
    backend = NvmlBackend(nvml)
    try:
        nvml.xid(1, 13)
        polls = _polls_until_xids(backend, 1)
    finally:
        backend.close()

    assert polls[0][0]["health"]["xid_events"] is None
    assert "xid_events" in polls[0][0]["health"]["unsupported"]
    assert [e["code"] for gpus in polls for e in gpus[1]["health"]["xid_events"]] == [13]


def test_driver_block_reports_versions_and_no_vgpu_release():
    nvml = FakeNvml([FakeGpu()])
    backend = NvmlBackend(nvml)
    block = json.loads(json.dumps(backend.driver()))
    backend.driver()

    assert block == {
        "driver_version": "580.159.04",
        "vgpu_manager_version": None,
        "nvml_version": "12.580.159.04",
        "cuda_driver_version": 13000,
        "unsupported": ["vgpu_manager_version"],
        "errors": {},
    }
    assert nvml.calls["nvmlSystemGetDriverVersion"] == 1, "versions do not change while NVML is up"


def test_vgpu_licence_expiry_guest_driver_and_state():
    host = vgpu_host()
    host.vgpus[1].is_licensed = False
    host.vgpus[1].license_expiry = (0, 0, 0, 0, 0, 0, 0)  # NOT_AVAILABLE
    host.vgpus[1].license_state = 4
    host.vgpus[1].frame_rate_limit = None
    gpu = poll(NvmlBackend(FakeNvml([host])))
    modeling, texturing = gpu["vgpus"]

    assert modeling["license_state"] == "licensed"
    assert modeling["license_expiry"] == dt.datetime(2026, 12, 31, 23, 59, 59, tzinfo=dt.UTC).timestamp()
    assert texturing["license_state"] == "unlicensed"
    assert texturing["license_expiry"] is None
    assert texturing["frame_rate_limit"] is None
    assert texturing["unsupported"] == ["frame_rate_limit"], "the limiter is off for this vGPU"
    assert gpu["errors"] == {}


def test_vgpu_booting_guest_has_no_licence_state_or_driver_yet():
    host = vgpu_host()
    host.vgpus[0].license_state = 1  # UNINITIALIZED
    host.vgpus[0].is_licensed = False
    host.vgpus[0].guest_driver = "Not Available"
    host.vgpus[0].guest_info_state = 0
    row = poll(NvmlBackend(FakeNvml([host])))["vgpus"][0]

    assert (row["license_state"], row["guest_driver_version"], row["guest_info_state"]) == (None, None, "uninitialized")
    assert row["unsupported"] == []


def test_older_driver_without_licence_info_falls_back_to_licence_status():
    nvml = FakeNvml([vgpu_host()])
    nvml.errors["nvmlVgpuInstanceGetLicenseInfo_v2"] = pynvml.NVML_ERROR_FUNCTION_NOT_FOUND
    backend = NvmlBackend(nvml)
    first, second = poll(backend)["vgpus"][0], poll(backend)["vgpus"][0]

    for row in (first, second):
        assert row["license_state"] == "licensed"
        assert row["license_expiry"] is None
        assert row["unsupported"] == ["license_expiry"]
    assert nvml.calls["nvmlVgpuInstanceGetLicenseInfo_v2"] == 2, "once per instance"
    assert nvml.calls["nvmlVgpuInstanceGetLicenseStatus"] == 4


def test_vgpu_transient_licence_error_is_reported_and_retried():
    nvml = FakeNvml([vgpu_host()])
    backend = NvmlBackend(nvml)
    nvml.errors["nvmlVgpuInstanceGetLicenseInfo_v2"] = pynvml.NVML_ERROR_UNKNOWN
    broken = poll(backend)
    del nvml.errors["nvmlVgpuInstanceGetLicenseInfo_v2"]
    healed = poll(backend)

    assert broken["vgpus"][0]["license_state"] is None
    assert "vgpu_license_state" in broken["errors"]
    assert broken["vgpus"][0]["unsupported"] == []
    assert healed["vgpus"][0]["license_state"] == "licensed"
    assert healed["errors"] == {}

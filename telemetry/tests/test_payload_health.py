"""The health fields of agent protocol v1 (issue 19): read with every value, refused with the path
of a bad one, `unsupported` kept, and reports of agents older than the fields still accepted."""

from __future__ import annotations

import copy
import json

import pytest

from telemetry import payload as payload_module
from telemetry.payload import (
    DriverInfo,
    GpuHealth,
    PayloadError,
    VgpuHealth,
    XidEvent,
    parse_agent_payload,
    throttle_names,
)

HEALTH = {
    "ecc_mode": "enabled", "ecc_corrected_volatile": 3, "ecc_uncorrected_volatile": 0,
    "ecc_corrected_aggregate": 12, "ecc_uncorrected_aggregate": 1, "retired_pages_sbe": None,
    "retired_pages_dbe": None, "retired_pages_pending": None, "remapped_rows_correctable": 2,
    "remapped_rows_uncorrectable": 0, "remapped_rows_pending": False, "remapped_rows_failure": False,
    "throttle_reasons": ["gpu_idle", "hw_thermal_slowdown"], "pcie_replay_counter": 0, "fan_speed_pct": None,
    "temp_slowdown_c": 87, "temp_shutdown_c": 92.5, "power_limit_w": 350.0, "performance_state": "P8",
    "xid_events": [{"code": 79, "at": 1_780_000_000.25}, {"code": 48, "at": 1_779_999_990}],
    "unsupported": ["retired_pages_sbe", "retired_pages_dbe", "retired_pages_pending", "fan_speed_pct"],
}
VGPU = {
    "vgpu_uuid": "c25b935b-2fda-58de-839f-1bf62c8441fa", "vm_uuid": "cb36e14e-3c36-5e11-a488-dc7dbdb6efe2",
    "vm_name": "ws-lighting-01", "type_name": "NVIDIA L40S-12Q", "fb_used_mib": 5632, "util_gpu": 30,
    "util_mem": 10, "enc_util": 4, "dec_util": 0,
    "license_state": "licensed", "license_expiry": 1_798_761_600.0, "guest_driver_version": "580.95",
    "frame_rate_limit": 60, "encoder_sessions": 1, "guest_info_state": "initialized", "unsupported": [],
}
DRIVER = {"driver_version": "580.159.04", "vgpu_manager_version": None, "nvml_version": "12.580.159.04",
          "cuda_driver_version": 13000, "unsupported": ["vgpu_manager_version"]}


def _payload(**top) -> dict:
    return {
        "agent": {"version": "1.1.0", "hostname": "render-01", "backend": "nvml"},
        "collected_at": 1_780_000_000.25,
        "driver": copy.deepcopy(DRIVER),
        "gpus": [{
            "uuid": "GPU-0c4f3a52-8f1e-4d6b-9a07-5b2d1e3c4f60", "index": 0, "name": "NVIDIA L40S",
            "pci_bus_id": "00000000:41:00.0", "fb_total_mib": 46068, "virtualization_mode": "vgpu_host",
            "util_gpu": 38, "util_mem": 21, "fb_used_mib": 14336, "enc_util": 4, "dec_util": 0, "temp_c": 52,
            "power_w": 161.2, "sm_clock_mhz": 2490, "clocks_event_reasons": 0x41,
            "health": copy.deepcopy(HEALTH), "vgpus": [copy.deepcopy(VGPU)],
        }],
        **top,
    }


def test_health_driver_and_vgpu_licence_are_read_with_every_value():
    report = parse_agent_payload(_payload())

    (gpu,) = report.gpus
    assert gpu.clocks_event_reasons == 0x41
    assert throttle_names(gpu.clocks_event_reasons) == gpu.health.throttle_reasons
    assert gpu.health == GpuHealth(
        ecc_mode="enabled", ecc_corrected_volatile=3, ecc_uncorrected_volatile=0, ecc_corrected_aggregate=12,
        ecc_uncorrected_aggregate=1, remapped_rows_correctable=2, remapped_rows_uncorrectable=0,
        remapped_rows_pending=False, remapped_rows_failure=False, throttle_reasons=["gpu_idle", "hw_thermal_slowdown"],
        pcie_replay_counter=0, temp_slowdown_c=87, temp_shutdown_c=92.5, power_limit_w=350.0,
        performance_state="P8",
        xid_events=[XidEvent(code=79, at=1_780_000_000.25), XidEvent(code=48, at=1_779_999_990.0)],
        unsupported=["retired_pages_sbe", "retired_pages_dbe", "retired_pages_pending", "fan_speed_pct"])
    assert gpu.vgpus[0].health == VgpuHealth(
        license_state="licensed", license_expiry=1_798_761_600.0, guest_driver_version="580.95",
        frame_rate_limit=60, encoder_sessions=1, guest_info_state="initialized", unsupported=[])
    assert report.driver == DriverInfo(driver_version="580.159.04", nvml_version="12.580.159.04",
                                       cuda_driver_version=13000, unsupported=["vgpu_manager_version"])
    assert not any(event.last_seen for event in gpu.health.xid_events)  # the agent reports events


def test_agents_older_than_the_health_fields_are_accepted_with_none():
    payload = _payload()
    del payload["driver"]
    gpu = payload["gpus"][0]
    del gpu["health"], gpu["clocks_event_reasons"]
    for key in ("license_state", "license_expiry", "guest_driver_version", "frame_rate_limit", "encoder_sessions",
                "guest_info_state", "unsupported"):
        del gpu["vgpus"][0][key]

    report = parse_agent_payload(payload)

    assert report.driver is None
    assert (report.gpus[0].health, report.gpus[0].clocks_event_reasons, report.gpus[0].vgpus[0].health) == (
        None, None, None)


def test_null_health_fields_and_empty_events_are_accepted():
    payload = _payload()
    payload["gpus"][0]["health"] = {"xid_events": [], "unsupported": []}

    health = parse_agent_payload(payload).gpus[0].health

    assert health == GpuHealth()


def _set(path: tuple, value):
    def mutate(payload):
        target = payload
        for key in path[:-1]:
            target = target[key]
        target[path[-1]] = value
    return mutate


H = ("gpus", 0, "health")
V = ("gpus", 0, "vgpus", 0)


@pytest.mark.parametrize(("mutate", "message"), [
    (_set((*H, "ecc_mode"), "on"), "gpus[0].health.ecc_mode: expected one of disabled, enabled or null, got 'on'"),
    (_set((*H, "ecc_corrected_volatile"), -1),
     "gpus[0].health.ecc_corrected_volatile: expected an integer count 0..4611686018427387904 or null, got -1"),
    (_set((*H, "ecc_uncorrected_aggregate"), 1.5), "gpus[0].health.ecc_uncorrected_aggregate: expected an integer"),
    (_set((*H, "retired_pages_sbe"), True), "gpus[0].health.retired_pages_sbe: expected an integer"),
    (_set((*H, "retired_pages_pending"), "no"),
     "gpus[0].health.retired_pages_pending: expected true, false or null, got 'no'"),
    (_set((*H, "remapped_rows_failure"), 0), "gpus[0].health.remapped_rows_failure: expected true, false or null"),
    (_set((*H, "throttle_reasons"), ["too_hot"]), "gpus[0].health.throttle_reasons[0]: expected one of"),
    (_set((*H, "throttle_reasons"), "gpu_idle"), "gpus[0].health.throttle_reasons: expected a list"),
    (_set((*H, "pcie_replay_counter"), 2**63), "gpus[0].health.pcie_replay_counter: expected an integer count"),
    (_set((*H, "fan_speed_pct"), 250), "gpus[0].health.fan_speed_pct: expected a number 0..200"),
    (_set((*H, "temp_slowdown_c"), 500), "gpus[0].health.temp_slowdown_c: expected a number -100..200"),
    (_set((*H, "power_limit_w"), -1), "gpus[0].health.power_limit_w: expected a number of watts"),
    (_set((*H, "performance_state"), "P" * 20), "gpus[0].health.performance_state: expected"),
    (_set((*H, "xid_events"), [{"code": 0, "at": 1.0}]), "gpus[0].health.xid_events[0].code: expected an XID code"),
    (_set((*H, "xid_events"), [{"code": 79, "at": -5}]), "gpus[0].health.xid_events[0].at: expected Unix seconds"),
    (_set((*H, "xid_events"), [{"code": 79}]), "gpus[0].health.xid_events[0]"),
    (_set((*H, "unsupported"), ["not_a_field"]), "gpus[0].health.unsupported[0]: expected one of"),
    (_set(H, []), "gpus[0].health: expected an object"),
    (_set(("gpus", 0, "clocks_event_reasons"), -4), "gpus[0].clocks_event_reasons: expected an integer count"),
    (_set((*V, "license_state"), "yes"), "gpus[0].vgpus[0].license_state: expected one of licensed, unlicensed"),
    (_set((*V, "license_expiry"), "tomorrow"), "gpus[0].vgpus[0].license_expiry: expected Unix seconds"),
    (_set((*V, "frame_rate_limit"), 2**31),
     "gpus[0].vgpus[0].frame_rate_limit: expected an integer count 0..2147483647"),
    (_set((*V, "encoder_sessions"), -1), "gpus[0].vgpus[0].encoder_sessions: expected an integer count"),
    (_set((*V, "guest_info_state"), "booting"), "gpus[0].vgpus[0].guest_info_state: expected one of"),
    (_set((*V, "guest_driver_version"), "5" * 41), "gpus[0].vgpus[0].guest_driver_version: expected"),
    (_set((*V, "unsupported"), ["ecc_mode"]), "gpus[0].vgpus[0].unsupported[0]: expected one of"),
    (_set(("driver",), "580"), "driver: expected an object"),
    (_set(("driver", "cuda_driver_version"), "13.0"), "driver.cuda_driver_version: expected an integer"),
    (_set(("driver", "driver_version"), 580), "driver.driver_version: expected"),
    (_set(("driver", "unsupported"), ["fan_speed_pct"]), "driver.unsupported[0]: expected one of"),
])
def test_bad_health_values_are_refused_with_the_path(mutate, message):
    payload = _payload()
    mutate(payload)

    with pytest.raises(PayloadError) as refused:
        parse_agent_payload(payload)

    assert str(refused.value).startswith(message), str(refused.value)


# The collector reads a well-formed report in one pass (msgspec's typed decoding, payload's "common
# case") and checks everything else field by field. Each value below is put into each field of a
# GPU, its health, its scheduler, a vGPU, the agent and the driver: a report the one pass accepts
# must be one the field-by-field checks accept too, read the same; anything else must still be
# refused with the field's path. Both as a decoded object and as the JSON body the collector gets.
_NASTY = [None, 0, -1, 1, 0.5, 87, 99.5, 100, 100.5, 101, 200, 201, 1000, 10_000, 10_001, 100_000, 100_001, 2**31 - 1,
          2**31, 2**62, 2**62 + 1, 2**63, 2**64, 2**70, 1e11, 1e11 - 1, -100, -101, 46068, 46069, 46068.5, -0.0, True,
          False, "", "x", "P0", "P00000000", "enabled", "licensed", "unlicensed", "initialized", "gpu_idle",
          "x" * 8, "x" * 40, "x" * 41, "\u00e9" * 40, "\U0001f600" * 41, "x" * 81, "x" * 101, [], ["gpu_idle"],
          ["bogus"], [None], ["fan_speed_pct"], ["frame_rate_limit"], ["vgpu_manager_version"],
          [{"code": 79, "at": 1.0}], {}, {"policy": "x"}, float("nan"), float("inf"), 1e400, "__missing__"]


def _with(obj: dict, key: str, value) -> dict:
    changed = copy.deepcopy(obj)
    if value == "__missing__":
        changed.pop(key, None)
    else:
        changed[key] = value
    return changed


def _outcome(parse, data) -> str:
    """The report (its repr: every field, the ones left out of == too) or the refusal's message."""
    try:
        return repr(parse(data))
    except PayloadError as exc:
        return f"refused: {exc}"


def agree(payload: dict) -> bool:
    """Whether the collector reads `payload` as the field-by-field checks do, as an object and as
    JSON; True when it was read in one pass (so the tests can tell they compared that path)."""
    body = json.dumps(payload).encode()  # NaN and infinity as the stdlib writes them
    assert _outcome(parse_agent_payload, payload) == _outcome(payload_module._checked_payload, payload)
    # Not always the object's outcome: orjson reads an integer past 64 bits as a float.
    assert _outcome(parse_agent_payload, body) == _outcome(payload_module._checked_payload, body)
    return payload_module._typed_payload(payload) is not None


def _base() -> dict:
    base = _payload()
    base["gpus"][0]["scheduler"] = {"policy": "equal_share", "arr_mode": "default", "avg_factor": 33,
                                    "timeslice_ms": None, "frequency_hz": 480.0}
    return base


_TARGETS = {
    "gpu": lambda p: p["gpus"][0], "health": lambda p: p["gpus"][0]["health"],
    "xid": lambda p: p["gpus"][0]["health"]["xid_events"][0], "scheduler": lambda p: p["gpus"][0]["scheduler"],
    "vgpu": lambda p: p["gpus"][0]["vgpus"][0], "agent": lambda p: p["agent"], "driver": lambda p: p["driver"],
    "payload": lambda p: p,
}


@pytest.mark.parametrize("where", list(_TARGETS))
def test_the_one_pass_checks_accept_only_what_the_field_by_field_checks_accept(where):
    base = _base()
    assert payload_module._typed_payload(base) is not None, "a well-formed report is read in one pass"
    assert agree(base)
    assert not _outcome(parse_agent_payload, base).startswith("refused")
    compared = one_pass = 0
    for key in [k for k in _TARGETS[where](base) if k not in ("vgpus", "health", "scheduler", "gpus", "xid_events")]:
        for value in _NASTY:
            payload = copy.deepcopy(base)
            target = _TARGETS[where](payload)
            if value == "__missing__":
                del target[key]
            else:
                target[key] = value
            one_pass += agree(payload)
            compared += 1
    assert compared > 100
    assert one_pass > 5, "values the one pass accepts were compared too"

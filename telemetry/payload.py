"""The normalized telemetry report every source is turned into, and the agent protocol v1 validator.

Pure Python (no Django, no ORM): the collector parses ~300 agent payloads a second, and the
source parsers (`telemetry.sources`) and `telemetry.ingest` share these types.

- `Report` is one reading of one host: its physical GPUs (`gpus`), each with the vGPUs running
  on it as the hypervisor sees them (`GpuReading.vgpus`), and `guest_vgpus`: readings taken
  INSIDE a VM, where the "GPU" the driver shows is really a vGPU (its product name is the vGPU
  profile, e.g. "NVIDIA L40S-2Q", and its UUID is the vGPU's). They are kept apart from `gpus`
  on purpose, so nothing that walks `report.gpus` can mistake a vGPU for a physical GPU and,
  say, discover a GPU model called "L40S-2Q". `split_guest_vgpus` does the sorting for every
  source.
- A metric a GPU does not report is None, never 0 (DESIGN.md, agent protocol).
- `parse_agent_payload` checks the protocol strictly: required keys, types, ranges and string
  lengths (so a row can never fail in the database half-way through a batch), and raises
  `PayloadError` naming the path of the first bad value. Keys it does not know are ignored, so
  an agent may add fields without breaking older collectors.
  A well-formed report is decoded and checked in one pass by msgspec (typed wire objects whose
  constraints state the same rules); anything else is checked field by field, which words the
  error.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass, field
from typing import Annotated, Any, Literal

import msgspec
import orjson
from msgspec import UNSET, Meta, Struct, UnsetType

# Longest strings the inventory columns take (fleet.models, telemetry.models).
MAX_HOSTNAME = 100
MAX_UUID = 80
MAX_NAME = 100
MAX_PCI_BUS_ID = 32
MAX_TYPE_NAME = 60
MAX_SHORT = 40

# Bounds a real reading stays within; anything outside is a broken sensor or a broken sender.
MAX_FB_MIB = 16 * 1024 * 1024  # 16 TiB
MAX_POWER_W = 10_000.0
MAX_CLOCK_MHZ = 100_000.0
MIN_TEMP_C, MAX_TEMP_C = -100.0, 200.0

# Agent spelling of NVML's virtualization modes (telemetry.agent.nvml_backend).
VGPU_GUEST = "vgpu_guest"
VGPU_HOST = "vgpu_host"


class PayloadError(ValueError):
    """A report that cannot be accepted; the message names the offending path and value."""


# Named flags of NVML's clocks event (throttle) reason bitmask, nvmlClocksEventReason*.
THROTTLE_FLAGS = {
    0x1: "gpu_idle",
    0x2: "applications_clocks_setting",
    0x4: "sw_power_cap",
    0x8: "hw_slowdown",
    0x10: "sync_boost",
    0x20: "sw_thermal_slowdown",
    0x40: "hw_thermal_slowdown",
    0x80: "hw_power_brake_slowdown",
    0x100: "display_clock_setting",
}
THROTTLE_NAMES = frozenset(THROTTLE_FLAGS.values())
# The flags that mean the GPU is held back by heat or by its power supply, not by choice,
# idleness or its normal power limit: a GPU at full load running at its power cap (sw_power_cap)
# is doing what it was set to do, and is not a fault.
THERMAL_THROTTLES = frozenset({"sw_thermal_slowdown", "hw_thermal_slowdown", "hw_slowdown"})
POWER_THROTTLES = frozenset({"hw_power_brake_slowdown"})

LICENSE_STATES = ("licensed", "unlicensed")
GUEST_INFO_STATES = ("initialized", "uninitialized")
ECC_MODES = ("enabled", "disabled")
MAX_COUNT = 2**62  # an error or replay counter; beyond it the sender is broken
# A frame rate or session count, stored in a 32-bit column: beyond it the sender is broken, and
# the row would fail the batch's transaction on PostgreSQL.
MAX_SMALL_COUNT = 2**31 - 1
MAX_XID_EVENTS = 1000  # per GPU and report; a storm beyond it is cut, and says so in the count


def throttle_names(mask: int) -> list[str]:
    """The named flags set in a clocks event reasons bitmask, lowest bit first."""
    return [name for bit, name in THROTTLE_FLAGS.items() if mask & bit]


@dataclass(slots=True)
class XidEvent:
    """One critical XID error the driver raised on a GPU: its code and when (Unix seconds).

    `last_seen`: the source shows only the code of the GPU's last XID, not each event
    (dcgm-exporter's gauge), and `at` is when it was seen; ingest stores such an event only
    when its code differs from the newest one stored for the GPU. Never set by the agent.
    """

    code: int
    at: float
    last_seen: bool = False


@dataclass(slots=True)
class GpuHealth:
    """What a GPU says about its health. None: the source does not tell, or the GPU does not
    support it; the names of fields the GPU does not support are in `unsupported`."""

    ecc_mode: str | None = None
    ecc_corrected_volatile: int | None = None
    ecc_uncorrected_volatile: int | None = None
    ecc_corrected_aggregate: int | None = None
    ecc_uncorrected_aggregate: int | None = None
    retired_pages_sbe: int | None = None
    retired_pages_dbe: int | None = None
    retired_pages_pending: bool | None = None
    remapped_rows_correctable: int | None = None
    remapped_rows_uncorrectable: int | None = None
    remapped_rows_pending: bool | None = None
    remapped_rows_failure: bool | None = None
    throttle_reasons: list[str] | None = None
    pcie_replay_counter: int | None = None
    fan_speed_pct: float | None = None
    temp_slowdown_c: float | None = None
    temp_shutdown_c: float | None = None
    power_limit_w: float | None = None
    performance_state: str | None = None
    xid_events: list[XidEvent] = field(default_factory=list)
    unsupported: list[str] = field(default_factory=list)


# GpuHealth's state fields (everything but the events), in order: what the inventory stores.
GPU_HEALTH_FIELDS = tuple(name for name in GpuHealth.__slots__ if name != "xid_events")


@dataclass(slots=True)
class VgpuHealth:
    """What NVML says of one vGPU instance's licence and guest (nvmlVgpuInstanceGet*)."""

    license_state: str | None = None
    license_expiry: float | None = None  # Unix seconds; None for a permanent or unknown expiry
    guest_driver_version: str | None = None
    frame_rate_limit: int | None = None
    encoder_sessions: int | None = None
    guest_info_state: str | None = None
    unsupported: list[str] = field(default_factory=list)


VGPU_HEALTH_FIELDS = tuple(VgpuHealth.__slots__)


@dataclass(slots=True)
class DriverInfo:
    """The NVIDIA software on a host: the driver and, on a vGPU host, the vGPU manager."""

    driver_version: str | None = None
    vgpu_manager_version: str | None = None
    nvml_version: str | None = None
    cuda_driver_version: int | None = None
    unsupported: list[str] = field(default_factory=list)


@dataclass(slots=True)
class VgpuReading:
    """One vGPU: utilization figures are shares of the physical GPU, frame buffer in MiB."""

    vgpu_uuid: str | None
    vm_uuid: str | None
    vm_name: str | None
    type_name: str | None
    fb_used_mib: float | None
    util_gpu: float | None
    util_mem: float | None
    enc_util: float | None
    dec_util: float | None
    # The instance's mdev UUID (NVML nvmlVgpuInstanceGetMdevUUID): the device id the hypervisor
    # knows it by. None from agents older than the field, SR-IOV vGPUs (vGPU 17+, no mdev) and
    # sources that do not tell (nvidia-smi, dcgm-exporter, guests).
    mdev_uuid: str | None = None
    # Health (issue 19), None where the source does not tell: see VgpuHealth.
    health: VgpuHealth | None = field(default=None, compare=False)


@dataclass(slots=True)
class GpuReading:
    """One physical GPU: identity (UUID is the key), then metrics, then the vGPUs on it."""

    uuid: str
    index: int
    name: str | None
    pci_bus_id: str | None
    fb_total_mib: float | None
    virtualization_mode: str | None
    util_gpu: float | None
    util_mem: float | None
    fb_used_mib: float | None
    enc_util: float | None
    dec_util: float | None
    temp_c: float | None
    power_w: float | None
    sm_clock_mhz: float | None
    vgpus: list[VgpuReading] = field(default_factory=list)
    # The vGPU scheduler reading (policy, arr_mode, avg_factor, timeslice_ms, frequency_hz), or None.
    # Left out of ==: it is state stored on the GPU row, not part of a sample.
    scheduler: dict | None = field(default=None, compare=False)
    # NVML's clocks event (throttle) reasons bitmask: why the clocks are held back now, or None.
    clocks_event_reasons: int | None = None
    # Health state and events, or None where the source does not tell (older agents).
    health: GpuHealth | None = field(default=None, compare=False)


@dataclass(slots=True)
class Report:
    """What one source said about one host (or, for `guest_vgpus`, one VM) at `collected_at`.

    `collected_at` is Unix seconds by the source's clock; `backend` names the source
    ("nvml", "sim", "nvidia-smi", "dcgm-exporter").
    """

    hostname: str
    backend: str
    collected_at: float
    gpus: list[GpuReading]
    guest_vgpus: list[VgpuReading] = field(default_factory=list)
    # Whether a fleet agent accepts scheduler changes (started with --write-token-file); None for
    # sources that say nothing about it (dcgm-exporter, nvidia-smi documents).
    scheduler_write: bool | None = None
    # The host's NVIDIA software versions, or None where the source does not tell.
    driver: DriverInfo | None = None


# -- names -----------------------------------------------------------------------------------

_VENDOR_PREFIX = re.compile(r"^(?:(?:NVIDIA|GRID)\s+)+", re.IGNORECASE)
# A vGPU type after the vendor prefix: board code, dash, frame buffer in GiB, series letter
# ("L40S-2Q", "RTX6000-12Q", "RTX6000-Ada-4Q", "A100D-20C"). Physical product names never
# end like this ("A100-SXM4-80GB", "H100 PCIe", "GeForce RTX 3080").
_PROFILE = re.compile(r"[A-Za-z0-9][A-Za-z0-9-]*-\d+[QABC]")


def strip_vendor(name: str) -> str:
    """The name without its leading "NVIDIA " / "GRID " (drivers spell one board several ways)."""
    return _VENDOR_PREFIX.sub("", " ".join(name.split()))


def model_key(name: str) -> str:
    """Key on which a reported product name matches a GpuModel name ("NVIDIA L40S" ~ "L40S")."""
    return strip_vendor(name).casefold()


def profile_key(type_name: str) -> str:
    """Key on which a reported vGPU type matches a VgpuProfile name ("GRID RTX6000-12Q" ~ "RTX6000-12Q")."""
    return strip_vendor(type_name).casefold()


def is_vgpu_profile_name(name: str | None) -> bool:
    """True for a product name that is a vGPU type, as a guest VM's driver reports its GPU."""
    return bool(name) and _PROFILE.fullmatch(strip_vendor(name)) is not None


def split_guest_vgpus(gpus: list[GpuReading], vm_name: str) -> tuple[list[GpuReading], list[VgpuReading]]:
    """Separate physical GPUs from the vGPUs a guest VM sees as its GPUs.

    A reading is a guest's vGPU when the driver says so (virtualization mode vgpu_guest) or,
    where the mode is unknown, when its product name is a vGPU type. Inside a guest the VM's
    own UUID is not visible, so the vGPU carries `vm_name` (the guest's hostname) instead.
    """
    physical: list[GpuReading] = []
    guest: list[VgpuReading] = []
    for gpu in gpus:
        mode = gpu.virtualization_mode
        if mode == VGPU_GUEST or (mode is None and is_vgpu_profile_name(gpu.name)):
            guest.append(VgpuReading(
                vgpu_uuid=gpu.uuid, vm_uuid=None, vm_name=vm_name or None,
                type_name=strip_vendor(gpu.name) if gpu.name else None,
                fb_used_mib=gpu.fb_used_mib, util_gpu=gpu.util_gpu, util_mem=gpu.util_mem,
                enc_util=gpu.enc_util, dec_util=gpu.dec_util,
            ))
        else:
            physical.append(gpu)
    return physical, guest


# -- value checks (shared by every source) ------------------------------------------------------

def show(value: Any) -> str:
    """A value as an error message quotes it: repr, cut to a readable length."""
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def check_number(value: Any, path: str, lo: float, hi: float, what: str) -> float | None:
    """`value` if it is a number within lo..hi or None; else PayloadError naming `path`.

    bool is refused although Python counts it as an int; NaN fails the range comparison.
    """
    if value is None:
        return None
    if (type(value) is int or type(value) is float) and lo <= value <= hi:
        return value
    raise PayloadError(f"{path}: expected {what} or null, got {show(value)}")


def check_percent(value: Any, path: str) -> float | None:
    return check_number(value, path, 0, 100, "a number 0..100")


def check_fb(value: Any, path: str, total: float | None) -> float | None:
    """Frame buffer in use: 0..total MiB (0..16 TiB while the total is unknown)."""
    hi = MAX_FB_MIB if total is None else total
    return check_number(value, path, 0, hi, f"a number of MiB 0..{hi:.10g}")


def check_str(value: Any, path: str, max_length: int, *, required: bool = False) -> str | None:
    if value is None and not required:
        return None
    if type(value) is str and 0 < len(value) <= max_length:
        return value
    what = f"a non-empty string of at most {max_length} characters"
    raise PayloadError(f"{path}: expected {what}{'' if required else ' or null'}, got {show(value)}")


def check_count(value: Any, path: str, maximum: int = MAX_COUNT) -> int | None:
    """A counter: an integer 0..`maximum` (2**62 by default) or None."""
    if value is None:
        return None
    if type(value) is int and 0 <= value <= maximum:
        return value
    raise PayloadError(f"{path}: expected an integer count 0..{maximum} or null, got {show(value)}")


def check_flag(value: Any, path: str) -> bool | None:
    if value is None or type(value) is bool:
        return value
    raise PayloadError(f"{path}: expected true, false or null, got {show(value)}")


def check_choice(value: Any, path: str, choices: tuple[str, ...] | frozenset[str]) -> str | None:
    if value is None or (type(value) is str and value in choices):
        return value
    raise PayloadError(f"{path}: expected one of {', '.join(sorted(choices))} or null, got {show(value)}")


def check_names(value: Any, path: str, known: tuple[str, ...] | frozenset[str] | None = None) -> list[str]:
    """A list of field or flag names (each a short string, from `known` where given)."""
    names = []
    for i, name in enumerate(_list(value, path)):
        if known is None:
            names.append(check_str(name, f"{path}[{i}]", MAX_SHORT, required=True))
        else:
            names.append(check_choice(name, f"{path}[{i}]", known) or "")
    return names


def _unsupported(obj: dict, path: str, known: tuple[str, ...]) -> list[str]:
    """The `unsupported` list of a health object: names of its own fields only."""
    return check_names(obj.get("unsupported", []), path + ".unsupported", known)


def _xid_events(value: Any, path: str) -> list[XidEvent]:
    events = []
    for i, item in enumerate(_list(value, path)[:MAX_XID_EVENTS]):
        item = _object(item, f"{path}[{i}]")
        _require(item, ("code", "at"), f"{path}[{i}]")
        code, at = item["code"], item["at"]
        if type(code) is not int or not 0 < code < 100_000:
            raise PayloadError(f"{path}[{i}].code: expected an XID code (an integer 1..99999), got {show(code)}")
        if not ((type(at) is int or type(at) is float) and 0 < at < 1e11):
            raise PayloadError(f"{path}[{i}].at: expected Unix seconds (a positive number), got {show(at)}")
        events.append(XidEvent(code=code, at=float(at)))
    return events


def parse_gpu_health(value: Any, path: str) -> GpuHealth | None:
    """The optional `health` object of a GPU (protocol v1, issue 19), each field checked."""
    if value is None:
        return None
    obj = _object(value, path)
    get = obj.get
    throttles = get("throttle_reasons")
    return GpuHealth(
        ecc_mode=check_choice(get("ecc_mode"), path + ".ecc_mode", ECC_MODES),
        ecc_corrected_volatile=check_count(get("ecc_corrected_volatile"), path + ".ecc_corrected_volatile"),
        ecc_uncorrected_volatile=check_count(get("ecc_uncorrected_volatile"), path + ".ecc_uncorrected_volatile"),
        ecc_corrected_aggregate=check_count(get("ecc_corrected_aggregate"), path + ".ecc_corrected_aggregate"),
        ecc_uncorrected_aggregate=check_count(get("ecc_uncorrected_aggregate"),
                                              path + ".ecc_uncorrected_aggregate"),
        retired_pages_sbe=check_count(get("retired_pages_sbe"), path + ".retired_pages_sbe"),
        retired_pages_dbe=check_count(get("retired_pages_dbe"), path + ".retired_pages_dbe"),
        retired_pages_pending=check_flag(get("retired_pages_pending"), path + ".retired_pages_pending"),
        remapped_rows_correctable=check_count(get("remapped_rows_correctable"),
                                              path + ".remapped_rows_correctable"),
        remapped_rows_uncorrectable=check_count(get("remapped_rows_uncorrectable"),
                                                path + ".remapped_rows_uncorrectable"),
        remapped_rows_pending=check_flag(get("remapped_rows_pending"), path + ".remapped_rows_pending"),
        remapped_rows_failure=check_flag(get("remapped_rows_failure"), path + ".remapped_rows_failure"),
        throttle_reasons=None if throttles is None else check_names(
            throttles, path + ".throttle_reasons", THROTTLE_NAMES),
        pcie_replay_counter=check_count(get("pcie_replay_counter"), path + ".pcie_replay_counter"),
        fan_speed_pct=check_number(get("fan_speed_pct"), path + ".fan_speed_pct", 0, 200, "a number 0..200"),
        temp_slowdown_c=check_number(get("temp_slowdown_c"), path + ".temp_slowdown_c", MIN_TEMP_C, MAX_TEMP_C,
                                     "a number -100..200"),
        temp_shutdown_c=check_number(get("temp_shutdown_c"), path + ".temp_shutdown_c", MIN_TEMP_C, MAX_TEMP_C,
                                     "a number -100..200"),
        power_limit_w=check_number(get("power_limit_w"), path + ".power_limit_w", 0, MAX_POWER_W,
                                   "a number of watts 0..10000"),
        performance_state=check_str(get("performance_state"), path + ".performance_state", 8),
        xid_events=_xid_events(get("xid_events", []), path + ".xid_events"),
        unsupported=_unsupported(obj, path, GPU_HEALTH_FIELDS + ("xid_events",)),
    )


def parse_vgpu_health(obj: dict, path: str) -> VgpuHealth | None:
    """The health keys of a vGPU object, or None when it carries none (an older agent)."""
    if not any(key in obj for key in VGPU_HEALTH_FIELDS):
        return None
    get = obj.get
    return VgpuHealth(
        license_state=check_choice(get("license_state"), path + ".license_state", LICENSE_STATES),
        license_expiry=check_number(get("license_expiry"), path + ".license_expiry", 0, 1e11, "Unix seconds"),
        guest_driver_version=check_str(get("guest_driver_version"), path + ".guest_driver_version", MAX_SHORT),
        frame_rate_limit=check_count(get("frame_rate_limit"), path + ".frame_rate_limit", MAX_SMALL_COUNT),
        encoder_sessions=check_count(get("encoder_sessions"), path + ".encoder_sessions", MAX_SMALL_COUNT),
        guest_info_state=check_choice(get("guest_info_state"), path + ".guest_info_state", GUEST_INFO_STATES),
        unsupported=_unsupported(obj, path, VGPU_HEALTH_FIELDS),
    )


def parse_driver(value: Any, path: str) -> DriverInfo | None:
    """The optional top-level `driver` object: the host's NVIDIA software versions."""
    if value is None:
        return None
    obj = _object(value, path)
    cuda = obj.get("cuda_driver_version")
    if cuda is not None and (type(cuda) is not int or not 0 < cuda < 10_000_000):
        raise PayloadError(f"{path}.cuda_driver_version: expected an integer such as 12080 or null, got {show(cuda)}")
    return DriverInfo(
        driver_version=check_str(obj.get("driver_version"), path + ".driver_version", MAX_SHORT),
        vgpu_manager_version=check_str(obj.get("vgpu_manager_version"), path + ".vgpu_manager_version", MAX_SHORT),
        nvml_version=check_str(obj.get("nvml_version"), path + ".nvml_version", MAX_SHORT),
        cuda_driver_version=cuda,
        unsupported=_unsupported(obj, path, tuple(DriverInfo.__slots__)),
    )


# -- agent protocol v1 ----------------------------------------------------------------------------

_GPU_KEYS = ("uuid", "index", "name", "pci_bus_id", "fb_total_mib", "virtualization_mode", "util_gpu",
             "util_mem", "fb_used_mib", "enc_util", "dec_util", "temp_c", "power_w", "sm_clock_mhz", "vgpus")
_VGPU_KEYS = ("vgpu_uuid", "vm_uuid", "vm_name", "type_name", "fb_used_mib", "util_gpu", "util_mem",
              "enc_util", "dec_util")


def _require(obj: dict, keys: tuple[str, ...], path: str) -> None:
    for key in keys:
        if key not in obj:
            raise PayloadError(f"{path}.{key}: required key missing")


def _object(value: Any, path: str) -> dict:
    if type(value) is not dict:
        raise PayloadError(f"{path}: expected an object, got {show(value)}")
    return value


def _list(value: Any, path: str) -> list:
    if type(value) is not list:
        raise PayloadError(f"{path}: expected a list, got {show(value)}")
    return value


def _vgpu(obj: Any, path: str, gpu_fb_total: float | None) -> VgpuReading:
    obj = _object(obj, path)
    _require(obj, _VGPU_KEYS, path)
    return VgpuReading(
        vgpu_uuid=check_str(obj["vgpu_uuid"], path + ".vgpu_uuid", MAX_UUID),
        vm_uuid=check_str(obj["vm_uuid"], path + ".vm_uuid", MAX_UUID),
        vm_name=check_str(obj["vm_name"], path + ".vm_name", MAX_NAME),
        type_name=check_str(obj["type_name"], path + ".type_name", MAX_TYPE_NAME),
        fb_used_mib=check_fb(obj["fb_used_mib"], path + ".fb_used_mib", gpu_fb_total),
        util_gpu=check_percent(obj["util_gpu"], path + ".util_gpu"),
        util_mem=check_percent(obj["util_mem"], path + ".util_mem"),
        enc_util=check_percent(obj["enc_util"], path + ".enc_util"),
        dec_util=check_percent(obj["dec_util"], path + ".dec_util"),
        # Added to protocol v1 after its first agents: optional, absent reads as null.
        mdev_uuid=check_str(obj.get("mdev_uuid"), path + ".mdev_uuid", MAX_UUID),
        health=parse_vgpu_health(obj, path),
    )


def _gpu(obj: Any, path: str) -> GpuReading:
    obj = _object(obj, path)
    _require(obj, _GPU_KEYS, path)
    index = obj["index"]
    if type(index) is not int or index < 0:
        raise PayloadError(f"{path}.index: expected an integer >= 0, got {show(index)}")
    fb_total = check_number(obj["fb_total_mib"], path + ".fb_total_mib", 0, MAX_FB_MIB, "a number of MiB")
    vgpus = _list(obj["vgpus"], path + ".vgpus")
    return GpuReading(
        uuid=check_str(obj["uuid"], path + ".uuid", MAX_UUID, required=True),
        index=index,
        name=check_str(obj["name"], path + ".name", MAX_NAME),
        pci_bus_id=check_str(obj["pci_bus_id"], path + ".pci_bus_id", MAX_PCI_BUS_ID),
        fb_total_mib=fb_total,
        virtualization_mode=check_str(obj["virtualization_mode"], path + ".virtualization_mode", MAX_SHORT),
        util_gpu=check_percent(obj["util_gpu"], path + ".util_gpu"),
        util_mem=check_percent(obj["util_mem"], path + ".util_mem"),
        fb_used_mib=check_fb(obj["fb_used_mib"], path + ".fb_used_mib", fb_total),
        enc_util=check_percent(obj["enc_util"], path + ".enc_util"),
        dec_util=check_percent(obj["dec_util"], path + ".dec_util"),
        temp_c=check_number(obj["temp_c"], path + ".temp_c", MIN_TEMP_C, MAX_TEMP_C, "a number -100..200"),
        power_w=check_number(obj["power_w"], path + ".power_w", 0, MAX_POWER_W, "a number of watts 0..10000"),
        sm_clock_mhz=check_number(obj["sm_clock_mhz"], path + ".sm_clock_mhz", 0, MAX_CLOCK_MHZ,
                                  "a number of MHz 0..100000"),
        vgpus=[_vgpu(v, f"{path}.vgpus[{i}]", fb_total) for i, v in enumerate(vgpus)],
        scheduler=_scheduler(obj.get("scheduler"), path + ".scheduler"),
        clocks_event_reasons=check_count(obj.get("clocks_event_reasons"), path + ".clocks_event_reasons"),
        health=parse_gpu_health(obj.get("health"), path + ".health"),
    )


def _scheduler(value: Any, path: str) -> dict | None:
    """The optional `scheduler` object of a GPU, with only its known keys, each checked."""
    if value is None:
        return None
    obj = _object(value, path)
    return {
        "policy": check_str(obj.get("policy"), path + ".policy", MAX_SHORT),
        "arr_mode": check_str(obj.get("arr_mode"), path + ".arr_mode", MAX_SHORT),
        "avg_factor": check_number(obj.get("avg_factor"), path + ".avg_factor", 0, 1000, "a number 0..1000"),
        "timeslice_ms": check_number(obj.get("timeslice_ms"), path + ".timeslice_ms", 0, 1000, "ms 0..1000"),
        "frequency_hz": check_number(obj.get("frequency_hz"), path + ".frequency_hz", 0, 100_000, "Hz 0..100000"),
    }


def check_unique_uuids(gpus: list[GpuReading], what: str = "gpus") -> None:
    """Refuse a report that lists one GPU twice: its two readings would fight over one sample."""
    seen: dict[str, int] = {}
    for position, gpu in enumerate(gpus):
        first = seen.setdefault(gpu.uuid, position)
        if first != position:
            raise PayloadError(f"{what}[{position}].uuid: {gpu.uuid!r} is already {what}[{first}]")


def _loads(data: bytes | bytearray | str) -> Any:
    """JSON decoded by orjson (the collector parses ~1,000 reports a second, ~4x faster than the
    stdlib's); what orjson refuses is decoded again by the stdlib, so the errors (line and column),
    and what the stdlib accepts beyond orjson (NaN, integers past 64 bits, UTF-16), stay as they were."""
    try:
        return orjson.loads(data)
    except orjson.JSONDecodeError:
        return json.loads(data)


# -- the common case, decoded and checked in one pass -------------------------------------------
# The collector reads ~1,000 reports a second, each of 8 GPUs and 32 vGPUs (~24 KB): decoding the
# JSON into dicts (orjson), then checking every field in Python, cost ~0.16 ms a report of CPU
# (bench/parse.py). msgspec decodes a body straight into the wire types below, checking types,
# ranges, lengths and names in C as it goes, and skipping the keys they do not name (as the
# functions above ignore them); the readings are then built from their values. The wire types
# state the same rules as the functions above. Whatever they refuse, for any reason (and a frame
# buffer in use beyond its GPU's total, or a GPU listed twice), is decoded again and checked field
# by field (`_checked_payload`), which accepts it or refuses it with the message naming its path.
# So they must accept a SUBSET of what those accept, reading the same values: int or float as
# sent, absent or null alike (tests/test_payload_typed.py and test_payload_health.py hold the two
# to that, with mutated reports).


def _number(lo: float, hi: float) -> Any:
    """A number within lo..hi or null, kept an int or a float as sent (as check_number); a bool is
    neither, and NaN fails the range."""
    return Annotated[int, Meta(ge=math.ceil(lo), le=math.floor(hi))] | Annotated[
        float, Meta(ge=float(lo), le=float(hi))] | None


def _text(max_length: int) -> Any:
    """A non-empty string of at most `max_length` characters (as check_str)."""
    return Annotated[str, Meta(min_length=1, max_length=max_length)]


def _count(maximum: int = MAX_COUNT) -> Any:
    """An integer count 0..`maximum` or null (as check_count)."""
    return Annotated[int, Meta(ge=0, le=maximum)] | None


_Uuid, _Name, _PciBusId, _TypeName, _Short = (_text(MAX_UUID), _text(MAX_NAME), _text(MAX_PCI_BUS_ID),
                                               _text(MAX_TYPE_NAME), _text(MAX_SHORT))
_Percent = _number(0, 100)
_Mib = _number(0, MAX_FB_MIB)  # and within the GPU's total: checked after decoding, as it spans two fields
_Temp = _number(MIN_TEMP_C, MAX_TEMP_C)
_UnixSeconds = Annotated[float, Meta(gt=0, lt=1e11)]  # an int is read as its float, as float(collected_at)
_SmallCount = _count(MAX_SMALL_COUNT)
_Count = _count()
_Flag = bool | None
_XidCode = Annotated[int, Meta(gt=0, lt=100_000)]
_ThrottleName = Literal[tuple(sorted(THROTTLE_NAMES))]
_GpuHealthName = Literal[GPU_HEALTH_FIELDS + ("xid_events",)]
_VgpuHealthName = Literal[VGPU_HEALTH_FIELDS]
_DriverName = Literal[tuple(DriverInfo.__slots__)]


# Wire objects live only while a report is read and never form a cycle: no need for the GC to track them.
class _XidWire(Struct, gc=False):
    code: _XidCode
    at: _UnixSeconds


class _GpuHealthWire(Struct, gc=False):
    ecc_mode: Literal[ECC_MODES] | None = None
    ecc_corrected_volatile: _Count = None
    ecc_uncorrected_volatile: _Count = None
    ecc_corrected_aggregate: _Count = None
    ecc_uncorrected_aggregate: _Count = None
    retired_pages_sbe: _Count = None
    retired_pages_dbe: _Count = None
    retired_pages_pending: _Flag = None
    remapped_rows_correctable: _Count = None
    remapped_rows_uncorrectable: _Count = None
    remapped_rows_pending: _Flag = None
    remapped_rows_failure: _Flag = None
    throttle_reasons: list[_ThrottleName] | None = None
    pcie_replay_counter: _Count = None
    fan_speed_pct: _number(0, 200) = None
    temp_slowdown_c: _Temp = None
    temp_shutdown_c: _Temp = None
    power_limit_w: _number(0, MAX_POWER_W) = None
    performance_state: _text(8) | None = None
    # Longer lists are cut to their first MAX_XID_EVENTS, unchecked beyond: that is _xid_events' to do.
    xid_events: Annotated[list[_XidWire], Meta(max_length=MAX_XID_EVENTS)] = []
    unsupported: list[_GpuHealthName] = []


class _SchedulerWire(Struct, gc=False):
    policy: _Short | None = None
    arr_mode: _Short | None = None
    avg_factor: _number(0, 1000) = None
    timeslice_ms: _number(0, 1000) = None
    frequency_hz: _number(0, 100_000) = None


class _VgpuWire(Struct, gc=False):
    vgpu_uuid: _Uuid | None
    vm_uuid: _Uuid | None
    vm_name: _Name | None
    type_name: _TypeName | None
    fb_used_mib: _Mib
    util_gpu: _Percent
    util_mem: _Percent
    enc_util: _Percent
    dec_util: _Percent
    mdev_uuid: _Uuid | None = None
    # The health keys sit beside the reading; UNSET (absent) tells an agent older than them (no
    # health at all) from one that sends null.
    license_state: Literal[LICENSE_STATES] | None | UnsetType = UNSET
    license_expiry: _number(0, 1e11) | UnsetType = UNSET
    guest_driver_version: _Short | None | UnsetType = UNSET
    frame_rate_limit: _SmallCount | UnsetType = UNSET
    encoder_sessions: _SmallCount | UnsetType = UNSET
    guest_info_state: Literal[GUEST_INFO_STATES] | None | UnsetType = UNSET
    unsupported: list[_VgpuHealthName] | UnsetType = UNSET


class _GpuWire(Struct, gc=False):
    uuid: _Uuid
    # Unbounded field by field, but orjson reads an integer past 64 bits as a float, which that refuses.
    index: Annotated[int, Meta(ge=0, le=2**63 - 1)]
    name: _Name | None
    pci_bus_id: _PciBusId | None
    fb_total_mib: _Mib
    virtualization_mode: _Short | None
    util_gpu: _Percent
    util_mem: _Percent
    fb_used_mib: _Mib
    enc_util: _Percent
    dec_util: _Percent
    temp_c: _Temp
    power_w: _number(0, MAX_POWER_W)
    sm_clock_mhz: _number(0, MAX_CLOCK_MHZ)
    vgpus: list[_VgpuWire]
    scheduler: _SchedulerWire | None = None
    clocks_event_reasons: _Count = None
    health: _GpuHealthWire | None = None


class _DriverWire(Struct, gc=False):
    driver_version: _Short | None = None
    vgpu_manager_version: _Short | None = None
    nvml_version: _Short | None = None
    cuda_driver_version: Annotated[int, Meta(gt=0, lt=10000000)] | None = None
    unsupported: list[_DriverName] = []


class _AgentWire(Struct, gc=False):
    version: _Short
    hostname: _text(MAX_HOSTNAME)
    backend: _Short
    scheduler_write: bool = False


class _PayloadWire(Struct, gc=False):
    agent: _AgentWire
    collected_at: _UnixSeconds
    gpus: list[_GpuWire]
    driver: _DriverWire | None = None


_decoder = msgspec.json.Decoder(_PayloadWire)
# Anything msgspec will not read (text with a lone surrogate cannot be UTF-8): checked field by field.
_REFUSED = (msgspec.MsgspecError, UnicodeError)


# The objects are built from the decoded values in field order: each wire type lists its fields in
# the order of the reading it becomes (tests/test_payload_typed.py holds them to it).
_values = msgspec.structs.astuple


def _vgpu_health_from(values: tuple) -> VgpuHealth | None:
    """The health keys of a vGPU (VGPU_HEALTH_FIELDS' values), UNSET where absent: None when all are."""
    if UNSET not in values:
        return VgpuHealth(*values)
    if all(value is UNSET for value in values):
        return None  # an agent older than the fields
    *values, unsupported = (None if value is UNSET else value for value in values)
    return VgpuHealth(*values, [] if unsupported is None else unsupported)


def _gpu_health_from(wire: _GpuHealthWire | None) -> GpuHealth | None:
    if wire is None:
        return None
    health = GpuHealth(*_values(wire))
    if health.xid_events:
        health.xid_events = [XidEvent(event.code, event.at) for event in health.xid_events]
    return health


_SCHEDULER_KEYS = ("policy", "arr_mode", "avg_factor", "timeslice_ms", "frequency_hz")


def _scheduler_from(wire: _SchedulerWire | None) -> dict | None:
    if wire is None:
        return None
    return dict(zip(_SCHEDULER_KEYS, _values(wire), strict=True))


def _gpu_from(wire: _GpuWire) -> GpuReading | None:
    """The GPU's reading, or None where a frame buffer in use exceeds the GPU's total."""
    values = _values(wire)
    fb_total, fb_used = values[4], values[8]
    if fb_total is not None and fb_used is not None and fb_used > fb_total:
        return None
    vgpus = []
    for vgpu in values[14]:
        vgpu_values = _values(vgpu)
        if fb_total is not None and vgpu_values[4] is not None and vgpu_values[4] > fb_total:
            return None
        vgpus.append(VgpuReading(*vgpu_values[:10], _vgpu_health_from(vgpu_values[10:])))
    return GpuReading(*values[:14], vgpus, _scheduler_from(values[15]), values[16], _gpu_health_from(values[17]))


def _typed_payload(data: bytes | bytearray | str | dict) -> Report | None:
    """The report of a body (or decoded object) the typed checks accept, or None: then
    `_checked_payload` reads it field by field."""
    try:
        if type(data) is dict:
            wire = msgspec.convert(data, _PayloadWire)
        elif isinstance(data, (bytes, bytearray, str)):
            wire = _decoder.decode(data)
        else:
            return None
    except _REFUSED:
        return None
    gpus = []
    for gpu in wire.gpus:
        reading = _gpu_from(gpu)
        if reading is None:
            return None
        gpus.append(reading)
    if len({gpu.uuid for gpu in gpus}) != len(gpus):
        return None  # a GPU listed twice: refused field by field, naming both places
    agent = wire.agent
    physical, guest = split_guest_vgpus(gpus, agent.hostname)
    return Report(hostname=agent.hostname, backend=agent.backend, collected_at=wire.collected_at, gpus=physical,
                  guest_vgpus=guest, scheduler_write=agent.scheduler_write,
                  driver=None if wire.driver is None else DriverInfo(*_values(wire.driver)))


def parse_agent_payload(data: bytes | str | dict) -> Report:
    """The `Report` in one `GET /v1/metrics` answer of a host agent, or PayloadError.

    `data` is the raw body (bytes or str) or an already decoded JSON object. A well-formed report
    is read in one pass by msgspec; anything else is checked field by field.
    """
    report = _typed_payload(data)
    return _checked_payload(data) if report is None else report


def _checked_payload(data: bytes | str | dict) -> Report:
    """`parse_agent_payload` field by field: the report, or PayloadError naming the first bad value."""
    if isinstance(data, (bytes, bytearray, str)):
        try:
            data = _loads(data)
        except UnicodeDecodeError as exc:
            raise PayloadError(f"invalid JSON: not UTF-8 ({exc.reason} at byte {exc.start})") from None
        except json.JSONDecodeError as exc:
            raise PayloadError(f"invalid JSON: {exc.msg} at line {exc.lineno} column {exc.colno}") from None
    top = _object(data, "payload")
    _require(top, ("agent", "collected_at", "gpus"), "payload")
    agent = _object(top["agent"], "agent")
    _require(agent, ("version", "hostname", "backend"), "agent")
    check_str(agent["version"], "agent.version", MAX_SHORT, required=True)
    hostname = check_str(agent["hostname"], "agent.hostname", MAX_HOSTNAME, required=True)
    backend = check_str(agent["backend"], "agent.backend", MAX_SHORT, required=True)
    scheduler_write = agent.get("scheduler_write", False)
    if type(scheduler_write) is not bool:
        raise PayloadError(f"agent.scheduler_write: expected true or false, got {show(scheduler_write)}")
    collected_at = top["collected_at"]
    if not ((type(collected_at) is int or type(collected_at) is float) and 0 < collected_at < 1e11):
        raise PayloadError(f"collected_at: expected Unix seconds (a positive number), got {show(collected_at)}")
    gpus = [_gpu(g, f"gpus[{i}]") for i, g in enumerate(_list(top["gpus"], "gpus"))]
    check_unique_uuids(gpus)
    physical, guest = split_guest_vgpus(gpus, hostname)
    return Report(hostname=hostname, backend=backend, collected_at=float(collected_at), gpus=physical,
                  guest_vgpus=guest, scheduler_write=scheduler_write, driver=parse_driver(top.get("driver"), "driver"))

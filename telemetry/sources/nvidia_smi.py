"""`nvidia-smi -q -x` documents (DTD v11 to v13) turned into a `Report`.

Where no agent runs (a locked-down hypervisor, a guest VM), a cron job POSTs this document to
`/api/v1/ingest/nvidia-smi/`. What the parser does, and why:
- It parses with defusedxml: the body comes from the network, so a document declaring
  entities (billion laughs) or external references is refused with `PayloadError`, never
  expanded. The `<!DOCTYPE nvidia_smi_log SYSTEM "nvsmi_device_vNN.dtd">` line every real
  document has is allowed (it is never fetched).
- It reads only the direct children of each `<gpu>`: an A100 in MIG mode repeats
  `fb_memory_usage` inside every `<mig_device>`, which must not be taken for the GPU's.
- Values carry units ("9184 MiB", "65 %", "27 C", "139.62 W", "1950 MHz"); "N/A", "Not
  Supported" and bracketed states ("[N/A]", "[Not Supported]", "[Unknown Error]") mean the GPU
  does not report the metric: None. Any other text where a number belongs is a PayloadError.
- Power: v11/v12 print `power_draw`; v13 prints `average_power_draw` (the 1-second average
  that NVML's power reading, and so the agent, reports) and `instant_power_draw`. The first
  present of power_draw, average_power_draw, instant_power_draw is taken.
- Virtualization modes are spelled as the agent spells them: None -> "none", Pass-Through
  -> "passthrough", VGPU -> "vgpu_guest", Host VGPU -> "vgpu_host", Host VSGA -> "vsga_host".
- A guest VM's document (mode "VGPU", product name a vGPU type such as "NVIDIA L40S-2Q" or
  "GRID T4-4Q") describes a vGPU, not a GPU: it lands in `Report.guest_vgpus` with the VM name
  the caller gives as `hostname` (see `telemetry.payload.split_guest_vgpus`).
- A vGPU host's document may list the running vGPUs in a `<vgpus>` element, one child per vGPU
  instance. The element names follow nvidia-smi's vGPU labels (VM UUID, VM Name, vGPU Name,
  vGPU UUID, FB Memory Usage, Utilization): `vm_uuid` (or `vm_id` when that is a UUID; ESXi and
  Xen give a domain id, which names no VM), `vm_name`, `vgpu_name` (or `vgpu_type_name`),
  `vgpu_uuid`, `fb_memory_usage/used`, and `utilization` (or `vgpu_instance_utilization`) with
  `gpu_util`, `memory_util`, `encoder_util`, `decoder_util`.
- Health (issue 19), into the same fields as the agent's (`telemetry.payload.GpuHealth`,
  `VgpuHealth`, `DriverInfo`). An element that says N/A, Not Supported or "[...]" is null and
  its field is named in `unsupported`; a missing element (older DTDs) is null only. Where
  nvidia-smi splits a count the agent reads whole, it is summed: ECC errors of DTD v12+ come as
  SRAM and DRAM counts (v13 splits uncorrectable SRAM into parity and SEC-DED), each summed
  into corrected and uncorrected; older documents give `single_bit/total`/`double_bit/total`.
  Throttle reasons are `clocks_event_reasons` (v12+) or `clocks_throttle_reasons` (older),
  each `..._reason_<flag>` "Active" or "Not Active": the active flags, named as the
  contract names them (`display_clocks_setting` is `display_clock_setting`), and their
  NVML bitmask in `clocks_event_reasons`. Temperatures: `gpu_temp_slow_threshold` and
  `gpu_temp_max_threshold` (shutdown), in C; Hopper's v13 documents give only offsets from
  T.Limit there, which are not stored. Power limit: the enforced one (`enforced_power_limit`,
  v13's `current_power_limit`). Per vGPU instance: `license_status` ("Licensed (Expiry:
  2026-12-1 9:15:2 GMT)", "Unlicensed (Restricted)", ...), `guest_driver_version`,
  `frame_rate_limit` ("60 FPS") and `encoder_stats/session_count`. The document's
  `driver_version` and `cuda_version` ("12.2" -> 12020) are `Report.driver`, for documents of
  physical GPUs only (a guest's describes the VM's driver). nvidia-smi shows no XID events and
  no vGPU manager release: those stay empty.
- `<timestamp>` is the host's local time without a zone ("Fri Aug  4 11:44:30 2023"). Given
  the time the document arrived (`received_at`), the parser takes the UTC offset (a multiple of
  15 minutes, as every time zone's is) that brings the stamp nearest to it; so a document sent
  twice keeps one instant (and is stored once), and a host clock that is off by more than the
  allowed skew is still caught by `telemetry.ingest`. Without `received_at` the stamp is
  read as UTC.
"""

from __future__ import annotations

import re
import uuid as uuid_lib
from datetime import UTC, datetime
from xml.etree.ElementTree import Element, ParseError

from defusedxml import DefusedXmlException
from defusedxml.ElementTree import fromstring

from telemetry.payload import (
    MAX_CLOCK_MHZ,
    MAX_COUNT,
    MAX_FB_MIB,
    MAX_HOSTNAME,
    MAX_NAME,
    MAX_PCI_BUS_ID,
    MAX_POWER_W,
    MAX_SHORT,
    MAX_SMALL_COUNT,
    MAX_TEMP_C,
    MAX_TYPE_NAME,
    MAX_UUID,
    MIN_TEMP_C,
    THROTTLE_FLAGS,
    DriverInfo,
    GpuHealth,
    GpuReading,
    PayloadError,
    Report,
    VgpuHealth,
    VgpuReading,
    check_fb,
    check_number,
    check_percent,
    check_str,
    check_unique_uuids,
    show,
    split_guest_vgpus,
)

BACKEND = "nvidia-smi"

_VIRTUALIZATION_MODES = {
    "none": "none",
    "pass-through": "passthrough",
    "vgpu": "vgpu_guest",
    "host vgpu": "vgpu_host",
    "host vsga": "vsga_host",
}
# States nvidia-smi prints where a value would be; bracketed ones ("[N/A]") are caught apart.
_NOT_AVAILABLE = {"n/a", "not supported", "not available", "unknown", "unknown error",
                  "insufficient permissions", "gpu is lost", "gpu requires reset"}
_NUMBER = re.compile(r"(-?\d+(?:\.\d+)?)\s*([A-Za-z%]*)")
_FB_UNITS = {"MiB": 1.0, "GiB": 1024.0, "KiB": 1 / 1024, "": 1.0}
_TIMESTAMP = re.compile(r"[A-Za-z]{3}\s+([A-Za-z]{3})\s+(\d{1,2})\s+(\d{1,2}):(\d{2}):(\d{2})\s+(\d{4})")
_MONTHS = {m: i for i, m in enumerate(("jan", "feb", "mar", "apr", "may", "jun", "jul", "aug", "sep", "oct",
                                       "nov", "dec"), start=1)}
_QUARTER_HOUR_S = 900
# Time zones run from UTC-12 to UTC+14.
_MIN_OFFSET_S, _MAX_OFFSET_S = -12 * 3600, 14 * 3600


def _text(parent: Element, path: str) -> str | None:
    """Stripped text of parent/path, or None where the element is missing or says N/A."""
    element = parent.find(path)
    if element is None or element.text is None:
        return None
    text = element.text.strip()
    if not text or text.startswith("[") or text.casefold() in _NOT_AVAILABLE:
        return None
    return text


def _quantity(parent: Element, paths: tuple[str, ...], where: str, units: dict[str, float]) -> float | None:
    """The first of `paths` that holds a value, converted by its unit; None if none does."""
    for path in paths:
        text = _text(parent, path)
        if text is None:
            continue
        match = _NUMBER.fullmatch(text)
        if match is None or match.group(2) not in units:
            expected = " or ".join(repr(f"12 {u}".strip()) for u in units if u)
            raise PayloadError(f"{where}/{path}: expected a value like {expected}, got {show(text)}")
        return float(match.group(1)) * units[match.group(2)]
    return None


def _percent(parent: Element, path: str, where: str) -> float | None:
    return check_percent(_quantity(parent, (path,), where, {"%": 1.0, "": 1.0}), f"{where}/{path}")


def _virtualization_mode(gpu: Element) -> str | None:
    text = _text(gpu, "gpu_virtualization_mode/virtualization_mode")
    if text is None:
        return None
    key = text.casefold()
    return _VIRTUALIZATION_MODES.get(key) or re.sub(r"\W+", "_", key)[:MAX_SHORT]


def _vm_uuid(instance: Element) -> str | None:
    text = _text(instance, "vm_uuid") or _text(instance, "vm_id")
    if text is None:
        return None
    try:
        return str(uuid_lib.UUID(text))
    except ValueError:
        return None  # a hypervisor domain id, not a UUID


def _vgpu(instance: Element, where: str, gpu_fb_total: float | None) -> VgpuReading:
    utilization = instance.find("utilization")
    if utilization is None:
        utilization = instance.find("vgpu_instance_utilization")
    if utilization is None:
        utilization = Element("utilization")
    util_where = f"{where}/{utilization.tag}"
    type_name = _text(instance, "vgpu_name") or _text(instance, "vgpu_type_name")
    fb_used = _quantity(instance, ("fb_memory_usage/used",), where, _FB_UNITS)
    return VgpuReading(
        vgpu_uuid=check_str(_text(instance, "vgpu_uuid"), f"{where}/vgpu_uuid", MAX_UUID),
        vm_uuid=_vm_uuid(instance),
        vm_name=check_str(_text(instance, "vm_name"), f"{where}/vm_name", MAX_NAME),
        type_name=check_str(type_name, f"{where}/vgpu_name", MAX_TYPE_NAME),
        fb_used_mib=check_fb(fb_used, f"{where}/fb_memory_usage/used", gpu_fb_total),
        util_gpu=_percent(utilization, "gpu_util", util_where),
        util_mem=_percent(utilization, "memory_util", util_where),
        enc_util=_percent(utilization, "encoder_util", util_where),
        dec_util=_percent(utilization, "decoder_util", util_where),
        health=_vgpu_health(instance, where),
    )


def _gpu(gpu: Element, index: int) -> GpuReading:
    where = f"gpu[{index}]"
    fb_total = check_number(_quantity(gpu, ("fb_memory_usage/total",), where, _FB_UNITS),
                            f"{where}/fb_memory_usage/total", 0, MAX_FB_MIB, "a number of MiB")
    fb_used = _quantity(gpu, ("fb_memory_usage/used",), where, _FB_UNITS)
    power = _quantity(gpu, ("power_readings/power_draw", "gpu_power_readings/power_draw",
                            "gpu_power_readings/average_power_draw", "gpu_power_readings/instant_power_draw"),
                      where, {"W": 1.0, "": 1.0})
    vgpus = gpu.find("vgpus")
    instances = [child for child in vgpus if len(child)] if vgpus is not None else []
    health, throttle_mask = _gpu_health(gpu, where)
    return GpuReading(
        uuid=check_str(_text(gpu, "uuid"), f"{where}/uuid", MAX_UUID, required=True),
        index=index,
        name=check_str(_text(gpu, "product_name"), f"{where}/product_name", MAX_NAME),
        pci_bus_id=check_str(_text(gpu, "pci/pci_bus_id") or gpu.get("id"), f"{where}/pci/pci_bus_id",
                             MAX_PCI_BUS_ID),
        fb_total_mib=fb_total,
        virtualization_mode=_virtualization_mode(gpu),
        util_gpu=_percent(gpu, "utilization/gpu_util", where),
        util_mem=_percent(gpu, "utilization/memory_util", where),
        fb_used_mib=check_fb(fb_used, f"{where}/fb_memory_usage/used", fb_total),
        enc_util=_percent(gpu, "utilization/encoder_util", where),
        dec_util=_percent(gpu, "utilization/decoder_util", where),
        temp_c=check_number(_quantity(gpu, ("temperature/gpu_temp",), where, {"C": 1.0, "": 1.0}),
                            f"{where}/temperature/gpu_temp", MIN_TEMP_C, MAX_TEMP_C, "a temperature -100..200 C"),
        power_w=check_number(power, f"{where}/power_draw", 0, MAX_POWER_W, "a power 0..10000 W"),
        sm_clock_mhz=check_number(_quantity(gpu, ("clocks/sm_clock",), where, {"MHz": 1.0, "": 1.0}),
                                  f"{where}/clocks/sm_clock", 0, MAX_CLOCK_MHZ, "a clock 0..100000 MHz"),
        vgpus=[_vgpu(child, f"{where}/vgpus/{child.tag}[{i}]", fb_total) for i, child in enumerate(instances)],
        clocks_event_reasons=throttle_mask,
        health=health,
    )


_NA = object()  # an element that is there but says N/A, Not Supported, "[...]"
_YES_NO = {"yes": True, "no": False}
_ECC_MODES = {"enabled": "enabled", "disabled": "disabled"}
_FLAG_BITS = {name: bit for bit, name in THROTTLE_FLAGS.items()}
# nvidia-smi's spelling of a flag where it differs from NVML's (and the contract's).
_FLAG_ALIASES = {"display_clocks_setting": "display_clock_setting"}
_PSTATE = re.compile(r"P\d{1,2}")
_CUDA = re.compile(r"(\d{1,3})\.(\d{1,2})")
_EXPIRY = re.compile(r"\(\s*Expiry:\s*([^)]*?)\s*(?:GMT|UTC)?\s*\)", re.IGNORECASE)


def _raw(parent: Element, path: str):
    """The element's stripped text, `_NA` where it is there but not available, None where missing."""
    element = parent.find(path)
    if element is None:
        return None
    text = (element.text or "").strip()
    if len(element) and not text:
        return text  # a container: it is there
    if not text or text.startswith("[") or text.casefold() in _NOT_AVAILABLE:
        return _NA
    return text


class _Health:
    """Reads the fields of one health object, collecting the names of those not available."""

    def __init__(self, parent: Element, where: str):
        self.parent, self.where, self.unsupported = parent, where, []

    def text(self, name: str, *paths: str) -> str | None:
        """The first of `paths` with a value; `name` is unsupported when one is there but none has one."""
        seen = False
        for path in paths:
            value = _raw(self.parent, path)
            if value is _NA:
                seen = True
            elif value is not None:
                return value
        if seen:
            self.unsupported.append(name)
        return None

    def number(self, name: str, paths: tuple[str, ...], units: dict[str, float], low: float, high: float,
               what: str) -> float | None:
        text = self.text(name, *paths)
        if text is None:
            return None
        path = next(p for p in paths if _raw(self.parent, p) == text)
        match = _NUMBER.fullmatch(text)
        if match is None or match.group(2) not in units:
            raise PayloadError(f"{self.where}/{path}: expected {what}, got {show(text)}")
        return check_number(float(match.group(1)) * units[match.group(2)], f"{self.where}/{path}", low, high, what)

    def count(self, name: str, *paths: str, maximum: int = MAX_COUNT) -> int | None:
        text = self.text(name, *paths)
        if text is None:
            return None
        if not text.isdigit() or int(text) > maximum:
            path = next(p for p in paths if _raw(self.parent, p) == text)
            raise PayloadError(f"{self.where}/{path}: expected an integer count 0..{maximum}, got {show(text)}")
        return int(text)

    def choice(self, name: str, path: str, choices: dict[str, object]):
        text = self.text(name, path)
        if text is None:
            return None
        if text.casefold() not in choices:
            raise PayloadError(f"{self.where}/{path}: expected one of {', '.join(choices)}, got {show(text)}")
        return choices[text.casefold()]

    def total(self, name: str, parent: str, parts: tuple[str, ...]) -> int | None:
        """The sum of the counts `parts` under `parent` that have one (nvidia-smi's split of one NVML
        count); unsupported when they are there and none has a value."""
        values, seen = [], False
        for part in parts:
            path = f"{parent}/{part}"
            value = _raw(self.parent, path)
            if value is _NA:
                seen = True
            elif value is not None:
                if not value.isdigit() or int(value) > MAX_COUNT:
                    raise PayloadError(f"{self.where}/{path}: expected an integer count, got {show(value)}")
                values.append(int(value))
        if values:
            return sum(values)
        if seen:
            self.unsupported.append(name)
        return None


# ECC counts as nvidia-smi splits them: SRAM and DRAM (v12+; v13 splits uncorrectable SRAM into
# parity and SEC-DED), or per unit with a total (older documents).
_CORRECTED = ("sram_correctable", "dram_correctable", "single_bit/total")
_UNCORRECTED = ("sram_uncorrectable", "sram_uncorrectable_parity", "sram_uncorrectable_secded", "dram_uncorrectable",
                "double_bit/total")


def _throttles(gpu: Element, read: _Health) -> tuple[list[str] | None, int | None]:
    """The active throttle flags and their bitmask, from clocks_event_reasons (or the older
    clocks_throttle_reasons); (None, None) where the document has neither."""
    for container, prefix in (("clocks_event_reasons", "clocks_event_reason_"),
                              ("clocks_throttle_reasons", "clocks_throttle_reason_")):
        element = gpu.find(container)
        if element is None:
            continue
        active, mask, known = [], 0, False
        for child in element:
            flag = child.tag.removeprefix(prefix)
            flag = _FLAG_ALIASES.get(flag, flag)
            state = (child.text or "").strip().casefold()
            if flag not in _FLAG_BITS or state not in ("active", "not active"):
                continue  # a flag newer than the contract, or not available
            known = True
            if state == "active":
                active.append(flag)
                mask |= _FLAG_BITS[flag]
        if not known:
            read.unsupported.append("throttle_reasons")
            return None, None
        return sorted(active, key=_FLAG_BITS.__getitem__), mask
    return None, None


def _gpu_health(gpu: Element, where: str) -> tuple[GpuHealth, int | None]:
    """A GPU's health and its throttle bitmask (see the module docstring)."""
    read = _Health(gpu, where)
    remapped = _raw(gpu, "remapped_rows")
    throttles, mask = _throttles(gpu, read)
    health = GpuHealth(
        ecc_mode=read.choice("ecc_mode", "ecc_mode/current_ecc", _ECC_MODES),
        ecc_corrected_volatile=read.total("ecc_corrected_volatile", "ecc_errors/volatile", _CORRECTED),
        ecc_uncorrected_volatile=read.total("ecc_uncorrected_volatile", "ecc_errors/volatile", _UNCORRECTED),
        ecc_corrected_aggregate=read.total("ecc_corrected_aggregate", "ecc_errors/aggregate", _CORRECTED),
        ecc_uncorrected_aggregate=read.total("ecc_uncorrected_aggregate", "ecc_errors/aggregate", _UNCORRECTED),
        retired_pages_sbe=read.count("retired_pages_sbe", "retired_pages/multiple_single_bit_retirement/retired_count"),
        retired_pages_dbe=read.count("retired_pages_dbe", "retired_pages/double_bit_retirement/retired_count"),
        retired_pages_pending=(
            read.choice("retired_pages_pending", "retired_pages/pending_retirement", _YES_NO)
            if gpu.find("retired_pages/pending_retirement") is not None
            else read.choice("retired_pages_pending", "retired_pages/pending_blacklist", _YES_NO)),
        throttle_reasons=throttles,
        pcie_replay_counter=read.count("pcie_replay_counter", "pci/replay_counter"),
        fan_speed_pct=read.number("fan_speed_pct", ("fan_speed",), {"%": 1.0, "": 1.0}, 0, 200,
                                  "a fan speed like '46 %'"),
        temp_slowdown_c=read.number("temp_slowdown_c", ("temperature/gpu_temp_slow_threshold",), {"C": 1.0, "": 1.0},
                                    MIN_TEMP_C, MAX_TEMP_C, "a temperature -100..200 C"),
        temp_shutdown_c=read.number("temp_shutdown_c", ("temperature/gpu_temp_max_threshold",), {"C": 1.0, "": 1.0},
                                    MIN_TEMP_C, MAX_TEMP_C, "a temperature -100..200 C"),
        power_limit_w=read.number("power_limit_w", ("power_readings/enforced_power_limit",
                                                    "gpu_power_readings/enforced_power_limit",
                                                    "gpu_power_readings/current_power_limit",
                                                    "power_readings/current_power_limit"),
                                  {"W": 1.0, "": 1.0}, 0, MAX_POWER_W, "a power 0..10000 W"),
        performance_state=read.text("performance_state", "performance_state"),
    )
    if remapped is _NA:  # before Ampere: one N/A for the four
        read.unsupported += ["remapped_rows_correctable", "remapped_rows_uncorrectable", "remapped_rows_pending",
                             "remapped_rows_failure"]
    elif remapped is not None:
        health.remapped_rows_correctable = read.count("remapped_rows_correctable", "remapped_rows/remapped_row_corr")
        health.remapped_rows_uncorrectable = read.count("remapped_rows_uncorrectable",
                                                        "remapped_rows/remapped_row_unc")
        health.remapped_rows_pending = read.choice("remapped_rows_pending", "remapped_rows/remapped_row_pending",
                                                   _YES_NO)
        health.remapped_rows_failure = read.choice("remapped_rows_failure", "remapped_rows/remapped_row_failure",
                                                   _YES_NO)
    if health.performance_state is not None and not _PSTATE.fullmatch(health.performance_state):
        raise PayloadError(f"{where}/performance_state: expected P0..P15, got {show(health.performance_state)}")
    health.unsupported = read.unsupported
    return health, mask


def _license(text: str, where: str) -> tuple[str, float | None]:
    """(license_state, expiry in Unix seconds or None) of a vGPU's `license_status`."""
    state = text.casefold()
    if state.startswith("unlicensed"):
        return "unlicensed", None
    if not state.startswith("licensed"):
        raise PayloadError(f"{where}: expected 'Licensed (Expiry: ...)' or 'Unlicensed (...)', got {show(text)}")
    match = _EXPIRY.search(text)
    if match is None or match.group(1).casefold() in _NOT_AVAILABLE:
        return "licensed", None
    try:
        expiry = datetime.strptime(" ".join(match.group(1).split()), "%Y-%m-%d %H:%M:%S").replace(tzinfo=UTC)
    except ValueError:
        raise PayloadError(f"{where}: expected an expiry like 2026-12-1 9:15:2 GMT, got {show(text)}") from None
    return "licensed", expiry.timestamp()


_VGPU_HEALTH_ELEMENTS = ("license_status", "guest_driver_version", "frame_rate_limit", "encoder_stats")


def _vgpu_health(instance: Element, where: str) -> VgpuHealth | None:
    """A vGPU instance's licence and guest, or None where the document shows none of it."""
    if not any(instance.find(tag) is not None for tag in _VGPU_HEALTH_ELEMENTS):
        return None
    read = _Health(instance, where)
    status = read.text("license_state", "license_status")
    state, expiry = _license(status, f"{where}/license_status") if status else (None, None)
    if status is None and "license_state" in read.unsupported:
        read.unsupported.append("license_expiry")
    frame_rate = read.number("frame_rate_limit", ("frame_rate_limit",), {"FPS": 1.0, "fps": 1.0, "": 1.0}, 0,
                             MAX_SMALL_COUNT, "a frame rate like '60 FPS'")
    return VgpuHealth(
        license_state=state,
        license_expiry=expiry,
        guest_driver_version=check_str(read.text("guest_driver_version", "guest_driver_version"),
                                       f"{where}/guest_driver_version", MAX_SHORT),
        frame_rate_limit=None if frame_rate is None else int(frame_rate),
        encoder_sessions=read.count("encoder_sessions", "encoder_stats/session_count", maximum=MAX_SMALL_COUNT),
        unsupported=read.unsupported,
    )


def _driver(root: Element) -> DriverInfo | None:
    """The document's driver and CUDA versions, or None where it names neither."""
    driver, cuda = _text(root, "driver_version"), _text(root, "cuda_version")
    if driver is None and cuda is None:
        return None
    cuda_version = None
    if cuda is not None:
        match = _CUDA.fullmatch(cuda)
        if match is None:
            raise PayloadError(f"cuda_version: expected a version like 12.2, got {show(cuda)}")
        cuda_version = int(match.group(1)) * 1000 + int(match.group(2)) * 10
    return DriverInfo(driver_version=check_str(driver, "driver_version", MAX_SHORT), cuda_driver_version=cuda_version)


def document_time(text: str | None, received_at: float | None = None) -> float:
    """Unix seconds of a `<timestamp>` (local time, no zone): see the module docstring."""
    match = _TIMESTAMP.fullmatch(" ".join((text or "").split()))
    month = _MONTHS.get(match.group(1).casefold()) if match else None
    if match is None or month is None:
        raise PayloadError(f"timestamp: expected a date like 'Fri Aug  4 11:44:30 2023', got {show(text)}")
    day, hour, minute, second, year = (int(g) for g in match.group(2, 3, 4, 5, 6))
    try:
        as_utc = datetime(year, month, day, hour, minute, second, tzinfo=UTC).timestamp()
    except ValueError as exc:
        raise PayloadError(f"timestamp: {show(text)} is no valid date ({exc})") from None
    if received_at is None:
        return as_utc
    offset = round((as_utc - received_at) / _QUARTER_HOUR_S) * _QUARTER_HOUR_S
    return as_utc - min(max(offset, _MIN_OFFSET_S), _MAX_OFFSET_S)


def parse_nvidia_smi(data: bytes | str, hostname: str = "", received_at: float | None = None) -> Report:
    """The `Report` in one `nvidia-smi -q -x` document, or PayloadError.

    `hostname` names the host (or, for a guest VM's document, the VM): the document itself
    does not. `received_at` (Unix seconds) resolves the document's zoneless timestamp.
    """
    try:
        root = fromstring(data)
    except DefusedXmlException as exc:
        raise PayloadError(f"refused XML: {exc}; nvidia-smi documents declare no entities") from None
    except ParseError as exc:
        raise PayloadError(f"malformed XML: {exc}") from None
    if root.tag != "nvidia_smi_log":
        raise PayloadError(f"not an nvidia-smi -q -x document: the root element is <{root.tag}>, "
                           f"expected <nvidia_smi_log>")
    if hostname:
        check_str(hostname, "hostname", MAX_HOSTNAME)
    collected_at = document_time(root.findtext("timestamp"), received_at)
    gpus = [_gpu(element, index) for index, element in enumerate(root.findall("gpu"))]
    check_unique_uuids(gpus, "gpu")
    physical, guest = split_guest_vgpus(gpus, hostname)
    return Report(hostname=hostname, backend=BACKEND, collected_at=collected_at, gpus=physical, guest_vgpus=guest,
                  driver=_driver(root) if physical else None)

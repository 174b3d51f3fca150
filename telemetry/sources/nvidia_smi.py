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
    MAX_FB_MIB,
    MAX_HOSTNAME,
    MAX_NAME,
    MAX_PCI_BUS_ID,
    MAX_POWER_W,
    MAX_SHORT,
    MAX_TEMP_C,
    MAX_TYPE_NAME,
    MAX_UUID,
    MIN_TEMP_C,
    GpuReading,
    PayloadError,
    Report,
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
    )


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
    return Report(hostname=hostname, backend=BACKEND, collected_at=collected_at, gpus=physical, guest_vgpus=guest)

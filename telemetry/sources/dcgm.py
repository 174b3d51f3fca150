"""dcgm-exporter's `/metrics` (Prometheus text) turned into a `Report`.

Parsed with `prometheus_client.parser` (STYLE.md: no hand-written parsers). One series per
GPU and field, labelled `gpu` (index), `UUID`, `device`, `modelName`, `Hostname`,
`pci_bus_id`; the GPU is keyed by its `UUID` label, as everywhere else.
- Frame buffer: dcgm-exporter exports used and free MiB (`DCGM_FI_DEV_FB_USED`,
  `DCGM_FI_DEV_FB_FREE`), not the total; the total is used + free, plus
  `DCGM_FI_DEV_FB_RESERVED` where the exporter is configured to export it (NVML's total,
  which the agent and nvidia-smi report, counts the driver's reservation).
- Series of a MIG instance (a non-empty `GPU_I_ID` label) describe a slice, not the GPU, and
  are skipped; dcgm-exporter reports no vGPUs, so `vgpus` is always empty.
- NaN means "no value" in Prometheus: None. Any other value out of range is a PayloadError
  naming the series.
- Utilization: `DCGM_FI_DEV_GPU_UTIL`, or where the exporter does not export it (its
  profiling counters replace it on A100/H100 setups) `DCGM_FI_PROF_GR_ENGINE_ACTIVE`, a 0..1
  ratio of time the graphics engine was busy, x100.
- Health (issue 19) into the agent's fields (`telemetry.payload.GpuHealth`): ECC volatile and
  aggregate totals (SBE corrected, DBE uncorrected), retired pages, remapped rows, the clocks
  event (throttle) reasons bitmask (`DCGM_FI_DEV_CLOCKS_EVENT_REASONS`, or the older
  `DCGM_FI_DEV_CLOCK_THROTTLE_REASONS`) with its named flags, PCIe replays, fan speed, the
  enforced power limit (`DCGM_FI_DEV_POWER_MGMT_LIMIT`, W) and the performance state
  (`DCGM_FI_DEV_PSTATE`). A GPU has health only where the scrape carries at least one of
  these fields; a field the exporter does not export is null (not told), not unsupported:
  dcgm-exporter drops a field the GPU does not support rather than say so.
- XID: `DCGM_FI_DEV_XID_ERRORS` is a gauge holding the code of the LAST XID the GPU raised,
  0 before any, and it keeps that value until the driver or DCGM restarts (NVIDIA/DCGM#277,
  dcgm-exporter#190); the exporter stamps nothing and the collector keeps no state between
  polls. So a non-zero value is reported as one `XidEvent` marked `last_seen` and stamped with
  the scrape time, and ingest stores it only when it differs from the newest XID stored for
  that GPU (so a held value is one event, not one per poll). Limits: the same code raised
  twice in a row is seen once, an XID replaced by another between two polls is missed, and
  the time is when the poll saw it, not when the driver raised it. The nvml agent reports
  each event with its time.
- `DCGM_FI_DEV_VGPU_LICENSE_STATUS` (1 licensed, 0 not) exists only for the vGPU a guest's
  exporter sees: it becomes the licence of that guest vGPU reading. The `DCGM_FI_DRIVER_VERSION`
  label every series carries is `Report.driver` (for scrapes of physical GPUs only: a guest's
  names the VM's driver).
"""

from __future__ import annotations

import math
import time

from prometheus_client.parser import text_string_to_metric_families

from telemetry.payload import (
    MAX_CLOCK_MHZ,
    MAX_COUNT,
    MAX_FB_MIB,
    MAX_HOSTNAME,
    MAX_NAME,
    MAX_PCI_BUS_ID,
    MAX_POWER_W,
    MAX_SHORT,
    MAX_TEMP_C,
    MAX_UUID,
    MIN_TEMP_C,
    DriverInfo,
    GpuHealth,
    GpuReading,
    PayloadError,
    Report,
    VgpuHealth,
    XidEvent,
    check_fb,
    check_number,
    check_percent,
    check_str,
    show,
    split_guest_vgpus,
    throttle_names,
)

BACKEND = "dcgm-exporter"

# dcgm-exporter field -> GpuReading attribute.
FIELDS = {
    "DCGM_FI_DEV_GPU_UTIL": "util_gpu",
    "DCGM_FI_DEV_MEM_COPY_UTIL": "util_mem",
    "DCGM_FI_DEV_FB_USED": "fb_used_mib",
    "DCGM_FI_DEV_FB_FREE": "fb_free_mib",
    "DCGM_FI_DEV_FB_RESERVED": "fb_reserved_mib",
    "DCGM_FI_DEV_ENC_UTIL": "enc_util",
    "DCGM_FI_DEV_DEC_UTIL": "dec_util",
    "DCGM_FI_DEV_GPU_TEMP": "temp_c",
    "DCGM_FI_DEV_POWER_USAGE": "power_w",
    "DCGM_FI_DEV_SM_CLOCK": "sm_clock_mhz",
    "DCGM_FI_PROF_GR_ENGINE_ACTIVE": "gr_engine_active",
}
# dcgm-exporter field -> GpuHealth attribute, and how its value is read.
HEALTH_FIELDS = {
    "DCGM_FI_DEV_ECC_SBE_VOL_TOTAL": "ecc_corrected_volatile",
    "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL": "ecc_uncorrected_volatile",
    "DCGM_FI_DEV_ECC_SBE_AGG_TOTAL": "ecc_corrected_aggregate",
    "DCGM_FI_DEV_ECC_DBE_AGG_TOTAL": "ecc_uncorrected_aggregate",
    "DCGM_FI_DEV_RETIRED_SBE": "retired_pages_sbe",
    "DCGM_FI_DEV_RETIRED_DBE": "retired_pages_dbe",
    "DCGM_FI_DEV_RETIRED_PENDING": "retired_pages_pending",
    "DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS": "remapped_rows_correctable",
    "DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS": "remapped_rows_uncorrectable",
    "DCGM_FI_DEV_ROW_REMAP_PENDING": "remapped_rows_pending",
    "DCGM_FI_DEV_ROW_REMAP_FAILURE": "remapped_rows_failure",
    "DCGM_FI_DEV_PCIE_REPLAY_COUNTER": "pcie_replay_counter",
    "DCGM_FI_DEV_FAN_SPEED": "fan_speed_pct",
    "DCGM_FI_DEV_POWER_MGMT_LIMIT": "power_limit_w",
    "DCGM_FI_DEV_PSTATE": "performance_state",
    "DCGM_FI_DEV_CLOCKS_EVENT_REASONS": "clocks_event_reasons",
    "DCGM_FI_DEV_CLOCK_THROTTLE_REASONS": "clocks_event_reasons",
    "DCGM_FI_DEV_XID_ERRORS": "xid",
    "DCGM_FI_DEV_VGPU_LICENSE_STATUS": "license",
}
_FLAGS = {"retired_pages_pending", "remapped_rows_pending", "remapped_rows_failure"}
_COUNTS = {"ecc_corrected_volatile", "ecc_uncorrected_volatile", "ecc_corrected_aggregate",
           "ecc_uncorrected_aggregate", "retired_pages_sbe", "retired_pages_dbe", "remapped_rows_correctable",
           "remapped_rows_uncorrectable", "pcie_replay_counter", "clocks_event_reasons"}
_THROTTLE_BITS = 0x1FF  # the flags the contract names; newer bits are kept in the mask only
_PERCENT = {"util_gpu", "util_mem", "enc_util", "dec_util"}
_FB = {"fb_used_mib", "fb_free_mib", "fb_reserved_mib"}


def _series(name: str, labels: dict[str, str]) -> str:
    return f'{name}{{UUID="{labels.get("UUID", "")}"}}'


def _health_value(field: str, value: float, where: str) -> int | float | bool | str | None:
    """A health series' value as its GpuHealth field holds it."""
    if math.isnan(value):
        return None
    if field in _COUNTS or field == "xid":
        if value != int(value) or not 0 <= value <= MAX_COUNT:
            raise PayloadError(f"{where}: expected an integer count >= 0, got {show(value)}")
        return int(value)
    if field in _FLAGS or field == "license":
        if value not in (0, 1):
            raise PayloadError(f"{where}: expected 0 or 1, got {show(value)}")
        return value == 1
    if field == "fan_speed_pct":
        return check_number(value, where, 0, 200, "a fan speed 0..200 %")
    if field == "power_limit_w":
        return check_number(value, where, 0, MAX_POWER_W, "a power 0..10000 W")
    if value != int(value) or not 0 <= value <= 15:  # DCGM_FI_DEV_PSTATE: 0..15, 32 is "unknown"
        if value == 32:
            return None
        raise PayloadError(f"{where}: expected a performance state 0..15, got {show(value)}")
    return f"P{int(value)}"


def _health(values: dict, collected_at: float) -> tuple[GpuHealth | None, int | None]:
    """The GPU's health and throttle bitmask from its health series, (None, mask) where it has none."""
    mask = values.pop("clocks_event_reasons", None)
    xid = values.pop("xid", None)
    values.pop("license", None)
    if not values and mask is None and xid is None:
        return None, None
    health = GpuHealth(**values)
    if mask is not None:
        health.throttle_reasons = throttle_names(mask & _THROTTLE_BITS)
    if xid:
        health.xid_events = [XidEvent(code=xid, at=collected_at, last_seen=True)]
    return health, mask


def _value(field: str, value: float, where: str) -> float | None:
    if math.isnan(value):
        return None
    if field == "gr_engine_active":  # a 0..1 ratio
        return check_percent(check_number(value, where, 0, 1, "a ratio 0..1") * 100, where)
    if field in _PERCENT:
        return check_percent(value, where)
    if field in _FB:
        return check_number(value, where, 0, MAX_FB_MIB, "a number of MiB")
    if field == "temp_c":
        return check_number(value, where, MIN_TEMP_C, MAX_TEMP_C, "a temperature -100..200 C")
    if field == "power_w":
        return check_number(value, where, 0, MAX_POWER_W, "a power 0..10000 W")
    return check_number(value, where, 0, MAX_CLOCK_MHZ, "a clock 0..100000 MHz")


def parse_dcgm_metrics(data: bytes | str, hostname: str = "", collected_at: float | None = None) -> Report:
    """The `Report` in one dcgm-exporter scrape, or PayloadError.

    `hostname` overrides the exporter's `Hostname` label (in Kubernetes that label is the
    pod's name, not the node's); `collected_at` is the scrape time (now when not given), as
    dcgm-exporter stamps no samples.
    """
    if isinstance(data, (bytes, bytearray)):
        try:
            data = data.decode()
        except UnicodeDecodeError as exc:
            raise PayloadError(f"invalid metrics text: not UTF-8 ({exc.reason} at byte {exc.start})") from None
    gpus: dict[str, dict] = {}
    health: dict[str, dict] = {}
    labels_of: dict[str, dict[str, str]] = {}
    collected_at = time.time() if collected_at is None else collected_at
    try:
        for family in text_string_to_metric_families(data):
            field = FIELDS.get(family.name)
            health_field = HEALTH_FIELDS.get(family.name)
            if field is None and health_field is None:
                continue
            for sample in family.samples:
                labels = sample.labels
                if labels.get("GPU_I_ID"):
                    continue
                where = _series(sample.name, labels)
                uuid = check_str(labels.get("UUID") or None, f"{where}: label UUID", MAX_UUID, required=True)
                values = gpus.setdefault(uuid, {})
                labels_of.setdefault(uuid, labels)
                if field is not None:
                    values[field] = _value(field, sample.value, where)
                else:
                    health.setdefault(uuid, {})[health_field] = _health_value(health_field, sample.value, where)
    except PayloadError:
        raise
    except ValueError as exc:
        raise PayloadError(f"invalid Prometheus text: {exc}") from None

    readings = []
    for uuid, values in gpus.items():
        labels = labels_of[uuid]
        where = _series("DCGM_FI_DEV_FB_USED", labels)
        try:
            index = int(labels.get("gpu", ""))
        except ValueError:
            raise PayloadError(f"{where}: label gpu: expected a GPU index, got {show(labels.get('gpu'))}") from None
        used, free = values.get("fb_used_mib"), values.get("fb_free_mib")
        util = values["util_gpu"] if "util_gpu" in values else values.get("gr_engine_active")
        gpu_health, throttle_mask = _health(dict(health.get(uuid, {})), collected_at)
        total = None if used is None or free is None else used + free + (values.get("fb_reserved_mib") or 0)
        readings.append(GpuReading(
            uuid=uuid,
            index=index,
            name=check_str(labels.get("modelName") or None, f"{where}: label modelName", MAX_NAME),
            pci_bus_id=check_str(labels.get("pci_bus_id") or None, f"{where}: label pci_bus_id", MAX_PCI_BUS_ID),
            fb_total_mib=total,
            virtualization_mode=None,
            util_gpu=util,
            util_mem=values.get("util_mem"),
            fb_used_mib=check_fb(used, where, total),
            enc_util=values.get("enc_util"),
            dec_util=values.get("dec_util"),
            temp_c=values.get("temp_c"),
            power_w=values.get("power_w"),
            sm_clock_mhz=values.get("sm_clock_mhz"),
            clocks_event_reasons=throttle_mask,
            health=gpu_health,
        ))
    readings.sort(key=lambda gpu: gpu.index)
    name = hostname or next((lbl.get("Hostname") for lbl in labels_of.values() if lbl.get("Hostname")), "")
    if name:
        check_str(name, "hostname", MAX_HOSTNAME)
    physical, guest = split_guest_vgpus(readings, name)
    for reading in guest:
        licensed = health.get(reading.vgpu_uuid, {}).get("license")
        if licensed is not None:
            reading.health = VgpuHealth(license_state="licensed" if licensed else "unlicensed")
    return Report(hostname=name, backend=BACKEND, collected_at=collected_at, gpus=physical, guest_vgpus=guest,
                  driver=_driver(labels_of) if physical else None)


def _driver(labels_of: dict[str, dict[str, str]]) -> DriverInfo | None:
    """The driver version the exporter labels every series with, or None without the label."""
    version = next((lbl["DCGM_FI_DRIVER_VERSION"] for lbl in labels_of.values() if lbl.get("DCGM_FI_DRIVER_VERSION")),
                   None)
    if version is None:
        return None
    return DriverInfo(driver_version=check_str(version, "label DCGM_FI_DRIVER_VERSION", MAX_SHORT))

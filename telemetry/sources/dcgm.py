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
"""

from __future__ import annotations

import math
import time

from prometheus_client.parser import text_string_to_metric_families

from telemetry.payload import (
    MAX_CLOCK_MHZ,
    MAX_FB_MIB,
    MAX_HOSTNAME,
    MAX_NAME,
    MAX_PCI_BUS_ID,
    MAX_POWER_W,
    MAX_TEMP_C,
    MAX_UUID,
    MIN_TEMP_C,
    GpuReading,
    PayloadError,
    Report,
    check_fb,
    check_number,
    check_percent,
    check_str,
    show,
    split_guest_vgpus,
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
}
_PERCENT = {"util_gpu", "util_mem", "enc_util", "dec_util"}
_FB = {"fb_used_mib", "fb_free_mib", "fb_reserved_mib"}


def _series(name: str, labels: dict[str, str]) -> str:
    return f'{name}{{UUID="{labels.get("UUID", "")}"}}'


def _value(field: str, value: float, where: str) -> float | None:
    if math.isnan(value):
        return None
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
    labels_of: dict[str, dict[str, str]] = {}
    try:
        for family in text_string_to_metric_families(data):
            field = FIELDS.get(family.name)
            if field is None:
                continue
            for sample in family.samples:
                labels = sample.labels
                if labels.get("GPU_I_ID"):
                    continue
                where = _series(sample.name, labels)
                uuid = check_str(labels.get("UUID") or None, f"{where}: label UUID", MAX_UUID, required=True)
                values = gpus.setdefault(uuid, {})
                labels_of.setdefault(uuid, labels)
                values[field] = _value(field, sample.value, where)
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
        total = None if used is None or free is None else used + free + (values.get("fb_reserved_mib") or 0)
        readings.append(GpuReading(
            uuid=uuid,
            index=index,
            name=check_str(labels.get("modelName") or None, f"{where}: label modelName", MAX_NAME),
            pci_bus_id=check_str(labels.get("pci_bus_id") or None, f"{where}: label pci_bus_id", MAX_PCI_BUS_ID),
            fb_total_mib=total,
            virtualization_mode=None,
            util_gpu=values.get("util_gpu"),
            util_mem=values.get("util_mem"),
            fb_used_mib=check_fb(used, where, total),
            enc_util=values.get("enc_util"),
            dec_util=values.get("dec_util"),
            temp_c=values.get("temp_c"),
            power_w=values.get("power_w"),
            sm_clock_mhz=values.get("sm_clock_mhz"),
        ))
    readings.sort(key=lambda gpu: gpu.index)
    name = hostname or next((lbl.get("Hostname") for lbl in labels_of.values() if lbl.get("Hostname")), "")
    if name:
        check_str(name, "hostname", MAX_HOSTNAME)
    physical, guest = split_guest_vgpus(readings, name)
    return Report(hostname=name, backend=BACKEND, collected_at=time.time() if collected_at is None else collected_at,
                  gpus=physical, guest_vgpus=guest)

"""GPU and vGPU health fields of agent protocol v1 (issue 19): names and conversions both backends share.

The fields were added to protocol v1 without a version bump (older agents omit them). Every
object that carries them lists, in `unsupported`, the fields its GPU or driver cannot report:
those are null, never 0, and a reader of the document tells "no errors" from "cannot tell".

Stdlib only, like the rest of the package.
"""

from __future__ import annotations

import calendar
from typing import Any

# Top-level "driver" block of GET /v1/metrics.
DRIVER_FIELDS = ("driver_version", "vgpu_manager_version", "nvml_version", "cuda_driver_version")

# Per-GPU "health" object, in the contract's order (xid_events and unsupported come last).
GPU_HEALTH_FIELDS = (
    "ecc_mode",
    "ecc_corrected_volatile",
    "ecc_uncorrected_volatile",
    "ecc_corrected_aggregate",
    "ecc_uncorrected_aggregate",
    "retired_pages_sbe",
    "retired_pages_dbe",
    "retired_pages_pending",
    "remapped_rows_correctable",
    "remapped_rows_uncorrectable",
    "remapped_rows_pending",
    "remapped_rows_failure",
    "throttle_reasons",
    "pcie_replay_counter",
    "fan_speed_pct",
    "temp_slowdown_c",
    "temp_shutdown_c",
    "power_limit_w",
    "performance_state",
    "xid_events",
)

# Keys added to each entry of gpu["vgpus"].
VGPU_HEALTH_FIELDS = (
    "license_state",
    "license_expiry",
    "guest_driver_version",
    "frame_rate_limit",
    "encoder_sessions",
    "guest_info_state",
)

# nvml.h nvmlClocksEventReason* (formerly nvmlClocksThrottleReason*): bit -> protocol name.
THROTTLE_REASONS = (
    (0x1, "gpu_idle"),
    (0x2, "applications_clocks_setting"),
    (0x4, "sw_power_cap"),
    (0x8, "hw_slowdown"),
    (0x10, "sync_boost"),
    (0x20, "sw_thermal_slowdown"),
    (0x40, "hw_thermal_slowdown"),
    (0x80, "hw_power_brake_slowdown"),
    (0x100, "display_clock_setting"),
)
REASON_BITS = {name: bit for bit, name in THROTTLE_REASONS}

# nvml.h nvmlVgpuLicenseExpiry_t.status. pynvml declares these with a trailing comma (tuples),
# so the numbers are kept here.
LICENSE_EXPIRY_VALID = 2


def throttle_flags(mask: int | None) -> list[str] | None:
    """The named flags set in a clocks event reasons bitmask, in bit order; None stays None.

    Bits the contract does not name (newer drivers add some) are left out rather than guessed."""
    if mask is None:
        return None
    return [name for bit, name in THROTTLE_REASONS if mask & bit]


def license_expiry_seconds(expiry: Any) -> float | None:
    """Unix seconds of an nvmlVgpuLicenseExpiry_t (UTC calendar fields) whose status is VALID;
    None for a permanent, unknown or not applicable expiry, or fields that make no date."""
    if getattr(expiry, "status", None) != LICENSE_EXPIRY_VALID:
        return None
    # timegm rolls month 0 or day 0 over into another date; a real expiry never has them.
    if not (1 <= expiry.month <= 12 and 1 <= expiry.day <= 31):
        return None
    try:
        return float(calendar.timegm((expiry.year, expiry.month, expiry.day, expiry.hour, expiry.min, expiry.sec)))
    except (TypeError, ValueError, OverflowError):
        return None


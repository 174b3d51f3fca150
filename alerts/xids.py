"""What an XID error means and what to do about it: the table an on-call admin reads instead of
a bare number (NVIDIA's "XID Errors" catalogue, r580; pure data, no ORM).

Each entry: (name, severity, who it usually hurts, what to do). Severity "critical" means the
GPU or every VM on it is affected until someone acts (a reset, a drain, a replacement);
"warning" means one application or VM was hit and the GPU carries on.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Xid:
    code: int
    name: str
    severity: str
    impact: str
    action: str


_APP = "the application that was running (usually one VM); the GPU carries on"
_GPU = "every VM on this GPU"
_RESET = "Drain the GPU's VMs, then reset the GPU (nvidia-smi -r) or reboot the host."

_TABLE = [
    Xid(8, "GPU stopped processing (channel timeout)", "warning", _APP,
        "Usually an application hang; if it repeats, check the guest driver and the host driver versions."),
    Xid(13, "Graphics engine exception", "warning", _APP,
        "Usually an application fault (out-of-range access); if it repeats across VMs, suspect the driver "
        "or hardware."),
    Xid(31, "GPU memory page fault", "warning", _APP,
        "An application accessed an invalid address; if several VMs show it, suspect the driver or memory."),
    Xid(32, "Invalid or corrupted push buffer stream", "warning", _APP,
        "Often PCIe trouble or a driver fault; watch the PCIe replay counter."),
    Xid(38, "Driver firmware error", "critical", _GPU, _RESET),
    Xid(43, "GPU stopped processing", "warning", _APP,
        "A user application hit a fault and its channel was reset; the GPU is still usable."),
    Xid(45, "Preemptive cleanup after earlier errors", "info", _APP,
        "Follows another XID or an application being killed; read the XID before it."),
    Xid(48, "Double-bit ECC error", "critical", _GPU,
        "Uncorrectable memory error: " + _RESET + " If it repeats, the board needs replacing."),
    Xid(61, "Internal micro-controller breakpoint", "warning", _GPU,
        "Collect an nvidia-bug-report; reset the GPU if it stops responding."),
    Xid(62, "Internal micro-controller halt", "critical", _GPU, _RESET),
    Xid(63, "ECC page retirement or row remapping recorded", "warning", _GPU,
        "Memory was repaired; a GPU reset applies the remapping. Plan one at a quiet time."),
    Xid(64, "ECC page retirement or row remapping failed", "critical", _GPU,
        "The memory repair failed: " + _RESET + " Replace the board if it repeats."),
    Xid(68, "Video decoder (NVDEC) exception", "warning", _APP,
        "Usually a malformed video stream in one application."),
    Xid(69, "Graphics engine class error", "warning", _APP,
        "Usually an application fault; if it repeats across VMs, suspect the driver."),
    Xid(74, "NVLink error", "critical", _GPU,
        "Check the NVLink bridges and cabling; reset the GPUs of the link."),
    Xid(79, "GPU has fallen off the bus", "critical", _GPU,
        "The host lost the GPU: its VMs are down. Drain the host, check power, cooling and seating; reboot."),
    Xid(92, "High single-bit ECC error rate", "warning", _GPU,
        "Memory is degrading: plan a drain and reset; watch the remapped rows."),
    Xid(94, "Contained ECC error", "warning", _APP,
        "An uncorrectable error was contained to one application; reset the GPU at a quiet time to repair the row."),
    Xid(95, "Uncontained ECC error", "critical", _GPU,
        "Every application on the GPU is affected: " + _RESET),
    Xid(109, "Context switch timeout", "warning", _APP,
        "An application did not yield the GPU in time (long shaders, time slice too short for the load)."),
    Xid(119, "GSP RPC timeout", "critical", _GPU, _RESET),
    Xid(120, "GSP error", "critical", _GPU, _RESET),
    Xid(121, "C2C link corrected error", "warning", _GPU, "Watch for repeats; no action needed for one."),
    Xid(140, "Unrecovered ECC error", "critical", _GPU, _RESET),
    Xid(154, "GPU recovery action changed", "critical", _GPU,
        "The driver asks for a reset or a reboot to recover the GPU: " + _RESET),
]

KNOWN: dict[int, Xid] = {xid.code: xid for xid in _TABLE}


def describe(code: int) -> Xid:
    """The table's entry for `code`, or an honest one for a code it does not know."""
    known = KNOWN.get(code)
    if known is not None:
        return known
    return Xid(code, f"XID {code} (not in this product's table)", "warning", "unknown",
               "Look the code up in NVIDIA's XID catalogue and collect an nvidia-bug-report on the host.")

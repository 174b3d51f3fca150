"""The agent's scheduler write path: PUT /v1/gpus/<uuid>/scheduler, shared by its backends.

Why a separate module: the read path (metrics) must stay unable to change anything; only an
agent started with a write token (`--write-token-file`) accepts this request, and the body is
checked here before any backend touches the driver. Stdlib only (the agent runs without Django),
so the ranges are repeated from `fleet.scheduler`; NVML checks them again.
"""

from __future__ import annotations

from typing import Any

POLICIES = ("best_effort", "equal_share", "fixed_share")
RANGES = {"frequency_hz": (63, 960), "avg_factor": (1, 60), "timeslice_ms": (1, 30)}


class SchedulerRefused(Exception):
    """The change was not made; `status` is the HTTP status the agent answers with."""

    def __init__(self, status: int, message: str):
        super().__init__(message)
        self.status = status
        self.message = message


def parse_settings(document: Any) -> dict[str, Any]:
    """The settings of a PUT body ({policy, arr, frequency_hz?, avg_factor?, timeslice_ms?}),
    or SchedulerRefused(400) naming what is wrong."""
    if not isinstance(document, dict):
        raise SchedulerRefused(400, "the body must be a JSON object")
    policy = document.get("policy")
    if policy not in POLICIES:
        raise SchedulerRefused(400, f"policy must be one of {', '.join(POLICIES)}")
    arr = document.get("arr", False)
    if not isinstance(arr, bool):
        raise SchedulerRefused(400, "arr must be true or false")
    if policy == "best_effort" and arr:
        raise SchedulerRefused(400, "best effort has no adaptive round-robin")
    settings: dict[str, Any] = {"policy": policy, "arr": arr}
    for name, (low, high) in RANGES.items():
        value = document.get(name)
        if value is not None and (isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high):
            raise SchedulerRefused(400, f"{name} must be an integer from {low} to {high}")
        settings[name] = value
    if arr and settings["timeslice_ms"] is not None:
        raise SchedulerRefused(400, "timeslice_ms applies only with arr off")
    if not arr and (settings["frequency_hz"] is not None or settings["avg_factor"] is not None):
        raise SchedulerRefused(400, "frequency_hz and avg_factor apply only with arr on")
    return settings


def holds_vgpus_message(count: int) -> str:
    noun = "vGPU" if count == 1 else "vGPUs"
    return f"the GPU holds {count} active {noun}; the scheduler changes only on a GPU without vGPUs"


def reported_state(settings: dict[str, Any]) -> dict[str, Any]:
    """What the metrics' `scheduler` reading says once `settings` is in force (sim backend)."""
    arr = settings["arr"]
    frequency_hz = settings.get("frequency_hz") if arr else None
    return {
        "policy": settings["policy"],
        "arr_mode": "enabled" if arr else ("disabled" if settings["policy"] != "best_effort" else "default"),
        "avg_factor": settings.get("avg_factor") if arr else None,
        "timeslice_ms": (1000 / frequency_hz if frequency_hz else None) if arr else settings.get("timeslice_ms"),
        "frequency_hz": frequency_hz,
    }

"""Simulated guest CPU and memory of the demo's VMs: what their hypervisor link would have read.

The demo's history (`telemetry.history`) stores these next to the simulated agents' GPU
readings, so a fresh demo's VM pages and rollups show CPU and memory too. Like the GPU sim
(`telemetry.agent.sim_backend`), every figure is a pure function of (seed, instant), and it
shares that sim's presence model and noise: seeded with the VM's first vGPU, the guest works
the same hours as its vGPU, and a lighting guest's CPU bursts are its GPU's bursts.

Patterns while the artist works (nights, weekends and days off idle; lunch at a third):
- animation: one vCPU near saturated (the rig and playback's main thread), the others almost
  idle, so the VM's average stays low while its busiest vCPU sits at 80-98 %;
- lighting, rendering, fx: ten-minute bursts (interactive renders) that load every vCPU;
- modeling: little CPU, and far less memory than its allocation (about 6 of 32 GB);
- compositing: memory heavy (85-95 % of its allocation: frames cached in RAM);
- the rest (texturing, shading, layout, other): light CPU and about half its memory.
Steal stays around 1 % and rises in render bursts, when the host's CPUs are contended.
"""

from __future__ import annotations

import datetime as dt
import math

from telemetry.agent.sim_backend import _activity, _Clock, _resolve_timezone, _smooth, _unit

#: (lowest, highest) share of the allocation the guest uses while working, by workflow.
RAM_WHILE_WORKING = {
    "modeling": (0.17, 0.21),
    "compositing": (0.85, 0.95),
    "animation": (0.55, 0.70),
    "lighting": (0.45, 0.65),
    "rendering": (0.45, 0.65),
    "fx": (0.50, 0.70),
}
DEFAULT_RAM_WHILE_WORKING = (0.35, 0.50)
#: CPU load factor by user type, as the GPU sim scales its load.
USER_TYPE_CPU = {"light": 0.7, "medium": 1.0, "heavy": 1.3}
BURST_WORKFLOWS = ("lighting", "rendering", "fx")


def timezone(name: str | None) -> dt.tzinfo | None:
    """The zone whose working hours the guests keep (a scenario's "timezone" value)."""
    return _resolve_timezone(name)


def clock(t: float, tz: dt.tzinfo | None) -> _Clock:
    """The local calendar position of `t` the patterns need (working hours, weekday)."""
    return _Clock(t, tz)


def _working_cpu(workflow: str, seed: str, t: float, vcpus: int, load: float) -> tuple[float, float, bool]:
    """(average %, busiest vCPU %, in a render burst) of a working guest."""
    if workflow == "animation":
        busiest = 80.0 + 18.0 * _smooth(seed, "main-thread", t, 600)
        others = min(100.0, (2.0 + 6.0 * _smooth(seed, "cpu-base", t, 300)) * load)
        return (busiest + others * (vcpus - 1)) / vcpus, busiest, False
    if workflow in BURST_WORKFLOWS and _unit(seed, "burst", math.floor(t / 600)) < 0.35:
        average = 85.0 + 12.0 * _smooth(seed, "cpu-burst", t, 30)
        return average, min(100.0, average + 3.0), True
    if workflow in BURST_WORKFLOWS:
        average = min(100.0, (10.0 + 15.0 * _smooth(seed, "cpu-base", t, 300)) * load)
    elif workflow == "modeling":
        average = min(100.0, (3.0 + 6.0 * _smooth(seed, "cpu-base", t, 300)) * load)
    elif workflow == "compositing":
        average = min(100.0, (15.0 + 20.0 * _smooth(seed, "cpu-base", t, 300)) * load)
    else:
        average = min(100.0, (6.0 + 9.0 * _smooth(seed, "cpu-base", t, 300)) * load)
    # Some thread always leads: the busiest vCPU runs well above the average.
    busiest = min(100.0, average * (1.5 + 2.5 * _smooth(seed, "cpu-lead", t, 600)), average * vcpus)
    return average, max(busiest, average), False


def simulate_guest(seed: str, workflow: str, user_type: str, vcpus: int, ram_mib: int, t: float, at: _Clock,
                   reports_memory: bool = True) -> dict:
    """The guest figures of a GuestSample at instant `t`: vcpu_util and vcpu_max_util (% of all
    vCPUs and of the busiest), cpu_steal_pct and ram_used_mib (None where `reports_memory` is
    off: a guest without the balloon driver)."""
    activity = _activity(seed, at)
    low, high = RAM_WHILE_WORKING.get(workflow, DEFAULT_RAM_WHILE_WORKING)
    if activity > 0.0:
        average, busiest, burst = _working_cpu(workflow, seed, t, vcpus, USER_TYPE_CPU.get(user_type, 1.0))
        if activity < 1.0:  # lunch: what is left open ticks over
            average, busiest = average * activity, busiest * activity
        ram_frac = low + (high - low) * _smooth(seed, "ram", t, 3600)
        if burst:
            ram_frac = min(0.97, ram_frac + 0.2)
        steal = 0.3 + 1.2 * _smooth(seed, "steal", t, 300) + (2.5 * _smooth(seed, "steal-burst", t, 60) if burst else 0)
    else:
        average = 0.5 + 1.5 * _smooth(seed, "cpu-idle", t, 900)
        busiest = min(100.0, average * 3.0)
        ram_frac = low * (0.7 + 0.2 * _smooth(seed, "ram-idle", t, 7200))  # the session stays logged in
        steal = 0.1 + 0.3 * _smooth(seed, "steal", t, 300)
    return {
        "vcpu_util": round(average, 1),
        "vcpu_max_util": round(busiest, 1),
        "cpu_steal_pct": round(steal, 2),
        "ram_used_mib": int(ram_frac * ram_mib) if reports_memory else None,
    }

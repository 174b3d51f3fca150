"""Simulated backend: serves protocol-v1 payloads computed from a scenario file and the clock.

Why it exists: the demo fleet, docker-compose and the collector's tests need agents that
behave like a studio without GPUs. Every figure is a pure function of (UUID, instant):
noise comes from BLAKE2b of the UUID and a time bucket (not Python's salted `hash`), so two
processes, or two scrapes of the same instant, report exactly the same numbers, and a test
can ask for any instant of any week.

Workload model per vGPU (DESIGN.md: modeling, animation, lighting, idle nights and weekends):
- presence: weekdays only, the artist arrives 9:00-9:45 and leaves 18:15-19:00 local time
  (varying per day), with a 45-minute lunch dip and an occasional day off; outside presence
  the VM idles (0-2 % GPU, a small resident frame buffer, no remoting session);
- modeling, texturing, shading, layout, compositing, other: light steady load with
  occasional one-minute spikes (tumbling a heavy scene, baking a texture);
- animation: larger frame buffer (animation cache) and a one-minute playback peak in
  every five minutes;
- a vGPU marked `cpu_bound` (an animator blocking a shot whose rig evaluates on one CPU
  core): the viewport waits on the CPU, so the GPU stays light (4-14 %), playback never
  peaks and the cache holds about half the profile;
- lighting, rendering, fx: ten-minute heavy bursts (interactive renders) over a moderate
  base, the largest frame buffer use;
- user_type scales the load: light 0.7x, medium 1x, heavy 1.3x GPU (frame buffer less so).
Per-GPU figures aggregate its vGPUs (utilizations summed and clipped at 100 %, frame buffer
summed), and temperature, power and SM clock follow the GPU's utilization, power up to just
under the scenario's `power_limit_w` and the SM clock up to its `max_sm_clock_mhz` (the
board's limits: fleet/catalog.py).

Health (issue 19): every GPU carries a "health" object and every vGPU its licence, guest driver
and guest state, healthy by default. An agent started with `events_from` (simfleet does, with
its start time and each host's place in the fleet) also shows GPU and vGPU trouble on a fixed
schedule, and answers 503 while its simulated outage lasts: `sim_events.py` gives the schedule.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import json
import math
import re
import time
from typing import Any

from . import BackendUnavailable, sim_events
from .health import DRIVER_FIELDS
from .scenario import ScenarioError
from .scheduler_write import SchedulerRefused, holds_vgpus_message, reported_state

_LIGHT = "light_steady"
_ANIMATION = "animation"
_BURSTS = "bursts"
_CPU_BOUND = "cpu_bound"
PATTERN_OF_WORKFLOW = {
    "modeling": _LIGHT,
    "texturing": _LIGHT,
    "shading": _LIGHT,
    "layout": _LIGHT,
    "compositing": _LIGHT,
    "other": _LIGHT,
    "animation": _ANIMATION,
    "lighting": _BURSTS,
    "rendering": _BURSTS,
    "fx": _BURSTS,
}
# (GPU utilization factor, frame buffer factor) per user type.
USER_TYPE_FACTORS = {"light": (0.7, 0.85), "medium": (1.0, 1.0), "heavy": (1.3, 1.1)}

DEFAULT_SCHEDULER = {
    "policy": "best_effort",
    "arr_mode": "default",
    "avg_factor": None,
    "timeslice_ms": None,
    "frequency_hz": None,
}
# NVML clocks event reason bits (nvml.h nvmlClocksEventReason*): GPU idle, software power cap.
REASON_GPU_IDLE = 0x1
REASON_SW_POWER_CAP = 0x4


def _unit(*parts: object) -> float:
    """A deterministic pseudo-random number in [0, 1) for the given key parts."""
    digest = hashlib.blake2b("\x1f".join(map(str, parts)).encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big") / 18446744073709551616.0


def _smooth(seed: str, name: str, t: float, period_s: float) -> float:
    """Value noise in [0, 1): random at multiples of `period_s`, smoothstep between them,
    so consecutive scrapes drift instead of jumping."""
    x = t / period_s
    bucket = math.floor(x)
    f = x - bucket
    f = f * f * (3.0 - 2.0 * f)
    a = _unit(seed, name, bucket)
    return a + (_unit(seed, name, bucket + 1) - a) * f


class _Clock:
    """Local calendar position of an instant: weekday (0 = Monday), hour as a float, day number."""

    __slots__ = ("weekday", "hour", "day")

    def __init__(self, t: float, tz: dt.tzinfo | None):
        local = dt.datetime.fromtimestamp(t, tz) if tz is not None else dt.datetime.fromtimestamp(t)
        self.weekday = local.weekday()
        self.hour = local.hour + local.minute / 60.0 + local.second / 3600.0
        self.day = local.toordinal()


def _activity(seed: str, clock: _Clock) -> float:
    """1.0 while the artist works, 0.35 over lunch, 0.0 when away (nights, weekends, days off)."""
    if clock.weekday >= 5:
        return 0.0
    day = clock.day
    if _unit(seed, "day-off", day) < 0.04:
        return 0.0
    start = 9.0 + 0.75 * _unit(seed, "arrive", day)
    end = 18.25 + 0.75 * _unit(seed, "leave", day)
    if not start <= clock.hour < end:
        return 0.0
    lunch = 12.25 + 0.75 * _unit(seed, "lunch", day)
    if lunch <= clock.hour < lunch + 0.75:
        return 0.35
    return 1.0


def _pattern(kind: str, seed: str, t: float) -> tuple[float, float, float]:
    """(GPU %, fraction of the profile's frame buffer, memory-controller/GPU ratio) while working."""
    if kind == _ANIMATION:
        util = 18.0 + 14.0 * _smooth(seed, "base", t, 300)
        # One minute of playback somewhere in every five; where varies per cycle, so a
        # collector scraping on a fixed grid does not always or never land on it.
        cycle = math.floor(t / 300.0)
        start = 300.0 * _unit(seed, "playback", cycle)
        playback = (t - start) % 300.0 < 60.0
        if playback:
            util += 45.0 + 15.0 * _smooth(seed, "play", t, 20)
        fb = 0.6 + 0.2 * _smooth(seed, "fb", t, 3600) + (0.08 if playback else 0.0)
        return util, fb, 0.7
    if kind == _CPU_BOUND:
        util = 4.0 + 10.0 * _smooth(seed, "base", t, 300)
        return util, 0.45 + 0.15 * _smooth(seed, "fb", t, 3600), 0.7
    if kind == _BURSTS:
        burst = _unit(seed, "burst", math.floor(t / 600)) < 0.35
        if burst:
            util = 80.0 + 20.0 * _smooth(seed, "burst-level", t, 30)
        else:
            util = 12.0 + 18.0 * _smooth(seed, "base", t, 300)
        fb = 0.5 + 0.25 * _smooth(seed, "fb", t, 3600) + (0.15 if burst else 0.0)
        return util, fb, 0.6
    minute = math.floor(t / 60)
    util = 6.0 + 14.0 * _smooth(seed, "base", t, 300)
    spike = _unit(seed, "spike", minute) < 0.06
    if spike:
        util += 30.0 + 40.0 * _unit(seed, "spike-size", minute)
    fb = 0.35 + 0.2 * _smooth(seed, "fb", t, 1800) + (0.08 if spike else 0.0)
    return util, fb, 0.5


def simulate_vgpu(vgpu: dict[str, Any], t: float, clock: _Clock) -> dict[str, Any]:
    """Protocol-v1 figures of one scenario vGPU at instant `t` (identity as the scenario gives it)."""
    seed = vgpu["vgpu_uuid"]
    fb_mib = vgpu["fb_mib"]
    activity = _activity(seed, clock)
    if activity > 0.0:
        util_factor, fb_factor = USER_TYPE_FACTORS[vgpu.get("user_type", "medium")]
        kind = _CPU_BOUND if vgpu.get("cpu_bound") else PATTERN_OF_WORKFLOW[vgpu.get("workflow", "other")]
        util, fb_frac, mem_ratio = _pattern(kind, seed, t)
        util = min(100.0, util * util_factor * activity)
        fb_frac = min(0.97, fb_frac * fb_factor)
        enc = min(100.0, 3.0 + 10.0 * _smooth(seed, "enc", t, 120) + 0.08 * util)
        dec = 2.0 * _smooth(seed, "dec", t, 120)
        sessions = 1
        fps = round(20 + 40 * activity * _smooth(seed, "fps", t, 60))
        latency_us = round(1500 + 3000 * _smooth(seed, "latency", t, 60))
    else:
        util = 1.5 * _smooth(seed, "idle", t, 900)
        fb_frac = 0.08 + 0.06 * _smooth(seed, "idle-fb", t, 7200)
        mem_ratio = 0.5
        enc = dec = 0.0
        sessions = fps = latency_us = 0
    return {
        "vgpu_uuid": vgpu["vgpu_uuid"],
        # The hypervisor's device id where the instance follows a simulated hypervisor; a plain
        # scenario has none unless it names one (an SR-IOV vGPU has no mdev either).
        "mdev_uuid": vgpu.get("mdev_uuid"),
        "vm_uuid": vgpu["vm_uuid"],
        "vm_name": vgpu["vm_name"],
        "type_name": vgpu["type_name"],
        "fb_used_mib": int(fb_frac * fb_mib),
        "util_gpu": round(util),
        "util_mem": round(util * mem_ratio),
        "enc_util": round(enc),
        "dec_util": round(dec),
        "enc_sessions": sessions,
        "enc_fps": fps,
        "enc_latency_us": latency_us,
    }


_OFFSET = re.compile(r"^UTC([+-])(\d{1,2})(?::(\d{2}))?$")


def _resolve_timezone(name: str | None) -> dt.tzinfo | None:
    """None means the agent machine's local time. "UTC" and fixed offsets ("UTC+09:00") need
    no tz database (slim containers often lack one); other names go through zoneinfo."""
    if name is None:
        return None
    if name.upper() == "UTC":
        return dt.UTC
    offset = _OFFSET.match(name.upper())
    if offset:
        sign, hours, minutes = offset.groups()
        delta = dt.timedelta(hours=int(hours), minutes=int(minutes or 0))
        return dt.timezone(-delta if sign == "-" else delta, name)
    try:
        from zoneinfo import ZoneInfo

        return ZoneInfo(name)
    except Exception as exc:  # ZoneInfoNotFoundError, or no tz database on this machine
        raise ScenarioError(f"unknown timezone {name!r}: {exc}") from None


_PROFILE_GB = re.compile(r"-(\d+)[A-Z]$")


def _runs(record: dict[str, Any], wall: float) -> bool:
    """Whether a simulated domain runs at `wall`: a guest asked to power off is off once its
    `shutdown_at` has passed (the file keeps that time rather than being rewritten then)."""
    due = record.get("shutdown_at")
    return record.get("state") == "running" and (due is None or due > wall)


def following_hypervisor(gpus: list[dict[str, Any]], state_path: str) -> list[dict[str, Any]]:
    """The scenario's GPUs with the vGPUs the simulated hypervisor holds now: each running domain's
    devices on the GPU with that PCI address, typed as the hypervisor types them, and the VM's
    workload as the scenario describes it (a VM the scenario does not know works as "other").

    The demo links each host to a simulated hypervisor (`hypervisors/backends/sim.py`, one JSON
    file per host); reading that file here makes the agent report what the hypervisor runs, as a
    real agent reports what the driver sees, so a change carried out on the hypervisor shows in
    telemetry. Each vGPU carries its device id as `mdev_uuid`, as NVML reports an mdev vGPU's. An
    unreadable file leaves the scenario as it is."""
    try:
        with open(state_path, encoding="utf-8") as handle:
            state = json.load(handle)
        type_names = {t["type_id"]: t["name"] for gpu in state["gpus"] for t in gpu["types"]}
        devices = {d["id"]: d for d in state["devices"]}
        wall = time.time()
        running = [(uuid, record) for uuid, record in state["domains"].items() if _runs(record, wall)]
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return gpus
    known = {v["vm_uuid"]: v for gpu in gpus for v in gpu.get("vgpus", ())}
    placed: dict[str, list[dict[str, Any]]] = {}
    for vm_uuid, record in running:
        for position, device_id in enumerate((record.get("live") or record.get("inactive") or {}).get("vgpus", [])):
            device = devices.get(device_id)
            if device is None:
                continue
            type_name = type_names.get(device["type_id"], "")
            match = _PROFILE_GB.search(type_name)
            base = known.get(vm_uuid, {})
            placed.setdefault(device["gpu_bus_id"].upper(), []).append({
                "vgpu_uuid": device_id if position == 0 else f"{device_id}-{position}",
                # The simulated hypervisor names its devices by mdev UUID, as libvirt does.
                "mdev_uuid": device_id,
                "vm_uuid": vm_uuid, "vm_name": record.get("name") or base.get("vm_name", vm_uuid),
                "type_name": type_name.split(" ", 1)[-1] if type_name.startswith(("NVIDIA ", "GRID ")) else type_name,
                "fb_mib": int(match.group(1)) * 1024 if match else base.get("fb_mib", 1024),
                "workflow": base.get("workflow", "other"), "user_type": base.get("user_type", "medium"),
                **({"cpu_bound": True} if base.get("cpu_bound") else {}),
            })
    return [{**gpu, "vgpus": placed.get(gpu["pci_bus_id"].upper(), [])} for gpu in gpus]


class SimBackend:
    """Serves a scenario (see `scenario.py`) with deterministic, workflow-shaped figures."""

    name = "sim"

    def __init__(self, scenario: dict[str, Any], *, events_from: float | None = None, slot: int = 0,
                 hosts: int = 1):
        """`events_from`: the instant the event schedule starts (None: a healthy fleet, no events);
        `slot` of `hosts`: this agent's place in the fleet, which picks its share of the events."""
        self.scenario = scenario
        self.hostname = scenario["hostname"]
        self._tz = _resolve_timezone(scenario.get("timezone"))
        self._events = None if events_from is None else sim_events.Events(events_from, slot, hosts)
        self._versions = sim_events.versions(scenario, slot if events_from is not None else 0)
        self._mismatch = events_from is not None and slot == sim_events.MISMATCH_SLOT
        self._last_collect: float | None = None

    def driver(self) -> dict[str, Any]:
        """The top-level "driver" block: the host's simulated driver set."""
        block = {field: self._versions[field] for field in DRIVER_FIELDS}
        return {**block, "unsupported": [], "errors": {}}

    def collect(self, now: float | None = None) -> list[dict[str, Any]]:
        """GPU dicts of protocol v1 at instant `now` (Unix seconds); the same instant gives the same
        dicts, except that an XID is reported only by the first collection after it."""
        t = time.time() if now is None else now
        events = self._events
        if events is not None and events.active("outage", t):
            raise BackendUnavailable(f"{self.hostname}: simulated agent outage", retry_after_s=30)
        clock = _Clock(t, self._tz)
        gpus = self.scenario["gpus"]
        if self.scenario.get("hypervisor_state"):
            gpus = following_hypervisor(gpus, self.scenario["hypervisor_state"])
        rows = [[simulate_vgpu(v, t, clock) for v in gpu.get("vgpus", ())] for gpu in gpus]
        flat = [row for gpu_rows in rows for row in gpu_rows]
        for position, (row, vgpu) in enumerate(zip(flat, [v for g in gpus for v in g.get("vgpus", ())],
                                                   strict=True)):
            guest = sim_events.CURRENT["guest"] if self._mismatch and position == 0 else self._versions["guest"]
            row.update(sim_events.vgpu_health(vgpu, row, t, guest))
        xids: list[tuple[int, float]] = []
        if events is not None:
            sim_events.apply_vgpu_events(events, flat, [v["fb_mib"] for g in gpus for v in g.get("vgpus", ())], t)
            after = self._last_collect if self._last_collect is not None and self._last_collect < t else t - 60
            xids = events.xids_between(after, t)
            self._last_collect = t
        result = []
        for index, gpu in enumerate(gpus):
            reading = self._gpu(index, gpu, t, clock, rows[index])
            reading["health"] = sim_events.healthy_gpu(gpu, reading, t)
            if events is not None:
                sim_events.apply_gpu_events(events, index, len(gpus), reading, t, xids)
            # The health object sits before the vGPU list, as the NVML backend's does.
            reading["vgpus"] = reading.pop("vgpus")
            reading["errors"] = reading.pop("errors")
            result.append(reading)
        return result

    def _gpu(self, index: int, gpu: dict[str, Any], t: float, clock: _Clock,
             vgpus: list[dict[str, Any]]) -> dict[str, Any]:
        mode = gpu.get("virtualization_mode", "vgpu_host")
        fb_total = gpu["fb_total_mib"]
        util = min(100, sum(v["util_gpu"] for v in vgpus))
        limit_w = float(gpu.get("power_limit_w", 250))
        idle_w = 0.09 * limit_w
        # Under full load the driver's power capping holds the board just below its limit (the SW
        # power cap reason below), so no reading exceeds it, even rounded for display.
        capped_w = 0.985 * limit_w
        power_w = round(idle_w + (capped_w - idle_w) * (util / 100.0) ** 1.2, 1)
        seed = gpu["uuid"]
        if util < 3:
            sm_clock = 300
            reasons = REASON_GPU_IDLE
        else:
            sm_clock = int(gpu.get("max_sm_clock_mhz", 1800) - 150 * _smooth(seed, "clock", t, 60))
            reasons = REASON_SW_POWER_CAP if power_w >= 0.97 * limit_w else 0
        scheduler = None
        if mode == "vgpu_host":
            scheduler = {**DEFAULT_SCHEDULER, **(gpu.get("scheduler") or {})}
        return {
            "uuid": gpu["uuid"],
            "index": index,
            "name": gpu["name"],
            "pci_bus_id": gpu["pci_bus_id"],
            "fb_total_mib": fb_total,
            "virtualization_mode": mode,
            "util_gpu": util,
            "util_mem": min(100, sum(v["util_mem"] for v in vgpus)),
            "fb_used_mib": min(fb_total, sum(v["fb_used_mib"] for v in vgpus)),
            "enc_util": min(100, sum(v["enc_util"] for v in vgpus)),
            "dec_util": min(100, sum(v["dec_util"] for v in vgpus)),
            "temp_c": round(31 + 0.47 * util + 3 * _smooth(seed, "temp", t, 600)),
            "power_w": power_w,
            "sm_clock_mhz": sm_clock,
            "clocks_event_reasons": reasons,
            "scheduler": scheduler,
            "vgpus": vgpus,
            "errors": {},
        }

    def set_scheduler(self, uuid: str, settings: dict[str, Any]) -> dict[str, Any]:
        """Apply scheduler `settings` to the scenario's GPU `uuid` (its next readings show them),
        refusing like the driver while the GPU holds vGPUs; returns the new reading."""
        gpu = next((g for g in self.scenario["gpus"] if g["uuid"] == uuid), None)
        if gpu is None:
            raise SchedulerRefused(404, f"no GPU with UUID {uuid} on this host")
        if gpu.get("virtualization_mode", "vgpu_host") != "vgpu_host":
            raise SchedulerRefused(409, "the GPU is not in vGPU host mode; it has no vGPU scheduler")
        if gpu.get("vgpus"):
            raise SchedulerRefused(409, holds_vgpus_message(len(gpu["vgpus"])))
        gpu["scheduler"] = reported_state(settings)
        return {**DEFAULT_SCHEDULER, **gpu["scheduler"]}

    def close(self) -> None:
        """Nothing to release; present so the server can close any backend alike."""

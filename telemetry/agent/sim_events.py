"""Health and health events of the simulated agents (issue 19): what the demo fleet shows.

Why it exists: a new user of the demo should see every kind of GPU/vGPU trouble the dashboard
knows within minutes of `make run`, and then now and then, without a real fleet failing. Every
value is a function of (instant, the agent's start, its place in the fleet, UUIDs): nothing
random, so tests and two scrapes of one instant agree.

Schedule. The fleet's agents (simfleet: one process, n hosts, slot i of n) share one clock
started when the process starts. Each kind below has an offset from that start and recurs every
`PERIOD_S` (45 min); round r of kind k happens on the host in slot (k + r) mod n, on its GPU or
vGPU number r (mod how many it has), so a kind moves around the fleet and each host sees a kind
about every n x 45 min. Before the start there are no events (back-filled history stays calm).

    kind              first at   lasts    what the agent reports
    xid               0:40       point    a critical XID (codes 13, 31, 43, 48, 63, 64, 74, 79, 92,
                                          94, 95 in turn), once, in the first poll after it
    ecc               1:10       20 min   uncorrectable ECC errors rising by one every 5 min
    remap             1:40       15 min   a row remap pending, then a remap failure (Turing
                                          boards, which retire pages instead: a pending DBE retirement)
    thermal           2:10       8 min    temperature 2 °C over the slowdown threshold, SM clock at
                                          60 %, throttle flags hw_slowdown + hw_thermal_slowdown
    license_lapse     2:40       10 min   a vGPU unlicensed
    license_expiring  3:00       20 min   a vGPU whose licence expires in 3 days
    fb_full           3:30       6 min    a vGPU's frame buffer at 97 % of its profile
    outage            4:00       3 min    the agent answers 503 to GET /v1/metrics

Driver versions: every host runs vGPU 19.2 (driver 580.95.02) except the host in slot 1, which
still runs vGPU 18.4 (570.172.07): a VM moved between them crosses a driver branch. On that host
the first VM's guest runs 580.95.05, newer than its host's branch. A scenario may set its own
"driver_version" and "vgpu_manager_version".
"""

from __future__ import annotations

import hashlib
import math
from typing import Any

from .health import REASON_BITS, throttle_flags

PERIOD_S = 45 * 60
# kind -> (offset from the start, duration) in seconds; a duration of 0 is a point event.
SCHEDULE = {
    "xid": (40, 0),
    "ecc": (70, 20 * 60),
    "remap": (100, 15 * 60),
    "thermal": (130, 8 * 60),
    "license_lapse": (160, 10 * 60),
    "license_expiring": (180, 20 * 60),
    "fb_full": (210, 6 * 60),
    "outage": (240, 3 * 60),
}
KINDS = tuple(SCHEDULE)
XID_CODES = (79, 13, 48, 31, 94, 43, 63, 74, 92, 64, 95)
EXPIRING_IN_S = 3 * 86400
FB_FULL_FRACTION = 0.97

CURRENT = {"driver_version": "580.95.02", "vgpu_manager_version": "19.2", "nvml_version": "13.580.95.02",
           "cuda_driver_version": 13000, "guest": "580.95.05"}
OLDER = {"driver_version": "570.172.07", "vgpu_manager_version": "18.4", "nvml_version": "12.570.172.07",
         "cuda_driver_version": 12080, "guest": "570.172.08"}
MISMATCH_SLOT = 1

# (slowdown, shutdown) °C by board; others get the H100's 89/95.
THRESHOLDS = {"L40S": (93.0, 96.0), "A16": (90.0, 95.0), "RTX 6000": (93.0, 98.0), "RTX 8000": (93.0, 98.0)}
# Boards cooled by the server's fans have none of their own: NVML answers NOT_SUPPORTED.
PASSIVE = ("L40S", "A16", "A40", "A10", "L4", "H100", "H200")
# Turing boards retire pages; Ampere and later remap rows (and answer NOT_SUPPORTED to the other).
RETIRES_PAGES = ("RTX 6000", "RTX 8000", "T4")


def _unit(*parts: object) -> float:
    digest = hashlib.blake2b("\x1f".join(map(str, parts)).encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big") / 18446744073709551616.0


class Events:
    """Which events touch one host at an instant: `active(kind, t)` gives (round, seconds into
    the event) when the kind's current round is on this host and running, else None."""

    def __init__(self, started_at: float, slot: int = 0, hosts: int = 1):
        self.started_at = started_at
        self.slot = slot
        self.hosts = max(1, hosts)

    def _round(self, kind: str, t: float) -> tuple[int, float]:
        offset, _ = SCHEDULE[kind]
        since = t - self.started_at - offset
        return math.floor(since / PERIOD_S), since % PERIOD_S

    def mine(self, kind: str, round_: int) -> bool:
        return round_ >= 0 and (KINDS.index(kind) + round_) % self.hosts == self.slot

    def active(self, kind: str, t: float) -> tuple[int, float] | None:
        round_, into = self._round(kind, t)
        if not self.mine(kind, round_) or into >= SCHEDULE[kind][1]:
            return None
        return round_, into

    def xids_between(self, after: float, until: float) -> list[tuple[int, float]]:
        """(round, instant) of this host's XIDs in (after, until]."""
        offset = SCHEDULE["xid"][0]
        first = math.floor((after - self.started_at - offset) / PERIOD_S) + 1
        found = []
        round_ = max(first, 0)
        while (at := self.started_at + offset + round_ * PERIOD_S) <= until:
            if at > after and self.mine("xid", round_):
                found.append((round_, at))
            round_ += 1
        return found


def versions(scenario: dict[str, Any], slot: int) -> dict[str, Any]:
    """The host's driver set: the fleet's current one, or the older branch in the mismatch slot."""
    base = OLDER if slot == MISMATCH_SLOT else CURRENT
    return {**base, **{k: scenario[k] for k in ("driver_version", "vgpu_manager_version") if k in scenario}}


def healthy_gpu(gpu: dict[str, Any], reading: dict[str, Any], t: float) -> dict[str, Any]:
    """The "health" object of a GPU with nothing wrong, given its protocol reading at `t`."""
    name = gpu["name"]
    slowdown, shutdown = next((v for k, v in THRESHOLDS.items() if k in name), (89.0, 95.0))
    turing = any(k in name for k in RETIRES_PAGES)
    passive = any(k in name for k in PASSIVE)
    # A few corrected errors accumulate over a board's life: realistic, and no alarm.
    corrected = int(6 * _unit(gpu["uuid"], "corrected"))
    unsupported = ["remapped_rows_correctable", "remapped_rows_uncorrectable", "remapped_rows_pending",
                   "remapped_rows_failure"] if turing else ["retired_pages_sbe", "retired_pages_dbe",
                                                            "retired_pages_pending"]
    if passive:
        unsupported.append("fan_speed_pct")
    health = {
        "ecc_mode": "enabled",
        "ecc_corrected_volatile": 0,
        "ecc_uncorrected_volatile": 0,
        "ecc_corrected_aggregate": corrected,
        "ecc_uncorrected_aggregate": 0,
        "retired_pages_sbe": 0 if turing else None,
        "retired_pages_dbe": 0 if turing else None,
        "retired_pages_pending": False if turing else None,
        "remapped_rows_correctable": None if turing else 0,
        "remapped_rows_uncorrectable": None if turing else 0,
        "remapped_rows_pending": None if turing else False,
        "remapped_rows_failure": None if turing else False,
        "throttle_reasons": throttle_flags(reading["clocks_event_reasons"]),
        "pcie_replay_counter": 0,
        "fan_speed_pct": None if passive else float(round(30 + 0.45 * reading["util_gpu"])),
        "temp_slowdown_c": slowdown,
        "temp_shutdown_c": shutdown,
        "power_limit_w": float(gpu.get("power_limit_w", 250)),
        "performance_state": "P8" if reading["util_gpu"] < 3 else "P0",
        "xid_events": [],
        "unsupported": unsupported,
    }
    return health


def apply_gpu_events(events: Events, index: int, count: int, reading: dict[str, Any], t: float,
                     xids: list[tuple[int, float]]) -> None:
    """Put this instant's GPU events into `reading` (its "health" included); GPU `index` of `count`."""
    health = reading["health"]
    turing = health["remapped_rows_pending"] is None
    for round_, at in xids:
        if round_ % count == index:
            health["xid_events"].append({"code": XID_CODES[round_ % len(XID_CODES)], "at": at})
    ecc = events.active("ecc", t)
    if ecc and ecc[0] % count == index:
        rising = 1 + int(ecc[1] // 300)
        health["ecc_uncorrected_volatile"] = rising
        health["ecc_uncorrected_aggregate"] += rising
    remap = events.active("remap", t)
    if remap and remap[0] % count == index:
        failed = remap[1] >= SCHEDULE["remap"][1] / 2
        if turing:
            health["retired_pages_dbe"] = 1
            health["retired_pages_pending"] = True
        else:
            health["remapped_rows_uncorrectable"] = 2 if failed else 1
            health["remapped_rows_pending"] = not failed
            health["remapped_rows_failure"] = failed
    thermal = events.active("thermal", t)
    if thermal and thermal[0] % count == index:
        reading["temp_c"] = round(health["temp_slowdown_c"] + 2)
        reading["sm_clock_mhz"] = int(reading["sm_clock_mhz"] * 0.6) if reading["sm_clock_mhz"] > 300 else 300
        reasons = (reading["clocks_event_reasons"] & ~REASON_BITS["gpu_idle"]) | REASON_BITS["hw_slowdown"] | \
            REASON_BITS["hw_thermal_slowdown"]
        reading["clocks_event_reasons"] = reasons
        health["throttle_reasons"] = throttle_flags(reasons)
        health["performance_state"] = "P0"


def vgpu_health(vgpu: dict[str, Any], reading: dict[str, Any], t: float, guest_driver: str) -> dict[str, Any]:
    """Health keys of a vGPU with nothing wrong: licensed until a renewal date of its own
    (30 to 120 days ahead, moving in whole days), Q-series frame rate limit, guest up."""
    day = math.floor(t / 86400)
    renewal = (day + 30 + int(90 * _unit(vgpu["vgpu_uuid"], "licence", day // 30))) * 86400.0
    return {
        "license_state": "licensed",
        "license_expiry": renewal,
        "guest_driver_version": guest_driver,
        "frame_rate_limit": 60,
        "encoder_sessions": reading["enc_sessions"],
        "guest_info_state": "initialized",
        "unsupported": [],
    }


def apply_vgpu_events(events: Events, rows: list[dict[str, Any]], sizes: list[int], t: float) -> None:
    """Put this instant's vGPU events into the host's vGPU readings (`sizes`: profile MiB each)."""
    if not rows:
        return
    lapse = events.active("license_lapse", t)
    if lapse:
        row = rows[lapse[0] % len(rows)]
        row["license_state"], row["license_expiry"] = "unlicensed", None
    expiring = events.active("license_expiring", t)
    if expiring:
        row = rows[(expiring[0] + 1) % len(rows)]
        if row["license_state"] == "licensed":
            began = events.started_at + SCHEDULE["license_expiring"][0] + expiring[0] * PERIOD_S
            row["license_expiry"] = began + EXPIRING_IN_S
    full = events.active("fb_full", t)
    if full:
        position = (full[0] + 2) % len(rows)
        rows[position]["fb_used_mib"] = int(FB_FULL_FRACTION * sizes[position])

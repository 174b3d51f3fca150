"""What the demo's simulated VMs do with their vCPUs and memory: the counters a host's hypervisor
would report for a guest whose artist works the way their workflow says, so right-sizing has
something true to the studio to read. Pure: no Django, no file.

The one model of the demo's guests. The simulated hypervisor (`hypervisors.backends.sim`) serves
these counters live, and the live reader turns two readings a minute apart into a guest sample
(`telemetry.guest_rates.reading`); the demo's history (`telemetry.history`) asks for the same
counters at past instants, with the same inputs, and makes its samples with the same function,
so a VM's back-filled hours and its live readings are one series.

Every figure is a function of the domain's UUID, its workflow, its size and the time, so every
process reading the same simulated host gets the same counters, and two readings a minute apart
give the work done in that minute. The week is cut into 5-minute steps; each step gives each
vCPU a share of busy time drawn from the domain's own random sequence (a weekly plan: weekday
working hours 09:00 to 19:00 local, starting up to an hour later per artist, a lunch break, idle
nights and weekends), and each week scales its plan by a few per cent so no two weeks are the
same. A vCPU's counter is the sum of those shares from a fixed Monday (`EPOCH_S`): whole weeks
by their totals, then the current week step by step, so it never goes back.

The workflows' plans (per vCPU, during working hours):

- animation (single-threaded playback and rigs): one vCPU 91-97 % busy, the others 5-15 %;
- render (lighting, rendering, shading, FX): bursts of renders on every vCPU (86-97 %) between
  interactive work (5-20 %, one vCPU 30-60 %), renders now and then running through the night;
- modeling (and texturing): one vCPU 15-40 %, the others 3-10 %; memory far below allocation;
- compositing: every vCPU 30-55 %, precomps at 75-90 %; memory heavy;
- light (layout, other): one vCPU 10-25 %, the others 2-8 %.

Memory in use follows the work of the step (a share of the allocation per workflow, more while
busy) and drifts slowly. Steal is the host's contention (`contention_for`) times the busy time,
so a busy VM on a crowded host waits most. A guest without the balloon driver reports no memory
use (None, never 0).
"""

from __future__ import annotations

import hashlib
import math
import random
from dataclasses import dataclass
from datetime import datetime
from functools import lru_cache
from itertools import accumulate
from zoneinfo import ZoneInfo

from telemetry.guest_rates import GuestCounters

STEP_S = 300
STEPS_PER_DAY = 24 * 3600 // STEP_S
WEEK_STEPS = 7 * STEPS_PER_DAY
#: Monday 2024-01-01 00:00, local time: week 0 of every simulated counter.
EPOCH_S = 1_704_067_200
NS = 1_000_000_000
#: Share of busy time a VM waits for a host CPU where the state file does not say.
DEFAULT_CONTENTION = 0.005


@dataclass(frozen=True)
class Pattern:
    """How one kind of work uses a VM: the share of its allocation in use when idle, and how much
    more while its vCPUs are busy."""

    name: str
    ram_idle: float
    ram_busy: float


PATTERNS = {
    "animation": Pattern("animation", ram_idle=0.35, ram_busy=0.9),
    "render": Pattern("render", ram_idle=0.40, ram_busy=0.45),
    "modeling": Pattern("modeling", ram_idle=0.15, ram_busy=0.3),
    "compositing": Pattern("compositing", ram_idle=0.62, ram_busy=0.3),
    "light": Pattern("light", ram_idle=0.22, ram_busy=0.5),
}
WORKFLOW_PATTERNS = {
    "animation": "animation",
    "lighting": "render",
    "rendering": "render",
    "shading": "render",
    "fx": "render",
    "modeling": "modeling",
    "texturing": "modeling",
    "compositing": "compositing",
    "layout": "light",
    "other": "light",
}


def pattern_for(workflow: str) -> Pattern:
    """The plan of a workflow (fleet.choices.Workflow's values); light work for any other."""
    return PATTERNS[WORKFLOW_PATTERNS.get(workflow, "light")]


def contention_for(domains: int) -> float:
    """The share of its busy time a VM waits for a host CPU on a host of `domains` VMs: half a
    per cent alone, up to 2 % on a crowded host."""
    return min(0.02, 0.004 + 0.0015 * max(domains, 0))


def standard_offset_s(zone: str) -> int:
    """The studio's offset from UTC (`zone`, an IANA name: settings.TIME_ZONE), in standard time
    all year round: the simulated artists' working hours never jump an hour, so their counters
    never go back."""
    tz = ZoneInfo(zone)
    offsets = [datetime(2024, month, 15, tzinfo=tz).utcoffset() for month in (1, 7)]
    return int(min(offsets).total_seconds())


def _unit(*parts: object) -> float:
    """A number in [0, 1) fixed by `parts`, the same in every process."""
    digest = hashlib.blake2b("/".join(str(p) for p in parts).encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big") / 2**64


@dataclass(frozen=True)
class _Week:
    """One domain's weekly plan: per vCPU, the busy ns before each step (WEEK_STEPS + 1 values),
    and each step's mean share of all vCPUs."""

    cumulative: tuple[tuple[int, ...], ...]
    mean: tuple[float, ...]


def _phase(step: int, start_shift: int) -> str:
    """'work', 'lunch' or 'off' for a step of the week (0 is Monday 00:00)."""
    day, of_day = divmod(step, STEPS_PER_DAY)
    hour = (of_day - start_shift) * STEP_S / 3600
    if day >= 5 or not 9 <= hour < 19:
        return "off"
    return "lunch" if 12.5 <= hour < 13.5 else "work"


def _shares(pattern: str, phase: str, rng: random.Random, vcpus: int, main: int, busy: bool) -> list[float]:
    """Each vCPU's busy share for one step."""
    rand = rng.random

    def spread(low: float, high: float) -> list[float]:
        # What rng.uniform(low, high) gives, without its call: a plan draws a few million.
        width = high - low
        return [low + width * rand() for _ in range(vcpus)]

    if pattern == "render" and busy:
        return spread(0.86, 0.97)
    if phase == "off":
        return spread(0.01, 0.04)
    if phase == "lunch":
        shares = spread(0.02, 0.06)
        shares[main] = rng.uniform(0.05, 0.25)
        return shares
    if pattern == "compositing":
        return spread(0.75, 0.9) if busy else spread(0.3, 0.55)
    main_range, rest_range = {"animation": ((0.91, 0.97), (0.05, 0.15)), "render": ((0.3, 0.6), (0.05, 0.2)),
                              "modeling": ((0.15, 0.4), (0.03, 0.1))}.get(pattern, ((0.1, 0.25), (0.02, 0.08)))
    shares = spread(*rest_range)
    shares[main] = rng.uniform(*main_range)
    return shares


@lru_cache(maxsize=1024)
def _week(uuid: str, pattern: str, vcpus: int) -> _Week:
    rng = random.Random(f"{uuid}/{pattern}/{vcpus}")
    start_shift = rng.randrange(0, 13)  # the artist starts up to an hour after 09:00
    main = rng.randrange(vcpus)  # the vCPU the guest's busiest thread runs on
    busy = False  # a render or a precomp running
    per_step = []  # each step's busy ns of each vCPU
    mean = []
    for step in range(WEEK_STEPS):
        phase = _phase(step, start_shift)
        if pattern == "render":
            keep, start = (0.8, 0.12) if phase == "work" else (0.97, 0.004)
            busy = rng.random() < (keep if busy else start)
        elif pattern == "compositing":
            busy = phase == "work" and rng.random() < 0.15
        shares = _shares(pattern, phase, rng, vcpus, main, busy)
        per_step.append([round(share * STEP_S * NS) for share in shares])
        mean.append(sum(shares) / vcpus)
    cumulative = tuple(tuple(accumulate(steps, initial=0)) for steps in zip(*per_step, strict=True))
    return _Week(cumulative=cumulative, mean=tuple(mean))


@lru_cache(maxsize=4096)
def _week_scale(uuid: str, week: int) -> float:
    """How much busier (or quieter) than its plan a week is: 0.96 to 1.02."""
    return 0.96 + 0.06 * _unit(uuid, "week", week)


@lru_cache(maxsize=4096)
def _weeks_before(uuid: str, week: int) -> float:
    """The sum of the scales of the weeks before `week`: whole weeks' busy time in plan units."""
    return sum(_week_scale(uuid, w) for w in range(week))


@lru_cache(maxsize=1024)
def _ram_offsets(uuid: str) -> tuple[float, float]:
    """A domain's own phase of its memory's slow drift and its offset from its pattern's share."""
    return _unit(uuid, "ram phase"), 0.06 * (_unit(uuid, "ram") - 0.5)


def counters(uuid: str, workflow: str, *, vcpus: int, ram_mib: int, now_ns: int, utc_offset_s: int = 0,
             contention: float = DEFAULT_CONTENTION, balloon: bool = True) -> GuestCounters:
    """The counters of a running simulated VM at `now_ns` (local time is UTC plus
    `utc_offset_s`). Without `balloon` (a guest without the balloon driver) no memory figure."""
    vcpus = max(int(vcpus), 1)
    pattern = pattern_for(workflow)
    plan = _week(uuid, pattern.name, vcpus)
    elapsed_s = max(0.0, now_ns / NS + utc_offset_s - EPOCH_S)
    week, into_week = divmod(elapsed_s, WEEK_STEPS * STEP_S)
    step, into_step = divmod(into_week, STEP_S)
    week, step = int(week), min(int(step), WEEK_STEPS - 1)
    before, scale = _weeks_before(uuid, week), _week_scale(uuid, week)
    into = min(into_step / STEP_S, 1.0)
    vcpu_ns = tuple([int(c[-1] * before + (c[step] + (c[step + 1] - c[step]) * into) * scale) for c in plan.cumulative])
    used = available = None
    if balloon:
        phase, offset = _ram_offsets(uuid)
        drift = 0.04 * math.sin(2 * math.pi * (now_ns / NS / 5400 + phase))
        share = pattern.ram_idle + pattern.ram_busy * plan.mean[step] * scale
        share = min(0.95, max(0.05, share * (1 + drift) + offset))
        available = ram_mib - ram_mib // 50  # what the firmware and the guest's kernel keep aside
        used = round(available * share)
    return GuestCounters(uuid=uuid, read_at_ns=now_ns, vcpus=vcpus, ram_mib=ram_mib, vcpu_ns=vcpu_ns,
                         steal_ns=int(sum(vcpu_ns) * contention), ram_used_mib=used, ram_available_mib=available)

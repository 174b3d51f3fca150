"""Back-filled history for the demo fleet: what its simulated agents would have reported.

A fresh demo otherwise opens on empty heatmaps: the agents only start reporting when
`runfleet` starts them. `backfill_history` asks each demo host's sim backend for its readings
at past instants (the sim is a pure function of time, so these are the very figures its agent
would have served then), stores them through the real ingest path, adds what the hosts'
hypervisor links would have read of those VMs' guests at the same instants (CPU and memory,
`telemetry.guest_sim`, stored in bulk), and rebuilds the rollups over that span (rewinding the
checkpoints first, since live collection may already have moved them past it). Only demo
agents are back-filled: their scenario comes from the inventory.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from datetime import UTC, datetime

from django.conf import settings

from fleet.models import VirtualMachine
from telemetry import guest_sim
from telemetry.agent import __version__ as AGENT_VERSION
from telemetry.agent.sim_backend import SimBackend
from telemetry.demo import host_scenario
from telemetry.ingest import store_reports
from telemetry.models import ROLLUP_STEPS_S, Agent, GpuSample, GuestSample
from telemetry.payload import parse_agent_payload
from telemetry.rollups import build_rollups, rewind_rollups


@dataclass
class BackfillResult:
    agents: int = 0
    reports: int = 0
    gpu_samples: int = 0
    vgpu_samples: int = 0
    guest_samples: int = 0
    rollups: int = 0
    skipped: bool = False
    seconds: float = 0.0


#: (days back, seconds between readings): a dense last day for the 5-minute views, a sparser
#: fortnight behind it for the weekly ones, so a first `make run` back-fills in seconds.
DEFAULT_TIERS = ((14.0, 1800), (1.0, 300))
#: Readings per host stored in one ingest transaction.
CHUNK = 48
#: The demo guest without the balloon driver: its hypervisor reports no memory use (the pages
#: say "not reported", never 0).
NO_BALLOON_VM = "poc-texturing"


def moments(now: datetime, tiers: tuple[tuple[float, int], ...]) -> list[float]:
    """Unix times of the readings: each tier's, aligned to its interval, merged in order."""
    end_s = now.timestamp()
    found = set()
    for days, every_s in tiers:
        first = (end_s - days * 86400) // every_s * every_s + every_s
        found.update(first + i * every_s for i in range(int((end_s - first) // every_s) + 1))
    return sorted(t for t in found if t <= end_s)


def backfill_history(agents: list[Agent], *, tiers: tuple[tuple[float, int], ...] = DEFAULT_TIERS,
                     now: datetime | None = None, force: bool = False) -> BackfillResult:
    """Store the readings of `tiers` for each agent's host, then build the rollups over them.

    Skipped (nothing written) when samples already reach back to the start, unless `force`:
    running it twice costs time and changes nothing, as ingest ignores samples it holds."""
    started = time.monotonic()
    now = now or datetime.now(UTC)
    result = BackfillResult(agents=len(agents))
    times = moments(now, tiers)
    if not times:
        return result
    start = datetime.fromtimestamp(times[0], tz=UTC)
    host_ids = [agent.host_id for agent in agents if agent.host_id]
    if not force and GpuSample.objects.filter(gpu__host_id__in=host_ids, ts__lte=start).exists():
        result.skipped = True
        return result
    backends = [(agent, SimBackend(host_scenario(agent.host, timezone=settings.TIME_ZONE)))
                for agent in agents if agent.host is not None]
    for first in range(0, len(times), CHUNK):
        items = [(agent, parse_agent_payload({
            "agent": {"version": AGENT_VERSION, "hostname": backend.hostname, "backend": backend.name},
            "collected_at": t, "gpus": backend.collect(t),
        })) for t in times[first:first + CHUNK] for agent, backend in backends]
        # Past readings on purpose: the ingest's clock check (against now) does not apply.
        stats = store_reports(items, received_at=now, check_clock=False)
        result.reports += len(items)
        result.gpu_samples += stats.gpu_samples
        result.vgpu_samples += stats.vgpu_samples
    result.guest_samples = backfill_guests([backend.scenario for _, backend in backends], times)
    rewind_rollups(start)
    for step_s in ROLLUP_STEPS_S:
        # One unbounded run catches up with the whole span.
        built = build_rollups(step_s, now=now, max_buckets=len(times) + 1)
        result.rollups += sum(series.rows for series in built.series)
    result.seconds = time.monotonic() - started
    return result


def backfill_guests(scenarios: list[dict], times: list[float]) -> int:
    """Store a guest sample of each VM of `scenarios` at each of `times` (Unix seconds), shaped by
    its artist's workflow (`telemetry.guest_sim`) and sized by its inventory row (vCPUs, RAM);
    returns how many were written. Samples already held are left as they are."""
    seats: dict[str, dict] = {}  # VM UUID -> its first vGPU in the scenario: the sim's seed
    for scenario in scenarios:
        for gpu in scenario["gpus"]:
            for vgpu in gpu.get("vgpus", ()):
                seats.setdefault(vgpu["vm_uuid"].lower(), vgpu)
    vms = [(vm_id, name, vcpus, ram_gib * 1024, seats[str(uuid).lower()]) for vm_id, uuid, name, vcpus, ram_gib in
           VirtualMachine.objects.filter(uuid__in=list(seats)).order_by("pk")
           .values_list("pk", "uuid", "name", "vcpus", "ram_gib")]
    if not vms or not times:
        return 0
    tz = guest_sim.timezone(scenarios[0].get("timezone"))
    written = 0
    for first in range(0, len(times), CHUNK):
        rows = []
        for t in times[first:first + CHUNK]:
            at, ts = guest_sim.clock(t, tz), datetime.fromtimestamp(t, tz=UTC)
            for vm_id, name, vcpus, ram_mib, seat in vms:
                figures = guest_sim.simulate_guest(
                    seat["vgpu_uuid"], seat.get("workflow", "other"), seat.get("user_type", "medium"), vcpus,
                    ram_mib, t, at, reports_memory=name != NO_BALLOON_VM)
                rows.append(GuestSample(vm_id=vm_id, ts=ts, vcpus=vcpus, ram_mib=ram_mib, **figures))
        written += len(GuestSample.objects.bulk_create(rows, ignore_conflicts=True))
    return written

"""Back-filled history for the demo fleet: what its simulated agents would have reported.

A fresh demo otherwise opens on empty heatmaps: the agents only start reporting when
`runfleet` starts them. `backfill_history` asks each demo host's sim backend for its readings
at past instants (the sim is a pure function of time, so these are the very figures its agent
would have served then), stores them through the real ingest path, adds what the hosts'
hypervisor links would have read of those VMs' guests at the same instants (CPU and memory,
stored in bulk), and rebuilds the rollups over that span (rewinding the checkpoints first,
since live collection may already have moved them past it). Only demo agents are back-filled:
their scenario comes from the inventory.

The guests' history is not a model of its own: it is the demo's simulated hypervisor read in
the past. The counters come from the one model the simulated hosts serve (`telemetry.guest_sim`)
with the inputs those hosts give each domain; two of them, a reading interval apart, make each
sample through the live reader's own `telemetry.guest_rates.reading`. So a VM's back-filled
hours and the readings that follow them once the demo runs are one series.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from datetime import UTC, datetime
from functools import partial

from django.conf import settings
from django.db.models import Count

from fleet.choices import Workflow
from fleet.demo import no_balloon_vm_id
from fleet.models import VirtualMachine
from telemetry import guest_rates, guest_sim
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
NS = 1_000_000_000


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
    """Store a guest sample of each VM of `scenarios` at each of `times` (Unix seconds): the
    reading its host's simulated hypervisor would have given then. Returns how many were
    written; samples already held are left as they are.

    Each sample is `guest_rates.reading` of the counters at the instant against those one reading
    interval before (HYPERVISOR_GUEST_INTERVAL_S), as the live reader takes them, and the counters
    have the inputs `hypervisors.sim_seed` gives the VM's domain: its UUID, its artist's workflow,
    its vCPUs and RAM, the studio's standard time, its host's contention (by the host's number of
    VMs) and, for the demo's guest without the balloon driver (`no_balloon_vm_id`), no memory."""
    uuids = {vgpu["vm_uuid"].lower() for scenario in scenarios for gpu in scenario["gpus"]
             for vgpu in gpu.get("vgpus", ())}
    vms = list(VirtualMachine.objects.filter(uuid__in=list(uuids)).order_by("pk")
               .values_list("pk", "uuid", "host_id", "artist__workflow", "vcpus", "ram_gib"))
    if not vms or not times:
        return 0
    on_host = dict(VirtualMachine.objects.filter(host_id__in={host_id for _, _, host_id, *_ in vms})
                   .values("host_id").annotate(vms=Count("pk")).values_list("host_id", "vms"))
    without_balloon = no_balloon_vm_id()
    offset_s = guest_sim.standard_offset_s(settings.TIME_ZONE)
    interval_ns = round(settings.HYPERVISOR_GUEST_INTERVAL_S * NS)
    guests = [(vm_id, partial(guest_sim.counters, str(uuid), workflow or Workflow.OTHER.value, vcpus=vcpus,
                              ram_mib=ram_gib * 1024, utc_offset_s=offset_s,
                              contention=guest_sim.contention_for(on_host.get(host_id, 0)),
                              balloon=vm_id != without_balloon))
              for vm_id, uuid, host_id, workflow, vcpus, ram_gib in vms]
    written = 0
    for first in range(0, len(times), CHUNK):
        rows = []
        for t in times[first:first + CHUNK]:
            now_ns, ts = round(t * NS), datetime.fromtimestamp(t, tz=UTC)
            for vm_id, counters_at in guests:
                figures = guest_rates.reading(counters_at(now_ns=now_ns), counters_at(now_ns=now_ns - interval_ns))
                rows.append(GuestSample(vm_id=vm_id, ts=ts, **figures.sample_fields()))
        written += len(GuestSample.objects.bulk_create(rows, ignore_conflicts=True))
    return written

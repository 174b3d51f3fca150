"""Reading VMs' guest CPU and memory through their hosts' hypervisor links, with no agent in the
guest: each linked host's running domains that the inventory knows (by UUID) get a
`telemetry.models.GuestSample` a reading, the figures taken against the counters the last
reading left (`GuestCounter`, `telemetry.guest_rates`). Run by beat's `read_guest_stats`
(every HYPERVISOR_GUEST_INTERVAL_S, in chunks of hosts across the workers) and `manage.py
read_guest_stats`.

One host's failure is its own: it is logged and said in the result, and the others are read. A
domain the inventory does not know is counted and left (the sync report shows it); a VM that
moved to another host starts its counters afresh there, so its first reading there has no CPU
figure rather than a wrong one.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from dataclasses import dataclass, field
from datetime import UTC, datetime

from django.db import transaction

from fleet.models import Host, VirtualMachine
from hypervisors.backends.base import GuestCounters, HypervisorError
from hypervisors.models import GuestCounter
from hypervisors.services import linked_hosts, open_link
from telemetry import guest_rates
from telemetry.models import GuestSample

logger = logging.getLogger(__name__)

#: Hosts whose readings are stored together, in one transaction (`store_chunk`): a chunk of
#: `read_guest_stats_hosts`. Storing host by host cost six times the database time
#: (bench/guest_stats.py, docs/benchmarks.md).
HOSTS_PER_STORE = 20
LEFT_FOR_NEXT_RUN = "not read: the run's time limit came first; read at the next run"


@dataclass
class HostRead:
    """What one host's reading did."""

    host: str
    samples: int = 0
    unknown: int = 0  # running domains the inventory does not know
    error: str = ""

    def as_dict(self) -> dict:
        return dataclasses.asdict(self)


@dataclass
class GuestRead:
    hosts: list[HostRead] = field(default_factory=list)

    @property
    def samples(self) -> int:
        return sum(h.samples for h in self.hosts)

    def as_dict(self) -> dict:
        return {"samples": self.samples, "hosts": [h.as_dict() for h in self.hosts],
                "failed": sum(1 for h in self.hosts if h.error)}


def _counters(data: dict) -> GuestCounters | None:
    try:
        return GuestCounters(**{**data, "vcpu_ns": tuple(data.get("vcpu_ns") or ())})
    except TypeError:  # written by an older version with other fields: start afresh
        return None


def store(host: Host, counters: list[GuestCounters]) -> HostRead:
    """Turn one host's counters into guest samples of the inventory's VMs, and keep them for the next reading."""
    return store_chunk([(host, counters)])[0]


def store_chunk(read: list[tuple[Host, list[GuestCounters]]]) -> list[HostRead]:
    """`store` for several hosts' counters at once: the same rows, in one transaction and a fixed
    number of queries however many hosts (a chunk of `read_guest_stats_hosts`)."""
    uuids = [c.uuid for _, counters in read for c in counters]
    by_uuid = {str(uuid).lower(): pk for uuid, pk in
               VirtualMachine.objects.filter(uuid__in=uuids).values_list("uuid", "pk")}
    previous = {row.vm_id: row for row in GuestCounter.objects.filter(vm_id__in=by_uuid.values())}
    results, samples, kept = [], [], []
    for host, counters in read:
        result = HostRead(host.name)
        for current in counters:
            vm_id = by_uuid.get(current.uuid.lower())
            if vm_id is None:
                result.unknown += 1
                continue
            before = previous.get(vm_id)
            last = _counters(before.counters) if before is not None and before.host_id == host.pk else None
            reading = guest_rates.reading(current, last)
            read_at = datetime.fromtimestamp(current.read_at_ns / 1e9, tz=UTC)
            samples.append(GuestSample(vm_id=vm_id, ts=read_at, **reading.sample_fields()))
            kept.append(GuestCounter(vm_id=vm_id, host=host, read_at=read_at,
                                     counters={**dataclasses.asdict(current), "vcpu_ns": list(current.vcpu_ns)}))
            result.samples += 1
        results.append(result)
    with transaction.atomic():
        GuestSample.objects.bulk_create(samples, ignore_conflicts=True)
        GuestCounter.objects.bulk_create(kept, update_conflicts=True, unique_fields=["vm"],
                                         update_fields=["host", "read_at", "counters"])
    return results


def read_counters(host: Host) -> list[GuestCounters]:
    """One host's running domains' counters, through its hypervisor link (HypervisorError when
    the link fails)."""
    backend = open_link(host)
    try:
        return backend.guest_counters()
    finally:
        backend.close()


def read_all(host_ids: list[int] | None = None, *, deadline: float | None = None) -> GuestRead:
    """Every linked host (or those of `host_ids`), one after the other; one host's failure does
    not stop the others. What was read is stored every HOSTS_PER_STORE hosts (`store_chunk`),
    and when the run is cut short what it had read is still stored. No host is started after
    `deadline` (a `time.monotonic()` instant: a task's time limit): those left are said so,
    and read at the next run."""
    result = GuestRead()
    hosts = linked_hosts() if host_ids is None else linked_hosts().filter(pk__in=host_ids)
    read: list[tuple[Host, list[GuestCounters]]] = []
    done: dict[str, HostRead] = {}
    order: list[str] = []

    def flush() -> None:
        done.update((stored.host, stored) for stored in store_chunk(read))
        read.clear()

    try:
        for host in hosts:
            order.append(host.name)
            if deadline is not None and time.monotonic() >= deadline:
                done[host.name] = HostRead(host.name, error=LEFT_FOR_NEXT_RUN)
                continue
            try:
                read.append((host, read_counters(host)))
            except HypervisorError as exc:
                done[host.name] = HostRead(host.name, error=str(exc))
            except Exception as exc:  # noqa: BLE001 - one host's failure must not stop the others
                logger.exception("read_guest_stats: %s failed", host.name)
                done[host.name] = HostRead(host.name, error=f"{type(exc).__name__}: {exc}")
            if len(read) >= HOSTS_PER_STORE:
                flush()
    finally:
        if read:
            flush()
    for name in order:
        if done[name].error:
            logger.warning("read_guest_stats: %s: %s", name, done[name].error)
        result.hosts.append(done[name])
    return result

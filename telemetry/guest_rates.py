"""A VM's CPU and memory use from two readings of its hypervisor's counters: the guest figures
sizing reads beside the GPU's (`vcpu_util`, `vcpu_max_util`, `cpu_steal_pct`, `ram_used_mib`,
`ram_used_pct`). Pure: no Django, no backend.

The counters (`GuestCounters`) are what every hypervisor backend returns and what the simulated
guests (`telemetry.guest_sim`) produce; turning two of them into figures is ingest work, so it
lives here, below the hypervisor links: the live reader (`hypervisors.guest_stats`) and the demo's
back-fill (`telemetry.history`) make their samples with the same `reading`.

Shares are of the time between the two readings: all vCPUs together (100 % is every vCPU busy),
the busiest vCPU alone (a single-threaded application saturates one core while the others idle)
and the time the vCPUs waited for a host CPU (steal, vSphere's ready time). A counter that went
back (the VM restarted, or moved) gives no CPU figure for that interval rather than a wrong one.
"""

from __future__ import annotations

from dataclasses import dataclass

#: Shorter than this between two readings and the shares are mostly rounding: no CPU figure.
MIN_INTERVAL_NS = 1_000_000_000


@dataclass(frozen=True)
class GuestCounters:
    """A running VM's CPU and memory as the hypervisor counts them at one moment, read without an
    agent in the guest. CPU times are cumulative (`reading` turns two readings into shares); a
    backend whose hypervisor reports shares already (vSphere's quick stats, Proxmox VE's status)
    gives them in the `*_pct` fields instead. None is "not reported": a guest without the balloon
    driver reports no memory use, which is not 0."""

    uuid: str  # lower case, with dashes
    read_at_ns: int  # when it was read (time.time_ns() or the hypervisor's own clock), ns
    vcpus: int
    ram_mib: int  # the VM's allocation
    vcpu_ns: tuple[int, ...] = ()  # cumulative run time of each vCPU, ns; () when not reported
    steal_ns: int | None = None  # cumulative time its vCPUs waited to run (steal, ready), ns, all vCPUs together
    ram_used_mib: int | None = None  # memory the guest uses (the balloon driver's figures)
    ram_available_mib: int | None = None  # memory the guest sees as its own
    vcpu_pct: float | None = None  # share of all its vCPUs used since the last reading, %
    vcpu_max_pct: float | None = None  # the busiest vCPU's share, %
    steal_pct: float | None = None  # share of time its vCPUs waited to run, %


@dataclass(frozen=True)
class GuestReading:
    """One VM's guest figures for one interval; None where the hypervisor gives nothing."""

    uuid: str
    vcpus: int
    ram_mib: int
    vcpu_util: float | None = None
    vcpu_max_util: float | None = None
    cpu_steal_pct: float | None = None
    ram_used_mib: int | None = None
    ram_used_pct: float | None = None

    def sample_fields(self) -> dict:
        """The figures a `telemetry.models.GuestSample` keeps of this reading (its percentage of
        RAM is derived from `ram_used_mib` and `ram_mib`, so it is not stored)."""
        return {"vcpus": self.vcpus, "ram_mib": self.ram_mib, "vcpu_util": self.vcpu_util,
                "vcpu_max_util": self.vcpu_max_util, "cpu_steal_pct": self.cpu_steal_pct,
                "ram_used_mib": self.ram_used_mib}


def _share(delta_ns: int, interval_ns: int, count: int = 1) -> float | None:
    if delta_ns < 0 or interval_ns <= 0 or count < 1:
        return None
    return round(min(100.0, 100.0 * delta_ns / (interval_ns * count)), 2)


def reading(current: GuestCounters, previous: GuestCounters | None) -> GuestReading:
    """The figures of `current` against `previous` (the same VM's last counters, or None)."""
    vcpu_util, vcpu_max, steal = current.vcpu_pct, current.vcpu_max_pct, current.steal_pct
    interval = current.read_at_ns - previous.read_at_ns if previous is not None else 0
    comparable = (previous is not None and previous.uuid == current.uuid and interval >= MIN_INTERVAL_NS)
    if comparable and current.vcpu_ns and len(current.vcpu_ns) == len(previous.vcpu_ns):
        deltas = [now - before for now, before in zip(current.vcpu_ns, previous.vcpu_ns, strict=True)]
        if min(deltas) >= 0:
            if vcpu_util is None:
                vcpu_util = _share(sum(deltas), interval, len(deltas))
            if vcpu_max is None:
                vcpu_max = _share(max(deltas), interval)
    if comparable and steal is None and current.steal_ns is not None and previous.steal_ns is not None:
        steal = _share(current.steal_ns - previous.steal_ns, interval, max(1, current.vcpus))
    used = current.ram_used_mib
    used_pct = round(100.0 * used / current.ram_mib, 2) if used is not None and current.ram_mib > 0 else None
    return GuestReading(uuid=current.uuid, vcpus=current.vcpus, ram_mib=current.ram_mib, vcpu_util=vcpu_util,
                        vcpu_max_util=vcpu_max, cpu_steal_pct=steal, ram_used_mib=used,
                        ram_used_pct=None if used_pct is None else min(100.0, used_pct))

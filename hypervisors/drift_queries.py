"""The snapshot `hypervisors.drift` compares, read from stored rows in a fixed number of queries
(nine, whatever the size of the fleet): the inventory, each host's last read of its hypervisor,
the agents' recent readings and the operations under way or just ended. Never the network."""

from __future__ import annotations

from datetime import datetime, timedelta

from django.conf import settings
from django.db.models import Max, OuterRef, Q, Subquery
from django.utils import timezone

from fleet.models import Gpu, Host, Vgpu, VirtualMachine
from hypervisors import drift
from hypervisors.models import ACTIVE, Operation, SyncReport
from telemetry.models import Agent, GpuSample, VgpuSample

#: Poll intervals a reading may be late before it no longer counts as "lately".
LATE_POLLS = 3


def telemetry_window_s() -> float:
    """How far back a reading counts as recent: TELEMETRY_STALE_AFTER_S, or three poll
    intervals where that is longer (an agent is not silent for missing one poll)."""
    return max(float(settings.TELEMETRY_STALE_AFTER_S), LATE_POLLS * float(settings.TELEMETRY_POLL_INTERVAL_S))


def _hosts_and_domains() -> tuple[list[dict], list[drift.DomainRow]]:
    """Hosts with their newest report's outcome (one query), and the newest successful report of
    each linked host with its domains (one query, whether any host is linked or not)."""
    newest = SyncReport.objects.filter(host=OuterRef("pk")).order_by("-created_at", "-id")
    hosts = list(Host.objects.order_by("name", "id").annotate(
        last_ok=Subquery(newest.values("ok")[:1]),
        last_error=Subquery(newest.values("error")[:1]),
    ).values("id", "name", "hypervisor_uri", "last_ok", "last_error"))
    read_ids = Host.objects.exclude(hypervisor_uri="").annotate(
        read_id=Subquery(newest.filter(ok=True).values("pk")[:1])).values("read_id")
    reports = {row["host_id"]: row for row in SyncReport.objects.filter(pk__in=read_ids).order_by()
               .values("host_id", "created_at", "diff")}
    domains = []
    for host in hosts:
        report = reports.get(host["id"]) if host["hypervisor_uri"] else None
        host["read_at"] = report["created_at"] if report else None
        for entry in ((report["diff"] or {}).get("entries", []) if report else []):
            if entry.get("state") is None:  # "gone": the inventory's VM, no domain
                continue
            devices = tuple(drift.DeviceRow(row["device_id"], row.get("gpu_bus_id") or "", row.get("profile"),
                                            row.get("type_name") or "")
                            for row in entry.get("vgpus", []) if row.get("device_id"))
            domains.append(drift.DomainRow(report["host_id"], entry["uuid"], entry["name"], entry["state"], devices))
    return hosts, domains


def drift_snapshot(now: datetime | None = None) -> drift.Snapshot:
    """Everything `drift.find_drift` compares, as of `now`. Nine queries."""
    now = now or timezone.now()
    window_s = telemetry_window_s()
    since = now - timedelta(seconds=window_s)
    hosts, domains = _hosts_and_domains()

    agents = list(Agent.objects.filter(enabled=True).order_by().values_list("host_id", "vm_id"))
    agent_hosts = {host_id for host_id, _ in agents if host_id}
    agent_vms = {vm_id for _, vm_id in agents if vm_id}

    gpus = tuple(drift.GpuRow(*row) for row in Gpu.objects.order_by("host_id", "pci_bus_id", "id")
                 .values_list("id", "host_id", "pci_bus_id"))
    vgpus: dict[int, list[drift.VgpuRow]] = {}
    for vm_id, *row in (Vgpu.objects.order_by("vm_id", "gpu_id", "placement_id", "id")
                        .values_list("vm_id", "id", "gpu_id", "profile__name", "device_id", "reported_device_id",
                                     "reported_device_at")):
        vgpus.setdefault(vm_id, []).append(drift.VgpuRow(*row))
    vms = tuple(drift.VmRow(pk, str(uuid), name, host_id, tuple(vgpus.get(pk, ())), pk in agent_vms)
                for pk, uuid, name, host_id in VirtualMachine.objects.order_by("name", "id")
                .values_list("id", "uuid", "name", "host_id"))

    readings = tuple(drift.Reading(row["vm_id"], row["gpu_id"], row["last"]) for row in (
        VgpuSample.objects.filter(ts__gte=since).order_by().values("vm_id", "gpu_id").annotate(last=Max("ts"))))
    reporting = frozenset(GpuSample.objects.filter(ts__gte=since).order_by().values_list("gpu_id", flat=True)
                          .distinct())

    # Operations under way, and those that ended after the oldest read (they may make it old).
    reads = [host["read_at"] for host in hosts if host["read_at"] is not None]
    ended = Q(finished_at__gte=min(reads)) if reads else Q(pk__in=[])
    operations = tuple(drift.OperationRow(pk, vm_id, status, finished_at, (host_id, target_id))
                       for pk, vm_id, status, finished_at, host_id, target_id in
                       Operation.objects.filter(Q(status__in=ACTIVE) | ended).order_by("id")
                       .values_list("id", "vm_id", "status", "finished_at", "host_id", "target_host_id"))

    return drift.Snapshot(
        now=now, window_s=window_s,
        hosts=tuple(drift.HostRow(host["id"], host["name"], bool(host["hypervisor_uri"]), host["read_at"],
                                  "" if host["last_ok"] in (None, True) else (host["last_error"] or "unreadable"),
                                  host["id"] in agent_hosts) for host in hosts),
        gpus=gpus, vms=vms, domains=tuple(domains), readings=readings, gpus_reporting=reporting,
        operations=operations,
    )


def fleet_drift(now: datetime | None = None) -> list[drift.Drift]:
    """Every drift of the fleet now, most severe first."""
    return drift.find_drift(drift_snapshot(now))

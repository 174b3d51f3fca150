"""Reusable reads of telemetry, shared by the REST API and the Prometheus exposition.

"Newest sample of each of many entities" is one query whatever their number: the outer rows
(GPUs, current vGPUs, or VMs for their guest readings) each pick their newest sample id by a
correlated `ORDER BY ts DESC LIMIT 1` subquery, which the unique (entity, ts) index answers
with one backward index step per entity on SQLite and PostgreSQL alike. (PostgreSQL's
DISTINCT ON would read every sample of those entities first; a window function would too.)
"""

from __future__ import annotations

from collections.abc import Iterable
from datetime import datetime

from django.db.models import Avg, Count, F, Max, OuterRef, Subquery

from fleet.models import Gpu, Vgpu, VirtualMachine
from telemetry.filtersets import status_filter
from telemetry.models import (
    Agent,
    AgentStatus,
    GpuHealthState,
    GpuSample,
    GuestSample,
    HostDriverState,
    VgpuSample,
    VmRollup,
    XidError,
)

GPU_SAMPLE_FIELDS = ("ts", "util_gpu", "util_mem", "fb_used_mib", "fb_total_mib", "enc_util", "dec_util",
                     "temp_c", "power_w", "sm_clock_mhz", "clocks_event_reasons")
VGPU_SAMPLE_FIELDS = ("ts", "fb_used_mib", "util_gpu", "util_mem", "enc_util", "dec_util")
GUEST_SAMPLE_FIELDS = ("ts", "vcpus", "ram_mib", "vcpu_util", "vcpu_max_util", "cpu_steal_pct", "ram_used_mib")


def _newest_samples(entities, samples, key: str, since: datetime | None, fields: tuple[str, ...]) -> dict[int, dict]:
    """The newest row of `samples` (a sample model whose `key` points at an entity) of each of
    `entities` (a queryset), at or after `since`, as {entity id: {field: value}}. One query."""
    newest = samples.objects.filter(**{key: OuterRef("pk")})
    if since is not None:
        newest = newest.filter(ts__gte=since)
    latest_ids = entities.order_by().annotate(
        sample_id=Subquery(newest.order_by("-ts").values("pk")[:1]),
    ).values("sample_id")
    rows = samples.objects.filter(pk__in=latest_ids).order_by().values(key, *fields)
    return {row.pop(key): row for row in rows}


def latest_gpu_samples(gpu_ids: Iterable[int] | None = None, since: datetime | None = None) -> dict[int, dict]:
    """The newest sample of each GPU in `gpu_ids` (every GPU when None), as {gpu_id: {field:
    value}} with GPU_SAMPLE_FIELDS; GPUs without a sample (or none at or after `since`) are
    absent. One query."""
    gpus = Gpu.objects.all() if gpu_ids is None else Gpu.objects.filter(pk__in=list(gpu_ids))
    return _newest_samples(gpus, GpuSample, "gpu_id", since, GPU_SAMPLE_FIELDS)


def latest_vgpu_samples(since: datetime | None = None) -> dict[tuple[int, int], dict]:
    """The newest sample of each current vGPU, as {(vm_id, gpu_id): {field: value}} with
    VGPU_SAMPLE_FIELDS; vGPUs without a sample at or after `since` are absent. One query.

    Samples are matched by VM and GPU rather than by vGPU row, so a VM's readings carry over
    a resize that replaced its vGPU on the same GPU."""
    newest = VgpuSample.objects.filter(vm_id=OuterRef("vm_id"), gpu_id=OuterRef("gpu_id"))
    if since is not None:
        newest = newest.filter(ts__gte=since)
    latest_ids = Vgpu.objects.order_by().annotate(
        sample_id=Subquery(newest.order_by("-ts").values("pk")[:1]),
    ).values("sample_id")
    rows = VgpuSample.objects.filter(pk__in=latest_ids).order_by().values("vm_id", "gpu_id", *VGPU_SAMPLE_FIELDS)
    return {(row.pop("vm_id"), row.pop("gpu_id")): row for row in rows}


def latest_guest_samples(vm_ids: Iterable[int] | None = None, since: datetime | None = None) -> dict[int, dict]:
    """The newest guest reading (CPU and memory through the hypervisor link) of each VM in
    `vm_ids` (every VM when None), as {vm_id: {field: value}} with GUEST_SAMPLE_FIELDS; VMs
    without a reading at or after `since` are absent. A figure the guest does not report is
    None, never 0. One query."""
    vms = VirtualMachine.objects.all() if vm_ids is None else VirtualMachine.objects.filter(pk__in=list(vm_ids))
    return _newest_samples(vms, GuestSample, "vm_id", since, GUEST_SAMPLE_FIELDS)


# The fleet overview's reads -----------------------------------------------------------------


def agent_status_counts() -> dict[str, int]:
    """How many agents have each status (every AgentStatus value a key), judged in SQL by
    `telemetry.filtersets.status_filter`, the same rule as the model's property. One query."""
    return Agent.objects.aggregate(**{value: Count("pk", filter=status_filter(value)) for value in AgentStatus.values})


def agents_by_status() -> dict[str, list]:
    """Every agent with its host, grouped by `Agent.status` (ok / stale / error / new / disabled;
    every status present as a key), each group in name order. One query.

    The status is judged in Python, by the model's own property, so the overview never disagrees
    with the agents page or the API; the agent table is small (one row per source).
    """
    groups: dict[str, list] = {status: [] for status in AgentStatus.values}
    for agent in Agent.objects.select_related("host").order_by("name", "id"):
        groups[agent.status].append(agent)
    return groups


def allocation_use(since: datetime, limit: int) -> tuple[list[dict], int]:
    """The `limit` VMs holding vGPUs now that used their allocation least since `since`, and how
    many VMs holding vGPUs have no data to judge by. Two queries.

    Read from the hourly VmRollups. Each row: {vm_id, vm_name, artist_name, fb_p95_pct (the
    highest hourly p95 of frame buffer used, as % of what the VM's profiles gave it that hour),
    util_gpu_avg (mean of the hourly means, %), hours}; lowest `fb_p95_pct` first, then lowest
    utilization. A VM without an hourly rollup carrying frame buffer data is not "idle" but
    unknown, hence the separate count.
    """
    allocated = Vgpu.objects.order_by().values("vm_id")
    rollups = VmRollup.objects.filter(
        step_s=3600, bucket__gte=since, vm_id__in=allocated,
        profile_fb_mib__gt=0, fb_used_mib_p95__isnull=False,
    )
    rows = list(
        rollups.order_by().values("vm_id", "vm__name", "vm__artist__name")
        .annotate(
            fb_p95_pct=Max(F("fb_used_mib_p95") * 100.0 / F("profile_fb_mib")),
            util_gpu_avg=Avg("util_gpu_avg"),
            hours=Count("pk"),
        )
        .order_by("fb_p95_pct", F("util_gpu_avg").asc(nulls_last=True), "vm__name", "vm_id")[:limit]
    )
    for row in rows:
        row["vm_name"] = row.pop("vm__name")
        row["artist_name"] = row.pop("vm__artist__name")
    no_data = VirtualMachine.objects.filter(pk__in=allocated).exclude(pk__in=rollups.values("vm_id")).count()
    return rows, no_data


def recent_vgpu_gpus(vm_ids: Iterable[int], since: datetime) -> dict[int, list[tuple[str, datetime]]]:
    """Per VM, the GPUs (PCI bus ids) its vGPUs were read on at or after `since`, with the newest
    reading's time: what the agents say a VM runs on, for hypervisor sync. One query."""
    rows = (VgpuSample.objects.filter(vm_id__in=list(vm_ids), ts__gte=since).order_by()
            .values("vm_id", "gpu__pci_bus_id").annotate(last=Max("ts")).order_by("vm_id", "gpu__pci_bus_id"))
    found: dict[int, list[tuple[str, datetime]]] = {}
    for row in rows:
        found.setdefault(row["vm_id"], []).append((row["gpu__pci_bus_id"], row["last"]))
    return found


# Health (issue 19) ----------------------------------------------------------------------------

#: How many of a GPU's XID errors its health shows, newest first.
RECENT_XIDS = 10
GPU_HEALTH_STATE_FIELDS = tuple(
    f.name for f in GpuHealthState._meta.concrete_fields if f.name not in ("gpu",))
HOST_DRIVER_FIELDS = tuple(f.name for f in HostDriverState._meta.concrete_fields if f.name != "host")


def gpu_health(gpu_id: int) -> dict | None:
    """The GPU's latest health reading (GpuHealthState's fields, `changed_at` when it last changed)
    and its RECENT_XIDS newest XID errors as `xid_errors` [{code, at}], or None when its agent
    never reported health nor an XID. Two queries."""
    state = GpuHealthState.objects.filter(gpu_id=gpu_id).values(*GPU_HEALTH_STATE_FIELDS).first()
    xids = list(XidError.objects.filter(gpu_id=gpu_id).order_by("-at", "-pk").values("code", "at")[:RECENT_XIDS])
    if state is None and not xids:
        return None
    health = state or dict.fromkeys(GPU_HEALTH_STATE_FIELDS)
    if state is None:
        health["unsupported"] = []
    return {**health, "xid_errors": xids}


def host_driver(host_id: int) -> dict | None:
    """The NVIDIA software versions the host's agent last reported (HostDriverState's fields), or
    None when it never did. One query."""
    return HostDriverState.objects.filter(host_id=host_id).values(*HOST_DRIVER_FIELDS).first()


def latest_xid_codes(gpu_ids: Iterable[int] | None = None) -> dict[int, int]:
    """The code of each GPU's newest stored XID error, {gpu_id: code}, of the GPUs in `gpu_ids`
    (every GPU when None); GPUs without one are absent. One query."""
    newest = XidError.objects.filter(gpu_id=OuterRef("pk")).order_by("-at", "-pk").values("code")[:1]
    gpus = Gpu.objects.order_by() if gpu_ids is None else Gpu.objects.filter(pk__in=list(gpu_ids)).order_by()
    rows = gpus.annotate(code=Subquery(newest)).values_list("pk", "code")
    return {pk: code for pk, code in rows if code is not None}

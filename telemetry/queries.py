"""Reusable reads of telemetry, shared by the REST API and the Prometheus exposition.

"Newest sample of each of many entities" is one query whatever their number: the outer rows
(GPUs, or current vGPUs) each pick their newest sample id by a correlated `ORDER BY ts DESC
LIMIT 1` subquery, which the unique (entity, ts) index answers with one backward index step
per entity on SQLite and PostgreSQL alike. (PostgreSQL's DISTINCT ON would read every sample
of those entities first; a window function would too.)
"""

from __future__ import annotations

from collections.abc import Iterable
from datetime import datetime

from django.db.models import OuterRef, Subquery

from fleet.models import Gpu, Vgpu
from telemetry.models import GpuSample, VgpuSample

GPU_SAMPLE_FIELDS = ("ts", "util_gpu", "util_mem", "fb_used_mib", "fb_total_mib", "enc_util", "dec_util",
                     "temp_c", "power_w", "sm_clock_mhz")
VGPU_SAMPLE_FIELDS = ("ts", "fb_used_mib", "util_gpu", "util_mem", "enc_util", "dec_util")


def latest_gpu_samples(gpu_ids: Iterable[int] | None = None, since: datetime | None = None) -> dict[int, dict]:
    """The newest sample of each GPU in `gpu_ids` (every GPU when None), as {gpu_id: {field:
    value}} with GPU_SAMPLE_FIELDS; GPUs without a sample (or none at or after `since`) are
    absent. One query."""
    newest = GpuSample.objects.filter(gpu_id=OuterRef("pk"))
    if since is not None:
        newest = newest.filter(ts__gte=since)
    gpus = Gpu.objects.order_by()
    if gpu_ids is not None:
        gpus = gpus.filter(pk__in=list(gpu_ids))
    latest_ids = gpus.annotate(sample_id=Subquery(newest.order_by("-ts").values("pk")[:1])).values("sample_id")
    rows = GpuSample.objects.filter(pk__in=latest_ids).order_by().values("gpu_id", *GPU_SAMPLE_FIELDS)
    return {row.pop("gpu_id"): row for row in rows}


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

"""Time series of one GPU or one VM from the rollups: `gpus/{id}/metrics/`, `vms/{id}/metrics/`.

`?start=&end=` are required (a bounded range: at most MAX_RANGE_DAYS, at most MAX_POINTS
points), ISO 8601 or Unix seconds; a time without an offset is UTC. `?step=` in seconds is a
multiple of 300 below an hour (read from the 5-minute rollups) or a multiple of 3600 (read from
the hourly rollups); without it the smallest of STEP_LADDER giving at most DEFAULT_POINTS
points is used. `?metric=` (repeatable or comma-separated) picks series; default all. A VM's
series come from the rollups of their source (`telemetry.metrics.Metric.source`): its vGPUs'
from `VmRollup`, its guest's CPU and memory (read through the hypervisor) from `GuestRollup`,
one query a source.

Buckets start at multiples of `step` since the epoch; the response lists every bucket from the
one holding `start` up to `end` (exclusive), with null where there is no data, so a chart shows
gaps as gaps. When `step` is wider than the rollups read, each point merges several rollup
buckets as `telemetry.aggregation` defines: sample-weighted avg, max of maxes, max of p95s (an
upper bound of the true p95).

Who sees what is `fleet.queries`' scoping: an artist reads their own VMs, and the series of a
GPU carrying them only where no one else is placed on it (`gpu_telemetry_visible`: a shared
GPU's readings include the co-tenants' usage), else 403 naming their VM's series instead; a GPU
or VM they may not see at all is 404; anonymous callers get 401.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

from django.db.models import Model
from django.shortcuts import get_object_or_404
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiParameter, OpenApiResponse, extend_schema
from rest_framework import serializers
from rest_framework.exceptions import PermissionDenied, ValidationError
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from config import parsing
from fleet.queries import may_read_gpu_telemetry, visible_gpus, visible_vms
from telemetry import metrics
from telemetry.aggregation import bucket_floor, max_or_none, weighted_mean
from telemetry.metrics import (
    DEFAULT_POINTS,
    FIVE_MINUTES,
    GPU_METRICS,
    HOURLY,
    MAX_POINTS,
    MAX_RANGE_DAYS,
    METRICS,
    STEP_LADDER,
    VM_METRICS,
    VM_ROLLUPS,
)
from telemetry.models import GpuRollup

# Parsing -----------------------------------------------------------------------------------

def parse_time(raw: str, name: str) -> datetime:
    """An aware UTC datetime from ISO 8601 (date, or date and time; no offset means UTC) or Unix
    seconds (`config.parsing.parse_time`); ValidationError naming the parameter otherwise."""
    try:
        return parsing.parse_time(raw)
    except parsing.ParseError as exc:
        raise ValidationError({name: [str(exc)]}) from None


def parse_step(raw: str | None, start: datetime, end: datetime) -> int:
    """`step` in seconds (`telemetry.metrics.parse_step`); ValidationError naming `step` otherwise."""
    try:
        return metrics.parse_step(raw, start, end)
    except parsing.ParseError as exc:
        raise ValidationError({"step": [str(exc)]}) from None


def parse_metrics(request: Request, allowed: tuple[str, ...], subject: str) -> tuple[str, ...]:
    names = [n.strip() for raw in request.query_params.getlist("metric") for n in raw.split(",") if n.strip()]
    if not names:
        return allowed
    unknown = [n for n in names if n not in allowed]
    if unknown:
        raise ValidationError({"metric": [
            f"{', '.join(map(repr, unknown))} not available for a {subject}; use {', '.join(allowed)}.",
        ]})
    return tuple(dict.fromkeys(names))


@dataclass(frozen=True)
class Window:
    start: datetime  # start of the first bucket
    end: datetime  # as requested, exclusive
    step: int
    source_step: int
    points: int


def parse_window(request: Request) -> Window:
    """The bounded range and step of a request, or ValidationError naming the parameter."""
    params = request.query_params
    missing = [name for name in ("start", "end") if not params.get(name, "").strip()]
    if missing:
        raise ValidationError({name: ["Required: the range must be bounded (ISO 8601 or Unix seconds)."]
                               for name in missing})
    start = parse_time(params["start"], "start")
    end = parse_time(params["end"], "end")
    if end <= start:
        raise ValidationError({"end": ["Must be later than start."]})
    if end - start > timedelta(days=MAX_RANGE_DAYS):
        raise ValidationError({"end": [f"The range may span at most {MAX_RANGE_DAYS} days."]})
    step = parse_step(params.get("step"), start, end)
    first = bucket_floor(start, step)
    points = math.ceil((end - first).total_seconds() / step)
    if points > MAX_POINTS:
        least = next((s for s in STEP_LADDER if math.ceil((end - start).total_seconds() / s) < MAX_POINTS), None)
        hint = f"; use a step of at least {least} s or a shorter range" if least else ""
        raise ValidationError({"step": [
            f"A step of {step} s over this range gives {points:,} points, more than {MAX_POINTS:,}{hint}.",
        ]})
    return Window(start=first, end=end, step=step, source_step=HOURLY if step >= HOURLY else FIVE_MINUTES,
                  points=points)


# Series ------------------------------------------------------------------------------------


def build_series(rows: list[tuple], window: Window, metrics: tuple[str, ...], capacity_fallback: float | None = None,
                 ) -> dict[str, dict[str, list]]:
    """Dense series from rollup rows `(bucket, samples, capacity, *columns)` (columns in the
    order of `columns_for(metrics)`): one point per `window.step`, None where no rollup fell."""
    columns = columns_for(metrics)
    index = {column: i + 3 for i, column in enumerate(columns)}
    per_point: list[list[tuple]] = [[] for _ in range(window.points)]
    start_s = window.start.timestamp()
    for row in rows:
        per_point[int((row[0].timestamp() - start_s) // window.step)].append(row)

    def capacity(row) -> float | None:
        return row[2] or capacity_fallback

    times = [_iso(window.start + timedelta(seconds=i * window.step)) for i in range(window.points)]
    series = {}
    for name in metrics:
        metric = METRICS[name]
        out: dict[str, list] = {"t": times}
        for stat in metric.stats:
            i = index[metric.column(stat)]
            if metric.percent_of_capacity:
                def value(row, i=i):
                    cap = capacity(row)
                    return row[i] * 100.0 / cap if row[i] is not None and cap else None
            else:
                def value(row, i=i):
                    return row[i]
            if stat == "avg":
                out[stat] = [weighted_mean((value(r), r[1]) for r in rows_) for rows_ in per_point]
            else:  # max of maxes, max of p95s (an upper bound; see telemetry.aggregation)
                out[stat] = [max_or_none(value(r) for r in rows_) for rows_ in per_point]
        series[name] = out
    return series


def columns_for(metrics: tuple[str, ...]) -> list[str]:
    return list(dict.fromkeys(METRICS[name].column(stat) for name in metrics for stat in METRICS[name].stats))


def _iso(moment: datetime) -> str:
    return moment.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


# Schema ------------------------------------------------------------------------------------


class MetricSeriesSerializer(serializers.Serializer):
    """One metric: bucket start times and, aligned with them, one list per statistic."""

    t = serializers.ListField(child=serializers.DateTimeField(), help_text="Start of each bucket (UTC)")
    avg = serializers.ListField(child=serializers.FloatField(allow_null=True), required=False,
                                help_text="Mean of the readings (sample-weighted when buckets are merged)")
    max = serializers.ListField(child=serializers.FloatField(allow_null=True), required=False,
                                help_text="Highest reading")
    p95 = serializers.ListField(child=serializers.FloatField(allow_null=True), required=False,
                                help_text="Nearest-rank 95th percentile; when `step` merges several rollup "
                                          "buckets, the highest of their p95s (an upper bound)")


_HELP = {
    "util_gpu": "3D/compute utilization, % (avg, max, p95)",
    "util_mem": "Memory controller utilization, % (avg, max)",
    "fb_used_mib": "Frame buffer used, MiB (avg, max, p95)",
    "fb_used_pct": "Frame buffer used, % of the GPU's frame buffer or of the VM's profiles (avg, max, p95)",
    "enc_util": "Encoder utilization, % (avg, max)",
    "dec_util": "Decoder utilization, % (avg, max)",
    "temp_c": "Temperature, °C (avg, max)",
    "power_w": "Power draw, W (avg, max)",
    "sm_clock_mhz": "SM clock, MHz (avg)",
    "vcpu_util": "Guest CPU used, % of all its vCPUs, read through the hypervisor (avg, max, p95)",
    "vcpu_max_util": "Busiest vCPU of the guest, % (avg, max, p95)",
    "cpu_steal_pct": "Time the guest's vCPUs waited for a host CPU, % (avg, max)",
    "ram_used_mib": "Guest memory used, MiB; null where the guest reports none (avg, max, p95)",
    "ram_used_pct": "Guest memory used, % of the VM's RAM allocation (avg, max, p95)",
}


def _series_serializer(name: str, metrics: tuple[str, ...]) -> type[serializers.Serializer]:
    fields = {m: MetricSeriesSerializer(required=False, help_text=_HELP[m]) for m in metrics}
    return type(name, (serializers.Serializer,), fields)


GpuMetricSeriesSerializer = _series_serializer("GpuMetricSeriesSerializer", GPU_METRICS)
VmMetricSeriesSerializer = _series_serializer("VmMetricSeriesSerializer", VM_METRICS)


class _WindowFields(serializers.Serializer):
    step = serializers.IntegerField(help_text="Seconds per point")
    source_step = serializers.IntegerField(help_text="Rollups read: 300 (5-minute) or 3600 (hourly)")
    start = serializers.DateTimeField(help_text="Start of the first bucket: `start` rounded down to the step")
    end = serializers.DateTimeField(help_text="End of the range as requested (exclusive)")


class GpuMetricsSerializer(_WindowFields):
    gpu = serializers.IntegerField()
    series = GpuMetricSeriesSerializer(help_text="The requested metrics (all by default)")


class VmMetricsSerializer(_WindowFields):
    vm = serializers.IntegerField()
    series = VmMetricSeriesSerializer(help_text="The requested metrics (all by default)")


class MetricsErrorSerializer(serializers.Serializer):
    """A 400: messages per parameter."""

    start = serializers.ListField(child=serializers.CharField(), required=False)
    end = serializers.ListField(child=serializers.CharField(), required=False)
    step = serializers.ListField(child=serializers.CharField(), required=False)
    metric = serializers.ListField(child=serializers.CharField(), required=False)


def _parameters(metrics: tuple[str, ...], subject: str) -> list[OpenApiParameter]:
    return [
        OpenApiParameter("id", OpenApiTypes.INT, OpenApiParameter.PATH, description=f"The {subject}'s id"),
        OpenApiParameter("start", OpenApiTypes.STR, required=True,
                         description="Start of the range: ISO 8601 (no offset means UTC) or Unix seconds"),
        OpenApiParameter("end", OpenApiTypes.STR, required=True,
                         description=f"End of the range (exclusive); at most {MAX_RANGE_DAYS} days after start"),
        OpenApiParameter("step", OpenApiTypes.INT,
                         description="Seconds per point: a multiple of 300 below 3600 (5-minute rollups) or "
                                     f"of 3600 (hourly rollups); at most {MAX_POINTS:,} points. Default: the "
                                     f"smallest of {', '.join(map(str, STEP_LADDER))} giving at most "
                                     f"{DEFAULT_POINTS} points"),
        OpenApiParameter("metric", OpenApiTypes.STR, many=True, enum=list(metrics),
                         description="Series to return (repeat or comma-separate); default all"),
    ]


_DESCRIPTION = (
    "Time series of the GPU from its rollups. `start` and `end` are required (ISO 8601, where no offset "
    f"means UTC, or Unix seconds): at most {MAX_RANGE_DAYS} days and {MAX_POINTS:,} points. Points start at "
    "multiples of `step` since the epoch, from the one holding `start` up to `end` (exclusive); every point "
    "is listed, with null where no data was collected. A `step` wider than the rollups read merges them: "
    "sample-weighted avg, highest max, highest p95 (an upper bound of the true p95). p95 is nearest-rank: "
    "a reading that was really taken, with at least 95% of the readings at or below it. Each metric lists "
    "only the statistics it has (see the schema). An artist may read a GPU carrying their VMs only where "
    "no one else is placed on it (403 otherwise: their own share is their VM's series); other GPUs are 404."
)

#: The 403 of an artist asking for a GPU they share: where their own share is.
SHARED_GPU = ("Other workstations are placed on this GPU, so its readings would show their usage. Your own "
              "share of it is your VM's series: /api/v1/vms/{id}/metrics/.")

_BAD_REQUEST = OpenApiResponse(MetricsErrorSerializer, description="A missing, invalid or unbounded parameter")


# Views -------------------------------------------------------------------------------------


class _MetricsView(APIView):
    subject: str  # key of the entity's id in the response, and its rollups' foreign key
    label: str
    metrics: tuple[str, ...]
    rollup_model: type[Model]
    capacity_column: str

    def get_entity(self, request: Request, pk: int):
        raise NotImplementedError

    def rows(self, entity, window: Window, metrics: tuple[str, ...]) -> list[tuple]:
        rollups = self.rollup_model.objects.filter(
            **{self.subject: entity}, step_s=window.source_step, bucket__gte=window.start, bucket__lt=window.end,
        ).order_by("bucket")
        return list(rollups.values_list("bucket", "samples", self.capacity_column, *columns_for(metrics)))

    def series(self, entity, window: Window, metrics: tuple[str, ...]) -> dict[str, dict[str, list]]:
        return build_series(self.rows(entity, window, metrics), window, metrics, self.capacity_fallback(entity))

    def get(self, request: Request, pk: int) -> Response:
        entity = self.get_entity(request, pk)
        window = parse_window(request)
        metrics = parse_metrics(request, self.metrics, self.label)
        series = self.series(entity, window, metrics)
        return Response({
            self.subject: entity.pk, "step": window.step, "source_step": window.source_step,
            "start": _iso(window.start), "end": _iso(window.end), "series": series,
        })

    def capacity_fallback(self, entity) -> float | None:
        return None


class GpuMetricsView(_MetricsView):
    subject = "gpu"
    label = "GPU"
    metrics = GPU_METRICS
    rollup_model = GpuRollup
    capacity_column = "fb_total_mib"

    def get_entity(self, request, pk):
        gpu = get_object_or_404(visible_gpus(request.user).select_related("gpu_model"), pk=pk)
        if not may_read_gpu_telemetry(request.user, gpu.pk):
            raise PermissionDenied(SHARED_GPU)
        return gpu

    def capacity_fallback(self, entity) -> float | None:
        # Rollups of GPUs that report no total frame buffer: the model's catalog figure.
        return float(entity.gpu_model.fb_mib)

    @extend_schema(
        operation_id="gpus_metrics",
        summary="GPU time series",
        description=_DESCRIPTION,
        parameters=_parameters(GPU_METRICS, "GPU"),
        responses={200: GpuMetricsSerializer, 400: _BAD_REQUEST,
                   403: OpenApiResponse(description="An artist's GPU that other workstations share")},
    )
    def get(self, request: Request, pk: int) -> Response:
        return super().get(request, pk)


class VmMetricsView(_MetricsView):
    subject = "vm"
    label = "VM"
    metrics = VM_METRICS

    def get_entity(self, request, pk):
        return get_object_or_404(visible_vms(request.user), pk=pk)

    def series(self, entity, window: Window, metrics: tuple[str, ...]) -> dict[str, dict[str, list]]:
        """The requested series, each read from the rollups of its source (one query a source
        asked for), in the order asked."""
        found: dict[str, dict[str, list]] = {}
        for source, rollups in VM_ROLLUPS.items():
            names = tuple(name for name in metrics if METRICS[name].source == source)
            if not names:
                continue
            rows = list(rollups.model.objects.filter(
                vm=entity, step_s=window.source_step, bucket__gte=window.start, bucket__lt=window.end,
            ).order_by("bucket").values_list("bucket", "samples", rollups.capacity_column, *columns_for(names)))
            found.update(build_series(rows, window, names))
        return {name: found[name] for name in metrics}

    @extend_schema(
        operation_id="vms_metrics",
        summary="VM time series",
        description="The VM's vGPUs together: frame buffer summed over its vGPUs and utilization the "
                    "busiest vGPU's at each reading; `fb_used_pct` is of the frame buffer its profiles "
                    "gave it. The guest's CPU and memory, read through its hypervisor (no agent in the "
                    "guest): `vcpu_util` (all its vCPUs), `vcpu_max_util` (the busiest vCPU), "
                    "`cpu_steal_pct` (time waiting for a host CPU), `ram_used_mib` and `ram_used_pct` "
                    "(of its RAM allocation); null where the hypervisor reported nothing, as a guest "
                    "without the balloon driver reports no memory use. An artist may read only their "
                    "own VMs. Parameters and shape as for `gpus/{id}/metrics/`.",
        parameters=_parameters(VM_METRICS, "VM"),
        responses={200: VmMetricsSerializer, 400: _BAD_REQUEST},
    )
    def get(self, request: Request, pk: int) -> Response:
        return super().get(request, pk)

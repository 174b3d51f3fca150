"""`heatmap/`: the matrices of the heatmap page, GPU × time, VM × time and host × hour of week.

The view parses and validates the query string (every bad parameter is a 400 naming it, all of
them at once) and hands a `telemetry.heatmap.HeatmapQuery` to `build_heatmap`, which reads the
rollups. `start` and `end` are parsed and bounded as in `gpus/{id}/metrics/`, and default to the
last 24 h (as the heatmap page opens) instead of being required; the default step
aims at a few hundred columns (a heatmap cell needs pixels) instead of the metrics API's 720
points. Scoping is `fleet.queries`': an artist's rows are their own VMs, the GPUs carrying them
on which no one else is placed (`gpu_telemetry_visible`) and the hosts of those GPUs; anonymous
callers get 401.
"""

from __future__ import annotations

import gzip
from datetime import timedelta

from django.http import HttpResponse
from django.utils import timezone
from django.utils.cache import patch_vary_headers
from django.utils.regex_helper import _lazy_re_compile
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiParameter, OpenApiResponse, extend_schema, extend_schema_field
from rest_framework import serializers
from rest_framework.exceptions import ValidationError
from rest_framework.renderers import BrowsableAPIRenderer, JSONRenderer
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from config import parsing
from fleet.queries import visible_hosts
from telemetry.aggregation import bucket_floor
from telemetry.api.metrics import HOURLY, MAX_RANGE_DAYS, METRICS, STEP_LADDER, parse_step, parse_time
from telemetry.heatmap import (
    DEFAULT_COLUMNS,
    DEFAULT_METRIC,
    ENCODINGS,
    FOLDS,
    GROUP_METRICS,
    GROUPS,
    MAX_COLUMNS,
    SORTS,
    STATS,
    HeatmapQuery,
    JsonRows,
    build_heatmap,
    column_count,
    default_step,
    typed_answer,
)

#: The most rows a window or a grouping may name (far above any fleet; keeps numbers sane).
MAX_ROWS = 1_000_000
_GROUP_NOUN = {"gpu": "GPU", "vm": "VM", "host": "host"}
#: The range without `start` (the heatmap page's default range too).
DEFAULT_RANGE = timedelta(hours=24)


def _choice(params, name: str, choices, default: str, errors: dict) -> str:
    value = params.get(name, "").strip() or default
    if value not in choices:
        errors[name] = [f"{value!r} is not a {name}: use {', '.join(choices)}."]
    return value


def parse_heatmap_query(request: Request) -> HeatmapQuery:
    """The validated query of a heatmap request, or ValidationError with a message per bad
    parameter (all of them, so a caller fixes everything at once)."""
    params = request.query_params
    errors: dict[str, list[str]] = {}
    group = _choice(params, "group", GROUPS, "gpu", errors)
    fold = _choice(params, "fold", FOLDS, "none", errors)
    sort = _choice(params, "sort", SORTS, "host", errors)
    metric = stat = None
    if group in GROUPS:
        metric = _choice(params, "metric", GROUP_METRICS[group], DEFAULT_METRIC[group], errors)
        if "metric" in errors:
            errors["metric"] = [f"{metric!r} is not a metric of {_GROUP_NOUN[group]} rows: use "
                                f"{', '.join(GROUP_METRICS[group])}."]
        else:
            stats = METRICS[metric].stats
            stat = params.get("stat", "").strip() or "avg"
            if stat not in stats:
                errors["stat"] = [f"{stat!r} is not a statistic of {metric}: use {', '.join(stats)}."]

    host_id = None
    host_raw = params.get("host", "").strip()
    if host_raw:
        # An id or a name, as the lists' `?host=` (fleet.filtersets.IdOrNameField).
        visible = visible_hosts(request.user)
        try:
            host_id = visible.filter(pk=parsing.parse_int(host_raw)).values_list("pk", flat=True).first()
        except parsing.ParseError:
            host_id = None
        if host_id is None and "\x00" not in host_raw:  # PostgreSQL refuses NUL in a string literal
            host_id = visible.filter(name=host_raw).values_list("pk", flat=True).first()
        if host_id is None:
            errors["host"] = [f"No host with the id or name {host_raw!r} that you may see."]

    encoding = _choice(params, "encoding", ENCODINGS, "json", errors)
    rows_max = _positive(params, "rows_max", errors)
    row_start = _positive(params, "row_start", errors, least=0) or 0
    row_count = _positive(params, "row_count", errors)

    start, end = _parse_range(params, errors)
    step = None
    if start and end:
        if end <= start:
            errors["end"] = ["Must be later than start."]
        elif end - start > timedelta(days=MAX_RANGE_DAYS):
            errors["end"] = [f"The range may span at most {MAX_RANGE_DAYS} days."]
        else:
            step = _parse_heatmap_step(params.get("step"), fold, start, end, errors)
    if errors:
        raise ValidationError(errors)
    return HeatmapQuery(group=group, metric=metric, stat=stat, fold=fold, sort=sort, host_id=host_id,
                        start=bucket_floor(start, step), end=end, step=step, encoding=encoding,
                        rows_max=rows_max, row_start=row_start, row_count=row_count)


def _positive(params, name: str, errors: dict, least: int = 1) -> int | None:
    """An optional whole number of at least `least` (None when absent)."""
    raw = params.get(name, "").strip()
    if not raw:
        return None
    try:
        return parsing.parse_int(raw, minimum=least, maximum=MAX_ROWS)
    except parsing.ParseError as exc:
        errors[name] = [str(exc)]
        return None


def _parse_range(params, errors: dict) -> tuple:
    """`start` and `end`, each ISO 8601 or Unix seconds; without them the DEFAULT_RANGE before
    `end` (default: now), as the heatmap page opens. (None, None) when either is invalid."""
    times = {}
    for name in ("start", "end"):
        raw = params.get(name, "").strip()
        try:
            times[name] = parse_time(raw, name) if raw else None
        except ValidationError as exc:
            errors.update(exc.detail)
            return None, None
    end = times["end"] or timezone.now()
    return times["start"] or end - DEFAULT_RANGE, end


def _parse_heatmap_step(raw: str | None, fold: str, start, end, errors: dict) -> int | None:
    raw = (raw or "").strip()
    if fold == "hour_of_week":
        if raw and raw != str(HOURLY):
            errors["step"] = [f"An hour_of_week fold reads hourly values: leave step out or use {HOURLY}."]
            return None
        return HOURLY
    if not raw:
        return default_step(start, end)
    try:
        step = parse_step(raw, start, end)
    except ValidationError as exc:
        errors.update(exc.detail)
        return None
    columns = column_count(bucket_floor(start, step), end, step)
    if columns > MAX_COLUMNS:
        least = next((s for s in STEP_LADDER if column_count(bucket_floor(start, s), end, s) <= MAX_COLUMNS), None)
        hint = f"; use a step of at least {least} s or a shorter range" if least else ""
        errors["step"] = [f"A step of {step} s over this range gives {columns:,} columns, more than "
                          f"{MAX_COLUMNS:,}{hint}."]
        return None
    return step


# Schema ------------------------------------------------------------------------------------


class HeatmapRowSerializer(serializers.Serializer):
    id = serializers.IntegerField(help_text="The GPU's, VM's or host's id")
    label = serializers.CharField(help_text="As in `y`")
    host_id = serializers.IntegerField(allow_null=True, help_text="Host of the row (null: a VM placed nowhere)")
    host = serializers.CharField(allow_null=True, help_text="That host's name")
    detail_url = serializers.CharField(help_text="The row's detail page; add `?at=<x>` to open it at a column")
    subtitle = serializers.CharField(help_text="GPU: its model; VM: its artist and profiles; host: its GPU count")
    peak = serializers.FloatField(allow_null=True, help_text="Highest cell of the row (null: no data)")
    mean = serializers.FloatField(allow_null=True, help_text="Mean of the row's cells that have data")


_TYPED_MATRIX_SCHEMA = {
    "type": "object",
    "description": "Plotly's typed-array object plus what decodes it",
    "properties": {
        "dtype": {"type": "string", "description": '"u1": one unsigned byte a cell'},
        "bdata": {"type": "string", "description": "The cells' codes in base64, row after row"},
        "shape": {"type": "string", "description": '"rows, columns"'},
        "offset": {"type": "number", "description": "Value of code 0 (zmin)"},
        "step": {"type": "number", "description": "Value between two codes: (zmax - zmin) / 254"},
        "null": {"type": "integer", "description": "The code of a cell without data: 255"},
        "precision": {"type": "number",
                      "description": "Half a step: how far a decoded value may be from the exact one"},
    },
    "required": ["dtype", "bdata", "shape", "offset", "step", "null", "precision"],
}


@extend_schema_field({
    "oneOf": [
        {"type": "array", "items": {"type": "array", "items": {"type": "number", "nullable": True}}},
        _TYPED_MATRIX_SCHEMA,
    ],
    "description": "json encoding: one list per row, one value per column, null where there is no data. "
                   "typed encoding: one byte a cell; value = offset + code * step, `null` (255) where there is no "
                   "data",
})
class MatrixField(serializers.JSONField):
    pass


class HeatmapGroupSerializer(serializers.Serializer):
    label = serializers.CharField(help_text='As in `y`: "host (n GPUs)" or "first row – last row (n GPUs)"')
    row_start = serializers.IntegerField(help_text="Its rows' window: pass as `row_start` to read them")
    row_count = serializers.IntegerField(help_text="... and as `row_count`")
    hosts = serializers.IntegerField(help_text="Hosts its rows are on")
    peak = serializers.FloatField(allow_null=True, help_text="Highest peak of its rows")
    mean = serializers.FloatField(allow_null=True, help_text="Mean of its rows' means")
    precision = serializers.FloatField(
        help_text="How far peak and mean may be from the exact figures: 0, or in a typed answer read from the "
                  "heatmap strips (GPU x time at 300 s steps of a % metric, sorted by host) half a step of `z`, "
                  "the figures being read from the codes")


class HeatmapSerializer(serializers.Serializer):
    group = serializers.ChoiceField(GROUPS)
    metric = serializers.ChoiceField(list(METRICS))
    stat = serializers.ChoiceField(STATS)
    fold = serializers.ChoiceField(FOLDS)
    sort = serializers.ChoiceField(SORTS)
    unit = serializers.CharField(help_text='"%", "MiB", "°C", "W" or "MHz"')
    start = serializers.DateTimeField(help_text="Start of the first bucket: `start` rounded down to the step")
    end = serializers.DateTimeField(help_text="End of the range as requested (exclusive)")
    step = serializers.IntegerField(help_text="Seconds per column (3600 for an hour_of_week fold)")
    source_step = serializers.IntegerField(help_text="Rollups read: 300 (5-minute) or 3600 (hourly)")
    x = serializers.ListField(child=serializers.CharField(),
                              help_text='Column labels: bucket starts (ISO 8601, UTC), or "Mon 00:00" ... '
                                        '"Sun 23:00" for an hour_of_week fold')
    y = serializers.ListField(child=serializers.CharField(), help_text="Row labels (unique); group labels when grouped")
    ids = serializers.ListField(child=serializers.IntegerField(),
                                help_text="Row ids, aligned with `y` (empty when grouped)")
    rows = HeatmapRowSerializer(many=True, help_text="Details of each row, aligned with `y` (empty when grouped)")
    z = MatrixField()
    encoding = serializers.ChoiceField(ENCODINGS, help_text="The encoding of `z`")
    total_rows = serializers.IntegerField(help_text="Rows in scope, before any window or grouping")
    row_start = serializers.IntegerField(help_text="The first row of the window (0: from the first)")
    groups = HeatmapGroupSerializer(many=True, allow_null=True,
                                    help_text="With `rows_max` and more rows than that: the groups, aligned with "
                                              "`y`; else null")
    zmin = serializers.FloatField(allow_null=True, help_text="0 for % metrics, else the lowest cell")
    zmax = serializers.FloatField(allow_null=True, help_text="100 for % metrics, else the highest cell")


class HeatmapErrorSerializer(serializers.Serializer):
    """A 400: messages per parameter."""

    group = serializers.ListField(child=serializers.CharField(), required=False)
    metric = serializers.ListField(child=serializers.CharField(), required=False)
    stat = serializers.ListField(child=serializers.CharField(), required=False)
    fold = serializers.ListField(child=serializers.CharField(), required=False)
    sort = serializers.ListField(child=serializers.CharField(), required=False)
    host = serializers.ListField(child=serializers.CharField(), required=False)
    start = serializers.ListField(child=serializers.CharField(), required=False)
    end = serializers.ListField(child=serializers.CharField(), required=False)
    step = serializers.ListField(child=serializers.CharField(), required=False)
    encoding = serializers.ListField(child=serializers.CharField(), required=False)
    rows_max = serializers.ListField(child=serializers.CharField(), required=False)
    row_start = serializers.ListField(child=serializers.CharField(), required=False)
    row_count = serializers.ListField(child=serializers.CharField(), required=False)


_PARAMETERS = [
    OpenApiParameter("group", OpenApiTypes.STR, enum=list(GROUPS),
                     description="Rows: one per GPU (default), per VM, or per host (its GPUs combined: their "
                                 "mean for avg, their highest for max and p95)"),
    OpenApiParameter("metric", OpenApiTypes.STR, enum=list(METRICS),
                     description="gpu and host: util_gpu (default), util_mem, fb_used_pct, fb_used_mib, enc_util, "
                                 "dec_util, temp_c, power_w, sm_clock_mhz. vm: fb_used_pct (default: frame buffer "
                                 "used as % of what the VM's profiles give it), fb_used_mib, util_gpu, util_mem, "
                                 "enc_util, dec_util, and the guest's CPU and memory read through its hypervisor: "
                                 "vcpu_util (% of all its vCPUs), vcpu_max_util (busiest vCPU, %), cpu_steal_pct "
                                 "(%, avg and max), ram_used_mib, ram_used_pct (% of its RAM allocation)"),
    OpenApiParameter("stat", OpenApiTypes.STR, enum=list(STATS),
                     description="avg (default), max or p95; one of the metric's statistics"),
    OpenApiParameter("start", OpenApiTypes.STR,
                     description="Start of the range: ISO 8601 (no offset means UTC) or Unix seconds. "
                                 "Default: 24 h before end"),
    OpenApiParameter("end", OpenApiTypes.STR,
                     description=f"End of the range (exclusive); at most {MAX_RANGE_DAYS} days after start. "
                                 "Default: now"),
    OpenApiParameter("step", OpenApiTypes.INT,
                     description="Seconds per column: a multiple of 300 below 3600 or of 3600; at most "
                                 f"{MAX_COLUMNS:,} columns. Default: the smallest of "
                                 f"{', '.join(map(str, STEP_LADDER))} giving at most {DEFAULT_COLUMNS} columns. "
                                 "Leave out (or 3600) with fold=hour_of_week"),
    OpenApiParameter("fold", OpenApiTypes.STR, enum=list(FOLDS),
                     description="none (default) or hour_of_week: 168 columns, Monday 00:00 to Sunday 23:00 in "
                                 "the studio's time zone, each the mean of the hourly values of the range at "
                                 "that hour of the week"),
    OpenApiParameter("sort", OpenApiTypes.STR, enum=list(SORTS),
                     description="host (default: grouped by host name, then PCI bus id / VM name), peak (highest "
                                 "row maximum first) or mean (highest row mean first); rows without data last"),
    OpenApiParameter("host", OpenApiTypes.STR, description="Only the rows of this host: its id or its name"),
    OpenApiParameter("encoding", OpenApiTypes.STR, enum=list(ENCODINGS),
                     description="json (default): `z` as lists of numbers. typed: `z` as one byte a cell in base64 "
                                 "(Plotly's typed-array object: dtype u1, bdata, shape), quantised to 255 levels "
                                 "from zmin to zmax: value = offset + code * step, code 255 = no data, each value "
                                 "within `precision` (half a step) of the json one. The typed answer is gzipped "
                                 "for clients that accept it and reused until the rollups or the inventory change"),
    OpenApiParameter("rows_max", OpenApiTypes.INT,
                     description="With more rows than this (after the window), consecutive rows in the sort order "
                                 "are grouped into at most this many: one group a host with sort=host when the "
                                 "hosts fit, else groups of equal size; each cell the highest of its rows' cells; "
                                 "`groups` gives each group's window for the drill-down"),
    OpenApiParameter("row_start", OpenApiTypes.INT,
                     description="A window of the sorted rows: the first (0-based; default 0)"),
    OpenApiParameter("row_count", OpenApiTypes.INT, description="... and how many (default: all after row_start)"),
]


class HeatmapRenderer(JSONRenderer):
    """JSON, with a `z` that PostgreSQL already wrote as JSON text (`JsonRows`) spliced in as
    it is: rendering 300,000 floats would cost more than reading them."""

    #: Stands for `z` while the rest renders; a string no label can render to (quotes escape).
    MARK = "\u2063heatmap-z\u2063"

    def render(self, data, accepted_media_type=None, renderer_context=None):
        z = data.get("z") if isinstance(data, dict) else None
        if not isinstance(z, JsonRows):
            return super().render(data, accepted_media_type, renderer_context)
        text = super().render({**data, "z": self.MARK}, accepted_media_type, renderer_context)
        mark = super().render(self.MARK)
        at = text.rindex(mark)
        return text[:at] + z.json().encode() + text[at + len(mark):]


class HeatmapView(APIView):
    renderer_classes = [HeatmapRenderer, BrowsableAPIRenderer]

    @extend_schema(
        operation_id="heatmap",
        summary="Heatmap matrix",
        description=(
            "A heatmap in Plotly's shape (`x`, `y`, `z`) with each row's details, read from the rollups "
            "(5-minute below a step of an hour, else hourly). Every GPU, VM or host in scope is a row, with "
            "null cells where nothing was collected; VMs are those holding a vGPU now or with data in the "
            "range. A cell merging several rollups takes their sample-weighted avg, highest max, or highest "
            "p95 (an upper bound of the true p95). An artist sees their own VMs, the GPUs carrying them on which "
            "no one else is placed (a shared GPU's readings would show the others' usage) and the hosts of "
            "those GPUs (combining only those GPUs)."
        ),
        parameters=_PARAMETERS,
        responses={200: HeatmapSerializer,
                   400: OpenApiResponse(HeatmapErrorSerializer, description="A missing or invalid parameter")},
    )
    def get(self, request: Request) -> Response | HttpResponse:
        query = parse_heatmap_query(request)
        if query.encoding != "typed":
            return Response(build_heatmap(request.user, query))
        return typed_response(request, query)


# The typed answer ----------------------------------------------------------------------------

_ACCEPTS_GZIP = _lazy_re_compile(r"\bgzip\b")


def typed_response(request: Request, query: HeatmapQuery) -> HttpResponse:
    """The typed answer, gzipped for clients that accept it.

    Compressed here and not by a site-wide GZipMiddleware: compressing a response that carries a
    secret (a CSRF token in a page) next to text an attacker can inject lets them guess the
    secret from the sizes (BREACH). This answer carries no secret (row labels, ids and numbers
    read from the rollups; the query string is not echoed), so compressing it is safe; the
    pages and the other API answers stay as they are.
    """
    body = typed_answer(request.user, query)
    if _ACCEPTS_GZIP.search(request.META.get("HTTP_ACCEPT_ENCODING", "")):
        response = HttpResponse(body, content_type="application/json")
        response["Content-Encoding"] = "gzip"
    else:
        response = HttpResponse(gzip.decompress(body), content_type="application/json")
    patch_vary_headers(response, ("Accept-Encoding",))
    return response

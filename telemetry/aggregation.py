"""Pure aggregation of telemetry readings: bucket arithmetic, avg, max and p95, and merging
finished buckets into wider ones. No Django import, so it is tested without a database.

Definitions used everywhere in the product (rollups, the metrics API, sizing evidence):

- A bucket of `step_s` seconds starts at a multiple of `step_s` since the Unix epoch (UTC),
  so 5-minute buckets start at :00, :05, ... and hourly buckets on the UTC hour.
- Missing readings (None: the GPU does not report that metric) are left out; an aggregate of
  no readings is None, never 0.
- **p95 is nearest-rank**: the smallest reading such that at least 95% of the readings are at
  or below it, i.e. `sorted(values)[ceil(0.95 * n) - 1]`. It is always a value that was really
  read (no interpolation between two readings), the same on every database, and it reads
  plainly for sizing: "95% of the time the VM used at most this much frame buffer".
- **Merging** buckets into a wider one (the API re-bucketing 5-minute rollups to 15 minutes):
  avg is the sample-weighted mean of the avgs, max the max of the maxes, and p95 the max of the
  p95s. That p95 is an upper bound of the true p95 of the merged readings (in each part at least
  95% of the readings are at or below its p95, hence at or below the largest one), so a merged
  chart may overstate pressure a little but never hides it. It is exact for a single bucket.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime


def bucket_floor(moment: datetime, step_s: int) -> datetime:
    """Start of the `step_s`-second bucket holding `moment` (aware), as an aware UTC datetime."""
    seconds = math.floor(moment.timestamp())
    return datetime.fromtimestamp(seconds - seconds % step_s, tz=UTC)


def present(values: Iterable[float | None]) -> list[float]:
    """The readings that exist (None means "not reported", not zero)."""
    return [v for v in values if v is not None]


def mean(values: Sequence[float]) -> float | None:
    """Arithmetic mean of readings, None for none."""
    return math.fsum(values) / len(values) if values else None


def maximum(values: Sequence[float]) -> float | None:
    return max(values) if values else None


def p95(values: Sequence[float]) -> float | None:
    """Nearest-rank 95th percentile (see the module docstring), None for no readings."""
    return percentile_nearest_rank(values, 95)


def percentile_nearest_rank(values: Sequence[float], q: float) -> float | None:
    """The smallest reading with at least q% of the readings at or below it."""
    if not values:
        return None
    ordered = sorted(values)
    rank = max(1, math.ceil(q / 100 * len(ordered)))
    return ordered[rank - 1]


@dataclass(frozen=True)
class Summary:
    """avg, max and p95 of one metric over one bucket (any of them None when no readings)."""

    avg: float | None
    max: float | None
    p95: float | None


def summarize(values: Iterable[float | None]) -> Summary:
    """avg, max and p95 of the readings that exist."""
    readings = present(values)
    return Summary(avg=mean(readings), max=maximum(readings), p95=p95(readings))


def sum_or_none(values: Iterable[float | None]) -> float | None:
    """Sum of the readings that exist; None when none exists (a VM whose vGPUs all report no
    frame buffer has an unknown use, not zero)."""
    readings = present(values)
    return math.fsum(readings) if readings else None


def max_or_none(values: Iterable[float | None]) -> float | None:
    return maximum(present(values))


def weighted_mean(pairs: Iterable[tuple[float | None, int]]) -> float | None:
    """Mean of bucket averages weighted by their sample counts (buckets without a value skipped)."""
    total = weight = 0.0
    for value, samples in pairs:
        if value is not None and samples:
            total += value * samples
            weight += samples
    return total / weight if weight else None

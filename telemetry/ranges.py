"""Time ranges of the dashboard's pages: the presets (6 h, 24 h, 7 d, 30 d), a custom range,
and the window around a moment that a heatmap click lands on.

Pure functions (no ORM), shared by the heatmap page and the detail pages, so every page
offers the same choices and reads `?range=`, `?start=`, `?end=` and `?at=` the same way.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

from config import parsing

PRESETS: dict[str, timedelta] = {
    "6h": timedelta(hours=6),
    "24h": timedelta(hours=24),
    "7d": timedelta(days=7),
    "30d": timedelta(days=30),
}
PRESET_LABELS = {"6h": "6 h", "24h": "24 h", "7d": "7 d", "30d": "30 d", "custom": "Custom"}
DEFAULT_PRESET = "24h"
#: Longest custom range a page accepts (the API's own bound is wider).
MAX_CUSTOM = timedelta(days=400)
#: Width of the window a detail page shows around `?at=` (a clicked heatmap cell).
AROUND = timedelta(hours=6)


class RangeError(ValueError):
    """A range the page cannot show; the message says what to change, `param` which query
    parameter is at fault (None when it is the combination)."""

    def __init__(self, message: str, param: str | None = None):
        super().__init__(message)
        self.param = param


@dataclass(frozen=True)
class TimeRange:
    key: str  # a PRESETS key, or "custom"
    start: datetime
    end: datetime
    at: datetime | None = None  # a moment to mark (heatmap click-through)

    @property
    def span(self) -> timedelta:
        return self.end - self.start

    def iso(self, moment: datetime | None) -> str:
        return "" if moment is None else moment.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")

    @property
    def start_iso(self) -> str:
        return self.iso(self.start)

    @property
    def end_iso(self) -> str:
        return self.iso(self.end)

    @property
    def at_iso(self) -> str:
        return self.iso(self.at)


def _parse(raw: str, name: str) -> datetime:
    """A moment of `?start=`, `?end=` or `?at=` (ISO 8601 or Unix seconds, as `config.parsing` reads
    them; no offset means UTC), or RangeError naming the parameter."""
    try:
        return parsing.parse_time(raw)
    except parsing.ParseError as exc:
        raise RangeError(f"{name} {exc}", name) from None


def resolve_range(params, now: datetime) -> TimeRange:
    """The range a page shows from its query parameters (a QueryDict or dict).

    `?at=` wins: AROUND either side of that moment (never past `now`). Then `?start=&end=`
    (a custom range). Then `?range=` (a preset; the default is DEFAULT_PRESET). Raises
    RangeError for an unknown preset or an unusable custom range."""
    at_raw = (params.get("at") or "").strip()
    if at_raw:
        at = _parse(at_raw, "at")
        end = min(at + AROUND, now) if at < now else at + AROUND
        return TimeRange("custom", at - AROUND, end, at=at)
    start_raw, end_raw = (params.get("start") or "").strip(), (params.get("end") or "").strip()
    if start_raw or end_raw:
        if not (start_raw and end_raw):
            raise RangeError("A custom range needs both a start and an end.")
        start, end = _parse(start_raw, "start"), _parse(end_raw, "end")
        if end <= start:
            raise RangeError("The end of the range must be after its start.")
        if end - start > MAX_CUSTOM:
            raise RangeError(f"A range may span at most {MAX_CUSTOM.days} days.")
        return TimeRange("custom", start, end)
    key = (params.get("range") or DEFAULT_PRESET).strip()
    if key not in PRESETS:
        raise RangeError(f"Unknown range {key!r}: use {', '.join(PRESETS)} or a custom start and end.", "range")
    return TimeRange(key, now - PRESETS[key], now)

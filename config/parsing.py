"""What a number or a time typed into a page or sent by a script may be: one place decides, for
the API's query parameters, the pages' and the filters' that are not a form field of their own.

Each function returns the value or raises `ParseError` (a ValueError) whose message says what
was wrong and what to send instead; the caller names the field (DRF's `ValidationError({name:
[message]})`, a form's error, a page's message), so bad input is a 400 naming it, never a 500.

- Numbers are written with ASCII digits. Python's `int()` reads `"٣"` as 3 but fails on `"²"`,
  although `"²".isdigit()` is True: both are refused alike, rather than one read as a number
  and the other crashing a view that checked `isdigit()` first.
- Whole numbers fit a signed 64-bit column (ids, counts) unless the caller bounds them closer.
- Numbers with a fraction are finite: `1e400` (infinity), `nan` and `inf` are refused.
- Times are ISO 8601 (a date, or a date and time with `Z`, an offset or none, which means
  `default_tz`) or Unix seconds, between TIME_MIN and TIME_MAX, so that the ranges and buckets
  computed from them stay within what a datetime holds.

Pure: no Django import, so the rules are tested without a database.
"""

from __future__ import annotations

import math
import re
from datetime import UTC, datetime, timedelta, tzinfo

INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1
#: Earliest and latest time accepted: the Unix epoch, and a year far from datetime's end, so a
#: range of a few hundred days around any accepted time is still a datetime.
TIME_MIN = datetime(1970, 1, 1, tzinfo=UTC)
TIME_MAX = datetime(9000, 1, 1, tzinfo=UTC)
#: Longest text read as a number: 2**63 has 19 digits; longer input is refused before int() reads it.
MAX_NUMBER_CHARS = 40

_INTEGER = re.compile(r"[+-]?[0-9]+", re.ASCII)
_DECIMAL = re.compile(r"[+-]?([0-9]+(\.[0-9]*)?|\.[0-9]+)([eE][+-]?[0-9]+)?", re.ASCII)
# A "+02:00" offset arrives as " 02:00" when the caller did not percent-encode the "+".
_SPACED_OFFSET = re.compile(r"(T\d{2}:\d{2}(:\d{2}(\.\d+)?)?) (\d{2}:?\d{2})$", re.ASCII)


class ParseError(ValueError):
    """Input that is not a value of the kind asked for; the message says what to send instead."""


def shown(raw: str) -> str:
    """The input as a message quotes it: repr (so a NUL or a space shows), cut short."""
    text = repr(raw)
    return text if len(text) <= 42 else text[:30] + "...'"


def parse_int(raw: str, *, minimum: int = INT64_MIN, maximum: int = INT64_MAX) -> int:
    """A whole number in ASCII digits (an optional sign), from `minimum` to `maximum`."""
    text = raw.strip()
    if len(text) > MAX_NUMBER_CHARS or not _INTEGER.fullmatch(text):
        raise ParseError(f"{shown(raw)} is not a whole number (digits 0-9).")
    value = int(text)
    if not minimum <= value <= maximum:
        raise ParseError(f"{value} is out of range: use a number from {minimum} to {maximum}.")
    return value


def parse_float(raw: str, *, minimum: float | None = None, maximum: float | None = None) -> float:
    """A finite number in ASCII digits, e.g. `1.5`, `-2`, `3e2`; from `minimum` to `maximum` when given."""
    text = raw.strip()
    if len(text) > MAX_NUMBER_CHARS or not _DECIMAL.fullmatch(text):
        raise ParseError(f"{shown(raw)} is not a number (digits 0-9, e.g. 1.5).")
    value = float(text)
    if not math.isfinite(value):
        raise ParseError(f"{shown(raw)} is too large a number.")
    if (minimum is not None and value < minimum) or (maximum is not None and value > maximum):
        low = "" if minimum is None else f" from {minimum:g}"
        high = "" if maximum is None else f" up to {maximum:g}"
        raise ParseError(f"{value:g} is out of range: use a number{low}{high}.")
    return value


def parse_page(raw: str | None) -> int | str:
    """A list's `?page=`: empty is the first page, `last` the last; else a whole number from 1.
    A number past the last page shows the last page (the rows may have gone since the link was
    made), as Django's `Paginator.get_page` does."""
    text = (raw or "").strip()
    if not text:
        return 1
    if text == "last":
        return text
    try:
        return parse_int(text, minimum=1)
    except ParseError as exc:
        raise ParseError(f"{exc} Pages are numbered from 1.") from None


def parse_time(raw: str, *, default_tz: tzinfo = UTC) -> datetime:
    """An aware UTC datetime from ISO 8601 or Unix seconds, between TIME_MIN and TIME_MAX.

    A time without an offset is in `default_tz`; a date alone is its midnight there."""
    text = raw.strip()
    advice = "use ISO 8601 (2026-03-01T12:00:00Z) or Unix seconds."
    if len(text) > 64 or not text.isascii():
        raise ParseError(f"{shown(raw)} is not a time: {advice}")
    if _DECIMAL.fullmatch(text):
        seconds = float(text)
        if not TIME_MIN.timestamp() <= seconds < TIME_MAX.timestamp():
            raise ParseError(f"{shown(raw)} is out of range: {_range_advice()}")
        return TIME_MIN + timedelta(seconds=seconds)
    text = _SPACED_OFFSET.sub(r"\1+\4", text)
    try:
        moment = datetime.fromisoformat(text[:-1] + "+00:00" if text.endswith(("Z", "z")) else text)
    except ValueError as exc:
        # Python says which part is wrong of a well-formed time ("day is out of range for month").
        reason = "" if str(exc).startswith("Invalid isoformat") else f" ({exc})"
        raise ParseError(f"{shown(raw)} is not a time{reason}: {advice}") from None
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=default_tz)
    try:
        moment = moment.astimezone(UTC)
    except (OverflowError, ValueError):  # a year-1 or year-9999 time shifted past datetime's range
        moment = None
    if moment is None or not TIME_MIN <= moment < TIME_MAX:
        raise ParseError(f"{shown(raw)} is out of range: {_range_advice()}")
    return moment


def _range_advice() -> str:
    return f"use a time from {TIME_MIN.year} up to {TIME_MAX.year}."

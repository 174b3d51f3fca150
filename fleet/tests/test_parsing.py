"""config.parsing: what a typed number or time may be, for every parameter that is not a form
field of its own. Pure functions, no database."""

from datetime import UTC, datetime, timedelta, timezone

import pytest

from config.parsing import ParseError, parse_float, parse_int, parse_page, parse_time


@pytest.mark.parametrize(("raw", "value"), [("42", 42), (" -7 ", -7), ("+3", 3), ("0", 0),
                                            (str(2**63 - 1), 2**63 - 1)])
def test_whole_numbers_in_ascii_digits_are_read(raw, value):
    assert parse_int(raw) == value


@pytest.mark.parametrize("raw", ["²", "٣", "１２", "1.5", "1e3", "nan", "inf", "", " ", "0x10", "1_000", "1\x00",
                                 "-", "9" * 41])
def test_anything_else_is_not_a_whole_number(raw):
    """`int("٣")` is 3 and `"²".isdigit()` is True, yet both are refused alike."""
    with pytest.raises(ParseError, match="is not a whole number"):
        parse_int(raw)


@pytest.mark.parametrize("raw", [str(2**63), str(-(2**63) - 1), str(10**30)])
def test_a_whole_number_no_database_column_holds_is_out_of_range(raw):
    with pytest.raises(ParseError, match="out of range"):
        parse_int(raw)


def test_bounds_of_the_caller_apply():
    assert parse_int("5", minimum=1, maximum=5) == 5
    with pytest.raises(ParseError, match="use a number from 1 to 5"):
        parse_int("6", minimum=1, maximum=5)


@pytest.mark.parametrize(("raw", "value"), [("1.5", 1.5), ("-2", -2.0), ("3e2", 300.0), (".5", 0.5)])
def test_numbers_with_a_fraction_are_read(raw, value):
    assert parse_float(raw) == value


@pytest.mark.parametrize(("raw", "message"), [("1e400", "too large"), ("-1e400", "too large"),
                                              ("nan", "not a number"), ("inf", "not a number"),
                                              ("٣.5", "not a number"), ("", "not a number")])
def test_infinite_or_unreadable_numbers_are_refused(raw, message):
    with pytest.raises(ParseError, match=message):
        parse_float(raw)


def test_a_number_out_of_the_callers_range_says_the_range():
    with pytest.raises(ParseError, match=r"use a number from 0.1 up to 16"):
        parse_float("17", minimum=0.1, maximum=16)


@pytest.mark.parametrize(("raw", "moment"), [
    ("2026-03-01T12:00:00Z", datetime(2026, 3, 1, 12, tzinfo=UTC)),
    ("2026-03-01T14:00:00+02:00", datetime(2026, 3, 1, 12, tzinfo=UTC)),
    ("2026-03-01T14:00:00 02:00", datetime(2026, 3, 1, 12, tzinfo=UTC)),  # a "+" that was not encoded
    ("2026-03-01", datetime(2026, 3, 1, tzinfo=UTC)),
    ("2026-03-01T12:00", datetime(2026, 3, 1, 12, tzinfo=UTC)),
    ("1772366400", datetime(2026, 3, 1, 12, tzinfo=UTC)),
    ("1772366400.5", datetime(2026, 3, 1, 12, 0, 0, 500_000, tzinfo=UTC)),
])
def test_times_are_iso_8601_or_unix_seconds_in_utc(raw, moment):
    assert parse_time(raw) == moment


def test_a_time_without_an_offset_is_in_the_zone_the_caller_gives():
    paris_winter = timezone(timedelta(hours=1))
    assert parse_time("2026-03-01T13:00", default_tz=paris_winter) == datetime(2026, 3, 1, 12, tzinfo=UTC)


@pytest.mark.parametrize(("raw", "message"), [
    ("2026-02-30", "not a time (day is out of range for month)"),
    ("2026-02-30T25:61:00Z", "not a time"),
    ("yesterday", "not a time"),
    ("٢٠٢٦-٠٣-٠١", "not a time"),
    ("2026-03-01\x00", "not a time"),
    ("x" * 5000, "not a time"),
    ("1e400", "out of range"),
    ("nan", "not a time"),
    ("-1", "out of range"),
    ("253402300800", "out of range"),
    ("9999-12-31T23:59:59", "out of range"),
    ("0001-01-01", "out of range"),
])
def test_times_that_do_not_exist_or_are_out_of_range_are_refused(raw, message):
    with pytest.raises(ParseError, match=message.replace("(", r"\(").replace(")", r"\)")):
        parse_time(raw)


@pytest.mark.parametrize(("raw", "page"), [(None, 1), ("", 1), ("3", 3), ("last", "last"), (str(2**62), 2**62)])
def test_page_numbers(raw, page):
    assert parse_page(raw) == page


@pytest.mark.parametrize("raw", ["0", "-1", "abc", "²", "1.5", str(10**30)])
def test_pages_are_numbered_from_1(raw):
    with pytest.raises(ParseError, match="Pages are numbered from 1"):
        parse_page(raw)

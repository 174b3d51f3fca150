"""`telemetry.state_digest`: equal readings, as PostgreSQL compares their columns, give equal
digests; a change of any field gives another."""

from datetime import UTC, datetime

import pytest

from telemetry.state_digest import Digest

NAMES = ("state", "limit_w", "counter", "reasons", "expiry", "extra")
FLOATS = {"limit_w", "expiry"}
READING = ("licensed", 350.0, 2**62, ["sw_power_cap", "hw_slowdown"], 1798761600.123456, {"a": 1, "b": [1, 2]})


def test_the_same_reading_told_in_other_forms_is_the_same_digest():
    digest = Digest(NAMES, FLOATS)
    same = ("licensed", 350, 2**62, ["sw_power_cap", "hw_slowdown"],
            datetime.fromtimestamp(1798761600.123456, tz=UTC), {"b": [1, 2], "a": 1})
    assert digest(same) == digest(READING)
    assert digest(("x", -0.0, None, None, None, None)) == digest(("x", 0.0, None, None, None, None))


def test_the_order_of_the_fields_does_not_matter():
    order = (5, 3, 0, 4, 1, 2)
    permuted = Digest([NAMES[i] for i in order], FLOATS)
    assert permuted([READING[i] for i in order]) == Digest(NAMES, FLOATS)(READING)


@pytest.mark.parametrize(("position", "other"), [
    (0, "unlicensed"), (0, None), (1, 350.5), (1, None), (2, 2**62 + 1), (2, 0), (3, []), (3, None),
    (3, ["hw_slowdown", "sw_power_cap"]), (4, 1798761600.123457), (5, {"a": 2, "b": [1, 2]}), (5, {}),
])
def test_any_change_of_a_field_is_another_digest(position, other):
    digest = Digest(NAMES, FLOATS)
    changed = list(READING)
    changed[position] = other
    assert digest(changed) != digest(READING)


def test_null_is_not_zero_nor_empty():
    digest = Digest(("a", "b"), {"b"})
    assert len({digest((None, None)), digest((0, 0.0)), digest(("", None)), digest(([], None))}) == 4

"""Pure parts of `telemetry.heatmap`: the default step, the hour-of-week columns (DST included)
and the fold, and the JSON rows the API splices into its response."""

from datetime import UTC, datetime, timedelta
from zoneinfo import ZoneInfo

import pytest

from telemetry.heatmap import (
    JsonRows,
    column_count,
    default_step,
    fold_hour_of_week,
    hour_of_week,
    hour_of_week_labels,
)

MONDAY = datetime(2026, 3, 2, tzinfo=UTC)
PARIS = ZoneInfo("Europe/Paris")


@pytest.mark.parametrize(("span", "step", "columns"), [
    (timedelta(hours=6), 300, 72),
    (timedelta(hours=24), 300, 288),
    (timedelta(days=7), 3600, 168),
    (timedelta(days=30), 10800, 240),
    (timedelta(days=365), 172800, 183),
])
def test_default_step_gives_at_most_300_columns(span, step, columns):
    assert default_step(MONDAY, MONDAY + span) == step
    assert column_count(MONDAY, MONDAY + span, step) == columns


def test_an_unaligned_start_counts_the_bucket_holding_it():
    assert column_count(MONDAY, MONDAY + timedelta(minutes=61), 300) == 13


def test_hour_of_week_labels_run_monday_to_sunday():
    labels = hour_of_week_labels()

    assert len(labels) == 168
    assert labels[:2] == ["Mon 00:00", "Mon 01:00"]
    assert labels[24 + 13] == "Tue 13:00"
    assert labels[-1] == "Sun 23:00"


def test_hour_of_week_is_the_local_wall_clock_across_dst():
    assert hour_of_week(datetime(2026, 3, 2, 9, tzinfo=UTC), PARIS) == 10  # UTC+1: Mon 10:00
    assert hour_of_week(datetime(2026, 3, 30, 8, tzinfo=UTC), PARIS) == 10  # UTC+2 after 29 March
    assert hour_of_week(datetime(2026, 3, 1, 23, tzinfo=UTC), PARIS) == 0  # Sunday 23:00 UTC: Mon 00:00 in Paris
    assert hour_of_week(datetime(2026, 3, 8, 23, 30, tzinfo=UTC), UTC) == 167


def test_fold_takes_the_mean_of_each_hour_of_the_week():
    first = MONDAY  # hour index 0 is Monday 00:00 UTC
    week = 168
    cells = {7: {10: 20.0, week + 10: 60.0, 2 * week + 11: 5.0}, 8: {}}

    folded = fold_hour_of_week(cells, first, 3 * week, UTC)

    assert folded[7][10] == 40.0
    assert folded[7][11] == 5.0
    assert sum(value is not None for value in folded[7]) == 2
    assert folded[8] == [None] * week


def test_json_rows_read_as_lists_and_join_as_one_matrix():
    rows = JsonRows(["[1.5, null]", "[null, 2]"])

    assert len(rows) == 2
    assert rows[0] == [1.5, None]
    assert rows[:] == [[1.5, None], [None, 2]]
    assert rows.tolist() == [[1.5, None], [None, 2]]
    assert rows.json() == "[[1.5, null],[null, 2]]"

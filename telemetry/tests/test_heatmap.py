"""Pure parts of `telemetry.heatmap`: the metrics each kind of row offers and their units, the
default step, the hour-of-week columns (DST included) and the fold, and the JSON rows the API
splices into its response; `telemetry.heatmap_codec`'s typed encoding, fixed-scale codes,
groups and the figures read from codes."""

import random
from datetime import UTC, datetime, timedelta
from zoneinfo import ZoneInfo

import pytest

from telemetry.heatmap import (
    GROUP_METRICS,
    UNITS,
    JsonRows,
    column_count,
    default_step,
    fold_hour_of_week,
    hour_of_week,
    hour_of_week_labels,
)
from telemetry.heatmap_codec import (
    NULL_CODE,
    code_mean,
    code_peak,
    code_sum,
    decode,
    encode_row,
    fixed_codes,
    group_cells,
    group_codes,
    group_windows,
    typed_matrix,
)
from telemetry.metrics import METRICS, VM_ROLLUPS

MONDAY = datetime(2026, 3, 2, tzinfo=UTC)
PARIS = ZoneInfo("Europe/Paris")
GUEST = ("vcpu_util", "vcpu_max_util", "cpu_steal_pct", "ram_used_mib", "ram_used_pct")


def test_vm_rows_offer_the_guest_metrics_and_gpu_and_host_rows_do_not():
    assert GROUP_METRICS["vm"] == ("util_gpu", "util_mem", "fb_used_mib", "fb_used_pct", "enc_util", "dec_util",
                                   *GUEST)
    assert GROUP_METRICS["gpu"] == GROUP_METRICS["host"] == (
        "util_gpu", "util_mem", "fb_used_mib", "fb_used_pct", "enc_util", "dec_util", "temp_c", "power_w",
        "sm_clock_mhz")
    # Each from the guest rollups; the memory share of the RAM allocation of the same rollup.
    assert {name: VM_ROLLUPS[METRICS[name].source].model.__name__ for name in GUEST} == dict.fromkeys(
        GUEST, "GuestRollup")
    assert VM_ROLLUPS[METRICS["ram_used_pct"].source].capacity_column == "ram_mib"
    assert [METRICS["ram_used_pct"].column(stat) for stat in METRICS["ram_used_pct"].stats] == [
        "ram_used_mib_avg", "ram_used_mib_max", "ram_used_mib_p95"]


def test_every_metric_has_a_unit_and_percentages_share_the_0_to_100_scale():
    assert set(UNITS) == set(METRICS)
    assert {name: UNITS[name] for name in GUEST} == {
        "vcpu_util": "%", "vcpu_max_util": "%", "cpu_steal_pct": "%", "ram_used_mib": "MiB", "ram_used_pct": "%"}


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


# The typed encoding and groups (telemetry.heatmap_codec) ---------------------------------------


def test_typed_matrix_round_trips_within_half_a_step():
    rows = [[0.0, 12.345, None, 100.0], [None, None, None, None], [99.9, 0.1, 50.0, 33.3]]

    z = typed_matrix([encode_row(row, 0.0, 100 / 254) for row in rows], 4, 0, 100)
    decoded = decode(z)

    assert (z["dtype"], z["shape"], z["null"]) == ("u1", "3, 4", 255)
    assert decoded[1] == [None] * 4
    assert (decoded[0][0], decoded[0][3]) == (0.0, 100.0)
    for exact, got in zip(sum(rows, []), sum(decoded, []), strict=True):
        assert (exact is None) == (got is None)
        if exact is not None:
            assert abs(exact - got) <= z["precision"] + 1e-12


def test_a_flat_or_empty_scale_still_decodes():
    assert decode(typed_matrix([encode_row([7.5, None, 7.5], 7.5, 1.0)], 3, 7.5, 7.5)) == [[7.5, None, 7.5]]
    assert decode(typed_matrix([encode_row([None], 0.0, 1.0)], 1, None, None)) == [[None]]


@pytest.mark.parametrize(("rows", "rows_max", "windows"), [
    (3, 5, [(0, 1), (1, 1), (2, 1)]),
    (10, 3, [(0, 4), (4, 4), (8, 2)]),
    (10_000, 200, [(i * 50, 50) for i in range(200)]),
])
def test_group_windows_cover_every_row_in_at_most_rows_max_groups(rows, rows_max, windows):
    assert group_windows(rows, rows_max) == windows


def test_group_cells_are_the_hottest_member_in_values_and_in_codes():
    assert group_cells([[1.0, None, 3.0], [2.0, None, None]]) == [2.0, None, 3.0]
    assert group_codes([bytes([1, 255, 3, 0]), bytes([2, 255, 255, 254])]) == bytes([2, 255, 3, 254])


def test_group_codes_take_each_columns_hottest_code_whatever_the_rows():
    """Random rows of every width and group size, against the plain column-by-column max (no data
    below any code)."""
    rng = random.Random(21)
    for width in (1, 7, 288, 300):
        for size in (1, 2, 3, 8, 50, 51):
            rows = [bytes(rng.choice([NULL_CODE, 0, 254, rng.randrange(255)]) for _ in range(width))
                    for _ in range(size)]
            expected = bytes(max((r[j] for r in rows if r[j] != NULL_CODE), default=NULL_CODE) for j in range(width))
            assert group_codes(rows) == expected, (width, size)


def test_fixed_codes_put_a_percentage_on_0_to_100_like_the_typed_matrix():
    codes = fixed_codes([0.0, 100.0, 50.0, None, 12.345, -3.0, 104.0], 0.0, 100.0)

    assert codes == encode_row([0.0, 100.0, 50.0, None, 12.345, 0.0, 100.0], 0.0, 100 / 254)
    assert codes[3] == NULL_CODE


def test_figures_read_from_codes_leave_cells_without_data_out():
    codes = bytes([NULL_CODE, 10, 254, NULL_CODE, 0, 200] * 100)  # 600 codes: sums past Adler-32's modulus

    assert code_sum(codes) == 464 * 100
    assert code_mean(codes) == pytest.approx(464 / 4)
    assert code_peak(codes) == 254
    assert (code_mean(bytes([NULL_CODE] * 5)), code_peak(bytes([NULL_CODE] * 5))) == (None, None)
    assert code_peak(bytes([NULL_CODE, 0])) == 0

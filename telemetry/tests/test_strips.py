"""Heatmap strips (`telemetry.strips`): the typed GPU x time heatmap at 5-minute steps read from
the strips is the one read from the rollups (the same cells, byte for byte, across a UTC
midnight and with missing data; exact row figures; group figures within the precision), late
and rebuilt rollups update the strips, whole days rebuilt from the rollups are the same strips,
and a range the strips do not cover, or that retention has passed, is read from the rollups."""

import gzip
import io
import json
from datetime import UTC, datetime, timedelta

import pytest
from django.core.management import CommandError, call_command
from django.db import connection
from django.test.utils import CaptureQueriesContext

from telemetry import strips
from telemetry.heatmap_codec import NULL_CODE, decode
from telemetry.models import GpuRollup, GpuStrip, StripCoverage
from telemetry.retention import prune_samples
from telemetry.rollups import build_rollups, rewind_rollups
from telemetry.tests.rollup_world import gpu_samples, studio

URL = "/api/v1/heatmap/"
#: Midnight UTC between Monday 2 and Tuesday 3 March 2026: the strips' day boundary.
MIDNIGHT = datetime(2026, 3, 3, tzinfo=UTC)
START, END = MIDNIGHT - timedelta(minutes=30), MIDNIGHT + timedelta(minutes=30)
BUILT_AT = MIDNIGHT + timedelta(minutes=35)


def at(minutes: float) -> datetime:
    """`minutes` after midnight (negative: before)."""
    return MIDNIGHT + timedelta(minutes=minutes)


@pytest.fixture
def world(artist):
    """The studio (render-01: gpu_1, gpu_2; render-02: gpu_idle, silent), ws-ana of the artist of
    `artist_api`, and 23:40 to 00:25 of readings built into rollups and strips:

    - gpu_1 reads every 10 s, utilization varying within each bucket (fractional means), frame
      buffer against its reported total;
    - gpu_2 has no reading from 23:55 to 00:10 (three buckets across midnight), no
      utilization in its 00:10 bucket (readings without it), readings again from 00:15 to 00:25,
      and no reported total (the frame buffer share is of its model's)."""
    fleet = studio(artist=artist)
    gpu_samples(fleet.gpu_1, at(-20), 270, util_gpu=lambda i: (i * 7) % 101, util_mem=lambda i: i % 50,
                enc_util=lambda i: i % 7, fb_used_mib=lambda i: 1000 + 37 * i, fb_total_mib=49152)
    gpu_samples(fleet.gpu_2, at(-20), 90, util_gpu=lambda i: 90 - i % 13, fb_used_mib=20000)
    gpu_samples(fleet.gpu_2, at(10), 30, util_gpu=None, fb_used_mib=30000)
    gpu_samples(fleet.gpu_2, at(15), 60, util_gpu=lambda i: 40 + i % 3, fb_used_mib=25000)
    build_rollups(300, now=BUILT_AT, late_s=0)
    return fleet


def typed(client, start=START, end=END, **params) -> dict:
    response = client.get(URL, {"start": start.isoformat(), "end": end.isoformat(), "encoding": "typed", **params},
                          HTTP_ACCEPT_ENCODING="gzip")
    assert response.status_code == 200, response.content
    return json.loads(gzip.decompress(response.content))


def from_rollups(client, **params) -> dict:
    """The same answer as before strips existed: their coverage set aside."""
    kept = list(StripCoverage.objects.all())
    StripCoverage.objects.all().delete()
    try:
        return typed(client, **params)
    finally:
        StripCoverage.objects.bulk_create(kept)


def assert_same_rows(new: list[dict], old: list[dict]) -> None:
    """The same rows with the same exact figures (up to the last bits of their float sums)."""
    figures = ("peak", "mean")
    assert [{k: v for k, v in row.items() if k not in figures} for row in new] == [
        {k: v for k, v in row.items() if k not in figures} for row in old]
    for got, want in zip([row[k] for row in new for k in figures], [row[k] for row in old for k in figures],
                         strict=True):
        assert got == want or got == pytest.approx(want, rel=1e-12)


def strip_of(gpu, day, series="util_gpu_avg") -> bytes:
    return bytes(GpuStrip.objects.get(gpu=gpu, series=series, day=day).codes)


def test_strips_are_written_with_the_rollups_a_byte_a_bucket(world):
    yesterday = strip_of(world.gpu_2, START.date())
    today = strip_of(world.gpu_2, MIDNIGHT.date())

    assert len(today) == len(yesterday) == 288
    assert yesterday[:284] == bytes([NULL_CODE]) * 284, "nothing before 23:40"
    assert NULL_CODE not in yesterday[284:287], "23:40 to 23:50 read"
    assert yesterday[287] == NULL_CODE, "23:55 not"
    assert today[:2] == bytes([NULL_CODE]) * 2, "00:00 and 00:05: no reading"
    assert today[2] == NULL_CODE, "00:10: readings without the utilization"
    assert NULL_CODE not in today[3:5], "00:15 and 00:20 read"
    assert today[5:] == bytes([NULL_CODE]) * 283
    assert not GpuStrip.objects.filter(gpu=world.gpu_idle).exists()
    assert {s for s in GpuStrip.objects.values_list("series", flat=True)} == strips.SERIES_NAMES
    assert StripCoverage.objects.get().since == strips.BEGINNING, "every rollup was written with its strips"


@pytest.mark.parametrize("params", [
    {}, {"stat": "max"}, {"stat": "p95"}, {"metric": "util_mem"}, {"metric": "fb_used_pct"},
    {"metric": "fb_used_pct", "stat": "max"}, {"metric": "enc_util"},
    {"sort": "peak"}, {"sort": "mean"}, {"row_start": 1, "row_count": 1}, {"host": "render-01"},
    {"start": MIDNIGHT - timedelta(minutes=27)},  # an unaligned start: rounded down
    {"start": MIDNIGHT - timedelta(hours=24)},  # the page's 24 h: three UTC days
])
def test_strips_give_the_cells_and_row_figures_the_rollups_give(admin_api, world, params):
    new = typed(admin_api, **params)
    old = from_rollups(admin_api, **params)

    assert decode(new["z"]) == decode(old["z"])
    assert new["z"]["bdata"] == old["z"]["bdata"]
    assert_same_rows(new["rows"], old["rows"])
    assert {k: v for k, v in new.items() if k not in ("z", "rows")} == {k: v for k, v in old.items()
                                                                         if k not in ("z", "rows")}
    assert any(v is not None for row in decode(new["z"]) for v in row), "some data drawn"


def test_an_artist_reads_from_the_strips_only_what_they_may_read(artist_api, world):
    new = typed(artist_api)
    old = from_rollups(artist_api)

    assert new["z"] == old["z"]
    assert_same_rows(new["rows"], old["rows"])
    assert new["ids"] == [world.gpu_1.pk], "gpu_2 is shared with another artist"


@pytest.mark.parametrize("params", [{"rows_max": 2}, {"rows_max": 1}, {"rows_max": 2, "sort": "peak"}])
def test_groups_from_the_strips_have_the_same_cells_and_figures_within_the_precision(admin_api, world, params):
    with CaptureQueriesContext(connection) as queries:
        new = typed(admin_api, **params)
    old = from_rollups(admin_api, **params)

    assert new["z"]["bdata"] == old["z"]["bdata"]
    assert new["y"] == old["y"]
    for got, want in zip(new["groups"], old["groups"], strict=True):
        assert {k: got[k] for k in ("label", "row_start", "row_count", "hosts")} == {
            k: want[k] for k in ("label", "row_start", "row_count", "hosts")}
        assert want["precision"] == 0.0, "from the rollups: exact"
        for name in ("peak", "mean"):
            assert got[name] == pytest.approx(want[name], abs=got["precision"] + 1e-9)
    if params.get("sort", "host") == "host":
        assert got["precision"] == pytest.approx(new["z"]["precision"]), "figures from codes: within a code"
        assert not [q for q in queries.captured_queries if "telemetry_gpurollup" in q["sql"]], "no rollup read"


def test_a_late_rollup_updates_the_strip(admin_api, world):
    before = decode(typed(admin_api)["z"])
    # The page's grouped answer, cached until a table it read is written.
    grouped_before = typed(admin_api, end=END + timedelta(minutes=5), rows_max=1)
    # 23:45: a reading that came back after the late window (a backfill), then rebuilt.
    gpu_samples(world.gpu_1, at(-15) + timedelta(seconds=5), 1, util_gpu=100)
    rewind_rollups(at(-15))
    build_rollups(300, now=BUILT_AT, late_s=0)
    # 00:30: readings a poll late, after the run at 00:35 closed their bucket: the next run, within
    # the late window, builds it again.
    gpu_samples(world.gpu_2, at(30), 30, util_gpu=3)
    build_rollups(300, now=at(36), late_s=120)

    after = typed(admin_api, end=END + timedelta(minutes=5))
    cells = decode(after["z"])
    column = after["x"].index("2026-03-02T23:45:00Z")
    exact = GpuRollup.objects.get(gpu=world.gpu_1, step_s=300, bucket=at(-15)).util_gpu_avg

    assert cells[0][column] != before[0][column]
    assert cells[0][column] == pytest.approx(exact, abs=after["z"]["precision"])
    assert cells[1][-1] == pytest.approx(3.0, abs=after["z"]["precision"])
    assert after["z"]["bdata"] == from_rollups(admin_api, end=END + timedelta(minutes=5))["z"]["bdata"]
    grouped = typed(admin_api, end=END + timedelta(minutes=5), rows_max=1)
    assert decode(grouped_before["z"])[0][-1] is None
    assert decode(grouped["z"])[0][-1] == pytest.approx(3.0, abs=0.2), "the page's grouped answer is fresh too"


def test_days_rebuilt_from_the_rollups_are_the_strips_written_bucket_by_bucket(world):
    written = {(s.gpu_id, s.series, s.day): bytes(s.codes) for s in GpuStrip.objects.all()}
    GpuStrip.objects.all().delete()
    StripCoverage.objects.all().delete()

    count = strips.rebuild_days(at(-20).date(), at(25).date())

    assert count == len(written)
    assert {(s.gpu_id, s.series, s.day): bytes(s.codes) for s in GpuStrip.objects.all()} == written
    assert StripCoverage.objects.get().since == datetime(2026, 3, 2, tzinfo=UTC), "no rollup after the days"


def test_a_range_before_the_strips_began_is_read_from_the_rollups(admin_api, world):
    """Rollups written before strips existed (an upgrade): the first bucket written with its strips
    starts the coverage, a range reaching older rollups is read from the rollups until
    `build_heatmap_strips` rebuilds their days, then from the strips."""
    StripCoverage.objects.all().delete()
    GpuStrip.objects.filter(day=MIDNIGHT.date() - timedelta(days=1)).delete()
    gpu_samples(world.gpu_1, at(35), 30, util_gpu=77)
    build_rollups(300, now=at(40), late_s=0)

    body = typed(admin_api, end=at(40))
    cells = decode(body["z"])[0]
    assert StripCoverage.objects.get().since == at(35)
    assert cells[:2] == [None, None]
    assert cells[2] is not None, "23:40, from the rollups"
    assert cells[-1] == pytest.approx(77.0, abs=body["z"]["precision"])

    strips.rebuild_days(START.date(), at(35).date())
    assert StripCoverage.objects.get().since == datetime(2026, 3, 2, tzinfo=UTC)
    assert typed(admin_api, end=at(40))["z"] == body["z"]


def test_retention_deletes_the_strips_of_expired_days_and_what_it_passed_is_read_from_the_rollups(
        admin_api, world, settings):
    settings.TELEMETRY_RETENTION_5M_DAYS = 1
    prune_samples(now=MIDNIGHT + timedelta(days=1, minutes=15))

    assert set(GpuStrip.objects.values_list("day", flat=True)) == {MIDNIGHT.date()}
    assert StripCoverage.objects.get().since == at(15)
    body = typed(admin_api)
    assert body["z"]["bdata"] == from_rollups(admin_api)["z"]["bdata"]
    assert all(v is None for row in decode(body["z"]) for v in row[:9]), "rollups before 00:15 are gone"


def test_build_heatmap_strips_covers_the_days_asked_for(admin_api, world, time_machine):
    """After an upgrade: `manage.py build_heatmap_strips --days 2` on 3 March covers 2 and 3 March."""
    GpuStrip.objects.all().delete()
    StripCoverage.objects.all().delete()
    time_machine.move_to(BUILT_AT, tick=False)
    out = io.StringIO()

    call_command("build_heatmap_strips", "--days", "2", stdout=out)

    assert StripCoverage.objects.get().since == datetime(2026, 3, 2, tzinfo=UTC)
    assert "Wrote 48 strips of 2 days" in out.getvalue(), "2 GPUs with readings x 12 series x 2 days"
    assert typed(admin_api)["z"]["bdata"] == from_rollups(admin_api)["z"]["bdata"]
    with pytest.raises(CommandError):
        call_command("build_heatmap_strips", "--days", "0")

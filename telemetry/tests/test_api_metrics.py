"""`gpus/{id}/metrics/` and `vms/{id}/metrics/`: series from the rollups, bounded ranges,
parameter errors that name the parameter, role scoping (an artist never reads a GPU shared with
anyone else); and `latest` on the GPU detail."""

from datetime import timedelta

import pytest

from fleet import services
from fleet.models import Vgpu
from fleet.tests.factories import VirtualMachineFactory
from telemetry.models import GpuRollup, VmRollup
from telemetry.rollups import build_rollups
from telemetry.tests.rollup_world import T0, at, gpu_samples, studio, vgpu_samples


@pytest.fixture
def world(artist):
    """The studio, with the signed-in artist (`artist_api`) as the owner of `ws-ana`."""
    return studio(artist=artist)


def gpu_url(gpu) -> str:
    return f"/api/v1/gpus/{gpu.pk}/metrics/"


def vm_url(vm) -> str:
    return f"/api/v1/vms/{vm.pk}/metrics/"


def five_minute_rollups(gpu, values: list[tuple[int, float, float, float]], start=T0):
    """GPU rollups from (samples, avg, max, p95) of util_gpu and fb_used_mib, one a 5 minutes."""
    GpuRollup.objects.bulk_create(
        GpuRollup(gpu=gpu, step_s=300, bucket=start + timedelta(minutes=5 * i), samples=n,
                  util_gpu_avg=avg, util_gpu_max=mx, util_gpu_p95=p95, util_mem_avg=avg / 2, util_mem_max=mx / 2,
                  fb_used_mib_avg=avg * 100, fb_used_mib_max=mx * 100, fb_used_mib_p95=p95 * 100,
                  fb_total_mib=46068.0, temp_c_avg=50.0, temp_c_max=60.0)
        for i, (n, avg, mx, p95) in enumerate(values)
    )


def get(client, url, **params):
    return client.get(url, params)


# Shapes and figures ------------------------------------------------------------------------


def test_gpu_series_shape_with_a_point_per_step_and_gaps_as_null(admin_api, world):
    five_minute_rollups(world.gpu_1, [(30, 10.0, 20.0, 19.0), (30, 30.0, 40.0, 39.0)])
    five_minute_rollups(world.gpu_1, [(30, 50.0, 60.0, 59.0)], start=at(900))  # 10:10 is missing

    response = get(admin_api, gpu_url(world.gpu_1), start=T0.isoformat(), end=at(1200).isoformat(), step=300)

    assert response.status_code == 200, response.content
    body = response.json()
    assert {k: body[k] for k in ("gpu", "step", "source_step", "start", "end")} == {
        "gpu": world.gpu_1.pk, "step": 300, "source_step": 300,
        "start": "2026-03-02T10:00:00Z", "end": "2026-03-02T10:20:00Z",
    }
    assert set(body["series"]) == {"util_gpu", "util_mem", "fb_used_mib", "fb_used_pct", "enc_util", "dec_util",
                                   "temp_c", "power_w", "sm_clock_mhz"}
    util = body["series"]["util_gpu"]
    assert util["t"] == ["2026-03-02T10:00:00Z", "2026-03-02T10:05:00Z", "2026-03-02T10:10:00Z",
                         "2026-03-02T10:15:00Z"]
    assert util["avg"] == [10.0, 30.0, None, 50.0]
    assert util["max"] == [20.0, 40.0, None, 60.0]
    assert util["p95"] == [19.0, 39.0, None, 59.0]
    assert set(body["series"]["util_mem"]) == {"t", "avg", "max"}  # only the statistics it has
    assert set(body["series"]["sm_clock_mhz"]) == {"t", "avg"}
    assert body["series"]["enc_util"]["avg"] == [None] * 4  # not reported: null, never 0
    assert body["series"]["fb_used_pct"]["max"][0] == pytest.approx(2000 * 100 / 46068)


def test_wider_step_merges_rollups_weighting_by_samples(admin_api, world):
    five_minute_rollups(world.gpu_1, [(10, 10.0, 20.0, 15.0), (30, 50.0, 90.0, 70.0), (20, 40.0, 45.0, 44.0)])

    body = get(admin_api, gpu_url(world.gpu_1), start=T0.isoformat(), end=at(900).isoformat(), step=900,
               metric="util_gpu").json()

    assert body["step"] == 900
    assert body["source_step"] == 300
    assert body["series"]["util_gpu"] == {
        "t": ["2026-03-02T10:00:00Z"],
        "avg": [pytest.approx((10 * 10 + 30 * 50 + 20 * 40) / 60)],
        "max": [90.0],
        "p95": [70.0],  # the highest of the p95s: an upper bound
    }


def test_hourly_steps_read_hourly_rollups(admin_api, world):
    GpuRollup.objects.create(gpu=world.gpu_1, step_s=3600, bucket=T0, samples=360, util_gpu_avg=33.0,
                             util_gpu_max=99.0, util_gpu_p95=80.0)
    five_minute_rollups(world.gpu_1, [(30, 1.0, 1.0, 1.0)])  # must not be read

    body = get(admin_api, gpu_url(world.gpu_1), start=T0.timestamp(), end=at(7200).timestamp(), step=3600,
               metric="util_gpu").json()

    assert body["source_step"] == 3600
    assert body["series"]["util_gpu"]["avg"] == [33.0, None]
    assert body["series"]["util_gpu"]["p95"] == [80.0, None]


def test_from_raw_samples_to_the_vm_chart(admin_api, world):
    """End to end: samples, the rollup build, then the VM's series in MiB and % of its profiles."""
    vgpu_samples(world.vm_ana, world.gpu_1, T0, 30, fb_used_mib=6144.0, util_gpu=lambda i: float(i))
    vgpu_samples(world.vm_ana, world.gpu_2, T0, 30, fb_used_mib=6144.0, util_gpu=5.0)
    build_rollups(300, now=at(600))

    body = get(admin_api, vm_url(world.vm_ana), start=T0.isoformat(), end=at(600).isoformat(), step=300).json()

    assert body["vm"] == world.vm_ana.pk
    assert set(body["series"]) == {"util_gpu", "util_mem", "fb_used_mib", "fb_used_pct", "enc_util", "dec_util"}
    assert body["series"]["fb_used_mib"]["avg"] == [12288.0, None]
    assert body["series"]["fb_used_pct"]["avg"] == [50.0, None]  # of two 12 GiB profiles
    assert body["series"]["util_gpu"]["max"] == [29.0, None]
    assert body["series"]["util_gpu"]["p95"] == [28.0, None]
    assert VmRollup.objects.get(vm=world.vm_ana).util_gpu_avg == pytest.approx(15.0)  # max(i, 5) averaged


def test_metric_filter_repeated_or_comma_separated(admin_api, world):
    five_minute_rollups(world.gpu_1, [(30, 10.0, 20.0, 19.0)])
    url = f"{gpu_url(world.gpu_1)}?start={T0.timestamp():.0f}&end={at(300).timestamp():.0f}"

    assert set(admin_api.get(f"{url}&metric=util_gpu,temp_c").json()["series"]) == {"util_gpu", "temp_c"}
    assert set(admin_api.get(f"{url}&metric=power_w&metric=util_mem").json()["series"]) == {"power_w", "util_mem"}


def test_times_iso_with_offset_or_unix_seconds_mean_the_same(admin_api, world):
    five_minute_rollups(world.gpu_1, [(30, 10.0, 20.0, 19.0)])
    url = gpu_url(world.gpu_1)

    iso = get(admin_api, url, start="2026-03-02T12:00:00+02:00", end="2026-03-02T12:05:00+02:00", step=300)
    unix = get(admin_api, url, start=str(int(T0.timestamp())), end=str(int(at(300).timestamp())), step=300)
    # A "+" that was not percent-encoded arrives as a space.
    spaced = admin_api.get(f"{url}?start=2026-03-02T12:00:00+02:00&end=2026-03-02T12:05:00+02:00&step=300")
    naive_is_utc = get(admin_api, url, start="2026-03-02T10:00:00", end="2026-03-02 10:05", step=300)

    assert iso.json() == unix.json() == spaced.json() == naive_is_utc.json()
    assert iso.json()["series"]["util_gpu"]["avg"] == [10.0]


def test_step_defaults_to_at_most_720_points(admin_api, world):
    url = gpu_url(world.gpu_1)
    day = get(admin_api, url, start=T0.isoformat(), end=(T0 + timedelta(days=1)).isoformat()).json()
    month = get(admin_api, url, start=T0.isoformat(), end=(T0 + timedelta(days=30)).isoformat()).json()

    assert (day["step"], day["source_step"], len(day["series"]["util_gpu"]["t"])) == (300, 300, 288)
    assert (month["step"], month["source_step"], len(month["series"]["util_gpu"]["t"])) == (3600, 3600, 720)


# Bounded range and parameter errors --------------------------------------------------------


@pytest.mark.parametrize(
    ("params", "field", "words"),
    [
        ({"end": "2026-03-02T11:00:00Z"}, "start", "Required"),
        ({"start": "2026-03-02T10:00:00Z"}, "end", "Required"),
        ({"start": "yesterday", "end": "2026-03-02T11:00:00Z"}, "start", "'yesterday' is not a time"),
        ({"start": "2026-03-02T10:00:00Z", "end": "2026-13-45"}, "end", "not a time"),
        ({"start": "2026-03-02T11:00:00Z", "end": "2026-03-02T10:00:00Z"}, "end", "later than start"),
        ({"start": "2024-01-01", "end": "2026-01-01"}, "end", "at most 400 days"),
        ({"start": "2026-01-01", "end": "2026-03-01", "step": 300}, "step", "more than 10,000"),
        ({"start": "2026-03-02T10:00:00Z", "end": "2026-03-02T11:00:00Z", "step": "five"}, "step", "whole number"),
        ({"start": "2026-03-02T10:00:00Z", "end": "2026-03-02T11:00:00Z", "step": 450}, "step", "multiple of 300"),
        ({"start": "2026-03-02T10:00:00Z", "end": "2026-03-02T11:00:00Z", "step": 5400}, "step", "multiple of 3600"),
        ({"start": "2026-03-02T10:00:00Z", "end": "2026-03-02T11:00:00Z", "step": 0}, "step", "multiple of 300"),
        ({"start": "2026-03-02T10:00:00Z", "end": "2026-03-02T11:00:00Z", "metric": "gpu_util"}, "metric",
         "'gpu_util' not available"),
    ],
)
def test_invalid_or_unbounded_parameters_are_400_naming_the_parameter(admin_api, world, params, field, words):
    response = get(admin_api, gpu_url(world.gpu_1), **params)

    assert response.status_code == 400
    assert list(response.json()) == [field]
    assert words in response.json()[field][0]


def test_missing_range_names_both_ends(admin_api, world):
    response = admin_api.get(gpu_url(world.gpu_1))

    assert response.status_code == 400
    assert set(response.json()) == {"start", "end"}


def test_too_many_points_suggests_a_step(admin_api, world):
    response = get(admin_api, gpu_url(world.gpu_1), start="2026-01-01", end="2026-03-01", step=300)

    assert "use a step of at least 600 s" in response.json()["step"][0]


def test_gpu_only_metrics_are_refused_for_a_vm(admin_api, world):
    response = get(admin_api, vm_url(world.vm_ana), start="2026-03-02T10:00:00Z", end="2026-03-02T11:00:00Z",
                   metric="temp_c")

    assert response.status_code == 400
    assert "not available for a VM" in response.json()["metric"][0]


# Role scoping ------------------------------------------------------------------------------

RANGE = {"start": "2026-03-02T10:00:00Z", "end": "2026-03-02T11:00:00Z"}


def test_artist_reads_own_vm_and_the_gpus_carrying_it_only(artist_api, world):
    assert get(artist_api, vm_url(world.vm_ana), **RANGE).status_code == 200
    assert get(artist_api, gpu_url(world.gpu_1), **RANGE).status_code == 200  # ws-ana alone on it
    assert get(artist_api, vm_url(world.vm_bob), **RANGE).status_code == 404
    assert get(artist_api, gpu_url(world.gpu_idle), **RANGE).status_code == 404
    # Out of scope is 404 before any parameter is looked at: nothing to learn from a 400.
    assert artist_api.get(vm_url(world.vm_bob)).status_code == 404


def test_artist_cannot_read_the_series_of_a_gpu_shared_with_another_artist(artist_api, admin_api, world):
    """gpu_2 carries ws-ana and Bob's ws-bob: its readings are both VMs' usage together, so Ana
    (who knows her own share from her VM's series) would read Bob's usage off it."""
    five_minute_rollups(world.gpu_2, [(30, 87.0, 91.0, 90.0)])

    response = get(artist_api, gpu_url(world.gpu_2), **RANGE)

    assert response.status_code == 403
    assert "/api/v1/vms/{id}/metrics/" in response.json()["detail"]
    assert b"87" not in response.content
    assert b"91" not in response.content
    for metric in ("util_gpu", "fb_used_pct", "power_w"):  # no metric and no parameter opens it
        assert get(artist_api, gpu_url(world.gpu_2), metric=metric, step=3600, **RANGE).status_code == 403
    assert get(admin_api, gpu_url(world.gpu_2), **RANGE).json()["series"]["util_gpu"]["avg"][0] == 87.0


def test_artist_alone_on_a_gpu_reads_its_series(artist_api, world):
    five_minute_rollups(world.gpu_1, [(30, 35.0, 50.0, 48.0)])

    body = get(artist_api, gpu_url(world.gpu_1), step=300, metric="util_gpu", **RANGE).json()

    assert body["series"]["util_gpu"]["avg"][:2] == [35.0, None]


def test_a_vm_without_an_artist_or_removed_from_the_gpu_decides_as_it_is_now(artist_api, world):
    """A co-tenant without an artist is still someone else; once Bob's vGPU leaves gpu_2, Ana is
    alone on it and reads it."""
    five_minute_rollups(world.gpu_1, [(30, 35.0, 50.0, 48.0)])
    services.place_vgpu(VirtualMachineFactory(name="ws-spare", artist=None), world.gpu_1, world.q12)
    assert get(artist_api, gpu_url(world.gpu_1), **RANGE).status_code == 403

    services.remove_vgpu(Vgpu.objects.get(vm=world.vm_bob))
    assert get(artist_api, gpu_url(world.gpu_2), **RANGE).status_code == 200


def test_admin_reads_everything_and_anonymous_gets_401(admin_api, api, world):
    assert get(admin_api, vm_url(world.vm_bob), **RANGE).status_code == 200
    assert get(admin_api, gpu_url(world.gpu_idle), **RANGE).status_code == 200
    assert get(admin_api, "/api/v1/gpus/999999/metrics/", **RANGE).status_code == 404
    assert get(api, gpu_url(world.gpu_1), **RANGE).status_code == 401
    assert get(api, vm_url(world.vm_ana), **RANGE).status_code == 401


# `latest` on the GPU detail ----------------------------------------------------------------


def test_gpu_detail_latest_is_the_newest_sample(artist_api, admin_api, world):
    gpu_samples(world.gpu_1, T0, 3, util_gpu=lambda i: [10.0, 20.0, 30.0][i], util_mem=13,
                fb_used_mib=lambda i: 1000.0 * (i + 1), fb_total_mib=46068.0, enc_util=None, dec_util=0.0,
                temp_c=55.0, power_w=210.5, sm_clock_mhz=2100.0)
    gpu_samples(world.gpu_2, T0, 1, util_gpu=99.0)

    latest = artist_api.get(f"/api/v1/gpus/{world.gpu_1.pk}/").json()["latest"]

    assert latest == {
        "ts": "2026-03-02T10:00:20Z", "util_gpu": 30.0, "util_mem": 13, "fb_used_mib": 3000,
        "fb_total_mib": 46068, "enc_util": None, "dec_util": 0.0, "temp_c": 55.0, "power_w": 210.5,
        "sm_clock_mhz": 2100,
    }
    assert admin_api.get(f"/api/v1/gpus/{world.gpu_idle.pk}/").json()["latest"] is None
    # gpu_2 is shared with Bob's VM: an artist's detail of it carries no reading, an admin's does.
    assert artist_api.get(f"/api/v1/gpus/{world.gpu_2.pk}/").json()["latest"] is None
    assert admin_api.get(f"/api/v1/gpus/{world.gpu_2.pk}/").json()["latest"]["util_gpu"] == 99.0
    assert "latest" not in admin_api.get("/api/v1/gpus/").json()["results"][0]


def test_schema_documents_the_metrics_endpoints(admin_api, db):
    schema = admin_api.get("/api/schema/", HTTP_ACCEPT="application/vnd.oai.openapi+json").json()

    gpu = schema["paths"]["/api/v1/gpus/{id}/metrics/"]["get"]
    assert {p["name"]: p.get("required", False) for p in gpu["parameters"]} == {
        "id": True, "start": True, "end": True, "step": False, "metric": False, "format": False,
    }
    assert set(gpu["responses"]) == {"200", "400", "403"}
    series = schema["components"]["schemas"]["GpuMetricSeries"]["properties"]
    assert "sm_clock_mhz" in series
    assert "temp_c" not in schema["components"]["schemas"]["VmMetricSeries"]["properties"]
    assert "/api/v1/vms/{id}/metrics/" in schema["paths"]

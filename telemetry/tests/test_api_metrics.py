"""`gpus/{id}/metrics/` and `vms/{id}/metrics/`: series from the rollups, bounded ranges,
parameter errors that name the parameter, role scoping (an artist never reads a GPU shared with
anyone else); and `latest` on the GPU detail."""

from datetime import timedelta

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from fleet import services
from fleet.models import Vgpu
from fleet.tests.factories import VirtualMachineFactory
from telemetry.models import GpuRollup, GuestRollup, GuestSample, VmRollup
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
    assert set(body["series"]) == {"util_gpu", "util_mem", "fb_used_mib", "fb_used_pct", "enc_util", "dec_util",
                                   "vcpu_util", "vcpu_max_util", "cpu_steal_pct", "ram_used_mib", "ram_used_pct"}
    assert body["series"]["vcpu_util"] == {"t": ["2026-03-02T10:00:00Z", "2026-03-02T10:05:00Z"],
                                           "avg": [None, None], "p95": [None, None], "max": [None, None]}
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


# A VM's guest CPU and memory (GuestRollup) ------------------------------------------------

GUEST_METRICS = ("vcpu_util", "vcpu_max_util", "cpu_steal_pct", "ram_used_mib", "ram_used_pct")


def guest_rollup(vm, seconds: int, samples: int, ram_mib: int, cpu: tuple, busiest: tuple, steal: tuple,
                 ram: tuple, step_s: int = 300) -> GuestRollup:
    """A guest rollup of `vm` at `seconds` after T0 from (avg, p95, max) of vcpu_util,
    vcpu_max_util and ram_used_mib and (avg, max) of cpu_steal_pct."""
    return GuestRollup.objects.create(
        vm=vm, step_s=step_s, bucket=at(seconds), samples=samples, vcpus=8, ram_mib=ram_mib,
        vcpu_util_avg=cpu[0], vcpu_util_p95=cpu[1], vcpu_util_max=cpu[2],
        vcpu_max_util_avg=busiest[0], vcpu_max_util_p95=busiest[1], vcpu_max_util_max=busiest[2],
        cpu_steal_pct_avg=steal[0], cpu_steal_pct_max=steal[1],
        ram_used_mib_avg=ram[0], ram_used_mib_p95=ram[1], ram_used_mib_max=ram[2])


@pytest.fixture
def guest(world):
    """ws-ana's guest over 20 minutes: 32 GiB of RAM, memory not reported at 10:05 (a guest
    without the balloon driver), nothing at all at 10:10, then resized to 16 GiB at 10:15."""
    guest_rollup(world.vm_ana, 0, 10, 32768, (20.0, 40.0, 50.0), (60.0, 90.0, 100.0), (1.0, 2.5),
                 (8192.0, 16384.0, 16384.0))
    guest_rollup(world.vm_ana, 300, 30, 32768, (40.0, 70.0, 80.0), (80.0, 95.0, 100.0), (3.0, 6.0),
                 (None, None, None))
    guest_rollup(world.vm_ana, 900, 20, 16384, (10.0, 12.0, 15.0), (30.0, 50.0, 60.0), (0.5, 1.0),
                 (4096.0, 8192.0, 12288.0))
    return world


def test_vm_guest_series_from_its_guest_rollups_with_memory_as_share_of_its_ram(admin_api, guest):
    body = get(admin_api, vm_url(guest.vm_ana), start=T0.isoformat(), end=at(1200).isoformat(), step=300,
               metric=",".join(GUEST_METRICS)).json()

    series = body["series"]
    assert list(series) == list(GUEST_METRICS)
    assert series["vcpu_util"] == {
        "t": ["2026-03-02T10:00:00Z", "2026-03-02T10:05:00Z", "2026-03-02T10:10:00Z", "2026-03-02T10:15:00Z"],
        "avg": [20.0, 40.0, None, 10.0], "p95": [40.0, 70.0, None, 12.0], "max": [50.0, 80.0, None, 15.0],
    }
    assert series["vcpu_max_util"]["p95"] == [90.0, 95.0, None, 50.0]
    assert {k: v for k, v in series["cpu_steal_pct"].items() if k != "t"} == {
        "avg": [1.0, 3.0, None, 0.5], "max": [2.5, 6.0, None, 1.0]}  # no p95 kept for steal
    # Memory the guest did not report stays null, never 0.
    assert series["ram_used_mib"]["avg"] == [8192.0, None, None, 4096.0]
    assert series["ram_used_mib"]["p95"] == [16384.0, None, None, 8192.0]
    # Of the RAM the VM had in that bucket: 32 GiB, then 16 GiB.
    assert {k: v for k, v in series["ram_used_pct"].items() if k != "t"} == {
        "avg": [25.0, None, None, 25.0], "p95": [50.0, None, None, 50.0], "max": [50.0, None, None, 75.0]}


def test_a_wider_step_merges_guest_rollups_as_the_vgpu_ones(admin_api, guest):
    body = get(admin_api, vm_url(guest.vm_ana), start=T0.isoformat(), end=at(1200).isoformat(), step=1200,
               metric=",".join(GUEST_METRICS)).json()

    series = body["series"]
    assert (body["step"], body["source_step"]) == (1200, 300)
    assert series["vcpu_util"]["avg"] == [pytest.approx((10 * 20.0 + 30 * 40.0 + 20 * 10.0) / 60)]
    assert (series["vcpu_util"]["p95"], series["vcpu_util"]["max"]) == ([70.0], [80.0])  # highest p95, max
    # The 30 readings without a memory figure weigh nothing in the mean.
    assert series["ram_used_mib"]["avg"] == [pytest.approx((10 * 8192.0 + 20 * 4096.0) / 30)]
    assert series["ram_used_pct"] == {"t": ["2026-03-02T10:00:00Z"], "avg": [25.0], "p95": [50.0], "max": [75.0]}


def test_guest_and_vgpu_series_of_a_vm_in_one_request_each_from_its_rollups(admin_api, guest):
    VmRollup.objects.create(vm=guest.vm_ana, step_s=300, bucket=T0, samples=30, fb_used_mib_avg=6144.0,
                            fb_used_mib_max=6144.0, fb_used_mib_p95=6144.0, util_gpu_avg=55.0,
                            profile_fb_mib=24576.0)
    url = f"{vm_url(guest.vm_ana)}?start={T0.timestamp():.0f}&end={at(300).timestamp():.0f}"

    body = admin_api.get(f"{url}&metric=ram_used_pct,fb_used_pct&metric=util_gpu,vcpu_util").json()
    with CaptureQueriesContext(connection) as queries:
        admin_api.get(f"{url}&metric=vcpu_util")

    assert list(body["series"]) == ["ram_used_pct", "fb_used_pct", "util_gpu", "vcpu_util"]
    assert body["series"]["fb_used_pct"]["avg"] == [25.0]  # of its profiles' 24 GiB
    assert body["series"]["ram_used_pct"]["avg"] == [25.0]  # of its 32 GiB of RAM
    assert (body["series"]["util_gpu"]["avg"], body["series"]["vcpu_util"]["avg"]) == ([55.0], [20.0])
    read = " ".join(q["sql"] for q in queries.captured_queries)
    assert "telemetry_guestrollup" in read
    assert "telemetry_vmrollup" not in read  # guest metrics alone read only the guest rollups


def test_from_guest_samples_to_the_vm_chart(admin_api, world):
    """End to end: guest readings through the hypervisor, the rollup build, then the series."""
    for i in range(10):
        GuestSample.objects.create(vm=world.vm_ana, ts=at(30 * i), vcpus=8, ram_mib=32768,
                                   vcpu_util=12.5 if i >= 5 else 3.0, vcpu_max_util=100.0 if i >= 5 else 10.0,
                                   cpu_steal_pct=0.5, ram_used_mib=None if i == 3 else (16384 if i >= 5 else 8192))
        GuestSample.objects.create(vm=world.vm_bob, ts=at(30 * i), vcpus=4, ram_mib=16384, vcpu_util=1.0,
                                   vcpu_max_util=2.0, cpu_steal_pct=None, ram_used_mib=None)
    build_rollups(300, now=at(600))

    ana = get(admin_api, vm_url(world.vm_ana), start=T0.isoformat(), end=at(600).isoformat(), step=300).json()
    bob = get(admin_api, vm_url(world.vm_bob), start=T0.isoformat(), end=at(600).isoformat(), step=300,
              metric="ram_used_pct,ram_used_mib,cpu_steal_pct").json()

    series = ana["series"]
    assert series["vcpu_util"] == {"t": ["2026-03-02T10:00:00Z", "2026-03-02T10:05:00Z"],
                                   "avg": [7.75, None], "p95": [12.5, None], "max": [12.5, None]}
    assert series["vcpu_max_util"]["avg"] == [55.0, None]
    assert series["cpu_steal_pct"]["max"] == [0.5, None]
    # Nine memory readings (four of 8 GiB, five of 16 GiB): the one without a figure left out.
    assert series["ram_used_mib"]["avg"] == [pytest.approx((4 * 8192 + 5 * 16384) / 9), None]
    assert series["ram_used_pct"]["avg"] == [pytest.approx((4 * 25.0 + 5 * 50.0) / 9), None]
    assert series["ram_used_pct"]["max"] == [50.0, None]
    # A guest that never reported its memory or steal: null, never 0.
    assert bob["series"]["ram_used_pct"]["avg"] == [None, None]
    assert bob["series"]["ram_used_mib"]["max"] == [None, None]
    assert bob["series"]["cpu_steal_pct"]["avg"] == [None, None]


def test_an_artist_reads_the_guest_series_of_their_own_vm_only(artist_api, guest):
    guest_rollup(guest.vm_bob, 0, 10, 16384, (66.0, 66.0, 66.0), (66.0, 66.0, 66.0), (6.6, 6.6),
                 (6666.0, 6666.0, 6666.0))

    own = get(artist_api, vm_url(guest.vm_ana), metric="vcpu_util,ram_used_pct", step=300, **RANGE)
    other = get(artist_api, vm_url(guest.vm_bob), metric="vcpu_util,ram_used_pct", step=300, **RANGE)

    assert own.status_code == 200
    assert own.json()["series"]["vcpu_util"]["avg"][:2] == [20.0, 40.0]
    assert other.status_code == 404
    assert b"66" not in other.content


def test_guest_metrics_are_refused_for_a_gpu_and_unknown_ones_name_the_valid_list(admin_api, world):
    for_gpu = get(admin_api, gpu_url(world.gpu_1), metric="vcpu_util", **RANGE)
    unknown = get(admin_api, vm_url(world.vm_ana), metric="ram_used,vcpu_util", **RANGE)

    assert for_gpu.status_code == 400
    assert for_gpu.json()["metric"] == [
        "'vcpu_util' not available for a GPU; use util_gpu, util_mem, fb_used_mib, fb_used_pct, enc_util, "
        "dec_util, temp_c, power_w, sm_clock_mhz."]
    assert unknown.status_code == 400
    assert unknown.json()["metric"] == [
        "'ram_used' not available for a VM; use util_gpu, util_mem, fb_used_mib, fb_used_pct, enc_util, dec_util, "
        "vcpu_util, vcpu_max_util, cpu_steal_pct, ram_used_mib, ram_used_pct."]


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
    vm_series = schema["components"]["schemas"]["VmMetricSeries"]["properties"]
    assert "temp_c" not in vm_series
    assert {"vcpu_util", "vcpu_max_util", "cpu_steal_pct", "ram_used_mib", "ram_used_pct"} <= set(vm_series)
    assert "vcpu_util" not in series
    vm_metric = next(p for p in schema["paths"]["/api/v1/vms/{id}/metrics/"]["get"]["parameters"]
                     if p["name"] == "metric")
    assert "ram_used_pct" in vm_metric["schema"]["items"]["enum"]
    assert "/api/v1/vms/{id}/metrics/" in schema["paths"]

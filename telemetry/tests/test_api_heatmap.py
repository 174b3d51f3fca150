"""`heatmap/`: one row per GPU, VM or host in scope (silent ones as nulls), cells merged from the
rollups as the metrics API merges them, host rows combining their GPUs, the sorts, the
hour-of-week fold in the studio's time zone, role scoping, a 400 naming each bad parameter,
a query count that does not grow with the fleet, the typed encoding (the same values within
its step, gzipped, fresh after new rollups) and rows grouped with a drill-down window."""

import gzip
import json
import re
from datetime import UTC, datetime, timedelta

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from fleet import services
from fleet.tests.factories import GpuFactory, HostFactory, VirtualMachineFactory, gpu_model, profile
from telemetry.heatmap import page_default_query
from telemetry.heatmap_codec import decode
from telemetry.models import GpuRollup, GuestRollup, VmRollup
from telemetry.rollup_tasks import build_rollups as build_rollups_task
from telemetry.rollups import build_rollups
from telemetry.tests.rollup_world import L40S, T0, at, gpu_samples, studio

URL = "/api/v1/heatmap/"
L40S_FB_MIB = 49152.0
Q12_FB_MIB = 12288.0


@pytest.fixture
def world(artist):
    """The studio (render-01: gpu_1, gpu_2; render-02: gpu_idle), `ws-ana` owned by the signed-in
    artist of `artist_api`."""
    return studio(artist=artist)


def gpu_rollups(gpu, values, start=T0, step_s=300, **fields):
    """Rollups of `gpu` from (samples, avg, max, p95) of util_gpu, one a `step_s` from `start`;
    frame buffer used is 100x the utilization figures."""
    GpuRollup.objects.bulk_create(
        GpuRollup(gpu=gpu, step_s=step_s, bucket=start + timedelta(seconds=step_s * i), samples=n,
                  util_gpu_avg=avg, util_gpu_max=mx, util_gpu_p95=p95,
                  fb_used_mib_avg=avg * 100, fb_used_mib_max=mx * 100, fb_used_mib_p95=p95 * 100, **fields)
        for i, (n, avg, mx, p95) in enumerate(values)
    )


def vm_rollups(vm, fb_used_mib: list[float], profile_fb_mib=Q12_FB_MIB * 2, start=T0, step_s=300):
    VmRollup.objects.bulk_create(
        VmRollup(vm=vm, step_s=step_s, bucket=start + timedelta(seconds=step_s * i), samples=30,
                 fb_used_mib_avg=fb, fb_used_mib_max=fb, fb_used_mib_p95=fb, util_gpu_avg=10.0,
                 profile_fb_mib=profile_fb_mib)
        for i, fb in enumerate(fb_used_mib)
    )


def guest_rollups(vm, ram_used_mib: list[float | None], vcpu_util: list[float] | None = None, ram_mib=32768,
                  samples=30, start=T0, step_s=300):
    """Guest rollups of `vm` (its CPU and memory read through the hypervisor), one a `step_s`:
    memory used as given (None: not reported) of `ram_mib`; vcpu_util avg as given, its p95 5
    points and its max 10 points higher, the busiest vCPU twice as busy."""
    cpu = vcpu_util or [10.0] * len(ram_used_mib)
    GuestRollup.objects.bulk_create(
        GuestRollup(vm=vm, step_s=step_s, bucket=start + timedelta(seconds=step_s * i), samples=samples, vcpus=8,
                    ram_mib=ram_mib, vcpu_util_avg=c, vcpu_util_p95=c + 5, vcpu_util_max=c + 10,
                    vcpu_max_util_avg=2 * c, vcpu_max_util_p95=2 * c, vcpu_max_util_max=2 * c,
                    cpu_steal_pct_avg=1.0, cpu_steal_pct_max=2.0,
                    ram_used_mib_avg=ram, ram_used_mib_p95=ram, ram_used_mib_max=ram)
        for i, (ram, c) in enumerate(zip(ram_used_mib, cpu, strict=True))
    )


def heatmap(client, start=T0, end=None, **params):
    response = client.get(URL, {"start": start.isoformat(), "end": (end or start + timedelta(hours=1)).isoformat(),
                                **params})
    assert response.status_code == 200, response.content
    return response.json()


def by_label(body) -> dict[str, list]:
    return dict(zip(body["y"], body["z"], strict=True))


# Shape -------------------------------------------------------------------------------------


def test_gpu_by_time_lists_every_gpu_with_silent_ones_as_nulls(admin_api, world):
    gpu_rollups(world.gpu_1, [(30, 10.0, 20.0, 19.0), (30, 30.0, 40.0, 39.0)])

    body = heatmap(admin_api)

    assert {k: body[k] for k in ("group", "metric", "stat", "fold", "sort", "unit", "start", "end", "step",
                                 "source_step", "zmin", "zmax")} == {
        "group": "gpu", "metric": "util_gpu", "stat": "avg", "fold": "none", "sort": "host", "unit": "%",
        "start": "2026-03-02T10:00:00Z", "end": "2026-03-02T11:00:00Z", "step": 300, "source_step": 300,
        "zmin": 0, "zmax": 100,
    }
    assert body["x"] == [f"2026-03-02T10:{m:02d}:00Z" for m in range(0, 60, 5)]
    assert body["y"] == ["render-01 · 00000000:3B:00.0", "render-01 · 00000000:5E:00.0",
                         "render-02 · 00000000:3B:00.0"]
    assert body["ids"] == [world.gpu_1.pk, world.gpu_2.pk, world.gpu_idle.pk]
    assert [row["label"] for row in body["rows"]] == body["y"]
    assert [row["id"] for row in body["rows"]] == body["ids"]
    assert body["rows"][0] == {
        "id": world.gpu_1.pk, "label": "render-01 · 00000000:3B:00.0", "host_id": world.host.pk, "host": "render-01",
        "detail_url": f"/gpus/{world.gpu_1.pk}/", "subtitle": L40S, "peak": 30.0, "mean": 20.0,
    }
    assert body["z"][0] == [10.0, 30.0] + [None] * 10
    # Silent GPUs are rows too: the picture shows them idle instead of hiding them.
    assert body["z"][1] == body["z"][2] == [None] * 12
    assert body["rows"][2]["peak"] is None
    assert body["rows"][2]["mean"] is None


@pytest.mark.parametrize(("span", "step", "columns", "expected_step", "source_step"), [
    (timedelta(hours=6), None, 72, 300, 300),
    (timedelta(hours=24), None, 288, 300, 300),
    (timedelta(days=7), None, 168, 3600, 3600),
    (timedelta(days=30), None, 240, 10800, 3600),
    (timedelta(hours=1), "900", 4, 900, 300),
    (timedelta(days=2), "7200", 24, 7200, 3600),
])
def test_columns_per_range_and_step(admin_api, world, span, step, columns, expected_step, source_step):
    params = {"step": step} if step else {}
    midnight = T0.replace(hour=0)  # a bucket start of every step

    body = heatmap(admin_api, start=midnight, end=midnight + span, **params)

    assert (len(body["x"]), body["step"], body["source_step"]) == (columns, expected_step, source_step)
    assert all(len(line) == columns for line in body["z"])
    assert len(body["z"]) == len(body["y"]) == len(body["ids"]) == len(body["rows"]) == 3


def test_start_is_floored_to_the_step_and_end_kept(admin_api, world):
    gpu_rollups(world.gpu_1, [(30, 10.0, 20.0, 19.0)])

    body = heatmap(admin_api, start=at(130), end=at(1800), step=900)

    assert body["start"] == "2026-03-02T10:00:00Z"
    assert body["end"] == "2026-03-02T10:30:00Z"
    assert body["x"] == ["2026-03-02T10:00:00Z", "2026-03-02T10:15:00Z"]
    assert body["z"][0] == [10.0, None]


# Values ------------------------------------------------------------------------------------


def test_gaps_inside_a_row_stay_null_at_their_place(admin_api, world, django_assert_max_num_queries):
    gpu_rollups(world.gpu_1, [(30, 10.0, 10.0, 10.0), (30, 20.0, 20.0, 20.0)], start=at(300))
    gpu_rollups(world.gpu_1, [(30, 40.0, 40.0, 40.0)], start=at(1200))  # 10:10 and 10:15 missing
    gpu_rollups(world.gpu_2, [(30, 50.0, 50.0, 50.0)], start=at(900))

    # One more query on PostgreSQL, only when a row has gaps: where its cells go.
    with django_assert_max_num_queries(3):
        gpus = by_label(heatmap(admin_api, end=at(1800)))
    merged = by_label(heatmap(admin_api, end=at(1800), step=600))
    hosts = heatmap(admin_api, end=at(1800), group="host", stat="max")

    assert gpus["render-01 · 00000000:3B:00.0"] == [None, 10.0, 20.0, None, 40.0, None]
    assert gpus["render-01 · 00000000:5E:00.0"] == [None, None, None, 50.0, None, None]
    assert merged["render-01 · 00000000:3B:00.0"] == [10.0, 20.0, 40.0]
    assert hosts["z"][0] == [None, 10.0, 20.0, 50.0, 40.0, None]


def test_the_browsable_api_shows_the_same_matrix(admin_api, world):
    gpu_rollups(world.gpu_1, [(30, 10.5, 20.0, 19.0)])

    response = admin_api.get(URL, {"start": T0.isoformat(), "end": at(600).isoformat()}, HTTP_ACCEPT="text/html")

    assert response.status_code == 200
    page = re.sub(r"\s", "", response.content.decode())
    assert "render-01·00000000:3B:00.0" in page
    assert "&quot;z&quot;:[[10.5,null],[null,null],[null,null]]" in page


def test_wider_step_merges_rollups_weighting_by_samples(admin_api, world):
    gpu_rollups(world.gpu_1, [(10, 10.0, 20.0, 15.0), (30, 50.0, 90.0, 70.0), (20, 40.0, 45.0, 44.0),
                              (30, 5.0, 6.0, 6.0)])

    def cells(stat):
        return by_label(heatmap(admin_api, end=at(1800), step=900, stat=stat))["render-01 · 00000000:3B:00.0"]

    assert cells("avg") == [pytest.approx((10 * 10 + 30 * 50 + 20 * 40) / 60), pytest.approx((30 * 5) / 30)]
    assert cells("max") == [90.0, 6.0]
    assert cells("p95") == [70.0, 6.0]  # the highest p95: an upper bound, as in the metrics API


def test_a_rollup_without_the_reading_does_not_dilute_the_mean(admin_api, world):
    gpu_rollups(world.gpu_1, [(10, 10.0, 20.0, 15.0)])
    GpuRollup.objects.create(gpu=world.gpu_1, step_s=300, bucket=at(300), samples=50)  # util_gpu not reported

    cells = by_label(heatmap(admin_api, end=at(600), step=600))["render-01 · 00000000:3B:00.0"]

    assert cells == [10.0]


def test_hourly_steps_read_hourly_rollups(admin_api, world):
    gpu_rollups(world.gpu_1, [(360, 40.0, 80.0, 70.0)], step_s=3600)
    gpu_rollups(world.gpu_1, [(30, 99.0, 99.0, 99.0)], step_s=300)  # not read at an hourly step

    body = heatmap(admin_api, end=at(7200), step=3600)

    assert body["source_step"] == 3600
    assert body["z"][0] == [40.0, None]


def test_fb_used_pct_of_a_gpu_is_of_its_reported_total_else_of_its_model(admin_api, world):
    gpu_rollups(world.gpu_1, [(30, 123.0, 200.0, 150.0)], fb_total_mib=24600.0)  # 12,300 MiB used
    gpu_rollups(world.gpu_2, [(30, 123.0, 200.0, 150.0)])  # no total reported: the L40S's 48 GiB

    rows = by_label(heatmap(admin_api, end=at(300), metric="fb_used_pct"))
    maxes = by_label(heatmap(admin_api, end=at(300), metric="fb_used_pct", stat="max"))

    assert rows["render-01 · 00000000:3B:00.0"] == [pytest.approx(50.0)]
    assert rows["render-01 · 00000000:5E:00.0"] == [pytest.approx(12300 * 100 / L40S_FB_MIB)]
    assert maxes["render-01 · 00000000:3B:00.0"] == [pytest.approx(20000 * 100 / 24600)]


def test_fb_used_mib_scale_is_the_data_range(admin_api, world):
    gpu_rollups(world.gpu_1, [(30, 10.0, 20.0, 19.0), (30, 30.0, 40.0, 39.0)])

    body = heatmap(admin_api, metric="fb_used_mib")
    empty = heatmap(admin_api, start=T0 - timedelta(days=1), metric="temp_c")

    assert (body["unit"], body["zmin"], body["zmax"]) == ("MiB", 1000.0, 3000.0)
    assert (empty["unit"], empty["zmin"], empty["zmax"]) == ("°C", None, None)


def test_vm_by_time_is_frame_buffer_as_share_of_the_profiles(admin_api, world):
    vm_rollups(world.vm_ana, [6144.0, 12288.0, 24576.0])  # ws-ana holds two L40S-12Q: 24 GiB
    vm_rollups(world.vm_bob, [3072.0], profile_fb_mib=Q12_FB_MIB)
    gone = VirtualMachineFactory(name="ws-gone")  # no vGPU now, but data in the range: listed
    vm_rollups(gone, [1024.0], profile_fb_mib=4096.0)
    VirtualMachineFactory(name="ws-never")  # no vGPU and no data: not a heatmap row

    body = heatmap(admin_api, end=at(900), group="vm")

    assert body["metric"] == "fb_used_pct"
    assert body["y"] == ["ws-ana", "ws-bob", "ws-gone"]  # render-01's VMs, then the one placed nowhere
    assert body["z"] == [[25.0, 50.0, 100.0], [25.0, None, None], [25.0, None, None]]
    ana = body["rows"][0]
    assert ana["subtitle"] == "Ana Artist · L40S-12Q ×2"
    assert ana["detail_url"] == f"/vms/{world.vm_ana.pk}/"
    assert (ana["host"], ana["host_id"]) == ("render-01", world.host.pk)
    assert body["rows"][2]["subtitle"].endswith("no vGPU now")
    assert body["rows"][2]["host"] is None


def test_vm_by_time_of_the_guest_memory_as_share_of_its_ram_with_unreported_memory_as_gaps(admin_api, world):
    guest_rollups(world.vm_ana, [8192.0, None, 24576.0], vcpu_util=[10.0, 20.0, 30.0])  # of 32 GiB
    guest_rollups(world.vm_bob, [4096.0], ram_mib=16384)
    guest_only = VirtualMachineFactory(name="ws-guest")  # no vGPU, but its guest was read: listed
    guest_rollups(guest_only, [8192.0], ram_mib=16384)
    gone = VirtualMachineFactory(name="ws-gone")  # vGPU history only: no row of the guest's metrics
    vm_rollups(gone, [1024.0], profile_fb_mib=4096.0)

    body = heatmap(admin_api, end=at(900), group="vm", metric="ram_used_pct")
    mib = heatmap(admin_api, end=at(900), group="vm", metric="ram_used_mib", stat="max")
    busiest = heatmap(admin_api, end=at(900), group="vm", metric="vcpu_util", stat="p95")

    assert (body["metric"], body["unit"], body["zmin"], body["zmax"]) == ("ram_used_pct", "%", 0, 100)
    assert body["y"] == ["ws-ana", "ws-bob", "ws-guest"]
    assert body["z"] == [[25.0, None, 75.0], [25.0, None, None], [50.0, None, None]]
    assert (body["rows"][0]["peak"], body["rows"][0]["mean"]) == (75.0, 50.0)
    assert body["rows"][2]["subtitle"].endswith("no vGPU now")
    assert (mib["unit"], mib["zmin"], mib["zmax"]) == ("MiB", 4096.0, 24576.0)
    assert mib["z"] == [[8192.0, None, 24576.0], [4096.0, None, None], [8192.0, None, None]]
    assert busiest["z"][0] == [15.0, 25.0, 35.0]


def test_guest_cells_merge_weighting_by_samples_and_leave_unreported_memory_out(admin_api, world):
    guest_rollups(world.vm_ana, [8192.0, None, 24576.0], vcpu_util=[10.0, 40.0, 30.0], samples=20)
    guest_rollups(world.vm_ana, [16384.0], vcpu_util=[70.0], samples=60, start=at(900))

    def cells(metric, stat):
        return by_label(heatmap(admin_api, end=at(1800), step=900, group="vm", metric=metric, stat=stat))["ws-ana"]

    assert cells("vcpu_util", "avg") == [pytest.approx((20 * 10 + 20 * 40 + 20 * 30) / 60), 70.0]
    assert cells("vcpu_util", "max") == [50.0, 80.0]
    assert cells("ram_used_pct", "avg") == [pytest.approx((20 * 25 + 20 * 75) / 40), 50.0]
    assert cells("ram_used_mib", "p95") == [24576.0, 16384.0]  # the highest p95: an upper bound
    assert cells("cpu_steal_pct", "max") == [2.0, 2.0]


def test_host_rows_combine_their_gpus_mean_for_avg_and_highest_for_max(admin_api, world):
    gpu_rollups(world.gpu_1, [(30, 20.0, 50.0, 45.0), (30, 10.0, 10.0, 10.0)])
    gpu_rollups(world.gpu_2, [(10, 60.0, 70.0, 65.0)])

    avg = heatmap(admin_api, end=at(600), group="host")
    peak = heatmap(admin_api, end=at(600), group="host", stat="max")

    assert avg["y"] == ["render-01", "render-02"]
    assert avg["z"] == [[40.0, 10.0], [None, None]]  # the mean of the GPUs, not weighted by samples
    assert peak["z"] == [[70.0, 10.0], [None, None]]
    assert [row["subtitle"] for row in avg["rows"]] == ["2 GPUs", "1 GPU"]
    assert avg["rows"][0]["detail_url"] == f"/hosts/{world.host.pk}/"


# Sorting -----------------------------------------------------------------------------------


def test_sorts_by_host_peak_and_mean_with_rows_without_data_last(admin_api, world):
    other = GpuFactory(host=HostFactory(name="render-00"), gpu_model=gpu_model(L40S), pci_bus_id="00000000:01:00.0")
    gpu_rollups(world.gpu_1, [(30, 10.0, 20.0, 19.0), (30, 90.0, 95.0, 94.0)])  # peak 90, mean 50
    gpu_rollups(world.gpu_2, [(30, 60.0, 70.0, 69.0), (30, 60.0, 70.0, 69.0)])  # peak 60, mean 60
    gpu_rollups(other, [(30, 5.0, 5.0, 5.0)])  # peak 5, mean 5

    def order(sort):
        return heatmap(admin_api, sort=sort)["ids"]

    assert order("host") == [other.pk, world.gpu_1.pk, world.gpu_2.pk, world.gpu_idle.pk]
    assert order("peak") == [world.gpu_1.pk, world.gpu_2.pk, other.pk, world.gpu_idle.pk]
    assert order("mean") == [world.gpu_2.pk, world.gpu_1.pk, other.pk, world.gpu_idle.pk]
    body = heatmap(admin_api, sort="peak")
    assert body["y"][0] == "render-01 · 00000000:3B:00.0"
    assert body["z"][0][:2] == [10.0, 90.0]  # cells travel with their row


# Hour of week ------------------------------------------------------------------------------


def test_hour_of_week_folds_in_the_studio_time_zone(admin_api, world, settings):
    """Monday 10:00 in Paris is 09:00 UTC in winter and 08:00 UTC after the clocks go forward
    (2026-03-29): both land in "Mon 10:00", which shows their mean."""
    settings.TIME_ZONE = "Europe/Paris"
    winter = datetime(2026, 3, 2, 9, 0, tzinfo=UTC)
    summer = datetime(2026, 3, 30, 8, 0, tzinfo=UTC)
    gpu_samples(world.gpu_1, winter, 6, every_s=600, util_gpu=20.0)
    gpu_samples(world.gpu_1, summer, 6, every_s=600, util_gpu=60.0)
    build_rollups(3600, now=summer + timedelta(hours=2), max_buckets=10_000, late_s=0)

    body = heatmap(admin_api, start=datetime(2026, 3, 1, tzinfo=UTC), end=datetime(2026, 4, 1, tzinfo=UTC),
                   fold="hour_of_week")

    assert (body["fold"], body["step"], body["source_step"]) == ("hour_of_week", 3600, 3600)
    assert len(body["x"]) == 168
    assert (body["x"][0], body["x"][10], body["x"][-1]) == ("Mon 00:00", "Mon 10:00", "Sun 23:00")
    cells = by_label(body)["render-01 · 00000000:3B:00.0"]
    assert cells[10] == pytest.approx(40.0)
    assert [i for i, value in enumerate(cells) if value is not None] == [10]
    assert body["rows"][0]["peak"] == pytest.approx(40.0)


def test_hour_of_week_of_hosts(admin_api, world):
    gpu_rollups(world.gpu_1, [(360, 20.0, 30.0, 30.0)], step_s=3600)  # Monday 10:00 UTC
    gpu_rollups(world.gpu_2, [(360, 40.0, 90.0, 80.0)], step_s=3600)

    body = heatmap(admin_api, end=T0 + timedelta(days=7), group="host", fold="hour_of_week", stat="max")

    assert body["y"] == ["render-01", "render-02"]
    assert body["z"][0][10] == 90.0
    assert body["z"][1] == [None] * 168


# Scoping -----------------------------------------------------------------------------------


def test_artist_sees_own_vms_the_gpus_only_they_use_and_those_hosts(artist_api, world):
    gpu_rollups(world.gpu_1, [(30, 20.0, 50.0, 45.0)])
    gpu_rollups(world.gpu_idle, [(30, 99.0, 99.0, 99.0)])
    vm_rollups(world.vm_bob, [1024.0])

    assert heatmap(artist_api, group="vm")["y"] == ["ws-ana"]
    assert heatmap(artist_api)["ids"] == [world.gpu_1.pk]  # gpu_2 carries Bob's VM too
    hosts = heatmap(artist_api, group="host")
    assert hosts["y"] == ["render-01"]
    assert hosts["z"][0][0] == 20.0
    response = artist_api.get(URL, {"start": T0.isoformat(), "end": at(3600).isoformat(),
                                    "host": world.gpu_idle.host_id})
    assert response.status_code == 400
    assert "host" in response.json()


def test_artist_sees_the_guest_rows_of_their_own_vms_only(artist_api, admin_api, world):
    guest_rollups(world.vm_ana, [8192.0])
    guest_rollups(world.vm_bob, [12288.0])
    guest_rollups(VirtualMachineFactory(name="ws-spare", artist=None), [4096.0], ram_mib=8192)

    body = heatmap(artist_api, group="vm", metric="ram_used_pct")

    assert body["y"] == ["ws-ana"]
    assert [v for row in body["z"] for v in row if v is not None] == [25.0]
    assert heatmap(admin_api, group="vm", metric="ram_used_pct")["y"] == ["ws-ana", "ws-bob", "ws-spare"]


def test_artist_host_rows_combine_only_the_gpus_they_may_see(artist_api, world):
    hidden = GpuFactory(host=world.host, gpu_model=gpu_model(L40S), pci_bus_id="00000000:86:00.0")
    gpu_rollups(world.gpu_1, [(30, 20.0, 20.0, 20.0)])
    gpu_rollups(hidden, [(30, 80.0, 80.0, 80.0)])

    body = heatmap(artist_api, group="host")

    assert body["z"][0][0] == 20.0
    assert body["rows"][0]["subtitle"] == "1 GPU"


SHARED_READING = 77.0  # gpu_2's figure: ws-ana's and Bob's ws-bob's usage together


@pytest.mark.parametrize("params", [
    {"group": "gpu"}, {"group": "gpu", "stat": "max", "sort": "peak"}, {"group": "gpu", "metric": "fb_used_pct"},
    {"group": "host"}, {"group": "host", "stat": "p95"}, {"group": "host", "metric": "fb_used_mib"},
    {"group": "gpu", "host": "render-01"}, {"group": "host", "host": "render-01"},
    {"group": "host", "fold": "hour_of_week", "step": "3600"},
], ids=lambda params: "-".join(params.values()))
def test_no_row_or_cell_of_an_artist_carries_a_gpu_shared_with_another_artist(artist_api, admin_api, world, params):
    gpu_rollups(world.gpu_1, [(30, 20.0, 20.0, 20.0)] * 12)
    gpu_rollups(world.gpu_2, [(30, SHARED_READING, SHARED_READING, SHARED_READING)] * 12)
    gpu_rollups(world.gpu_1, [(30, 20.0, 20.0, 20.0)], step_s=3600)
    gpu_rollups(world.gpu_2, [(30, SHARED_READING, SHARED_READING, SHARED_READING)], step_s=3600)
    if "host" in params:
        params = {**params, "host": world.host.pk}

    body = heatmap(artist_api, **params)
    staff = heatmap(admin_api, **params)

    # Every cell is gpu_1's own figure (20% busy, 2000 MiB used), never one mixed with gpu_2's.
    own = {"util_gpu": 20.0, "fb_used_mib": 2000.0, "fb_used_pct": 2000.0 * 100 / L40S_FB_MIB}[params.get(
        "metric", "util_gpu")]
    cells = [v for row in body["z"] for v in row if v is not None]
    assert cells
    assert cells == pytest.approx([own] * len(cells))
    assert [figure for row in body["rows"] for figure in (row["peak"], row["mean"])] == pytest.approx([own, own])
    if params["group"] == "gpu":
        assert body["ids"] == [world.gpu_1.pk]
    assert max(v for row in staff["z"] for v in row if v is not None) > own, "admins still see gpu_2"


def test_an_artist_sharing_every_gpu_has_no_gpu_or_host_rows(artist_api, world):
    """Ana's second vGPU leaves gpu_1: she is then only on gpu_2, which Bob shares."""
    gpu_rollups(world.gpu_2, [(30, SHARED_READING, SHARED_READING, SHARED_READING)])
    services.remove_vgpu(world.vm_ana.vgpus.get(gpu=world.gpu_1))

    assert heatmap(artist_api, group="gpu")["rows"] == []
    assert heatmap(artist_api, group="host")["rows"] == []
    assert heatmap(artist_api, group="host", host=world.host.pk)["z"] == []
    assert heatmap(artist_api, group="host", fold="hour_of_week")["y"] == []
    assert heatmap(artist_api, group="vm")["y"] == ["ws-ana"]  # her own series stays


def test_anonymous_gets_401(api, world):
    assert api.get(URL, {"start": T0.isoformat(), "end": at(3600).isoformat()}).status_code == 401


# Bad input ---------------------------------------------------------------------------------


@pytest.mark.parametrize(("params", "field", "words"), [
    ({"group": "rack"}, "group", "gpu, vm, host"),
    ({"metric": "fan_pct"}, "metric", "util_gpu"),
    ({"group": "vm", "metric": "temp_c"}, "metric", "VM rows"),
    ({"group": "vm", "metric": "ram_used"}, "metric", "vcpu_util, vcpu_max_util, cpu_steal_pct, ram_used_mib, "
                                                      "ram_used_pct"),
    ({"metric": "vcpu_util"}, "metric", "not a metric of GPU rows"),
    ({"group": "host", "metric": "ram_used_pct"}, "metric", "not a metric of host rows"),
    ({"group": "vm", "metric": "cpu_steal_pct", "stat": "p95"}, "stat", "avg, max"),
    ({"metric": "util_mem", "stat": "p95"}, "stat", "avg, max"),
    ({"stat": "median"}, "stat", "avg, max, p95"),
    ({"fold": "day_of_week"}, "fold", "hour_of_week"),
    ({"sort": "name"}, "sort", "host, peak, mean"),
    ({"host": "render-99"}, "host", "'render-99'"),
    ({"host": "999999"}, "host", "999999"),
    ({"start": "yesterday"}, "start", "not a time"),
    ({"end": "2026-03-02T09:00:00Z"}, "end", "later than start"),
    ({"end": "2027-06-01T00:00:00Z"}, "end", "400 days"),
    ({"step": "7"}, "step", "multiple of 300"),
    ({"step": "abc"}, "step", "whole number"),
    ({"step": "300", "end": "2026-03-12T10:00:00Z"}, "step", "2,000"),
    ({"fold": "hour_of_week", "step": "300"}, "step", "hourly"),
    ({"encoding": "msgpack"}, "encoding", "json, typed"),
    ({"rows_max": "0"}, "rows_max", "from 1"),
    ({"row_start": "-1"}, "row_start", "from 0"),
    ({"row_count": "many"}, "row_count", "whole number"),
])
def test_bad_parameters_are_400_naming_them(admin_api, world, params, field, words):
    query = {"start": T0.isoformat(), "end": at(3600).isoformat(), **params}

    response = admin_api.get(URL, query)

    assert response.status_code == 400
    body = response.json()
    assert field in body, body
    assert words in " ".join(body[field])


def test_without_a_range_the_last_24_hours_up_to_now(admin_api, world):
    before = datetime.now(UTC)
    response = admin_api.get(URL, {"group": "host"})
    after = datetime.now(UTC)

    assert response.status_code == 200, response.content
    body = response.json()
    end, start = datetime.fromisoformat(body["end"]), datetime.fromisoformat(body["start"])
    assert before.replace(microsecond=0) <= end <= after, "answered to the second"
    assert end - timedelta(hours=24) - timedelta(seconds=body["step"]) < start <= end - timedelta(hours=24)
    assert len(body["x"]) == len(body["z"][0])


def test_an_end_alone_shows_the_24_hours_before_it(admin_api, world):
    gpu_rollups(world.gpu_1, [(360, 40.0, 50.0, 45.0)], step_s=3600)

    body = admin_api.get(URL, {"end": at(3600).isoformat(), "step": 3600}).json()

    assert body["start"] == "2026-03-01T11:00:00Z"
    assert body["end"] == "2026-03-02T11:00:00Z"
    row = body["z"][body["ids"].index(world.gpu_1.pk)]
    assert len(row) == 24
    assert row[-1] == 40.0, "the hour before end has the GPU's reading"


def test_a_host_by_name_shows_the_rows_of_that_host(admin_api, world):
    body = heatmap(admin_api, host=world.host.name)

    assert body["ids"] == [world.gpu_1.pk, world.gpu_2.pk]


def test_columns_cap_suggests_a_step(admin_api, world):
    response = admin_api.get(URL, {"start": T0.isoformat(), "end": (T0 + timedelta(days=30)).isoformat(),
                                   "step": "900"})

    assert response.status_code == 400
    assert "use a step of at least 1800 s" in response.json()["step"][0]


# Queries -----------------------------------------------------------------------------------


def _add_gpus(count: int):
    """`count` GPUs, each on its own host, holding a VM's vGPU, with data for both."""
    start = HostFactory._meta.model.objects.count()
    for i in range(start, start + count):
        gpu = GpuFactory(host=HostFactory(name=f"node-{i:02d}"), gpu_model=gpu_model(L40S))
        gpu_rollups(gpu, [(30, 10.0 + i, 20.0, 19.0)])
        gpu_rollups(gpu, [(360, 10.0 + i, 20.0, 19.0)], step_s=3600)
        vm = VirtualMachineFactory(name=f"ws-{i:02d}")
        services.place_vgpu(vm, gpu, profile("L40S-12Q"))
        vm_rollups(vm, [1024.0 * i], profile_fb_mib=Q12_FB_MIB)


@pytest.mark.parametrize("params", [
    {"group": "gpu"}, {"group": "vm"}, {"group": "host"}, {"group": "host", "fold": "hour_of_week"},
    {"group": "gpu", "sort": "peak"},
])
def test_query_count_is_the_same_with_2_and_12_gpus(admin_api, django_assert_num_queries, params):
    # The rows (and, for VMs, their profile names), then the values: never one query per row.
    queries = 3 if params["group"] == "vm" else 2
    _add_gpus(2)
    with django_assert_num_queries(queries):
        small = heatmap(admin_api, **params)
    _add_gpus(10)
    with django_assert_num_queries(queries):
        large = heatmap(admin_api, **params)

    assert (len(small["y"]), len(large["y"])) == (2, 12)
    assert sum(value is not None for line in large["z"] for value in line) == 12


def test_host_filter_costs_one_query_more(admin_api, world, django_assert_num_queries):
    with django_assert_num_queries(3):
        body = heatmap(admin_api, host=world.host.pk)

    assert body["ids"] == [world.gpu_1.pk, world.gpu_2.pk]


def test_schema_documents_the_heatmap(admin_api, db):
    schema = admin_api.get("/api/schema/", HTTP_ACCEPT="application/vnd.oai.openapi+json").json()

    operation = schema["paths"]["/api/v1/heatmap/"]["get"]
    assert {p["name"]: p.get("required", False) for p in operation["parameters"]} == {
        "group": False, "metric": False, "stat": False, "start": False, "end": False, "step": False,
        "fold": False, "sort": False, "host": False, "encoding": False, "rows_max": False, "row_start": False,
        "row_count": False,
    }
    assert set(operation["responses"]) == {"200", "400"}
    properties = schema["components"]["schemas"]["Heatmap"]["properties"]
    assert {"x", "y", "z", "ids", "rows", "zmin", "zmax", "encoding", "groups", "total_rows"} <= set(properties)
    assert [variant.get("type") for variant in properties["z"]["oneOf"]] == ["array", "object"]


# Typed encoding ----------------------------------------------------------------------------


def typed(client, start=T0, end=None, **params):
    """The typed answer, as the page's fetch gets it (gzip accepted), and its decoded rows."""
    response = client.get(URL, {"start": start.isoformat(), "end": (end or start + timedelta(hours=1)).isoformat(),
                                "encoding": "typed", **params}, HTTP_ACCEPT_ENCODING="gzip, deflate, br")
    assert response.status_code == 200, response.content
    assert response["Content-Encoding"] == "gzip"
    body = json.loads(gzip.decompress(response.content))
    return body, decode(body["z"])


def assert_same_within_step(exact: list[list], body: dict, decoded: list[list]) -> None:
    step = body["z"]["step"]
    assert body["z"]["precision"] == pytest.approx(step / 2)
    assert len(decoded) == len(exact)
    for exact_row, decoded_row in zip(exact, decoded, strict=True):
        assert [v is None for v in decoded_row] == [v is None for v in exact_row], "gaps stay gaps"
        for want, got in zip(exact_row, decoded_row, strict=True):
            if want is not None:
                assert abs(got - want) <= step / 2 + 1e-9, (want, got, step)


@pytest.mark.parametrize("params", [
    {}, {"metric": "fb_used_mib"}, {"metric": "fb_used_pct", "stat": "max"}, {"step": "900"},
    {"group": "host"}, {"group": "host", "fold": "hour_of_week", "end": T0 + timedelta(days=7)},
    {"group": "vm"}, {"sort": "peak"}, {"group": "vm", "metric": "ram_used_mib"},
    {"group": "vm", "metric": "ram_used_pct", "stat": "max"}, {"group": "vm", "metric": "vcpu_util", "step": "900"},
])
def test_typed_heatmap_decodes_to_the_json_values_within_the_quantisation_step(admin_api, world, params):
    gpu_rollups(world.gpu_1, [(30, 0.0, 20.0, 19.0), (30, 33.3, 40.0, 39.0), (30, 99.99, 100.0, 100.0)])
    gpu_rollups(world.gpu_1, [(30, 12.34, 50.0, 45.0)], start=at(1500))  # a gap inside the row
    gpu_rollups(world.gpu_2, [(10, 61.7, 70.0, 65.0)], start=at(900))
    GpuRollup.objects.create(gpu=world.gpu_2, step_s=300, bucket=at(1200), samples=50)  # without the reading
    gpu_rollups(world.gpu_2, [(10, 5.0, 7.0, 6.0)], start=at(1500))
    gpu_rollups(world.gpu_1, [(360, 42.42, 80.0, 70.0)], step_s=3600)
    vm_rollups(world.vm_ana, [6144.0, 12000.0, 24576.0])
    guest_rollups(world.vm_ana, [8000.0, None, 31000.5, 12345.0], vcpu_util=[3.3, 0.0, 95.5, 47.0])
    guest_rollups(world.vm_bob, [2048.0], ram_mib=16384, start=at(600))
    params = {"end": at(3600), **params}

    exact = heatmap(admin_api, **params)
    body, decoded = typed(admin_api, **params)

    assert body["encoding"] == "typed"
    assert body["z"]["dtype"] == "u1"
    assert body["z"]["shape"] == f"{len(exact['y'])}, {len(exact['x'])}"
    assert {k: v for k, v in body.items() if k not in ("z", "encoding")} == \
        {k: v for k, v in exact.items() if k not in ("z", "encoding")}
    assert_same_within_step(exact["z"], body, decoded)
    assert any(v is not None for row in decoded for v in row)


def test_typed_percent_scale_keeps_its_ends_and_a_fifth_of_a_point(admin_api, world):
    gpu_rollups(world.gpu_1, [(30, 0.0, 0.0, 0.0), (30, 100.0, 100.0, 100.0), (30, 50.0, 50.0, 50.0)])

    body, decoded = typed(admin_api)

    assert (body["z"]["offset"], body["z"]["null"]) == (0.0, 255)
    assert body["z"]["precision"] < 0.2
    assert decoded[0][:3] == [0.0, 100.0, pytest.approx(50.0, abs=0.2)]
    assert decoded[2] == [None] * 12


def test_typed_answer_is_plain_json_without_gzip_and_says_it_varies(admin_api, world):
    gpu_rollups(world.gpu_1, [(30, 10.0, 20.0, 19.0)])

    response = admin_api.get(URL, {"start": T0.isoformat(), "end": at(600).isoformat(), "encoding": "typed"})

    assert response.status_code == 200
    assert not response.has_header("Content-Encoding")
    assert "Accept-Encoding" in response["Vary"]
    assert decode(response.json()["z"])[0][0] == pytest.approx(10.0, abs=0.2)


def test_json_answer_is_not_compressed(admin_api, world):
    response = admin_api.get(URL, {"start": T0.isoformat(), "end": at(600).isoformat()},
                             HTTP_ACCEPT_ENCODING="gzip")

    assert not response.has_header("Content-Encoding")
    assert response.json()["encoding"] == "json"


def test_typed_answer_shows_rollups_built_after_it_was_first_served(admin_api, world):
    before, _ = typed(admin_api)
    gpu_rollups(world.gpu_1, [(30, 70.0, 80.0, 75.0)])
    world.gpu_2.host.name = "render-01b"
    world.gpu_2.host.save()

    after, decoded = typed(admin_api)

    assert before["rows"][0]["peak"] is None
    assert after["rows"][0]["peak"] == 70.0
    assert decoded[0][0] == pytest.approx(70.0, abs=0.2)
    assert "render-01b · 00000000:5E:00.0" in after["y"], "a renamed host shows at once"


def test_typed_answers_are_per_scope(artist_api, admin_api, world):
    artist, _ = typed(artist_api, group="vm")
    admin, _ = typed(admin_api, group="vm")

    assert artist["y"] == ["ws-ana"]
    assert len(admin["y"]) > 1


def test_once_rollups_are_built_the_pages_first_heatmap_is_ready_for_every_admin(
        admin_api, admin_user, world, time_machine):
    now = at(1800 + 42)
    time_machine.move_to(now, tick=False)
    gpu_samples(world.gpu_1, at(600), 30, util_gpu=64.0)  # the 10:10 bucket

    build_rollups_task.apply().get()
    query = page_default_query(now)
    with CaptureQueriesContext(connection) as queries:
        body, decoded = typed(admin_api, start=now - timedelta(hours=24), end=query.end, rows_max=200)

    assert not [q for q in queries.captured_queries if "telemetry_gpurollup" in q["sql"]], "served from the cache"
    assert body["end"] == "2026-03-02T10:35:00Z", "the next 5-minute boundary, as the page asks"
    assert decoded[0][body["x"].index("2026-03-02T10:10:00Z")] == pytest.approx(64.0, abs=0.2)


# Groups and windows ------------------------------------------------------------------------


def test_rows_past_rows_max_are_grouped_with_the_hottest_cell_and_a_window_to_drill_into(admin_api, world):
    _add_gpus(5)  # node-00 ... node-04, one GPU each: util 10 + i in the first bucket
    gpu_rollups(world.gpu_1, [(30, 95.0, 99.0, 98.0)], start=at(300))

    full = heatmap(admin_api)
    grouped = heatmap(admin_api, rows_max=3)

    assert full["total_rows"] == grouped["total_rows"] == 8
    assert full["groups"] is None
    assert len(grouped["y"]) == 3
    assert (grouped["ids"], grouped["rows"]) == ([], [])
    assert [(g["row_start"], g["row_count"]) for g in grouped["groups"]] == [(0, 3), (3, 3), (6, 2)]
    assert grouped["y"][0] == f"{full['y'][0]} – {full['y'][2]} (3 GPUs)"
    for group, cells in zip(grouped["groups"], grouped["z"], strict=True):
        members = full["z"][group["row_start"]:group["row_start"] + group["row_count"]]
        hottest = [max((v for v in column if v is not None), default=None) for column in zip(*members, strict=True)]
        assert cells == hottest
        assert group["peak"] == max((r["peak"] for r in full["rows"][group["row_start"]:][:group["row_count"]]
                                     if r["peak"] is not None), default=None)
    assert 95.0 in [v for row in grouped["z"] for v in row], "the hot GPU shows in its group"

    drill = grouped["groups"][1]
    window = heatmap(admin_api, row_start=drill["row_start"], row_count=drill["row_count"])
    assert window["ids"] == full["ids"][3:6]
    assert window["z"] == full["z"][3:6]
    assert (window["row_start"], window["total_rows"], window["groups"]) == (3, 8, None)


def test_rows_sorted_by_host_are_grouped_a_host_a_group_when_the_hosts_fit(admin_api, world):
    _add_gpus(3)  # three hosts of one GPU (node-..); render-01 has two GPUs, render-02 one
    gpu_rollups(world.gpu_2, [(30, 80.0, 90.0, 85.0)])
    gpu_rollups(world.gpu_1, [(30, 20.0, 30.0, 25.0)], start=at(300))

    full = heatmap(admin_api)
    grouped = heatmap(admin_api, rows_max=5)

    assert [label.split(" · ")[0] for label in full["y"]] == ["node-02", "node-03", "node-04", "render-01",
                                                               "render-01", "render-02"]
    assert grouped["y"] == [*full["y"][:3], "render-01 (2 GPUs)", full["y"][5]]
    render_01 = grouped["groups"][3]
    assert (render_01["row_start"], render_01["row_count"], render_01["hosts"]) == (3, 2, 1)
    assert grouped["z"][3][:3] == [80.0, 20.0, None]
    assert heatmap(admin_api, rows_max=4)["y"][0].endswith("(2 GPUs)"), "more hosts than groups: equal sizes"


def test_rows_that_fit_rows_max_are_not_grouped(admin_api, world):
    body = heatmap(admin_api, rows_max=3)

    assert body["groups"] is None
    assert len(body["ids"]) == 3


def test_grouped_typed_heatmap_decodes_to_the_grouped_json(admin_api, world):
    _add_gpus(4)
    gpu_rollups(world.gpu_2, [(30, 55.5, 60.0, 58.0)], start=at(600))

    exact = heatmap(admin_api, rows_max=2, sort="peak")
    body, decoded = typed(admin_api, rows_max=2, sort="peak")

    assert body["groups"] == exact["groups"]
    assert_same_within_step(exact["z"], body, decoded)

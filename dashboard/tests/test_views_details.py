"""Detail pages of a host, GPU, VM and artist: what they show, their time ranges (presets,
custom, `?at=` from a heatmap click, bad input), who may open them, their empty states, and
query counts that do not grow with the rows shown."""

from __future__ import annotations

import html
import re
from datetime import UTC, datetime, timedelta
from types import SimpleNamespace
from urllib.parse import parse_qs, urlsplit

import pytest
from django.db import connection
from django.test import Client
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from fleet import services
from fleet.models import Host
from fleet.tests.factories import ArtistFactory, GpuFactory, HostFactory, VirtualMachineFactory, gpu_model, profile
from telemetry.aggregation import bucket_floor
from telemetry.models import Agent, Drift, GpuSample, GuestRollup, GuestSample, VgpuSample, VmRollup

L40S = "NVIDIA L40S"
L40S_FB_MIB = 49152  # 48 GiB, the catalog's L40S


# Helpers -----------------------------------------------------------------------------------


def charts(page: str) -> list[dict[str, str]]:
    """The data-* attributes of every chart element (the contract with static/js/timeseries.js)."""
    found = []
    for tag in re.findall(r"<div class=\"chart\"[^>]*>", page, re.S):
        attrs = {name: html.unescape(value) for name, value in re.findall(r"(data-[\w-]+)=\"([^\"]*)\"", tag)}
        if "data-series-url" in attrs:
            found.append(attrs)
    return found


def query_of(url: str) -> dict[str, str]:
    return {key: values[0] for key, values in parse_qs(urlsplit(url).query).items()}


def iso_time(text: str) -> datetime:
    return datetime.fromisoformat(text.replace("Z", "+00:00"))


def page(client, url: str, status: int = 200) -> str:
    response = client.get(url)
    assert response.status_code == status, response.content[:2000]
    return response.content.decode()


def rollup(vm, step_s: int, bucket: datetime, *, fb: tuple, util: tuple, samples: int = 30,
           profile_fb_mib: float = 12288.0) -> VmRollup:
    """A VM rollup: `fb` and `util` are (avg, max, p95)."""
    return VmRollup.objects.create(
        vm=vm, step_s=step_s, bucket=bucket, samples=samples, profile_fb_mib=profile_fb_mib,
        fb_used_mib_avg=fb[0], fb_used_mib_max=fb[1], fb_used_mib_p95=fb[2],
        util_gpu_avg=util[0], util_gpu_max=util[1], util_gpu_p95=util[2],
    )


def usage_history(vm, now: datetime) -> None:
    """Two 5-minute and two hourly buckets in the last day: peak 9318.4 MiB of a 12 GiB
    profile (76%), p95 9000 MiB (73%), utilization 20% over 30 samples and 60% over 10
    (sample-weighted mean 30%, highest 80%)."""
    for step in (300, 3600):
        rollup(vm, step, bucket_floor(now - timedelta(hours=3), step), fb=(6000.0, 9318.4, 9000.0),
               util=(20.0, 60.0, 50.0), samples=30)
        rollup(vm, step, bucket_floor(now - timedelta(hours=1, minutes=30), step), fb=(4000.0, 5000.0, 4800.0),
               util=(60.0, 80.0, 75.0), samples=10)


def ok_agent(host, name: str) -> Agent:
    return Agent.objects.create(name=name, url=f"http://{host.name}:9410", host=host, last_seen=timezone.now())


@pytest.fixture
def world(artist):
    """render-01 with two L40S GPUs: Ana's ws-ana (L40S-12Q) and Bob's ws-bob (L40S-12Q) share
    gpu_1, Cleo's ws-cleo is on gpu_2. Agent agent-r01 serves render-01 and is up. Ana's VM has a
    day of rollups; gpu_1 and both its vGPUs have a newest sample."""
    now = timezone.now()
    host = HostFactory(name="render-01", cpu_threads=64, ram_gib=512, vcpu_overcommit=2.0, ram_overcommit=1.0)
    gpu_1 = GpuFactory(host=host, gpu_model=gpu_model(L40S), pci_bus_id="00000000:3B:00.0", uuid="GPU-aaaa-0001")
    gpu_2 = GpuFactory(host=host, gpu_model=gpu_model(L40S), pci_bus_id="00000000:5E:00.0", uuid="GPU-aaaa-0002")
    bob = ArtistFactory(name="Bob Builder", workflow="lighting")
    cleo = ArtistFactory(name="Cleo Comp", workflow="compositing")
    q12 = profile("L40S-12Q")
    vm_ana = VirtualMachineFactory(name="ws-ana", artist=artist, vcpus=16, ram_gib=64)
    vm_bob = VirtualMachineFactory(name="ws-bob", artist=bob)
    vm_cleo = VirtualMachineFactory(name="ws-cleo", artist=cleo)
    services.place_vgpu(vm_ana, gpu_1, q12)
    services.place_vgpu(vm_bob, gpu_1, q12)
    services.place_vgpu(vm_cleo, gpu_2, q12)
    agent = ok_agent(host, "agent-r01")
    usage_history(vm_ana, now)
    GpuSample.objects.create(gpu=gpu_1, ts=now - timedelta(seconds=20), util_gpu=42.0, temp_c=61.0,
                             fb_used_mib=15000.0, fb_total_mib=L40S_FB_MIB, power_w=180.0)
    VgpuSample.objects.create(vm=vm_ana, gpu=gpu_1, ts=now - timedelta(seconds=20), fb_used_mib=7000.0, util_gpu=17.0)
    VgpuSample.objects.create(vm=vm_bob, gpu=gpu_1, ts=now - timedelta(seconds=20), fb_used_mib=3000.0, util_gpu=9.0)
    return SimpleNamespace(host=host, gpu_1=gpu_1, gpu_2=gpu_2, ana=artist, bob=bob, cleo=cleo, vm_ana=vm_ana,
                           vm_bob=vm_bob, vm_cleo=vm_cleo, agent=agent, q12=q12)


@pytest.fixture
def staff_client(client, admin_user):
    client.force_login(admin_user)
    return client


@pytest.fixture
def artist_client(client, artist):
    client.force_login(artist.user)
    return client


# Host --------------------------------------------------------------------------------------


def test_host_page_shows_capacity_gpus_vms_agents_and_a_line_per_gpu(staff_client, world):
    Drift.objects.create(agent=world.agent, kind="unknown_vm", subject="vm-x", detail="unknown VM")

    body = page(staff_client, f"/hosts/{world.host.pk}/")

    assert '<a href="/hosts/">Hosts</a> / render-01' in body
    assert "Linux KVM" in body
    # 16 + 8 + 8 vCPUs claimed of 64 threads x 2.0; 64 + 32 + 32 GiB of 512 GiB x 1.0.
    assert re.search(r'data-fact="vcpus">32 of 128\s', body)
    assert re.search(r'data-fact="ram">128 of 512 GiB', body)
    gpu_rows = re.findall(r'<tr data-gpu="(\d+)">(.*?)</tr>', body, re.S)
    assert [int(pk) for pk, _ in gpu_rows] == [world.gpu_1.pk, world.gpu_2.pk]
    first = gpu_rows[0][1]
    assert "00000000:3B:00.0" in first
    assert L40S in first
    assert f"24576 / {L40S_FB_MIB} MiB" in first  # two 12Q allocated
    assert "42%" in first
    assert "61 °C" in first
    assert "no reading" in gpu_rows[1][1]
    for vm, artist_name in ((world.vm_ana, "Ana Artist"), (world.vm_bob, "Bob Builder"), (world.vm_cleo, "Cleo Comp")):
        assert f'<a href="/vms/{vm.pk}/">{vm.name}</a>' in body
        assert artist_name in body
    agent_row = re.search(r'<tr data-agent="\d+">(.*?)</tr>', body, re.S).group(1)
    assert "agent-r01" in agent_row
    assert '<span class="badge ok">OK</span>' in agent_row
    assert re.search(r'<td class="num">1</td>', agent_row)  # one open drift

    (chart,) = charts(body)
    urls = chart["data-series-url"].split()
    assert [urlsplit(u).path for u in urls] == [f"/api/v1/gpus/{world.gpu_1.pk}/metrics/",
                                                f"/api/v1/gpus/{world.gpu_2.pk}/metrics/"]
    assert chart["data-series-labels"] == '["00000000:3B:00.0", "00000000:5E:00.0"]'
    assert query_of(urls[0])["metric"] == "util_gpu"


def test_host_page_without_agent_says_to_add_one(staff_client):
    host = HostFactory(name="lonely-01")
    GpuFactory(host=host)

    body = page(staff_client, f"/hosts/{host.pk}/")

    assert "No agent serves this host" in body
    (chart,) = charts(body)
    assert chart["data-empty-hint"] == "No agent serves lonely-01: add one so its GPUs report."
    assert chart["data-empty-link"] == "/agents/"


def test_stale_agent_is_named_with_when_it_was_last_seen(staff_client, world):
    world.agent.last_seen = datetime(2026, 3, 2, 9, 30, tzinfo=UTC)
    world.agent.save()

    body = page(staff_client, f"/hosts/{world.host.pk}/")

    assert "Agent agent-r01 is stale: last seen 2026-03-02 09:30 UTC" in body
    assert '<span class="badge stale">Stale</span>' in body
    hint = charts(body)[0]["data-empty-hint"]
    assert "agent-r01 (Stale, last seen 2026-03-02 09:30 UTC)" in hint


# GPU ---------------------------------------------------------------------------------------


def test_gpu_page_shows_facts_resident_vgpus_split_and_series(staff_client, world):
    body = page(staff_client, f"/gpus/{world.gpu_1.pk}/")

    assert f'<a href="/hosts/{world.host.pk}/">render-01</a> / 00000000:3B:00.0' in body
    for fact in ("GPU-aaaa-0001", "00000000:3B:00.0", "vGPU (shared)", "Equal-size", L40S):
        assert fact in body
    assert re.search(rf'data-fact="fb">24576 of {L40S_FB_MIB} MiB \(50%\) to 2 vGPUs', body)
    rows = dict(re.findall(r'<tr data-vgpu="\d+">\s*<td><a href="/vms/\d+/">([\w-]+)</a></td>(.*?)</tr>', body, re.S))
    assert set(rows) == {"ws-ana", "ws-bob"}
    assert "Ana Artist" in rows["ws-ana"]
    assert "L40S-12Q" in rows["ws-ana"]
    assert "12288 MiB" in rows["ws-ana"]
    assert "25.0%" in rows["ws-ana"]
    assert "7000 MiB" in rows["ws-ana"]
    assert "(57% of profile)" in rows["ws-ana"]
    assert "17%" in rows["ws-ana"]
    assert "3000 MiB" in rows["ws-bob"]
    assert "9%" in rows["ws-bob"]
    assert "ws-cleo" not in body  # on the other GPU
    assert '"segments": [{"name": "ws-ana \\u00b7 L40S-12Q", "mib": 12288}' in body
    assert f'"free_mib": {L40S_FB_MIB - 24576}' in body

    found = charts(body)
    assert [c["data-lines"] for c in found][:2] == [
        '[{"metric": "util_gpu", "stat": "avg", "name": "Average"}, '
        '{"metric": "util_gpu", "stat": "p95", "name": "p95"}]',
        '[{"metric": "fb_used_mib", "stat": "avg", "name": "Average"}, {"metric": "fb_used_mib", "stat": "max", '
        '"name": "Peak"}]',
    ]
    assert {c["data-unit"] for c in found} == {"%", "GiB", "°C", "W"}
    fb_chart = found[1]
    assert fb_chart["data-limit"] == f"{L40S_FB_MIB / 1024:.3f}"
    assert fb_chart["data-scale"] == "1024"
    url = found[0]["data-series-url"]
    assert urlsplit(url).path == f"/api/v1/gpus/{world.gpu_1.pk}/metrics/"
    assert query_of(url)["metric"] == "util_gpu,fb_used_mib,temp_c,power_w,enc_util,dec_util"


def test_passthrough_gpu_says_it_has_no_vgpus(staff_client, world):
    gpu = GpuFactory(host=world.host, mode="passthrough")

    body = page(staff_client, f"/gpus/{gpu.pk}/")

    assert "Passthrough GPU" in body
    assert "given whole to one VM" in body
    assert "Resident vGPUs" not in body
    assert len(charts(body)) == 5


# VM ----------------------------------------------------------------------------------------


def test_vm_page_shows_vgpus_usage_summary_and_charts_against_the_profile(staff_client, world):
    body = page(staff_client, f"/vms/{world.vm_ana.pk}/")

    assert '<a href="/vms/">VMs</a> / ws-ana' in body
    assert str(world.vm_ana.uuid) in body
    assert f'<a href="/artists/{world.ana.pk}/">Ana Artist</a>' in body
    assert f'<a href="/hosts/{world.host.pk}/">render-01</a>' in body
    assert 'data-fact="vcpus">16<' in body
    assert 'data-fact="ram">64 GiB<' in body
    assert f'<a href="/gpus/{world.gpu_1.pk}/">00000000:3B:00.0</a>' in body
    assert "L40S-12Q" in body
    assert "12288 MiB (12 GiB)" in body
    assert 'data-figure="peak-fb-pct">76%<' in body
    assert 'data-figure="mean-util">30%<' in body
    assert "Peak frame buffer use was 9.1 of 12 GiB (76%)." in body
    assert "On average the vGPU kept its GPU 30% busy (highest 80%)." in body

    fb_chart, util_chart, cpu_chart, ram_chart = charts(body)
    assert urlsplit(fb_chart["data-series-url"]).path == f"/api/v1/vms/{world.vm_ana.pk}/metrics/"
    # The guest's CPU and memory, read through the hypervisor, beside the GPU's.
    assert parse_qs(urlsplit(cpu_chart["data-series-url"]).query)["metric"] == ["vcpu_util,vcpu_max_util,ram_used_mib"]
    assert '"metric": "vcpu_max_util"' in cpu_chart["data-lines"]
    assert ram_chart["data-limit-label"] == f"RAM: {world.vm_ana.ram_gib} GiB"
    assert fb_chart["data-limit"] == "12.000"
    assert fb_chart["data-limit-label"] == "Profile: 12 GiB (L40S-12Q)"
    assert '"stat": "p95"' in fb_chart["data-lines"]
    assert '"stat": "max"' in fb_chart["data-lines"]
    assert util_chart["data-ymax"] == "100"


def test_vm_without_vgpu_and_without_data_says_so(staff_client):
    vm = VirtualMachineFactory(name="ws-bare")

    body = page(staff_client, f"/vms/{vm.pk}/")

    assert "This VM has no vGPU" in body
    assert "No usage was recorded between" in body
    fb_chart = charts(body)[0]
    assert "data-limit" not in fb_chart
    assert fb_chart["data-empty-hint"] == "This VM is not placed on a host, so nothing reports its vGPUs."


# A VM's guest (CPU and memory through the hypervisor link) ---------------------------------


def guest_rollup(vm, bucket: datetime, *, cpu: tuple, busiest: tuple, ram: tuple | None) -> GuestRollup:
    """An hourly guest rollup; `cpu`, `busiest` and `ram` (MiB) are (p95, max); `ram` None: not reported."""
    ram_p95, ram_max = ram or (None, None)
    return GuestRollup.objects.create(
        vm=vm, step_s=3600, bucket=bucket, samples=60, vcpus=16, ram_mib=65536,
        vcpu_util_avg=cpu[0] / 2, vcpu_util_p95=cpu[0], vcpu_util_max=cpu[1],
        vcpu_max_util_avg=busiest[0] / 2, vcpu_max_util_p95=busiest[0], vcpu_max_util_max=busiest[1],
        cpu_steal_pct_avg=0.5, cpu_steal_pct_max=2.0,
        ram_used_mib_avg=None if ram is None else ram_p95 / 2, ram_used_mib_p95=ram_p95, ram_used_mib_max=ram_max,
    )


def guest_figures(body: str) -> dict[str, str]:
    """The guest card's figures by their data-guest name, as text."""
    card = body[body.index('data-section="guest"'):]
    card = card[:card.index("</section>")]
    return {name: " ".join(re.sub(r"<[^>]+>", "", text).split())
            for name, text in re.findall(r'data-guest="([\w-]+)"[^>]*>(.*?)</(?:div|p)>', card, re.S)}


def guest_table(body: str) -> dict[str, list[str]]:
    """The guest card's table: {figure key: [cell per window]}."""
    rows = re.findall(r'<tr data-guest-row="(\w+)">(.*?)</tr>', body, re.S)
    return {key: [c.strip() for c in re.findall(r"<td[^>]*>(.*?)</td>", cells, re.S)] for key, cells in rows}


def test_vm_page_shows_its_guests_newest_reading_and_its_day_and_week(staff_client, world):
    """ws-ana: 16 vCPUs, 64 GiB. An animation-like guest: one vCPU near saturated, a low average."""
    now = timezone.now()
    GuestSample.objects.create(vm=world.vm_ana, ts=now - timedelta(minutes=5), vcpus=16, ram_mib=65536,
                               vcpu_util=40.0, vcpu_max_util=40.0, cpu_steal_pct=0.1, ram_used_mib=1024)
    GuestSample.objects.create(vm=world.vm_ana, ts=now - timedelta(seconds=20), vcpus=16, ram_mib=65536,
                               vcpu_util=8.4, vcpu_max_util=96.2, cpu_steal_pct=1.25, ram_used_mib=12288)
    guest_rollup(world.vm_ana, bucket_floor(now - timedelta(hours=3), 3600), cpu=(9.0, 14.0), busiest=(95.0, 99.0),
                 ram=(12000.0, 14336.0))
    guest_rollup(world.vm_ana, bucket_floor(now - timedelta(days=3), 3600), cpu=(30.0, 55.0), busiest=(97.0, 100.0),
                 ram=(30720.0, 40960.0))
    guest_rollup(world.vm_ana, bucket_floor(now - timedelta(days=9), 3600), cpu=(90.0, 100.0),
                 busiest=(100.0, 100.0), ram=(60000.0, 65536.0))  # older than a week: not counted

    body = page(staff_client, f"/vms/{world.vm_ana.pk}/")

    assert "CPU and memory (from the hypervisor)" in body
    figures = guest_figures(body)
    assert figures["vcpu-util"] == "8%"
    assert figures["vcpu-max-util"] == "96%"
    assert figures["steal"] == "steal 1.3%"
    assert figures["ram-used-pct"] == "19%"
    assert figures["ram-used"] == "12.0 of 64 GiB"
    assert "stale" not in figures["read-at"]
    assert guest_table(body) == {
        "vcpu_util": ["9% / 14%", "30% / 55%"],
        "vcpu_max_util": ["95% / 99%", "97% / 100%"],
        "ram_used_mib": ["11.7 / 14.0 GiB", "30.0 / 40.0 GiB"],
    }


def test_a_guest_without_the_balloon_driver_shows_memory_not_reported(staff_client, world):
    now = timezone.now()
    GuestSample.objects.create(vm=world.vm_ana, ts=now - timedelta(seconds=20), vcpus=16, ram_mib=65536,
                               vcpu_util=20.0, vcpu_max_util=50.0, cpu_steal_pct=None, ram_used_mib=None)
    guest_rollup(world.vm_ana, bucket_floor(now - timedelta(hours=2), 3600), cpu=(20.0, 30.0), busiest=(50.0, 60.0),
                 ram=None)

    body = page(staff_client, f"/vms/{world.vm_ana.pk}/")

    figures = guest_figures(body)
    assert figures["vcpu-util"] == "20%"
    assert figures["ram-used-pct"] == "not reported"
    assert figures["ram-used"] == "of 64 GiB: the guest has no balloon driver"
    assert figures["steal"] == "steal not reported"
    assert guest_table(body)["ram_used_mib"] == ["not reported", "not reported"]
    assert "0.0 of 64 GiB" not in body


def test_a_stale_guest_reading_says_so(staff_client, world):
    GuestSample.objects.create(vm=world.vm_ana, ts=timezone.now() - timedelta(hours=2), vcpus=16, ram_mib=65536,
                               vcpu_util=5.0, vcpu_max_util=9.0, cpu_steal_pct=0.2, ram_used_mib=4096)

    figures = guest_figures(page(staff_client, f"/vms/{world.vm_ana.pk}/"))

    assert "stale" in figures["read-at"]
    assert figures["vcpu-util"] == "5%"


def test_a_vm_without_guest_readings_says_why(staff_client, world):
    body = page(staff_client, f"/vms/{world.vm_ana.pk}/")
    assert guest_figures(body)["none"] == "No reading yet: the host is not linked to a hypervisor."
    assert 'data-table="guest"' not in body

    Host.objects.filter(pk=world.host.pk).update(hypervisor_uri="sim://render-01")
    body = page(staff_client, f"/vms/{world.vm_ana.pk}/")
    assert guest_figures(body)["none"] == "No reading yet."


# Artist ------------------------------------------------------------------------------------


def test_artist_page_shows_facts_and_week_usage_per_vm(staff_client, world):
    second = VirtualMachineFactory(name="ws-ana-2", artist=world.ana)
    services.place_vgpu(second, world.gpu_2, world.q12)

    body = page(staff_client, f"/artists/{world.ana.pk}/")

    assert '<a href="/artists/">Artists</a> / Ana Artist' in body
    assert 'data-fact="user">ana<' in body
    assert 'data-fact="workflow">Modeling<' in body
    assert 'data-fact="user-type">Medium<' in body
    assert '<a data-range="7d"' not in body  # the links carry href first
    assert re.search(r'href="\?range=7d" data-range="7d" aria-current="true"', body)
    rows = dict(re.findall(r'<tr data-vm="\d+">\s*<td><a href="/vms/\d+/">([\w-]+)</a></td>(.*?)</tr>', body, re.S))
    assert set(rows) == {"ws-ana", "ws-ana-2"}
    assert 'data-figure="p95-fb-pct">73% of profile<' in rows["ws-ana"]  # 9000 of 12288 MiB
    assert 'data-figure="peak-fb">9318 MiB<' in rows["ws-ana"]
    assert 'data-figure="mean-util">30%<' in rows["ws-ana"]
    assert 'data-figure="mean-util">—<' in rows["ws-ana-2"]  # no rollups
    assert "Bob Builder" not in body


# Time ranges -------------------------------------------------------------------------------


def pages_of(world) -> list[str]:
    return [f"/hosts/{world.host.pk}/", f"/gpus/{world.gpu_1.pk}/", f"/vms/{world.vm_ana.pk}/"]


@pytest.mark.parametrize(("preset", "span", "step"), [
    ("6h", timedelta(hours=6), "300"), ("24h", timedelta(hours=24), "300"),
    ("7d", timedelta(days=7), "900"), ("30d", timedelta(days=30), "3600"),
])
def test_presets_set_the_series_range_and_mark_the_choice(staff_client, world, preset, span, step):
    for url in pages_of(world):
        before = timezone.now()
        body = page(staff_client, f"{url}?range={preset}")
        after = timezone.now()

        assert re.search(rf'href="\?range={preset}" data-range="{preset}" aria-current="true"', body)
        for chart in charts(body):
            end = iso_time(chart["data-end"])
            assert before - timedelta(seconds=1) <= end <= after
            assert end - iso_time(chart["data-start"]) == span
            for series_url in chart["data-series-url"].split():
                query = query_of(series_url)
                assert (query["start"], query["end"], query["step"]) == (chart["data-start"], chart["data-end"], step)
            assert "data-at" not in chart


def test_default_range_is_24_hours(staff_client, world):
    body = page(staff_client, f"/vms/{world.vm_ana.pk}/")

    assert re.search(r'data-range="24h" aria-current="true"', body)
    chart = charts(body)[0]
    assert iso_time(chart["data-end"]) - iso_time(chart["data-start"]) == timedelta(hours=24)


def test_heatmap_click_marks_the_moment_six_hours_either_side(staff_client, world):
    for url in pages_of(world):
        body = page(staff_client, f"{url}?at=2026-03-02T10:00:00Z")

        assert "around 2026-03-02 10:00 UTC" in body
        for chart in charts(body):
            assert (chart["data-start"], chart["data-end"], chart["data-at"]) == (
                "2026-03-02T04:00:00Z", "2026-03-02T16:00:00Z", "2026-03-02T10:00:00Z")
            assert query_of(chart["data-series-url"].split()[0])["start"] == "2026-03-02T04:00:00Z"


def test_custom_range_is_used_as_given(staff_client, world):
    body = page(staff_client, f"/gpus/{world.gpu_1.pk}/?start=2026-03-01T00:00&end=2026-03-03T00:00")

    assert re.search(r'<summary data-range="custom" aria-current="true">', body)
    assert 'value="2026-03-01T00:00"' in body
    assert 'value="2026-03-03T00:00"' in body
    chart = charts(body)[0]
    assert (chart["data-start"], chart["data-end"]) == ("2026-03-01T00:00:00Z", "2026-03-03T00:00:00Z")
    assert query_of(chart["data-series-url"])["step"] == "300"


def test_usage_summary_follows_the_range(staff_client, world):
    old = datetime(2026, 3, 2, 10, 0, tzinfo=UTC)
    rollup(world.vm_ana, 300, old, fb=(1000.0, 12288.0, 12000.0), util=(90.0, 100.0, 99.0))

    body = page(staff_client, f"/vms/{world.vm_ana.pk}/?at=2026-03-02T10:00:00Z")

    assert "Peak frame buffer use was 12 of 12 GiB (100%)." in body
    assert "close to the profile&#x27;s limit" in body
    assert "kept its GPU 90% busy" in body


@pytest.mark.parametrize(("query", "message"), [
    ("range=1y", "Unknown range &#x27;1y&#x27;: use 6h, 24h, 7d, 30d or a custom start and end."),
    ("start=2026-03-03T00:00&end=2026-03-01T00:00", "The end of the range must be after its start."),
    ("start=2026-03-03T00:00", "A custom range needs both a start and an end."),
    ("at=yesterday", "at &#x27;yesterday&#x27; is not a time: use ISO 8601"),
])
def test_a_bad_range_is_a_400_page_with_the_message(staff_client, world, query, message):
    for url in [*pages_of(world), f"/artists/{world.ana.pk}/"]:
        body = page(staff_client, f"{url}?{query}", status=400)

        assert message in body
        assert "Showing the default range instead." in body
        # A refused custom range reopens its form to be fixed.
        assert ("<details class=\"custom-range\" open>" in body) == ("start=" in query)
    body = page(staff_client, f"/vms/{world.vm_ana.pk}/?start=2026-03-03T00:00&end=2026-03-01T00:00", status=400)
    assert 'value="2026-03-03T00:00"' in body
    assert 'value="2026-03-01T00:00"' in body


# Who may see what --------------------------------------------------------------------------


def test_artist_sees_their_own_vm_without_fleet_links(artist_client, world):
    GuestSample.objects.create(vm=world.vm_ana, ts=timezone.now() - timedelta(seconds=20), vcpus=16, ram_mib=65536,
                               vcpu_util=8.0, vcpu_max_util=90.0, cpu_steal_pct=0.5, ram_used_mib=8192)
    GuestSample.objects.create(vm=world.vm_bob, ts=timezone.now() - timedelta(seconds=20), vcpus=8, ram_mib=32768,
                               vcpu_util=77.0, vcpu_max_util=99.0, cpu_steal_pct=0.5, ram_used_mib=30000)
    body = page(artist_client, f"/vms/{world.vm_ana.pk}/")

    assert guest_figures(body)["vcpu-util"] == "8%"  # her guest's CPU and memory
    assert "77%" not in body

    assert '<a href="/me/">My workstation</a> / ws-ana' in body
    assert 'data-fact="host">render-01<' in body
    assert "/hosts/" not in body
    assert "/gpus/" not in body.replace("/api/v1/gpus/", "")
    assert "agent-r01" not in charts(body)[0]["data-empty-hint"]
    assert "Bob Builder" not in body
    assert "ws-bob" not in body


def test_artist_pages_chart_their_vgpu_and_show_nothing_of_the_gpu_they_share(artist_client, admin_user, world):
    """gpu_1 carries ws-ana and Bob's ws-bob: its readings (42% busy, 15000 MiB, 61 °C, 180 W) are
    both VMs' usage together. Ana's pages chart her VM's own series and show none of them; the
    admin's GPU page still does."""
    shared_figures = ("42% busy", "15000 MiB", "61 °C", "180 W", "3000 MiB")
    staff_client = Client()  # the `client` fixture is Ana's here
    staff_client.force_login(admin_user)
    gpu_page = page(staff_client, f"/gpus/{world.gpu_1.pk}/")
    assert all(figure in gpu_page for figure in shared_figures)
    assert urlsplit(charts(gpu_page)[0]["data-series-url"]).path == f"/api/v1/gpus/{world.gpu_1.pk}/metrics/"

    own_series = f"/api/v1/vms/{world.vm_ana.pk}/metrics/"
    for url in (f"/vms/{world.vm_ana.pk}/", f"/artists/{world.ana.pk}/", "/me/"):
        body = page(artist_client, url)
        for figure in shared_figures:
            assert figure not in body, f"{url} shows {figure!r} of the shared GPU"
        assert "/api/v1/gpus/" not in body
        for chart in charts(body):
            assert urlsplit(chart["data-series-url"]).path == own_series
            series = artist_client.get(chart["data-series-url"])
            assert series.status_code == 200
            if "fb_used_mib" in series.json()["series"]:
                assert any(v is not None for v in series.json()["series"]["fb_used_mib"]["max"])
    assert charts(page(artist_client, f"/vms/{world.vm_ana.pk}/")), "her VM page charts her vGPU"
    # The series behind the admin's charts stays closed to her.
    assert artist_client.get(charts(gpu_page)[0]["data-series-url"]).status_code == 403


def test_artist_sees_their_own_artist_page(artist_client, world):
    body = page(artist_client, f"/artists/{world.ana.pk}/")

    assert "ws-ana" in body
    assert "/hosts/" not in body


def test_artist_gets_404_for_anothers_vm_and_artist(artist_client, world):
    page(artist_client, f"/vms/{world.vm_bob.pk}/", status=404)
    page(artist_client, f"/artists/{world.bob.pk}/", status=404)


def test_artist_gets_403_for_host_and_gpu_pages_even_their_own(artist_client, world):
    body = page(artist_client, f"/hosts/{world.host.pk}/", status=403)
    assert "Go to my workstation" in body
    page(artist_client, f"/gpus/{world.gpu_1.pk}/", status=403)


def test_anonymous_visitors_are_sent_to_login(client, world):
    for url in [*pages_of(world), f"/artists/{world.ana.pk}/"]:
        response = client.get(url)

        assert response.status_code == 302
        assert response["Location"] == f"/login/?next={url}"


def test_unknown_objects_are_404(staff_client, world):
    for url in ("/hosts/999999/", "/gpus/999999/", "/vms/999999/", "/artists/999999/"):
        page(staff_client, url, status=404)


# Query counts ------------------------------------------------------------------------------


def count_queries(client, url: str) -> int:
    with CaptureQueriesContext(connection) as queries:
        response = client.get(url)
    assert response.status_code == 200
    return len(queries)


def crowded_host(n: int, label: str) -> SimpleNamespace:
    """A host with `n` L40S GPUs, each with one VM (of its own artist) on an L40S-12Q, a sample
    per GPU and vGPU, rollups per VM, and `n` agents."""
    now = timezone.now()
    host = HostFactory(name=f"{label}-host", cpu_threads=256, ram_gib=2048)
    q12 = profile("L40S-12Q")
    gpus, vms = [], []
    for i in range(n):
        gpu = GpuFactory(host=host, gpu_model=gpu_model(L40S), pci_bus_id=f"00000000:{i + 1:02X}:00.0",
                         uuid=f"GPU-{label}-{i}")
        vm = VirtualMachineFactory(name=f"{label}-vm-{i}", artist=ArtistFactory(name=f"{label} artist {i}"))
        services.place_vgpu(vm, gpu, q12)
        GpuSample.objects.create(gpu=gpu, ts=now, util_gpu=10.0 + i)
        VgpuSample.objects.create(vm=vm, gpu=gpu, ts=now, fb_used_mib=100.0 * i, util_gpu=1.0)
        usage_history(vm, now)
        Agent.objects.create(name=f"{label}-agent-{i}", url=f"http://{label}:{9400 + i}", host=host,
                             last_seen=now - timedelta(hours=i))
        gpus.append(gpu)
        vms.append(vm)
    return SimpleNamespace(host=host, gpus=gpus, vms=vms)


def crowded_gpu(n: int, label: str):
    """One L40S GPU holding `n` L40S-4Q vGPUs of `n` artists, each with a sample."""
    now = timezone.now()
    host = HostFactory(name=f"{label}-host", cpu_threads=256, ram_gib=2048)
    gpu = GpuFactory(host=host, gpu_model=gpu_model(L40S), uuid=f"GPU-{label}")
    q4 = profile("L40S-4Q")
    for i in range(n):
        vm = VirtualMachineFactory(name=f"{label}-vm-{i}", artist=ArtistFactory(name=f"{label} artist {i}"))
        services.place_vgpu(vm, gpu, q4)
        VgpuSample.objects.create(vm=vm, gpu=gpu, ts=now, fb_used_mib=100.0 * i, util_gpu=1.0)
    return gpu


def multi_vgpu_vm(n: int, label: str):
    """A VM with `n` L40S-48Q vGPUs (a whole GPU each) on one host."""
    host = HostFactory(name=f"{label}-host")
    vm = VirtualMachineFactory(name=f"{label}-vm")
    for i in range(n):
        gpu = GpuFactory(host=host, gpu_model=gpu_model(L40S), uuid=f"GPU-{label}-{i}")
        services.place_vgpu(vm, gpu, profile("L40S-48Q"))
    usage_history(vm, timezone.now())
    return vm


def test_host_page_query_count_does_not_grow_with_gpus_vms_and_agents(staff_client, django_assert_num_queries):
    small, big = crowded_host(2, "small"), crowded_host(12, "big")

    assert count_queries(staff_client, f"/hosts/{small.host.pk}/") == count_queries(staff_client,
                                                                                    f"/hosts/{big.host.pk}/")
    # session, user, host, GPUs, their samples, VMs, vGPUs, agents, history, badges, hypervisor status and diff,
    # driver versions
    with django_assert_num_queries(13):
        body = page(staff_client, f"/hosts/{big.host.pk}/")
    assert len(re.findall(r"<tr data-gpu=", body)) == 12
    assert len(re.findall(r"<tr data-vm=", body)) == 12
    assert len(re.findall(r"<tr data-agent=", body)) == 12


def test_gpu_page_query_count_does_not_grow_with_vgpus(staff_client, django_assert_num_queries):
    small, big = crowded_gpu(2, "small"), crowded_gpu(12, "big")

    assert count_queries(staff_client, f"/gpus/{small.pk}/") == count_queries(staff_client, f"/gpus/{big.pk}/")
    with django_assert_num_queries(12):  # session, user, GPU, its sample, vGPUs, vGPU samples, agents, history,
        # badges, health state, XIDs, open alerts
        body = page(staff_client, f"/gpus/{big.pk}/")
    assert len(re.findall(r"<tr data-vgpu=", body)) == 12


def test_vm_page_query_count_does_not_grow_with_vgpus(staff_client, django_assert_num_queries):
    # A VM holds at most four vGPUs (fleet.placement.MAX_VGPUS_PER_VM).
    small, big = multi_vgpu_vm(1, "small"), multi_vgpu_vm(4, "big")

    assert count_queries(staff_client, f"/vms/{small.pk}/") == count_queries(staff_client, f"/vms/{big.pk}/")
    # session, user, VM, vGPUs, usage, guest's newest reading, guest's rollups, agents, operation, history, badges
    with django_assert_num_queries(11):
        body = page(staff_client, f"/vms/{big.pk}/")
    assert len(re.findall(r"<tr data-vgpu=", body)) == 4


def test_artist_page_query_count_does_not_grow_with_vms(staff_client, django_assert_num_queries):
    small_artist, big_artist = ArtistFactory(name="Small"), ArtistFactory(name="Big")
    for artist, n in ((small_artist, 2), (big_artist, 12)):
        for vm in crowded_host(n, artist.name.lower()).vms:
            vm.artist = artist
            vm.save()

    assert (count_queries(staff_client, f"/artists/{small_artist.pk}/")
            == count_queries(staff_client, f"/artists/{big_artist.pk}/"))
    with django_assert_num_queries(7):  # session, user, artist, VMs, vGPUs, usage, badges
        body = page(staff_client, f"/artists/{big_artist.pk}/")
    assert len(re.findall(r"<tr data-vm=", body)) == 12
    assert len(re.findall(r'data-figure="mean-util">30%<', body)) == 12

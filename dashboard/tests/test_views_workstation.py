"""/me/: an artist's own VMs, their usage against the profile over the last weeks, and nothing
of anyone else's, even of artists sharing their GPU and host."""

from __future__ import annotations

import html
import re
from datetime import UTC, datetime, timedelta
from types import SimpleNamespace
from urllib.parse import parse_qs, urlsplit

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from fleet import services
from fleet.tests.factories import (
    ArtistFactory,
    GpuFactory,
    HostFactory,
    UserFactory,
    VirtualMachineFactory,
    gpu_model,
    profile,
)
from telemetry.aggregation import bucket_floor
from telemetry.models import Agent, VmRollup

L40S = "NVIDIA L40S"


def charts(body: str) -> list[dict[str, str]]:
    found = []
    for tag in re.findall(r"<div class=\"chart\"[^>]*>", body, re.S):
        found.append({name: html.unescape(value) for name, value in re.findall(r"(data-[\w-]+)=\"([^\"]*)\"", tag)})
    return found


def iso_time(text: str) -> datetime:
    return datetime.fromisoformat(text.replace("Z", "+00:00"))


def me(client, status: int = 200, query: str = "") -> str:
    response = client.get(f"/me/{query}")
    assert response.status_code == status, response.content[:2000]
    return response.content.decode()


def week_of_use(vm, now: datetime) -> None:
    """Hourly and 5-minute rollups ten days ago and yesterday: peak 9318.4 MiB of 12 GiB (76%),
    utilization 20% over 30 samples and 60% over 10 (mean 30%, highest 80%)."""
    for step in (300, 3600):
        for when, fb_max, util in ((now - timedelta(days=10), 9318.4, (20.0, 60.0)),
                                   (now - timedelta(days=1), 5000.0, (60.0, 80.0))):
            VmRollup.objects.create(
                vm=vm, step_s=step, bucket=bucket_floor(when, step), samples=30 if util[0] == 20.0 else 10,
                profile_fb_mib=12288.0, fb_used_mib_avg=fb_max / 2, fb_used_mib_max=fb_max,
                fb_used_mib_p95=fb_max - 100, util_gpu_avg=util[0], util_gpu_max=util[1], util_gpu_p95=util[1],
            )


@pytest.fixture
def world(artist):
    """Ana (signed in) has ws-ana on gpu_1 of render-01 and ws-ana-2 on gpu_2; Bob shares gpu_1
    (ws-bob), Cleo has ws-cleo on gpu_2. Agent agent-r01 serves render-01."""
    now = timezone.now()
    host = HostFactory(name="render-01", cpu_threads=128)
    gpu_1 = GpuFactory(host=host, gpu_model=gpu_model(L40S), pci_bus_id="00000000:3B:00.0")
    gpu_2 = GpuFactory(host=host, gpu_model=gpu_model(L40S), pci_bus_id="00000000:5E:00.0")
    q12 = profile("L40S-12Q")
    vm_ana = VirtualMachineFactory(name="ws-ana", artist=artist)
    vm_ana_2 = VirtualMachineFactory(name="ws-ana-2", artist=artist)
    vm_bob = VirtualMachineFactory(name="ws-bob", artist=ArtistFactory(name="Bob Builder"))
    vm_cleo = VirtualMachineFactory(name="ws-cleo", artist=ArtistFactory(name="Cleo Comp"))
    for vm, gpu in ((vm_ana, gpu_1), (vm_ana_2, gpu_2), (vm_bob, gpu_1), (vm_cleo, gpu_2)):
        services.place_vgpu(vm, gpu, q12)
    week_of_use(vm_ana, now)
    week_of_use(vm_bob, now)
    agent = Agent.objects.create(name="agent-r01", url="http://render-01:9410", host=host, last_seen=now)
    return SimpleNamespace(host=host, gpu_1=gpu_1, vm_ana=vm_ana, vm_ana_2=vm_ana_2, vm_bob=vm_bob, vm_cleo=vm_cleo,
                           agent=agent)


@pytest.fixture
def artist_client(client, artist):
    client.force_login(artist.user)
    return client


def test_shows_only_the_signed_in_artists_vms_with_profiles_and_host_name(artist_client, world):
    body = me(artist_client)

    assert [int(pk) for pk in re.findall(r'data-section="workstation" data-vm="(\d+)"', body)] == [
        world.vm_ana.pk, world.vm_ana_2.pk]
    assert f'<a href="/vms/{world.vm_ana.pk}/">ws-ana</a>' in body
    assert "L40S-12Q (12 GiB of frame buffer)" in body
    assert '<span data-fact="host">render-01</span>' in body
    assert "/hosts/" not in body
    assert 'href="/gpus/' not in body
    # Bob shares gpu_1 with ws-ana, Cleo shares gpu_2 with ws-ana-2: nothing of theirs shows.
    for other in ("Bob Builder", "ws-bob", "Cleo Comp", "ws-cleo"):
        assert other not in body
    for chart in charts(body):
        assert urlsplit(chart["data-series-url"]).path in (f"/api/v1/vms/{world.vm_ana.pk}/metrics/",
                                                           f"/api/v1/vms/{world.vm_ana_2.pk}/metrics/")


def test_default_range_is_the_last_30_days_with_a_plain_summary(artist_client, world):
    body = me(artist_client)

    assert re.search(r'data-range="30d" aria-current="true"', body)
    fb_chart, util_chart, *_ = charts(body)
    assert iso_time(fb_chart["data-end"]) - iso_time(fb_chart["data-start"]) == timedelta(days=30)
    query = {k: v[0] for k, v in parse_qs(urlsplit(fb_chart["data-series-url"]).query).items()}
    assert (query["start"], query["end"], query["step"]) == (fb_chart["data-start"], fb_chart["data-end"], "3600")
    assert fb_chart["data-limit"] == "12.000"
    assert fb_chart["data-limit-label"] == "Profile: 12 GiB (L40S-12Q)"
    assert util_chart["data-unit"] == "%"
    assert "Peak frame buffer use was 9.1 of 12 GiB (76%)." in body
    assert "On average the vGPU kept its GPU 30% busy (highest 80%)." in body
    # ws-ana-2 has no rollups: the summary says so for the range shown.
    assert "No usage was recorded between" in body


def test_presets_narrow_the_summary_and_charts(artist_client, world):
    body = me(artist_client, query="?range=7d")

    assert re.search(r'data-range="7d" aria-current="true"', body)
    assert iso_time(charts(body)[0]["data-end"]) - iso_time(charts(body)[0]["data-start"]) == timedelta(days=7)
    # Only yesterday's bucket is in the last 7 days: peak 5000 MiB (41%), mean 60%.
    assert "Peak frame buffer use was 4.9 of 12 GiB (41%)." in body
    assert "Less than half of the profile&#x27;s frame buffer was ever in use." in body
    assert "kept its GPU 60% busy" in body


def test_heatmap_click_marks_the_moment(artist_client, world):
    body = me(artist_client, query="?at=2026-03-02T10:00:00Z")

    assert "around 2026-03-02 10:00 UTC" in body
    assert {c["data-at"] for c in charts(body)} == {"2026-03-02T10:00:00Z"}


def test_bad_range_is_a_400_with_the_message(artist_client, world):
    body = me(artist_client, status=400, query="?range=forever")

    assert "Unknown range &#x27;forever&#x27;" in body
    assert "ws-ana" in body  # the page is still there, on the default range


def test_stale_agent_of_their_host_is_named(artist_client, world):
    world.agent.last_seen = datetime(2026, 3, 2, 9, 30, tzinfo=UTC)
    world.agent.save()

    body = me(artist_client)

    assert "Agent agent-r01 is stale: last seen 2026-03-02 09:30 UTC" in body
    hint = charts(body)[0]["data-empty-hint"]
    assert hint == ("If the workstation was running then, the collector on render-01 may be down: "
                    "tell your studio's IT admin.")


def test_vm_without_vgpu_says_so(artist_client, artist):
    VirtualMachineFactory(name="ws-bare", artist=artist)

    body = me(artist_client)

    assert "ws-bare" in body
    assert "This VM has no vGPU" in body
    assert "This VM is not placed on a host" in charts(body)[0]["data-empty-hint"]


def test_artist_without_vms_is_told_to_ask(artist_client, artist):
    body = me(artist_client)

    assert "No virtual workstation yet" in body
    assert charts(body) == []


def test_user_without_artist_gets_an_empty_state(client, db):
    client.force_login(UserFactory(username="nobody"))

    body = me(client)

    assert "Your account is not linked to an artist; ask your studio's IT admin." in body
    assert 'href="/"' not in body.split("<main", 1)[1]


def test_staff_without_artist_get_a_link_to_the_overview(client, admin_user):
    client.force_login(admin_user)

    body = me(client)

    assert "Your account is not linked to an artist" in body
    assert '<a class="button" href="/">Fleet overview</a>' in body


def test_anonymous_is_sent_to_login(client):
    response = client.get("/me/")

    assert response.status_code == 302
    assert response["Location"] == "/login/?next=/me/"


def test_query_count_does_not_grow_with_vms(client, db, django_assert_num_queries):
    now = timezone.now()
    clients = {}
    for n in (2, 12):
        artist = ArtistFactory(user=UserFactory(username=f"artist-{n}"), name=f"Artist {n}")
        host = HostFactory(name=f"host-{n}", cpu_threads=256)
        Agent.objects.create(name=f"agent-{n}", url=f"http://host-{n}:9410", host=host, last_seen=now)
        for i in range(n):
            gpu = GpuFactory(host=host, gpu_model=gpu_model(L40S))
            vm = VirtualMachineFactory(name=f"ws-{n}-{i}", artist=artist)
            services.place_vgpu(vm, gpu, profile("L40S-12Q"))
            week_of_use(vm, now)
        clients[n] = artist.user

    counts = {}
    for n, user in clients.items():
        client.force_login(user)
        with CaptureQueriesContext(connection) as queries:
            body = me(client)
        counts[n] = len(queries)
        assert len(re.findall(r'data-section="workstation"', body)) == n
    assert counts[2] == counts[12]
    # session, user, artist, VMs (with their suggestions), vGPUs, usage, agents, vGPU profiles and resize
    # requests (the request form), the fleet snapshot of the VMs' GPU models (7: where each choice of
    # the form fits now), the navigation badges, and the feedback prompt (a "Not now" today, the VMs
    # not rated today) and the artist's last ratings
    with django_assert_num_queries(20):
        me(client)

"""The dashboard in a real browser: an admin's overview and heatmaps, click-through to the
detail page at the clicked time, a 1,000-GPU heatmap drawn in groups with a drill-down, and an
artist who sees only their own workstation."""

from __future__ import annotations

import math
import os
import re
from datetime import UTC, datetime, timedelta
from urllib.parse import parse_qs, urlsplit

import pytest
from django.db.models import Sum

from e2e.conftest import sign_in
from fleet.choices import GpuMode
from fleet.models import Artist, Gpu, Host, Vgpu, VirtualMachine

pytestmark = pytest.mark.django_db(transaction=True, serialized_rollback=True)

READY = "[data-state=ready], [data-state=empty], [data-state=error]"


def figure(page, name: str, attribute: str = "data-value") -> int:
    return int(page.locator(f"[data-figure={name}] .value").get_attribute(attribute))


def draw_heatmap(page, query: str) -> dict:
    """Open the heatmap page with `query`, wait for the chart and return its drawn state."""
    page.goto(f"/heatmap/?{query}")
    chart = page.locator("#heatmap")
    chart.and_(page.locator(READY)).wait_for(timeout=20_000)
    return {
        "state": chart.get_attribute("data-state"),
        "rows": int(chart.get_attribute("data-rows") or 0),
        "columns": int(chart.get_attribute("data-columns") or 0),
        "y": page.evaluate("() => document.getElementById('heatmap').data[0].y"),
    }


def test_admin_signs_in_and_the_overview_shows_what_the_database_holds(page, demo_world):
    sign_in(page, "admin")

    assert urlsplit(page.url).path == "/"
    vgpu_gpus = Gpu.objects.filter(mode=GpuMode.VGPU)
    assert figure(page, "hosts") == Host.objects.count()
    assert figure(page, "gpus") == Gpu.objects.count()
    assert figure(page, "vms") == VirtualMachine.objects.count()
    assert figure(page, "artists") == Artist.objects.count()
    assert figure(page, "vgpus") == Vgpu.objects.count()
    assert figure(page, "frame-buffer") == Vgpu.objects.filter(gpu__in=vgpu_gpus).aggregate(
        mib=Sum("profile__fb_mib"))["mib"]
    assert figure(page, "frame-buffer", "data-physical-mib") == vgpu_gpus.aggregate(
        mib=Sum("gpu_model__fb_mib"))["mib"]
    health = {li.get_attribute("data-agents"): int(li.get_attribute("data-count"))
              for li in page.locator("li[data-agents]").all()}
    assert health["ok"] == len(demo_world.agents) - 1
    assert health["stale"] == 1
    assert demo_world.stale.name in page.locator("[data-table=agents-attention]").inner_text()


def test_overview_refreshes_itself_without_a_reload(page, demo_world, settings):
    from telemetry.models import Agent

    settings.DASHBOARD_REFRESH_S = 2
    sign_in(page, "admin")
    page.evaluate("() => { window.notReloaded = true; }")
    Agent.objects.update(last_seen=datetime.now(UTC))  # the stale agent reports again

    page.locator("li[data-agents=stale][data-count='0']").wait_for(timeout=15_000)
    assert page.evaluate("() => window.notReloaded") is True
    assert int(page.locator("li[data-agents=ok]").get_attribute("data-count")) == len(demo_world.agents)


def test_each_heatmap_draws_one_row_per_gpu_vm_and_host_in_scope(page, demo_world):
    sign_in(page, "admin")

    gpus = draw_heatmap(page, "view=gpu&range=24h")
    assert gpus["state"] == "ready"
    assert gpus["rows"] == Gpu.objects.count() == len(gpus["y"])
    assert gpus["columns"] in (288, 289)  # 24 h of 5-minute buckets, the first one partly in range

    vms = draw_heatmap(page, "view=vm&range=24h")
    assert vms["state"] == "ready"
    assert vms["rows"] == VirtualMachine.objects.filter(vgpus__isnull=False).distinct().count()

    week = draw_heatmap(page, "view=host&range=7d")
    assert week["state"] == "ready"
    assert week["rows"] == Host.objects.count()
    assert week["columns"] == 168


def test_a_click_on_a_heatmap_cell_opens_that_gpu_at_that_time(page, demo_world):
    sign_in(page, "admin")
    draw_heatmap(page, "view=gpu&range=24h&sort=host")
    row, column = 1, 200
    target = page.evaluate(
        """([row, column]) => {
            const el = document.getElementById('heatmap');
            const xa = el._fullLayout.xaxis, ya = el._fullLayout.yaxis, trace = el.data[0];
            const box = el.getBoundingClientRect();
            return {
                x: box.left + xa._offset + xa.l2p(xa.d2l(trace.x[column])),
                y: box.top + ya._offset + ya.l2p(ya.d2l(trace.y[row])),
                at: trace.x[column],
                id: el.heatmapRows ? el.heatmapRows[row].id : null,
            };
        }""",
        [row, column],
    )

    page.mouse.click(target["x"], target["y"])
    page.wait_for_url("**/gpus/*/?at=*")

    url = urlsplit(page.url)
    gpu = Gpu.objects.get(pk=int(url.path.strip("/").split("/")[-1]))
    if target["id"] is not None:
        assert gpu.pk == target["id"]
    assert parse_qs(url.query)["at"] == [target["at"]]
    assert gpu.pci_bus_id in page.locator("main").inner_text()
    page.locator(".chart").first.and_(page.locator(READY)).wait_for(timeout=20_000)


def add_fleet(gpus: int, hours: int, now: datetime) -> None:
    """`gpus` more L40S GPUs on hosts of 8, with 5-minute rollups of the last `hours`: a studio
    day with a per-GPU phase, every 97th GPU silent; their heatmap strips written from them, as
    `manage.py build_heatmap_strips` does for rollups written before strips existed."""
    from fleet.models import GpuModel
    from telemetry import strips
    from telemetry.models import GpuRollup

    model = GpuModel.objects.get(name="NVIDIA L40S")
    hosts = Host.objects.bulk_create(Host(name=f"farm-{h:03d}", cpu_threads=128, ram_gib=1024)
                                     for h in range(math.ceil(gpus / 8)))
    made = Gpu.objects.bulk_create(Gpu(host=hosts[g // 8], gpu_model=model, uuid=f"GPU-farm-{g}",
                                       pci_bus_id=f"00000000:{g % 8 + 1:02X}:00.0") for g in range(gpus))
    first = now.replace(minute=now.minute - now.minute % 5, second=0, microsecond=0) - timedelta(hours=hours)
    GpuRollup.objects.bulk_create(
        (GpuRollup(gpu=gpu, step_s=300, bucket=first + timedelta(minutes=5 * b), samples=10,
                   util_gpu_avg=max(0.0, min(100.0, 50 + 45 * math.sin((b / 72 + g / 97) * 2 * math.pi))))
         for g, gpu in enumerate(made) if g % 97 for b in range(hours * 12)),
        batch_size=5000,
    )
    strips.rebuild_days(first.date(), now.date())


def test_a_1000_gpu_heatmap_draws_groups_from_the_typed_matrix_and_a_click_shows_a_group(page, demo_world, tmp_path):
    add_fleet(1000, 6, demo_world.now)
    total = Gpu.objects.count()
    sign_in(page, "admin")

    with page.expect_response(lambda response: "/api/v1/heatmap/" in response.url) as answer:
        drawn = draw_heatmap(page, "view=gpu&range=6h&sort=host")
    assert "encoding=typed" in answer.value.url
    assert answer.value.headers.get("content-encoding") == "gzip"
    chart = page.locator("#heatmap")
    assert drawn["state"] == "ready"
    assert chart.get_attribute("data-grouped") == "true"
    assert int(chart.get_attribute("data-total-rows")) == total > 1000
    hosts = Host.objects.filter(gpus__isnull=False).distinct().count()
    assert drawn["rows"] == hosts > 125, "one group a host: they fit a screen"
    assert "farm-010 (8 GPUs)" in drawn["y"]
    assert page.evaluate("() => document.getElementById('heatmap').data[0].z[0] instanceof Float64Array")
    # The typed codes decoded in the page are the API's values within half a step.
    hot = page.evaluate("() => Math.max(...document.getElementById('heatmap').data[0].z.flatMap("
                        "(row) => Array.from(row).filter((v) => !Number.isNaN(v))))")
    assert 94.5 <= hot <= 100.0
    # A group's peak and mean on hover: read from the strips' codes, they say how close they are.
    peak = page.evaluate("() => document.getElementById('heatmap').data[0].customdata[0][0][1]")
    assert re.fullmatch(r"\d+\.\d % ± 0\.2", peak), peak
    page.screenshot(path=os.environ.get("HEATMAP_SCREENSHOT", str(tmp_path / "heatmap-1000-gpus.png")))

    row = drawn["y"].index("farm-010 (8 GPUs)")
    target = page.evaluate(
        """(row) => {
            const el = document.getElementById('heatmap');
            const xa = el._fullLayout.xaxis, ya = el._fullLayout.yaxis, trace = el.data[0];
            const box = el.getBoundingClientRect();
            return {x: box.left + xa._offset + xa.l2p(xa.d2l(trace.x[20])),
                    y: box.top + ya._offset + ya.l2p(ya.d2l(trace.y[row]))};
        }""",
        row,
    )
    page.mouse.click(target["x"], target["y"])
    page.locator("#heatmap[data-grouped=false][data-state=ready]").wait_for(timeout=20_000)
    rows = page.evaluate("() => document.getElementById('heatmap').data[0].y")
    assert rows == [f"farm-010 · 00000000:{n:02X}:00.0" for n in range(1, 9)]
    # A row's peak on hover is exact, as the GPU's rollups give it.
    peak = page.evaluate("() => document.getElementById('heatmap').data[0].customdata[0][0][1]")
    assert re.fullmatch(r"\d+\.\d %", peak), peak
    assert page.locator(".heatmap-drill button").inner_text() == f"← All {total:,} GPUs"
    assert page.locator(".heatmap-drill span").inner_text() == "Showing farm-010 (8 GPUs)"

    page.locator(".heatmap-drill button").click()
    page.locator("#heatmap[data-grouped=true][data-state=ready]").wait_for(timeout=20_000)
    assert page.locator(".heatmap-drill").count() == 0


def test_an_artist_sees_their_own_workstation_and_nothing_of_anyone_else(page, demo_world):
    artist, other = demo_world.artist, demo_world.other
    own_vm = artist.vms.filter(vgpus__isnull=False).first()
    other_vm = other.vms.first()

    sign_in(page, artist.user.username)

    assert urlsplit(page.url).path == "/me/"
    body = page.locator("main").inner_text()
    assert own_vm.name in body
    assert other.name not in body
    assert other_vm.name not in body
    page.locator(".chart").first.and_(page.locator(READY)).wait_for(timeout=20_000)
    assert page.locator("nav.mainnav a").all_inner_texts() == ["My workstation"]

    assert page.goto(f"/vms/{other_vm.pk}/").status == 404
    assert page.goto("/heatmap/").status == 403
    assert page.goto(f"/gpus/{own_vm.vgpus.first().gpu_id}/").status == 403
    response = page.goto(f"/api/v1/vms/{other_vm.pk}/")
    assert response.status == 404

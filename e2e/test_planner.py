"""The density planner in Chromium: the sizing guide's server drawn to scale, then an admin
changes the board and the mix, adds a row without JavaScript's help, and gets a linkable plan."""

from __future__ import annotations

import pytest

from e2e.conftest import sign_in

pytestmark = pytest.mark.django_db(transaction=True, serialized_rollback=True)


@pytest.fixture
def catalog(admin_user):
    from fleet.catalog import load_catalog
    from fleet.models import GpuModel, VgpuProfile
    from sizing.models import WorkflowPreset
    from sizing.presets import load_presets

    # A transactional test elsewhere in the run may have flushed what the migrations loaded.
    if not GpuModel.objects.exists():
        load_catalog(GpuModel, VgpuProfile)
    load_presets(WorkflowPreset)
    return GpuModel.objects.get(name="NVIDIA L40S")


def heights(page, gpu: int) -> list[float]:
    return [box["height"] for box in (block.bounding_box() for block in
                                      page.locator(f'[data-gpu="{gpu}"] .vgpu').all())]


def test_the_guide_is_drawn_to_scale_and_a_new_mix_is_a_link(page, catalog):
    sign_in(page, "admin", next_path="/sizing/planner/")

    assert page.inner_text('[data-figure="servers"] [data-value]') == "1"
    stack = page.locator('[data-gpu="0"] .gpu-stack').bounding_box()["height"]
    twelve_q = heights(page, 0)
    assert len(twelve_q) == 2
    # Two 12Q fill a 24 GB GPU, half each (borders aside); a 24Q fills one alone.
    assert all(abs(height - stack / 2) < 4 for height in twelve_q)
    assert abs(heights(page, 1)[0] - stack) < 6

    page.select_option("#id_gpu_model", label="NVIDIA L40S")
    page.fill("#id_gpus", "2")
    page.click("button[name=add_row]")
    page.wait_for_load_state("networkidle")
    assert page.locator("tr[data-row]").count() == 7
    page.select_option('select[name="artists-6-demand"]', "workflow:layout")
    page.fill('input[name="artists-6-count"]', "6")
    page.click("button.primary:has-text('Plan')")
    page.wait_for_load_state("networkidle")

    assert f"gpu_model={catalog.pk}" in page.url
    # On 48 GB GPUs: 12Q+12Q on one GPU, the two 24Q on another, six 8Q layout artists on a third:
    # three GPUs, two servers of two.
    assert page.inner_text('[data-figure="servers"] [data-value]') == "2"
    assert page.locator(".vgpu[data-profile='L40S-8Q']").count() == 6
    page.goto(page.url)  # the plan is a link
    assert page.inner_text('[data-figure="servers"] [data-value]') == "2"

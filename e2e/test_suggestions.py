"""The right-sizing page in Chromium: an admin opens a suggestion's evidence (its chart is drawn
from the page's own data) and accepts another, which files a resize request."""

from __future__ import annotations

import pytest

from e2e.conftest import sign_in

pytestmark = pytest.mark.django_db(transaction=True, serialized_rollback=True)


@pytest.fixture
def world(admin_user):
    from fleet.catalog import load_catalog
    from fleet.models import GpuModel, VgpuProfile
    from sizing.suggestions import refresh_suggestions
    from sizing.tests.suggestion_world import rtx_studio, this_hour, two_weeks_of_use

    # A transactional test elsewhere in the run may have flushed the catalog (see e2e/conftest.py).
    if not GpuModel.objects.exists():
        load_catalog(GpuModel, VgpuProfile)
    world = rtx_studio()
    two_weeks_of_use(world, end=this_hour())
    refresh_suggestions()
    return world


def test_an_admin_reads_the_evidence_and_accepts_a_suggestion(page, world):
    from fleet.models import ResizeRequest
    from sizing.models import Suggestion

    light = Suggestion.objects.get(vm=world.light)
    heavy = Suggestion.objects.get(vm=world.heavy)
    sign_in(page, "admin", next_path="/sizing/suggestions/")

    assert page.inner_text('[data-figure="downsize"] .value') == "1"
    detail = page.locator(f"#suggestion-{light.pk}-detail")
    assert detail.is_hidden()
    page.click(f'[data-toggle-detail="suggestion-{light.pk}-detail"]')
    assert detail.is_visible()
    chart = page.locator(f'[data-suggestion-chart="{light.pk}"]')
    page.wait_for_selector(f'[data-suggestion-chart="{light.pk}"][data-state="ready"]')
    assert chart.locator(".scatterlayer .trace").count() == 2  # daily p95 and peak
    assert "Profile 24 GiB" in chart.inner_text()

    page.click(f"#suggestion-{heavy.pk} button:has-text('Accept')")
    page.wait_for_load_state("networkidle")

    filed = ResizeRequest.objects.get()
    assert (filed.vm_id, filed.requested_profile.name, filed.status) == (world.heavy.pk, "RTX6000-24Q", "pending")
    assert f"Request #{filed.pk} filed" in page.inner_text(".messages")
    assert f"Request #{filed.pk} pending" in page.inner_text(f"#suggestion-{heavy.pk}")

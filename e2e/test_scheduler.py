"""The scheduler page in Chromium: an admin picks fixed share without ARR, sees only the fields
that apply, saves a 24 ms time slice and reads the exact commands; drift shows in the list. The
host's agent runs without a write token, so the page offers no "Apply" and says how to get one."""

from __future__ import annotations

import os

import pytest

from e2e.conftest import sign_in

pytestmark = pytest.mark.django_db(transaction=True, serialized_rollback=True)


@pytest.fixture
def gpu(admin_user):
    from fleet.catalog import load_catalog
    from fleet.models import GpuModel, VgpuProfile
    from fleet.tests.factories import GpuFactory, HostFactory

    if not GpuModel.objects.exists():
        load_catalog(GpuModel, VgpuProfile)
    return GpuFactory(host=HostFactory(name="render-07"), gpu_model=GpuModel.objects.get(name="Tesla T4"),
                      pci_bus_id="00000000:86:00.0",
                      scheduler_reported={"policy": "best_effort", "arr_mode": "default", "avg_factor": None,
                                          "timeslice_ms": None, "frequency_hz": None})


def test_admin_sets_fixed_share_with_a_time_slice_and_reads_the_commands(page, gpu):
    from telemetry.models import Agent

    Agent.objects.create(name="render-07-agent", url="http://render-07:9410", host=gpu.host)  # no write token
    sign_in(page, "admin", next_path=f"/scheduler/gpus/{gpu.pk}/")
    assert page.inner_text('[data-apply="read-only"]').startswith(
        "The agent of render-07 runs without a write token: apply the commands below by hand.")
    assert "python manage.py scheduler_write_token render-07-agent" in page.inner_text('[data-apply="read-only"]')
    assert page.locator('[data-form="apply"]').count() == 0

    page.select_option("#id_policy", "fixed_share")
    assert page.is_visible('[data-field="arr"]')
    page.uncheck("#id_arr")
    assert page.is_hidden('[data-field="frequency_hz"]')
    assert page.is_visible('[data-field="timeslice_ms"]')
    page.fill("#id_timeslice_ms", "24")
    page.click('[data-form="policy"] button[type=submit]')
    page.wait_for_load_state("networkidle")

    assert page.inner_text('[data-command="runtime"]') == (
        "nvidia-smi vgpu -i 00000000:86:00.0 set-scheduler-state -p 3 -a 0 -ts 24000000")
    assert 'RmPVMRL=0x00180011"' in page.inner_text('[data-section="commands"]')
    assert "drift: policy, timeslice_ms" in page.inner_text('[data-fact="drift"]')
    if os.environ.get("SCREENSHOT_DIR"):
        page.screenshot(path=os.path.join(os.environ["SCREENSHOT_DIR"], "scheduler-gpu.png"), full_page=True)

    page.select_option("#id_policy", "best_effort")
    assert page.is_hidden('[data-field="arr"]')
    assert page.is_hidden('[data-field="timeslice_ms"]')

    page.goto("/scheduler/?drift=1")
    assert page.inner_text(f'[data-gpu="{gpu.pk}"] [data-cell="drift"]').startswith("drift:")
    if os.environ.get("SCREENSHOT_DIR"):
        page.screenshot(path=os.path.join(os.environ["SCREENSHOT_DIR"], "scheduler-drift.png"), full_page=True)

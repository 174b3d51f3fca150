"""POST /api/v1/alerts/{id}/drain/: a drain plan of the alert's GPU, started for staff only, and
the refusals a script can act on."""

from __future__ import annotations

import pytest

from alerts.models import AlertState
from alerts.tests.worlds import gpu_alert
from sizing import optimizer_runs, tasks
from sizing.models import OptimizerRun, OptimizerStatus
from sizing.tests.optimizer_world import failing_gpu_fleet

pytestmark = pytest.mark.django_db


def drain_url(alert) -> str:
    return f"/api/v1/alerts/{alert.pk}/drain/"


@pytest.fixture
def queued(monkeypatch):
    sent: list[int] = []
    monkeypatch.setattr(optimizer_runs, "enqueue", sent.append)
    return sent


def test_a_drain_starts_a_run_of_the_alerts_gpu(admin_api, queued, django_capture_on_commit_callbacks):
    world = failing_gpu_fleet()
    alert = gpu_alert(world.failing)

    with django_capture_on_commit_callbacks(execute=True):
        response = admin_api.post(drain_url(alert), format="json")

    assert response.status_code == 202, response.data
    run = OptimizerRun.objects.get()
    assert response.json() == {"run": run.pk, "url": f"/sizing/optimizer/{run.pk}/"}
    assert queued == [run.pk]
    assert run.params["drain_gpu_ids"] == [world.failing.pk]
    assert run.params["include_requests"] is False
    # The worker's plan moves the two VMs of the failing GPU, no other.
    tasks.run_optimizer(run.pk)
    run.refresh_from_db()
    assert sorted(m["vm_name"] for m in run.result["plan"]["moves"]) == ["ws-fx-a", "ws-fx-b"]


def test_a_busy_optimizer_is_a_409_naming_its_run(admin_api, queued):
    world = failing_gpu_fleet()
    busy = optimizer_runs.start_run(None)

    response = admin_api.post(drain_url(gpu_alert(world.failing)))

    assert response.status_code == 409
    assert response.json() == {"detail": f"The optimizer is busy with run #{busy.pk}: drain again once it has "
                                         f"finished."}
    assert OptimizerRun.objects.count() == 1


@pytest.mark.parametrize("state", [AlertState.RESOLVED, None])
def test_an_ended_alert_or_one_about_no_gpu_is_a_409(admin_api, queued, state):
    world = failing_gpu_fleet()
    alert = gpu_alert(world.failing, state=AlertState.RESOLVED) if state else gpu_alert(None, rule="licence_pool")

    response = admin_api.post(drain_url(alert))

    assert response.status_code == 409
    assert response.json() == {"detail": "Nothing to drain: this alert is not about a GPU, or it has ended."}
    assert not OptimizerRun.objects.exists()


def test_a_gpu_without_vgpu_is_a_409(admin_api, queued):
    world = failing_gpu_fleet()
    alert = gpu_alert(world.failing)
    world.failing.vgpus.all().delete()

    response = admin_api.post(drain_url(alert))

    assert response.status_code == 409
    assert response.json()["detail"] == "studio-01 00000000:3B:00.0 (Quadro RTX 6000) runs no vGPU: there is " \
                                        "nothing to move."


# The run is sent once committed, so this test commits (and gets the catalog back afterwards).
@pytest.mark.django_db(transaction=True, serialized_rollback=True)
def test_a_queue_that_is_down_is_a_503_with_the_failed_run(admin_api, broker_down):
    world = failing_gpu_fleet()

    response = admin_api.post(drain_url(gpu_alert(world.failing)))

    assert response.status_code == 503
    run = OptimizerRun.objects.get()
    assert response.json() == {"detail": optimizer_runs.QUEUE_UNREACHABLE, "run": run.pk}
    assert run.status == OptimizerStatus.FAILED


def test_artists_may_not_drain(artist_api, queued):
    world = failing_gpu_fleet()

    response = artist_api.post(drain_url(gpu_alert(world.failing)))

    assert response.status_code == 403
    assert not OptimizerRun.objects.exists()

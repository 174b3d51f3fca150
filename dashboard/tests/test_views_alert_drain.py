"""The drain action of a health alert's page: the POST starts a drain run and opens its page,
which names the GPU, lists the moves off it and what stays on it, and runs a drain again as a
drain; refusals come back to the alert with the reason."""

from __future__ import annotations

import pytest
from django.contrib.messages import get_messages
from django.urls import reverse

from alerts.models import AlertState
from alerts.tests.worlds import gpu_alert
from dashboard.tests.test_views_overview import attr, find, one, rows, text
from fleet import services
from fleet.models import Vgpu
from sizing import optimizer_runs, tasks
from sizing.models import OptimizerRun
from sizing.tests.optimizer_world import failing_gpu_fleet

pytestmark = pytest.mark.django_db

FAILING = "studio-01 00000000:3B:00.0 (Quadro RTX 6000)"


@pytest.fixture
def queued(monkeypatch):
    sent: list[int] = []
    monkeypatch.setattr(optimizer_runs, "enqueue", sent.append)
    return sent


def drain_url(alert) -> str:
    return reverse("alerts:alert-drain", args=[alert.pk])


def messages_of(response) -> list[str]:
    return [str(m) for m in get_messages(response.wsgi_request)]


def test_the_alert_page_drains_the_gpu_and_the_run_page_shows_the_drain(admin_client, queued):
    world = failing_gpu_fleet()
    alert = gpu_alert(world.failing)
    page = admin_client.get(reverse("alerts:alert", args=[alert.pk])).content.decode()
    assert attr(one(page, data_form="drain"), "action") == drain_url(alert)

    response = admin_client.post(drain_url(alert))

    run = OptimizerRun.objects.get()
    assert response.status_code == 302
    assert response["Location"] == reverse("sizing:optimizer-run", args=[run.pk])
    assert messages_of(response) == [f"Planning how to move every VM off {FAILING}: review the plan, then apply it."]
    tasks.run_optimizer(run.pk)
    html = admin_client.get(response["Location"]).content.decode()
    assert text(one(html, data_drain=True)).startswith(f"Drain of GPU {FAILING}: the plan moves every VM off it")
    moves = rows(html, "moves")
    assert sorted(int(attr(row, "data-vm")) for row in moves) == sorted(vm.pk for vm in world.leaving)
    assert all(text(row).endswith("Drain: off the drained GPU") for row in moves)
    assert text(one(html, data_section="unplaced")).startswith("Left on the drained GPU None: every VM on")
    assert find(html, data_section="apply")


def test_a_vm_that_cannot_leave_is_listed_as_left_on_the_gpu(admin_client, queued):
    world = failing_gpu_fleet()
    services.remove_vgpus(Vgpu.objects.filter(gpu__in=[world.half_c, world.half_d]).order_by("pk"))
    for gpu in (world.half_c, world.half_d):
        services.update_gpu(gpu, mode="passthrough")
    admin_client.post(drain_url(gpu_alert(world.failing)))
    run = OptimizerRun.objects.get()
    tasks.run_optimizer(run.pk)

    html = admin_client.get(reverse("sizing:optimizer-run", args=[run.pk])).content.decode()

    assert text(one(html, data_no_moves=True)) == (f"No VM moves off {FAILING}: none of its VMs finds room "
                                                   f"elsewhere (below).")
    reason = "it cannot leave the drained GPU: no other Quadro RTX 6000 GPU in vGPU mode can take 1 x RTX6000-12Q"
    assert text(one(html, data_list="unplaced")) == (f"ws-fx-a : {reason} for VM ws-fx-a "
                                                     f"ws-fx-b : {reason} for VM ws-fx-b")
    assert "the GPU is not empty after this plan" in text(one(html, data_section="unplaced"))


def test_a_busy_optimizer_sends_the_admin_back_to_the_alert(admin_client, queued):
    world = failing_gpu_fleet()
    alert = gpu_alert(world.failing)
    busy = optimizer_runs.start_run(None)

    response = admin_client.post(drain_url(alert))

    assert response["Location"] == reverse("alerts:alert", args=[alert.pk])
    assert messages_of(response) == [f"The optimizer is busy with run #{busy.pk}: drain again once it has finished."]
    assert OptimizerRun.objects.count() == 1


def test_an_ended_alert_drains_nothing(admin_client, queued):
    world = failing_gpu_fleet()
    alert = gpu_alert(world.failing, state=AlertState.RESOLVED)

    response = admin_client.post(drain_url(alert))

    assert response["Location"] == reverse("alerts:alert", args=[alert.pk])
    assert messages_of(response) == ["Nothing to drain: this alert is not about a GPU, or it has ended."]
    assert not OptimizerRun.objects.exists()


def test_run_again_on_a_changed_fleet_drains_the_same_gpu(admin_client, queued):
    world = failing_gpu_fleet()
    admin_client.post(drain_url(gpu_alert(world.failing)))
    first = OptimizerRun.objects.get()
    tasks.run_optimizer(first.pk)
    services.remove_vgpus(Vgpu.objects.filter(vm=world.staying[0]))  # the fleet changes meanwhile
    html = admin_client.get(reverse("sizing:optimizer-run", args=[first.pk])).content.decode()
    form = one(html, action=reverse("sizing:optimizer"))
    hidden = {attr(i, "name"): attr(i, "value") for i in find(str(form), type="hidden")
              if attr(i, "name") != "csrfmiddlewaretoken"}
    assert hidden == {"drain_gpu": str(world.failing.pk)}

    response = admin_client.post(reverse("sizing:optimizer"), hidden)

    second = OptimizerRun.objects.exclude(pk=first.pk).get()
    assert response["Location"] == reverse("sizing:optimizer-run", args=[second.pk])
    assert second.params["drain_gpu_ids"] == [world.failing.pk]
    assert second.params["include_requests"] is False

"""The optimizer pages: who may open them, starting a run, following its progress, the diff of
a finished plan and applying it."""

from __future__ import annotations

import pytest
from django.contrib.messages import get_messages
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.urls import reverse

from dashboard.tests.test_views_overview import attr, figure, find, one, rows, text
from fleet import services
from fleet.choices import ResizeStatus
from fleet.tests.factories import GpuFactory, VirtualMachineFactory, profile
from hypervisors import operations, sim_seed
from hypervisors.backends import sim
from sizing import optimizer_runs, tasks
from sizing.models import OptimizerRun, OptimizerStatus
from sizing.tests.optimizer_world import (
    fleet_with_request,
    fragmented_fleet,
    gpus_in_use,
    make_runs,
    placements,
    suggestion,
)

pytestmark = pytest.mark.django_db

PAGE = reverse("sizing:optimizer")
HTMX = {"HX-Request": "true"}


@pytest.fixture
def queued(monkeypatch):
    sent: list[int] = []
    monkeypatch.setattr(optimizer_runs, "enqueue", sent.append)
    return sent


def run_url(run) -> str:
    return reverse("sizing:optimizer-run", args=[run.pk])


def apply_url(run) -> str:
    return reverse("sizing:optimizer-apply", args=[run.pk])


def finished(user) -> OptimizerRun:
    run = optimizer_runs.start_run(user)
    tasks.run_optimizer(run.pk)
    return OptimizerRun.objects.get(pk=run.pk)


def confirmed(run) -> dict:
    """What the run page's apply form posts: the ticked confirmation and the plan's fingerprint."""
    return {"confirm": "on", "fingerprint": run.fleet_fingerprint}


def flash(response) -> list[str]:
    return [str(m) for m in get_messages(response.wsgi_request)]


# Roles -----------------------------------------------------------------------------------------


def test_anonymous_visitors_are_sent_to_login_and_artists_refused(client, artist, admin_user, queued):
    run = make_runs(1, admin_user)[0]
    for path in (PAGE, run_url(run)):
        response = client.get(path)
        assert response.status_code == 302
        assert response["Location"] == f"/login/?next={path}"
    assert client.post(apply_url(run), {"confirm": "on"}).status_code == 302

    client.force_login(artist.user)
    for path in (PAGE, run_url(run)):
        assert client.get(path).status_code == 403
    assert client.post(PAGE, {"include_requests": "on"}).status_code == 403
    assert client.post(apply_url(run), {"confirm": "on"}).status_code == 403
    assert OptimizerRun.objects.count() == 1
    assert OptimizerRun.objects.get().status == OptimizerStatus.DONE


def test_a_poll_after_the_session_ended_reloads_the_page(client, admin_user):
    run = make_runs(1, admin_user, status=OptimizerStatus.RUNNING)[0]
    response = client.get(run_url(run), headers=HTMX)
    assert response["HX-Refresh"] == "true"


# The optimizer's home --------------------------------------------------------------------------


def test_the_page_counts_what_a_run_can_include(staff, admin_user):
    world = fleet_with_request(admin_user)
    suggestion(world.vm_a, profile("RTX6000-6Q"))
    suggestion(world.vm_b, profile("RTX6000-6Q"), dismissed=True)
    response = staff.get(PAGE)
    html = response.content.decode()
    assert response.status_code == 200
    assert text(one(html, data_count="requests")) == "1"
    assert text(one(html, data_count="suggestions")) == "1", "a dismissed suggestion is not counted"
    form = one(html, action=PAGE)
    assert find(str(form), name="csrfmiddlewaretoken")
    assert "No runs yet" in html


@pytest.mark.parametrize("rows", [2, 12])
def test_the_list_of_runs_costs_the_same_queries_for_2_and_12(staff, admin_user, rows):
    make_runs(rows, admin_user)
    staff.get(PAGE)  # session and user loaded once, as on any page
    with CaptureQueriesContext(connection) as queries:
        response = staff.get(PAGE)
    html = response.content.decode()
    assert len(find(html, data_run=True)) == rows
    # session, user, pending requests, suggestions, runs, active run, the navigation badges
    assert len(queries) == 7, [q["sql"] for q in queries]
    first = one(html, data_run=str(OptimizerRun.objects.order_by("-id").first().pk))
    assert "3 → 2" in text(first)


def test_starting_a_run_opens_its_page(staff, admin_user, queued, django_capture_on_commit_callbacks):
    fleet_with_request(admin_user)
    with django_capture_on_commit_callbacks(execute=True):
        response = staff.post(PAGE, {"include_requests": "on"})
    run = OptimizerRun.objects.get()
    assert response.status_code == 302
    assert response["Location"] == run_url(run)
    assert run.params["include_requests"] is True
    assert run.params["include_suggestions"] is False
    assert len(run.params["changes"]) == 1
    assert queued == [run.pk]


# The run is sent once committed, so this test commits (and gets the catalog back afterwards).
@pytest.mark.django_db(transaction=True, serialized_rollback=True)
def test_while_the_task_queue_is_down_starting_a_run_says_it_did_not_start_and_why(staff, broker_down):
    fragmented_fleet()

    response = staff.post(PAGE, {"include_requests": "on"}, follow=True)

    run = OptimizerRun.objects.get()
    assert response.status_code == 200
    assert response.redirect_chain == [(run_url(run), 302)]
    page = response.content.decode()
    message = one(page, class_="message")
    assert "error" in attr(message, "class").split()
    assert text(message) == f"Optimizer run #{run.pk} was not queued; the reason is below."
    assert text(one(page, data_error=True)) == ("The run failed. Could not queue the run: the task queue (Redis) is "
                                                "unreachable; start it again once it is back.")
    assert attr(one(page, id="optimizer-run"), "data-status") == "failed"
    assert "hx-trigger" not in dict(one(page, id="optimizer-run").attributes), "nothing to wait for"
    assert broker_down == ["sizing.tasks.run_optimizer"]


def test_a_second_start_shows_the_run_in_progress(staff, admin_user, queued):
    fragmented_fleet()
    first = optimizer_runs.start_run(admin_user)
    response = staff.post(PAGE, {})
    assert response["Location"] == run_url(first)
    assert OptimizerRun.objects.count() == 1
    assert flash(response) == [f"No new run was started: run #{first.pk} had not finished. Its progress is below."]
    page = staff.get(PAGE).content.decode()
    button = one(page, type="submit", class_="primary")
    assert "disabled" in dict(button.attributes)


# A run's page ----------------------------------------------------------------------------------


def test_a_running_run_shows_a_progress_bar_that_polls_every_second(staff, admin_user, queued):
    fragmented_fleet()
    run = optimizer_runs.start_run(admin_user)
    optimizer_runs.claim_run(run.pk)
    OptimizerRun.objects.filter(pk=run.pk).update(progress=0.4, stage="Draining half-empty GPUs")

    page = staff.get(run_url(run)).content.decode()
    body = one(page, id="optimizer-run")
    assert attr(body, "hx-trigger") == "every 1s"
    assert attr(body, "hx-get") == run_url(run)
    progress = one(page, max="1")
    assert progress.name == "progress"
    assert attr(progress, "value") == "0.400"
    assert text(one(page, data_stage=True)) == "Draining half-empty GPUs"

    partial = staff.get(run_url(run), headers=HTMX).content.decode()
    assert "<html" not in partial
    assert attr(one(partial, id="optimizer-run"), "hx-trigger") == "every 1s"


def test_a_finished_plan_stops_polling_and_shows_the_diff(staff, admin_user, queued):
    world = fragmented_fleet()
    run = finished(admin_user)
    partial = staff.get(run_url(run), headers=HTMX).content.decode()

    body = one(partial, id="optimizer-run")
    assert "hx-trigger" not in dict(body.attributes), "polling stops once the run is done"
    assert figure(partial, "gpus-in-use") == 1
    assert text(one(partial, data_figure="gpus-in-use")).startswith("GPUs in use 2 → 1")
    assert text(one(partial, data_figure="gpus-freed")).startswith("GPUs freed 1")
    freed = text(one(partial, data_table="freed"))
    assert "studio-01" in freed
    assert ("00000000:3B:00.0" in freed) != ("00000000:5E:00.0" in freed)
    moved = run.result["plan"]["moves"][0]["vm_id"]
    row = text(one(partial, data_vm=str(moved)))
    assert {world.vm_a.pk: "ws-modeling-a", world.vm_b.pk: "ws-modeling-b"}[moved] in row
    assert "RTX6000-12Q" in row
    assert "Consolidation" in row
    form = one(partial, action=apply_url(run))
    assert find(str(form), name="csrfmiddlewaretoken")
    assert find(str(form), name="confirm", required=True)
    assert attr(find(str(form), name="fingerprint")[0], "value") == run.fleet_fingerprint
    assert text(one(str(one(partial, data_vm=str(moved))), data_shutdown="yes")) == "Yes"
    assert text(one(partial, data_shutdowns=True)) == f"Shut down before you apply: {row.split()[0]}."


def test_apply_is_disabled_with_the_reason_once_the_fleet_changed(staff, admin_user, queued):
    world = fragmented_fleet()
    run = finished(admin_user)
    # A bus id of its own: the sequence of GpuFactory comes round to the world's 3B after 250 GPUs.
    services.place_vgpu(VirtualMachineFactory(), GpuFactory(host=world.host, pci_bus_id="00000000:AF:00.0"),
                        profile("RTX6000-24Q"))

    page = staff.get(run_url(run)).content.decode()

    assert not find(page, action=apply_url(run))
    assert text(one(page, data_blocked=True)) == optimizer_runs.FLEET_CHANGED
    assert "disabled" in dict(one(page, type="button", class_="primary").attributes)


def test_a_finished_run_clears_its_queued_banner(staff, admin_user, queued):
    """Started, then finished before the admin looks: the page says done, with no "queued" or
    "running" left in a message or the header, and its body no longer polls."""
    fragmented_fleet()
    response = staff.post(PAGE, {})
    run = OptimizerRun.objects.get()
    assert flash(response) == []
    tasks.run_optimizer(run.pk)

    page = staff.get(response["Location"]).content.decode()

    body = one(page, id="optimizer-run")
    assert attr(body, "data-status") == "done"
    assert "hx-trigger" not in dict(body.attributes)
    assert not find(page, class_="message")
    outside_body = page.split('id="optimizer-run"')[0]
    assert "queued" not in outside_body.lower().split("<main")[-1]
    assert "running" not in outside_body.lower().split("<main")[-1]
    partial = staff.get(run_url(run), headers=HTMX).content.decode()
    assert "hx-trigger" not in dict(one(partial, id="optimizer-run").attributes)


def test_a_failed_run_shows_its_error(staff, admin_user):
    run = make_runs(1, admin_user, status=OptimizerStatus.FAILED)[0]
    OptimizerRun.objects.filter(pk=run.pk).update(result=None, error="RuntimeError: <b>boom</b>")
    page = staff.get(run_url(run)).content.decode()
    assert "RuntimeError: &lt;b&gt;boom&lt;/b&gt;" in page
    assert not find(page, data_section="apply")


def test_an_unknown_run_is_404(staff):
    assert staff.get(reverse("sizing:optimizer-run", args=[999999])).status_code == 404


# Applying --------------------------------------------------------------------------------------


def test_apply_needs_the_confirmation(staff, admin_user, queued):
    fragmented_fleet()
    run = finished(admin_user)
    before = placements()
    for body in ({}, {"fingerprint": run.fleet_fingerprint}, {"confirm": "on"}):
        response = staff.post(apply_url(run), body)
        assert response["Location"] == run_url(run)
        assert flash(response)[-1] == "Tick the confirmation to apply the plan."
    response = staff.post(apply_url(run), {"confirm": "on", "fingerprint": "an-older-plan"})
    assert flash(response)[-1] == f"Not applied: {optimizer_runs.FLEET_CHANGED}"
    assert placements() == before
    assert OptimizerRun.objects.get(pk=run.pk).status == OptimizerStatus.DONE


def test_apply_moves_the_vms_and_says_so(staff, admin_user, queued):
    world = fleet_with_request(admin_user)
    run = finished(admin_user)
    response = staff.post(apply_url(run), confirmed(run))
    assert response["Location"] == run_url(run)
    assert [m["vm_name"] for m in run.result["plan"]["moves"]] == ["ws-anim-c"], "the 12Q joins a half-full GPU"
    assert flash(response) == ["Plan applied: 1 VM re-placed, 1 resize request approved."]
    assert gpus_in_use() == 2
    world.request.refresh_from_db()
    assert world.request.status == ResizeStatus.APPROVED
    page = staff.get(run_url(run)).content.decode()
    assert "Applied" in text(one(page, data_applied=True))
    assert not find(page, data_section="apply")


def test_apply_refused_by_a_changed_fleet_says_why(staff, admin_user, queued):
    world = fragmented_fleet()
    run = finished(admin_user)
    # A bus id of its own: the sequence of GpuFactory comes round to the world's 3B after 250 GPUs.
    services.place_vgpu(VirtualMachineFactory(), GpuFactory(host=world.host, pci_bus_id="00000000:AF:00.0"),
                        profile("RTX6000-24Q"))
    before = placements()
    response = staff.post(apply_url(run), confirmed(run))
    assert flash(response) == [f"Not applied: {optimizer_runs.FLEET_CHANGED}"]
    assert placements() == before
    assert staff.get(apply_url(run)).status_code == 405


# On hosts linked to their hypervisor ----------------------------------------------------------


def test_a_plan_on_a_linked_host_lists_its_operations_with_run_now_for_all(staff, admin_user, queued, sim_dir,
                                                                          settings, django_capture_on_commit_callbacks):
    settings.HYPERVISOR_VERIFY_WAIT_S = 0
    world = fragmented_fleet()
    world.host.hypervisor_uri = "sim://studio-01"
    world.host.save()
    sim_seed.seed_host(world.host).set_shutdown_s(0)
    run = finished(admin_user)
    page = staff.get(run_url(run)).content.decode()
    assert attr(one(page, data_carried=True), "data-carried") == "operation"
    assert not find(page, data_shutdowns=True), "nothing to shut down by hand"

    response = staff.post(apply_url(run), confirmed(run))

    (operation,) = optimizer_runs.operations_of(run)
    assert flash(response) == ["Plan applied: 1 VM re-placed; 1 operation created on the hypervisors: run them below."]
    page = staff.get(run_url(run)).content.decode()
    (row,) = rows(page, "operations")
    assert f'href="/operations/{operation.pk}/"' in str(row)
    assert attr(row, "data-status") == "pending"
    assert "hx-trigger" in dict(one(page, id="optimizer-run").attributes), "it polls while the operation waits"

    with django_capture_on_commit_callbacks(execute=False):
        response = staff.post(reverse("sizing:optimizer-run-operations", args=[run.pk]))
    assert flash(response)[-1] == f"Running 1 operation now, one after another: #{operation.pk}."
    assert operations.run(operation.pk).status == "succeeded"
    page = staff.get(run_url(run)).content.decode()
    assert attr(rows(page, "operations")[0], "data-status") == "succeeded"
    assert not find(page, data_run_operations=True)
    assert "hx-trigger" not in dict(one(page, id="optimizer-run").attributes), "polling stops once it ended"
    domain = sim.SimBackend.open("sim://studio-01").domain(str(operation.vm.uuid))
    assert domain.state == "running"

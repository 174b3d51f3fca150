"""The audit log beyond the fleet services: the admin site, sizing's actions, the history boxes
of the detail pages, and retention."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.contrib import admin
from django.test import Client, RequestFactory
from django.utils import timezone

from fleet import audit, services
from fleet.models import Artist, AuditEvent, GpuModel, Host, ResizeRequest
from fleet.tests.factories import GpuFactory, HostFactory, UserFactory, VirtualMachineFactory, profile
from sizing import optimizer_runs, tasks
from sizing.models import OptimizerStatus, Suggestion, WorkflowPreset
from sizing.suggestions import refresh_suggestions
from sizing.tests.optimizer_world import fleet_with_request
from sizing.tests.suggestion_world import NOW, rtx_studio, two_weeks_of_use
from telemetry.retention import prune_samples

pytestmark = pytest.mark.django_db


@pytest.fixture
def staff_client(admin_user):
    client = Client()
    client.force_login(admin_user)
    return client


def admin_form_data(model, admin_user, obj=None, **changes) -> dict:
    """What the admin's change (or add) form of `obj` posts when a user changes only `changes`."""
    model_admin = admin.site._registry[model]
    request = RequestFactory().get("/admin/")
    request.user = admin_user
    form = model_admin.get_form(request, obj, change=obj is not None)(instance=obj)
    data = {name: form[name].value() for name in form.fields}
    data.update(changes)
    return {name: value for name, value in data.items() if value is not None}


def only(action: str) -> AuditEvent:
    (event,) = AuditEvent.objects.filter(action=action)
    return event


# Admin site ---------------------------------------------------------------------------------


def test_admin_artist_add_change_and_delete_are_recorded_with_the_admin_and_before_after(staff_client,
                                                                                           admin_user):
    user = UserFactory(username="dora")
    added = staff_client.post("/admin/fleet/artist/add/", admin_form_data(
        Artist, admin_user, name="Dora Explorer", user=user.pk, workflow="modeling"))
    assert added.status_code == 302, added.content
    artist = Artist.objects.get(name="Dora Explorer")

    changed = staff_client.post(f"/admin/fleet/artist/{artist.pk}/change/",
                                admin_form_data(Artist, admin_user, artist, workflow="lighting"))
    assert changed.status_code == 302, changed.content
    deleted = staff_client.post(f"/admin/fleet/artist/{artist.pk}/delete/", {"post": "yes"})
    assert deleted.status_code == 302

    create, update, delete = (only(f"artist.{verb}") for verb in ("create", "update", "delete"))
    assert (create.actor, create.source, create.object_id) == (admin_user, "admin", str(artist.pk))
    assert (create.before, create.after["name"]) == (None, "Dora Explorer")
    assert (update.before["workflow"], update.after["workflow"]) == ("modeling", "lighting")
    assert (delete.object_repr, delete.before["name"], delete.after) == ("Dora Explorer", "Dora Explorer", None)


def test_saving_an_admin_form_unchanged_records_nothing(staff_client, admin_user):
    model = GpuModel.objects.get(name="Tesla T4")

    response = staff_client.post(f"/admin/fleet/gpumodel/{model.pk}/change/", admin_form_data(GpuModel, admin_user,
                                                                                              model))

    assert response.status_code == 302, response.content
    assert not AuditEvent.objects.exists()


def test_admin_catalog_change_is_recorded_as_gpu_model_update(staff_client, admin_user):
    model = GpuModel.objects.get(name="Tesla T4")

    response = staff_client.post(f"/admin/fleet/gpumodel/{model.pk}/change/",
                                 admin_form_data(GpuModel, admin_user, model, name="Tesla T4 (studio B)"))

    assert response.status_code == 302, response.content
    event = only("gpu_model.update")
    assert (event.object_type, event.source) == ("gpu_model", "admin")
    assert (event.before["name"], event.after["name"]) == ("Tesla T4", "Tesla T4 (studio B)")


def test_bulk_delete_in_the_admin_writes_one_event_per_row(staff_client):
    boards = [GpuModel.objects.create(name=f"Spare board {i}", code=f"SPARE{i}", fb_mib=16384) for i in range(3)]

    response = staff_client.post("/admin/fleet/gpumodel/", {
        "action": "delete_selected", "post": "yes", "_selected_action": [b.pk for b in boards]})

    assert response.status_code == 302
    # object_id is text: ordered by its number, so ids 9 and 10 do not swap.
    events = sorted(AuditEvent.objects.filter(action="gpu_model.delete"), key=lambda e: int(e.object_id))
    assert [(e.object_id, e.before["name"], e.actor_name) for e in events] == [
        (str(b.pk), b.name, "admin") for b in boards]


def test_deleting_a_host_in_the_admin_is_recorded(staff_client):
    host = HostFactory(name="retired-01")

    response = staff_client.post(f"/admin/fleet/host/{host.pk}/delete/", {"post": "yes"})

    assert response.status_code == 302
    assert not Host.objects.filter(pk=host.pk).exists()
    event = only("host.delete")
    assert (event.object_id, event.object_repr, event.before["cpu_threads"]) == (str(host.pk), "retired-01", 72)


def test_removing_a_vgpu_in_the_admin_is_recorded_once(staff_client):
    vgpu = services.place_vgpu(VirtualMachineFactory(name="ws-admin"), GpuFactory(), profile("RTX6000-12Q"))

    response = staff_client.post(f"/admin/fleet/vgpu/{vgpu.pk}/delete/", {"post": "yes"})

    assert response.status_code == 302
    assert only("vgpu.remove").before["vm_id"] == vgpu.vm_id


# Sizing -------------------------------------------------------------------------------------


def test_preset_change_through_the_admin_list_and_the_api_is_recorded(staff_client, admin_api, admin_user):
    preset = WorkflowPreset.objects.get(workflow="modeling")
    rows = list(WorkflowPreset.objects.order_by("workflow"))
    form = {"form-TOTAL_FORMS": len(rows), "form-INITIAL_FORMS": len(rows), "_save": "Save"}
    for i, row in enumerate(rows):
        form.update({f"form-{i}-id": row.pk, f"form-{i}-fb_mib": row.fb_mib, f"form-{i}-series": row.series,
                     f"form-{i}-vgpus": row.vgpus, f"form-{i}-vcpus": row.vcpus, f"form-{i}-ram_gib": row.ram_gib,
                     f"form-{i}-note": row.note})
        if row.pk == preset.pk:
            form[f"form-{i}-vcpus"] = 12

    response = staff_client.post("/admin/sizing/workflowpreset/", form)
    assert response.status_code == 302, response.content
    api = admin_api.patch(f"/api/v1/workflow-presets/{preset.pk}/", {"ram_gib": 48}, format="json")
    assert api.status_code == 200, api.content

    page, by_api = AuditEvent.objects.filter(action="workflow_preset.update").order_by("id")
    assert (page.source, page.actor, page.object_repr) == ("admin", admin_user, str(preset))
    assert (page.before["vcpus"], page.after["vcpus"]) == (8, 12)
    assert (by_api.source, by_api.before["ram_gib"], by_api.after["ram_gib"]) == ("api", 32, 48)


@pytest.fixture
def suggestions(artist):
    world = rtx_studio(artist=artist)
    two_weeks_of_use(world)
    refresh_suggestions(now=NOW)
    world.heavy_s, world.light_s = (Suggestion.objects.get(vm=vm) for vm in (world.heavy, world.light))
    return world


def test_accepting_a_suggestion_records_the_accept_and_the_request_it_filed(admin_api, admin_user, suggestions):
    heavy = suggestions.heavy_s

    response = admin_api.post(f"/api/v1/suggestions/{heavy.pk}/accept/", {"evidence_key": heavy.evidence_key})

    assert response.status_code == 201, response.content
    filed = ResizeRequest.objects.get()
    accept, file = only("suggestion.accept"), only("resize_request.file")
    assert (accept.actor, accept.source, accept.comment) == (admin_user, "api", f"filed resize request #{filed.pk}")
    assert (accept.before["resize_request_id"], accept.after["resize_request_id"]) == (None, filed.pk)
    assert (file.object_id, file.after["vm_id"], file.after["status"]) == (str(filed.pk), heavy.vm_id, "pending")


def test_dismissing_and_restoring_on_the_page_are_recorded(staff_client, admin_user, suggestions):
    light = suggestions.light_s

    staff_client.post(f"/sizing/suggestions/{light.pk}/dismiss/", {"evidence_key": light.evidence_key})
    staff_client.post(f"/sizing/suggestions/{light.pk}/restore/")
    staff_client.post(f"/sizing/suggestions/{light.pk}/restore/")  # not dismissed any more: no event

    dismiss, restore = only("suggestion.dismiss"), only("suggestion.restore")
    assert (dismiss.source, dismiss.actor) == ("web", admin_user)
    assert (dismiss.before["dismissed_key"], dismiss.after["dismissed_key"]) == ("", light.evidence_key)
    assert dismiss.after["dismissed_by_id"] == admin_user.pk
    assert (restore.before["dismissed_key"], restore.after["dismissed_key"]) == (light.evidence_key, "")
    assert "evidence" not in dismiss.after  # the figures are recomputed hourly: not copied into the log


def test_optimizer_start_and_apply_are_recorded_with_the_requests_they_approve(admin_user, monkeypatch):
    monkeypatch.setattr(optimizer_runs, "enqueue", lambda run_id: None)
    world = fleet_with_request(admin_user)

    with audit.acting_as(admin_user, "web"):
        run = optimizer_runs.start_run(admin_user)
    assert tasks.run_optimizer(run.pk) == OptimizerStatus.DONE
    run.refresh_from_db()
    with audit.acting_as(admin_user, "web"):
        optimizer_runs.apply_run(run, admin_user)

    start, apply, approve = only("optimizer_run.start"), only("optimizer_run.apply"), only("resize_request.approve")
    assert (start.actor, start.after["status"], start.object_id) == (admin_user, "pending", str(run.pk))
    assert "1 pending change(s)" in start.comment
    assert (apply.before["status"], apply.after["status"]) == ("done", "applied")
    assert apply.after["applied_by_id"] == admin_user.pk
    assert (approve.object_id, approve.before["status"], approve.after["status"]) == (
        str(world.request.pk), "pending", "approved")
    assert approve.comment == f"Applied by optimizer run #{run.pk}"
    assert AuditEvent.objects.filter(action="vgpu.place", at__gte=apply.at - timedelta(minutes=1)).exists()


# History boxes ------------------------------------------------------------------------------


def history_rows(body: str) -> list[str]:
    start = body.index('data-section="history"')
    return body[start:body.index("</section>", start)]


def test_vm_page_history_lists_its_changes_vgpus_and_requests_with_a_link_to_all(staff_client, admin_user):
    vm = VirtualMachineFactory(name="ws-hist", vcpus=8)
    gpu = GpuFactory()
    with audit.acting_as(admin_user, "web"):
        services.update_vm(vm, vcpus=16)
        vgpu = services.place_vgpu(vm, gpu, profile("RTX6000-12Q"))
        services.remove_vgpu(vgpu)
    ResizeRequest.objects.create(vm=vm, current_profile=profile("RTX6000-12Q"),
                                 requested_profile=profile("RTX6000-24Q"), requested_vgpus=1, reason="bigger")
    audit.record("resize_request.file", ResizeRequest.objects.get(), after=audit.snapshot(ResizeRequest.objects.get()))
    other = services.place_vgpu(VirtualMachineFactory(name="ws-other"), gpu, profile("RTX6000-12Q"))

    box = history_rows(staff_client.get(f"/vms/{vm.pk}/").content.decode())

    for action in ("vm.update", "vgpu.place", "vgpu.remove", "resize_request.file"):
        assert f"<code>{action}</code>" in box
    assert box.count("<tr data-event=") == 4  # not ws-other's placement
    assert f'data-event="{AuditEvent.objects.get(object_type="vgpu", object_id=str(other.pk)).pk}"' not in box
    assert "vcpus: 8 -&gt; 16" in box
    assert "admin" in box
    assert f'href="/audit/?object_type=vm&amp;object_id={vm.pk}"' in box


def test_vm_history_shows_the_last_ten_events_newest_first(staff_client):
    vm = VirtualMachineFactory(name="ws-busy", vcpus=1)
    for vcpus in range(2, 15):
        services.update_vm(vm, vcpus=vcpus)

    box = history_rows(staff_client.get(f"/vms/{vm.pk}/").content.decode())

    assert box.count("<tr data-event=") == 10
    assert box.index("vcpus: 13 -&gt; 14") < box.index("vcpus: 12 -&gt; 13")
    assert "vcpus: 3 -&gt; 4" not in box


def test_gpu_and_host_pages_show_their_history(staff_client, admin_user):
    host = HostFactory(name="render-hist")
    gpu = GpuFactory(host=host)
    old_bus = gpu.pci_bus_id
    with audit.acting_as(admin_user, "admin"):
        services.update_host(host, ram_gib=1024)
        services.update_gpu(gpu, pci_bus_id="00000000:D8:00.0")
        services.place_vgpu(VirtualMachineFactory(name="ws-on-gpu"), gpu, profile("RTX6000-12Q"))

    host_box = history_rows(staff_client.get(f"/hosts/{host.pk}/").content.decode())
    gpu_box = history_rows(staff_client.get(f"/gpus/{gpu.pk}/").content.decode())

    assert "<code>host.update</code>" in host_box
    assert "ram_gib: 768 -&gt; 1024" in host_box
    assert "<code>gpu.update</code>" not in host_box
    assert "<code>gpu.update</code>" in gpu_box
    assert "<code>vgpu.place</code>" in gpu_box
    assert f"pci_bus_id: {old_bus} -&gt; 00000000:D8:00.0" in gpu_box
    assert f"/audit/?object_type=gpu&amp;object_id={gpu.pk}" in gpu_box


def test_an_object_without_events_says_so(staff_client):
    host = HostFactory(name="quiet-01")

    box = history_rows(staff_client.get(f"/hosts/{host.pk}/").content.decode())

    assert "No changes recorded yet." in box


def test_artists_see_no_history_on_their_own_vm(client, artist):
    vm = VirtualMachineFactory(name="ws-mine", artist=artist)
    services.update_vm(vm, vcpus=12)
    client.force_login(artist.user)

    body = client.get(f"/vms/{vm.pk}/").content.decode()

    assert "ws-mine" in body
    assert 'data-section="history"' not in body
    assert "vm.update" not in body


# Retention ----------------------------------------------------------------------------------


def old_and_new_events() -> tuple[AuditEvent, AuditEvent]:
    old = audit.record("fleet.note", object_type="fleet", object_repr="old")
    new = audit.record("fleet.note", object_type="fleet", object_repr="new")
    AuditEvent.objects.filter(pk=old.pk).update(at=timezone.now() - timedelta(days=400))
    AuditEvent.objects.filter(pk=new.pk).update(at=timezone.now() - timedelta(days=10))
    return old, new


def test_audit_events_are_kept_forever_by_default(settings):
    assert settings.AUDIT_RETENTION_DAYS == 0
    old_and_new_events()

    assert prune_samples()["audit_events"] == 0

    assert AuditEvent.objects.count() == 2


def test_audit_events_older_than_the_retention_are_pruned(settings):
    settings.AUDIT_RETENTION_DAYS = 365
    old, new = old_and_new_events()

    assert prune_samples()["audit_events"] == 1

    assert list(AuditEvent.objects.values_list("pk", flat=True)) == [new.pk]


def test_the_audit_page_says_how_long_events_are_kept(settings, admin_client):
    assert "Events are kept forever" in admin_client.get("/audit/").content.decode()
    settings.AUDIT_RETENTION_DAYS = 365
    assert "Events are kept 365 days" in admin_client.get("/audit/").content.decode()


# Summaries ----------------------------------------------------------------------------------


@pytest.mark.parametrize(("before", "after", "expected"), [
    (None, {"name": "a"}, "created"),
    ({"name": "a"}, None, "deleted"),
    ({"name": "a", "vcpus": 8}, {"name": "b", "vcpus": 8}, "name: a -> b"),
    ({"a": 1, "b": 1, "c": 1, "d": 1, "e": 1, "f": 1}, {"a": 2, "b": 2, "c": 2, "d": 2, "e": 2, "f": 2},
     "a: 1 -> 2; b: 1 -> 2; c: 1 -> 2; d: 1 -> 2; 2 more"),
    ({"host_id": 3}, {"host_id": None}, "host_id: 3 -> -"),
])
def test_summary_names_what_changed(before, after, expected):
    assert audit.summary(before, after) == expected

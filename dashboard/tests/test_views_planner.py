"""The density planner page (/sizing/planner/): what an admin reads there.

The first view is the sizing guide's answer; a submitted mix is a link; bad input comes back
with each message next to its field and everything typed kept; "From measurements" lists how
each VM was planned; presets are shown with where to edit them; roles; fixed query counts.
"""

from __future__ import annotations

from urllib.parse import urlencode

from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.urls import reverse

from dashboard.tests.test_views_overview import attr, find, one, text
from fleet.tests.factories import gpu_model, profile
from sizing.models import WorkflowPreset
from sizing.tests.planner_world import measured_fleet, more_vms

PLANNER = reverse("sizing:planner")


def query(rows: list[dict], blank: int = 0, **server) -> str:
    """The planner's GET query for a server (the guide's unless overridden) and artist rows."""
    data = {"gpu_model": gpu_model("Quadro RTX 6000").pk, "gpus": 3, "cpu_threads": 72, "ram_gib": 384,
            "vcpu_overcommit": 1, "ram_overcommit": 1, "size_mode": "equal", **server,
            "artists-TOTAL_FORMS": len(rows) + blank, "artists-INITIAL_FORMS": 0}
    for index, row in enumerate(rows):
        data.update({f"artists-{index}-{key}": value for key, value in row.items()})
    return f"{PLANNER}?{urlencode(data, doseq=True)}"


def get(client, url: str = PLANNER, status: int = 200) -> str:
    response = client.get(url)
    assert response.status_code == status, response.content.decode()[:2000]
    return response.content.decode()


def drawing(html: str) -> list[list[list[str]]]:
    """server -> GPU -> profiles of its blocks, as drawn."""
    return [
        [[attr(block, "data-profile") for block in find(str(gpu), class_="vgpu")]
         for gpu in find(str(server), data_gpu=True)]
        for server in find(html, data_server=True)
    ]


def figure(html: str, name: str) -> str:
    return text(one(str(one(html, data_figure=name)), data_value=True))


def field_errors(html: str) -> list[str]:
    return [text(error) for error in find(html, class_="field-error")]


# First view: the sizing guide ----------------------------------------------------------------


def test_the_first_view_is_the_sizing_guides_server_and_its_answer(staff):
    html = get(staff)

    assert figure(html, "servers") == "1"
    assert figure(html, "lower-bound") == "1"
    assert find(html, data_optimal=True)
    assert figure(html, "artists-per-server") == "4.0"
    assert drawing(html) == [[["RTX6000-12Q", "RTX6000-12Q"], ["RTX6000-24Q"], ["RTX6000-24Q"]]]
    labels = [text(block) for block in find(html, class_="vgpu-label")]
    assert labels == ["Modeling", "Shading", "Animation", "Lighting"]
    selected = one(html, id="id_gpu_model")
    assert [text(option) for option in find(str(selected), selected=True)] == ["Quadro RTX 6000"]
    assert attr(one(html, id="id_gpus"), "value") == "3"
    assert attr(one(html, id="id_cpu_threads"), "value") == "72"
    assert "vCPUs 44 / 72" in html
    assert "RAM 192 / 384 GiB" in html


def test_the_presets_table_shows_each_preset_on_the_board_with_an_edit_link(staff):
    html = get(staff)

    modeling = one(html, data_workflow="modeling")
    assert "RTX6000-12Q" in text(modeling)
    preset = WorkflowPreset.objects.get(workflow="modeling")
    assert find(str(modeling), href=reverse("admin:sizing_workflowpreset_change", args=[preset.pk]))
    assert len(find(html, data_workflow=True)) == 10
    assert find(html, href=reverse("admin:sizing_workflowpreset_changelist"))


def test_an_admin_edits_presets_in_the_admin_site_and_the_planner_follows(staff):
    preset = WorkflowPreset.objects.get(workflow="modeling")
    changelist = reverse("admin:sizing_workflowpreset_changelist")
    assert staff.get(changelist).status_code == 200
    change = reverse("admin:sizing_workflowpreset_change", args=[preset.pk])
    response = staff.post(change, {"fb_mib": 24576, "series": "Q", "vgpus": 1, "vcpus": 8, "ram_gib": 32,
                                    "note": "Bigger scenes"})
    assert response.status_code == 302

    html = get(staff)

    # Modeling now takes a whole GPU: with animation and lighting that fills the first server.
    assert figure(html, "servers") == "2"
    assert drawing(html) == [[["RTX6000-24Q"], ["RTX6000-24Q"], ["RTX6000-24Q"]], [["RTX6000-12Q"], [], []]]
    assert "RTX6000-24Q" in text(one(html, data_workflow="modeling"))


def test_the_admin_site_adds_presets_only_for_workflows_without_one(staff):
    add = reverse("admin:sizing_workflowpreset_add")
    assert staff.get(add).status_code == 403
    WorkflowPreset.objects.filter(workflow="fx").delete()
    response = staff.post(add, {"workflow": "fx", "fb_mib": 16384, "series": "Q", "vgpus": 1, "vcpus": 16,
                                "ram_gib": 64, "note": ""})
    assert response.status_code == 302
    assert WorkflowPreset.objects.get(workflow="fx").fb_mib == 16384
    preset = WorkflowPreset.objects.get(workflow="fx")
    assert staff.post(reverse("admin:sizing_workflowpreset_delete", args=[preset.pk]), {"post": "yes"}).status_code \
        == 403


def test_the_admin_site_refuses_a_preset_smaller_than_any_profile(staff):
    preset = WorkflowPreset.objects.get(workflow="modeling")
    response = staff.post(reverse("admin:sizing_workflowpreset_change", args=[preset.pk]),
                          {"fb_mib": 100, "series": "Q", "vgpus": 1, "vcpus": 8, "ram_gib": 32, "note": ""})
    assert response.status_code == 200
    assert "greater than or equal to 1024" in response.content.decode()
    preset.refresh_from_db()
    assert preset.fb_mib == 12288


# A submitted mix ----------------------------------------------------------------------------


def test_a_submitted_mix_is_planned_and_drawn(staff):
    url = query([{"demand": "workflow:modeling", "count": 12}], cpu_threads=512, ram_gib=4096)
    html = get(staff, url)

    assert figure(html, "servers") == "2"
    # Both servers hold six modelers: drawn once, with their count.
    server = one(html, data_server="1")
    assert attr(server, "data-count") == "2"
    assert "Servers 1–2" in text(server)
    assert drawing(html) == [[["RTX6000-12Q"] * 2] * 3]


def test_explicit_profile_rows_and_overrides_reach_the_plan(staff):
    url = query([{"demand": f"profile:{profile('RTX6000-8Q').pk}", "count": 3, "vcpus": 4, "label": "Juniors"}])
    html = get(staff, url)

    assert drawing(html) == [[["RTX6000-8Q"] * 3, [], []]]
    assert [text(block) for block in find(html, class_="vgpu-label")] == ["Juniors #1", "Juniors #2", "Juniors #3"]
    assert "vCPUs 12 / 72" in html


def test_artists_no_server_can_take_are_named_with_the_reason(staff):
    html = get(staff, query([{"demand": "workflow:lighting", "count": 2, "vgpus": 4},
                             {"demand": "workflow:modeling", "count": 1}]))

    unplaced = one(html, data_unplaced="vm_gpus")
    assert "2 × Lighting" in text(unplaced)
    assert "a server has 3 GPUs" in text(unplaced)
    assert figure(html, "servers") == "1"


def test_add_row_adds_a_blank_row_and_keeps_what_was_typed(staff):
    url = query([{"demand": "workflow:animation", "count": 5}], blank=1) + "&add_row=1"
    html = get(staff, url)

    assert len(find(html, data_row=True)) == 3
    assert attr(one(html, name="artists-0-count"), "value") == "5"
    assert attr(one(html, name="artists-TOTAL_FORMS"), "value") == "3"
    assert figure(html, "servers") == "2"  # five 24Q on 3-GPU servers


# Bad input ---------------------------------------------------------------------------------


def test_bad_input_comes_back_with_messages_next_to_the_fields_and_nothing_lost(staff):
    url = query([
        {"demand": "workflow:modeling", "count": 0},
        {"demand": f"profile:{profile('T4-4Q').pk}", "count": 2},
        {"demand": "", "count": 3},
        {"demand": "workflow:animation", "count": 1, "vgpus": 9},
    ], gpus=40, size_mode="mixed")
    html = get(staff, url, status=400)

    assert one(html, role="alert")
    assert not find(html, data_section="result")
    gpus = one(html, data_field="gpus")
    assert "less than or equal to 16" in text(gpus)
    assert attr(one(str(gpus), name="gpus"), "value") == "40"
    assert "Quadro RTX 6000 does not support mixed-size mode" in text(one(html, data_field="size_mode"))
    assert field_errors(html)[2:] == [
        "Ensure this value is greater than or equal to 1.",
        "T4-4Q is a profile of Tesla T4 GPUs; this server has Quadro RTX 6000 GPUs. Choose a Quadro RTX 6000 "
        "profile or a workflow.",
        "Choose a workflow or a profile for this row.",
        "Ensure this value is less than or equal to 4.",
    ]
    assert attr(one(html, name="artists-3-vgpus"), "value") == "9"
    assert attr(one(html, name="artists-2-count"), "value") == "3"


def test_a_mix_without_rows_asks_for_one(staff):
    html = get(staff, query([], blank=2), status=400)
    assert "Add at least one artist row, or plan From measurements." in text(one(html, role="alert"))


def test_more_than_ten_thousand_artists_are_refused(staff):
    html = get(staff, query([{"demand": "workflow:modeling", "count": 6000}] * 2), status=400)
    assert "At most 10,000 artists in one plan; these rows ask for 12,000." in text(one(html, role="alert"))


def test_a_damaged_form_is_a_400_not_an_error_page(staff):
    html = get(staff, f"{PLANNER}?gpu_model=abc&artists-TOTAL_FORMS=x", status=400)
    assert one(html, role="alert")


# From measurements ---------------------------------------------------------------------------


def test_from_measurements_lists_how_each_vm_was_planned(staff, db):
    fleet = measured_fleet()
    html = get(staff, query([], from_measurements="on", hosts=[fleet.host_a.pk]))

    rows = find(html, data_table="measured")[0]
    vms = [text(row) for row in find(str(rows), data_vm=True)]
    # Suggested resizes first, then by name; only host-a's VMs.
    assert [row.split()[0] for row in vms] == ["ws-down", "ws-dismissed", "ws-keep"]
    assert "suggested 1 × RTX6000-8Q" in vms[0]
    assert "dismissed" in vms[1]
    # GPUs in the order of the VMs' names; ws-down's 8Q cannot share an equal-size GPU with a 12Q.
    assert drawing(html) == [[["RTX6000-12Q"], ["RTX6000-8Q"], ["RTX6000-24Q"]]]
    assert [text(block) for block in find(html, class_="vgpu-label")] == ["ws-dismissed", "ws-down", "ws-keep"]


def test_hosts_without_from_measurements_are_an_error_on_the_field(staff, db):
    fleet = measured_fleet()
    html = get(staff, query([{"demand": "workflow:modeling", "count": 1}], hosts=[fleet.host_a.pk]), status=400)
    assert "Hosts choose VMs only in From measurements mode." in text(one(html, data_field="hosts"))


def test_from_measurements_with_too_many_vms_asks_to_choose_hosts(staff, db, monkeypatch):
    measured_fleet()
    monkeypatch.setattr("sizing.planner.MAX_ARTISTS", 4)
    html = get(staff, query([], from_measurements="on"), status=400)
    assert "one plan takes at most 4: choose some hosts" in text(one(html, data_field="hosts"))
    assert not find(html, data_section="result")


def test_from_measurements_with_no_vm_says_there_is_nothing_to_plan(staff):
    html = get(staff, query([], from_measurements="on"))
    assert figure(html, "servers") == "0"
    assert "Nothing to plan" in html


# Roles -----------------------------------------------------------------------------------


def test_anonymous_visitors_are_sent_to_the_login_page(client, db):
    response = client.get(PLANNER)
    assert response.status_code == 302
    assert response["Location"].startswith(reverse("login"))


def test_artists_get_403(client, artist):
    client.force_login(artist.user)
    assert client.get(PLANNER).status_code == 403


# Query counts ------------------------------------------------------------------------------


def _count(client, url: str) -> int:
    with CaptureQueriesContext(connection) as queries:
        get(client, url)
    return len(queries)


def test_the_page_costs_the_same_queries_for_2_and_12_rows(staff, django_assert_num_queries):
    workflows = ["modeling", "shading", "animation", "lighting", "layout", "fx", "texturing", "rendering",
                 "compositing", "other"]
    rows = [{"demand": f"workflow:{w}", "count": 2} for w in workflows]
    rows += [{"demand": f"profile:{profile(name).pk}", "count": 1} for name in ("RTX6000-4Q", "RTX6000-6Q")]

    small, large = query(rows[:2]), query(rows)
    # session, user, GPU models, profiles, presets, hosts, the navigation badges
    with django_assert_num_queries(7):
        get(staff, small)
    assert _count(staff, large) == 7


def test_the_page_from_measurements_costs_the_same_queries_for_2_and_12_vms(staff, django_assert_num_queries):
    url = query([], from_measurements="on")
    more_vms("few", 2)
    # session, user, GPU models, profiles, presets, hosts, vGPUs, the catalog, VMs with suggestions,
    # the navigation badges
    with django_assert_num_queries(10):
        get(staff, url)
    more_vms("many", 10)
    html = get(staff, url)
    assert len(find(html, data_vm=True)) == 12
    assert _count(staff, url) == 10


def test_vcpus_and_ram_can_come_from_the_fleets_measurements(staff, db):
    from fleet.tests.factories import ArtistFactory
    from sizing.models import SuggestionAction
    from sizing.tests.planner_world import suggest

    fleet = measured_fleet()
    vm = fleet.vms["ws-keep"]
    vm.artist = ArtistFactory(name="Ana", workflow="animation")
    vm.save()
    suggest(vm, SuggestionAction.KEEP, cpu_action="downsize", suggested_vcpus=6, ram_action="downsize",
            suggested_ram_gib=24)

    offered = get(staff)
    html = get(staff, query([{"demand": "workflow:animation", "count": 1}], measured_cpu_ram="on"))

    assert 'name="measured_cpu_ram"' in offered
    assert "checked" in dict(one(html, name="measured_cpu_ram").attributes)
    assert "vCPUs and RAM measured on 1 VM(s) of the fleet" in text(html)

"""POST /api/v1/sizing/plan/ and /api/v1/workflow-presets/: the contract's fields, the sizing
guide's answer, "from measurements", every kind of bad input (400 with field messages), roles,
and the number of queries (the same for 2 rows or VMs as for 12)."""

from __future__ import annotations

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from fleet.tests.factories import ArtistFactory, gpu_model, profile
from sizing.models import SuggestionAction, WorkflowPreset
from sizing.tests.planner_world import GUIDE_WORKFLOWS, guide_server, measured_fleet, more_vms, suggest

PLAN = "/api/v1/sizing/plan/"
PRESETS = "/api/v1/workflow-presets/"


def plan(client, body: dict, status: int = 200) -> dict:
    response = client.post(PLAN, body, format="json")
    assert response.status_code == status, response.content
    return response.json()


def guide_body(**server) -> dict:
    return {"server": guide_server(**server), "artists": [{"workflow": w, "count": 1} for w in GUIDE_WORKFLOWS]}


def layout_names(body: dict) -> list[list[list[str]]]:
    return [[[v["profile"] for v in gpu["vgpus"]] for gpu in server["gpus"]] for server in body["layout"]]


# The contract ------------------------------------------------------------------------------


def test_the_sizing_guides_mix_needs_one_server_laid_out_as_the_guide_says(admin_api):
    body = plan(admin_api, guide_body())

    assert body["servers"] == 1
    assert body["unplaced"] == []
    assert layout_names(body) == [[["RTX6000-12Q", "RTX6000-12Q"], ["RTX6000-24Q"], ["RTX6000-24Q"]]]
    gpus = body["layout"][0]["gpus"]
    assert [(v["workflow"], v["artist"]) for v in gpus[0]["vgpus"]] == [
        ("modeling", "Modeling"), ("shading", "Shading")]
    assert [v["workflow"] for v in gpus[1]["vgpus"] + gpus[2]["vgpus"]] == ["animation", "lighting"]
    assert gpus[0]["vgpus"][0]["profile_id"] == profile("RTX6000-12Q").pk
    assert [gpu["fb_used_mib"] for gpu in gpus] == [24576, 24576, 24576]
    server = body["layout"][0]
    assert (server["server"], server["artists"], server["vcpus_used"], server["vcpu_capacity"]) == (1, 4, 44, 72)
    assert (server["ram_gib_used"], server["ram_capacity_gib"]) == (192, 384)
    assert (body["lower_bound_servers"], body["optimal"], body["artists_per_server"]) == (1, True, 4.0)
    assert body["lower_bounds"] == {"gpus": 1, "vcpus": 1, "ram": 1}
    assert body["usage_pct"]["gpus"] == 100.0
    assert body["server"] == {"gpu_model": "Quadro RTX 6000", "fb_per_gpu_mib": 24576, "gpus": 3,
                              "vcpu_capacity": 72, "ram_capacity_gib": 384, "size_mode": "equal"}
    assert [d["profile"] for d in body["demands"]] == ["RTX6000-12Q", "RTX6000-12Q", "RTX6000-24Q", "RTX6000-24Q"]
    assert body["planned_with"] is None


def test_presets_are_translated_to_the_servers_board(admin_api):
    body = plan(admin_api, {
        "server": {"gpu_model": gpu_model("NVIDIA A16").pk, "gpus": 8, "cpu_threads": 128, "ram_gib": 1024},
        "artists": [{"workflow": "modeling", "count": 3}],
    })

    # A16 GPUs (16 GB) have no 12Q: the modeling preset takes the next size, one per GPU.
    assert body["demands"][0]["profile"] == "A16-16Q"
    assert "A16-16Q" in body["demands"][0]["note"]
    assert [len(gpu["vgpus"]) for gpu in body["layout"][0]["gpus"]] == [1, 1, 1, 0, 0, 0, 0, 0]


def test_explicit_profiles_and_overrides_are_planned_as_given(admin_api):
    body = plan(admin_api, {
        "server": {"gpu_model": gpu_model("NVIDIA L40S").pk, "gpus": 3, "cpu_threads": 64, "ram_gib": 512},
        "artists": [{"profile": profile("L40S-8Q").pk, "count": 6, "vcpus": 4, "ram_gib": 16, "label": "Juniors"},
                    {"workflow": "lighting", "count": 1, "vgpus": 2, "vcpus": 20}],
    })

    assert body["servers"] == 1
    assert layout_names(body) == [[["L40S-8Q"] * 6, ["L40S-24Q"], ["L40S-24Q"]]]
    gpus = body["layout"][0]["gpus"]
    assert {v["artist"] for v in gpus[0]["vgpus"]} == {"Juniors"}
    assert [v["artist_number"] for v in gpus[0]["vgpus"]] == [1, 2, 3, 4, 5, 6]
    assert (body["layout"][0]["vcpus_used"], body["layout"][0]["ram_gib_used"]) == (6 * 4 + 20, 6 * 16 + 64)
    lighting = gpus[1]["vgpus"] + gpus[2]["vgpus"]
    assert {v["workflow"] for v in lighting} == {"lighting"}
    assert len({v["vm"] for v in lighting}) == 1  # one VM with two vGPUs


def test_artists_no_server_can_take_are_listed_with_the_rule(admin_api):
    body = plan(admin_api, {"server": guide_server(), "artists": [
        {"workflow": "lighting", "count": 2, "vgpus": 4}, {"workflow": "modeling", "count": 1}]})

    assert body["servers"] == 1
    assert body["unplaced"] == [{
        "artist": "Lighting", "workflow": "lighting", "count": 2, "rule": "vm_gpus",
        "reason": "Lighting needs 4 vGPUs, each on a GPU of its own in one server; a server has 3 GPUs",
    }]


def test_edited_presets_change_the_plan(admin_api):
    response = admin_api.patch(f"{PRESETS}{WorkflowPreset.objects.get(workflow='modeling').pk}/",
                               {"fb_mib": 24576}, format="json")
    assert response.status_code == 200, response.content

    body = plan(admin_api, {"server": guide_server(), "artists": [{"workflow": "modeling", "count": 2}]})

    assert layout_names(body) == [[["RTX6000-24Q"], ["RTX6000-24Q"], []]]


# From measurements ---------------------------------------------------------------------------


@pytest.fixture
def measured(db):
    return measured_fleet()


def test_from_measurements_plans_each_vm_with_its_suggested_or_current_profile(admin_api, measured):
    body = plan(admin_api, {"server": {"gpu_model": gpu_model("NVIDIA L40S").pk, "gpus": 2, "cpu_threads": 64,
                                       "ram_gib": 512}, "from_measurements": True})

    by_vm = {row["vm_name"]: row for row in body["planned_with"]}
    assert sorted(by_vm) == ["ws-dismissed", "ws-down", "ws-heavy", "ws-keep", "ws-new"]  # not ws-idle
    assert (by_vm["ws-down"]["source"], by_vm["ws-down"]["source_profile"], by_vm["ws-down"]["planned_profile"]) == (
        "suggested", "RTX6000-8Q", "L40S-8Q")
    assert "downsize suggested" in by_vm["ws-down"]["reason"]
    assert (by_vm["ws-dismissed"]["source"], by_vm["ws-dismissed"]["planned_profile"]) == ("current", "L40S-12Q")
    assert "dismissed" in by_vm["ws-dismissed"]["reason"]
    assert (by_vm["ws-keep"]["source"], by_vm["ws-keep"]["reason"]) == ("current", "suggestion: keep")
    assert (by_vm["ws-new"]["source"], by_vm["ws-new"]["planned_profile"]) == ("current", "L40S-8Q")
    assert (by_vm["ws-heavy"]["source"], by_vm["ws-heavy"]["vgpus"]) == ("suggested", 2)
    assert by_vm["ws-heavy"]["vm"] == measured.vms["ws-heavy"].pk
    # The VMs' own vCPUs and RAM are planned: 6 + 8 + 12 + 4 + 16 vCPUs, 24 + 32 + 64 + 16 + 96 GiB.
    assert sum(s["vcpus_used"] for s in body["layout"]) == 46
    assert sum(s["ram_gib_used"] for s in body["layout"]) == 232
    heavy = [v for s in body["layout"] for g in s["gpus"] for v in g["vgpus"] if v["artist"] == "ws-heavy"]
    assert [v["profile"] for v in heavy] == ["L40S-24Q", "L40S-24Q"]


def test_vcpus_and_ram_from_measurements_replace_the_presets_by_workflow(admin_api, measured):
    """Four animators measured through the hypervisors, right-sized to 4, 6, 6 and 12 vCPUs and
    16, 24, 32 and 24 GiB: the animation row gets the 75th percentile (6 vCPUs, 24 GiB); the
    modeling row, with nobody measured, keeps its preset; a row's own value still wins."""
    animator = ArtistFactory(name="Ana", workflow="animation")
    sizes = (("ws-down", "downsize", 4, "downsize", 16), ("ws-keep", "keep", None, "downsize", 24),
             ("ws-heavy", "downsize", 6, "downsize", 32), ("ws-new", "upsize", 12, "keep", None))
    for name, cpu_action, vcpus, ram_action, ram_gib in sizes:
        vm = measured.vms[name]
        vm.artist = animator
        vm.vcpus = 6 if name == "ws-keep" else vm.vcpus
        vm.ram_gib = 24 if name == "ws-new" else vm.ram_gib
        vm.save()
        suggest(vm, SuggestionAction.KEEP, cpu_action=cpu_action, suggested_vcpus=vcpus, ram_action=ram_action,
                suggested_ram_gib=ram_gib)
    body = {"server": guide_server(), "artists": [{"workflow": "animation", "count": 2},
                                                  {"workflow": "modeling", "count": 1},
                                                  {"workflow": "animation", "count": 1, "vcpus": 16}]}
    preset = WorkflowPreset.objects.get(workflow="modeling")

    measured_plan = plan(admin_api, {**body, "measured_cpu_ram": True})
    presets_plan = plan(admin_api, body)

    animation, modeling, own = measured_plan["demands"]
    assert (animation["vcpus"], animation["ram_gib"]) == (6, 24)
    assert "vCPUs and RAM measured on 4 VM(s) of the fleet" in animation["note"]
    assert (modeling["vcpus"], modeling["ram_gib"]) == (preset.vcpus, preset.ram_gib)
    assert (own["vcpus"], own["ram_gib"]) == (16, 24)
    animation_preset = WorkflowPreset.objects.get(workflow="animation")
    assert (presets_plan["demands"][0]["vcpus"], presets_plan["demands"][0]["ram_gib"]) == (
        animation_preset.vcpus, animation_preset.ram_gib)


def test_from_measurements_plans_each_vm_with_its_right_sized_vcpus_and_ram_when_asked(admin_api, measured):
    suggest(measured.vms["ws-heavy"], SuggestionAction.UPSIZE, "RTX6000-24Q", vgpus=2, cpu_action="downsize",
            suggested_vcpus=8, ram_action="downsize", suggested_ram_gib=48)
    server = {"gpu_model": gpu_model("NVIDIA L40S").pk, "gpus": 2, "cpu_threads": 64, "ram_gib": 512}

    as_is = plan(admin_api, {"server": server, "from_measurements": True})
    right_sized = plan(admin_api, {"server": server, "from_measurements": True, "measured_cpu_ram": True})

    assert sum(s["vcpus_used"] for s in as_is["layout"]) == 46
    assert sum(s["vcpus_used"] for s in right_sized["layout"]) == 46 - 16 + 8
    assert sum(s["ram_gib_used"] for s in right_sized["layout"]) == 232 - 96 + 48


def test_from_measurements_can_be_limited_to_some_hosts(admin_api, measured):
    body = plan(admin_api, {"server": guide_server(), "from_measurements": True, "hosts": [measured.host_b.pk]})

    assert sorted(row["vm_name"] for row in body["planned_with"]) == ["ws-heavy", "ws-new"]
    assert body["artists_placed"] == 2


def test_from_measurements_with_an_empty_fleet_needs_no_server(admin_api, db):
    body = plan(admin_api, {"server": guide_server(), "from_measurements": True})
    assert (body["servers"], body["layout"], body["planned_with"]) == (0, [], [])


def test_from_measurements_refuses_more_vms_than_one_plan_takes(admin_api, measured, monkeypatch):
    monkeypatch.setattr("sizing.planner.MAX_ARTISTS", 4)
    errors = plan(admin_api, {"server": guide_server(), "from_measurements": True}, 400)
    assert errors == {"hosts": ["5 VMs hold vGPUs on these hosts; one plan takes at most 4: choose some hosts."]}
    body = plan(admin_api, {"server": guide_server(), "from_measurements": True, "hosts": [measured.host_a.pk]})
    assert body["artists_placed"] == 3


# Bad input -------------------------------------------------------------------------------


def _artist(**fields) -> dict:
    return {"workflow": "modeling", "count": 1, **fields}


@pytest.mark.parametrize(
    ("change", "path", "message"),
    [
        (lambda b: b["server"].update(gpu_model=999_999), ["server", "gpu_model"], "does not exist"),
        (lambda b: b["server"].update(gpus=0), ["server", "gpus"], "greater than or equal to 1"),
        (lambda b: b["server"].update(gpus=17), ["server", "gpus"], "less than or equal to 16"),
        (lambda b: b["server"].pop("cpu_threads"), ["server", "cpu_threads"], "required"),
        (lambda b: b["server"].update(ram_gib="lots"), ["server", "ram_gib"], "valid integer"),
        (lambda b: b["server"].update(vcpu_overcommit=0), ["server", "vcpu_overcommit"], "greater than or equal"),
        (lambda b: b["server"].update(size_mode="mixed"), ["server", "size_mode"],
         "Quadro RTX 6000 does not support mixed-size mode"),
        (lambda b: b["server"].update(size_mode="tetris"), ["server", "size_mode"], "not a valid choice"),
        (lambda b: b.update(artists=[_artist(workflow="juggling")]), ["artists", "0", "workflow"],
         "not a valid choice"),
        (lambda b: b.update(artists=[_artist(count=0)]), ["artists", "0", "count"], "greater than or equal to 1"),
        (lambda b: b.update(artists=[_artist(count=10_001)]), ["artists", "0", "count"], "less than or equal"),
        (lambda b: b.update(artists=[_artist(count=6000), _artist(count=6000)]), ["artists"],
         "At most 10,000 artists in one plan; these rows ask for 12,000."),
        (lambda b: b.update(artists=[_artist(vgpus=5)]), ["artists", "0", "vgpus"], "less than or equal to 4"),
        (lambda b: b.update(artists=[_artist(profile=profile("RTX6000-12Q").pk)]),
         ["artists", "0", "non_field_errors"], "Give either a workflow or a profile, not both."),
        (lambda b: b.update(artists=[{"count": 1}]), ["artists", "0", "non_field_errors"],
         "Give either a workflow or a profile, not both."),
        (lambda b: b.update(artists=[_artist(), {"profile": profile("L40S-12Q").pk, "count": 1}]),
         ["artists", "1", "profile"],
         "L40S-12Q is a profile of NVIDIA L40S GPUs; this server has Quadro RTX 6000 GPUs."),
        (lambda b: b.update(artists=[{"profile": 999_999, "count": 1}]), ["artists", "0", "profile"],
         "Unknown profile id 999999."),
        (lambda b: b.update(artists=[_artist()] * 101), ["artists", "non_field_errors"], "no more than 100"),
        (lambda b: b.update(artists=[]), ["artists"], "Give at least one artist row, or from_measurements."),
        (lambda b: b.pop("artists"), ["artists"], "Give at least one artist row, or from_measurements."),
        (lambda b: b.update(from_measurements=True), ["artists"], "Leave artists out with from_measurements"),
        (lambda b: b.update(hosts=[1]), ["hosts"], "only with from_measurements"),
        (lambda b: b.update(artists=[], from_measurements=True, hosts=[999_998, 999_999]), ["hosts"],
         "Unknown host ids: 999998, 999999."),
    ],
)
def test_bad_input_is_a_400_naming_the_field(admin_api, db, change, path, message):
    body = guide_body()
    change(body)

    errors = plan(admin_api, body, status=400)

    for key in path:
        errors = errors[key]
    assert any(message in error for error in errors), errors


def test_a_row_missing_its_preset_is_a_400(admin_api, db):
    WorkflowPreset.objects.filter(workflow="fx").delete()
    errors = plan(admin_api, {"server": guide_server(), "artists": [_artist(), {"workflow": "fx", "count": 1}]}, 400)
    assert errors == {"artists": {"1": {"workflow": ["No preset for fx: add one under workflow presets."]}}}


# Roles -----------------------------------------------------------------------------------


def test_anonymous_callers_are_asked_to_authenticate(api, db):
    assert api.post(PLAN, guide_body(), format="json").status_code == 401
    assert api.get(PRESETS).status_code == 401


def test_artists_may_neither_plan_nor_read_or_edit_presets(artist_api):
    preset = WorkflowPreset.objects.get(workflow="modeling")
    assert artist_api.post(PLAN, guide_body(), format="json").status_code == 403
    assert artist_api.get(PRESETS).status_code == 403
    assert artist_api.patch(f"{PRESETS}{preset.pk}/", {"vcpus": 64}, format="json").status_code == 403
    preset.refresh_from_db()
    assert preset.vcpus == 8


# Query counts ------------------------------------------------------------------------------


def _queries(client, body: dict) -> int:
    with CaptureQueriesContext(connection) as queries:
        plan(client, body)
    return len(queries)


def test_a_plan_costs_the_same_queries_for_2_and_12_rows(admin_api, django_assert_num_queries):
    rows = [{"workflow": w, "count": 1} for w in ("modeling", "shading", "animation", "lighting", "layout", "fx")]
    rows += [{"profile": profile(f"RTX6000-{size}").pk, "count": 2} for size in ("1Q", "2Q", "3Q", "4Q", "6Q", "8Q")]
    small = {"server": guide_server(), "artists": [rows[0], rows[6]]}
    large = {"server": guide_server(), "artists": rows}

    # GPU model, profiles named by rows, presets, the board's profiles.
    with django_assert_num_queries(4):
        plan(admin_api, small)
    assert _queries(admin_api, large) == 4


def test_a_plan_from_measurements_costs_the_same_queries_for_2_and_12_vms(admin_api, django_assert_num_queries):
    more_vms("few", 2)
    body = {"server": guide_server(), "from_measurements": True, "hosts": []}
    # GPU model, the board's profiles, vGPUs, the catalog, VMs with their suggestions.
    with django_assert_num_queries(5):
        plan(admin_api, body)
    more_vms("many", 10)
    assert len(plan(admin_api, body)["planned_with"]) == 12
    assert _queries(admin_api, body) == 5


# Workflow presets --------------------------------------------------------------------------


def test_presets_are_listed_in_pages_with_every_seeded_workflow(admin_api, django_assert_num_queries):
    with django_assert_num_queries(2):  # count, page
        body = admin_api.get(PRESETS).json()
    assert set(body) == {"count", "next", "previous", "results"}
    assert body["count"] == 10
    modeling = next(row for row in body["results"] if row["workflow"] == "modeling")
    assert (modeling["fb_mib"], modeling["series"], modeling["vgpus"], modeling["vcpus"], modeling["ram_gib"]) == (
        12288, "Q", 1, 8, 32)
    WorkflowPreset.objects.exclude(workflow__in=["modeling", "lighting"]).delete()
    with django_assert_num_queries(2):
        assert admin_api.get(PRESETS).json()["count"] == 2


def test_admins_edit_a_preset_but_not_its_workflow(admin_api, db):
    preset = WorkflowPreset.objects.get(workflow="lighting")
    response = admin_api.patch(f"{PRESETS}{preset.pk}/", {"vgpus": 2, "vcpus": 24, "workflow": "modeling"},
                               format="json")

    assert response.status_code == 200, response.content
    preset.refresh_from_db()
    assert (preset.workflow, preset.vgpus, preset.vcpus) == ("lighting", 2, 24)
    assert admin_api.get(f"{PRESETS}{preset.pk}/").json()["vgpus"] == 2


@pytest.mark.parametrize(
    ("change", "field"),
    [
        ({"fb_mib": 100}, "fb_mib"),
        ({"fb_mib": 200_000}, "fb_mib"),
        ({"series": "Z"}, "series"),
        ({"vgpus": 5}, "vgpus"),
        ({"vgpus": 0}, "vgpus"),
        ({"vcpus": 0}, "vcpus"),
        ({"ram_gib": -1}, "ram_gib"),
    ],
)
def test_a_bad_preset_change_is_a_400_and_changes_nothing(admin_api, db, change, field):
    preset = WorkflowPreset.objects.get(workflow="modeling")
    response = admin_api.patch(f"{PRESETS}{preset.pk}/", {"note": "changed", **change}, format="json")

    assert response.status_code == 400
    assert field in response.json()
    preset.refresh_from_db()
    assert (preset.fb_mib, preset.series, preset.vgpus, preset.vcpus, preset.ram_gib, preset.note) == (
        12288, "Q", 1, 8, 32, "Sizing guide: 12Q, half a Quadro RTX 6000")


def test_presets_are_neither_created_nor_deleted_through_the_api(admin_api, db):
    preset = WorkflowPreset.objects.get(workflow="modeling")
    assert admin_api.post(PRESETS, {"workflow": "fx", "fb_mib": 8192}, format="json").status_code == 405
    assert admin_api.delete(f"{PRESETS}{preset.pk}/").status_code == 405
    assert WorkflowPreset.objects.count() == 10

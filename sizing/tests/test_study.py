"""The proof-of-concept study (`sizing.study`): its figures are those of the rollups and ratings
of the chosen hosts and days, and its density is the planner's answer."""

from __future__ import annotations

from datetime import UTC, date, datetime, timedelta
from types import SimpleNamespace

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from fleet.models import VirtualMachine
from fleet.tests.factories import ArtistFactory, gpu_model
from sizing import planning, study
from sizing.models import Feedback
from sizing.tests.planner_world import measured_fleet
from telemetry.models import GuestRollup, VmRollup

pytestmark = pytest.mark.django_db

START, END = date(2026, 11, 1), date(2026, 11, 14)


def hour(day: date, h: int) -> datetime:
    return datetime(day.year, day.month, day.day, h, tzinfo=UTC)


def gpu_hour(vm, at, *, util_p95, fb_p95, profile_fb, enc_max=0.0):
    VmRollup.objects.create(vm=vm, step_s=3600, bucket=at, samples=60, util_gpu_p95=util_p95,
                            fb_used_mib_p95=fb_p95, profile_fb_mib=profile_fb, enc_util_max=enc_max)


def guest_hour(vm, at, *, vcpu_p95, busiest_p95, ram_p95, ram_mib, vcpus=8):
    GuestRollup.objects.create(vm=vm, step_s=3600, bucket=at, samples=60, vcpus=vcpus, ram_mib=ram_mib,
                               vcpu_util_p95=vcpu_p95, vcpu_max_util_p95=busiest_p95, ram_used_mib_p95=ram_p95)


def rate(vm, day, rating, tags):
    Feedback.objects.create(artist=vm.artist, vm=vm, host=vm.host, rating=rating, tags=tags, session_date=day)


def world() -> SimpleNamespace:
    """measured_fleet, with a modeler on ws-down and a lighter on ws-keep (both on host-a), and
    hours and ratings inside and outside the study's days."""
    fleet = measured_fleet()
    down, keep = fleet.vms["ws-down"], fleet.vms["ws-keep"]
    down.artist = ArtistFactory(name="Mo Modeler", workflow="modeling")
    keep.artist = ArtistFactory(name="Li Lighter", workflow="lighting")
    VirtualMachine.objects.bulk_update([down, keep], ["artist"])
    down.refresh_from_db()
    keep.refresh_from_db()
    # ws-down: 12 GiB profile; two hours in range, one before it (higher, must not count).
    gpu_hour(down, hour(START, 10), util_p95=40, fb_p95=3072, profile_fb=12288, enc_max=5)
    gpu_hour(down, hour(END, 23), util_p95=70, fb_p95=6144, profile_fb=12288, enc_max=12)
    gpu_hour(down, hour(START - timedelta(days=1), 10), util_p95=99, fb_p95=12288, profile_fb=12288, enc_max=90)
    guest_hour(down, hour(START, 10), vcpu_p95=30, busiest_p95=80, ram_p95=12288, ram_mib=24576)
    guest_hour(down, hour(END, 23), vcpu_p95=45, busiest_p95=60, ram_p95=6144, ram_mib=24576)
    # ws-keep: 24 GiB profile, one hour.
    gpu_hour(keep, hour(START, 12), util_p95=90, fb_p95=18432, profile_fb=24576, enc_max=30)
    guest_hour(keep, hour(START, 12), vcpu_p95=20, busiest_p95=95, ram_p95=16384, ram_mib=65536)
    rate(down, START, 4, ["fine"])
    rate(down, START + timedelta(days=1), 2, ["viewport_stutter"])
    rate(down, END + timedelta(days=1), 1, ["out_of_gpu_memory"])  # after the study
    rate(keep, START, 5, ["fine"])
    return SimpleNamespace(fleet=fleet, down=down, keep=keep)


def by_name(rows, attr="label"):
    return {getattr(row, attr): row for row in rows}


def test_per_vm_figures_are_those_of_the_rollups_and_ratings_of_the_range():
    w = world()
    result = study.study([w.fleet.host_a.pk], START, END)
    vms = by_name(result.vms, "name")
    assert set(vms) == {"ws-down", "ws-dismissed", "ws-keep"}  # host-a's VMs only
    down = vms["ws-down"].figures
    assert down.hours == 2
    assert down.gpu_p95 == 70
    assert down.fb_p95_pct == pytest.approx(50.0)
    assert down.enc_max == 12
    assert down.vcpu_p95 == 45
    assert down.busiest_vcpu_p95 == 80
    assert down.ram_p95_pct == pytest.approx(50.0)
    assert (down.feedback_count, down.feedback_mean) == (2, 3.0)
    assert set(down.top_tags) == {"Fine", "Viewport stutter"}
    assert vms["ws-dismissed"].figures.hours == 0
    assert vms["ws-dismissed"].figures.gpu_p95 is None


def test_per_workflow_rows_keep_the_busiest_vm_and_all_ratings_of_the_workflow():
    w = world()
    result = study.study([], START, END)
    workflows = by_name(result.workflows)
    assert set(workflows) >= {"Modeling", "Lighting"}
    lighting = workflows["Lighting"]
    assert (lighting.vms, lighting.hours, lighting.gpu_p95) == (1, 1, 90)
    assert lighting.fb_p95_pct == pytest.approx(75.0)
    assert lighting.ram_p95_pct == pytest.approx(25.0)
    assert (lighting.feedback_count, lighting.feedback_mean) == (1, 5.0)
    assert workflows["Modeling"].feedback_mean == 3.0
    assert w.keep.artist.workflow == "lighting"


def test_the_density_is_the_planners_answer_from_measurements_on_a_server_like_the_first_host():
    w = world()
    result = study.study([w.fleet.host_a.pk], START, END)
    expected = planning.run_plan(planning.PlanRequest(
        gpu_model=gpu_model("Quadro RTX 6000"), gpus=2, cpu_threads=w.fleet.host_a.cpu_threads,
        ram_gib=w.fleet.host_a.ram_gib, from_measurements=True, host_ids=(w.fleet.host_a.pk,),
        measured_cpu_ram=True,
    )).plan
    density = result.density
    assert (density.host, density.gpus, density.vms) == ("host-a", 2, 3)
    assert density.servers == expected.servers
    assert density.lower_bound_servers == expected.lower_bound_servers
    assert density.artists_per_server == expected.artists_per_server
    assert density.sentence == (f"The measurements support {expected.artists_per_server:g} artists per server: "
                                f"{expected.servers} server{'s' if expected.servers != 1 else ''} for these 3 VMs.")


def test_the_density_is_planned_on_the_server_the_admin_names():
    w = world()
    result = study.study([w.fleet.host_a.pk], START, END, server_id=w.fleet.host_b.pk)
    host_b = w.fleet.host_b
    expected = planning.run_plan(planning.PlanRequest(
        gpu_model=gpu_model("Quadro RTX 6000"), gpus=2, cpu_threads=host_b.cpu_threads, ram_gib=host_b.ram_gib,
        from_measurements=True, host_ids=(w.fleet.host_a.pk,), measured_cpu_ram=True,
    )).plan
    density = result.density
    assert (density.host, density.vms) == ("host-b", 3)  # host-a's VMs, on a server like host-b
    assert density.servers == expected.servers
    assert {vm.name for vm in result.vms} == {"ws-down", "ws-dismissed", "ws-keep"}


def test_a_workflows_feedback_is_that_of_its_vms_even_when_a_vm_changed_hands():
    """A lighter's old rating of the VM a modeler now works in counts for Modeling, with that
    VM's figures, not for Lighting, whose row holds no such VM."""
    w = world()
    former = ArtistFactory(name="Former Lighter", workflow="lighting")
    Feedback.objects.create(artist=former, vm=w.down, host=w.down.host, rating=1, tags=["viewport_stutter"],
                            session_date=START + timedelta(days=2))
    workflows = by_name(study.study([], START, END).workflows)
    assert (workflows["Modeling"].feedback_count, workflows["Modeling"].feedback_mean) == (3, 2.33)  # (4 + 2 + 1) / 3
    assert (workflows["Lighting"].feedback_count, workflows["Lighting"].feedback_mean) == (1, 5.0)


def test_a_group_narrows_the_figures_and_the_density_to_its_vms():
    """The pilot: VMs named by pattern or name (case aside) and of the workflows chosen; the
    density plans only them, and a group none of the hosts' VMs is in plans nothing."""
    w = world()
    named = study.study([], START, END, group=study.Group(names=("WS-D*", "ws-keep")))
    assert {vm.name for vm in named.vms} == {"ws-down", "ws-dismissed", "ws-keep"}
    assert named.density.vms == 3
    lighting = study.study([], START, END, group=study.Group(workflows=("lighting",)))
    assert [vm.name for vm in lighting.vms] == ["ws-keep"]
    assert [f.label for f in lighting.workflows] == ["Lighting"]
    assert (lighting.density.vms, lighting.density.host) == (1, "host-a")
    both = study.study([], START, END, group=study.Group(names=("ws-*",), workflows=("lighting", "fx")))
    assert [vm.name for vm in both.vms] == ["ws-keep"]
    elsewhere = study.study([w.fleet.host_b.pk], START, END, group=study.Group(workflows=("lighting",)))
    assert (elsewhere.vms, elsewhere.density) == ([], None)
    assert elsewhere.density_error == "No VM of these hosts is in the group chosen: there is nothing to plan."


def test_name_patterns_take_only_the_star_as_a_wildcard():
    assert study.unmatched(["ws-[1]", "ws-?", "ws-*", "WS-1"], ["ws-[1]", "ws-1"]) == ["ws-?"]


def test_the_study_costs_the_same_queries_for_more_vms_and_days():
    w = world()
    with CaptureQueriesContext(connection) as small:
        study.study([w.fleet.host_a.pk], START, START)
    with CaptureQueriesContext(connection) as large:
        study.study([], START, END)
    assert len(large) == len(small)
    with CaptureQueriesContext(connection) as named:
        study.study([], START, END, server_id=w.fleet.host_b.pk)
    assert len(named) <= len(small)


def test_the_density_sentence_counts_only_the_vms_it_placed():
    density = study.Density(host="rtx8000-01", gpu_model="Quadro RTX 8000", gpus=3, cpu_threads=96, ram_gib=768,
                            vms=5, servers=1, artists_per_server=2.0, lower_bound_servers=1, unplaced=3)
    assert density.sentence == "The measurements support 2 artists per server: 1 server for 2 of these 5 VMs."

"""The suggestion service on real hourly rollups: what each VM is advised, where the new size
fits, that a refresh is idempotent and costs the same queries for 2 VMs as for 12, that a
dismissal lasts until the evidence changes, and what accepting one files."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.core import mail
from django.db import connection
from django.test.utils import CaptureQueriesContext

from fleet import requests as resize_requests
from fleet import services
from fleet.models import AuditEvent, Notification, ResizeRequest, Vgpu
from fleet.tests.factories import GpuFactory, HostFactory, VirtualMachineFactory, gpu_model, profile
from sizing import engine
from sizing.models import Suggestion
from sizing.queries import suggestion_summary, suggestions_for
from sizing.suggestions import SuggestionConflict, accept_suggestion, dismiss_suggestion, refresh_suggestions
from sizing.tests.suggestion_world import (
    END,
    GIB,
    NOW,
    TWO_WEEKS_H,
    guest_hourly,
    hourly,
    rtx_studio,
    two_weeks_of_use,
)
from telemetry.models import VmRollup
from telemetry.rollups import build_rollups
from telemetry.tests.rollup_world import vgpu_samples

pytestmark = pytest.mark.django_db


@pytest.fixture
def world():
    world = rtx_studio()
    two_weeks_of_use(world)
    return world


def suggestion_of(vm) -> Suggestion:
    return Suggestion.objects.select_related("current_profile", "suggested_profile").get(vm=vm)


# What each VM is advised ------------------------------------------------------------------------


def test_a_vm_over_90_percent_of_its_profile_gets_an_upsize_that_fits_on_its_gpu(world):
    counts = refresh_suggestions(now=NOW)

    heavy = suggestion_of(world.heavy)
    assert (heavy.action, heavy.current_profile.name, heavy.suggested_profile.name) == (
        "upsize", "RTX6000-12Q", "RTX6000-24Q")
    assert heavy.suggested_vgpus is None
    assert heavy.evidence["fb_p95_pct"] == 94.0
    assert heavy.evidence["covered_hours"] == TWO_WEEKS_H
    assert "94%" in heavy.reason
    # Alone on its GPU, a 12Q grows into a 24Q where it is: no move, no GPU more or less.
    assert (heavy.fits, heavy.gpus_delta) == ("same_gpu", 0)
    assert heavy.evidence["impact"]["gpu_ids"] == [world.gpu_1.pk]
    assert (heavy.window_start, heavy.window_end, heavy.computed_at) == (END - timedelta(days=14), END, NOW)
    assert counts == {"upsize": 1, "downsize": 1, "keep": 1, "insufficient_data": 0, "removed": 0, "failed": 0}


def test_the_cpu_explains_what_the_gpu_cannot_a_saturated_vcpu_beside_an_idle_gpu(world):
    """peer's GPU idles (p95 12 %) while one of its 8 vCPUs is saturated: CPU-bound. light uses 5
    of its 32 GiB of RAM: it gives RAM back. heavy's guest reports no memory: no RAM advice."""
    world.peer.vcpus, world.peer.ram_gib = 8, 32
    world.peer.save()
    VmRollup.objects.filter(vm=world.peer).update(util_gpu_p95=12.0, util_gpu_avg=8.0)
    guest_hourly(world.peer, TWO_WEEKS_H, util_pct=14.0, busiest_pct=98.0, ram_used_mib=16 * GIB)
    world.light.ram_gib = 32
    world.light.save()
    guest_hourly(world.light, TWO_WEEKS_H, util_pct=20.0, busiest_pct=40.0, ram_used_mib=5 * GIB)
    guest_hourly(world.heavy, TWO_WEEKS_H, util_pct=30.0, busiest_pct=50.0, ram_used_mib=None)

    refresh_suggestions(now=NOW)

    peer = suggestion_of(world.peer)
    assert (peer.action, peer.cpu_action, peer.combined) == ("keep", "keep", "cpu_bound")
    assert peer.evidence["combined"]["message"].startswith("The GPU idles (p95 12 %) while one vCPU is saturated")
    assert peer.evidence["guest"]["vcpu_max_util_p95"] == 98.0
    assert peer.evidence["guest"]["single_thread_bound"] is True
    light = suggestion_of(world.light)
    assert (light.ram_action, light.suggested_ram_gib) == ("downsize", 8)  # 5 / 0.7 = 7.1 -> 8 GiB
    assert any("never used more than 5.0 of its 32 GiB" in r for r in light.evidence["guest"]["reasons"])
    heavy = suggestion_of(world.heavy)
    assert (heavy.ram_action, heavy.suggested_ram_gib) == ("insufficient_data", None)


def test_a_change_of_the_cpu_advice_brings_back_a_dismissed_suggestion(world, admin_user):
    refresh_suggestions(now=NOW)
    dismiss_suggestion(suggestion_of(world.peer), admin_user)
    refresh_suggestions(now=NOW)
    assert suggestion_of(world.peer).is_dismissed  # nothing new: stays dismissed

    world.peer.vcpus = 8
    world.peer.save()
    guest_hourly(world.peer, TWO_WEEKS_H, util_pct=14.0, busiest_pct=98.0, ram_used_mib=4 * GIB)
    refresh_suggestions(now=NOW)

    assert not suggestion_of(world.peer).is_dismissed


def test_the_artists_own_ratings_move_the_confidence_and_a_former_owners_stay_out(world):
    """heavy (upsize) is rated 1-2 stars with 'out of GPU memory' by Ana on 3 of 4 days: the upsize
    is confirmed. light (downsize) rated 5 stars by Bob. Cleo's ratings of heavy from before Ana
    had it are not Ana's to read: they stay out."""
    from datetime import date

    from fleet.tests.factories import ArtistFactory
    from sizing.models import Feedback

    def rate(vm, artist, day, rating, *tags):
        Feedback.objects.create(artist=artist, vm=vm, rating=rating, tags=list(tags),
                                session_date=date(2026, 3, day))

    for day, rating, tags in ((9, 1, ("out_of_gpu_memory",)), (10, 2, ("viewport_stutter",)), (11, 4, ()),
                              (12, 2, ("out_of_gpu_memory",))):
        rate(world.heavy, world.ana, day, rating, *tags)
    rate(world.heavy, ArtistFactory(name="Cleo before"), 8, 5, "fine")
    for day in (9, 10, 11):
        rate(world.light, world.bob, day, 5, "fine")

    refresh_suggestions(now=NOW)

    heavy = suggestion_of(world.heavy)
    assert heavy.evidence["feedback"]["count"] == 4  # not Cleo's
    assert heavy.evidence["confidence"]["level"] == "high"
    assert heavy.evidence["confidence"]["why"].startswith("The artist confirms it: 4 days rated, 75% of them 1-2 stars")
    light = suggestion_of(world.light)
    assert (light.action, light.evidence["confidence"]["level"]) == ("downsize", "high")
    assert suggestion_of(world.peer).evidence["confidence"]["level"] == "medium"  # no feedback


def test_a_vm_at_30_percent_gets_a_downsize_with_the_gpu_it_frees(world):
    refresh_suggestions(now=NOW)

    light = suggestion_of(world.light)
    assert (light.action, light.suggested_profile.name) == ("downsize", "RTX6000-12Q")
    assert light.evidence["fb_p95_pct"] == 30.0
    # As a 12Q it joins another 12Q and frees its own GPU: GPUs 3B and 86 each hold one 12Q
    # beside a free slot, and the fleet's first GPU is taken.
    assert (light.fits, light.gpus_delta) == ("move", -1)
    impact = light.evidence["impact"]
    assert impact["gpu_ids"] == [world.gpu_1.pk]
    assert world.gpu_1.pci_bus_id in impact["detail"]
    assert "frees 1 GPU" in impact["detail"]


def test_a_vm_using_half_its_profile_keeps_it_without_impact(world):
    refresh_suggestions(now=NOW)

    peer = suggestion_of(world.peer)
    assert (peer.action, peer.suggested_profile, peer.fits, peer.gpus_delta) == ("keep", None, "", 0)
    assert "impact" not in peer.evidence
    assert "50%" in peer.reason


def test_two_days_of_data_is_not_enough_to_judge(world):
    newcomer = VirtualMachineFactory(name="ws-new")
    services.place_vgpu(newcomer, GpuFactory(host=world.host, pci_bus_id="00000000:AF:00.0"), profile("RTX6000-24Q"))
    hourly(newcomer, 48, fb_mib=23_000, profile_fb_mib=24 * GIB)

    refresh_suggestions(now=NOW)

    advice = suggestion_of(newcomer)
    assert (advice.action, advice.suggested_profile, advice.fits) == ("insufficient_data", None, "")
    assert "48 h of data" in advice.reason
    assert advice.evidence["covered_hours"] == 48


def test_a_vm_without_rollups_and_rollups_outside_the_window_give_not_enough_data(world):
    silent = VirtualMachineFactory(name="ws-silent")
    services.place_vgpu(silent, world.gpu_3, profile("RTX6000-12Q"))
    stale = VirtualMachineFactory(name="ws-stale")
    services.place_vgpu(stale, GpuFactory(host=world.host, pci_bus_id="00000000:AF:00.0"), profile("RTX6000-24Q"))
    # Two weeks of heavy use that ended fifteen days ago, and the hour still in progress.
    hourly(stale, TWO_WEEKS_H, fb_mib=23_000, profile_fb_mib=24 * GIB, end=END - timedelta(days=15))
    hourly(stale, 1, fb_mib=23_000, profile_fb_mib=24 * GIB, end=END + timedelta(hours=1))

    refresh_suggestions(now=NOW)

    assert suggestion_of(silent).action == "insufficient_data"
    assert suggestion_of(stale).action == "insufficient_data"
    assert suggestion_of(stale).evidence["covered_hours"] == 0


def test_suggestions_follow_the_rollups_built_from_raw_samples():
    """End to end: vGPU samples -> the hourly rollup task -> the refresh."""
    host = HostFactory(name="render-02")
    vm = VirtualMachineFactory(name="ws-sampled")
    gpu = GpuFactory(host=host)
    services.place_vgpu(vm, gpu, profile("RTX6000-12Q"))
    start = END - timedelta(days=4)
    vgpu_samples(vm, gpu, start, 4 * 24 * 6, every_s=600, fb_used_mib=11_800.0, util_gpu=35.0, enc_util=5.0)
    build_rollups(3600, now=NOW, max_buckets=200)
    assert VmRollup.objects.filter(vm=vm, step_s=3600).count() == 96

    refresh_suggestions(now=NOW)

    advice = suggestion_of(vm)
    assert (advice.action, advice.suggested_profile.name) == ("upsize", "RTX6000-24Q")
    assert advice.evidence["fb_p95_mib"] == 11_800.0
    assert advice.evidence["covered_hours"] == 96


def test_hours_missing_one_of_a_vms_vgpus_do_not_make_a_downsize():
    """A VM with two L40S-12Q whose second vGPU went unreported for four days: its hours read half
    the frame buffer it holds, so they are left out instead of read as a downsize."""
    host = HostFactory(name="render-03")
    gpu_1, gpu_2 = (GpuFactory(host=host, gpu_model=gpu_model("NVIDIA L40S"), pci_bus_id=bus)
                    for bus in ("00000000:3B:00.0", "00000000:5E:00.0"))
    vm = VirtualMachineFactory(name="ws-dual")
    services.place_vgpu(vm, gpu_1, profile("L40S-12Q"))
    services.place_vgpu(vm, gpu_2, profile("L40S-12Q"))
    start = END - timedelta(days=4)
    # 8 GiB used on each vGPU: 16 of 24 GiB, which no smaller pair of profiles holds.
    vgpu_samples(vm, gpu_1, start, 4 * 24 * 6, every_s=600, fb_used_mib=8192.0, util_gpu=10.0, enc_util=0.0)
    vgpu_samples(vm, gpu_2, start, 6, every_s=600, fb_used_mib=8192.0, util_gpu=10.0, enc_util=0.0)
    build_rollups(3600, now=NOW, max_buckets=200)
    assert VmRollup.objects.filter(vm=vm, step_s=3600, partial=True).count() == 95

    refresh_suggestions(now=NOW)

    advice = suggestion_of(vm)
    assert advice.action == "insufficient_data"
    assert advice.suggested_profile is None
    assert (advice.evidence["covered_hours"], advice.evidence["partial_hours"]) == (1, 95)
    assert "95 h with not every vGPU reported left out" in advice.reason


# Refreshing --------------------------------------------------------------------------------------


def test_a_second_refresh_updates_the_rows_in_place(world):
    refresh_suggestions(now=NOW)
    first = {s.vm_id: s.pk for s in Suggestion.objects.all()}

    later = NOW + timedelta(hours=1)
    hourly(world.heavy, 1, fb_mib=11_550, profile_fb_mib=12 * GIB, end=END + timedelta(hours=1))
    refresh_suggestions(now=later)

    assert {s.vm_id: s.pk for s in Suggestion.objects.all()} == first
    assert Suggestion.objects.count() == 3
    assert suggestion_of(world.heavy).computed_at == later
    assert suggestion_of(world.heavy).window_end == END + timedelta(hours=1)


def test_refreshing_some_vms_leaves_the_others_alone(world):
    refresh_suggestions(now=NOW)
    later = NOW + timedelta(hours=2)

    counts = refresh_suggestions(now=later, vm_ids=[world.light.pk])

    assert (counts["downsize"], counts["upsize"]) == (1, 0)
    assert suggestion_of(world.light).computed_at == later
    assert suggestion_of(world.heavy).computed_at == NOW


def test_a_vm_that_lost_its_vgpus_loses_its_suggestion(world):
    refresh_suggestions(now=NOW)
    services.remove_vgpu(Vgpu.objects.get(vm=world.peer))

    counts = refresh_suggestions(now=NOW)

    assert counts["removed"] == 1
    assert not Suggestion.objects.filter(vm=world.peer).exists()
    assert Suggestion.objects.count() == 2


def test_one_vm_the_engine_cannot_judge_does_not_stop_the_others(world, monkeypatch):
    refresh_suggestions(now=NOW)
    advise = engine.advise

    def failing(current, vgpus, hours, options, thresholds, **kwargs):
        if current.name == "RTX6000-24Q":
            raise ValueError("unexpected rollup")
        return advise(current, vgpus, hours, options, thresholds, **kwargs)

    monkeypatch.setattr(engine, "advise", failing)
    later = NOW + timedelta(hours=1)
    counts = refresh_suggestions(now=later)

    assert counts["failed"] == 1
    assert suggestion_of(world.heavy).computed_at == later
    # The VM that failed keeps its previous suggestion rather than losing it.
    assert suggestion_of(world.light).computed_at == NOW


def test_the_window_follows_the_setting(world, settings):
    settings.SIZING_WINDOW_DAYS = 2

    refresh_suggestions(now=NOW)

    advice = suggestion_of(world.heavy)
    assert advice.window_start == END - timedelta(days=2)
    assert advice.evidence["covered_hours"] == 48
    assert advice.action == "insufficient_data"


def test_the_daily_chart_series_follows_the_studios_days(world, settings):
    """Hours are grouped by the calendar day of TIME_ZONE: a studio on UTC+14 starts its days
    ten hours before UTC's, so its fortnight of hours falls on other dates."""
    refresh_suggestions(now=NOW)
    utc_days = [day["date"] for day in suggestion_of(world.heavy).evidence["daily"]]
    settings.TIME_ZONE = "Pacific/Kiritimati"

    refresh_suggestions(now=NOW)

    local_days = [day["date"] for day in suggestion_of(world.heavy).evidence["daily"]]
    assert (utc_days[0], utc_days[-1], len(utc_days)) == ("2026-03-02", "2026-03-16", 15)
    assert (local_days[0], local_days[-1], len(local_days)) == ("2026-03-03", "2026-03-16", 14)


def _fleet(n_vms: int) -> None:
    host = HostFactory(cpu_threads=512, ram_gib=4096)
    for i in range(n_vms):
        vm = VirtualMachineFactory()
        services.place_vgpu(vm, GpuFactory(host=host), profile("RTX6000-12Q" if i % 2 else "RTX6000-24Q"))
        hourly(vm, 96, fb_mib=3_000 + 700 * i, profile_fb_mib=(12 if i % 2 else 24) * GIB)


def _refresh_queries() -> int:
    with CaptureQueriesContext(connection) as queries:
        refresh_suggestions(now=NOW)
    return len(queries)


def test_a_refresh_costs_the_same_queries_for_2_vms_as_for_12(django_assert_num_queries):
    _fleet(2)
    # The snapshot (7), the rollups, the guest rollups and the ratings (1 each), then in a
    # savepoint: the upsert, ended dismissals, dropped request links and removals (1 each).
    assert _refresh_queries() == 16
    assert Suggestion.objects.count() == 2
    _fleet(10)
    with django_assert_num_queries(16):
        counts = refresh_suggestions(now=NOW)
    assert sum(counts[a] for a in ("upsize", "downsize", "keep", "insufficient_data")) == 12
    assert Suggestion.objects.count() == 12


# Dismissing --------------------------------------------------------------------------------------


def _shown(user) -> set[str]:
    return {s.vm.name for s in suggestions_for(user) if not s.dismissed}


def test_a_dismissed_suggestion_stays_hidden_until_its_evidence_changes(world, admin_user):
    refresh_suggestions(now=NOW)
    light = suggestion_of(world.light)
    dismiss_suggestion(light, admin_user, evidence_key=light.evidence_key)
    assert _shown(admin_user) == {"ws-heavy", "ws-peer"}
    assert suggestion_summary()["dismissed"] == 1

    # An hour later the figures are the same: still hidden.
    hourly(world.light, 1, fb_mib=7_372, profile_fb_mib=24 * GIB, end=END + timedelta(hours=1))
    refresh_suggestions(now=NOW + timedelta(hours=1))
    assert _shown(admin_user) == {"ws-heavy", "ws-peer"}

    # The artist's use grew: the advice changed, so the suggestion is back, for good.
    VmRollup.objects.filter(vm=world.light).update(fb_used_mib_avg=12_000, fb_used_mib_max=12_000,
                                                   fb_used_mib_p95=12_000)
    refresh_suggestions(now=NOW + timedelta(hours=1))
    light = suggestion_of(world.light)
    assert _shown(admin_user) == {"ws-heavy", "ws-light", "ws-peer"}
    assert (light.dismissed_key, light.dismissed_by, light.dismissed_at) == ("", None, None)


def test_dismissing_what_was_recomputed_since_it_was_shown_is_refused(world, admin_user):
    refresh_suggestions(now=NOW)
    light = suggestion_of(world.light)

    with pytest.raises(SuggestionConflict, match="recomputed"):
        dismiss_suggestion(light, admin_user, evidence_key="0" * 64)

    assert suggestion_of(world.light).dismissed_key == ""


# Accepting ---------------------------------------------------------------------------------------


def test_accepting_files_a_pending_request_with_a_reason_from_the_evidence(world, admin_user):
    refresh_suggestions(now=NOW)
    heavy = suggestion_of(world.heavy)

    filed = accept_suggestion(heavy, admin_user, evidence_key=heavy.evidence_key, note="Deadline on Friday.")

    filed.refresh_from_db()
    assert (filed.vm, filed.status, filed.requested_by) == (world.heavy, "pending", admin_user)
    assert (filed.current_profile.name, filed.requested_profile.name, filed.requested_vgpus) == (
        "RTX6000-12Q", "RTX6000-24Q", 1)
    assert filed.reason.startswith("Right-sizing: fb p95 11.3 GiB = 94% of 12 GiB over 14 days")
    assert "RTX6000-12Q -> RTX6000-24Q" in filed.reason
    assert filed.reason.endswith("Deadline on Friday.")
    assert suggestion_of(world.heavy).resize_request == filed


def test_the_request_link_holds_while_the_suggestion_asks_the_same(world, admin_user):
    refresh_suggestions(now=NOW)
    filed = accept_suggestion(suggestion_of(world.heavy), admin_user)

    refresh_suggestions(now=NOW)
    assert suggestion_of(world.heavy).resize_request == filed

    # Use dropped to half the 12Q: the advice is now to keep it, and the link goes.
    VmRollup.objects.filter(vm=world.heavy).update(fb_used_mib_avg=6_144, fb_used_mib_max=6_144,
                                                   fb_used_mib_p95=6_144)
    refresh_suggestions(now=NOW)
    assert suggestion_of(world.heavy).resize_request is None
    assert ResizeRequest.objects.filter(pk=filed.pk, status="pending").exists()


def test_accepting_tells_the_admins_as_filing_does(world, admin_user, django_capture_on_commit_callbacks):
    admin_user.email = "admin@example.com"
    admin_user.save()
    refresh_suggestions(now=NOW)
    with django_capture_on_commit_callbacks(execute=True):
        accepted = accept_suggestion(suggestion_of(world.heavy), admin_user)
        filed = resize_requests.file_request(world.peer, admin_user, profile("RTX6000-24Q"), 1, "by hand")

    notes = {n.message: n.url for n in Notification.objects.filter(user=admin_user)}
    assert notes == {"Resize request for ws-heavy: 1 x RTX6000-24Q": "/requests/",
                     "Resize request for ws-peer: 1 x RTX6000-24Q": "/requests/"}
    assert sorted(m.subject for m in mail.outbox) == ["vGPU fleet: Resize request for ws-heavy: 1 x RTX6000-24Q",
                                                      "vGPU fleet: Resize request for ws-peer: 1 x RTX6000-24Q"]
    events = AuditEvent.objects.filter(action="resize_request.file").order_by("pk")
    assert [(e.object_id, e.comment) for e in events] == [
        (str(accepted.pk), "from the right-sizing suggestion for ws-heavy"), (str(filed.pk), "")]


def test_accepting_refuses_what_filing_refuses(world, admin_user):
    refresh_suggestions(now=NOW)
    # Two RTX6000-12Q in one VM: Turing boards combine only full-GPU profiles.
    Suggestion.objects.filter(vm=world.heavy).update(suggested_profile=world.q12, suggested_vgpus=2)
    with pytest.raises(resize_requests.RequestError) as by_hand:
        resize_requests.file_request(world.heavy, admin_user, world.q12, 2, "by hand")
    with pytest.raises(SuggestionConflict) as accepted:
        accept_suggestion(suggestion_of(world.heavy), admin_user)
    assert by_hand.value.errors["requested_vgpus"] in str(accepted.value)
    assert "may only use full-GPU profiles" in str(accepted.value)
    assert not ResizeRequest.objects.exists()

    # A request already pending for the VM: filing's own refusal, in filing's words.
    pending = resize_requests.file_request(world.heavy, admin_user, world.q24, 1, "by hand")
    Suggestion.objects.filter(vm=world.heavy).update(suggested_profile=world.q24, suggested_vgpus=None)
    with pytest.raises(SuggestionConflict, match=rf"already has a pending request \(#{pending.pk}\)"):
        accept_suggestion(suggestion_of(world.heavy), admin_user)
    assert list(ResizeRequest.objects.all()) == [pending]


def test_accepting_is_refused_when_the_vms_vgpus_changed_meanwhile(world, admin_user):
    refresh_suggestions(now=NOW)
    services.remove_vgpu(Vgpu.objects.get(vm=world.heavy))
    services.place_vgpu(world.heavy, world.gpu_1, profile("RTX6000-24Q"))

    with pytest.raises(SuggestionConflict, match="changed since"):
        accept_suggestion(suggestion_of(world.heavy), admin_user)

    assert not ResizeRequest.objects.exists()


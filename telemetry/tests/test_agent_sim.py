"""The simulated backend: deterministic, plausible, shaped by workflow and by the studio's hours."""

from __future__ import annotations

import datetime as dt
import statistics

import pytest

from telemetry.agent.scenario import ScenarioError, build_scenario, poc_scenario, validate_scenario
from telemetry.agent.sim_backend import SimBackend

MONDAY = dt.datetime(2026, 1, 5, tzinfo=dt.UTC).timestamp()  # a Monday, 00:00 UTC
HOUR = 3600.0
DAY = 24 * HOUR


def utc_poc() -> SimBackend:
    return SimBackend({**poc_scenario(), "timezone": "UTC"})


def vgpu(snapshot: list[dict], vm_name: str) -> dict:
    return next(v for gpu in snapshot for v in gpu["vgpus"] if v["vm_name"] == vm_name)


def instants(days: int, step_s: float):
    t = MONDAY
    while t < MONDAY + days * DAY:
        yield t
        t += step_s


def is_working_hours(t: float) -> bool:
    """Hours every simulated artist is at work: weekdays 10:00-12:00 and 14:00-18:00 UTC."""
    moment = dt.datetime.fromtimestamp(t, dt.UTC)
    return moment.weekday() < 5 and (10 <= moment.hour < 12 or 14 <= moment.hour < 18)


def is_off_hours(t: float) -> bool:
    moment = dt.datetime.fromtimestamp(t, dt.UTC)
    return moment.weekday() >= 5 or moment.hour < 7 or moment.hour >= 20


def test_same_instant_gives_the_same_figures_across_agents():
    t = MONDAY + 2 * DAY + 10.5 * HOUR  # Wednesday 10:30
    first, second = utc_poc().collect(t), utc_poc().collect(t)

    assert first == second
    assert utc_poc().collect(t + 300) != first, "figures should move over five minutes of work"


def test_figures_stay_within_physical_bounds_all_week():
    backend = utc_poc()
    for t in instants(days=7, step_s=17 * 60):
        for gpu in backend.collect(t):
            assert 0 <= gpu["util_gpu"] <= 100
            assert 0 <= gpu["util_mem"] <= 100
            assert 0 <= gpu["enc_util"] <= 100
            assert 0 <= gpu["dec_util"] <= 100
            assert 0 <= gpu["fb_used_mib"] <= gpu["fb_total_mib"]
            assert 20 <= gpu["power_w"] <= 250
            assert 25 <= gpu["temp_c"] <= 90
            for v in gpu["vgpus"]:
                profile_mib = 12288 if v["type_name"].endswith("12Q") else 24576
                assert 0 <= v["util_gpu"] <= 100
                assert 0 <= v["util_mem"] <= 100
                assert 0 < v["fb_used_mib"] <= profile_mib


def test_gpu_figures_aggregate_its_vgpus():
    backend = utc_poc()
    for t in instants(days=2, step_s=23 * 60):
        for gpu in backend.collect(t):
            assert gpu["util_gpu"] == min(100, sum(v["util_gpu"] for v in gpu["vgpus"]))
            assert gpu["fb_used_mib"] == sum(v["fb_used_mib"] for v in gpu["vgpus"])


def test_modeling_vm_is_busier_in_working_hours_than_nights_and_weekends():
    backend = utc_poc()
    work, off, work_fb, off_fb = [], [], [], []
    for t in instants(days=28, step_s=10 * 60):
        modeling = vgpu(backend.collect(t), "vws-modeling-01")
        if is_working_hours(t):
            work.append(modeling["util_gpu"])
            work_fb.append(modeling["fb_used_mib"])
        elif is_off_hours(t):
            off.append(modeling["util_gpu"])
            off_fb.append(modeling["fb_used_mib"])

    assert statistics.mean(work) >= 8
    assert statistics.mean(work) > 5 * statistics.mean(off)
    assert max(off) <= 5, "an idle VM should not show spikes at night"
    assert statistics.mean(work_fb) > 2 * statistics.mean(off_fb)


def test_workflows_have_their_own_shape():
    """What the heatmap shows at a glance: lighting bursts, animation uses more memory than modeling."""
    backend = utc_poc()
    samples: dict[str, list[dict]] = {"vws-modeling-01": [], "vws-animation-01": [], "vws-lighting-01": []}
    for t in instants(days=14, step_s=5 * 60):
        if is_working_hours(t):
            snapshot = backend.collect(t)
            for name, rows in samples.items():
                rows.append(vgpu(snapshot, name))

    def share_at_least(name: str, util: int) -> float:
        return sum(v["util_gpu"] >= util for v in samples[name]) / len(samples[name])

    def fb_fraction(name: str, profile_mib: int) -> float:
        return statistics.mean(v["fb_used_mib"] for v in samples[name]) / profile_mib

    assert share_at_least("vws-lighting-01", 80) > 0.2, "lighting should spend a good part of the day in bursts"
    assert share_at_least("vws-modeling-01", 80) < 0.05, "modeling is light and steady"
    assert share_at_least("vws-animation-01", 55) > 0.1, "animation playback peaks"
    assert fb_fraction("vws-animation-01", 24576) > fb_fraction("vws-modeling-01", 12288)
    assert statistics.mean(v["util_gpu"] for v in samples["vws-lighting-01"]) > statistics.mean(
        v["util_gpu"] for v in samples["vws-modeling-01"]
    )


def test_a_cpu_bound_animators_gpu_stays_light_and_its_playback_never_peaks():
    """The rig evaluates on one CPU core: the viewport waits on it, so playback never loads the GPU."""
    seats = [{"vm_name": name, "type_name": "L40S-16Q", "fb_mib": 16384, "workflow": "animation",
              "user_type": "heavy", **extra} for name, extra in (("ws-anim", {}), ("ws-rig", {"cpu_bound": True}))]
    scenario = build_scenario("node-07", [{"name": "NVIDIA L40S", "fb_total_mib": 46068, "vgpus": seats}],
                              timezone="UTC")
    backend = SimBackend(scenario)
    days = [backend.collect(t) for t in instants(days=5, step_s=5 * 60) if is_working_hours(t)]

    rig = [vgpu(snapshot, "ws-rig") for snapshot in days]
    assert max(v["util_gpu"] for v in rig) < 30
    assert max(vgpu(snapshot, "ws-anim")["util_gpu"] for snapshot in days) > 55  # its playback peaks
    assert 0.4 * 16384 < statistics.mean(v["fb_used_mib"] for v in rig) < 0.7 * 16384
    scenario["gpus"][0]["vgpus"][1]["cpu_bound"] = "yes"
    with pytest.raises(ScenarioError, match="cpu_bound must be true, false or absent"):
        validate_scenario(scenario)


def test_active_vm_has_a_remoting_session_and_idle_vm_none():
    backend = utc_poc()
    working = vgpu(backend.collect(MONDAY + 2 * DAY + 11 * HOUR), "vws-modeling-01")  # Wednesday 11:00
    sunday = vgpu(backend.collect(MONDAY + 6 * DAY + 11 * HOUR), "vws-modeling-01")

    assert working["enc_sessions"] == 1
    assert working["enc_fps"] > 0
    assert sunday["enc_sessions"] == 0
    assert sunday["enc_fps"] == 0


def test_working_hours_follow_the_scenario_timezone():
    wednesday_11_utc = MONDAY + 2 * DAY + 11 * HOUR  # 20:00 in Tokyo
    tokyo = SimBackend({**poc_scenario(), "timezone": "UTC+09:00"})

    assert vgpu(utc_poc().collect(wednesday_11_utc), "vws-modeling-01")["enc_sessions"] == 1
    assert vgpu(tokyo.collect(wednesday_11_utc), "vws-modeling-01")["enc_sessions"] == 0


def test_unknown_timezone_is_refused_with_its_name():
    with pytest.raises(ScenarioError, match="Mars/Olympus_Mons"):
        SimBackend({**poc_scenario(), "timezone": "Mars/Olympus_Mons"})


def test_gpu_without_vgpus_idles_and_passthrough_has_no_scheduler():
    backend = SimBackend(
        build_scenario(
            "spare-host",
            [
                {"name": "NVIDIA L40S", "fb_total_mib": 46068},
                {"name": "NVIDIA L40S", "fb_total_mib": 46068, "virtualization_mode": "passthrough"},
            ],
            timezone="UTC",
        )
    )
    empty, passthrough = backend.collect(MONDAY + 2 * DAY + 11 * HOUR)

    assert (empty["util_gpu"], empty["fb_used_mib"], empty["vgpus"]) == (0, 0, [])
    assert empty["clocks_event_reasons"] == 1  # GPU idle
    assert empty["scheduler"]["policy"] == "best_effort"
    assert passthrough["virtualization_mode"] == "passthrough"
    assert passthrough["scheduler"] is None


def test_plain_scenario_reports_no_mdev_uuid_unless_it_names_one():
    mdev = "6d0e4f2a-9b1c-4d3e-8f5a-7b6c5d4e3f2a"
    backend = SimBackend(build_scenario("node-07", [{"name": "NVIDIA L40S", "fb_total_mib": 46068, "vgpus": [
        {"vm_name": "ws-plain", "type_name": "L40S-12Q", "fb_mib": 12288},
        {"vm_name": "ws-named", "type_name": "L40S-12Q", "fb_mib": 12288, "mdev_uuid": mdev},
    ]}], timezone="UTC"))

    snapshot = backend.collect(MONDAY + 11 * HOUR)

    assert vgpu(snapshot, "ws-plain")["mdev_uuid"] is None
    assert vgpu(snapshot, "ws-named")["mdev_uuid"] == mdev

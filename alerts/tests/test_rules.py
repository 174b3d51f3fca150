"""The rules as pure functions: when each fires, on what subject, and what its thresholds accept."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from alerts import rules
from alerts.rules import (
    AgentFacts,
    Facts,
    GpuRef,
    GpuState,
    GpuWindow,
    HostVersions,
    ParamError,
    Pool,
    SchedulerFacts,
    VgpuLicence,
    VgpuWindow,
    XidFacts,
    check_params,
)

NOW = datetime(2026, 11, 26, 12, 0, tzinfo=UTC)
GPU = GpuRef(gpu_id=7, host_id=3, label="node-03 3B:00.0 (L40S)", vm_ids=(11, 12))


def run(slug: str, facts: Facts, **params) -> list[rules.Finding]:
    kind = rules.RULES[slug]
    return rules.evaluate(facts, {slug: (kind.severity, check_params(slug, params))})


def window(minutes=5, samples=30, late_s=0, **values) -> GpuWindow:
    first = NOW - timedelta(minutes=minutes) + timedelta(seconds=10 + late_s)
    return GpuWindow(gpu=GPU, samples=samples, first_ts=first, **values)


# -- thresholds -------------------------------------------------------------------------------


def test_defaults_fill_what_an_admin_left_out():
    assert check_params("gpu_temperature", {"margin_c": 3}) == {"margin_c": 3, "minutes": 5,
                                                                "fallback_slowdown_c": 87}


@pytest.mark.parametrize(("params", "param", "says"), [
    ({"minutes": 0}, "minutes", "between 1 and 1440"),
    ({"minutes": 2.5}, "minutes", "whole number"),
    ({"minutes": "5"}, "minutes", "expected a number"),
    ({"minutes": True}, "minutes", "expected a number"),
    ({"minute": 5}, "minute", "has no parameter 'minute'"),
])
def test_a_bad_threshold_is_refused_naming_it(params, param, says):
    with pytest.raises(ParamError) as refused:
        check_params("throttling", params)
    assert refused.value.param == param
    assert says in str(refused.value)


def test_every_rule_has_an_evaluator_and_sane_defaults():
    for slug, kind in rules.RULES.items():
        assert slug in rules.EVALUATORS
        assert check_params(slug, {}) == kind.defaults()


# -- agents -----------------------------------------------------------------------------------


def test_an_agent_fires_after_the_configured_number_of_failed_polls():
    agent = AgentFacts(agent_id=4, name="node-03-agent", host_id=3, host_name="node-03", failures=3,
                       last_seen=NOW - timedelta(minutes=2), last_error="connection refused", vm_ids=(11,))
    (finding,) = run("agent_unreachable", Facts(now=NOW, agents=[agent]), polls=3)
    assert finding.key == "agent_unreachable:agent:4"
    assert finding.severity == "critical"
    assert "connection refused" in finding.summary
    assert finding.vm_ids == (11,)
    assert run("agent_unreachable", Facts(now=NOW, agents=[agent]), polls=4) == []


# -- windows ----------------------------------------------------------------------------------


def test_a_gpu_hot_for_the_whole_window_fires_and_names_its_threshold():
    hot = window(temp_min=86, temp_max=88, slowdown_c=89)
    (finding,) = run("gpu_temperature", Facts(now=NOW, gpu_windows={5: [hot]}))
    assert finding.key == "gpu_temperature:gpu:7"
    assert finding.gpu_id == 7
    assert finding.vm_ids == (11, 12)
    assert "89 °C" in finding.summary


def test_one_cool_reading_in_the_window_keeps_it_quiet():
    assert run("gpu_temperature", Facts(now=NOW, gpu_windows={5: [window(temp_min=70, temp_max=88,
                                                                            slowdown_c=89)]})) == []


def test_a_window_that_starts_late_is_not_yet_sustained():
    """Two hot readings of a GPU that just came back are not five minutes of heat."""
    late = window(samples=2, late_s=200, temp_min=88, temp_max=88, slowdown_c=89)
    assert run("gpu_temperature", Facts(now=NOW, gpu_windows={5: [late]})) == []


def test_a_gpu_without_its_own_slowdown_temperature_is_judged_by_the_fallback():
    unknown = window(temp_min=83, temp_max=84, slowdown_c=None)
    assert run("gpu_temperature", Facts(now=NOW, gpu_windows={5: [unknown]}), fallback_slowdown_c=87)
    assert not run("gpu_temperature", Facts(now=NOW, gpu_windows={5: [unknown]}), fallback_slowdown_c=95)


def test_throttling_fires_only_when_every_reading_was_held_back():
    always = window(samples=30, thermal_samples=30)
    sometimes = window(samples=30, thermal_samples=29)
    (finding,) = run("throttling", Facts(now=NOW, gpu_windows={5: [always]}))
    assert "heat" in finding.title
    assert run("throttling", Facts(now=NOW, gpu_windows={5: [sometimes]})) == []


def test_a_vgpu_frame_buffer_above_the_share_for_the_window_fires_for_its_vm_only():
    full = VgpuWindow(vm_id=11, vm_name="vws-anim-01", gpu=GPU, profile="L40S-12Q", profile_fb_mib=12288,
                      samples=30, first_ts=NOW - timedelta(minutes=5, seconds=-10), fb_min=11900, fb_max=12200)
    (finding,) = run("vgpu_fb_full", Facts(now=NOW, vgpu_windows={5: [full]}))
    assert finding.vm_ids == (11,)
    assert finding.key == "vgpu_fb_full:vm:11:gpu:7"
    assert "L40S-12Q" in finding.summary
    assert run("vgpu_fb_full", Facts(now=NOW, vgpu_windows={5: [full]}), percent=99) == []


# -- events and state -------------------------------------------------------------------------


def test_an_xid_fires_per_gpu_and_code_with_its_meaning_and_own_severity():
    fell_off = XidFacts(gpu=GPU, code=79, count=1, first_at=NOW, last_at=NOW)
    app_fault = XidFacts(gpu=GPU, code=43, count=3, first_at=NOW - timedelta(minutes=3), last_at=NOW)
    found = {f.key: f for f in run("xid", Facts(now=NOW, xids=[fell_off, app_fault]))}
    assert set(found) == {"xid:gpu:7:79", "xid:gpu:7:43"}
    assert "fallen off the bus" in found["xid:gpu:7:79"].title
    assert found["xid:gpu:7:79"].severity == "critical"
    assert found["xid:gpu:7:43"].severity == "warning"
    assert "3 times" in found["xid:gpu:7:43"].summary


def test_an_unknown_xid_is_named_honestly():
    (finding,) = run("xid", Facts(now=NOW, xids=[XidFacts(gpu=GPU, code=9999, count=1, first_at=NOW,
                                                          last_at=NOW)]))
    assert "not in this product's table" in finding.title


def test_ecc_and_remapping_state_fire_and_a_pending_repair_is_only_a_warning():
    states = [GpuState(gpu=GPU, ecc_uncorrected_volatile=2, ecc_uncorrected_aggregate=5),
              GpuState(gpu=GpuRef(8, 3, "node-03 5E:00.0 (L40S)"), remapped_rows_pending=True),
              GpuState(gpu=GpuRef(9, 3, "node-03 86:00.0 (L40S)"), remapped_rows_failure=True)]
    (ecc,) = run("ecc_uncorrectable", Facts(now=NOW, gpu_states=states))
    assert "2 uncorrectable" in ecc.summary
    remaps = {f.gpu_id: f for f in run("row_remap", Facts(now=NOW, gpu_states=states))}
    assert remaps[8].severity == "warning"
    assert remaps[9].severity == "critical"
    assert 7 not in remaps


def test_licence_rules_fire_on_lapsed_and_soon_expiring_vgpus():
    lapsed = VgpuLicence(vm_id=11, vm_name="vws-anim-01", gpu=GPU, type_name="L40S-12Q", edition="vws",
                         license_state="unlicensed", license_expiry=None)
    expiring = VgpuLicence(vm_id=12, vm_name="vws-model-02", gpu=GPU, type_name="L40S-6Q", edition="vws",
                           license_state="licensed", license_expiry=NOW + timedelta(days=3))
    later = VgpuLicence(vm_id=13, vm_name="vws-light-03", gpu=GPU, type_name="L40S-6Q", edition="vws",
                        license_state="licensed", license_expiry=NOW + timedelta(days=30))
    facts = Facts(now=NOW, licences=[lapsed, expiring, later])
    (unlicensed,) = run("vgpu_unlicensed", facts)
    assert unlicensed.vm_ids == (11,)
    (soon,) = run("licence_expiring", facts, days=7)
    assert soon.vm_ids == (12,)
    assert "3 days" in soon.title


def test_a_pool_above_its_share_warns_and_an_overdrawn_pool_is_critical():
    near = Pool(edition="vws", label="vWS", owned=10, in_use=10)
    over = Pool(edition="vpc", label="vPC", owned=4, in_use=5)
    fine = Pool(edition="vapps", label="vApps", owned=10, in_use=5)
    found = {f.key: f for f in run("licence_pool", Facts(now=NOW, pools=[near, over, fine]), percent=90)}
    assert found["licence_pool:vws"].severity == "warning"
    assert found["licence_pool:vpc"].severity == "critical"
    assert "licence_pool:vapps" not in found


def test_driver_versions_that_differ_between_hosts_of_one_gpu_model_fire_once_for_the_model():
    hosts = [HostVersions(1, "node-01", ("L40S",), "580.95", "19.2"),
             HostVersions(2, "node-02", ("L40S",), "580.95", "19.2"),
             HostVersions(3, "node-03", ("L40S",), "570.148", "18.3"),
             HostVersions(4, "node-04", ("A16",), "570.148", "18.3")]
    (finding,) = run("driver_mismatch", Facts(now=NOW, hosts=hosts))
    assert finding.key == "driver_mismatch:model:L40S"
    assert "node-03" in finding.summary
    assert "node-01, node-02" in finding.summary


def test_scheduler_drift_waits_for_its_grace_time():
    fresh = SchedulerFacts(gpu=GPU, fields=("policy",), desired="equal share", reported="best effort",
                           since=NOW - timedelta(minutes=2))
    old = SchedulerFacts(gpu=GPU, fields=("policy",), desired="equal share", reported="best effort",
                         since=NOW - timedelta(minutes=30))
    assert run("scheduler_drift", Facts(now=NOW, schedulers=[fresh]), minutes=10) == []
    (finding,) = run("scheduler_drift", Facts(now=NOW, schedulers=[old]), minutes=10)
    assert "best effort" in finding.summary
    assert "equal share" in finding.summary

"""The right-sizing engine on hand-checked cases, without a database.

Each case is a VM's hourly usage an admin could picture ("a 12Q at 93% most of the day"), with
the profile the engine must suggest worked out by hand from NVIDIA's rule of thumb: frame
buffer not often above 90% (window p95) nor on average above 70% of the profile. Profiles are
NVIDIA's real figures from fleet.catalog.
"""

from __future__ import annotations

import json
from dataclasses import replace
from datetime import UTC, datetime, timedelta

import pytest

from fleet.tests.test_placement import all_profile_names, profile_spec
from sizing.engine import (
    DOWNSIZE,
    INSUFFICIENT_DATA,
    KEEP,
    UPSIZE,
    Advice,
    Thresholds,
    UsageHour,
    advise,
    evidence_key,
    is_active_hour,
)

GIB = 1024
MONDAY = datetime(2025, 3, 3, tzinfo=UTC)
RTX6000 = [profile_spec(name) for name in all_profile_names("RTX6000")]
L40S_Q = [profile_spec(name) for name in all_profile_names("L40S") if name.endswith("Q")]


def hours(count: int, *, p95: float, peak: float | None = None, mean: float | None = None, util: float = 20.0,
          enc: float | None = 5.0, profile_fb: float | None = None, start: datetime = MONDAY,
          samples: int = 360) -> list[UsageHour]:
    """`count` consecutive busy hours with the same figures (MiB): the simplest usage to reason
    about, since every window figure then equals the hourly one."""
    return [
        UsageHour(
            start=start + timedelta(hours=i), samples=samples,
            fb_used_mib_avg=mean if mean is not None else p95 * 0.8, fb_used_mib_max=peak if peak is not None else p95,
            fb_used_mib_p95=p95, util_gpu_avg=util * 0.8, util_gpu_p95=util,
            enc_util_avg=None if enc is None else enc / 2, enc_util_max=enc, profile_fb_mib=profile_fb,
        )
        for i in range(count)
    ]


def run(current: str, usage: list[UsageHour], *, vgpus: int = 1, options=None, **kwargs) -> Advice:
    """advise() for a VM of `current` (a catalog name), with every profile of its board as options.
    Every reason must fit the Suggestion row's 300 characters."""
    spec = profile_spec(current)
    advice = advise(spec, vgpus, usage, options if options is not None else RTX6000 + L40S_Q, **kwargs)
    assert len(advice.reason) <= 300, advice.reason
    return advice


def pct_of(percent: float, fb_mib: int) -> float:
    return percent * fb_mib / 100


TWELVE_Q = 12 * GIB


# NVIDIA's upsize rules, at their edges ---------------------------------------------------


def test_p95_at_exactly_90_percent_keeps_the_profile():
    advice = run("RTX6000-12Q", hours(100, p95=pct_of(90, TWELVE_Q), mean=pct_of(50, TWELVE_Q)))
    assert advice.action == KEEP
    assert advice.suggested is None
    assert advice.evidence["fb_p95_pct"] == 90.0
    assert advice.reason.startswith("p95 10.8 GiB = 90% of 12 GiB; mean 50%")


def test_p95_just_above_90_percent_upsizes_to_the_next_profile_that_restores_headroom():
    advice = run("RTX6000-12Q", hours(100, p95=pct_of(90.5, TWELVE_Q), mean=pct_of(50, TWELVE_Q)))
    assert advice.action == UPSIZE
    assert advice.suggested.name == "RTX6000-24Q"
    assert advice.suggested_vgpus is None
    assert "p95 over 90%" in advice.reason
    assert "RTX6000-24Q brings p95 to 45.2%, mean to 25%" in advice.reason
    assert run("RTX6000-12Q", hours(100, p95=pct_of(90.01, TWELVE_Q), mean=pct_of(50, TWELVE_Q))).action == UPSIZE


def test_p95_counts_as_often_only_above_five_percent_of_active_hours():
    # 100 active hours: 5 at 95% are "now and then" (p95 = 60%), 6 are "often" (p95 = 95%).
    def usage(hot):
        calm = hours(100 - hot, p95=pct_of(60, TWELVE_Q), mean=pct_of(40, TWELVE_Q))
        spikes = hours(hot, p95=pct_of(95, TWELVE_Q), mean=pct_of(40, TWELVE_Q), start=MONDAY + timedelta(days=7))
        return calm + spikes

    assert run("RTX6000-12Q", usage(5)).action == KEEP
    assert run("RTX6000-12Q", usage(6)).action == UPSIZE


def test_mean_at_exactly_70_percent_keeps_and_just_above_upsizes():
    at_limit = run("RTX6000-12Q", hours(100, p95=pct_of(80, TWELVE_Q), mean=pct_of(70, TWELVE_Q)))
    above = run("RTX6000-12Q", hours(100, p95=pct_of(80, TWELVE_Q), mean=pct_of(70.2, TWELVE_Q)))
    assert at_limit.action == KEEP
    assert above.action == UPSIZE
    assert above.suggested.name == "RTX6000-24Q"
    assert "mean over 70%" in above.reason
    assert "p95 over" not in above.reason


def test_upsize_picks_the_smallest_larger_profile_that_satisfies_both_rules():
    # L40S-8Q at p95 95% (7.6 GiB) and mean 90%: 12Q holds p95 at 63% but mean 60% is fine too,
    # so 12Q, not 16Q or 24Q. At mean 100% of 8Q (8 GiB) 12Q gives 66.7%: still 12Q.
    advice = run("L40S-8Q", hours(100, p95=pct_of(95, 8 * GIB), mean=pct_of(90, 8 * GIB)))
    assert advice.suggested.name == "L40S-12Q"
    # A 3Q at its limit cannot go to 4Q (mean 75% of 4 GiB) and needs 6Q.
    tight = run("L40S-3Q", hours(100, p95=3 * GIB, mean=3 * GIB))
    assert tight.suggested.name == "L40S-6Q"


def test_a_whole_gpu_that_is_too_small_gets_one_more_vgpu():
    advice = run("RTX6000-24Q", hours(100, p95=pct_of(95, 24 * GIB), mean=pct_of(60, 24 * GIB)))
    assert advice.action == UPSIZE
    assert advice.suggested.name == "RTX6000-24Q"
    assert advice.suggested_vgpus == 2
    assert "2 x RTX6000-24Q" in advice.reason
    assert "a single-GPU application needs a board with more frame buffer" in advice.reason
    assert advice.evidence["suggested_fb_mib"] == 48 * GIB


def test_four_whole_gpus_is_the_limit_and_then_a_larger_board_is_needed():
    total = 4 * 24 * GIB
    advice = run("RTX6000-24Q", hours(100, p95=pct_of(95, total), mean=pct_of(60, total)), vgpus=4)
    assert advice.action == KEEP
    assert "4 x RTX6000-24Q is the most this board offers" in advice.reason
    assert "board with more frame buffer" in advice.reason


def test_a_vpc_profile_that_allows_one_vgpu_per_vm_is_never_given_a_second():
    b_series = [profile_spec("L40S-1B"), profile_spec("L40S-2B")]
    advice = run("L40S-2B", hours(100, p95=pct_of(97, 2 * GIB)), options=b_series)
    assert advice.action == KEEP
    assert "board with more frame buffer" in advice.reason


def test_options_of_another_board_or_series_are_never_suggested():
    advice = run("RTX6000-12Q", hours(100, p95=pct_of(95, TWELVE_Q)), options=L40S_Q)
    assert advice.action == UPSIZE
    assert advice.suggested.gpu_model == "Quadro RTX 6000"
    assert advice.suggested_vgpus == 2  # only the current 12Q is left to it: one more 12Q


# Downsizing ------------------------------------------------------------------------------


def test_downsize_to_the_smallest_profile_keeping_the_headroom():
    # 12Q using p95 5000 MiB, mean 4000, peak 5500: 6Q holds p95 81%, mean 65%, peak 90%; 4Q not.
    advice = run("RTX6000-12Q", hours(100, p95=5000, mean=4000, peak=5500, util=20))
    assert advice.action == DOWNSIZE
    assert advice.suggested.name == "RTX6000-6Q"
    assert advice.evidence["suggested_fb_mib"] == 6 * GIB
    assert "RTX6000-6Q keeps p95 at 81.4%, peak 89.5%, mean 65.1%" in advice.reason


def test_downsize_is_allowed_at_exactly_90_70_and_100_percent_of_the_smaller_profile():
    six_q = 6 * GIB
    advice = run("RTX6000-12Q", hours(100, p95=pct_of(90, six_q), mean=pct_of(70, six_q), peak=six_q, util=25))
    assert advice.suggested.name == "RTX6000-6Q"


def test_downsize_never_goes_below_the_peak():
    # Same p95 and mean as above, but a peak of 6500 MiB would not fit a 6Q: 8Q instead.
    advice = run("RTX6000-12Q", hours(100, p95=5000, mean=4000, peak=6500))
    assert advice.suggested.name == "RTX6000-8Q"
    # A peak above 8Q leaves no smaller profile at all.
    kept = run("RTX6000-12Q", hours(100, p95=5000, mean=4000, peak=8500))
    assert kept.action == KEEP
    assert "no smaller profile keeps that headroom" in kept.reason


def test_gpu_load_above_the_fixed_share_of_the_smaller_profile_blocks_it():
    usage = {"p95": 5000, "mean": 4000, "peak": 5500}
    # 6Q is a quarter of a Quadro RTX 6000 under fixed share: 25% of GPU time.
    assert run("RTX6000-12Q", hours(100, util=25, **usage)).suggested.name == "RTX6000-6Q"
    stepped = run("RTX6000-12Q", hours(100, util=30, **usage))
    assert stepped.suggested.name == "RTX6000-8Q"  # a third: 33.3%
    assert "RTX6000-6Q would hold the frame buffer but not GPU load p95 30%" in stepped.reason
    blocked = run("RTX6000-12Q", hours(100, util=40, **usage))
    assert blocked.action == KEEP
    assert "GPU load p95 40% exceeds the fixed share of every smaller profile (RTX6000-8Q: 33.3%)" in blocked.reason


def test_a_busy_encoder_blocks_any_downsize():
    usage = {"p95": 5000, "mean": 4000, "peak": 5500}
    assert run("RTX6000-12Q", hours(100, enc=79.9, **usage)).action == DOWNSIZE
    busy = run("RTX6000-12Q", hours(100, enc=80, **usage))
    assert busy.action == KEEP
    assert "encoder peaks at 80%" in busy.reason


def test_quadro_rtx_6000_24q_shrinks_to_12q_when_half_the_gpu_is_enough():
    whole = 24 * GIB
    advice = run("RTX6000-24Q", hours(100, p95=pct_of(40, whole), mean=pct_of(30, whole), peak=pct_of(45, whole),
                                      util=30))
    assert advice.action == DOWNSIZE
    assert advice.suggested.name == "RTX6000-12Q"


def test_l40s_8q_goes_to_4q_or_6q_by_frame_buffer_and_gpu_load():
    usage = {"p95": 3000, "mean": 2000, "peak": 3500}
    # 4Q holds p95 73%, mean 49%, peak 85%; its fixed share is 1/12 of an L40S (8.3%).
    assert run("L40S-8Q", hours(100, util=8, **usage)).suggested.name == "L40S-4Q"
    assert run("L40S-8Q", hours(100, util=10, **usage)).suggested.name == "L40S-6Q"  # 1/8: 12.5%
    # More frame buffer: 4Q would exceed 90% (p95 4000 = 98%), 6Q holds it.
    assert run("L40S-8Q", hours(100, p95=4000, mean=3000, peak=4500, util=8)).suggested.name == "L40S-6Q"


def test_a_multi_vgpu_vm_shrinks_each_vgpu_unless_the_board_only_combines_whole_gpus():
    total = 2 * 24 * GIB
    usage = hours(100, p95=pct_of(30, total), mean=pct_of(25, total), peak=pct_of(36, total), util=20)
    l40s = run("L40S-24Q", usage, vgpus=2)
    assert (l40s.action, l40s.suggested.name, l40s.suggested_vgpus) == (DOWNSIZE, "L40S-12Q", None)
    assert l40s.evidence["suggested_fb_mib"] == 2 * 12 * GIB
    quadro = run("RTX6000-24Q", usage, vgpus=2, multi_vgpu_full_only=True)
    assert quadro.action == KEEP
    assert quadro.reason.endswith("on this board a VM with several vGPUs may only hold whole-GPU profiles")


def test_the_smallest_profile_is_kept_with_its_figures():
    advice = run("RTX6000-1Q", hours(100, p95=200, mean=150, peak=300))
    assert advice.action == KEEP
    assert advice.reason == "p95 0.2 GiB = 19.5% of 1 GiB; mean 14.6%; peak 29.3%"


# Coverage --------------------------------------------------------------------------------


def test_three_days_of_data_are_needed():
    short = run("RTX6000-12Q", hours(71, p95=pct_of(95, TWELVE_Q)))
    assert short.action == INSUFFICIENT_DATA
    assert short.suggested is None
    assert short.reason == "71 h of data in 14 days; needs 72 h"
    assert run("RTX6000-12Q", hours(72, p95=pct_of(95, TWELVE_Q))).action == UPSIZE


def test_hours_without_samples_are_not_coverage():
    usage = hours(72, p95=pct_of(95, TWELVE_Q))
    usage[0] = UsageHour(start=usage[0].start, samples=0)
    assert run("RTX6000-12Q", usage).action == INSUFFICIENT_DATA


def idle(count: int, start: datetime) -> list[UsageHour]:
    """Hours of a VM nobody uses: GPU at 1%, the desktop's 600 MiB of frame buffer."""
    return [
        UsageHour(start=start + timedelta(hours=i), samples=360, fb_used_mib_avg=600, fb_used_mib_max=650,
                  fb_used_mib_p95=640, util_gpu_avg=1, util_gpu_p95=2, enc_util_avg=0, enc_util_max=0)
        for i in range(count)
    ]


def test_a_mostly_idle_vm_has_not_enough_data():
    busy_23 = hours(23, p95=5000) + idle(100, MONDAY + timedelta(days=2))
    advice = run("RTX6000-12Q", busy_23)
    assert advice.action == INSUFFICIENT_DATA
    assert advice.reason == "active in 23 of 123 h of data, idle otherwise; needs 24 active h"
    assert run("RTX6000-12Q", hours(24, p95=5000) + idle(100, MONDAY + timedelta(days=2))).action != INSUFFICIENT_DATA


def test_idle_nights_and_weekends_do_not_dilute_a_busy_artists_mean():
    """Two weeks, busy 9:00-19:00 on weekdays at mean 73% of a 12Q, idle otherwise: upsize.
    Counting the idle hours would bring the mean to 25% and suggest a downsize instead."""
    usage = []
    for day in range(14):
        start = MONDAY + timedelta(days=day)
        if start.weekday() < 5:
            usage += idle(9, start)
            usage += hours(10, p95=pct_of(80, TWELVE_Q), mean=pct_of(73, TWELVE_Q), start=start + timedelta(hours=9))
            usage += idle(5, start + timedelta(hours=19))
        else:
            usage += idle(24, start)
    advice = run("RTX6000-12Q", usage)
    assert advice.evidence["covered_hours"] == 14 * 24
    assert advice.evidence["active_hours"] == 100
    assert advice.evidence["fb_mean_pct"] == 73.0
    assert advice.action == UPSIZE
    assert len(advice.evidence["daily"]) == 14


def test_an_hour_counts_as_active_on_gpu_load_or_on_frame_buffer_held():
    thresholds = Thresholds()

    def hour(util, fb_avg):
        return UsageHour(start=MONDAY, samples=60, util_gpu_p95=util, fb_used_mib_avg=fb_avg)

    assert is_active_hour(hour(5, 0), TWELVE_Q, thresholds)
    assert not is_active_hour(hour(4.9, 0), TWELVE_Q, thresholds)
    # A scene left open overnight: idle GPU, a quarter of the profile held.
    assert is_active_hour(hour(0, 0.25 * TWELVE_Q), TWELVE_Q, thresholds)
    assert not is_active_hour(hour(0, 0.24 * TWELVE_Q), TWELVE_Q, thresholds)
    # No utilization reading at all (metric not supported): frame buffer alone decides.
    assert is_active_hour(UsageHour(start=MONDAY, samples=60, fb_used_mib_avg=5000), TWELVE_Q, thresholds)


def test_hours_under_another_profile_size_are_left_out():
    """After a resize from 12Q to 24Q, the 12Q hours do not describe the 24Q: wait for new data."""
    before = hours(200, p95=pct_of(95, TWELVE_Q), profile_fb=TWELVE_Q)
    after = hours(30, p95=6000, profile_fb=24 * GIB, start=MONDAY + timedelta(days=9))
    advice = run("RTX6000-24Q", before + after)
    assert advice.action == INSUFFICIENT_DATA
    assert advice.reason == "30 h of data in 14 days; needs 72 h (200 h under another profile size left out)"
    assert advice.evidence["other_size_hours"] == 200


def test_hours_with_not_every_vgpu_reported_are_left_out():
    """A two-vGPU VM whose second vGPU went unreported reads half its frame buffer in those hours:
    they must not pull the figures down into a downsize."""
    complete = hours(100, p95=pct_of(60, 2 * TWELVE_Q), mean=pct_of(55, 2 * TWELVE_Q))
    halves = [replace(h, start=h.start + timedelta(days=5), partial=True)
              for h in hours(200, p95=pct_of(30, 2 * TWELVE_Q), mean=pct_of(28, 2 * TWELVE_Q), util=10)]
    advice = run("L40S-12Q", complete + halves, vgpus=2)
    assert advice.action == KEEP
    assert (advice.evidence["covered_hours"], advice.evidence["partial_hours"]) == (100, 200)
    assert advice.evidence["fb_p95_pct"] == 60.0

    only_halves = run("L40S-12Q", halves, vgpus=2)
    assert only_halves.action == INSUFFICIENT_DATA
    assert only_halves.reason == ("0 h of data in 14 days; needs 72 h (200 h with not every vGPU reported "
                                  "left out)")
    # Read as whole hours, the same readings would have asked for a smaller profile.
    assert run("L40S-12Q", [replace(h, partial=False) for h in halves], vgpus=2).action == DOWNSIZE


def test_thresholds_are_tunable():
    usage = hours(100, p95=pct_of(85, TWELVE_Q), mean=pct_of(50, TWELVE_Q))
    assert run("RTX6000-12Q", usage).action == KEEP
    strict = Thresholds(fb_high_pct=80)
    advice = run("RTX6000-12Q", usage, thresholds=strict)
    assert advice.action == UPSIZE
    assert advice.evidence["thresholds"]["fb_high_pct"] == 80


# Evidence --------------------------------------------------------------------------------

EVIDENCE_KEYS = {
    "window_days", "covered_hours", "active_hours", "other_size_hours", "partial_hours", "fb_p95_mib", "fb_peak_mib",
    "fb_mean_mib", "fb_p95_pct", "fb_peak_pct", "fb_mean_pct", "hours_over_high_pct", "util_gpu_p95_pct",
    "util_gpu_mean_pct", "enc_util_max_pct", "enc_util_mean_pct", "current_profile", "vgpus", "profile_fb_mib",
    "suggested_profile", "suggested_vgpus", "suggested_fb_mib", "thresholds", "daily",
}


@pytest.mark.parametrize("usage", [
    hours(100, p95=pct_of(95, TWELVE_Q)),  # upsize
    hours(100, p95=5000, mean=4000, peak=5500),  # downsize
    hours(100, p95=pct_of(60, TWELVE_Q)),  # keep
    hours(10, p95=5000),  # insufficient data
    hours(100, p95=5000, enc=None),  # no encoder readings
], ids=["upsize", "downsize", "keep", "insufficient", "no-encoder"])
def test_evidence_has_the_same_keys_whatever_the_action_and_is_json(usage):
    advice = run("RTX6000-12Q", usage)
    assert set(advice.evidence) == EVIDENCE_KEYS
    assert json.loads(json.dumps(advice.evidence)) == advice.evidence
    assert advice.evidence["profile_fb_mib"] == TWELVE_Q


def test_evidence_figures_are_hand_checkable():
    usage = hours(48, p95=6144, mean=4096, peak=7000, util=30, enc=12) + hours(
        48, p95=3072, mean=2048, peak=3500, util=10, enc=4, start=MONDAY + timedelta(days=2))
    evidence = run("RTX6000-12Q", usage).evidence
    assert evidence["fb_p95_mib"] == 6144  # the p95 of 96 hourly p95s, half of them 6144
    assert evidence["fb_p95_pct"] == 50.0
    assert evidence["fb_peak_mib"] == 7000
    assert evidence["fb_mean_mib"] == 3072.0  # equal samples: the plain mean of 4096 and 2048
    assert evidence["fb_mean_pct"] == 25.0
    assert evidence["hours_over_high_pct"] == 0.0
    assert evidence["util_gpu_p95_pct"] == 30
    assert evidence["util_gpu_mean_pct"] == 16.0  # averages are 80% of the p95s: 24 and 8
    assert evidence["enc_util_max_pct"] == 12
    assert evidence["enc_util_mean_pct"] == 4.0
    assert evidence["daily"][0] == {"date": "2025-03-03", "fb_p95_mib": 6144, "fb_peak_mib": 7000,
                                    "util_gpu_p95_pct": 30}
    assert evidence["daily"][-1]["date"] == "2025-03-06"
    assert [day["fb_peak_mib"] for day in evidence["daily"]] == [7000, 7000, 3500, 3500]


def test_the_mean_weighs_hours_by_their_samples():
    full = hours(80, p95=4000, mean=4000, samples=360)
    thin = hours(20, p95=8000, mean=8000, samples=36, start=MONDAY + timedelta(days=4))
    evidence = run("RTX6000-12Q", full + thin).evidence
    assert evidence["fb_mean_mib"] == round((80 * 360 * 4000 + 20 * 36 * 8000) / (80 * 360 + 20 * 36), 1)


def test_hours_over_high_counts_hourly_peaks_above_90_percent():
    usage = hours(90, p95=5000, peak=6000) + hours(10, p95=5000, peak=11500, start=MONDAY + timedelta(days=5))
    assert run("RTX6000-12Q", usage).evidence["hours_over_high_pct"] == 10.0


def test_evidence_key_holds_under_small_drifts_and_changes_with_the_advice():
    base = run("RTX6000-12Q", hours(100, p95=pct_of(61.0, TWELVE_Q), mean=pct_of(41, TWELVE_Q)))
    drifted = run("RTX6000-12Q", hours(100, p95=pct_of(61.6, TWELVE_Q), mean=pct_of(41.4, TWELVE_Q)))
    moved = run("RTX6000-12Q", hours(100, p95=pct_of(68, TWELVE_Q), mean=pct_of(41, TWELVE_Q)))
    upsized = run("RTX6000-12Q", hours(100, p95=pct_of(95, TWELVE_Q), mean=pct_of(41, TWELVE_Q)))
    assert base.action == drifted.action == moved.action == KEEP
    assert evidence_key(base) == evidence_key(drifted)
    assert evidence_key(base) != evidence_key(moved)
    assert evidence_key(base) != evidence_key(upsized)
    assert len(evidence_key(base)) == 64


def test_evidence_key_of_insufficient_data_holds_while_data_accumulates():
    early, later = run("RTX6000-12Q", hours(40, p95=5000)), run("RTX6000-12Q", hours(41, p95=9000))
    assert early.action == later.action == INSUFFICIENT_DATA
    assert evidence_key(early) == evidence_key(later)

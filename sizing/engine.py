"""Right-sizing: which vGPU profile a VM should have, from what it really used.

Pure functions, no ORM: `sizing.suggestions` reads a VM's hourly rollups, turns them into
`UsageHour`s and calls `advise`. NVIDIA's rule of thumb (vgpu-facts.md section 5): a VM's
frame buffer should not often exceed 90% nor average above 70% of its profile.

How advice is reached, in order (each step documented where it is coded):

1. **Which hours.** Hours with samples, recorded under the VM's current frame buffer
   (`UsageHour.profile_fb_mib` equal to current x vGPUs, or unknown). Hours recorded under
   another size are left out: usage under a smaller profile is capped by it, and applications
   size their caches to what they are given, so after a resize the advice waits for fresh data
   instead of flip-flopping on the old size's figures.
2. **Coverage.** Too few covered hours (`min_covered_hours`, three days) or too few *active*
   hours (`min_active_hours`) give "insufficient_data", with the figures in the reason.
3. **Figures over active hours only** (`is_active_hour`), so idle nights and weekends do not
   drag the averages down and make a busy artist's VM look oversized.
4. **Upsize** when the frame buffer is often above 90% (window p95 above `fb_high_pct`) or
   its mean above 70% (`fb_avg_high_pct`) of the profile: to the smallest larger profile that
   satisfies both rules again; past a whole GPU, one more vGPU of the largest profile.
5. **Downsize** to the smallest smaller profile that keeps the same headroom (p95 <= 90%,
   mean <= 70%, peak <= 100% of the smaller size), unless the GPU load would not fit the
   smaller slice's fixed share or the encoder is busy.
6. **Keep** otherwise, with the figures in the reason.

All frame buffer figures are totals over the VM's vGPUs (telemetry sums them) and percentages
are of the VM's total profile frame buffer (profile x vGPUs).
"""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field, replace
from datetime import datetime

from fleet.placement import MAX_VGPUS_PER_VM, ProfileSpec
from telemetry.aggregation import percentile_nearest_rank

UPSIZE = "upsize"
DOWNSIZE = "downsize"
KEEP = "keep"
INSUFFICIENT_DATA = "insufficient_data"

# Frame buffer may not exceed the profile: a smaller profile must hold the VM's peak whole.
FB_PEAK_MAX_PCT = 100.0
# Comparisons of a figure with a threshold tolerate float noise: a p95 of exactly 90% of the
# profile is "at most 90%", not "above 90%", whatever binary rounding made of 0.9 x 12288.
_EPSILON_PCT = 1e-9


@dataclass(frozen=True)
class UsageHour:
    """One hourly rollup of a VM (telemetry's VmRollup at step 3600): frame buffer in MiB over all
    the VM's vGPUs, utilizations in percent of the physical GPU, and the frame buffer the VM's
    profiles gave it in that hour."""

    start: datetime
    samples: int
    fb_used_mib_avg: float | None = None
    fb_used_mib_max: float | None = None
    fb_used_mib_p95: float | None = None
    util_gpu_avg: float | None = None
    util_gpu_p95: float | None = None
    enc_util_avg: float | None = None
    enc_util_max: float | None = None
    profile_fb_mib: float | None = None
    #: Some reading of the hour lacked one of the VM's vGPUs (telemetry.rollups): the frame buffer
    #: is a share of the VM's, so the hour is left out of the advice.
    partial: bool = False


@dataclass(frozen=True)
class Thresholds:
    """The figures advice turns on; defaults follow NVIDIA's guidance, admins may tune them.

    `idle_util_pct` and `idle_fb_pct` decide which hours count as worked (`is_active_hour`);
    `enc_busy_pct` is the encoder load at which a VM is never downsized (remote-display
    sessions share the GPU's encoder with every other vGPU on it).
    """

    window_days: int = 14
    min_covered_hours: int = 72
    min_active_hours: int = 24
    fb_high_pct: float = 90.0
    fb_avg_high_pct: float = 70.0
    idle_util_pct: float = 5.0
    idle_fb_pct: float = 25.0
    enc_busy_pct: float = 80.0


@dataclass(frozen=True)
class Advice:
    """What `advise` concludes for one VM.

    `suggested` is the profile each of the VM's vGPUs should have (None for keep and for
    insufficient data) and `suggested_vgpus` the number of vGPUs when that should change.
    `evidence` is JSON-serialisable: the figures behind the advice and a daily series for a
    small chart.
    """

    action: str
    current: ProfileSpec
    vgpus: int
    suggested: ProfileSpec | None = None
    suggested_vgpus: int | None = None
    reason: str = ""
    evidence: dict = field(default_factory=dict)


@dataclass(frozen=True)
class UsageFigures:
    """What a VM used over the window, computed by `usage_figures` (MiB and percent of the GPU).

    `covered_hours` counts hours with samples under the current size, `other_size_hours` those
    left out because another profile size was in place, `partial_hours` those left out because
    not every vGPU of the VM reported (their frame buffer would read low and invite a downsize),
    `active_hours` the covered hours in
    which the artist worked. The fb and util figures are over active hours and None when no
    active hour reported them.
    """

    covered_hours: int
    other_size_hours: int
    active_hours: int
    partial_hours: int
    fb_p95_mib: float | None
    fb_peak_mib: float | None
    fb_mean_mib: float | None
    hours_over_high_pct: float | None
    util_gpu_p95_pct: float | None
    util_gpu_mean_pct: float | None
    enc_util_max_pct: float | None
    enc_util_mean_pct: float | None
    daily: tuple[dict, ...] = ()


# Hours -----------------------------------------------------------------------------------


def is_active_hour(hour: UsageHour, profile_fb_mib: float, thresholds: Thresholds) -> bool:
    """Whether the artist worked in this hour, so that it counts in the VM's figures.

    Active when the GPU was busy (hourly util p95, or the average where no p95 was recorded, at
    least `idle_util_pct`) OR the frame buffer held was substantial (hourly average at least
    `idle_fb_pct` of the profile). The second arm exists because a scene left open overnight
    holds its frame buffer although the GPU idles, and that memory is real demand the profile
    must provide; a desktop at the login screen holds a few hundred MiB and stays below it.
    """
    util = hour.util_gpu_p95 if hour.util_gpu_p95 is not None else hour.util_gpu_avg
    if util is not None and util >= thresholds.idle_util_pct:
        return True
    return hour.fb_used_mib_avg is not None and hour.fb_used_mib_avg * 100 >= thresholds.idle_fb_pct * profile_fb_mib


def _same_size(hour: UsageHour, profile_fb_mib: float) -> bool:
    return hour.profile_fb_mib is None or abs(hour.profile_fb_mib - profile_fb_mib) < 0.5


def _first(*values: float | None) -> float | None:
    return next((v for v in values if v is not None), None)


def _weighted_mean(pairs: list[tuple[float, int]]) -> float | None:
    """Sample-weighted mean of hourly averages: an hour with half its samples weighs half."""
    weight = sum(samples for _, samples in pairs)
    return math.fsum(value * samples for value, samples in pairs) / weight if weight else None


def usage_figures(hours: Sequence[UsageHour], profile_fb_mib: float, thresholds: Thresholds) -> UsageFigures:
    """The VM's usage over the window, against `profile_fb_mib` (its total profile frame buffer).

    - **fb p95** is the nearest-rank 95th percentile of the active hours' p95s (an hour without
      p95 contributes its max, else its average). It is not the p95 of every reading, which
      hourly rollups cannot give, but it reads as plainly: in 95% of the active hours the VM
      spent at least 95% of the hour at or below it. So "p95 above 90% of the profile" means
      "in more than 5% of active hours the VM spent more than 5% of the hour above 90%", which
      is how NVIDIA's "often" is taken here.
    - **fb peak** is the largest hourly max; **fb mean** the sample-weighted mean of hourly
      averages; **hours over high** the share (0-100) of active hours whose max exceeded
      `fb_high_pct` of the profile.
    - **util p95** the nearest-rank p95 of hourly util p95s (the busiest vGPU, in % of the
      physical GPU), **util mean** sample-weighted; **enc max / mean** likewise.
    - **daily**: one entry per calendar day of `start` (the caller passes times in the zone
      the chart shows) with data, max over that day's covered hours, for a small chart.
    """
    with_samples = [h for h in hours if h.samples > 0]
    covered = [h for h in with_samples if not h.partial]
    current = [h for h in covered if _same_size(h, profile_fb_mib)]
    active = [h for h in current if is_active_hour(h, profile_fb_mib, thresholds)]

    fb_p95s = [v for h in active if (v := _first(h.fb_used_mib_p95, h.fb_used_mib_max, h.fb_used_mib_avg)) is not None]
    fb_maxes = [v for h in active if (v := _first(h.fb_used_mib_max, h.fb_used_mib_p95, h.fb_used_mib_avg)) is not None]
    util_p95s = [v for h in active if (v := _first(h.util_gpu_p95, h.util_gpu_avg)) is not None]
    enc_maxes = [v for h in active if (v := _first(h.enc_util_max, h.enc_util_avg)) is not None]
    high_mib = thresholds.fb_high_pct * profile_fb_mib / 100
    over_high = sum(1 for v in fb_maxes if v > high_mib)

    return UsageFigures(
        covered_hours=len(current),
        other_size_hours=len(covered) - len(current),
        active_hours=len(active),
        partial_hours=len(with_samples) - len(covered),
        fb_p95_mib=percentile_nearest_rank(fb_p95s, 95),
        fb_peak_mib=max(fb_maxes) if fb_maxes else None,
        fb_mean_mib=_weighted_mean([(h.fb_used_mib_avg, h.samples) for h in active if h.fb_used_mib_avg is not None]),
        hours_over_high_pct=100 * over_high / len(fb_maxes) if fb_maxes else None,
        util_gpu_p95_pct=percentile_nearest_rank(util_p95s, 95),
        util_gpu_mean_pct=_weighted_mean([(h.util_gpu_avg, h.samples) for h in active if h.util_gpu_avg is not None]),
        enc_util_max_pct=max(enc_maxes) if enc_maxes else None,
        enc_util_mean_pct=_weighted_mean([(h.enc_util_avg, h.samples) for h in active if h.enc_util_avg is not None]),
        daily=_daily(current),
    )


def _daily(hours: list[UsageHour]) -> tuple[dict, ...]:
    days: dict[str, dict] = {}
    for hour in sorted(hours, key=lambda h: h.start):
        day = days.setdefault(hour.start.date().isoformat(),
                              {"fb_p95_mib": [], "fb_peak_mib": [], "util_gpu_p95_pct": []})
        for key, value in (
            ("fb_p95_mib", _first(hour.fb_used_mib_p95, hour.fb_used_mib_max, hour.fb_used_mib_avg)),
            ("fb_peak_mib", _first(hour.fb_used_mib_max, hour.fb_used_mib_p95, hour.fb_used_mib_avg)),
            ("util_gpu_p95_pct", _first(hour.util_gpu_p95, hour.util_gpu_avg)),
        ):
            if value is not None:
                day[key].append(value)
    return tuple(
        {"date": date, **{key: _round(max(values)) if values else None for key, values in series.items()}}
        for date, series in days.items()
    )


# Advice ----------------------------------------------------------------------------------


def _pct(mib: float, total_mib: float) -> float:
    return 100 * mib / total_mib


def _within(mib: float, limit_pct: float, total_mib: float) -> bool:
    """Whether `mib` is at most `limit_pct` percent of `total_mib` (float noise tolerated)."""
    return _pct(mib, total_mib) <= limit_pct + _EPSILON_PCT


def _headroom_ok(figures: UsageFigures, total_mib: float, thresholds: Thresholds) -> bool:
    """NVIDIA's two rules under a frame buffer of `total_mib`: p95 <= 90% and mean <= 70%."""
    return (_within(figures.fb_p95_mib, thresholds.fb_high_pct, total_mib)
            and (figures.fb_mean_mib is None or _within(figures.fb_mean_mib, thresholds.fb_avg_high_pct, total_mib)))


def _vm_limit(*profiles: ProfileSpec) -> int:
    return min([MAX_VGPUS_PER_VM, *(p.max_per_vm for p in profiles)])


def advise(current: ProfileSpec, vgpus: int, hours: Sequence[UsageHour], options: Sequence[ProfileSpec],
           thresholds: Thresholds = Thresholds(), *, multi_vgpu_full_only: bool = False) -> Advice:
    """The right size for a VM holding `vgpus` vGPUs of `current`, given its hourly usage over the
    window and the profiles it could take instead (`options`: same board and series; profiles
    of another board or series are ignored, `current` is always an option).

    Returns an Advice whose action is upsize, downsize, keep or insufficient_data, with a reason
    for people and the evidence (see `build_evidence`). `multi_vgpu_full_only` is the board's
    rule that a VM with several vGPUs may only combine full-GPU profiles (Quadro RTX 6000/8000,
    T4: `GpuModelSpec.multi_vgpu_full_only`); with it, a multi-vGPU VM is never offered a
    partial profile.
    """
    vgpus = max(vgpus, 1)
    total_mib = current.fb_mib * vgpus
    same_board = sorted(
        {p for p in options if p.gpu_model == current.gpu_model and p.series == current.series} | {current},
        key=lambda p: (p.fb_mib, p.id),
    )
    figures = usage_figures(hours, total_mib, thresholds)

    def done(action, reason, suggested=None, suggested_vgpus=None):
        advice = Advice(action=action, current=current, vgpus=vgpus, suggested=suggested,
                        suggested_vgpus=suggested_vgpus, reason=reason)
        return replace(advice, evidence=build_evidence(advice, figures, thresholds))

    missing = _coverage_gap(figures, thresholds)
    if missing:
        return done(INSUFFICIENT_DATA, missing)

    state = _describe(figures, total_mib)
    if not _headroom_ok(figures, total_mib, thresholds):
        return _upsize(current, vgpus, figures, same_board, thresholds, state, done)
    return _downsize(current, vgpus, figures, same_board, thresholds, state, done, multi_vgpu_full_only)


def _coverage_gap(figures: UsageFigures, thresholds: Thresholds) -> str:
    """Why the data cannot support advice ("" when it can), with the figures."""
    if figures.covered_hours < thresholds.min_covered_hours:
        reason = (f"{figures.covered_hours} h of data in {thresholds.window_days} days; "
                  f"needs {thresholds.min_covered_hours} h")
        left_out = [f"{figures.other_size_hours} h under another profile size"] if figures.other_size_hours else []
        if figures.partial_hours:
            left_out.append(f"{figures.partial_hours} h with not every vGPU reported")
        if left_out:
            reason += f" ({' and '.join(left_out)} left out)"
        return reason
    if figures.active_hours < thresholds.min_active_hours:
        return (f"active in {figures.active_hours} of {figures.covered_hours} h of data, idle otherwise; "
                f"needs {thresholds.min_active_hours} active h")
    if figures.fb_p95_mib is None:
        return f"no frame buffer readings in {figures.active_hours} active h"
    return ""


def _describe(figures: UsageFigures, total_mib: float) -> str:
    """The figures an admin reads first: "p95 7.1 GiB = 59% of 12 GiB; mean 41%; peak 80%"."""
    text = f"p95 {_gib(figures.fb_p95_mib)} = {_fmt_pct(_pct(figures.fb_p95_mib, total_mib))} of {_gib(total_mib)}"
    if figures.fb_mean_mib is not None:
        text += f"; mean {_fmt_pct(_pct(figures.fb_mean_mib, total_mib))}"
    return text + f"; peak {_fmt_pct(_pct(figures.fb_peak_mib, total_mib))}"


# `done(action, reason, suggested=None, suggested_vgpus=None)` builds the Advice with its evidence.
_Done = Callable[..., Advice]


def _upsize(current: ProfileSpec, vgpus: int, figures: UsageFigures, same_board: list[ProfileSpec],
            thresholds: Thresholds, state: str, done: _Done) -> Advice:
    """The smallest step up that satisfies both rules again: a larger profile with the same vGPU
    count first, then (past the largest profile) more vGPUs of the largest, up to the VM limit.
    When even the largest step would not satisfy them, the largest step is suggested anyway:
    measured use cannot exceed the current profile, so the next run, on data under the new
    size, decides whether more is needed."""
    largest = same_board[-1]
    steps = [(p, vgpus) for p in same_board if p.fb_mib > current.fb_mib and _vm_limit(p) >= vgpus]
    steps += [(largest, n) for n in range(vgpus + 1, _vm_limit(current, largest) + 1)]
    if not steps:
        return done(KEEP, f"{state}: over NVIDIA's limits, and {vgpus} x {current.name} is the most this "
                          f"board offers a VM; a board with more frame buffer is needed")
    target, count = next((s for s in steps if _headroom_ok(figures, s[0].fb_mib * s[1], thresholds)), steps[-1])
    target_mib = target.fb_mib * count
    why = []
    if not _within(figures.fb_p95_mib, thresholds.fb_high_pct, current.fb_mib * vgpus):
        why.append(f"p95 over {_fmt_pct(thresholds.fb_high_pct)}")
    if figures.fb_mean_mib is not None and not _within(figures.fb_mean_mib, thresholds.fb_avg_high_pct,
                                                        current.fb_mib * vgpus):
        why.append(f"mean over {_fmt_pct(thresholds.fb_avg_high_pct)}")
    size = f"{count} x {target.name}" if count != 1 or vgpus != 1 else target.name
    reason = (f"{state} ({' and '.join(why)}); {size} brings p95 to "
              f"{_fmt_pct(_pct(figures.fb_p95_mib, target_mib))}")
    if figures.fb_mean_mib is not None:
        reason += f", mean to {_fmt_pct(_pct(figures.fb_mean_mib, target_mib))}"
    if count > vgpus:
        # Each vGPU's frame buffer is its own GPU's: a renderer spreads over them, a viewport does not.
        reason += "; a single-GPU application needs a board with more frame buffer instead"
    return done(UPSIZE, reason, suggested=target, suggested_vgpus=count if count != vgpus else None)


def _downsize(current: ProfileSpec, vgpus: int, figures: UsageFigures, same_board: list[ProfileSpec],
              thresholds: Thresholds, state: str, done: _Done, multi_vgpu_full_only: bool) -> Advice:
    """The smallest smaller profile (same vGPU count) that keeps the same headroom, else keep.

    A candidate must hold p95 <= 90%, mean <= 70% and peak <= 100% of its size (never below
    what was really used), and two blocks apply:

    - **Fixed share**: under fixed-share scheduling a vGPU gets 1/max_per_gpu of the GPU's time
      (a 6Q on a Quadro RTX 6000: 25%). A VM whose util p95 exceeds that share would be slowed,
      so such a candidate is skipped; a larger smaller profile may still fit. Applied whatever
      the GPU's current policy: an admin may switch to fixed share, and a denser GPU leaves
      each VM less time under any policy.
    - **Encoder**: with an encoder max at `enc_busy_pct` or above, no downsize at all: a smaller
      profile packs more VMs onto the GPU, whose encoder their remote-display sessions share.
    """
    if multi_vgpu_full_only and vgpus > 1:
        return done(KEEP, f"{state}; on this board a VM with several vGPUs may only hold whole-GPU profiles")
    smaller = [p for p in same_board if p.fb_mib < current.fb_mib and _vm_limit(p) >= vgpus]
    fitting = [
        p for p in smaller
        if _headroom_ok(figures, p.fb_mib * vgpus, thresholds)
        and _within(figures.fb_peak_mib, FB_PEAK_MAX_PCT, p.fb_mib * vgpus)
    ]
    if not fitting:
        return done(KEEP, f"{state}; no smaller profile keeps that headroom" if smaller else state)
    enc = figures.enc_util_max_pct
    if enc is not None and enc >= thresholds.enc_busy_pct:
        return done(KEEP, f"{state}; {fitting[0].name} would hold the frame buffer, but the encoder peaks at "
                          f"{_fmt_pct(enc)}: remote display would suffer on a fuller GPU")
    util = figures.util_gpu_p95_pct
    target = next((p for p in fitting if util is None or util <= 100 / p.max_per_gpu + _EPSILON_PCT), None)
    if target is None:
        return done(KEEP, f"{state}; {fitting[0].name} would hold the frame buffer, but GPU load p95 "
                          f"{_fmt_pct(util)} exceeds the fixed share of every smaller profile "
                          f"({fitting[-1].name}: {_fmt_pct(100 / fitting[-1].max_per_gpu)})")
    target_mib = target.fb_mib * vgpus
    reason = (f"{state}; {target.name} keeps p95 at {_fmt_pct(_pct(figures.fb_p95_mib, target_mib))}, "
              f"peak {_fmt_pct(_pct(figures.fb_peak_mib, target_mib))}")
    if figures.fb_mean_mib is not None:
        reason += f", mean {_fmt_pct(_pct(figures.fb_mean_mib, target_mib))}"
    if target is not fitting[0]:
        reason += f" ({fitting[0].name} would hold the frame buffer but not GPU load p95 {_fmt_pct(util)})"
    return done(DOWNSIZE, reason, suggested=target)


# Evidence --------------------------------------------------------------------------------


def build_evidence(advice: Advice, figures: UsageFigures, thresholds: Thresholds) -> dict:
    """The figures behind `advice`, JSON-serialisable, keys stable whatever the action.

    Frame buffer in MiB and in % of the VM's total profile frame buffer (`profile_fb_mib`,
    profile x vGPUs); `suggested_fb_mib` is the suggested total (None when nothing is
    suggested). Figures the data did not give are None. Rounded to 1 decimal.
    """
    total_mib = advice.current.fb_mib * advice.vgpus
    suggested_count = advice.suggested_vgpus or advice.vgpus

    def pct(mib):
        return _round(_pct(mib, total_mib)) if mib is not None else None

    return {
        "window_days": thresholds.window_days,
        "covered_hours": figures.covered_hours,
        "active_hours": figures.active_hours,
        "other_size_hours": figures.other_size_hours,
        "partial_hours": figures.partial_hours,
        "fb_p95_mib": _round(figures.fb_p95_mib),
        "fb_peak_mib": _round(figures.fb_peak_mib),
        "fb_mean_mib": _round(figures.fb_mean_mib),
        "fb_p95_pct": pct(figures.fb_p95_mib),
        "fb_peak_pct": pct(figures.fb_peak_mib),
        "fb_mean_pct": pct(figures.fb_mean_mib),
        "hours_over_high_pct": _round(figures.hours_over_high_pct),
        "util_gpu_p95_pct": _round(figures.util_gpu_p95_pct),
        "util_gpu_mean_pct": _round(figures.util_gpu_mean_pct),
        "enc_util_max_pct": _round(figures.enc_util_max_pct),
        "enc_util_mean_pct": _round(figures.enc_util_mean_pct),
        "current_profile": advice.current.name,
        "vgpus": advice.vgpus,
        "profile_fb_mib": total_mib,
        "suggested_profile": advice.suggested.name if advice.suggested else None,
        "suggested_vgpus": suggested_count if advice.suggested else None,
        "suggested_fb_mib": advice.suggested.fb_mib * suggested_count if advice.suggested else None,
        "thresholds": asdict(thresholds),
        "daily": [dict(day) for day in figures.daily],
    }


# Figures that decide the advice, in the steps `evidence_key` rounds them to.
_KEY_FIGURES = ("fb_p95_pct", "fb_mean_pct", "fb_peak_pct")
_KEY_STEP_PCT = 5


def evidence_key(advice: Advice) -> str:
    """A digest of what an admin saw when dismissing `advice`: the action, current and suggested
    profile and vGPU counts, and the deciding figures (fb p95, mean and peak as % of the profile)
    in steps of 5 points.

    Why coarse: suggestions refresh hourly and each refresh moves a 14-day p95 by a fraction
    of a point; a key on exact figures would bring a dismissed suggestion back every hour. A
    change of the advice itself, or a drift of 5 points of the profile (the kind that would
    change an admin's mind), gives a new key and shows the suggestion again. Insufficient data
    keys on the action alone, since its figures grow every hour by design.
    """
    parts = {"action": advice.action, "current": advice.current.name, "vgpus": advice.vgpus}
    if advice.action != INSUFFICIENT_DATA:
        parts["suggested"] = advice.suggested.name if advice.suggested else None
        parts["suggested_vgpus"] = advice.suggested_vgpus
        for name in _KEY_FIGURES:
            value = advice.evidence.get(name)
            parts[name] = None if value is None else int(value // _KEY_STEP_PCT)
    return hashlib.sha256(json.dumps(parts, sort_keys=True).encode()).hexdigest()


# Formatting ------------------------------------------------------------------------------


def _round(value: float | None) -> float | None:
    return None if value is None else round(value, 1)


def _fmt_pct(value: float) -> str:
    """A percentage for people: one decimal, dropped when it is zero ("59%", "90.4%")."""
    text = f"{value:.1f}"
    return (text[:-2] if text.endswith(".0") else text) + "%"


def _gib(mib: float) -> str:
    text = f"{mib / 1024:.1f}"
    return (text[:-2] if text.endswith(".0") else text) + " GiB"

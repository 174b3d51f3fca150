"""The demo's simulated guests: each workflow's CPU and memory shape over a working day."""

from __future__ import annotations

import datetime as dt
from statistics import quantiles

from telemetry import guest_sim

#: A Wednesday, 09:45 to 18:00 UTC: the artist is in (arrival 9:00-9:45, leaving after 18:15).
DAY = dt.datetime(2026, 3, 4, 9, 45, tzinfo=dt.UTC).timestamp()


def day_of(workflow: str, vcpus: int = 8, ram_mib: int = 32768, seed: str = "vgpu-1", **kwargs) -> list[dict]:
    """A reading a minute over the working day, lunch left out."""
    readings = []
    for minute in range(0, 8 * 60 + 15):
        t = DAY + minute * 60
        at = guest_sim.clock(t, dt.UTC)
        if 12.0 <= at.hour < 13.5:
            continue
        readings.append(guest_sim.simulate_guest(seed, workflow, "medium", vcpus, ram_mib, t, at, **kwargs))
    return readings


def p95(values: list[float]) -> float:
    return quantiles(values, n=20)[-1]


def test_an_animation_guest_saturates_one_vcpu_and_little_else():
    day = day_of("animation", vcpus=12)
    assert p95([r["vcpu_max_util"] for r in day]) >= 90
    assert min(r["vcpu_max_util"] for r in day) >= 80
    assert p95([r["vcpu_util"] for r in day]) <= 15


def test_a_lighting_guest_loads_every_vcpu_in_bursts():
    day = day_of("lighting")
    busy = [r for r in day if r["vcpu_util"] >= 80]
    assert 0.15 * len(day) <= len(busy) <= 0.6 * len(day)  # about a third of the ten-minute slots
    assert max(r["cpu_steal_pct"] for r in busy) > max(r["cpu_steal_pct"] for r in day if r not in busy)


def test_modeling_uses_a_fraction_of_its_memory_and_compositing_most_of_it():
    modeling, compositing = day_of("modeling"), day_of("compositing")
    assert max(r["ram_used_mib"] for r in modeling) <= 0.22 * 32768  # about 6 of 32 GiB
    assert p95([r["vcpu_util"] for r in modeling]) <= 12
    assert min(r["ram_used_mib"] for r in compositing) >= 0.85 * 32768


def test_busiest_vcpu_is_never_below_the_average_and_figures_are_repeatable():
    for workflow in ("animation", "lighting", "modeling", "compositing", "layout"):
        day = day_of(workflow, vcpus=4)
        assert all(r["vcpu_util"] <= r["vcpu_max_util"] <= 100 for r in day), workflow
        assert day == day_of(workflow, vcpus=4)


def test_a_guest_without_the_balloon_driver_reports_no_memory():
    assert {r["ram_used_mib"] for r in day_of("compositing", reports_memory=False)} == {None}


def test_nights_idle():
    night = DAY + 14 * 3600  # 23:45
    at = guest_sim.clock(night, dt.UTC)
    reading = guest_sim.simulate_guest("vgpu-1", "lighting", "heavy", 16, 98304, night, at)
    assert reading["vcpu_util"] <= 2
    assert reading["ram_used_mib"] < 0.5 * 98304

"""The demo's simulated guests (telemetry/guest_sim.py): the counters a hypervisor would report of
each workflow's VM, read as the live reader reads them (a reading a minute apart, through
`guest_rates.reading`)."""

from __future__ import annotations

import datetime as dt
from statistics import quantiles

from telemetry import guest_sim
from telemetry.guest_rates import GuestReading, reading

S = 1_000_000_000
UUID = "4c1e9a55-0d3c-4e7f-8a90-5b0f6c8e3d1a"
#: A Wednesday, UTC. Every artist is in from 10:00 to 12:30 and from 14:30 to 19:00 (starts
#: move up to an hour past 09:00, lunch with them), and gone from 20:00.
WEDNESDAY = dt.datetime(2026, 3, 4, tzinfo=dt.UTC)
WORKING_HOURS = [(10.0, 12.5), (14.5, 19.0)]


def read(workflow: str, t_s: float, *, vcpus: int = 8, ram_mib: int = 32768, uuid: str = UUID,
         **inputs) -> GuestReading:
    """The live reader's figures at `t_s` (Unix seconds): counters then against a minute before."""
    def at(now_s: float):
        return guest_sim.counters(uuid, workflow, vcpus=vcpus, ram_mib=ram_mib, now_ns=int(now_s * S), **inputs)
    return reading(at(t_s), at(t_s - 60))


def working_day(workflow: str, every_s: int = 300, **kwargs) -> list[GuestReading]:
    """A reading every `every_s` over the Wednesday's working hours."""
    readings = []
    for start_h, end_h in WORKING_HOURS:
        t = WEDNESDAY.timestamp() + start_h * 3600
        while t < WEDNESDAY.timestamp() + end_h * 3600:
            readings.append(read(workflow, t, **kwargs))
            t += every_s
    return readings


def p95(values: list[float]) -> float:
    return quantiles(values, n=20)[-1]


def test_an_animation_guest_saturates_one_vcpu_while_its_average_stays_low():
    day = working_day("animation", vcpus=12)
    assert min(r.vcpu_max_util for r in day) >= 85  # playback's main thread, all day
    assert p95([r.vcpu_max_util for r in day]) >= 90
    assert p95([r.vcpu_util for r in day]) <= 20  # the eleven others near idle


def test_a_lighting_guest_loads_every_vcpu_in_render_bursts_between_interactive_work():
    for uuid in (UUID, "0b0b0b0b-0000-4000-8000-000000000001", "0b0b0b0b-0000-4000-8000-000000000002"):
        day = [r.vcpu_util for r in working_day("lighting", vcpus=16, ram_mib=65536, uuid=uuid)]
        assert max(day) >= 85, uuid  # a render: all 16 vCPUs busy
        assert min(day) <= 30, uuid  # between renders


def test_modeling_uses_far_less_memory_than_its_allocation_and_compositing_most_of_it():
    modeling, compositing = working_day("modeling"), working_day("compositing")
    assert max(r.ram_used_mib for r in modeling) <= 0.25 * 32768  # about 6 of 32 GiB
    assert p95([r.vcpu_util for r in modeling]) <= 15
    assert min(r.ram_used_pct for r in compositing) >= 60


def test_nights_are_idle():
    night = read("lighting", WEDNESDAY.timestamp() + 3 * 3600, vcpus=16, ram_mib=65536)
    assert night.vcpu_max_util < 10
    assert night.ram_used_pct < 60


def test_counters_never_go_back_across_days_and_weeks():
    previous = None
    for step in range(0, 9 * 24 * 3600, 1200):  # nine days every 20 minutes, across a week's end
        current = guest_sim.counters(UUID, "compositing", vcpus=4, ram_mib=16384,
                                     now_ns=int((WEDNESDAY.timestamp() + step) * S), utc_offset_s=3600)
        if previous is not None:
            assert all(now >= before for now, before in zip(current.vcpu_ns, previous.vcpu_ns, strict=True)), step
            assert current.steal_ns >= previous.steal_ns
        previous = current


def test_steal_grows_with_the_hosts_contention():
    alone = working_day("lighting", every_s=1800, contention=guest_sim.contention_for(1))
    crowded = working_day("lighting", every_s=1800, contention=guest_sim.contention_for(12))
    assert sum(r.cpu_steal_pct for r in crowded) > sum(r.cpu_steal_pct for r in alone)
    assert all(0 < r.cpu_steal_pct <= 2 for r in crowded)


def test_a_guest_without_the_balloon_driver_reports_no_memory_never_0():
    day = working_day("compositing", every_s=1800, balloon=False)
    assert {(r.ram_used_mib, r.ram_used_pct) for r in day} == {(None, None)}
    assert all(r.vcpu_util is not None for r in day)  # its CPU is read as any other's


def test_the_same_inputs_give_the_same_counters_and_the_figures_stay_in_range():
    t_ns = int((WEDNESDAY.timestamp() + 15 * 3600) * S)
    for workflow in ("animation", "lighting", "modeling", "compositing", "layout", "unknown"):
        first = guest_sim.counters(UUID, workflow, vcpus=4, ram_mib=8192, now_ns=t_ns)
        assert first == guest_sim.counters(UUID, workflow, vcpus=4, ram_mib=8192, now_ns=t_ns)
        for figures in working_day(workflow, every_s=1800, vcpus=4, ram_mib=8192):
            assert 0 <= figures.vcpu_util <= figures.vcpu_max_util <= 100, workflow
            assert 0 < figures.ram_used_mib < 8192, workflow


def test_local_time_is_the_studios_standard_time_all_year():
    assert guest_sim.standard_offset_s("UTC") == 0
    assert guest_sim.standard_offset_s("Europe/Paris") == 3600  # CET, summer too
    assert guest_sim.standard_offset_s("America/Los_Angeles") == -8 * 3600

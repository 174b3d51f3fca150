"""Guest CPU and memory figures from two readings of a hypervisor's counters (telemetry/guest_rates.py)."""

from telemetry.guest_rates import GuestCounters, reading

UUID = "11111111-1111-4111-8111-111111111111"
S = 1_000_000_000


def counters(at_s: float, vcpu_s: tuple[float, ...], *, steal_s: float | None = None, used: int | None = None,
             **fields) -> GuestCounters:
    return GuestCounters(uuid=UUID, read_at_ns=int(at_s * S), vcpus=len(vcpu_s), ram_mib=32768,
                         vcpu_ns=tuple(int(v * S) for v in vcpu_s),
                         steal_ns=None if steal_s is None else int(steal_s * S), ram_used_mib=used, **fields)


def test_one_saturated_vcpu_of_eight_reads_as_an_eighth_of_the_vm_and_all_of_its_busiest_core():
    before = counters(0, (100, 5, 5, 5, 5, 5, 5, 5), steal_s=1)
    after = counters(60, (160, 5, 5, 5, 5, 5, 5, 6.2), steal_s=1 + 0.48 * 8 * 0.05, used=6144)
    got = reading(after, before)
    assert (got.vcpu_util, got.vcpu_max_util) == (12.75, 100.0)  # (60 + 1.2) s of 8 x 60 s
    assert got.cpu_steal_pct == 0.04
    assert (got.ram_used_mib, got.ram_used_pct) == (6144, 18.75)


def test_without_a_previous_reading_or_after_a_restart_there_is_no_cpu_figure_but_memory_is_read():
    after = counters(60, (10, 10), used=2048)
    assert reading(after, None).vcpu_util is None
    restarted = reading(after, counters(0, (500, 500)))
    assert (restarted.vcpu_util, restarted.vcpu_max_util, restarted.ram_used_mib) == (None, None, 2048)


def test_a_guest_without_the_balloon_driver_reports_memory_as_unknown_never_as_zero():
    got = reading(counters(60, (30, 30)), counters(0, (0, 0)))
    assert (got.vcpu_util, got.ram_used_mib, got.ram_used_pct) == (50.0, None, None)


def test_shares_a_hypervisor_reports_itself_are_kept_as_they_are():
    got = reading(counters(60, (), vcpu_pct=37.5, vcpu_max_pct=91.0, steal_pct=2.5, used=1024), None)
    assert (got.vcpu_util, got.vcpu_max_util, got.cpu_steal_pct, got.ram_used_pct) == (37.5, 91.0, 2.5, 3.12)

"""vCPU and RAM advice from guest readings through the hypervisor, and the combined reading with
the vGPU's advice (sizing/guest_engine.py): one known answer for each case."""

from datetime import UTC, datetime, timedelta

from sizing.guest_engine import (
    CPU_BOUND,
    DOWNSIZE,
    GPU_BOUND,
    HOST_CONTENDED,
    INSUFFICIENT_DATA,
    KEEP,
    MEMORY_BOUND,
    UPSIZE,
    GuestHour,
    HostRoom,
    advise_guest,
    combine,
)

T0 = datetime(2026, 9, 1, tzinfo=UTC)
GIB = 1024


def hours(n: int = 100, *, vcpus: int = 8, ram_gib: int = 32, util: float = 20.0, busiest: float = 40.0,
          steal: float = 0.5, ram_used_gib: float | None = 16.0, ram_peak_gib: float | None = None) -> list[GuestHour]:
    used = None if ram_used_gib is None else ram_used_gib * GIB
    peak = used if ram_peak_gib is None else ram_peak_gib * GIB
    return [GuestHour(start=T0 + timedelta(hours=i), samples=60, vcpus=vcpus, ram_mib=ram_gib * GIB,
                      vcpu_util_avg=util * 0.8, vcpu_util_p95=util, vcpu_max_util_p95=busiest,
                      vcpu_max_util_max=min(100.0, busiest + 5), cpu_steal_pct_avg=steal,
                      ram_used_mib_p95=used, ram_used_mib_max=peak) for i in range(n)]


def test_an_animators_single_saturated_vcpu_is_not_a_reason_for_more_vcpus():
    advice = advise_guest(hours(util=14.0, busiest=98.0), vcpus=8, ram_gib=32)
    assert (advice.cpu_action, advice.suggested_vcpus, advice.single_thread_bound) == (KEEP, None, True)
    assert "one vCPU is saturated (busiest p95 98 %) while the 8 together stay at p95 14 %" in advice.reason


def test_vcpus_busy_together_get_as_many_more_as_bring_them_to_the_target():
    advice = advise_guest(hours(util=90.0, busiest=100.0), vcpus=8, ram_gib=32)
    assert (advice.cpu_action, advice.suggested_vcpus) == (UPSIZE, 12)  # ceil(8 x 90 / 60)


def test_an_increase_the_host_cannot_give_is_capped_and_said():
    advice = advise_guest(hours(util=90.0, busiest=100.0), vcpus=8, ram_gib=32,
                          room=HostRoom("node-01", vcpus=2, ram_gib=0))
    assert (advice.cpu_action, advice.suggested_vcpus) == (UPSIZE, 10)
    assert "node-01 has room for 2 more" in advice.reason


def test_idle_vcpus_give_some_back_but_a_workstation_keeps_at_least_four():
    advice = advise_guest(hours(util=20.0, busiest=30.0, vcpus=16), vcpus=16, ram_gib=32)
    assert (advice.cpu_action, advice.suggested_vcpus) == (DOWNSIZE, 6)  # ceil(16 x 20 / 60)
    assert advise_guest(hours(util=10.0, busiest=30.0, vcpus=16), vcpus=16, ram_gib=32).suggested_vcpus == 4
    assert advise_guest(hours(util=6.0, busiest=20.0, vcpus=4), vcpus=4, ram_gib=32).cpu_action == KEEP


def test_a_modeling_vm_using_6_of_32_gib_gives_ram_back():
    advice = advise_guest(hours(ram_used_gib=5.0, ram_peak_gib=6.0), vcpus=8, ram_gib=32)
    assert (advice.ram_action, advice.suggested_ram_gib) == (DOWNSIZE, 12)  # 6 / 0.7 = 8.6 -> 12 on the ladder
    assert "never used more than 6.0 of its 32 GiB (19 %)" in advice.reason


def test_ram_near_the_allocation_gets_more_within_the_hosts_room():
    advice = advise_guest(hours(ram_used_gib=30.5, ram_peak_gib=31.5), vcpus=8, ram_gib=32)
    assert (advice.ram_action, advice.suggested_ram_gib) == (UPSIZE, 48)  # 30.5 / 0.7 = 43.6 -> 48
    capped = advise_guest(hours(ram_used_gib=30.5, ram_peak_gib=31.5), vcpus=8, ram_gib=32,
                          room=HostRoom("node-01", vcpus=0, ram_gib=4))
    assert (capped.ram_action, capped.suggested_ram_gib) == (KEEP, None)
    assert "node-01 has room for 4 GiB more" in capped.reason


def test_a_guest_that_reports_no_memory_gets_no_ram_advice_never_a_downsize():
    advice = advise_guest(hours(ram_used_gib=None), vcpus=8, ram_gib=32)
    assert (advice.ram_action, advice.suggested_ram_gib) == (INSUFFICIENT_DATA, None)
    assert "reports no memory use: install the balloon driver" in advice.reason
    assert advice.evidence["ram_unreported_hours"] == 100


def test_too_few_hours_or_only_idle_ones_give_no_cpu_advice():
    assert advise_guest(hours(50), vcpus=8, ram_gib=32).cpu_action == INSUFFICIENT_DATA
    assert advise_guest(hours(util=1.0, busiest=2.0), vcpus=8, ram_gib=32).cpu_action == INSUFFICIENT_DATA
    # Hours recorded at another vCPU count do not count for this one.
    assert advise_guest(hours(vcpus=4), vcpus=8, ram_gib=32).cpu_action == INSUFFICIENT_DATA


# Combined ----------------------------------------------------------------------------------------


def test_gpu_idle_and_one_vcpu_saturated_is_cpu_bound_do_not_upsize_the_vgpu():
    guest = advise_guest(hours(util=14.0, busiest=98.0), vcpus=8, ram_gib=32)
    combined = combine("keep", gpu_util_p95=12.0, guest=guest)
    assert (combined.kind, combined.keep_vgpu) == (CPU_BOUND, True)
    assert combined.message.startswith("The GPU idles (p95 12 %) while one vCPU is saturated")
    assert combined.message.endswith("do not upsize the vGPU.")
    # A frame buffer that overflows still needs its upsize: the note says so instead of blocking it.
    assert not combine("upsize", gpu_util_p95=12.0, guest=guest, fb_pressure=True).keep_vgpu


def test_gpu_busy_and_idle_vcpus_is_gpu_bound():
    guest = advise_guest(hours(util=15.0, busiest=40.0), vcpus=8, ram_gib=32)
    assert combine("keep", gpu_util_p95=92.0, guest=guest).kind == GPU_BOUND


def test_short_of_ram_with_a_fine_frame_buffer_is_memory_bound():
    guest = advise_guest(hours(ram_used_gib=31.0, ram_peak_gib=31.8), vcpus=8, ram_gib=32)
    assert combine("keep", gpu_util_p95=50.0, guest=guest).kind == MEMORY_BOUND


def test_vcpus_waiting_for_the_host_is_host_contention_not_the_vms_size():
    guest = advise_guest(hours(util=85.0, busiest=95.0, steal=12.0), vcpus=8, ram_gib=32)
    assert (guest.cpu_action, guest.steal_high) == (KEEP, True)  # no vCPU added for contention
    assert combine("upsize", gpu_util_p95=50.0, guest=guest).kind == HOST_CONTENDED


def test_agreeing_advice_has_no_combined_note():
    guest = advise_guest(hours(util=40.0, busiest=60.0), vcpus=8, ram_gib=32)
    assert combine("keep", gpu_util_p95=50.0, guest=guest) is None

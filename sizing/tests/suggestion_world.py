"""Helpers of the suggestion tests: a small Quadro RTX 6000 fleet and hourly rollups written at
times the tests choose (the rows the hourly rollup task would have built)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from types import SimpleNamespace

from django.utils import timezone

from fleet import services
from fleet.tests.factories import ArtistFactory, GpuFactory, HostFactory, VirtualMachineFactory, profile
from sizing.models import Suggestion, SuggestionAction
from telemetry.aggregation import bucket_floor
from telemetry.models import GuestRollup, VmRollup

#: "Now" of the tests: half past ten, so the hour in progress (10:00-11:00) is left out.
NOW = datetime(2026, 3, 16, 10, 30, tzinfo=UTC)
#: The end of the window at NOW: the start of the hour in progress.
END = datetime(2026, 3, 16, 10, 0, tzinfo=UTC)
TWO_WEEKS_H = 14 * 24
GIB = 1024


def _value(value, i):
    return value(i) if callable(value) else value


def hourly(vm, hours: int, *, fb_mib, util_pct=20.0, enc_pct=0.0, profile_fb_mib=None, end: datetime = END,
           samples: int = 360) -> list[VmRollup]:
    """`hours` hourly rollups of `vm` ending at `end` (the newest bucket starts an hour before it),
    each with frame buffer avg = max = p95 = `fb_mib` and GPU utilization `util_pct`. A callable
    value is called with the hour's index (0 = oldest)."""
    rows = []
    for i in range(hours):
        fb, util, enc = _value(fb_mib, i), _value(util_pct, i), _value(enc_pct, i)
        rows.append(VmRollup(
            vm=vm, step_s=3600, bucket=end - timedelta(hours=hours - i), samples=samples,
            fb_used_mib_avg=fb, fb_used_mib_max=fb, fb_used_mib_p95=fb,
            util_gpu_avg=util, util_gpu_max=util, util_gpu_p95=util,
            enc_util_avg=enc, enc_util_max=enc, profile_fb_mib=profile_fb_mib,
        ))
    return VmRollup.objects.bulk_create(rows)


def guest_hourly(vm, hours: int, *, util_pct: float, busiest_pct: float, ram_used_mib: float | None,
                 steal_pct: float = 0.3, end: datetime = END) -> list[GuestRollup]:
    """`hours` hourly guest rollups of `vm` (its vCPUs and RAM as it has them) ending at `end`:
    its vCPUs together at `util_pct`, the busiest at `busiest_pct`, memory used `ram_used_mib`
    (None: the guest reports none)."""
    return GuestRollup.objects.bulk_create(GuestRollup(
        vm=vm, step_s=3600, bucket=end - timedelta(hours=hours - i), samples=60, vcpus=vm.vcpus,
        ram_mib=vm.ram_gib * GIB, vcpu_util_avg=util_pct, vcpu_util_p95=util_pct, vcpu_util_max=util_pct,
        vcpu_max_util_avg=busiest_pct, vcpu_max_util_p95=busiest_pct, vcpu_max_util_max=busiest_pct,
        cpu_steal_pct_avg=steal_pct, cpu_steal_pct_max=steal_pct, ram_used_mib_avg=ram_used_mib,
        ram_used_mib_p95=ram_used_mib, ram_used_mib_max=ram_used_mib,
    ) for i in range(hours))


def rtx_studio(artist=None) -> SimpleNamespace:
    """Host render-01 with three Quadro RTX 6000 GPUs (24 GB, equal-size mode):

    - GPU 3B: `heavy` (Ana's, or `artist`'s) alone with a 12Q: room to grow to 24Q in place;
    - GPU 5E: `light` (Bob's) with a 24Q it uses 30% of;
    - GPU 86: `peer` (Cleo's) with a 12Q and a free 12Q slot beside it.
    """
    host = HostFactory(name="render-01")
    gpu_1 = GpuFactory(host=host, pci_bus_id="00000000:3B:00.0")
    gpu_2 = GpuFactory(host=host, pci_bus_id="00000000:5E:00.0")
    gpu_3 = GpuFactory(host=host, pci_bus_id="00000000:86:00.0")
    ana = artist or ArtistFactory(name="Ana")
    bob, cleo = ArtistFactory(name="Bob"), ArtistFactory(name="Cleo")
    heavy = VirtualMachineFactory(name="ws-heavy", artist=ana)
    light = VirtualMachineFactory(name="ws-light", artist=bob)
    peer = VirtualMachineFactory(name="ws-peer", artist=cleo)
    q12, q24 = profile("RTX6000-12Q"), profile("RTX6000-24Q")
    services.place_vgpu(heavy, gpu_1, q12)
    services.place_vgpu(light, gpu_2, q24)
    services.place_vgpu(peer, gpu_3, q12)
    return SimpleNamespace(host=host, gpu_1=gpu_1, gpu_2=gpu_2, gpu_3=gpu_3, ana=ana, bob=bob, cleo=cleo,
                           heavy=heavy, light=light, peer=peer, q12=q12, q24=q24)


def two_weeks_of_use(world, end: datetime = END) -> None:
    """Two weeks up to `end` in which heavy uses 94% of its 12Q (upsize), light 30% of its 24Q
    (downsize) and peer 50% of its 12Q (keep)."""
    hourly(world.heavy, TWO_WEEKS_H, fb_mib=11_550, profile_fb_mib=12 * GIB, end=end)
    hourly(world.light, TWO_WEEKS_H, fb_mib=7_372, profile_fb_mib=24 * GIB, end=end)
    hourly(world.peer, TWO_WEEKS_H, fb_mib=6_144, util_pct=40.0, profile_fb_mib=12 * GIB, end=end)


def this_hour() -> datetime:
    """The start of the hour in progress: the end of the window of a refresh run now."""
    return bucket_floor(timezone.now(), 3600)


def suggest(vm, action=SuggestionAction.UPSIZE, target="RTX6000-24Q", reason="Frame buffer p95 at 93% of the profile"):
    """A right-sizing suggestion for `vm`, as the hourly refresh would write it."""
    now = timezone.now()
    return Suggestion.objects.create(
        vm=vm, current_profile=profile("RTX6000-12Q"), suggested_profile=profile(target) if target else None,
        action=action, reason=reason, evidence_key="k1", window_start=now - timedelta(days=14), window_end=now,
        computed_at=now, evidence={"window_days": 14, "fb_p95_mib": 11468.8, "profile_fb_mib": 12288,
                                   "fb_p95_pct": 93.3, "fb_peak_pct": 100.0, "fb_mean_pct": 74.0,
                                   "util_gpu_p95_pct": 41.0,
                                   "impact": {"fits": "same_gpu", "detail": "fits on host-a GPU 00000000:3B:00.0"}},
    )

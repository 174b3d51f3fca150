"""`manage.py backfill_demo`: the demo fleet opens with a history its heatmaps can show."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from django.core.management import CommandError, call_command
from django.db.models import Max

from fleet import demo as fleet_demo
from fleet.models import VirtualMachine
from telemetry import history
from telemetry.models import GpuRollup, GpuSample, GuestRollup, GuestSample, VgpuSample, VmRollup

pytestmark = pytest.mark.django_db

NOW = datetime(2026, 3, 4, 12, 2, 30, tzinfo=UTC)
TIERS = ((0.5, 1800), (0.1, 300))  # half a day every 30 min, the last 2.4 h every 5 min


@pytest.fixture
def demo_agents(tmp_path):
    fleet_demo.seed_demo(hosts=3, admin_password="pass-word-123", artist_password="pass-word-123")
    call_command("demo_agents", "--dir", str(tmp_path), "--base-port", "9611")
    return tmp_path


def test_moments_merge_a_sparse_and_a_dense_tier_up_to_now():
    times = history.moments(NOW, ((1 / 24, 1800), (0.25 / 24, 300)))
    stamps = [datetime.fromtimestamp(t, tz=UTC).strftime("%H:%M") for t in times]
    assert stamps == ["11:30", "11:50", "11:55", "12:00"]


def test_backfill_stores_the_sims_past_readings_and_builds_rollups_over_them(demo_agents):
    from telemetry.models import Agent

    agents = list(Agent.objects.select_related("host"))
    result = history.backfill_history(agents, tiers=TIERS, now=NOW)

    readings = len(history.moments(NOW, TIERS))
    assert result.reports == readings * len(agents)
    oldest = GpuSample.objects.order_by("ts").first().ts
    assert NOW - timedelta(hours=12) <= oldest <= NOW - timedelta(hours=11)
    assert VgpuSample.objects.filter(vm__isnull=False).exists()
    # Every complete hour of the span has hourly rollups of GPUs and VMs; the 5-minute ones
    # reach the last complete bucket before now.
    assert GpuRollup.objects.filter(step_s=3600).values("bucket").distinct().count() >= 11
    assert VmRollup.objects.filter(step_s=3600).exists()
    newest_5m = GpuRollup.objects.filter(step_s=300).order_by("-bucket").first().bucket
    assert newest_5m == datetime(2026, 3, 4, 11, 55, tzinfo=UTC)


def guest_peaks(vm_name: str) -> dict:
    """The highest hourly p95 and max of a demo VM's guest rollups."""
    return GuestRollup.objects.filter(vm__name=vm_name, step_s=3600).aggregate(
        cpu_p95=Max("vcpu_util_p95"), busiest_p95=Max("vcpu_max_util_p95"), cpu_max=Max("vcpu_util_max"),
        ram_max=Max("ram_used_mib_max"), ram_p95=Max("ram_used_mib_p95"), buckets=Max("samples"),
    )


def test_backfill_gives_every_demo_vm_guest_cpu_and_memory_shaped_by_its_workflow(demo_agents):
    """NOW is a Wednesday noon: the half day back-filled holds three working hours."""
    from telemetry.models import Agent

    agents = list(Agent.objects.select_related("host"))
    result = history.backfill_history(agents, tiers=TIERS, now=NOW)

    readings = len(history.moments(NOW, TIERS))
    demo_vms = VirtualMachine.objects.filter(vgpus__isnull=False, host__in=[a.host for a in agents]).distinct()
    assert result.guest_samples == readings * demo_vms.count()
    assert set(GuestSample.objects.values_list("vm_id", flat=True).distinct()) == set(
        demo_vms.values_list("pk", flat=True))
    oldest = GuestSample.objects.order_by("ts").first().ts
    assert oldest == GpuSample.objects.order_by("ts").first().ts  # the same span as the GPU history
    assert GuestRollup.objects.filter(step_s=300).exists()
    assert GuestRollup.objects.filter(step_s=3600).values("bucket").distinct().count() >= 11
    # Animation: one vCPU near saturated, a low average over its 12 vCPUs.
    animation = guest_peaks("poc-animation")
    assert animation["busiest_p95"] >= 80
    assert animation["cpu_p95"] <= 25
    # Lighting: renders load every vCPU.
    assert guest_peaks("poc-lighting")["cpu_max"] >= 80
    # Modeling: 4 to 8 of its 32 GiB.
    modeling = guest_peaks("poc-modeling")
    assert VirtualMachine.objects.get(name="poc-modeling").ram_gib == 32
    assert 4 * 1024 <= modeling["ram_max"] <= 8 * 1024
    assert modeling["cpu_p95"] <= 15
    # The demo's guest without the balloon driver reports no memory, never 0; its CPU is there.
    no_balloon = VirtualMachine.objects.get(pk=fleet_demo.no_balloon_vm_id())
    assert GuestSample.objects.filter(vm=no_balloon).exists()
    assert not GuestSample.objects.filter(vm=no_balloon, ram_used_mib__isnull=False).exists()
    peaks = guest_peaks(no_balloon.name)
    assert peaks["ram_max"] is None
    assert peaks["cpu_p95"] is not None
    assert GuestSample.objects.exclude(vm=no_balloon).filter(ram_used_mib__isnull=True).count() == 0


def test_a_second_backfill_is_skipped_and_a_forced_one_duplicates_nothing(demo_agents):
    from telemetry.models import Agent

    agents = list(Agent.objects.select_related("host"))
    history.backfill_history(agents, tiers=TIERS, now=NOW)
    samples, rollups = GpuSample.objects.count(), GpuRollup.objects.count()

    assert history.backfill_history(agents, tiers=TIERS, now=NOW).skipped
    forced = history.backfill_history(agents, tiers=TIERS, now=NOW, force=True)
    assert not forced.skipped
    assert (GpuSample.objects.count(), GpuRollup.objects.count()) == (samples, rollups)


def test_command_reports_what_it_did_and_refuses_without_demo_agents(demo_agents, tmp_path_factory, capsys):
    call_command("backfill_demo", "--dir", str(demo_agents), "--days", "0.2", "--recent-days", "0.05")
    assert "Back-filled" in capsys.readouterr().out
    call_command("backfill_demo", "--dir", str(demo_agents), "--days", "0.2", "--recent-days", "0.05")
    assert "already present" in capsys.readouterr().out

    with pytest.raises(CommandError, match="run `manage.py demo_agents` first"):
        call_command("backfill_demo", "--dir", str(tmp_path_factory.mktemp("empty")))
    with pytest.raises(CommandError, match="between 0 and 60"):
        call_command("backfill_demo", "--dir", str(demo_agents), "--days", "90")

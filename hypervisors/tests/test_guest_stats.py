"""Storing guest CPU and memory read through a hypervisor link (hypervisors/guest_stats.py): one
sample a VM a reading, shares taken against the counters the last reading left on that host."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest
from django_celery_beat.models import PeriodicTask

from fleet import demo as fleet_demo
from fleet.models import VirtualMachine
from fleet.tests.factories import HostFactory, VirtualMachineFactory
from hypervisors import guest_stats, schedules, sim_seed
from hypervisors.backends import sim
from hypervisors.backends.base import GuestCounters
from telemetry import history
from telemetry.demo import demo_hosts, host_scenario
from telemetry.models import GuestSample

pytestmark = pytest.mark.django_db

S = 1_000_000_000
T0 = 1_790_000_000  # seconds since the epoch: 2026-09-21


def counters(vm, at_s: int, vcpu_s: tuple[int, ...], used: int | None = 4096) -> GuestCounters:
    return GuestCounters(uuid=str(vm.uuid), read_at_ns=at_s * S, vcpus=len(vcpu_s), ram_mib=16384,
                         vcpu_ns=tuple(v * S for v in vcpu_s), ram_used_mib=used)


def test_the_second_reading_of_a_vm_gives_its_cpu_shares_and_each_gives_its_memory():
    host = HostFactory(name="node-01", hypervisor_uri="sim://node-01")
    vm = VirtualMachineFactory(name="ws-anim-01", host=host)

    first = guest_stats.store(host, [counters(vm, T0, (100, 100, 100, 100))])
    second = guest_stats.store(host, [counters(vm, T0 + 60, (160, 103, 103, 106), used=None)])

    assert (first.samples, second.samples) == (1, 1)
    before, after = GuestSample.objects.filter(vm=vm).order_by("ts")
    assert (before.vcpu_util, before.ram_used_mib, before.ram_used_pct) == (None, 4096, 25.0)
    assert (after.vcpu_util, after.vcpu_max_util) == (30.0, 100.0)  # 72 s of 4 x 60 s; one core saturated
    assert (after.vcpus, after.ram_mib, after.ram_used_mib) == (4, 16384, None)  # memory not reported: unknown
    assert (after.ts - before.ts).total_seconds() == 60


def test_a_domain_the_inventory_lacks_is_counted_and_a_vm_read_on_another_host_starts_afresh():
    node1 = HostFactory(name="node-01", hypervisor_uri="sim://node-01")
    node2 = HostFactory(name="node-02", hypervisor_uri="sim://node-02")
    vm = VirtualMachineFactory(name="ws-comp-01", host=node1)
    stranger = GuestCounters(uuid="99999999-9999-4999-8999-999999999999", read_at_ns=T0 * S, vcpus=2,
                             ram_mib=4096)

    assert guest_stats.store(node1, [counters(vm, T0, (10, 10)), stranger]).unknown == 1
    guest_stats.store(node2, [counters(vm, T0 + 60, (70, 70))])  # moved: node-02's counters are its own

    assert [s.vcpu_util for s in GuestSample.objects.filter(vm=vm).order_by("ts")] == [None, None]
    assert GuestSample.objects.count() == 2


def test_a_reading_stored_twice_is_kept_once():
    host = HostFactory(name="node-01", hypervisor_uri="sim://node-01")
    vm = VirtualMachineFactory(name="ws-anim-01", host=host)
    guest_stats.store(host, [counters(vm, T0, (1, 1))])
    guest_stats.store(host, [counters(vm, T0, (1, 1))])
    assert GuestSample.objects.filter(vm=vm).count() == 1


def test_hosts_stored_together_give_what_each_stored_alone_gives_in_the_same_queries():
    """A chunk of hosts is stored in one transaction whose queries do not grow with its hosts,
    and each host's result and samples are its own."""
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    hosts = [HostFactory(name=f"node-{i:02d}", hypervisor_uri=f"sim://node-{i:02d}") for i in range(3)]
    vms = [VirtualMachineFactory(name=f"ws-{i:02d}", host=host) for i, host in enumerate(hosts)]
    stranger = GuestCounters(uuid="99999999-9999-4999-8999-999999999999", read_at_ns=T0 * S, vcpus=2, ram_mib=4096)
    first = [(host, [counters(vm, T0, (10, 10))]) for host, vm in zip(hosts, vms, strict=True)]
    first[1][1].append(stranger)
    with CaptureQueriesContext(connection) as three:
        results = guest_stats.store_chunk(first)
    with CaptureQueriesContext(connection) as one:
        guest_stats.store_chunk([(hosts[0], [counters(vms[0], T0 + 60, (40, 70))])])

    assert [(r.host, r.samples, r.unknown) for r in results] == [("node-00", 1, 0), ("node-01", 1, 1),
                                                                  ("node-02", 1, 0)]
    assert len(three) == len(one)
    latest = GuestSample.objects.filter(vm=vms[0]).order_by("ts").last()
    assert (latest.vcpu_util, latest.vcpu_max_util) == (75.0, 100.0)  # against node-00's own counters
    assert GuestSample.objects.count() == 4


def test_a_run_past_its_deadline_reads_no_more_hosts_and_says_which_wait(settings, tmp_path):
    """A reading task that ran out of time starts no other host: each left is named, with why,
    and nothing is stored for it."""
    import time

    from hypervisors import sim_seed

    settings.HYPERVISOR_SIM_DIR = str(tmp_path)
    hosts = [HostFactory(name=f"node-{i:02d}", hypervisor_uri=f"sim://node-{i:02d}") for i in range(2)]
    for host in hosts:
        VirtualMachineFactory(name=f"ws-{host.name}", host=host)
        sim_seed.seed_host(host)

    late = guest_stats.read_all([h.pk for h in hosts], deadline=time.monotonic() - 1)
    on_time = guest_stats.read_all([h.pk for h in hosts], deadline=time.monotonic() + 60)

    assert [(h.host, h.error) for h in late.hosts] == [(h.name, guest_stats.LEFT_FOR_NEXT_RUN) for h in hosts]
    assert late.samples == 0
    assert [(h.host, h.samples, h.error) for h in on_time.hosts] == [(h.name, 1, "") for h in hosts]
    assert GuestSample.objects.count() == 2


def test_beat_reads_the_guests_every_interval(settings):
    PeriodicTask.objects.filter(name=schedules.READ_GUEST_STATS).delete()
    settings.HYPERVISOR_GUEST_INTERVAL_S = 30
    schedules.ensure_default_schedules()
    entry = PeriodicTask.objects.get(name=schedules.READ_GUEST_STATS)
    assert entry.task == "hypervisors.tasks.read_guest_stats"
    assert (entry.interval.every, entry.expire_seconds) == (30, 27)


def test_a_linked_hosts_guests_are_read_by_the_tasks_and_rolled_up(linked, monkeypatch, settings):
    """Beat's task hands node-01 to a reading task (expiring before the next reading); its
    simulated hypervisor read twice a minute apart on a working afternoon: ws-a (an animator's) has
    one vCPU saturated, ws-b's guest has no balloon driver; the hourly rollup has both."""
    from datetime import timedelta

    from hypervisors import sim_seed, tasks
    from hypervisors.backends import sim
    from telemetry.models import GuestRollup
    from telemetry.rollups import build_rollups

    settings.TIME_ZONE = "UTC"
    linked.vm_a.artist.workflow = "animation"
    linked.vm_a.artist.save()
    linked.vm_b.artist.workflow = "other"
    linked.vm_b.artist.save()
    sim_seed.seed_host(linked.host)
    wednesday = 1_764_169_200 * S  # 15:00 UTC: the artists are at work
    moments = iter([wednesday, wednesday + 60 * S])
    now = next(moments)
    monkeypatch.setattr(sim.time, "time_ns", lambda: now)
    sent = []
    monkeypatch.setattr(tasks.read_guest_stats_hosts, "apply_async",
                        lambda args, expires: sent.append((args, expires)))
    assert tasks.read_guest_stats() == {"hosts": 1, "tasks": 1}
    assert sent == [([[linked.host.pk]], settings.HYPERVISOR_GUEST_INTERVAL_S * 0.9)]
    first = tasks.read_guest_stats_hosts(*sent[0][0])
    now = next(moments)
    second = tasks.read_guest_stats_hosts([linked.host.pk])

    assert (first["samples"], second["samples"], second["failed"]) == (2, 2, 0)
    ana = GuestSample.objects.filter(vm=linked.vm_a).order_by("ts").last()
    assert ana.vcpu_max_util >= 85  # one vCPU saturated
    assert ana.vcpu_util <= 30  # the others idle
    assert GuestSample.objects.filter(vm=linked.vm_b).order_by("ts").last().ram_used_mib is None
    build_rollups(3600, now=ana.ts + timedelta(hours=1), late_s=0)
    hour = GuestRollup.objects.get(vm=linked.vm_a, step_s=3600)
    assert (hour.samples, hour.vcpus, hour.ram_mib) == (2, 8, 32768)
    assert GuestRollup.objects.get(vm=linked.vm_b, step_s=3600).ram_used_mib_p95 is None


def test_the_fleet_is_read_in_chunks_of_hosts_side_by_side(monkeypatch, settings):
    from hypervisors import tasks

    hosts = [HostFactory(name=f"node-{i:02d}", hypervisor_uri=f"sim://node-{i:02d}") for i in range(45)]
    HostFactory(name="unlinked")
    sent = []
    monkeypatch.setattr(tasks.read_guest_stats_hosts, "apply_async", lambda args, expires: sent.append(args[0]))

    assert tasks.read_guest_stats() == {"hosts": 45, "tasks": 3}
    assert [len(chunk) for chunk in sent] == [20, 20, 5]
    assert sorted(pk for chunk in sent for pk in chunk) == sorted(h.pk for h in hosts)


def test_the_demo_history_holds_what_reading_its_simulated_hosts_stores(sim_dir, settings):
    """The back-filled guest history is the live reading in the past: at an instant of it, reading
    every demo host's simulated hypervisor (a minute apart, as beat does) stores for each VM the
    very figures the back-fill stored, the guest without the balloon driver included."""
    settings.TIME_ZONE = "Europe/Paris"
    fleet_demo.seed_demo(hosts=3, admin_password="pass-word-123", artist_password="pass-word-123")
    sim_seed.link_demo_hosts()
    hosts = demo_hosts()
    at_s = 1_772_636_400  # Wednesday 2026-03-04, 16:00 in Paris: every artist at work
    history.backfill_guests([host_scenario(host, timezone=settings.TIME_ZONE) for host in hosts], [at_s])
    fields = ("vm__name", "vcpus", "ram_mib", "vcpu_util", "vcpu_max_util", "cpu_steal_pct", "ram_used_mib")
    backfilled = set(GuestSample.objects.values_list(*fields))
    GuestSample.objects.all().delete()

    for host in hosts:
        backend = sim.SimBackend.open(host.hypervisor_uri)
        for read_at_s in (at_s - settings.HYPERVISOR_GUEST_INTERVAL_S, at_s):
            backend.clock = lambda read_at_s=read_at_s: int(read_at_s * S)
            guest_stats.store(host, backend.guest_counters())
    live = set(GuestSample.objects.filter(ts=datetime.fromtimestamp(at_s, tz=UTC)).values_list(*fields))

    assert len(backfilled) == VirtualMachine.objects.filter(vgpus__gpu__host__in=hosts).distinct().count() >= 10
    assert live >= backfilled
    by_vm = {row[0]: dict(zip(fields, row, strict=True)) for row in backfilled}
    no_balloon = VirtualMachine.objects.get(pk=fleet_demo.no_balloon_vm_id())
    assert by_vm[no_balloon.name]["ram_used_mib"] is None  # not reported, never 0
    assert by_vm["poc-animation"]["vcpu_max_util"] >= 85  # one vCPU saturated...
    assert by_vm["poc-animation"]["vcpu_util"] <= 25  # ...while the VM is mostly idle

"""Two requests that race for the last of something: exactly one gets it.

Each test starts two threads at one barrier; each thread has its own database connection
(Django's are per thread) and closes it at the end. To make the race real, fleet.services'
reads of the fleet are slowed down (see `rendezvous`): without the row locks (PostgreSQL)
or IMMEDIATE transactions (SQLite), both requests read the old state and both are accepted,
or the loser is refused by the database constraint rather than by the rules.
"""

from __future__ import annotations

import contextlib
import functools
import threading

import pytest
from django.db import connection

from fleet import services
from fleet.models import Vgpu, VirtualMachine
from fleet.placement import PlacementError, Rule
from fleet.services import FleetConflict
from fleet.tests.factories import GpuFactory, HostFactory, VirtualMachineFactory, profile
from fleet.tests.lock_race import outcome_of, run_in_threads

# serialized_rollback: these tests commit, and the flush afterwards would take the catalog
# (loaded by a data migration) away from the tests that run after them.
pytestmark = pytest.mark.django_db(transaction=True, serialized_rollback=True)

RENDEZVOUS_S = 1.0


@pytest.fixture
def rendezvous(monkeypatch):
    """`rendezvous("gpu_state")`: each racing request, once it has read that state inside its
    transaction (the read the write is based on), waits up to RENDEZVOUS_S for the other to have
    read it too. Unlocked, both read the old state before either writes. Locked, the second
    cannot read before the first commits: the first stops waiting after the timeout, and the
    second reads what the first wrote."""

    def install(name: str) -> None:
        both_read = threading.Barrier(2)
        original = getattr(services, name)

        def read_then_wait(*args, **kwargs):
            state = original(*args, **kwargs)
            if connection.in_atomic_block:  # not the unlocked check before the transaction
                with contextlib.suppress(threading.BrokenBarrierError):
                    both_read.wait(timeout=RENDEZVOUS_S)
            return state

        monkeypatch.setattr(services, name, read_then_wait)

    return install


def race(*calls):
    """Run each call in its own thread, all released at once; returns each one's result or exception."""
    barrier = threading.Barrier(len(calls))
    outcomes: list[object] = [None] * len(calls)

    def run(index, call):
        def released():
            barrier.wait(timeout=10)
            return call()

        outcomes[index] = outcome_of(released)
        connection.close()

    run_in_threads(*[functools.partial(run, index, call) for index, call in enumerate(calls)])
    return outcomes


def _split(outcomes):
    won = [o for o in outcomes if not isinstance(o, Exception)]
    lost = [o for o in outcomes if isinstance(o, Exception)]
    unexpected = [o for o in lost if not isinstance(o, PlacementError)]
    assert not unexpected, unexpected
    return won, lost


def test_two_placements_race_for_the_last_slot(rendezvous):
    gpu = GpuFactory()
    services.place_vgpu(VirtualMachineFactory(), gpu, profile("RTX6000-12Q"))
    vm_a, vm_b = VirtualMachineFactory(name="ws-a"), VirtualMachineFactory(name="ws-b")
    q12 = profile("RTX6000-12Q")
    rendezvous("gpu_state")  # after the set-up, which reads the GPU too

    won, lost = _split(race(
        lambda: services.place_vgpu(vm_a, gpu, q12),
        lambda: services.place_vgpu(vm_b, gpu, q12),
    ))

    assert len(won) == 1
    assert len(lost) == 1
    # The loser was refused by the rules, seeing the winner's vGPU, as a 409 naming the rule.
    assert isinstance(lost[0], FleetConflict)
    assert Rule.MAX_PER_GPU in lost[0].rules
    assert "RTX6000-12Q allows 2 per GPU" in str(lost[0])
    assert Vgpu.objects.filter(gpu=gpu).count() == q12.max_per_gpu
    loser = vm_b if won[0].vm_id == vm_a.pk else vm_a
    assert VirtualMachine.objects.get(pk=loser.pk).host_id is None


def test_two_first_placements_race_for_the_hosts_last_vcpus(rendezvous):
    """12 vCPUs left on the host: either 8-vCPU VM fits alone, not both. They go to different
    GPUs, so only the host's lock stands between them."""
    host = HostFactory(name="tight", cpu_threads=16, ram_gib=512)
    gpu_a, gpu_b, gpu_c = (GpuFactory(host=host) for _ in range(3))
    services.place_vgpu(VirtualMachineFactory(vcpus=4), gpu_c, profile("RTX6000-24Q"))
    vm_a, vm_b = VirtualMachineFactory(vcpus=8), VirtualMachineFactory(vcpus=8)
    q24 = profile("RTX6000-24Q")
    rendezvous("host_state")

    won, lost = _split(race(
        lambda: services.place_vgpu(vm_a, gpu_a, q24),
        lambda: services.place_vgpu(vm_b, gpu_b, q24),
    ))

    assert len(won) == 1
    assert len(lost) == 1
    assert isinstance(lost[0], FleetConflict)
    assert lost[0].rules == [Rule.HOST_VCPU]
    assert "needs 8 vCPUs; host tight has 4 of 16 vCPUs free" in str(lost[0])
    on_host = VirtualMachine.objects.filter(host=host)
    assert sum(on_host.values_list("vcpus", flat=True)) == 12
    assert Vgpu.objects.filter(gpu__host=host).count() == 2


def test_resize_races_a_placement_for_the_hosts_last_vcpus(rendezvous):
    """A VM on the host grows from 4 to 10 vCPUs while an 8-vCPU VM lands there: 16 threads hold
    either change, not both."""
    host = HostFactory(name="tight", cpu_threads=16, ram_gib=512)
    gpu_a, gpu_b = GpuFactory(host=host), GpuFactory(host=host)
    resident = services.place_vgpu(VirtualMachineFactory(vcpus=4), gpu_a, profile("RTX6000-24Q")).vm
    newcomer = VirtualMachineFactory(vcpus=8)
    rendezvous("host_state")

    won, lost = _split(race(
        lambda: services.update_vm(VirtualMachine.objects.get(pk=resident.pk), vcpus=10),
        lambda: services.place_vgpu(newcomer, gpu_b, profile("RTX6000-24Q")),
    ))

    assert len(won) == 1
    assert len(lost) == 1
    assert Rule.HOST_VCPU in lost[0].rules
    claimed = sum(VirtualMachine.objects.filter(host=host).values_list("vcpus", flat=True))
    assert claimed in (10, 12)  # the resident grown (10) or the newcomer placed (4 + 8)
    assert claimed <= host.cpu_threads

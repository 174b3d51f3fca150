"""The optimizer on the fleet `make run` shows: what an admin sees on the first day."""

import pytest

from fleet.demo import seed_demo
from fleet.models import VgpuProfile, VirtualMachine
from fleet.queries import fleet_snapshot
from sizing import optimizer

pytestmark = pytest.mark.django_db


def test_the_demo_fleet_makes_room_for_two_growing_vms_without_reshuffling_the_rest():
    """The sizing guide's animation and lighting VMs each ask a second whole RTX 6000 (their
    upsize suggestions in the demo). The plan must reach the bound and make both changes; the
    dozens of VMs on other boards have no part in it, and an admin shuts down every VM a plan
    moves, so only a handful may move (before the move-reducing steps: 54 of 68)."""
    seed_demo()
    q24 = VgpuProfile.objects.get(name="RTX6000-24Q")
    growing = VirtualMachine.objects.filter(name__in=["poc-animation", "poc-lighting"])
    changes = [optimizer.Change(vm.pk, q24.pk, 2, f"suggestion:{vm.pk}") for vm in growing]
    snapshot = fleet_snapshot()

    plan = optimizer.optimize(snapshot, changes)

    assert optimizer.verify(snapshot, plan) == []
    assert plan.unplaced == ()
    assert plan.gpus_after == plan.lower_bound
    moved = {m.vm_name for m in plan.moves}
    assert {"poc-animation", "poc-lighting"} <= moved
    assert len(moved) <= 10, sorted(moved)

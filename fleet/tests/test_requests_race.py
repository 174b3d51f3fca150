"""Two approvals competing for the last slot: exactly one applies, the other is a conflict and stays pending."""

import pytest

from fleet import requests as service
from fleet.choices import ResizeStatus
from fleet.models import ResizeRequest, Vgpu
from fleet.services import FleetConflict
from fleet.tests.factories import VirtualMachineFactory, profile
from fleet.tests.test_concurrency import race

pytestmark = pytest.mark.django_db(transaction=True, serialized_rollback=True)


def test_two_approvals_for_the_last_slot(rtx, admin_user):
    """Only rtx.empty can take a 24Q; two VMs without vGPUs both ask for one."""
    other = VirtualMachineFactory(name="ws-other")
    q24 = profile("RTX6000-24Q")
    requests = [service.file_request(vm, admin_user, q24, 1, "race") for vm in (rtx.vm, other)]
    outcomes = race(*[(lambda r=r: service.approve(r, admin_user, "go")) for r in requests])
    won = [o for o in outcomes if isinstance(o, ResizeRequest)]
    lost = [o for o in outcomes if isinstance(o, FleetConflict)]
    assert len(won) == 1, outcomes
    assert len(lost) == 1, outcomes
    assert Vgpu.objects.filter(gpu=rtx.empty).count() == 1
    statuses = sorted(ResizeRequest.objects.values_list("status", flat=True))
    assert statuses == sorted([ResizeStatus.APPROVED, ResizeStatus.PENDING])
    assert "No GPU has room" in ResizeRequest.objects.get(status=ResizeStatus.PENDING).last_error

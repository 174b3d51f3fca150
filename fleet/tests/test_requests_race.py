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


def test_two_approvals_over_http_the_loser_gets_409_and_stays_pending_with_the_reason(rtx, admin_user):
    """The same race through the API, as two admins' scripts would run it."""
    from rest_framework.test import APIClient

    other = VirtualMachineFactory(name="ws-other-http")
    q24 = profile("RTX6000-24Q")
    requests = [service.file_request(vm, admin_user, q24, 1, "race") for vm in (rtx.vm, other)]
    clients = []
    for _ in requests:
        client = APIClient()
        client.force_authenticate(admin_user)
        clients.append(client)
    responses = race(*[
        (lambda c=c, r=r: c.post(f"/api/v1/resize-requests/{r.pk}/approve/", {"comment": "go"}, format="json"))
        for c, r in zip(clients, requests, strict=True)])
    assert sorted(r.status_code for r in responses) == [200, 409], [r.content for r in responses]
    loser = next(r for r in responses if r.status_code == 409)
    assert "No GPU has room" in loser.content.decode()
    pending = ResizeRequest.objects.get(status=ResizeStatus.PENDING)
    assert "No GPU has room" in pending.last_error
    assert Vgpu.objects.filter(gpu=rtx.empty).count() == 1

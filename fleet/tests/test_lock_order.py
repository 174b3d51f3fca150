"""Writers that meet on the same rows, each forced to arrive while the other is half-way through
(`lock_race.first_then_second`): a resize approval against an edit of its VM, against the
deletion of its VM, two approvals for one GPU's last slot, and a writer outside the product
that locks against the order. Every writer of the product locks in `fleet.locks`' order, so
none of them deadlocks (which reached the user as a 503 "cannot reach its database"): the
second waits, then either succeeds on what the first left or gets a 409 naming what changed,
with nothing of its own written and no audit event.

Run on PostgreSQL (row locks; CI sets DATABASE_URL) and on SQLite (IMMEDIATE transactions,
where the second simply runs after the first), as test_concurrency.py is.
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest
from django.db import connection, transaction
from rest_framework.test import APIClient

from config.db_outage import CONCURRENT_CHANGE
from fleet import requests as service
from fleet import services
from fleet.choices import ResizeStatus
from fleet.models import AuditEvent, Host, ResizeRequest, Vgpu, VirtualMachine
from fleet.tests.factories import GpuFactory, HostFactory, UserFactory, VirtualMachineFactory, profile
from fleet.tests.lock_race import first_then_second

# serialized_rollback: these tests commit; the flush afterwards must not take the catalog away.
pytestmark = pytest.mark.django_db(transaction=True, serialized_rollback=True)


def api_as(user) -> APIClient:
    client = APIClient()
    client.force_authenticate(user)
    return client


def last_event_id() -> int:
    return AuditEvent.objects.order_by("-pk").values_list("pk", flat=True).first() or 0


def events_since(mark: int) -> list[tuple[str, str]]:
    """(action, object) of the audit events written after `mark`, sorted."""
    return sorted(AuditEvent.objects.filter(pk__gt=mark).values_list("action", "object_repr"))


@pytest.fixture
def studio(admin_user):
    """host-a (72 threads): one RTX 6000 shared by ws-lena and ws-kai (12Q each), another holding
    ws-solo (12Q). host-b (16 threads): ws-resident (8 vCPUs, 24Q) on one RTX 6000, the other
    empty. A 24Q for ws-solo fits on its own GPU once its 12Q is gone; a 24Q for ws-lena fits only
    on host-b's empty GPU, and only while ws-lena has at most 8 vCPUs."""
    host_a, host_b = HostFactory(name="host-a"), HostFactory(name="host-b", cpu_threads=16)
    shared = GpuFactory(host=host_a, pci_bus_id="00000000:3B:00.0")
    own = GpuFactory(host=host_a, pci_bus_id="00000000:5E:00.0")
    busy = GpuFactory(host=host_b, pci_bus_id="00000000:3B:00.0")
    empty = GpuFactory(host=host_b, pci_bus_id="00000000:AF:00.0")
    q12, q24 = profile("RTX6000-12Q"), profile("RTX6000-24Q")
    vms = {name: VirtualMachineFactory(name=f"ws-{name}", vcpus=vcpus, ram_gib=32)
           for name, vcpus in (("lena", 4), ("kai", 4), ("solo", 4), ("resident", 8))}
    for name, gpu, size in (("lena", shared, q12), ("kai", shared, q12), ("solo", own, q12), ("resident", busy, q24)):
        services.place_vgpu(vms[name], gpu, size)
    return SimpleNamespace(host_a=host_a, host_b=host_b, own=own, empty=empty, q12=q12, q24=q24,
                           admin=admin_user, other_admin=UserFactory(username="admin-2", is_staff=True), **vms)


def file_resize(vm, to_profile, user) -> ResizeRequest:
    return service.file_request(vm, user, to_profile, 1, "Bigger scenes this month")


def approving(request: ResizeRequest, user):
    return lambda: api_as(user).post(f"/api/v1/resize-requests/{request.pk}/approve/", {"comment": "go"},
                                     format="json")


def editing(vm, user, **fields):
    return lambda: api_as(user).patch(f"/api/v1/vms/{vm.pk}/", fields, format="json")


def placed(vm) -> list[tuple[str, str, str]]:
    return sorted(Vgpu.objects.filter(vm=vm).values_list("gpu__host__name", "gpu__pci_bus_id", "profile__name"))


@pytest.mark.parametrize("approval_first", [True, False], ids=["approval-first", "edit-first"])
def test_an_approval_on_the_vms_host_and_an_edit_of_the_vm_both_go_through(studio, approval_first):
    """ws-solo grows from 12Q to 24Q on its own GPU while an admin gives it 12 vCPUs. Nothing
    conflicts, so both are applied, one after the other. (Approval used to lock the VM, then its
    host; the edit the host, then the VM: with the edit first, PostgreSQL aborted one of them.)"""
    request = file_resize(studio.solo, studio.q24, studio.admin)
    mark = last_event_id()
    approve, edit = approving(request, studio.admin), editing(studio.solo, studio.other_admin, vcpus=12)

    outcomes = first_then_second(approve, edit) if approval_first else first_then_second(edit, approve)

    assert [o.status_code for o in outcomes] == [200, 200], [o.content for o in outcomes]
    assert placed(studio.solo) == [("host-a", "00000000:5E:00.0", "RTX6000-24Q")]
    solo = VirtualMachine.objects.get(pk=studio.solo.pk)
    assert (solo.vcpus, solo.host_id) == (12, studio.host_a.pk)
    assert ResizeRequest.objects.get(pk=request.pk).status == ResizeStatus.APPROVED
    assert events_since(mark) == [("resize_request.approve", "ws-solo -> RTX6000-24Q (Approved and applied)"),
                                  ("vgpu.place", "RTX6000-24Q for ws-solo"),
                                  ("vgpu.remove", "RTX6000-12Q for ws-solo"),
                                  ("vm.update", "ws-solo")]


def test_an_edit_that_waited_for_an_approval_moving_the_vm_is_a_conflict(studio):
    """The approval moves ws-lena to host-b while the edit, which read host-a, waits for the lock:
    the edit answers 409 naming the move and writes nothing; the move stands."""
    request = file_resize(studio.lena, studio.q24, studio.admin)
    mark = last_event_id()

    approved, edited = first_then_second(approving(request, studio.admin),
                                         editing(studio.lena, studio.other_admin, vcpus=12))

    assert (approved.status_code, edited.status_code) == (200, 409), [approved.content, edited.content]
    assert edited.json()["detail"] == "VM ws-lena moved to host host-b meanwhile; try again"
    assert edited.json()["violations"] == [{"rule": "vm_host", "message": edited.json()["detail"]}]
    assert placed(studio.lena) == [("host-b", "00000000:AF:00.0", "RTX6000-24Q")]
    assert VirtualMachine.objects.get(pk=studio.lena.pk).vcpus == 4
    assert ResizeRequest.objects.get(pk=request.pk).status == ResizeStatus.APPROVED
    assert [action for action, _ in events_since(mark)] == ["resize_request.approve", "vgpu.place", "vgpu.remove"]


def test_an_approval_that_waited_for_an_edit_growing_the_vm_is_a_conflict_and_stays_pending(studio):
    """The edit gives ws-lena 12 vCPUs while the approval waits: host-b, the only place with room
    for its 24Q, has 8 threads left. The approval answers 409 saying so, the request stays pending
    with that reason, ws-lena keeps its 12Q on host-a."""
    request = file_resize(studio.lena, studio.q24, studio.admin)
    mark = last_event_id()

    edited, approved = first_then_second(editing(studio.lena, studio.other_admin, vcpus=12),
                                         approving(request, studio.admin))

    assert (edited.status_code, approved.status_code) == (200, 409), [edited.content, approved.content]
    reason = approved.json()["detail"]
    assert reason.startswith("No GPU has room for 1 x RTX6000-24Q for ws-lena now. On host-a: ")
    assert "On host-b: VM ws-lena needs 12 vCPUs; host host-b has 8 of 16 vCPUs free" in reason
    pending = ResizeRequest.objects.get(pk=request.pk)
    assert (pending.status, pending.last_error) == (ResizeStatus.PENDING, reason)
    assert placed(studio.lena) == [("host-a", "00000000:3B:00.0", "RTX6000-12Q")]
    assert VirtualMachine.objects.get(pk=studio.lena.pk).vcpus == 12
    assert events_since(mark) == [("vm.update", "ws-lena")]


def test_two_approvals_for_the_last_slot_one_wins_the_other_names_the_taken_gpu(studio):
    """ws-kai and ws-solo each ask for a 24Q: host-b's empty GPU is the only one either could
    move to (host-a's GPUs keep a 12Q each). The second approval waits for the first, then answers
    409 naming the GPU whose slot went, and its request stays pending."""
    first = file_resize(studio.kai, studio.q24, studio.admin)
    services.place_vgpu(VirtualMachineFactory(name="ws-filler"), studio.own, studio.q12)  # solo's GPU stays taken
    second = file_resize(studio.solo, studio.q24, studio.admin)
    mark = last_event_id()

    won, lost = first_then_second(approving(first, studio.admin), approving(second, studio.other_admin))

    assert (won.status_code, lost.status_code) == (200, 409), [won.content, lost.content]
    reason = lost.json()["detail"]
    assert reason.startswith("No GPU has room for 1 x RTX6000-24Q for ws-solo now. On host-a: ")
    assert "On host-b: RTX6000-24Q needs 24576 MiB; GPU 00000000:AF:00.0 has 0 MiB free" in reason
    assert "RTX6000-24Q allows 1 per GPU; GPU 00000000:AF:00.0 already has 1." in reason
    assert placed(studio.kai) == [("host-b", "00000000:AF:00.0", "RTX6000-24Q")]
    assert placed(studio.solo) == [("host-a", "00000000:5E:00.0", "RTX6000-12Q")]
    assert ResizeRequest.objects.get(pk=first.pk).status == ResizeStatus.APPROVED
    assert (ResizeRequest.objects.get(pk=second.pk).status,
            ResizeRequest.objects.get(pk=second.pk).last_error) == (ResizeStatus.PENDING, reason)
    assert events_since(mark) == [("resize_request.approve", "ws-kai -> RTX6000-24Q (Approved and applied)"),
                                  ("vgpu.place", "RTX6000-24Q for ws-kai"),
                                  ("vgpu.remove", "RTX6000-12Q for ws-kai")]


def test_an_approval_that_waited_for_the_deletion_of_its_vm_is_a_conflict(studio):
    """An admin deletes ws-lena while another approves its request: the deletion goes through,
    the approval answers 409 saying the VM was deleted (not a 500, not a 503)."""
    request = file_resize(studio.lena, studio.q24, studio.admin)
    mark = last_event_id()

    deleted, approved = first_then_second(lambda: api_as(studio.other_admin).delete(f"/api/v1/vms/{studio.lena.pk}/"),
                                          approving(request, studio.admin))

    assert (deleted.status_code, approved.status_code) == (204, 409), [deleted.content, approved.content]
    assert approved.json()["detail"] == "VM ws-lena was deleted meanwhile; reload and try again."
    assert not VirtualMachine.objects.filter(pk=studio.lena.pk).exists()
    assert not ResizeRequest.objects.filter(pk=request.pk).exists()
    assert placed(studio.kai) == [("host-a", "00000000:3B:00.0", "RTX6000-12Q")]
    assert events_since(mark) == [("vm.delete", "ws-lena")]


def test_a_deadlock_with_a_writer_outside_the_product_is_a_409_not_an_outage(studio, caplog):
    """A studio script locks ws-solo, then its host, against the order. The API edit of ws-solo
    holds the host and waits for the VM: PostgreSQL aborts the edit, which answers 409 "try
    again", not 503 "cannot reach its database", and writes nothing. (On SQLite the script's
    transaction runs first and the edit after it.)"""
    mark = last_event_id()

    def script():
        with transaction.atomic():
            VirtualMachine.objects.select_for_update().filter(pk=studio.solo.pk).first()
            Host.objects.select_for_update().filter(pk=studio.host_a.pk).first()
            Host.objects.filter(pk=studio.host_a.pk).update(cpu_model="2 x Xeon Gold 6254")
        return "committed"

    scripted, edited = first_then_second(script, editing(studio.solo, studio.admin, vcpus=12))

    assert scripted == "committed"
    assert Host.objects.get(pk=studio.host_a.pk).cpu_model == "2 x Xeon Gold 6254"
    if connection.vendor == "postgresql":
        assert edited.status_code == 409, edited.content
        assert edited.json() == {"detail": CONCURRENT_CHANGE}
        assert "Retry-After" not in edited
        assert "concurrent change, answered 409 to PATCH" in caplog.text
        assert VirtualMachine.objects.get(pk=studio.solo.pk).vcpus == 4
        assert events_since(mark) == []
    else:
        assert edited.status_code == 200, edited.content
        assert VirtualMachine.objects.get(pk=studio.solo.pk).vcpus == 12

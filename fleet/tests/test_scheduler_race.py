"""A GPU's scheduler policy set while a vGPU lands on that GPU: the staging decision (which counts
the GPU's vGPUs) and the placement are serialized by the GPU row's lock, so a policy is recorded
"desired" (ready to apply) only if no vGPU had landed when it was decided.

Two threads, each with its own database connection (Django's are per thread), as in
test_concurrency.py. The interleaving is forced with events: one side pauses inside its
transaction, at the point where the other side's write would slip in without the lock, for up to
RENDEZVOUS_S. Locked, the other side cannot get there: the pause times out and the two run one
after the other. Run it on PostgreSQL (row locks) and on SQLite (IMMEDIATE transactions).
"""

from __future__ import annotations

import threading

import pytest
from django.db import connection

from fleet import audit, scheduler, services
from fleet.models import AuditEvent, SchedulerPolicy, Vgpu
from fleet.scheduler import SchedulerSettings as S
from fleet.scheduler_policies import set_gpu_policy
from fleet.tests.factories import GpuFactory, HostFactory, VirtualMachineFactory, profile

# serialized_rollback: these tests commit; the flush afterwards must not take the catalog away.
pytestmark = pytest.mark.django_db(transaction=True, serialized_rollback=True)

RENDEZVOUS_S = 1.0
EQUAL_ARR = S("equal_share", arr=True)


def run_both(first, second):
    """Run the two calls in their own threads; returns each one's result (an exception is raised)."""
    outcomes: list[object] = [None, None]

    def run(index, call):
        try:
            outcomes[index] = call()
        except Exception as exc:  # handed to the test
            outcomes[index] = exc
        finally:
            connection.close()

    threads = [threading.Thread(target=run, args=(i, call)) for i, call in enumerate((first, second))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    assert not any(thread.is_alive() for thread in threads), "a racing request hung"
    for outcome in outcomes:
        if isinstance(outcome, Exception):
            raise outcome
    return outcomes


class Moments:
    """Events at the two moments that matter: `landed` once the vGPU row is written inside the
    placement's transaction, `decided` once set_gpu_policy has counted the GPU's vGPUs inside its
    own. `pause(after="landed", until="decided")` makes that side wait there for the other."""

    def __init__(self):
        self.landed, self.decided = threading.Event(), threading.Event()
        self.pauses: dict[str, threading.Event] = {}

    def pause(self, after: str, until: str) -> None:
        self.pauses[after] = getattr(self, until)

    def reached(self, moment: str) -> None:
        getattr(self, moment).set()
        if moment in self.pauses:
            self.pauses[moment].wait(timeout=RENDEZVOUS_S)


@pytest.fixture
def moments(monkeypatch):
    seen = Moments()
    record, staging_reason = audit.record, scheduler.staging_reason

    def recording(action, *args, **kwargs):
        result = record(action, *args, **kwargs)
        if action == "vgpu.place":
            seen.reached("landed")
        return result

    def deciding(vgpu_count):
        reason = staging_reason(vgpu_count)
        seen.reached("decided")
        return reason

    monkeypatch.setattr(audit, "record", recording)
    monkeypatch.setattr(scheduler, "staging_reason", deciding)
    return seen


@pytest.fixture
def world():
    gpu = GpuFactory(host=HostFactory(name="race-host"), pci_bus_id="00000000:86:00.0")
    return gpu, VirtualMachineFactory(name="ws-landing"), profile("RTX6000-12Q")


def test_policy_set_while_a_vgpu_is_landing_waits_for_it_and_is_staged(moments, world):
    """The placement has written its vGPU and not committed yet when the policy is set: the policy
    must wait for the GPU and then see the vGPU (staged), not decide on the old count (desired)."""
    gpu, vm, q12 = world
    moments.pause(after="landed", until="decided")

    def set_policy_once_landing():
        assert moments.landed.wait(timeout=10)
        return set_gpu_policy(gpu, EQUAL_ARR)

    vgpu, row = run_both(lambda: services.place_vgpu(vm, gpu, q12), set_policy_once_landing)

    assert Vgpu.objects.filter(pk=vgpu.pk, gpu=gpu).exists()
    row = SchedulerPolicy.objects.get(pk=row.pk)
    assert (row.apply_state, row.apply_detail) == (
        "staged", "the GPU holds 1 vGPU; staged until it is empty or the driver reloads")


def test_vgpu_placed_while_a_policy_is_being_decided_lands_after_it(moments, world):
    """The policy has counted no vGPU and not committed yet when a placement starts: the vGPU must
    land after the policy is recorded "desired", so "desired" was true when it was written."""
    gpu, vm, q12 = world
    moments.pause(after="decided", until="landed")

    def place_once_decided():
        assert moments.decided.wait(timeout=10)
        return services.place_vgpu(vm, gpu, q12)

    row, vgpu = run_both(lambda: set_gpu_policy(gpu, EQUAL_ARR), place_once_decided)

    assert SchedulerPolicy.objects.get(pk=row.pk).apply_state == "desired"
    decided = AuditEvent.objects.get(action="scheduler_policy.update", object_id=str(row.pk))
    landed = AuditEvent.objects.get(action="vgpu.place", object_id=str(vgpu.pk))
    assert decided.pk < landed.pk, "the vGPU landed before the policy that counted none was recorded"

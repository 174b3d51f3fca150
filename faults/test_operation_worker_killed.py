"""A prefork worker SIGKILLed (its pool processes with it, as the OOM killer or `docker kill`
would) while it carries an approved resize out on a simulated hypervisor, in the middle of
waiting for the guest to power off.

The moment is made without a hook in the product: the guest takes SHUTDOWN_S seconds to power
off once asked, and the worker is killed once the operation's shutdown step has been running
for a few seconds. Beat runs `resume_operations` every second throughout, with a heartbeat
that turns stale after HEARTBEAT_STALE_S.

What must hold: while the first worker waits for the guest, beat does not hand its operation
to another worker (its heartbeat stays fresh); while no worker runs, the operation stays
running with what it did recorded (the guest's definition and power state as found) and
nothing else changed, on the host or in the inventory; a new worker resumes it through beat,
and it ends as an uninterrupted run would: every step done once, one new vGPU device on the
host, the VM running with it, the request approved, the inventory naming the new device.
"""

from __future__ import annotations

import json
import signal
import time

import pytest
from django_celery_beat.models import IntervalSchedule, PeriodicTask

from faults.services import wait_for
from faults.stack import Web
from faults.world import build_linked_world
from fleet.choices import ResizeStatus
from fleet.models import AuditEvent, ResizeRequest, Vgpu
from hypervisors.backends.base import PowerState
from hypervisors.choices import OperationStatus, StepKind, StepStatus
from hypervisors.models import Operation, OperationClaim
from hypervisors.schedules import RESUME_OPERATIONS
from hypervisors.tests.worlds import host_view

pytestmark = pytest.mark.faults

SHUTDOWN_S = 8.0
HEARTBEAT_STALE_S = 3.0
#: How long into the guest's shutdown the worker is killed: past a stale heartbeat's age, so a
#: run that did not beat while it waited would already have been handed on by beat.
KILL_AFTER_S = 4.5
STEPS = ["notify", "shutdown", "remove_vgpu", "create_vgpu", "redefine", "start", "verify"]


def resume_every_second() -> None:
    """Beat runs resume_operations every second, and nothing else (the test is about operations;
    the machine running it is small)."""
    every, _ = IntervalSchedule.objects.get_or_create(every=1, period=IntervalSchedule.SECONDS)
    PeriodicTask.objects.filter(name=RESUME_OPERATIONS).update(interval=every, expire_seconds=1, enabled=True)
    PeriodicTask.objects.exclude(name=RESUME_OPERATIONS).update(enabled=False)
    assert PeriodicTask.objects.filter(name=RESUME_OPERATIONS, enabled=True).exists()


def step_states(operation: Operation) -> dict[str, str]:
    return dict(operation.steps.order_by("index").values_list("kind", "status"))


def test_a_worker_killed_while_the_guest_shuts_down_is_resumed_by_another_and_the_resize_ends_once(
        stack, settings, tmp_path):
    settings.HYPERVISOR_SIM_DIR = tmp_path / "sim"
    stack.env.update(HYPERVISOR_SIM_DIR=str(settings.HYPERVISOR_SIM_DIR),
                     HYPERVISOR_HEARTBEAT_STALE_S=str(HEARTBEAT_STALE_S), HYPERVISOR_VERIFY_WAIT_S="0",
                     HYPERVISOR_SHUTDOWN_TIMEOUT_S="300", HYPERVISOR_RETRY_S="2")
    world = build_linked_world(shutdown_s=SHUTDOWN_S)
    resume_every_second()
    worker = stack.start_worker()
    web = stack.start_web()
    stack.start_beat()
    automation = Web(int(web.base.rsplit(":", 1)[1]))
    automation.headers["Authorization"] = f"Token {world.admin_token}"

    status, body, _ = automation.post(f"/api/v1/resize-requests/{world.request.pk}/approve/",
                                      {"comment": "go", "run_now": True})
    assert status == 200, body
    assert json.loads(body)["status"] == ResizeStatus.APPLYING, body
    operation = Operation.objects.get(request=world.request)
    assert list(step_states(operation)) == STEPS

    def shutdown_running() -> bool:
        return operation.steps.filter(kind=StepKind.SHUTDOWN, status=StepStatus.RUNNING).exists()

    assert wait_for(shutdown_running, 60), f"the shutdown step never started\n{stack.outputs()}"
    shutdown_started = time.monotonic()
    time.sleep(KILL_AFTER_S)
    # The guest is still shutting down, and the only run is the first: beat ran resume_operations
    # several times with a 3 s staleness, yet the waiting run kept its heartbeat fresh.
    assert host_view().domain(str(world.vm.uuid)).state == PowerState.RUNNING
    assert worker.count("resume_operations") >= 2, worker.output
    assert worker.count("Task hypervisors.tasks.run_operation") == 1, worker.output
    worker.kill_group(signal.SIGKILL)
    killed_at = time.monotonic()

    # No worker runs: the operation stays running, what the shutdown step read is recorded, and
    # nothing beyond the guest's own power-off changes. Watched past the heartbeat's staleness
    # and the guest's power-off.
    new_vgpu = Vgpu.objects.get(vm=world.vm)
    assert (new_vgpu.profile.name, new_vgpu.device_id) == ("L40S-12Q", "")  # reserved by the approval
    while time.monotonic() < max(killed_at + HEARTBEAT_STALE_S + 2, shutdown_started + SHUTDOWN_S + 1):
        operation.refresh_from_db()
        assert operation.status == OperationStatus.RUNNING
        assert operation.before["was_running"] is True
        assert [d["id"] for d in operation.before["devices"]] == [world.old_device]
        assert step_states(operation) == {**dict.fromkeys(STEPS, StepStatus.PENDING),
                                          "notify": StepStatus.DONE, "shutdown": StepStatus.RUNNING}
        domain = host_view().domain(str(world.vm.uuid))
        assert [d.id for d in domain.vgpus] == [world.old_device]
        assert [d.id for d in host_view().vgpu_devices()] == [world.old_device]
        assert ResizeRequest.objects.get(pk=world.request.pk).status == ResizeStatus.APPLYING
        assert Vgpu.objects.get(vm=world.vm).device_id == ""
        time.sleep(0.5)
    # The guest obeyed the shutdown it was asked for before the kill.
    assert host_view().domain(str(world.vm.uuid)).state == PowerState.SHUT_OFF
    operation.refresh_from_db()
    assert operation.heartbeat_at is not None

    # A new worker: beat's resume_operations finds the lost run and enqueues it; the new worker
    # takes it and carries it to the end.
    resumed_from = time.monotonic()
    successor = stack.start_worker()

    def ended() -> bool:
        operation.refresh_from_db()
        return operation.status not in (OperationStatus.PENDING, OperationStatus.RUNNING)

    assert wait_for(ended, 60), f"the operation did not end after the restart\n{stack.outputs()}"
    resumed_in_s = time.monotonic() - resumed_from
    assert operation.status == OperationStatus.SUCCEEDED, f"{operation.error}\n{stack.outputs()}"
    assert resumed_in_s < 30, resumed_in_s
    assert successor.count("Task hypervisors.tasks.run_operation") >= 1, successor.output
    assert step_states(operation) == dict.fromkeys(STEPS, StepStatus.DONE)
    # Each step left its audit event once: nothing was done twice, the shutdown included.
    events = AuditEvent.objects.filter(object_type="operation", object_id=str(operation.pk))
    done = sorted(events.filter(after__has_key="step").values_list("after__step", "action"))
    assert done == [(index, f"operation.{kind}") for index, kind in enumerate(STEPS)]
    assert events.filter(action="operation.succeeded").count() == 1

    # The host: the old device gone, exactly one new one, the VM running with it.
    created = operation.steps.get(kind=StepKind.CREATE_VGPU).args["device_id"]
    devices = host_view().vgpu_devices()
    assert [(d.id, d.type_name) for d in devices] == [(created, "NVIDIA L40S-12Q")]
    domain = host_view().domain(str(world.vm.uuid))
    assert (domain.state, [d.id for d in domain.vgpus]) == (PowerState.RUNNING, [created])
    # The inventory and the request say the same.
    vgpu = Vgpu.objects.get(vm=world.vm)
    assert (vgpu.profile.name, vgpu.device_id) == ("L40S-12Q", created)
    assert ResizeRequest.objects.get(pk=world.request.pk).status == ResizeStatus.APPROVED
    assert not OperationClaim.objects.filter(operation=operation, active=True).exists()

    # Deliveries piled up while no worker ran find it ended and change nothing.
    time.sleep(2)
    assert [d.id for d in host_view().vgpu_devices()] == [created]
    assert Operation.objects.get(pk=operation.pk).status == OperationStatus.SUCCEEDED

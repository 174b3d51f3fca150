"""Drain runs end to end on real ORM fleets: started with the GPU to drain, planned by the task
(through Celery, eagerly), applied through `apply_run`, as operations on a linked host."""

from __future__ import annotations

import pytest

from fleet import services
from fleet.models import AuditEvent, Vgpu
from hypervisors import operations
from hypervisors.choices import OperationKind, OperationStatus
from sizing import optimizer_runs
from sizing.models import OptimizerRun, OptimizerStatus
from sizing.tests.optimizer_world import failing_gpu_fleet, placements
from sizing.tests.test_optimizer_operations import link, view

pytestmark = pytest.mark.django_db


@pytest.fixture
def quick_hosts(sim_dir, settings):
    """Simulated hosts in tmp_path, no wait for the agent's confirmation."""
    settings.HYPERVISOR_VERIFY_WAIT_S = 0
    settings.HYPERVISOR_SHUTDOWN_TIMEOUT_S = 3


def drain_run(user, gpu, capture) -> OptimizerRun:
    """Start a drain of `gpu`; the commit sends the task, which Celery runs eagerly."""
    with capture(execute=True):
        run = optimizer_runs.start_run(user, include_requests=False, drain_gpu_ids=[gpu.pk])
    run.refresh_from_db()
    return run


def test_a_drain_run_keeps_the_gpu_and_says_so_in_the_audit(admin_user, monkeypatch):
    monkeypatch.setattr(optimizer_runs, "enqueue", lambda run_id: None)
    world = failing_gpu_fleet()

    run = optimizer_runs.start_run(admin_user, include_requests=False, drain_gpu_ids=[world.failing.pk])

    assert run.params["drain_gpu_ids"] == [world.failing.pk]
    assert optimizer_runs.drained_gpus(run) == ["studio-01 00000000:3B:00.0 (Quadro RTX 6000)"]
    event = AuditEvent.objects.get(action="optimizer_run.start", object_id=str(run.pk))
    assert event.comment.endswith("; drain of GPU studio-01 00000000:3B:00.0 (Quadro RTX 6000)")


def test_a_gpu_that_is_not_in_the_fleet_cannot_be_drained(admin_user):
    with pytest.raises(ValueError, match="No GPU #987654 in the fleet"):
        optimizer_runs.start_run(admin_user, drain_gpu_ids=[987654])
    assert not OptimizerRun.objects.exists()


@pytest.mark.usefixtures("eager")
def test_a_drain_plans_moves_off_the_gpu_only_and_applying_empties_it(admin_user,
                                                                      django_capture_on_commit_callbacks):
    world = failing_gpu_fleet()

    run = drain_run(admin_user, world.failing, django_capture_on_commit_callbacks)

    assert run.status == OptimizerStatus.DONE, run.error
    plan = run.result["plan"]
    assert sorted(m["vm_id"] for m in plan["moves"]) == sorted(vm.pk for vm in world.leaving)
    assert {m["reason"] for m in plan["moves"]} == {"drain"}
    assert plan["drained"] == [world.failing.pk]
    assert plan["freed_gpu_ids"] == [world.failing.pk]
    assert run.result["names"]["gpus"][str(world.failing.pk)]["label"] == "00000000:3B:00.0"

    outcome = optimizer_runs.apply_run(run, admin_user)

    assert outcome.vms_moved == 2
    assert outcome.operation_ids == []  # the host is not linked: the inventory only
    assert not Vgpu.objects.filter(gpu=world.failing).exists()
    after = placements()
    assert ("ws-comp-c", "00000000:5E:00.0", "RTX6000-12Q", 0) in after
    assert ("ws-comp-d", "00000000:AF:00.0", "RTX6000-12Q", 0) in after
    assert sorted(bus for vm, bus, _, _ in after if vm.startswith("ws-fx")) == ["00000000:5E:00.0",
                                                                               "00000000:AF:00.0"]


@pytest.mark.usefixtures("eager")
def test_a_vm_with_no_room_elsewhere_is_named_on_the_run(admin_user, django_capture_on_commit_callbacks):
    world = failing_gpu_fleet()
    # The two other GPUs go to passthrough (emptied first, as the inventory requires): no room left.
    services.remove_vgpus(Vgpu.objects.filter(gpu__in=[world.half_c, world.half_d]).order_by("pk"))
    for gpu in (world.half_c, world.half_d):
        services.update_gpu(gpu, mode="passthrough")

    run = drain_run(admin_user, world.failing, django_capture_on_commit_callbacks)

    assert run.status == OptimizerStatus.DONE, run.error
    assert run.result["plan"]["moves"] == []
    unplaced = dict(run.result["plan"]["unplaced"])
    assert sorted(unplaced) == sorted(vm.pk for vm in world.leaving)
    assert all(reason.startswith("it cannot leave the drained GPU: no other Quadro RTX 6000 GPU in vGPU mode")
               for reason in unplaced.values())
    assert run.result["summary"]["unplaced"] == 2


def test_a_gpu_deleted_before_the_run_fails_it_naming_the_gpu(admin_user, monkeypatch):
    monkeypatch.setattr(optimizer_runs, "enqueue", lambda run_id: None)
    world = failing_gpu_fleet()
    run = optimizer_runs.start_run(admin_user, include_requests=False, drain_gpu_ids=[world.half_c.pk])
    Vgpu.objects.filter(gpu=world.half_c).delete()
    world.half_c.delete()

    assert optimizer_runs.execute_run(run.pk) == OptimizerStatus.FAILED

    run.refresh_from_db()
    assert run.error == ("studio-01 00000000:5E:00.0 (Quadro RTX 6000) is no longer in the fleet: there is nothing "
                         "to drain.")


@pytest.mark.usefixtures("eager", "quick_hosts")
def test_on_a_linked_host_the_drain_runs_as_operations_that_empty_the_gpu(admin_user,
                                                                         django_capture_on_commit_callbacks):
    world = failing_gpu_fleet()
    link(world.host)
    run = drain_run(admin_user, world.failing, django_capture_on_commit_callbacks)

    outcome = optimizer_runs.apply_run(run, admin_user)
    optimizer_runs.run_operations_now(run, admin_user)
    for operation in optimizer_runs.operations_of(run):
        operations.run(operation.pk)

    done = optimizer_runs.operations_of(run)
    assert len(outcome.operation_ids) == 2
    assert [(op.kind, op.status) for op in done] == [(OperationKind.MOVE, OperationStatus.SUCCEEDED)] * 2
    host = view(world.host)
    assert sorted(d.gpu_bus_id for d in host.vgpu_devices()) == sorted([world.half_c.pci_bus_id] * 2
                                                                       + [world.half_d.pci_bus_id] * 2)
    for vm in world.leaving:
        (vgpu,) = Vgpu.objects.filter(vm=vm).select_related("gpu")
        assert vgpu.gpu_id in (world.half_c.pk, world.half_d.pk)
        assert [d.gpu_bus_id for d in host.domain(str(vm.uuid)).vgpus] == [vgpu.gpu.pci_bus_id]

"""Applying an optimizer plan on hosts linked to their hypervisor: each moved VM becomes an
operation that the host carries out, and a failure puts both the host and the inventory back.

The hosts are real simulated hypervisors (JSON state files), seeded from the inventory; each
check reads them through a fresh link, as an admin looking at the host would.
"""

from __future__ import annotations

import pytest

from fleet import services
from fleet.choices import ResizeStatus
from fleet.models import Vgpu, VirtualMachine
from fleet.tests.factories import GpuFactory, HostFactory, VirtualMachineFactory, profile
from hypervisors import operations, sim_seed
from hypervisors.backends import sim
from hypervisors.backends.base import PowerState
from hypervisors.choices import OperationKind, OperationStatus, StepStatus
from hypervisors.models import Operation, OperationClaim
from sizing import optimizer_runs, tasks
from sizing.models import OptimizerRun, OptimizerStatus
from sizing.tests.optimizer_world import fleet_with_request, fragmented_fleet, placements

pytestmark = pytest.mark.django_db


@pytest.fixture(autouse=True)
def quick_hosts(sim_dir, settings, monkeypatch):
    """Simulated hosts in tmp_path, no wait for the agent's confirmation, no broker."""
    settings.HYPERVISOR_VERIFY_WAIT_S = 0
    settings.HYPERVISOR_SHUTDOWN_TIMEOUT_S = 3
    monkeypatch.setattr(optimizer_runs, "enqueue", lambda run_id: None)


def link(*hosts) -> None:
    """Link each host to its own simulated hypervisor, seeded from the inventory, with guests
    that power off at once."""
    for host in hosts:
        host.hypervisor_uri = f"sim://{host.name}"
        host.save()
        sim_seed.seed_host(host).set_shutdown_s(0)


def view(host) -> sim.SimBackend:
    return sim.SimBackend.open(f"sim://{host.name}")


def four_half_full_gpus():
    """The fragmented fleet with two more half-full GPUs, linked: a plan moves two VMs."""
    world = fragmented_fleet()
    for index, bus in enumerate(("00000000:AF:00.0", "00000000:D8:00.0")):
        gpu = GpuFactory(host=world.host, pci_bus_id=bus)
        services.place_vgpu(VirtualMachineFactory(name=f"ws-extra-{index}"), gpu, world.q12)
    link(world.host)
    return world


def one_move_planned(user):
    """The fragmented fleet, linked, and a finished plan moving one VM: (world, run, move, VM)."""
    world = fragmented_fleet()
    link(world.host)
    run = finished_run(user, include_requests=False)
    (move,) = run.result["plan"]["moves"]
    return world, run, move, VirtualMachine.objects.get(pk=move["vm_id"])


def two_half_full_hosts() -> list:
    """studio-01 and studio-02, one Quadro RTX 6000 each holding one RTX6000-12Q (not linked)."""
    hosts = [HostFactory(name="studio-01"), HostFactory(name="studio-02")]
    for index, host in enumerate(hosts):
        gpu = GpuFactory(host=host, pci_bus_id="00000000:3B:00.0")
        services.place_vgpu(VirtualMachineFactory(name=f"ws-{index}"), gpu, profile("RTX6000-12Q"))
    return hosts


def finished_run(user, **options) -> OptimizerRun:
    run = optimizer_runs.start_run(user, **options)
    assert tasks.run_optimizer(run.pk) == OptimizerStatus.DONE
    run.refresh_from_db()
    return run


def run_all(run: OptimizerRun, user) -> list[Operation]:
    """The admin's "run them all now", then a worker taking each in turn."""
    optimizer_runs.run_operations_now(run, user)
    for operation in optimizer_runs.operations_of(run):
        operations.run(operation.pk)
    return optimizer_runs.operations_of(run)


def test_a_move_on_a_linked_host_becomes_an_operation_that_puts_the_vm_on_its_new_gpu(admin_user):
    world, run, move, vm = one_move_planned(admin_user)
    (old_device,) = [d.id for d in view(world.host).domain(str(vm.uuid)).vgpus]

    outcome = optimizer_runs.apply_run(run, admin_user)

    (operation,) = Operation.objects.all()
    assert outcome.operation_ids == [operation.pk]
    assert (operation.kind, operation.status, operation.origin) == (OperationKind.MOVE, OperationStatus.PENDING,
                                                                    f"optimizer run #{run.pk}")
    assert [s.kind for s in operation.steps.order_by("index")] == [
        "notify", "shutdown", "remove_vgpu", "create_vgpu", "redefine", "start", "verify"]
    # Nothing happens on the host until the admin runs it.
    assert [d.id for d in view(world.host).domain(str(vm.uuid)).vgpus] == [old_device]

    (done,) = run_all(run, admin_user)

    assert done.status == OperationStatus.SUCCEEDED, done.error
    target = Vgpu.objects.select_related("gpu").get(vm=vm)
    assert target.gpu_id == move["to_gpu_ids"][0]
    domain = view(world.host).domain(str(vm.uuid))
    assert domain.state == PowerState.RUNNING
    assert [(d.gpu_bus_id, d.id) for d in domain.vgpus] == [(target.gpu.pci_bus_id, target.device_id)]
    assert old_device not in {d.id for d in view(world.host).vgpu_devices()}
    assert not OperationClaim.objects.filter(active=True).exists()


def test_a_move_to_another_linked_host_moves_the_domain_there(admin_user):
    """Two hosts with one half-full GPU each: the plan puts both VMs on one GPU, so one VM
    changes host, and its domain goes with it."""
    hosts = two_half_full_hosts()
    link(*hosts)
    run = finished_run(admin_user, include_requests=False)
    (move,) = run.result["plan"]["moves"]
    assert move["from_host_id"] != move["to_host_id"]
    vm = VirtualMachine.objects.get(pk=move["vm_id"])
    source, target = (next(h for h in hosts if h.pk == move[key]) for key in ("from_host_id", "to_host_id"))

    optimizer_runs.apply_run(run, admin_user)
    (done,) = run_all(run, admin_user)

    assert done.status == OperationStatus.SUCCEEDED, done.error
    assert "move_domain" in [s.kind for s in done.steps.all()]
    assert str(vm.uuid) not in {d.uuid for d in view(source).list_domains()}
    domain = view(target).domain(str(vm.uuid))
    assert domain.state == PowerState.RUNNING
    assert [d.id for d in domain.vgpus] == [Vgpu.objects.get(vm=vm).device_id]
    assert VirtualMachine.objects.get(pk=vm.pk).host_id == target.pk
    # Both VMs now share the one GPU on the target host.
    assert len(view(target).vgpu_devices()) == 2
    assert view(source).vgpu_devices() == []


def test_a_plan_touching_a_gpu_under_another_operation_is_refused_whole(admin_user):
    world = fragmented_fleet()
    link(world.host)
    first = finished_run(admin_user, include_requests=False)
    optimizer_runs.apply_run(first, admin_user)  # its operation waits, holding both GPUs
    # Meanwhile two more artists get a GPU each, one on the GPU the first plan empties.
    q12 = profile("RTX6000-12Q")
    gpu_c = GpuFactory(host=world.host, pci_bus_id="00000000:AF:00.0")
    emptied = next(g for g in (world.gpu_a, world.gpu_b) if not Vgpu.objects.filter(gpu=g).exists())
    services.place_vgpu(VirtualMachineFactory(name="ws-c"), emptied, q12)
    services.place_vgpu(VirtualMachineFactory(name="ws-d"), gpu_c, q12)
    second = finished_run(admin_user, include_requests=False)
    assert second.result["plan"]["moves"]
    before = placements()

    with pytest.raises(optimizer_runs.PlanConflict, match=r"is being changed by operation #\d+"):
        optimizer_runs.apply_run(second, admin_user)

    assert placements() == before
    assert OptimizerRun.objects.get(pk=second.pk).status == OptimizerStatus.DONE
    assert Operation.objects.count() == 1


def test_a_failed_move_puts_back_the_host_and_the_inventory(admin_user):
    world, run, move, vm = one_move_planned(admin_user)
    before = placements()
    old = view(world.host).domain(str(vm.uuid))
    # The target GPU's driver takes no further vGPU now (as a GPU someone filled by hand would).
    state = view(world.host)._read()
    target_bus = next(g.pci_bus_id for g in (world.gpu_a, world.gpu_b) if g.pk == move["to_gpu_ids"][0])
    for gpu in state["gpus"]:
        if gpu["bus_id"] == target_bus:
            for vtype in gpu["types"]:
                vtype["max_instances"] = 1
    view(world.host).seed(state)
    optimizer_runs.apply_run(run, admin_user)

    (done,) = run_all(run, admin_user)

    assert done.status == OperationStatus.ROLLED_BACK
    assert "cannot take another" in done.error
    assert done.steps.get(kind="create_vgpu").status == StepStatus.FAILED
    assert view(world.host).domain(str(vm.uuid)) == old  # running, with its old device
    assert placements() == before
    assert Vgpu.objects.get(vm=vm).device_id == old.vgpus[0].id
    assert not OperationClaim.objects.filter(active=True).exists()


def test_requests_of_the_plan_are_applying_until_their_operation_ends(admin_user):
    world = fleet_with_request(admin_user)
    link(world.host)
    run = finished_run(admin_user)

    outcome = optimizer_runs.apply_run(run, admin_user)

    world.request.refresh_from_db()
    assert world.request.status == ResizeStatus.APPLYING
    assert outcome.applying_request_ids == [world.request.pk]
    assert outcome.approved_request_ids == []
    resize = Operation.objects.get(request=world.request)
    assert resize.kind == OperationKind.RESIZE
    done = run_all(run, admin_user)
    assert [op.status for op in done] == [OperationStatus.SUCCEEDED] * len(done), [op.error for op in done]
    world.request.refresh_from_db()
    assert world.request.status == ResizeStatus.APPROVED
    domain = view(world.host).domain(str(world.vm_c.uuid))
    assert [d.type_name for d in domain.vgpus] == ["NVIDIA RTX6000-12Q"]


def test_when_one_operation_of_a_plan_fails_the_ones_after_it_are_rolled_back_unrun(admin_user, settings):
    """Four half-full GPUs: the plan moves two VMs, one operation each, run in turn. The first
    VM's guest will not power off, so its operation rolls back, and so does the second, unrun
    (it may have needed the room the first was to make)."""
    world = four_half_full_gpus()
    run = finished_run(admin_user, include_requests=False)
    before = placements()
    optimizer_runs.apply_run(run, admin_user)
    first, second = optimizer_runs.operations_of(run)
    view(world.host).set_ignore_acpi(str(first.vm.uuid))
    settings.HYPERVISOR_SHUTDOWN_TIMEOUT_S = 0.2
    # Asked to run now, the second still waits for the first.
    optimizer_runs.run_operations_now(run, admin_user)
    assert operations.run(second.pk) is None

    done = run_all(run, admin_user)

    assert [op.status for op in done] == [OperationStatus.ROLLED_BACK] * 2
    assert "did not power off" in done[0].error
    assert f"operation #{first.pk} of the same plan failed" in done[1].error
    assert done[1].started_at is None
    assert placements() == before
    assert not OperationClaim.objects.filter(active=True).exists()
    assert all(view(world.host).domain(str(op.vm.uuid)).state == PowerState.RUNNING for op in done)


def test_the_operations_of_a_plan_run_in_turn_and_hold_their_gpus_until_the_last_ends(admin_user):
    world = four_half_full_gpus()
    run = finished_run(admin_user, include_requests=False)
    optimizer_runs.apply_run(run, admin_user)
    optimizer_runs.run_operations_now(run, admin_user)
    first, second = optimizer_runs.operations_of(run)
    touched = {row["gpu_id"] for op in (first, second) for row in op.before["vgpus"] + op.after["vgpus"]}

    assert operations.run(first.pk).status == OperationStatus.SUCCEEDED
    held = set(OperationClaim.objects.filter(active=True, gpu__isnull=False).values_list("gpu_id", flat=True))
    assert held == touched
    assert operations.run(second.pk).status == OperationStatus.SUCCEEDED

    assert not OperationClaim.objects.filter(active=True).exists()
    for op in (first, second):
        devices = {d.id for d in view(world.host).domain(str(op.vm.uuid)).vgpus}
        assert devices == set(Vgpu.objects.filter(vm=op.vm).values_list("device_id", flat=True))
    assert len({d.gpu_bus_id for d in view(world.host).vgpu_devices()}) == 2


def test_a_move_between_a_linked_and_an_unlinked_host_refuses_the_plan_naming_the_host(admin_user):
    hosts = two_half_full_hosts()
    link(hosts[0])
    run = finished_run(admin_user, include_requests=False)
    before = placements()

    with pytest.raises(optimizer_runs.PlanConflict, match="studio-02 has no hypervisor link"):
        optimizer_runs.apply_run(run, admin_user)

    assert placements() == before
    assert not Operation.objects.exists()


def test_operation_order_lets_vms_leave_a_gpu_before_others_arrive():
    # VM 1 goes to GPU 20, which VM 2 leaves for GPU 30: VM 2 first.
    assert optimizer_runs.operation_order({1: ({10}, {20}), 2: ({20}, {30})}) == [2, 1]
    # A VM resized on its own GPU depends on nobody.
    assert optimizer_runs.operation_order({1: ({10}, {10}), 2: ({20}, {10})}) == [1, 2]
    with pytest.raises(optimizer_runs.PlanConflict, match="exchanges GPUs"):
        optimizer_runs.operation_order({1: ({10}, {20}), 2: ({20}, {10})})

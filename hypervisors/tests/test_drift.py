"""Three-way drift on plain data (hypervisors/drift.py): each kind, as the admin reads it, and what
is deliberately not drift (an operation under way, a read older than the last change, readings
from before a move)."""

from dataclasses import replace
from datetime import UTC, datetime, timedelta

from hypervisors.drift import (
    Action,
    DeviceRow,
    Do,
    DomainRow,
    GpuRow,
    HostRow,
    Kind,
    OperationRow,
    Reading,
    Severity,
    Snapshot,
    VgpuRow,
    VmRow,
    counts,
    find_drift,
    select,
)

NOW = datetime(2026, 3, 2, 10, 0, tzinfo=UTC)
READ_AT = NOW - timedelta(minutes=5)
BUS_A, BUS_B = "00000000:3B:00.0", "00000000:5E:00.0"
UUID_A = "11111111-1111-4111-8111-111111111111"
UUID_X = "99999999-9999-4999-8999-999999999999"
DEV_A = "aaaaaaaa-0000-4000-8000-000000000001"

NODE1 = HostRow(1, "node-01", linked=True, read_at=READ_AT, has_agent=True)
NODE2 = HostRow(2, "node-02", linked=True, read_at=READ_AT, has_agent=True)
GPU_A, GPU_B, GPU_C = GpuRow(10, 1, BUS_A), GpuRow(11, 1, BUS_B), GpuRow(20, 2, BUS_A)
VM = VmRow(100, UUID_A, "ws-a", 1, (VgpuRow(1000, GPU_A.id, "L40S-12Q", DEV_A),))
DOMAIN = DomainRow(1, UUID_A, "ws-a", "running", (DeviceRow(DEV_A, BUS_A, "L40S-12Q", "NVIDIA L40S-12Q"),))


def world(**changes) -> Snapshot:
    """ws-a on node-01, GPU A: the inventory, the hypervisor and the agent agree."""
    base = Snapshot(now=NOW, window_s=60, hosts=(NODE1, NODE2), gpus=(GPU_A, GPU_B, GPU_C), vms=(VM,),
                    domains=(DOMAIN,), readings=(Reading(VM.id, GPU_A.id, NOW - timedelta(seconds=8)),),
                    gpus_reporting=frozenset({GPU_A.id, GPU_B.id, GPU_C.id}))
    return replace(base, **changes)


def only(snapshot: Snapshot):
    items = find_drift(snapshot)
    assert len(items) == 1, [(i.kind, i.message) for i in items]
    return items[0]


def test_three_views_in_step_are_no_drift():
    assert find_drift(world()) == []


def test_agent_still_reporting_the_old_gpu_after_a_move():
    moved_vm = replace(VM, vgpus=(VgpuRow(1000, GPU_B.id, "L40S-12Q", DEV_A),))
    moved_domain = replace(DOMAIN, devices=(DeviceRow(DEV_A, BUS_B, "L40S-12Q"),))
    item = only(world(vms=(moved_vm,), domains=(moved_domain,),
                      readings=(Reading(VM.id, GPU_A.id, NOW - timedelta(seconds=5)),
                                Reading(VM.id, GPU_B.id, NOW - timedelta(seconds=5)))))
    assert item.kind == Kind.AGENT_OLD_GPU
    assert item.gpu_id == GPU_A.id
    assert item.message == ("The agent still reports ws-a on GPU 00000000:3B:00.0 of node-01 (5 s ago); the "
                            "inventory and the hypervisor have it on 00000000:5E:00.0.")
    assert item.action.code == Do.CHECK_AGENT
    assert "3B:00.0" in item.telemetry
    assert "5E:00.0" in item.inventory
    assert "5E:00.0" in item.hypervisor


def test_readings_from_before_a_finished_operation_do_not_count():
    moved_vm = replace(VM, vgpus=(VgpuRow(1000, GPU_B.id, "L40S-12Q", DEV_A),))
    moved_domain = replace(DOMAIN, devices=(DeviceRow(DEV_A, BUS_B, "L40S-12Q"),))
    done = OperationRow(7, VM.id, "succeeded", READ_AT - timedelta(minutes=1), (1, 1))
    items = find_drift(world(vms=(moved_vm,), domains=(moved_domain,), operations=(done,),
                             readings=(Reading(VM.id, GPU_A.id, READ_AT - timedelta(minutes=2)),
                                       Reading(VM.id, GPU_B.id, NOW - timedelta(seconds=5)))))
    assert items == []


def test_a_domain_the_inventory_does_not_know_holding_a_vgpu():
    stranger = DomainRow(1, UUID_X, "render-tmp", "running", (DeviceRow("dev-x", BUS_B, "L40S-24Q"),))
    item = only(world(domains=(DOMAIN, stranger)))
    assert item.kind == Kind.UNKNOWN_VM
    assert item.severity == Severity.CRITICAL
    assert item.vm_id is None
    assert item.vm_uuid == UUID_X
    assert item.gpu_id == GPU_B.id
    assert item.action == Action(Do.SYNC_AND_APPLY, "Sync and apply on the host page: it creates the VM and places "
                                                    "its vGPUs", host_id=1)
    assert item.inventory == "not in the inventory"
    assert "L40S-24Q on 00000000:5E:00.0" in item.hypervisor


def test_a_vgpu_the_hypervisor_places_only_at_start_agrees_with_the_inventorys_gpu():
    """A VM that is off on vSphere, or a Proxmox VE resource mapping: the device names no GPU."""
    unplaced = replace(DOMAIN, state="shut_off", devices=(DeviceRow(DEV_A, "", "L40S-12Q", "grid_l40s-12q"),))
    assert find_drift(world(domains=(unplaced,), readings=())) == []
    other_profile = replace(unplaced, devices=(DeviceRow(DEV_A, "", "L40S-24Q", "grid_l40s-24q"),))
    item = only(world(domains=(other_profile,), readings=()))
    assert item.kind == Kind.PROFILE_MISMATCH
    assert item.message.startswith("ws-a's vGPU on GPU 00000000:3B:00.0 of node-01 is a L40S-24Q on the hypervisor")
    assert item.hypervisor.endswith("shut off, L40S-24Q on the GPU the hypervisor picks at start")


def test_a_device_of_a_known_vm_the_inventory_does_not_record():
    extra = DeviceRow("dev-extra", BUS_B, "L40S-12Q")
    item = only(world(domains=(replace(DOMAIN, devices=(*DOMAIN.devices, extra)),),
                      readings=(Reading(VM.id, GPU_A.id, NOW), Reading(VM.id, GPU_B.id, NOW))))
    assert item.kind == Kind.UNKNOWN_DEVICE
    assert item.gpu_id == GPU_B.id
    assert "which the inventory does not record" in item.message
    assert item.message.endswith("The agent reads it too.")


def test_inventory_vgpu_missing_on_the_running_domain():
    item = only(world(domains=(replace(DOMAIN, devices=()),), readings=()))
    assert item.kind == Kind.MISSING_DEVICE
    assert item.severity == Severity.CRITICAL
    assert item.message == ("The inventory gives ws-a a L40S-12Q on GPU 00000000:3B:00.0 of node-01, but its domain "
                            "on the hypervisor has no device for it: the VM runs without that vGPU.")
    assert item.hypervisor.endswith("running, no vGPU")
    assert item.action.code == Do.FIX_HYPERVISOR


def test_missing_device_that_the_agent_still_reads_asks_for_a_new_read():
    item = only(world(domains=(replace(DOMAIN, devices=()),)))
    assert (item.kind, item.severity, item.action.code) == (Kind.MISSING_DEVICE, Severity.INFO, Do.SYNC)


def test_gpu_mismatch_the_agent_agrees_with_the_hypervisor():
    elsewhere = replace(DOMAIN, devices=(DeviceRow(DEV_A, BUS_B, "L40S-12Q"),))
    item = only(world(domains=(elsewhere,), readings=(Reading(VM.id, GPU_B.id, NOW),)))
    assert item.kind == Kind.GPU_MISMATCH
    assert item.gpu_id == GPU_A.id
    assert "the inventory is out of date" in item.message
    assert item.action.code == Do.FIX_INVENTORY


def test_gpu_mismatch_the_agent_agrees_with_the_inventory():
    elsewhere = replace(DOMAIN, devices=(DeviceRow(DEV_A, BUS_B, "L40S-12Q"),))
    item = only(world(domains=(elsewhere,)))
    assert item.kind == Kind.GPU_MISMATCH
    assert "the hypervisor's read may be old" in item.message
    assert item.action.code == Do.SYNC


def test_profile_and_device_id_differences():
    other_type = replace(DOMAIN, devices=(DeviceRow(DEV_A, BUS_A, "L40S-24Q"),))
    item = only(world(domains=(other_type,)))
    assert item.kind == Kind.PROFILE_MISMATCH
    assert "is a L40S-24Q on the hypervisor and a L40S-12Q in the inventory" in item.message

    unrecorded = replace(VM, vgpus=(VgpuRow(1000, GPU_A.id, "L40S-12Q", ""),))
    item = only(world(vms=(unrecorded,)))
    assert (item.kind, item.severity, item.action.code) == (Kind.DEVICE_ID, Severity.INFO, Do.SYNC_AND_APPLY)


MDEV_NEW = "bbbbbbbb-0000-4000-8000-000000000002"


def reporting(device: str, at: datetime = READ_AT, **fields) -> VmRow:
    """ws-a with the agent reporting its vGPU as mdev `device` since `at`."""
    return replace(VM, vgpus=(VgpuRow(1000, GPU_A.id, "L40S-12Q", DEV_A, device, at, **fields),))


def test_agent_reporting_the_device_the_others_have_is_no_drift():
    assert find_drift(world(vms=(reporting(DEV_A.upper()),))) == []


def test_agent_reporting_another_device_than_the_hypervisors_last_read():
    item = only(world(vms=(reporting(MDEV_NEW),)))
    assert (item.kind, item.severity, item.gpu_id) == (Kind.AGENT_DEVICE, Severity.WARNING, GPU_A.id)
    assert item.kind_label == "agent reports another device"
    assert item.message == (f"The agent reads ws-a's L40S-12Q on GPU {BUS_A} of node-01 as device {MDEV_NEW}; the "
                            f"hypervisor's last read has {DEV_A}: the device was recreated since, or the read is old.")
    assert item.action == Action(Do.SYNC, "Read the hypervisor again (Compare on the host page), then apply its "
                                          "device ids", host_id=1)


def test_agent_reporting_another_device_than_the_inventory_of_an_unlinked_host():
    unlinked = replace(NODE1, linked=False, read_at=None)
    item = only(world(hosts=(unlinked, NODE2), domains=(), vms=(reporting(MDEV_NEW),)))
    assert item.kind == Kind.AGENT_DEVICE
    assert item.message == (f"The agent reads ws-a's L40S-12Q on GPU {BUS_A} of node-01 as device {MDEV_NEW}; the "
                            f"inventory records {DEV_A}: an operation on this vGPU would look for a device that is "
                            "not there.")
    assert item.action.code == Do.FIX_INVENTORY


def test_agent_device_is_not_compared_where_it_cannot_be_trusted_or_has_nothing_to_match():
    # The agent reads nothing of the vGPU lately: its stored report may be old.
    assert find_drift(world(vms=(reporting(MDEV_NEW),), readings=(), hosts=(replace(NODE1, has_agent=False),
                                                                            NODE2))) == []
    # An SR-IOV vGPU: the inventory's device is a VF address, no mdev to compare with.
    sriov = replace(VM, vgpus=(VgpuRow(1000, GPU_A.id, "L40S-12Q", "0000:3b:00.4", MDEV_NEW, READ_AT),))
    vf = replace(DOMAIN, devices=(DeviceRow("0000:3b:00.4", BUS_A, "L40S-12Q"),))
    assert find_drift(world(vms=(sriov,), domains=(vf,))) == []
    # Reported before an operation that ended since: the operation may have replaced the device.
    done = OperationRow(7, VM.id, "succeeded", READ_AT - timedelta(minutes=1), (1, 1))
    early = reporting(MDEV_NEW, at=READ_AT - timedelta(minutes=3))
    assert find_drift(world(vms=(early,), operations=(done,))) == []
    assert only(world(vms=(reporting(MDEV_NEW),), operations=(done,))).kind == Kind.AGENT_DEVICE


def test_vm_missing_on_its_hypervisor():
    item = only(world(domains=(), readings=()))
    assert item.kind == Kind.MISSING_DOMAIN
    assert item.hypervisor == "node-01 (read 5 min ago): no such domain"


def test_vm_whose_domain_is_on_another_host():
    moved = replace(DOMAIN, host_id=2, devices=(DeviceRow(DEV_A, BUS_A, "L40S-12Q"),))
    item = only(world(domains=(moved,), readings=(Reading(VM.id, GPU_C.id, NOW),)))
    assert item.kind == Kind.ELSEWHERE
    assert (item.host_id, item.other_host_id) == (2, 1)
    assert item.message == ("The inventory has ws-a on node-01; the hypervisor of node-02 has its domain (running). "
                            "The agent reads it there too.")
    assert select([item], host_id=1) == [item] == select([item], host_id=2)


def test_agent_reports_the_vm_on_another_host():
    items = find_drift(world(readings=(Reading(VM.id, GPU_A.id, NOW), Reading(VM.id, GPU_C.id, NOW))))
    assert [i.kind for i in items] == [Kind.AGENT_OTHER_HOST]
    assert items[0].message.startswith("The agent reports ws-a on GPU 00000000:3B:00.0 of node-02")
    assert items[0].action == Action(Do.CHECK_AGENT, "Check the agent of node-02 and where ws-a really runs",
                                     host_id=2)


def test_agent_silent_for_a_running_vm_with_a_vgpu():
    item = only(world(readings=(), gpus_reporting=frozenset()))
    assert item.kind == Kind.AGENT_SILENT
    assert "the agent of node-01 has reported nothing for 60 s" in item.message
    assert item.telemetry == "no reading in the last 60 s"

    item = only(world(readings=()))
    assert "while the host's GPUs are read: check the vGPU driver and licence in the guest" in item.message


def test_no_agent_or_a_vm_that_is_off_is_not_silent():
    assert find_drift(world(readings=(), hosts=(replace(NODE1, has_agent=False), NODE2))) == []
    assert find_drift(world(readings=(), domains=(replace(DOMAIN, state="shut_off"),))) == []
    assert only(world(readings=(), hosts=(replace(NODE1, has_agent=False), NODE2),
                      vms=(replace(VM, guest_agent=True),))).kind == Kind.AGENT_SILENT


def test_a_vm_under_an_operation_is_reported_as_such_and_nothing_else():
    running = OperationRow(12, VM.id, "running", None, (1, 1))
    item = only(world(domains=(), readings=(), operations=(running,)))
    assert item.kind == Kind.IN_OPERATION
    assert item.message == "ws-a is being changed by operation #12 (running): its views differ until it ends."
    assert item.action == Action(Do.FOLLOW_OPERATION, "Follow operation #12", host_id=1, operation_id=12)


def test_a_read_older_than_the_last_operation_is_not_compared():
    done = OperationRow(9, VM.id, "succeeded", READ_AT + timedelta(minutes=1), (1, 1))
    item = only(world(domains=(replace(DOMAIN, devices=()),), operations=(done,)))
    assert item.kind == Kind.STALE_READ
    assert item.action.code == Do.SYNC
    assert item.action.operation_id == 9


def test_hosts_never_read_or_whose_last_read_failed():
    never = replace(NODE1, read_at=None)
    items = find_drift(world(hosts=(never, NODE2)))
    assert [i.kind for i in items] == [Kind.UNREAD]
    assert items[0].vm_id is None

    failed = replace(NODE1, read_error="Connection refused")
    item = only(world(hosts=(failed, NODE2)))
    assert item.kind == Kind.UNREAD
    assert item.severity == Severity.WARNING
    assert "Connection refused" in item.message


def test_an_unlinked_host_compares_inventory_and_agent_only():
    unlinked = replace(NODE1, linked=False, read_at=None)
    assert find_drift(world(hosts=(unlinked, NODE2), domains=())) == []
    item = only(world(hosts=(unlinked, NODE2), domains=(), readings=(Reading(VM.id, GPU_B.id, NOW),)))
    assert item.kind == Kind.AGENT_OLD_GPU
    assert "the inventory has it on 00000000:3B:00.0" in item.message
    assert item.hypervisor == "unknown: node-01 is not linked to its hypervisor"


def test_counts_by_kind_distinct_vms_and_gpus():
    vm2 = VmRow(101, "22222222-2222-4222-8222-222222222222", "ws-b", 1, (VgpuRow(1001, GPU_B.id, "L40S-12Q", "d"),))
    items = find_drift(world(vms=(VM, vm2), readings=()))
    assert {(i.kind, i.vm_name) for i in items} == {(Kind.AGENT_SILENT, "ws-a"), (Kind.MISSING_DOMAIN, "ws-b")}
    summary = {c.kind: (c.vms, c.gpus, c.items) for c in counts(items)}
    assert summary == {Kind.MISSING_DOMAIN: (1, 0, 1), Kind.AGENT_SILENT: (1, 1, 1)}
    assert select(items, kinds=[Kind.AGENT_SILENT]) == [i for i in items if i.kind == Kind.AGENT_SILENT]
    assert select(items, severity=Severity.CRITICAL) == []

"""The comparison itself, without a database: what an admin reads in a diff."""

from hypervisors.backends.base import Domain, VgpuDevice
from hypervisors.discovery import HostInventory, InventoryVgpu, InventoryVm, TelemetryVgpu, diff_host, ram_gib_of
from hypervisors.matching import match_profile, profile_name_of

BUS_A, BUS_B = "00000000:3B:00.0", "00000000:5E:00.0"
UUID_1 = "11111111-1111-4111-8111-111111111111"
UUID_2 = "22222222-2222-4222-8222-222222222222"
DEV_1 = "aaaaaaaa-0000-4000-8000-000000000001"
PROFILES = {BUS_A: ("L40S-12Q", "L40S-24Q"), BUS_B: ("L40S-12Q", "L40S-24Q")}


def vm(**fields) -> InventoryVm:
    values = {"id": 1, "uuid": UUID_1, "name": "ws-a", "vcpus": 8, "ram_gib": 32, "host": "node-01",
              "vgpus": (InventoryVgpu(10, "L40S-12Q", BUS_A, DEV_1),)}
    return InventoryVm(**{**values, **fields})


def domain(**fields) -> Domain:
    values = {"uuid": UUID_1, "name": "ws-a", "vcpus": 8, "ram_mib": 32768, "state": "running",
              "vgpus": (VgpuDevice("mdev", DEV_1, BUS_A, "NVIDIA L40S-12Q"),)}
    return Domain(**{**values, **fields})


def inventory(*vms, telemetry=None) -> HostInventory:
    return HostInventory("node-01", tuple(vms), PROFILES, telemetry or {})


def kinds(diff) -> dict:
    return {e["name"]: e["kind"] for e in diff["entries"]}


def test_type_names_match_profiles_whatever_the_driver_calls_them():
    assert profile_name_of("NVIDIA L40S-12Q") == "L40S-12Q"
    assert profile_name_of("GRID RTX6000-12Q") == "RTX6000-12Q"
    assert match_profile("nvidia l40s-12q", ["L40S-24Q", "L40S-12Q"]) == "L40S-12Q"
    assert match_profile("NVIDIA L40S-13Q", ["L40S-12Q"]) is None


def test_ram_is_rounded_up_to_whole_gib():
    assert (ram_gib_of(32768), ram_gib_of(16000), ram_gib_of(1)) == (32, 16, 1)


def test_uuid_wins_over_name():
    """A domain named like another VM is that VM only when no domain carries its UUID."""
    renamed = domain(name="ws-b")
    impostor = domain(uuid=UUID_2, name="ws-a", vgpus=())
    diff = diff_host([impostor, renamed], inventory(vm()))
    by_uuid = {e["uuid"]: e for e in diff["entries"]}
    assert by_uuid[UUID_1]["kind"] == "changed"
    assert by_uuid[UUID_1]["changes"] == [{"field": "name", "inventory": "ws-a", "hypervisor": "ws-b"}]
    assert by_uuid[UUID_2]["kind"] == "new"


def test_a_name_match_with_another_uuid_updates_the_uuid():
    diff = diff_host([domain(uuid=UUID_2)], inventory(vm()))
    [entry] = diff["entries"]
    assert entry["changes"] == [{"field": "uuid", "inventory": UUID_1, "hypervisor": UUID_2}]
    assert entry["appliable"] is True


def test_vgpu_differences_are_noted_not_applied():
    other_gpu = domain(vgpus=(VgpuDevice("mdev", DEV_1, BUS_B, "NVIDIA L40S-24Q"),))
    [entry] = diff_host([other_gpu], inventory(vm()))["entries"]
    assert entry["kind"] == "changed"
    assert entry["appliable"] is False
    assert "a L40S-24Q on the hypervisor, a L40S-12Q in the inventory" in entry["vgpu_notes"][0]
    assert f"on GPU {BUS_B} on the hypervisor, {BUS_A} in the inventory" in entry["vgpu_notes"][1]


def test_a_vm_the_inventory_has_elsewhere_is_left_to_the_admin():
    diff = diff_host([domain()], inventory(vm(host="node-02")))
    [entry] = diff["entries"]
    assert entry["kind"] == "elsewhere"
    assert entry["appliable"] is False
    assert "node-02" in entry["notes"][0]


def test_the_agents_readings_are_joined():
    readings = {UUID_1: (TelemetryVgpu(BUS_B, "2026-11-26T07:00:00+00:00"),)}
    [entry] = diff_host([domain()], inventory(vm(), telemetry=readings))["entries"]
    assert entry["telemetry"] == [{"gpu_bus_id": BUS_B, "last_seen": "2026-11-26T07:00:00+00:00", "device_ids": []}]
    assert f"the agent read a vGPU of this VM on GPU {BUS_B}" in entry["vgpu_notes"][0]


SEEN = "2026-11-26T07:00:00+00:00"
DEV_2 = "bbbbbbbb-0000-4000-8000-000000000002"


def test_readings_with_the_device_the_domain_holds_join_by_device_id():
    readings = {UUID_1: (TelemetryVgpu(BUS_A, SEEN, (DEV_1.upper(),)),)}
    [entry] = diff_host([domain()], inventory(vm(), telemetry=readings))["entries"]
    assert entry["kind"] == "same"
    assert entry["telemetry"] == [{"gpu_bus_id": BUS_A, "last_seen": SEEN, "device_ids": [DEV_1.upper()]}]


def test_a_device_recreated_on_the_same_gpu_is_noted_where_the_gpu_join_sees_nothing():
    readings = {UUID_1: (TelemetryVgpu(BUS_A, SEEN, (DEV_2,)),)}
    [entry] = diff_host([domain()], inventory(vm(), telemetry=readings))["entries"]
    assert entry["kind"] == "changed"
    assert entry["vgpu_notes"] == [f"the agent read device {DEV_2} of this VM on GPU {BUS_A} at {SEEN}, which the "
                                   "domain does not hold on the hypervisor"]
    # The same reading without a device id: the GPU matches, nothing to note.
    no_id = {UUID_1: (TelemetryVgpu(BUS_A, SEEN),)}
    assert diff_host([domain()], inventory(vm(), telemetry=no_id))["entries"][0]["kind"] == "same"


def test_a_reported_device_the_hypervisor_has_on_another_gpu_is_noted():
    readings = {UUID_1: (TelemetryVgpu(BUS_B, SEEN, (DEV_1,)),)}
    [entry] = diff_host([domain()], inventory(vm(), telemetry=readings))["entries"]
    assert entry["vgpu_notes"] == [f"the agent read device {DEV_1} on GPU {BUS_B} at {SEEN}; the hypervisor has it "
                                   f"on GPU {BUS_A}"]


def test_entries_come_new_changed_gone_then_same():
    diff = diff_host([domain(uuid=UUID_2, name="ws-new", vgpus=())],
                     inventory(vm(), vm(id=2, uuid="33333333-3333-4333-8333-333333333333", name="ws-x",
                                        host="node-01", vgpus=())))
    assert [e["kind"] for e in diff["entries"]] == ["new", "gone", "gone"]
    assert diff["summary"] == {"new": 1, "changed": 0, "gone": 2, "elsewhere": 0, "same": 0}
    assert kinds(diff)["ws-new"] == "new"


def test_a_vsphere_vgpu_of_a_vm_that_is_off_agrees_with_the_inventory_on_any_gpu():
    """ESXi places a VM's vGPU on a GPU when the VM starts: off, its device is on none, and only
    its profile is compared (against the host's GPU models)."""
    off = domain(state="shut_off", vgpus=(VgpuDevice("vmiop", DEV_1, "", "GRID L40S-12Q"),))
    [entry] = diff_host([off], inventory(vm()))["entries"]
    assert (entry["kind"], entry["vgpu_notes"]) == ("same", [])
    assert entry["vgpus"][0]["profile"] == "L40S-12Q"
    resized = domain(state="shut_off", vgpus=(VgpuDevice("vmiop", DEV_1, "", "GRID L40S-24Q"),))
    [entry] = diff_host([resized], inventory(vm()))["entries"]
    assert entry["vgpu_notes"] == [f"vGPU {DEV_1} is a L40S-24Q on the hypervisor, a L40S-12Q in the inventory"]

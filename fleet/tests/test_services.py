"""The fleet services: what they write when the rules accept, and that a refusal writes nothing."""

from __future__ import annotations

import pytest

from fleet import placement, services
from fleet.models import Gpu, Host, Vgpu, VirtualMachine
from fleet.placement import PlacementError, Rule
from fleet.services import FleetConflict
from fleet.tests.factories import GpuFactory, HostFactory, VirtualMachineFactory, gpu_model, profile

pytestmark = pytest.mark.django_db


def _place(gpu, name, **vm_fields):
    return services.place_vgpu(VirtualMachineFactory(**vm_fields), gpu, profile(name))


def _host_of(vm) -> int | None:
    return VirtualMachine.objects.get(pk=vm.pk).host_id


# place_vgpu ----------------------------------------------------------------------------------

def test_place_vgpu_creates_the_vgpu_and_moves_the_vm_onto_the_gpus_host():
    gpu = GpuFactory()
    vm = VirtualMachineFactory()
    assert vm.host_id is None

    vgpu = services.place_vgpu(vm, gpu, profile("RTX6000-12Q"))

    row = Vgpu.objects.select_related("profile").get(pk=vgpu.pk)
    assert (row.vm_id, row.gpu_id, row.profile.name, row.placement_id) == (vm.pk, gpu.pk, "RTX6000-12Q", 0)
    assert _host_of(vm) == gpu.host_id
    assert vgpu.vm.host_id == gpu.host_id  # callers (forms, demo) use the returned VM
    assert _place(gpu, "RTX6000-12Q").placement_id == 1


def test_place_vgpu_stores_mixed_size_grid_offsets():
    gpu = GpuFactory(gpu_model=gpu_model("NVIDIA L40S"), size_mode="mixed")
    ids = [_place(gpu, "L40S-8Q").placement_id for _ in range(4)]
    assert ids == [0, 8, 16, 24]
    with pytest.raises(PlacementError) as refused:
        _place(gpu, "L40S-8Q")
    assert refused.value.rules == [Rule.MAX_PER_GPU]
    assert "L40S-8Q allows 4 per GPU in mixed-size mode" in str(refused.value)


def test_refused_placement_raises_the_rules_and_writes_nothing():
    gpu = GpuFactory(pci_bus_id="00000000:3B:00.0")
    _place(gpu, "RTX6000-12Q")
    _place(gpu, "RTX6000-12Q")
    vm = VirtualMachineFactory()

    with pytest.raises(PlacementError) as refused:
        services.place_vgpu(vm, gpu, profile("RTX6000-12Q"))

    assert not isinstance(refused.value, FleetConflict)  # refused before any lock: a plain 400
    assert set(refused.value.rules) == {Rule.FRAME_BUFFER, Rule.MAX_PER_GPU}
    assert "RTX6000-12Q allows 2 per GPU; GPU 00000000:3B:00.0 already has 2" in str(refused.value)
    assert Vgpu.objects.filter(gpu=gpu).count() == 2
    assert not Vgpu.objects.filter(vm=vm).exists()
    assert _host_of(vm) is None


def test_frame_buffer_refusal_names_the_numbers():
    gpu = GpuFactory()
    _place(gpu, "RTX6000-8Q")
    _place(gpu, "RTX6000-8Q")
    with pytest.raises(PlacementError) as refused:
        _place(gpu, "RTX6000-12Q")
    assert set(refused.value.rules) == {Rule.FRAME_BUFFER, Rule.EQUAL_SIZE}
    assert "RTX6000-12Q needs 12288 MiB" in str(refused.value)
    assert "8192 MiB free" in str(refused.value)


def test_profile_of_another_model_is_refused():
    with pytest.raises(PlacementError) as refused:
        _place(GpuFactory(), "L40S-12Q")
    assert refused.value.rules == [Rule.PROFILE_MODEL]
    assert not Vgpu.objects.exists()


def test_host_capacity_refusal_leaves_the_vm_unplaced():
    host = HostFactory(name="small", cpu_threads=16, ram_gib=128)
    gpu_a, gpu_b = GpuFactory(host=host), GpuFactory(host=host)
    _place(gpu_a, "RTX6000-24Q", vcpus=8)
    vm = VirtualMachineFactory(vcpus=9)

    with pytest.raises(PlacementError) as refused:
        services.place_vgpu(vm, gpu_b, profile("RTX6000-24Q"))

    assert refused.value.rules == [Rule.HOST_VCPU]
    assert "needs 9 vCPUs; host small has 8 of 16 vCPUs free" in str(refused.value)
    assert _host_of(vm) is None
    assert not Vgpu.objects.filter(gpu=gpu_b).exists()
    assert _place(gpu_b, "RTX6000-24Q", vcpus=8).vm.host_id == host.pk  # exactly full is fine


def test_second_vgpu_of_a_vm_stays_on_its_host():
    vm = VirtualMachineFactory()
    first = GpuFactory()
    services.place_vgpu(vm, first, profile("RTX6000-24Q"))
    with pytest.raises(PlacementError) as refused:
        services.place_vgpu(vm, GpuFactory(), profile("RTX6000-24Q"))  # a GPU of another host
    assert refused.value.rules == [Rule.VM_HOST]
    second = services.place_vgpu(vm, GpuFactory(host=first.host), profile("RTX6000-24Q"))
    assert second.vm.host_id == first.host_id
    assert Vgpu.objects.filter(vm=vm).count() == 2


def test_refusal_found_under_lock_is_a_fleet_conflict(monkeypatch):
    """The check before the locks saw a free slot, but another request took it before the write:
    the API answers 409 and nothing is written."""
    gpu = GpuFactory()
    _place(gpu, "RTX6000-24Q")
    monkeypatch.setattr(services, "check_vgpu", lambda vm, gpu, profile: placement.Decision(placement_id=0))
    vm = VirtualMachineFactory()

    with pytest.raises(FleetConflict) as conflict:
        services.place_vgpu(vm, gpu, profile("RTX6000-24Q"))

    assert set(conflict.value.rules) == {Rule.FRAME_BUFFER, Rule.MAX_PER_GPU}
    assert Vgpu.objects.filter(gpu=gpu).count() == 1
    assert _host_of(vm) is None


def test_taken_slot_is_a_conflict_and_rolls_the_vm_move_back(monkeypatch):
    """The unique (gpu, placement_id) constraint is the backstop: if the rules ever handed out a
    taken slot, the insert fails, the caller gets a 409 and the VM does not stay on the host."""
    gpu = GpuFactory(pci_bus_id="00000000:AF:00.0")
    _place(gpu, "RTX6000-12Q")
    monkeypatch.setattr(placement, "check_placement", lambda *args: placement.Decision(placement_id=0))
    vm = VirtualMachineFactory()

    with pytest.raises(FleetConflict) as conflict:
        services.place_vgpu(vm, gpu, profile("RTX6000-12Q"))

    assert conflict.value.rules == [Rule.PLACEMENT_SLOT]
    assert "GPU 00000000:AF:00.0: the slot was taken by another request meanwhile" in str(conflict.value)
    assert _host_of(vm) is None
    assert Vgpu.objects.filter(gpu=gpu).count() == 1


def test_place_vgpu_follows_a_gpu_moved_since_it_was_loaded():
    """A GPU object loaded before the GPU moved to another host (an open form) must not put the
    VM on the old host while its vGPU sits on the new one."""
    old_host, new_host = HostFactory(), HostFactory()
    gpu = GpuFactory(host=old_host)
    stale = Gpu.objects.get(pk=gpu.pk)
    services.update_gpu(gpu, host=new_host)
    vm = VirtualMachineFactory()

    vgpu = services.place_vgpu(vm, stale, profile("RTX6000-12Q"))

    assert Vgpu.objects.get(pk=vgpu.pk).gpu.host_id == new_host.pk
    assert _host_of(vm) == new_host.pk


def test_check_vgpu_previews_without_writing():
    gpu = GpuFactory()
    vm = VirtualMachineFactory()
    decision = services.check_vgpu(vm, gpu, profile("RTX6000-12Q"))
    assert decision.ok
    assert decision.placement_id == 0
    assert not Vgpu.objects.exists()
    assert _host_of(vm) is None


# remove_vgpu ---------------------------------------------------------------------------------

def test_remove_vgpu_frees_the_slot_and_releases_the_vm_with_its_last_vgpu():
    host = HostFactory()
    gpu_a, gpu_b = GpuFactory(host=host), GpuFactory(host=host)
    vm = VirtualMachineFactory(vcpus=12, ram_gib=48)
    first = services.place_vgpu(vm, gpu_a, profile("RTX6000-24Q"))
    second = services.place_vgpu(vm, gpu_b, profile("RTX6000-24Q"))

    services.remove_vgpu(first)
    assert not Vgpu.objects.filter(pk=first.pk).exists()
    assert _host_of(vm) == host.pk  # still runs there with its second vGPU
    assert services.host_state(host).allocated_vcpus == 12
    assert _place(gpu_a, "RTX6000-24Q").placement_id == 0  # the slot is free again

    services.remove_vgpu(second)
    assert _host_of(vm) is None
    assert services.host_state(host).allocated_vcpus == 8  # only the VM that took gpu_a


def test_removed_vm_gives_its_capacity_back():
    host = HostFactory(cpu_threads=16)
    gpu_a, gpu_b = GpuFactory(host=host), GpuFactory(host=host)
    big = _place(gpu_a, "RTX6000-24Q", vcpus=16)
    with pytest.raises(PlacementError):
        _place(gpu_b, "RTX6000-24Q", vcpus=4)
    services.remove_vgpu(big)
    assert _place(gpu_b, "RTX6000-24Q", vcpus=16).vm.host_id == host.pk


# update_vm -----------------------------------------------------------------------------------

@pytest.fixture
def full_host():
    """A 16-thread, 64 GiB host run to its limit by two 8-vCPU, 32 GiB VMs."""
    host = HostFactory(name="full", cpu_threads=16, ram_gib=64)
    gpu_a, gpu_b = GpuFactory(host=host), GpuFactory(host=host)
    _place(gpu_a, "RTX6000-24Q", vcpus=8, ram_gib=32)
    vm = _place(gpu_b, "RTX6000-24Q", vcpus=8, ram_gib=32).vm
    return host, vm


def test_update_vm_refuses_more_vcpus_than_the_host_has(full_host):
    _, vm = full_host
    with pytest.raises(PlacementError) as refused:
        services.update_vm(vm, vcpus=9)
    assert refused.value.rules == [Rule.HOST_VCPU]
    assert "needs 9 vCPUs; host full has 8 of 16 vCPUs free" in str(refused.value)
    assert VirtualMachine.objects.get(pk=vm.pk).vcpus == 8


def test_update_vm_refuses_more_ram_than_the_host_has(full_host):
    _, vm = full_host
    with pytest.raises(PlacementError) as refused:
        services.update_vm(vm, ram_gib=33)
    assert refused.value.rules == [Rule.HOST_RAM]
    assert "needs 33 GiB RAM; host full has 32 of 64 GiB free" in str(refused.value)
    assert VirtualMachine.objects.get(pk=vm.pk).ram_gib == 32


def test_update_vm_accepts_shrinking_and_renaming(full_host):
    host, vm = full_host
    services.update_vm(vm, vcpus=4, ram_gib=16, name="ws-renamed")
    saved = VirtualMachine.objects.get(pk=vm.pk)
    assert (saved.name, saved.vcpus, saved.ram_gib, saved.host_id) == ("ws-renamed", 4, 16, host.pk)
    services.update_vm(saved, vcpus=8)  # back to exactly full
    assert VirtualMachine.objects.get(pk=vm.pk).vcpus == 8


def test_update_vm_without_a_host_takes_any_size():
    """A VM on no host claims nothing yet; placement checks it when it lands."""
    vm = VirtualMachineFactory()
    services.update_vm(vm, vcpus=512, ram_gib=4096)
    assert VirtualMachine.objects.get(pk=vm.pk).vcpus == 512


def test_update_vm_checks_values_already_set_on_the_instance(full_host):
    """A caller (an admin's save_model) may set the fields on the object and call update_vm(vm):
    what gets written is what gets checked."""
    _, vm = full_host
    vm.vcpus = 12
    with pytest.raises(PlacementError) as refused:
        services.update_vm(vm)
    assert refused.value.rules == [Rule.HOST_VCPU]
    assert VirtualMachine.objects.get(pk=vm.pk).vcpus == 8


def test_update_vm_with_an_object_loaded_before_placement():
    """An edit form opened before the VM got its vGPU holds host=None: saving it must neither skip
    the capacity check nor take the VM off the host its vGPU is on."""
    vm = VirtualMachineFactory(vcpus=4, ram_gib=8)
    stale = VirtualMachine.objects.get(pk=vm.pk)
    host = HostFactory(cpu_threads=8, ram_gib=64)
    services.place_vgpu(vm, GpuFactory(host=host), profile("RTX6000-24Q"))

    with pytest.raises(PlacementError) as refused:
        services.update_vm(stale, vcpus=9)
    assert refused.value.rules == [Rule.HOST_VCPU]

    services.update_vm(stale, name="ws-renamed")
    saved = VirtualMachine.objects.get(pk=vm.pk)
    assert (saved.name, saved.host_id, saved.vcpus) == ("ws-renamed", host.pk, 4)


# update_gpu ----------------------------------------------------------------------------------

@pytest.fixture
def busy_l40s():
    gpu = GpuFactory(gpu_model=gpu_model("NVIDIA L40S"), pci_bus_id="00000000:41:00.0")
    _place(gpu, "L40S-12Q")
    return gpu


@pytest.mark.parametrize(("change", "words"), [
    ({"size_mode": "mixed"}, "its size mode can change only while it holds none"),
    ({"mode": "passthrough"}, "its mode can change only while it holds none"),
])
def test_update_gpu_refuses_mode_changes_while_vgpus_exist(busy_l40s, change, words):
    with pytest.raises(PlacementError) as refused:
        services.update_gpu(busy_l40s, **change)
    assert refused.value.rules == [Rule.GPU_BUSY]
    assert "GPU 00000000:41:00.0 holds 1 vGPU(s)" in str(refused.value)
    assert words in str(refused.value)
    saved = Gpu.objects.get(pk=busy_l40s.pk)
    assert (saved.mode, saved.size_mode) == ("vgpu", "equal")


def test_update_gpu_refuses_moving_a_busy_gpu(busy_l40s):
    """Its vGPUs' VMs run on this host: the GPU cannot leave without them."""
    host_id = busy_l40s.host_id
    with pytest.raises(PlacementError) as refused:
        services.update_gpu(busy_l40s, host=HostFactory())
    assert refused.value.rules == [Rule.GPU_BUSY]
    assert "its host can change only while it holds none" in str(refused.value)
    assert Gpu.objects.get(pk=busy_l40s.pk).host_id == host_id


def test_update_gpu_saves_other_fields_of_a_busy_gpu(busy_l40s):
    services.update_gpu(busy_l40s, uuid="GPU-replaced-0000")
    assert Gpu.objects.get(pk=busy_l40s.pk).uuid == "GPU-replaced-0000"


def test_update_gpu_checks_values_already_set_on_the_instance(busy_l40s):
    busy_l40s.size_mode = "mixed"
    with pytest.raises(PlacementError) as refused:
        services.update_gpu(busy_l40s)
    assert refused.value.rules == [Rule.GPU_BUSY]
    assert Gpu.objects.get(pk=busy_l40s.pk).size_mode == "equal"


def test_update_gpu_switches_an_empty_gpu_to_mixed_size():
    gpu = GpuFactory(gpu_model=gpu_model("NVIDIA L40S"))
    services.update_gpu(gpu, size_mode="mixed")
    assert Gpu.objects.get(pk=gpu.pk).size_mode == "mixed"
    _place(gpu, "L40S-24Q")
    _place(gpu, "L40S-8Q")  # two sizes on one GPU: only mixed-size mode allows it
    assert sorted(Vgpu.objects.filter(gpu=gpu).values_list("profile__name", flat=True)) == ["L40S-24Q", "L40S-8Q"]


def test_update_gpu_refuses_mixed_size_on_a_t4():
    gpu = GpuFactory(gpu_model=gpu_model("Tesla T4"))
    with pytest.raises(PlacementError) as refused:
        services.update_gpu(gpu, size_mode="mixed")
    assert refused.value.rules == [Rule.SIZE_MODE_UNSUPPORTED]
    assert "Tesla T4 does not support mixed-size mode" in str(refused.value)
    assert Gpu.objects.get(pk=gpu.pk).size_mode == "equal"


def test_update_gpu_refuses_creating_a_mixed_size_t4():
    host = HostFactory()
    new = Gpu(host=host, gpu_model=gpu_model("Tesla T4"), pci_bus_id="00000000:5E:00.0", size_mode="mixed")
    with pytest.raises(PlacementError) as refused:
        services.update_gpu(new)
    assert refused.value.rules == [Rule.SIZE_MODE_UNSUPPORTED]
    assert not Gpu.objects.filter(host=host).exists()


# update_host ---------------------------------------------------------------------------------

@pytest.fixture
def claimed_host():
    """A 32-thread, 256 GiB host whose VMs claim 24 vCPUs and 96 GiB."""
    host = HostFactory(name="claimed", cpu_threads=32, ram_gib=256)
    gpu_a, gpu_b = GpuFactory(host=host), GpuFactory(host=host)
    _place(gpu_a, "RTX6000-24Q", vcpus=16, ram_gib=64)
    _place(gpu_b, "RTX6000-24Q", vcpus=8, ram_gib=32)
    return host


def test_update_host_refuses_shrinking_below_what_its_vms_claim(claimed_host):
    with pytest.raises(PlacementError) as refused:
        services.update_host(claimed_host, cpu_threads=23, ram_gib=95)
    assert set(refused.value.rules) == {Rule.HOST_VCPU, Rule.HOST_RAM}
    assert "Host claimed runs VMs with 24 vCPUs; 23 vCPUs" in str(refused.value)
    assert "Host claimed runs VMs with 96 GiB RAM; 95 GiB" in str(refused.value)
    saved = Host.objects.get(pk=claimed_host.pk)
    assert (saved.cpu_threads, saved.ram_gib) == (32, 256)


def test_update_host_accepts_shrinking_to_exactly_the_claims(claimed_host):
    services.update_host(claimed_host, cpu_threads=24, ram_gib=96)
    saved = Host.objects.get(pk=claimed_host.pk)
    assert (saved.cpu_threads, saved.ram_gib) == (24, 96)


def test_update_host_overcommit_makes_room_for_fewer_threads(claimed_host):
    services.update_host(claimed_host, cpu_threads=12, vcpu_overcommit=2.0)
    assert Host.objects.get(pk=claimed_host.pk).cpu_threads == 12
    with pytest.raises(PlacementError) as refused:
        services.update_host(claimed_host, vcpu_overcommit=1.5)
    assert refused.value.rules == [Rule.HOST_VCPU]
    assert Host.objects.get(pk=claimed_host.pk).vcpu_overcommit == 2.0


def test_update_host_checks_values_already_set_on_the_instance(claimed_host):
    claimed_host.cpu_threads = 8
    with pytest.raises(PlacementError):
        services.update_host(claimed_host)
    assert Host.objects.get(pk=claimed_host.pk).cpu_threads == 32


def test_update_host_creates_a_host():
    host = services.update_host(Host(name="new-host"), cpu_threads=64, ram_gib=512)
    assert Host.objects.get(pk=host.pk).cpu_threads == 64


def test_update_host_renames_a_host_already_over_capacity(db):
    """An admin must still be able to rename (or grow) a host whose VMs claim more than it has,
    e.g. after the overcommit default was lowered; only a shrink is refused."""
    host = HostFactory(cpu_threads=16, ram_gib=64)
    gpu = GpuFactory(host=host)
    services.place_vgpu(VirtualMachineFactory(vcpus=16, ram_gib=64), gpu, profile("RTX6000-24Q"))
    Host.objects.filter(pk=host.pk).update(cpu_threads=8)  # over capacity from outside the rules
    host.refresh_from_db()

    services.update_host(host, name="renamed-host")
    assert Host.objects.get(pk=host.pk).name == "renamed-host"
    with pytest.raises(PlacementError) as refused:
        services.update_host(host, ram_gib=32)
    assert refused.value.rules == ["host_vcpu", "host_ram"]
    assert Host.objects.get(pk=host.pk).ram_gib == 64


# Rows that went away while a change was on its way ------------------------------------------

def test_editing_a_vm_deleted_since_it_was_loaded_is_a_conflict_and_does_not_bring_it_back():
    """An edit form left open on a VM another admin deleted: saving it used to re-insert the VM
    (Django saves a loaded object whose row is gone as a new one)."""
    vm = VirtualMachineFactory(name="ws-gone")
    stale = VirtualMachine.objects.get(pk=vm.pk)
    vm.delete()

    with pytest.raises(FleetConflict) as conflict:
        services.update_vm(stale, vcpus=16)

    assert str(conflict.value) == "VM ws-gone was deleted meanwhile; reload and try again."
    assert conflict.value.rules == [Rule.FLEET_CHANGED]
    assert not VirtualMachine.objects.filter(pk=vm.pk).exists()


def test_removing_a_vgpu_removed_meanwhile_is_a_conflict_naming_it():
    vgpu = services.place_vgpu(VirtualMachineFactory(name="ws-twice"), GpuFactory(), profile("RTX6000-12Q"))
    services.remove_vgpu(vgpu)

    with pytest.raises(FleetConflict, match=r"^vGPU RTX6000-12Q for ws-twice was removed meanwhile; reload"):
        services.remove_vgpu(vgpu)


def test_placing_on_a_gpu_deleted_since_it_was_loaded_is_a_conflict():
    gpu = GpuFactory(pci_bus_id="00000000:AF:00.0")
    stale = Gpu.objects.get(pk=gpu.pk)
    gpu.delete()
    vm = VirtualMachineFactory()

    with pytest.raises(FleetConflict, match="was deleted meanwhile; reload and try again"):
        services.place_vgpu(vm, stale, profile("RTX6000-12Q"))
    assert _host_of(vm) is None


def test_removing_several_vgpus_removes_all_or_none():
    """The admin's "Delete selected" on vGPUs of two VMs: one of them already went, so none is removed."""
    first, second = _place(GpuFactory(), "RTX6000-12Q"), _place(GpuFactory(), "RTX6000-12Q")
    services.remove_vgpu(second)

    with pytest.raises(FleetConflict):
        services.remove_vgpus([first, second])
    assert Vgpu.objects.filter(pk=first.pk).exists()

    services.remove_vgpus([first])
    assert _host_of(first.vm) is None

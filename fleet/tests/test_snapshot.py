"""The fleet snapshot that every sizing calculation starts from."""

import pytest

from fleet import services
from fleet.queries import fleet_snapshot
from fleet.tests.factories import GpuFactory, HostFactory, VirtualMachineFactory, profile


@pytest.mark.django_db
def test_snapshot_mirrors_the_inventory_in_a_fixed_number_of_queries(django_assert_num_queries):
    host = HostFactory(cpu_threads=72, ram_gib=384)
    gpu_a, gpu_b = GpuFactory(host=host), GpuFactory(host=host)
    modeler, animator = VirtualMachineFactory(vcpus=8, ram_gib=32), VirtualMachineFactory(vcpus=12, ram_gib=64)
    services.place_vgpu(modeler, gpu_a, profile("RTX6000-12Q"))
    services.place_vgpu(animator, gpu_b, profile("RTX6000-24Q"))

    with django_assert_num_queries(7):
        snapshot = fleet_snapshot()

    assert snapshot.gpus_in_use() == 2
    assert snapshot.hosts[host.pk].allocated_vcpus == 20
    assert snapshot.hosts[host.pk].allocated_ram_gib == 96
    assert [v.profile.name for v in snapshot.gpus[gpu_a.pk].vgpus] == ["RTX6000-12Q"]
    assert snapshot.vms[animator.pk].host_id == host.pk
    assert snapshot.vm_profile(animator.pk).name == "RTX6000-24Q"
    assert [p.name for p in snapshot.profiles_for("Quadro RTX 6000", "Q")][:2] == ["RTX6000-1Q", "RTX6000-2Q"]


@pytest.mark.django_db
def test_fingerprint_changes_when_a_placement_changes():
    gpu = GpuFactory()
    vm = VirtualMachineFactory()
    before = fleet_snapshot().fingerprint()
    assert fleet_snapshot().fingerprint() == before
    services.place_vgpu(vm, gpu, profile("RTX6000-12Q"))
    assert fleet_snapshot().fingerprint() != before

"""Forms of the fleet inventory: each accepts what the placement rules allow, refuses what they
do not with the rule's own sentence, and writes only through the services."""


import pytest

from fleet import placement, services
from fleet.forms import GpuForm, HostForm, VgpuPlacementForm, VirtualMachineForm
from fleet.models import Gpu, Host, Vgpu, VirtualMachine
from fleet.tests.factories import BUS, GpuFactory, HostFactory, VirtualMachineFactory, gpu_model, profile

pytestmark = pytest.mark.django_db


def placement_form(vm, gpu, profile_name):
    return VgpuPlacementForm(data={"vm": vm.pk, "gpu": gpu.pk, "profile": profile(profile_name).pk})


# --- VgpuPlacementForm -------------------------------------------------------------------------

def test_placement_form_places_a_fitting_vgpu_and_moves_the_vm(rtx):
    form = placement_form(rtx.vm, rtx.empty, "RTX6000-12Q")

    assert form.is_valid(), form.errors
    vgpu = form.save()

    assert vgpu.pk is not None
    assert vgpu.placement_id == 0
    assert Vgpu.objects.get(pk=vgpu.pk).gpu == rtx.empty
    assert VirtualMachine.objects.get(pk=rtx.vm.pk).host == rtx.host


def test_placement_form_refuses_a_vgpu_too_big_with_the_rules_numbers(rtx):
    form = placement_form(rtx.vm, rtx.gpu, "RTX6000-12Q")

    assert not form.is_valid()
    errors = form.non_field_errors()
    assert f"RTX6000-12Q needs 12288 MiB; GPU {BUS} has 8192 MiB free of 24576 MiB" in errors
    assert f"GPU {BUS} is in equal-size mode and holds 8192 MiB vGPUs; RTX6000-12Q has 12288 MiB" in errors
    assert not Vgpu.objects.filter(vm=rtx.vm).exists()


def test_placement_form_refuses_a_profile_of_another_model_even_though_it_is_listed(rtx):
    GpuFactory(host=HostFactory(name="rtx8000-host"), gpu_model=gpu_model("Quadro RTX 8000"))
    form = placement_form(rtx.vm, rtx.empty, "RTX8000-24Q")

    assert "RTX8000-24Q" in [p.name for p in form.fields["profile"].queryset]
    assert not form.is_valid()
    assert form.non_field_errors() == [
        "RTX8000-24Q is a Quadro RTX 8000 profile; GPU 00000000:5E:00.0 is a Quadro RTX 6000",
    ]


def test_placement_form_lists_profiles_of_the_preset_gpus_model_only(rtx):
    GpuFactory(host=HostFactory(name="l40s-host"), gpu_model=gpu_model("NVIDIA L40S"))

    everything = {p.gpu_model.name for p in VgpuPlacementForm().fields["profile"].queryset}
    preset = {p.gpu_model.name for p in VgpuPlacementForm(initial={"gpu": rtx.empty.pk}).fields["profile"].queryset}

    assert everything == {"Quadro RTX 6000", "NVIDIA L40S"}  # models the fleet has, not the whole catalog
    assert preset == {"Quadro RTX 6000"}


def test_placement_form_refuses_a_passthrough_gpu(rtx):
    rtx.empty.mode = "passthrough"
    rtx.empty.save()
    form = placement_form(rtx.vm, rtx.empty, "RTX6000-24Q")

    assert not form.is_valid()
    assert form.non_field_errors() == ["GPU 00000000:5E:00.0 is in passthrough mode and hosts no vGPU"]


def test_placement_form_shows_a_refusal_met_at_save_time_instead_of_failing(rtx):
    form = placement_form(rtx.vm, rtx.empty, "RTX6000-24Q")
    assert form.is_valid()
    services.place_vgpu(VirtualMachineFactory(name="ws-faster"), rtx.empty, profile("RTX6000-24Q"))

    assert form.save() is None

    assert not form.is_valid()
    assert "RTX6000-24Q allows 1 per GPU; GPU 00000000:5E:00.0 already has 1" in form.non_field_errors()
    assert not Vgpu.objects.filter(vm=rtx.vm).exists()


def test_placement_form_shows_a_fleet_conflict_found_under_the_locks(rtx, monkeypatch):
    """The unlocked check passed, the locked one did not: another request took the slot in between."""
    form = placement_form(rtx.vm, rtx.empty, "RTX6000-24Q")
    assert form.is_valid()
    services.place_vgpu(VirtualMachineFactory(name="ws-faster"), rtx.empty, profile("RTX6000-24Q"))
    monkeypatch.setattr(services, "check_vgpu", lambda *args: placement.Decision())

    assert form.save() is None

    assert "RTX6000-24Q allows 1 per GPU; GPU 00000000:5E:00.0 already has 1" in form.non_field_errors()
    assert not Vgpu.objects.filter(vm=rtx.vm).exists()
    assert VirtualMachine.objects.get(pk=rtx.vm.pk).host is None


# --- GpuForm -----------------------------------------------------------------------------------

def gpu_data(gpu, **changes):
    data = {"host": gpu.host_id, "gpu_model": gpu.gpu_model_id, "pci_bus_id": gpu.pci_bus_id, "uuid": gpu.uuid,
            "mode": gpu.mode, "size_mode": gpu.size_mode}
    return {**data, **changes}


def test_gpu_form_switches_an_empty_l40s_to_mixed_size():
    gpu = GpuFactory(gpu_model=gpu_model("NVIDIA L40S"))
    form = GpuForm(data=gpu_data(gpu, size_mode="mixed"), instance=gpu)

    assert form.is_valid(), form.errors
    form.save()

    assert Gpu.objects.get(pk=gpu.pk).size_mode == "mixed"


def test_gpu_form_refuses_to_switch_a_gpu_holding_vgpus(rtx):
    other_host = HostFactory(name="other-host")
    form = GpuForm(data=gpu_data(rtx.gpu, mode="passthrough", host=other_host.pk), instance=rtx.gpu)

    assert not form.is_valid()
    assert form.non_field_errors() == [
        f"GPU {BUS} holds 2 vGPU(s); its mode and host can change only while it holds none",
    ]
    saved = Gpu.objects.get(pk=rtx.gpu.pk)
    assert (saved.mode, saved.host) == ("vgpu", rtx.host)


def test_gpu_form_refuses_mixed_size_on_a_quadro_rtx_6000():
    host = HostFactory()
    form = GpuForm(data={"host": host.pk, "gpu_model": gpu_model("Quadro RTX 6000").pk, "pci_bus_id": BUS,
                         "uuid": "", "mode": "vgpu", "size_mode": "mixed"})

    assert not form.is_valid()
    assert form.non_field_errors() == ["Quadro RTX 6000 does not support mixed-size mode"]
    assert not Gpu.objects.filter(host=host).exists()


def test_gpu_form_adds_a_gpu_through_the_service():
    host = HostFactory()
    form = GpuForm(data={"host": host.pk, "gpu_model": gpu_model("NVIDIA L40S").pk, "pci_bus_id": BUS,
                         "uuid": "GPU-new", "mode": "vgpu", "size_mode": "mixed"})

    assert form.is_valid(), form.errors
    gpu = form.save()

    assert Gpu.objects.get(pk=gpu.pk).size_mode == "mixed"


def test_gpu_form_shows_a_refusal_met_at_save_time():
    gpu = GpuFactory(gpu_model=gpu_model("NVIDIA L40S"))
    form = GpuForm(data=gpu_data(gpu, size_mode="mixed"), instance=gpu)
    assert form.is_valid()
    services.place_vgpu(VirtualMachineFactory(), gpu, profile("L40S-24Q"))

    assert form.save() is None

    assert form.non_field_errors() == [
        f"GPU {gpu.pci_bus_id} holds 1 vGPU(s); its size mode can change only while it holds none",
    ]
    assert Gpu.objects.get(pk=gpu.pk).size_mode == "equal"


# --- HostForm ----------------------------------------------------------------------------------

def host_data(host, **changes):
    data = {"name": host.name, "hypervisor": host.hypervisor, "cpu_model": host.cpu_model,
            "cpu_threads": host.cpu_threads, "ram_gib": host.ram_gib, "vcpu_overcommit": host.vcpu_overcommit,
            "ram_overcommit": host.ram_overcommit}
    return {**data, **changes}


def test_host_form_refuses_to_shrink_below_what_its_vms_claim(rtx):
    form = HostForm(data=host_data(rtx.host, cpu_threads=12, ram_gib=48), instance=rtx.host)

    assert not form.is_valid()
    assert form.non_field_errors() == [
        "Host rtx-host runs VMs with 16 vCPUs; 12 vCPUs (12 threads x 1 overcommit) would not hold them",
        "Host rtx-host runs VMs with 64 GiB RAM; 48 GiB (48 GiB x 1 overcommit) would not hold them",
    ]
    assert Host.objects.get(pk=rtx.host.pk).cpu_threads == 72


def test_host_form_shrinks_as_far_as_its_vms_allow(rtx):
    form = HostForm(data=host_data(rtx.host, cpu_threads=16, ram_gib=64), instance=rtx.host)

    assert form.is_valid(), form.errors
    form.save()

    saved = Host.objects.get(pk=rtx.host.pk)
    assert (saved.cpu_threads, saved.ram_gib) == (16, 64)


def test_host_form_adds_a_host():
    form = HostForm(data={"name": "new-host", "hypervisor": "esxi", "cpu_model": "", "cpu_threads": 64,
                          "ram_gib": 512, "vcpu_overcommit": 1.5, "ram_overcommit": 1})

    assert form.is_valid(), form.errors
    form.save()

    assert Host.objects.get(name="new-host").vcpu_overcommit == 1.5


# --- VirtualMachineForm ------------------------------------------------------------------------

def vm_data(vm, **changes):
    data = {"name": vm.name, "uuid": str(vm.uuid), "artist": vm.artist_id or "", "vcpus": vm.vcpus,
            "ram_gib": vm.ram_gib}
    return {**data, **changes}


def test_vm_form_refuses_more_vcpus_and_ram_than_its_host_has_free(rtx):
    vm = VirtualMachine.objects.get(name="ws-8q-a")
    form = VirtualMachineForm(data=vm_data(vm, vcpus=70, ram_gib=800), instance=vm)

    assert not form.is_valid()
    assert form.non_field_errors() == [
        "VM ws-8q-a needs 70 vCPUs; host rtx-host has 64 of 72 vCPUs free (72 threads x 1 overcommit)",
        "VM ws-8q-a needs 800 GiB RAM; host rtx-host has 736 of 768 GiB free (768 GiB x 1 overcommit)",
    ]
    assert VirtualMachine.objects.get(pk=vm.pk).vcpus == 8


def test_vm_form_resizes_within_the_hosts_capacity(rtx):
    vm = VirtualMachine.objects.get(name="ws-8q-a")
    form = VirtualMachineForm(data=vm_data(vm, vcpus=64, ram_gib=128), instance=vm)

    assert form.is_valid(), form.errors
    form.save()

    saved = VirtualMachine.objects.get(pk=vm.pk)
    assert (saved.vcpus, saved.ram_gib, saved.host) == (64, 128, rtx.host)


def test_vm_form_leaves_a_vm_without_host_unchecked(rtx):
    form = VirtualMachineForm(data=vm_data(rtx.vm, vcpus=200), instance=rtx.vm)

    assert form.is_valid(), form.errors
    form.save()

    assert VirtualMachine.objects.get(pk=rtx.vm.pk).vcpus == 200

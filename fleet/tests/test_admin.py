"""The admin site: it places, refuses and removes vGPUs by the same rules as the API, keeps
vGPUs read-only once placed, and its changelists do not query once per row."""


import pytest
from django.contrib.auth.models import Permission
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.urls import reverse

from fleet import placement, services
from fleet.models import Gpu, GpuModel, Host, Vgpu, VgpuProfile, VirtualMachine
from fleet.tests.factories import (
    BUS,
    ArtistFactory,
    GpuFactory,
    HostFactory,
    UserFactory,
    VirtualMachineFactory,
    gpu_model,
    profile,
)

pytestmark = pytest.mark.django_db

MODELS = ["gpumodel", "vgpuprofile", "host", "gpu", "artist", "virtualmachine", "vgpu"]


@pytest.fixture
def admin_client(client, admin_user):
    client.force_login(admin_user)
    return client


def add_vgpu(client, vm, gpu, profile_name):
    return client.post(reverse("admin:fleet_vgpu_add"), {
        "vm": vm.pk, "gpu": gpu.pk, "profile": profile(profile_name).pk, "_save": "Save",
    })


def management(prefix, count):
    """The management form of an inline formset (read-only inlines post it too)."""
    return {f"{prefix}-TOTAL_FORMS": count, f"{prefix}-INITIAL_FORMS": count,
            f"{prefix}-MIN_NUM_FORMS": 0, f"{prefix}-MAX_NUM_FORMS": 1000}


# --- placing a vGPU ----------------------------------------------------------------------------

def test_adding_a_vgpu_that_does_not_fit_shows_the_rule_and_writes_nothing(admin_client, rtx):
    response = add_vgpu(admin_client, rtx.vm, rtx.gpu, "RTX6000-12Q")

    assert response.status_code == 200
    assert response.context["adminform"].form.non_field_errors() == [
        f"RTX6000-12Q needs 12288 MiB; GPU {BUS} has 8192 MiB free of 24576 MiB",
        f"GPU {BUS} is in equal-size mode and holds 8192 MiB vGPUs; RTX6000-12Q has 12288 MiB",
    ]
    assert f"RTX6000-12Q needs 12288 MiB; GPU {BUS} has 8192 MiB free of 24576 MiB" in response.text
    assert not Vgpu.objects.filter(vm=rtx.vm).exists()
    assert VirtualMachine.objects.get(pk=rtx.vm.pk).host is None


def test_adding_a_vgpu_that_fits_places_it_and_moves_the_vm_onto_the_host(admin_client, rtx):
    response = add_vgpu(admin_client, rtx.vm, rtx.empty, "RTX6000-12Q")

    assert response.status_code == 302
    vgpu = Vgpu.objects.get(vm=rtx.vm)
    assert (vgpu.gpu, vgpu.profile.name, vgpu.placement_id) == (rtx.empty, "RTX6000-12Q", 0)
    assert VirtualMachine.objects.get(pk=rtx.vm.pk).host == rtx.host
    assert "was added successfully" in admin_client.get(response.url).text


def test_adding_a_second_vgpu_takes_the_next_placement_id(admin_client, rtx):
    add_vgpu(admin_client, rtx.vm, rtx.empty, "RTX6000-12Q")
    add_vgpu(admin_client, VirtualMachineFactory(name="ws-other"), rtx.empty, "RTX6000-12Q")

    assert list(Vgpu.objects.filter(gpu=rtx.empty).values_list("vm__name", "placement_id")) == [
        ("ws-new", 0), ("ws-other", 1),
    ]


def test_a_fleet_conflict_at_save_time_is_shown_on_the_form_not_a_500(admin_client, rtx, monkeypatch):
    """Validation saw a free GPU; under the locks it was full (another request won the slot)."""
    services.place_vgpu(VirtualMachineFactory(name="ws-faster"), rtx.empty, profile("RTX6000-24Q"))
    monkeypatch.setattr(services, "check_vgpu", lambda *args: placement.Decision())

    response = add_vgpu(admin_client, rtx.vm, rtx.empty, "RTX6000-24Q")

    assert response.status_code == 200
    assert "RTX6000-24Q allows 1 per GPU; GPU 00000000:5E:00.0 already has 1" in response.text
    assert not Vgpu.objects.filter(vm=rtx.vm).exists()
    assert VirtualMachine.objects.get(pk=rtx.vm.pk).host is None


def test_the_gpu_page_links_to_placing_a_vgpu_there_with_its_models_profiles(admin_client, rtx):
    GpuFactory(host=HostFactory(name="l40s-host"), gpu_model=gpu_model("NVIDIA L40S"))

    response = admin_client.get(reverse("admin:fleet_vgpu_add"), {"gpu": rtx.empty.pk})

    profiles = {p.gpu_model.name for p in response.context["adminform"].form.fields["profile"].queryset}
    assert profiles == {"Quadro RTX 6000"}
    gpu_page = admin_client.get(reverse("admin:fleet_gpu_change", args=[rtx.empty.pk]))
    assert f'{reverse("admin:fleet_vgpu_add")}?gpu={rtx.empty.pk}' in gpu_page.text


def test_a_placed_vgpu_cannot_be_edited(admin_client, rtx):
    vgpu = Vgpu.objects.filter(gpu=rtx.gpu).first()
    url = reverse("admin:fleet_vgpu_change", args=[vgpu.pk])

    page = admin_client.get(url)
    response = admin_client.post(url, {"vm": rtx.vm.pk, "gpu": rtx.empty.pk, "profile": vgpu.profile_id})

    assert page.status_code == 200
    assert "View vGPU" in page.text
    assert 'name="_save"' not in page.text
    assert response.status_code == 403
    assert Vgpu.objects.get(pk=vgpu.pk).gpu == rtx.gpu


# --- removing a vGPU ---------------------------------------------------------------------------

def test_deleting_the_last_vgpu_of_a_vm_frees_the_slot_and_the_host(admin_client, rtx):
    vm = VirtualMachine.objects.get(name="ws-8q-a")
    vgpu = Vgpu.objects.get(vm=vm)

    response = admin_client.post(reverse("admin:fleet_vgpu_delete", args=[vgpu.pk]), {"post": "yes"})

    assert response.status_code == 302
    assert not Vgpu.objects.filter(pk=vgpu.pk).exists()
    assert VirtualMachine.objects.get(pk=vm.pk).host is None
    assert services.check_vgpu(rtx.vm, rtx.gpu, profile("RTX6000-8Q")).ok  # the slot is free again


def test_deleting_one_of_two_vgpus_keeps_the_vm_on_its_host(admin_client, rtx):
    third = GpuFactory(host=rtx.host, pci_bus_id="00000000:86:00.0")
    first = services.place_vgpu(rtx.vm, rtx.empty, profile("RTX6000-24Q"))
    services.place_vgpu(rtx.vm, third, profile("RTX6000-24Q"))

    admin_client.post(reverse("admin:fleet_vgpu_delete", args=[first.pk]), {"post": "yes"})

    assert list(Vgpu.objects.filter(vm=rtx.vm).values_list("gpu", flat=True)) == [third.pk]
    assert VirtualMachine.objects.get(pk=rtx.vm.pk).host == rtx.host


def test_deleting_vgpus_in_bulk_releases_their_vms(admin_client, rtx):
    ids = list(Vgpu.objects.filter(gpu=rtx.gpu).values_list("pk", flat=True))

    response = admin_client.post(reverse("admin:fleet_vgpu_changelist"), {
        "action": "delete_selected", "_selected_action": ids, "post": "yes",
    })

    assert response.status_code == 302
    assert not Vgpu.objects.filter(gpu=rtx.gpu).exists()
    assert list(VirtualMachine.objects.filter(name__startswith="ws-8q").values_list("host", flat=True)) == [None, None]


# --- GPUs, hosts and VMs save through the services ---------------------------------------------

def test_changing_the_mode_of_a_gpu_with_vgpus_is_refused(admin_client, rtx):
    data = {"host": rtx.host.pk, "gpu_model": rtx.gpu.gpu_model_id, "pci_bus_id": BUS, "uuid": rtx.gpu.uuid,
            "mode": "passthrough", "size_mode": "equal", **management("vgpus", 2)}

    response = admin_client.post(reverse("admin:fleet_gpu_change", args=[rtx.gpu.pk]), data)

    assert response.status_code == 200
    assert f"GPU {BUS} holds 2 vGPU(s); its mode can change only while it holds none" in response.text
    assert Gpu.objects.get(pk=rtx.gpu.pk).mode == "vgpu"


def test_an_empty_gpu_changes_mode(admin_client, rtx):
    data = {"host": rtx.host.pk, "gpu_model": rtx.empty.gpu_model_id, "pci_bus_id": rtx.empty.pci_bus_id,
            "uuid": rtx.empty.uuid, "mode": "passthrough", "size_mode": "equal", **management("vgpus", 0)}

    response = admin_client.post(reverse("admin:fleet_gpu_change", args=[rtx.empty.pk]), data)

    assert response.status_code == 302
    assert Gpu.objects.get(pk=rtx.empty.pk).mode == "passthrough"


def test_shrinking_a_host_below_its_vms_is_refused(admin_client, rtx):
    data = {"name": "rtx-host", "hypervisor": "kvm", "cpu_model": "", "cpu_threads": 8, "ram_gib": 768,
            "vcpu_overcommit": 1, "ram_overcommit": 1, **management("gpus", 2)}

    response = admin_client.post(reverse("admin:fleet_host_change", args=[rtx.host.pk]), data)

    assert response.status_code == 200
    assert "Host rtx-host runs VMs with 16 vCPUs; 8 vCPUs (8 threads x 1 overcommit) would not hold them" \
        in response.text
    assert Host.objects.get(pk=rtx.host.pk).cpu_threads == 72


def test_growing_a_vm_past_its_host_is_refused(admin_client, rtx):
    vm = VirtualMachine.objects.get(name="ws-8q-a")
    data = {"name": vm.name, "uuid": str(vm.uuid), "artist": vm.artist_id, "vcpus": 72, "ram_gib": 32,
            **management("vgpus", 1)}

    response = admin_client.post(reverse("admin:fleet_virtualmachine_change", args=[vm.pk]), data)

    assert response.status_code == 200
    assert "VM ws-8q-a needs 72 vCPUs; host rtx-host has 64 of 72 vCPUs free (72 threads x 1 overcommit)" \
        in response.text
    assert VirtualMachine.objects.get(pk=vm.pk).vcpus == 8


def test_a_vm_resize_that_fits_is_saved(admin_client, rtx):
    vm = VirtualMachine.objects.get(name="ws-8q-a")
    data = {"name": vm.name, "uuid": str(vm.uuid), "artist": vm.artist_id, "vcpus": 16, "ram_gib": 64,
            **management("vgpus", 1)}

    response = admin_client.post(reverse("admin:fleet_virtualmachine_change", args=[vm.pk]), data)

    assert response.status_code == 302
    saved = VirtualMachine.objects.get(pk=vm.pk)
    assert (saved.vcpus, saved.ram_gib, saved.host) == (16, 64, rtx.host)


# --- pages -------------------------------------------------------------------------------------

@pytest.mark.parametrize("model", MODELS)
def test_every_changelist_and_add_page_renders(admin_client, rtx, model):
    changelist = admin_client.get(reverse(f"admin:fleet_{model}_changelist"))
    add = admin_client.get(reverse(f"admin:fleet_{model}_add"))

    assert changelist.status_code == 200
    assert add.status_code == 200
    assert changelist.context["cl"].result_count >= 1


def test_changelist_columns_show_usage(admin_client, rtx):
    services.place_vgpu(rtx.vm, rtx.empty, profile("RTX6000-24Q"))
    third = GpuFactory(host=rtx.host, pci_bus_id="00000000:86:00.0")
    services.place_vgpu(rtx.vm, third, profile("RTX6000-24Q"))

    gpus = admin_client.get(reverse("admin:fleet_gpu_changelist")).text
    hosts = admin_client.get(reverse("admin:fleet_host_changelist")).text
    vms = admin_client.get(reverse("admin:fleet_virtualmachine_changelist")).text

    assert "16384 / 24576" in gpus
    assert "24576 / 24576" in gpus
    assert "24 / 72" in hosts  # vCPUs: three 8-vCPU VMs on 72 threads
    assert "RTX6000-24Q, RTX6000-24Q" in vms


def test_gpu_and_vm_pages_list_their_vgpus_read_only(admin_client, rtx):
    vm = VirtualMachine.objects.get(name="ws-8q-a")

    gpu_page = admin_client.get(reverse("admin:fleet_gpu_change", args=[rtx.gpu.pk]))
    vm_page = admin_client.get(reverse("admin:fleet_virtualmachine_change", args=[vm.pk]))

    assert "ws-8q-a" in gpu_page.text
    assert "ws-8q-b" in gpu_page.text
    assert "RTX6000-8Q" in gpu_page.text
    assert "vgpus-0-vm" not in gpu_page.text  # no input: the inline is read-only
    assert "RTX6000-8Q" in vm_page.text
    assert BUS in vm_page.text


def make_fleet(size):
    """`size` hosts, each with two GPUs and three VMs holding vGPUs, their artists with accounts."""
    for _ in range(size):
        host = HostFactory()
        gpus = [GpuFactory(host=host), GpuFactory(host=host, gpu_model=gpu_model("NVIDIA L40S"))]
        for gpu, name in ((gpus[0], "RTX6000-12Q"), (gpus[0], "RTX6000-12Q"), (gpus[1], "L40S-24Q")):
            services.place_vgpu(VirtualMachineFactory(artist=ArtistFactory()), gpu, profile(name))


def changelist_queries(client, model, query=None):
    with CaptureQueriesContext(connection) as queries:
        response = client.get(reverse(f"admin:fleet_{model}_changelist"), query or {})
    assert response.status_code == 200
    return len(queries), response.context["cl"].result_count


@pytest.mark.parametrize("model", ["host", "gpu", "artist", "virtualmachine", "vgpu"])
def test_changelist_queries_do_not_grow_with_rows(admin_client, model):
    make_fleet(1)
    few, few_rows = changelist_queries(admin_client, model)
    make_fleet(4)
    many, many_rows = changelist_queries(admin_client, model)

    assert many_rows >= 4 * few_rows > 0
    assert many == few


@pytest.mark.parametrize(("model", "filter_by_t4"), [
    ("gpumodel", lambda t4: {"multi_vgpu_full_only__exact": 1, "gpus_per_board__exact": 1, "q": "Tesla"}),
    ("vgpuprofile", lambda t4: {"gpu_model__id__exact": t4.pk}),
])
def test_catalog_changelist_queries_do_not_grow_with_rows(admin_client, model, filter_by_t4):
    make_fleet(2)
    few, few_rows = changelist_queries(admin_client, model, filter_by_t4(gpu_model("Tesla T4")))
    many, many_rows = changelist_queries(admin_client, model)

    assert many_rows > few_rows > 0
    assert many == few


# --- the catalog -------------------------------------------------------------------------------

def test_the_catalog_says_it_ships_from_nvidias_tables(admin_client):
    changelist = admin_client.get(reverse("admin:fleet_vgpuprofile_changelist"))
    change = admin_client.get(reverse("admin:fleet_gpumodel_change", args=[gpu_model().pk]))

    for page in (changelist, change):
        assert "This catalog ships with the product from NVIDIA's vGPU tables" in page.text


def test_only_superusers_edit_the_catalog(client):
    staff = UserFactory(username="ops", is_staff=True)
    staff.user_permissions.add(*Permission.objects.filter(
        codename__in=["view_gpumodel", "change_gpumodel", "add_gpumodel"],
    ))
    client.force_login(staff)

    page = client.get(reverse("admin:fleet_gpumodel_change", args=[gpu_model().pk]))
    add = client.get(reverse("admin:fleet_gpumodel_add"))

    assert page.status_code == 200
    assert 'name="_save"' not in page.text
    assert add.status_code == 403


def test_a_profile_in_use_keeps_its_figures(admin_client, rtx):
    q8 = VgpuProfile.objects.get(name="RTX6000-8Q")
    data = {"name": q8.name, "gpu_model": q8.gpu_model_id, "series": "Q", "fb_mib": 4096,
            "max_per_gpu": q8.max_per_gpu, "max_per_gpu_mixed": "", "max_per_vm": q8.max_per_vm}

    response = admin_client.post(reverse("admin:fleet_vgpuprofile_change", args=[q8.pk]), data)

    assert response.status_code == 200
    assert "RTX6000-8Q: fb_mib can change only while no vGPU of this profile exists (2 do)" in response.text
    assert VgpuProfile.objects.get(pk=q8.pk).fb_mib == 8192


def test_a_model_without_gpus_can_be_edited_by_a_superuser(admin_client):
    t4 = GpuModel.objects.get(name="Tesla T4")
    data = {"name": t4.name, "code": t4.code, "fb_mib": 15360, "gpus_per_board": 1, "multi_vgpu_full_only": "on"}

    response = admin_client.post(reverse("admin:fleet_gpumodel_change", args=[t4.pk]), data)

    assert response.status_code == 302
    assert GpuModel.objects.get(pk=t4.pk).fb_mib == 15360

"""Writes through the API that the placement rules govern, and how refusals read.

A rule refusal is a 400 naming the rule and the numbers; a fleet that changed under the request
is a 409; deleting something still in use is a 409; invalid input is a 400 with field messages.
None of them writes anything.
"""

import pytest

from fleet import placement, services
from fleet.models import Artist, Gpu, Host, Vgpu, VirtualMachine
from fleet.tests.factories import GpuFactory, HostFactory, VirtualMachineFactory, gpu_model, profile

MODEL = "<the GPU's model id>"  # filled in by the test: ids differ between databases


@pytest.fixture
def gpu(db):
    """An empty Quadro RTX 6000 (24576 MiB) in a 72-thread, 768 GiB host."""
    return GpuFactory(host=HostFactory(name="render-01"), pci_bus_id="00000000:3B:00.0")


def place(client, vm, gpu, profile_name):
    return client.post(
        "/api/v1/vgpus/", {"vm": vm.pk, "gpu": gpu.pk, "profile": profile(profile_name).pk}, format="json",
    )


def test_placing_a_vgpu_returns_its_slot_and_moves_the_vm_to_the_host(admin_api, gpu):
    vm = VirtualMachineFactory(name="ws-model-01")

    response = place(admin_api, vm, gpu, "RTX6000-12Q")

    assert response.status_code == 201, response.content
    body = response.json()
    assert body["placement_id"] == 0
    assert (body["vm"], body["gpu"], body["profile"]) == (vm.pk, gpu.pk, profile("RTX6000-12Q").pk)
    shown = admin_api.get(f"/api/v1/vms/{vm.pk}/").json()
    assert shown["host"] == gpu.host_id
    assert shown["vgpus"] == [{"id": body["id"], "gpu": gpu.pk, "profile": profile("RTX6000-12Q").pk}]
    second = place(admin_api, VirtualMachineFactory(), gpu, "RTX6000-12Q")
    assert second.json()["placement_id"] == 1
    assert admin_api.get(f"/api/v1/gpus/{gpu.pk}/").json()["used_fb_mib"] == 24576


def test_the_device_the_agent_reports_is_shown_and_never_written_through_the_api(admin_api, gpu):
    vgpu = services.place_vgpu(VirtualMachineFactory(name="ws-model-01"), gpu, profile("RTX6000-12Q"))
    Vgpu.objects.filter(pk=vgpu.pk).update(reported_device_id="5c3b2a19-8f7e-4d6c-b5a4-93827160f5e4")

    placed = place(admin_api, VirtualMachineFactory(), gpu, "RTX6000-12Q").json()
    shown = admin_api.get(f"/api/v1/vgpus/{vgpu.pk}/").json()

    assert shown["reported_device_id"] == "5c3b2a19-8f7e-4d6c-b5a4-93827160f5e4"
    assert (placed["reported_device_id"], placed["reported_device_at"]) == ("", None)
    admin_api.patch(f"/api/v1/vgpus/{vgpu.pk}/", {"reported_device_id": "forged"}, format="json")
    assert Vgpu.objects.get(pk=vgpu.pk).reported_device_id == "5c3b2a19-8f7e-4d6c-b5a4-93827160f5e4"


def test_refusal_names_the_rule_and_the_numbers_and_writes_nothing(admin_api, gpu):
    for _ in range(2):
        services.place_vgpu(VirtualMachineFactory(), gpu, profile("RTX6000-8Q"))
    vm = VirtualMachineFactory(name="ws-light-01")

    response = place(admin_api, vm, gpu, "RTX6000-12Q")

    assert response.status_code == 400
    body = response.json()
    message = "RTX6000-12Q needs 12288 MiB; GPU 00000000:3B:00.0 has 8192 MiB free of 24576 MiB"
    assert body["detail"].startswith("On host render-01: ")
    assert message in body["detail"]
    assert {"rule": "frame_buffer", "message": message, "host": "render-01"} in body["violations"]
    assert "equal_size" in {v["rule"] for v in body["violations"]}
    assert Vgpu.objects.filter(vm=vm).count() == 0
    assert Vgpu.objects.filter(gpu=gpu).count() == 2
    vm.refresh_from_db()
    assert vm.host_id is None


def test_host_capacity_refusal_names_vcpus(admin_api, gpu):
    vm = VirtualMachineFactory(name="ws-sim-01", vcpus=96)

    response = place(admin_api, vm, gpu, "RTX6000-24Q")

    assert response.status_code == 400
    assert response.json()["violations"] == [{
        "rule": "host_vcpu",
        "message": "VM ws-sim-01 needs 96 vCPUs; host render-01 has 72 of 72 vCPUs free "
                   "(72 threads x 1 overcommit)",
        "host": "render-01",
    }]
    assert not Vgpu.objects.exists()


def test_profile_of_another_board_is_refused(admin_api, gpu):
    response = place(admin_api, VirtualMachineFactory(), gpu, "T4-4Q")
    assert response.status_code == 400
    assert [v["rule"] for v in response.json()["violations"]] == ["profile_model"]


def test_fleet_changed_under_the_request_is_409(admin_api, gpu, monkeypatch):
    """The pre-check saw room (patched to pass here, as if it ran before another request took the
    GPU); the check under the locks finds the GPU full and answers 409."""
    services.place_vgpu(VirtualMachineFactory(), gpu, profile("RTX6000-24Q"))
    monkeypatch.setattr(services, "check_vgpu", lambda vm, gpu, profile: placement.Decision())
    vm = VirtualMachineFactory()

    response = place(admin_api, vm, gpu, "RTX6000-24Q")

    assert response.status_code == 409
    body = response.json()
    assert "frame_buffer" in {v["rule"] for v in body["violations"]}
    assert "has 0 MiB free of 24576 MiB" in body["detail"]
    assert Vgpu.objects.filter(gpu=gpu).count() == 1
    vm.refresh_from_db()
    assert vm.host_id is None


@pytest.mark.parametrize(
    ("payload", "field"),
    [
        ({"profile": 999_999}, "profile"),
        ({"gpu": 999_999}, "gpu"),
        ({"vm": "ws-0001"}, "vm"),
        ({"profile": None}, "profile"),
    ],
)
def test_invalid_vgpu_input_is_400_with_field_message(admin_api, gpu, payload, field):
    body = {"vm": VirtualMachineFactory().pk, "gpu": gpu.pk, "profile": profile("RTX6000-12Q").pk, **payload}
    response = admin_api.post("/api/v1/vgpus/", body, format="json")
    assert response.status_code == 400
    assert field in response.json()
    assert not Vgpu.objects.exists()


def test_removing_the_last_vgpu_frees_the_host(admin_api, gpu):
    vm = VirtualMachineFactory()
    first = services.place_vgpu(vm, gpu, profile("RTX6000-24Q"))

    response = admin_api.delete(f"/api/v1/vgpus/{first.pk}/")

    assert response.status_code == 204
    assert admin_api.get(f"/api/v1/vms/{vm.pk}/").json()["host"] is None
    assert admin_api.get(f"/api/v1/hosts/{gpu.host_id}/").json()["allocated_vcpus"] == 0


def test_vm_resize_beyond_host_capacity_is_refused(admin_api, gpu):
    services.place_vgpu(VirtualMachineFactory(vcpus=64), gpu, profile("RTX6000-12Q"))
    vm = VirtualMachineFactory(name="ws-anim-01", vcpus=8)
    services.place_vgpu(vm, gpu, profile("RTX6000-12Q"))

    refused = admin_api.patch(f"/api/v1/vms/{vm.pk}/", {"vcpus": 16}, format="json")
    accepted = admin_api.patch(f"/api/v1/vms/{vm.pk}/", {"ram_gib": 64, "name": "ws-anim-02"}, format="json")

    assert refused.status_code == 400
    assert refused.json()["violations"][0]["rule"] == "host_vcpu"
    assert "needs 16 vCPUs; host render-01 has 8 of 72 vCPUs free" in refused.json()["detail"]
    assert accepted.status_code == 200
    assert accepted.json()["vcpus"] == 8
    assert accepted.json()["ram_gib"] == 64
    assert accepted.json()["host"] == gpu.host_id
    vm.refresh_from_db()
    assert (vm.vcpus, vm.ram_gib, vm.name) == (8, 64, "ws-anim-02")


def test_host_cannot_shrink_below_its_vms(admin_api, gpu):
    services.place_vgpu(VirtualMachineFactory(vcpus=48, ram_gib=256), gpu, profile("RTX6000-24Q"))

    refused = admin_api.patch(f"/api/v1/hosts/{gpu.host_id}/", {"cpu_threads": 32}, format="json")
    accepted = admin_api.patch(f"/api/v1/hosts/{gpu.host_id}/", {"cpu_threads": 48}, format="json")

    assert refused.status_code == 400
    assert refused.json()["violations"] == [{
        "rule": "host_vcpu",
        "message": "Host render-01 runs VMs with 48 vCPUs; 32 vCPUs (32 threads x 1 overcommit) would not hold them",
    }]
    assert accepted.status_code == 200
    assert accepted.json()["cpu_threads"] == 48
    assert accepted.json()["allocated_vcpus"] == 48
    assert accepted.json()["gpu_count"] == 1


def test_gpu_holding_vgpus_keeps_its_mode(admin_api, gpu):
    services.place_vgpu(VirtualMachineFactory(), gpu, profile("RTX6000-12Q"))

    response = admin_api.patch(f"/api/v1/gpus/{gpu.pk}/", {"mode": "passthrough"}, format="json")

    assert response.status_code == 400
    assert response.json()["violations"][0]["rule"] == "gpu_busy"
    assert "holds 1 vGPU(s)" in response.json()["detail"]
    gpu.refresh_from_db()
    assert gpu.mode == "vgpu"


def test_new_gpu_in_mixed_size_mode_needs_a_capable_model(admin_api, gpu):
    body = {"host": gpu.host_id, "gpu_model": gpu_model("Quadro RTX 6000").pk, "pci_bus_id": "00000000:5E:00.0",
            "size_mode": "mixed"}

    refused = admin_api.post("/api/v1/gpus/", body, format="json")
    accepted = admin_api.post("/api/v1/gpus/", {**body, "gpu_model": gpu_model("NVIDIA L40S").pk}, format="json")

    assert refused.status_code == 400
    assert refused.json()["violations"] == [
        {"rule": "size_mode_unsupported", "message": "Quadro RTX 6000 does not support mixed-size mode"},
    ]
    assert accepted.status_code == 201
    assert accepted.json()["size_mode"] == "mixed"
    assert accepted.json()["used_fb_mib"] == 0
    assert Gpu.objects.filter(host=gpu.host).count() == 2


@pytest.mark.parametrize(
    ("route", "noun", "blocked_by"),
    [
        ("hosts", "host", "1 GPU and 1 virtual machine"),
        ("gpus", "GPU", "1 vGPU"),
        ("vgpu-profiles", "vGPU profile", "1 vGPU"),
        ("gpu-models", "GPU model", "1 GPU and 8 vGPU profiles"),
    ],
)
def test_deleting_what_is_still_in_use_is_409(admin_api, gpu, route, noun, blocked_by):
    vgpu = services.place_vgpu(VirtualMachineFactory(), gpu, profile("RTX6000-12Q"))
    target = {"hosts": gpu.host, "gpus": gpu, "vgpu-profiles": vgpu.profile, "gpu-models": gpu.gpu_model}[route]

    response = admin_api.delete(f"/api/v1/{route}/{target.pk}/")

    assert response.status_code == 409
    detail = response.json()["detail"]
    assert detail.startswith(f"Cannot delete {noun} {target}:")
    assert blocked_by in detail
    assert type(target).objects.filter(pk=target.pk).exists()


@pytest.mark.parametrize(
    ("route", "body", "field"),
    [
        ("hosts", {"name": "h1", "cpu_threads": "many", "ram_gib": 512}, "cpu_threads"),
        ("hosts", {"name": "h1", "cpu_threads": 0, "ram_gib": 512}, "cpu_threads"),
        ("hosts", {"name": "h1", "cpu_threads": 64, "ram_gib": 512, "hypervisor": "vbox"}, "hypervisor"),
        ("hosts", {"name": "render-01", "cpu_threads": 64, "ram_gib": 512}, "name"),
        ("gpus", {"host": 999_999, "gpu_model": MODEL, "pci_bus_id": "00000000:5E:00.0"}, "host"),
        ("gpus", {"gpu_model": MODEL, "pci_bus_id": "00000000:5E:00.0", "mode": "sli"}, "mode"),
        ("gpus", {"gpu_model": MODEL, "pci_bus_id": "00000000:3B:00.0"}, "non_field_errors"),
        ("gpus", {"gpu_model": MODEL, "pci_bus_id": "00000000:5E:00.0", "uuid": "GPU-taken"}, "uuid"),
        ("vms", {"name": "ws-x", "vcpus": 0}, "vcpus"),
        ("vms", {"name": "ws-x", "artist": 999_999}, "artist"),
        ("artists", {"name": "Dee", "user_type": "superheavy"}, "user_type"),
        ("artists", {"name": "Dee", "workflow": "cooking"}, "workflow"),
        ("vgpu-profiles", {"name": "X-1Q", "gpu_model": MODEL, "series": "Z", "fb_mib": 1024, "max_per_gpu": 1},
         "series"),
    ],
)
def test_invalid_input_is_400_with_field_messages_and_writes_nothing(admin_api, gpu, route, body, field):
    gpu.uuid = "GPU-taken"
    gpu.save()
    body = {key: gpu.gpu_model_id if value == MODEL else value for key, value in body.items()}
    if route == "gpus":
        body = {"host": gpu.host_id, **body}
    counts = {model: model.objects.count() for model in (Host, Gpu, VirtualMachine, Artist)}

    response = admin_api.post(f"/api/v1/{route}/", body, format="json")

    assert response.status_code == 400
    assert field in response.json(), response.json()
    assert {model: model.objects.count() for model in counts} == counts


def test_gpus_without_uuid_may_coexist(admin_api, gpu):
    """Only a non-empty UUID is unique (GPUs entered by hand before discovery have none)."""
    gpu.uuid = ""
    gpu.save()
    body = {"host": gpu.host_id, "gpu_model": gpu.gpu_model_id, "pci_bus_id": "00000000:5E:00.0", "uuid": ""}
    assert admin_api.post("/api/v1/gpus/", body, format="json").status_code == 201


def test_new_artist_gets_default_workflow_and_user_type(admin_api, db):
    response = admin_api.post("/api/v1/artists/", {"name": "Cleo Artist"}, format="json")
    assert response.status_code == 201
    assert response.json() == {
        "id": response.json()["id"], "user": None, "name": "Cleo Artist", "workflow": "other", "user_type": "medium",
    }


def test_one_artist_per_user(admin_api, artist):
    response = admin_api.post("/api/v1/artists/", {"name": "Ana Again", "user": artist.user_id}, format="json")
    assert response.status_code == 400
    assert "user" in response.json()
    assert Artist.objects.filter(user=artist.user).count() == 1


def test_new_host_shows_zero_usage_and_default_overcommit(admin_api, settings, db):
    response = admin_api.post("/api/v1/hosts/", {"name": "render-02", "cpu_threads": 64, "ram_gib": 512},
                              format="json")
    assert response.status_code == 201
    body = response.json()
    assert (body["allocated_vcpus"], body["allocated_ram_gib"], body["gpu_count"]) == (0, 0, 0)
    assert body["vcpu_overcommit"] == settings.FLEET_DEFAULT_VCPU_OVERCOMMIT
    assert body["hypervisor"] == "kvm"


def test_a_race_the_validators_could_not_see_is_409_not_500(admin_api, gpu, monkeypatch):
    """Two admins add the same GPU at once: both pass validation, the database refuses the second."""
    from django.db import IntegrityError

    def lose_the_race(gpu, **fields):
        raise IntegrityError('duplicate key value violates unique constraint "gpu_unique_host_pci_bus_id"')

    monkeypatch.setattr(services, "update_gpu", lose_the_race)
    body = {"host": gpu.host_id, "gpu_model": gpu.gpu_model_id, "pci_bus_id": "00000000:5E:00.0"}

    response = admin_api.post("/api/v1/gpus/", body, format="json")

    assert response.status_code == 409
    assert "another request changed it meanwhile" in response.json()["detail"]
    assert Gpu.objects.count() == 1

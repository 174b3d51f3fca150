"""Resize requests of a VM's vCPUs and RAM through the API: filed alone or with a vGPU change and
read back, bad numbers refused naming the field, approval giving the VM its new size when its
host has room, and refused (the request pending, the VM as it was) when it has not."""

import pytest

from fleet.choices import ResizeStatus
from fleet.models import AuditEvent, Host, ResizeRequest, Vgpu, VirtualMachine
from fleet.tests.factories import VirtualMachineFactory, profile
from fleet.tests.request_world import URL

SIZE_FIELDS = ("current_vcpus", "current_ram_gib", "requested_vcpus", "requested_ram_gib")


def _file(api, vm, **body):
    response = api.post(URL, {"vm": vm.pk, "reason": "bigger fluid caches", **body}, format="json")
    assert response.status_code == 201, response.json()
    return response.json()


def test_artist_files_a_ram_change_alone_and_reads_it_back(fleet_world, artist_api):
    filed = _file(artist_api, fleet_world.vm_a, requested_ram_gib=64)

    assert {name: filed[name] for name in SIZE_FIELDS} == {
        "current_vcpus": 8, "current_ram_gib": 32, "requested_vcpus": None, "requested_ram_gib": 64}
    # The vGPU stays as it is: the request names the profile and count the VM holds.
    assert (filed["requested_profile"], filed["requested_vgpus"]) == (fleet_world.profile_12q.pk, 1)
    read = artist_api.get(f"{URL}{filed['id']}/").json()
    assert {name: read[name] for name in SIZE_FIELDS} == {name: filed[name] for name in SIZE_FIELDS}
    listed = artist_api.get(URL).json()["results"]
    assert [(r["id"], r["requested_ram_gib"]) for r in listed] == [(filed["id"], 64)]


def test_artist_cannot_file_a_size_change_for_another_artists_vm(fleet_world, artist_api):
    response = artist_api.post(URL, {"vm": fleet_world.vm_b.pk, "requested_vcpus": 16, "reason": "mine now"},
                               format="json")
    assert response.status_code == 403
    assert not ResizeRequest.objects.exists()


@pytest.mark.parametrize(("body", "field", "message"), [
    ({"requested_vcpus": 0}, "requested_vcpus", "greater than or equal to 1"),
    ({"requested_ram_gib": -4}, "requested_ram_gib", "greater than or equal to"),
    ({"requested_vcpus": 100_000}, "requested_vcpus", "less than or equal to 768"),
    ({"requested_vcpus": "many"}, "requested_vcpus", "valid integer"),
    ({}, "requested_profile", "already has this profile and number of vGPUs"),
    ({"requested_vcpus": 8, "requested_ram_gib": 32}, "requested_vcpus", "ws-ana has 8 vCPUs already"),
    ({"requested_vcpus": 8, "requested_ram_gib": 32}, "requested_ram_gib", "ws-ana has 32 GiB of RAM already"),
])
def test_bad_sizes_are_refused_naming_the_field_and_nothing_is_saved(fleet_world, artist_api, body, field, message):
    response = artist_api.post(URL, {"vm": fleet_world.vm_a.pk, "reason": "lighting pass", **body}, format="json")
    assert response.status_code == 400
    assert message in str(response.json()[field])
    assert not ResizeRequest.objects.exists()


def test_approval_gives_the_vm_its_new_size_keeps_its_vgpu_and_audits_both_sizes(fleet_world, artist_api,
                                                                                  admin_api):
    filed = _file(artist_api, fleet_world.vm_a, requested_vcpus=16, requested_ram_gib=64)

    response = admin_api.post(f"{URL}{filed['id']}/approve/", {"comment": "go"}, format="json")

    assert response.status_code == 200, response.json()
    assert response.json()["status"] == ResizeStatus.APPROVED
    vm = VirtualMachine.objects.get(pk=fleet_world.vm_a.pk)
    assert (vm.vcpus, vm.ram_gib) == (16, 64)
    # The vGPU was not placed again: the same row, on the same GPU.
    assert list(Vgpu.objects.filter(vm=vm).values_list("pk", "gpu_id")) == [
        (fleet_world.vgpu_a.pk, fleet_world.gpu_a.pk)]
    change = AuditEvent.objects.get(action="vm.update", object_id=str(vm.pk))
    assert ({k: change.before[k] for k in ("vcpus", "ram_gib")}, {k: change.after[k] for k in ("vcpus", "ram_gib")}) \
        == ({"vcpus": 8, "ram_gib": 32}, {"vcpus": 16, "ram_gib": 64})
    assert change.comment == f"resize request #{filed['id']}"
    approval = AuditEvent.objects.get(action="resize_request.approve")
    assert {name: approval.after[name] for name in SIZE_FIELDS} == {
        "current_vcpus": 8, "current_ram_gib": 32, "requested_vcpus": 16, "requested_ram_gib": 64}


def test_a_vgpu_and_a_size_change_are_applied_together(fleet_world, artist_api, admin_api):
    filed = _file(artist_api, fleet_world.vm_a, requested_profile=profile("RTX6000-24Q").pk, requested_ram_gib=48)

    assert admin_api.post(f"{URL}{filed['id']}/approve/", {}, format="json").status_code == 200

    vm = VirtualMachine.objects.get(pk=fleet_world.vm_a.pk)
    assert (vm.vcpus, vm.ram_gib) == (8, 48)
    assert [v.profile.name for v in Vgpu.objects.filter(vm=vm)] == ["RTX6000-24Q"]


def test_approval_is_refused_when_the_host_lacks_the_vcpus_and_nothing_changes(fleet_world, artist_api, admin_api):
    # host-a: 16 threads, no overcommit; ws-ana claims 8 and another VM 6, so 10 are free for ws-ana.
    Host.objects.filter(pk=fleet_world.host_a.pk).update(cpu_threads=16, vcpu_overcommit=1.0)
    VirtualMachineFactory(name="ws-render", host=fleet_world.host_a, vcpus=6, ram_gib=16)
    filed = _file(artist_api, fleet_world.vm_a, requested_vcpus=12)

    response = admin_api.post(f"{URL}{filed['id']}/approve/", {}, format="json")

    assert response.status_code == 409
    why = "VM ws-ana needs 12 vCPUs; host host-a has 10 of 16 vCPUs free (16 threads x 1 overcommit)"
    assert why in str(response.json())
    request = ResizeRequest.objects.get(pk=filed["id"])
    assert request.status == ResizeStatus.PENDING
    assert why in request.last_error
    vm = VirtualMachine.objects.get(pk=fleet_world.vm_a.pk)
    assert (vm.vcpus, vm.ram_gib) == (8, 32)
    assert list(Vgpu.objects.filter(vm=vm).values_list("pk", flat=True)) == [fleet_world.vgpu_a.pk]
    assert not AuditEvent.objects.filter(action__in=("vm.update", "resize_request.approve")).exists()
    # The queue's answer is the approval's: no room, and why.
    detail = admin_api.get(f"{URL}{filed['id']}/").json()
    assert detail["fits"]["where"] == "nowhere"
    assert why in detail["fits"]["reason"]


def test_approval_is_refused_when_the_host_lacks_the_ram(fleet_world, artist_api, admin_api):
    Host.objects.filter(pk=fleet_world.host_a.pk).update(ram_gib=64, ram_overcommit=1.0)
    filed = _file(artist_api, fleet_world.vm_a, requested_ram_gib=96)

    response = admin_api.post(f"{URL}{filed['id']}/approve/", {}, format="json")

    assert response.status_code == 409
    assert "VM ws-ana needs 96 GiB RAM; host host-a has 64 of 64 GiB free" in str(response.json())
    assert VirtualMachine.objects.get(pk=fleet_world.vm_a.pk).ram_gib == 32

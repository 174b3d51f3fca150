"""A change of a VM's vCPUs and RAM through the pages: the artist files it on /me/ (their VM
only), the queue and the confirm step show it, approval applies it, and a host without room
refuses it with the reason while the request stays pending."""

import re

from django.test import Client

from fleet.choices import ResizeStatus
from fleet.models import Host, ResizeRequest, Vgpu, VirtualMachine
from fleet.tests.factories import profile


def _client(user):
    client = Client()
    client.force_login(user)
    return client


def _text(response) -> str:
    return " ".join(re.sub(r"<[^>]+>", " ", response.content.decode()).replace("&gt;", ">").split())


def _row(html: str, pk: int) -> str:
    match = re.search(rf'<tr data-request="{pk}">(.*?)</tr>', html, re.S)
    assert match, f"no row for request #{pk}"
    return " ".join(re.sub(r"<[^>]+>", " ", match.group(1)).replace("&gt;", ">").split())


def _approve(admin, request):
    page = admin.get(f"/requests/{request.pk}/review/").content.decode()
    fingerprint = re.search(r'name="fingerprint" value="(\w+)"', page).group(1)
    return admin.post(f"/requests/{request.pk}/approve/", {"confirm": "on", "fingerprint": fingerprint}, follow=True)


def _file_on_me(client, vm, **fields):
    return client.post(f"/me/vms/{vm.pk}/request/", {"change": "size", "reason": "lighter shots", **fields},
                       follow=True)


def test_artist_files_a_ram_change_for_own_vm_and_the_admin_approves_it(fleet_world, admin_user):
    ana = _client(fleet_world.ana.user)
    assert 'name="requested_ram_gib"' in ana.get("/me/").content.decode()

    filed = _file_on_me(ana, fleet_world.vm_a, requested_ram_gib="16", requested_vcpus="4")

    assert "Request for ws-ana (8 -> 4 vCPUs, 32 -> 16 GiB) filed" in _text(filed)
    request = ResizeRequest.objects.get(vm=fleet_world.vm_a)
    assert (request.requested_profile, request.requested_vgpus, request.requested_vcpus,
            request.requested_ram_gib) == (fleet_world.profile_12q, 1, 4, 16)
    assert "8 -> 4 vCPUs, 32 -> 16 GiB" in _row(ana.get("/me/").content.decode(), request.pk)
    admin = _client(admin_user)
    row = _row(admin.get("/requests/").content.decode(), request.pk)
    assert "8 -> 4 vCPUs, 32 -> 16 GiB" in row
    assert "same gpu" in row
    review = _text(admin.get(f"/requests/{request.pk}/review/"))
    assert "8 -> 4 vCPUs, 32 -> 16 GiB" in review
    assert "1 × RTX6000-12Q, 8 vCPUs, 32 GiB → 1 × RTX6000-12Q, 4 vCPUs, 16 GiB" in review
    assert "its vCPUs and RAM change while it is powered off" in review

    done = _text(_approve(admin, request))

    assert f"Request #{request.pk} for ws-ana (8 -> 4 vCPUs, 32 -> 16 GiB) approved and applied." in done
    vm = VirtualMachine.objects.get(pk=fleet_world.vm_a.pk)
    assert (vm.vcpus, vm.ram_gib) == (4, 16)
    assert list(Vgpu.objects.filter(vm=vm).values_list("pk", flat=True)) == [fleet_world.vgpu_a.pk]
    decided = _row(admin.get("/requests/").content.decode(), request.pk)
    assert "8 -> 4 vCPUs, 32 -> 16 GiB" in decided
    assert "Approved" in decided


def test_artist_cannot_file_a_size_change_for_another_artists_vm(fleet_world):
    response = _file_on_me(_client(fleet_world.ana.user), fleet_world.vm_b, requested_ram_gib="64")
    assert response.status_code == 403
    assert not ResizeRequest.objects.exists()


def test_bad_numbers_on_the_form_are_told_and_nothing_is_filed(fleet_world):
    ana = _client(fleet_world.ana.user)
    assert "A VM has 1 to 768 vCPUs." in _text(_file_on_me(ana, fleet_world.vm_a, requested_vcpus="0"))
    assert "A VM has 1 to 24576 GiB of RAM." in _text(_file_on_me(ana, fleet_world.vm_a, requested_ram_gib="-8"))
    assert "Enter the RAM (GiB) as a whole number." in _text(
        _file_on_me(ana, fleet_world.vm_a, requested_ram_gib="lots"))
    assert "The VM already has this profile and number of vGPUs" in _text(_file_on_me(ana, fleet_world.vm_a))
    assert not ResizeRequest.objects.exists()


def test_a_host_without_room_refuses_the_approval_and_the_request_waits(fleet_world, admin_user):
    Host.objects.filter(pk=fleet_world.host_a.pk).update(ram_gib=64, ram_overcommit=1.0)
    _file_on_me(_client(fleet_world.ana.user), fleet_world.vm_a, requested_ram_gib="128")
    request = ResizeRequest.objects.get()
    admin = _client(admin_user)
    why = "VM ws-ana needs 128 GiB RAM; host host-a has 64 of 64 GiB free"
    queue = admin.get("/requests/").content.decode()
    assert why in _row(queue, request.pk)
    # Moving other VMs' vGPUs makes no RAM: the queue does not offer to plan it.
    assert "data-room" not in re.search(rf'<tr data-request="{request.pk}">(.*?)</tr>', queue, re.S).group(1)
    review = admin.get(f"/requests/{request.pk}/review/").content.decode()
    assert "Cannot be approved now" in review
    assert 'name="fingerprint"' not in review

    # A confirmation posted from a look at the page while the host had room is refused: the
    # review shows the reason again.
    Host.objects.filter(pk=fleet_world.host_a.pk).update(ram_gib=768)
    fingerprint = re.search(r'name="fingerprint" value="(\w+)"',
                            admin.get(f"/requests/{request.pk}/review/").content.decode()).group(1)
    Host.objects.filter(pk=fleet_world.host_a.pk).update(ram_gib=64)
    refused = _text(admin.post(f"/requests/{request.pk}/approve/", {"confirm": "on", "fingerprint": fingerprint},
                               follow=True))

    assert f"Request #{request.pk} was not approved: The fleet changed since you reviewed" in refused
    assert f"Cannot be approved now: {why}" in refused
    request.refresh_from_db()
    assert request.status == ResizeStatus.PENDING
    assert VirtualMachine.objects.get(pk=fleet_world.vm_a.pk).ram_gib == 32


def test_a_profile_change_with_more_vcpus_is_filed_as_one_request(fleet_world):
    ana = _client(fleet_world.ana.user)
    filed = ana.post(f"/me/vms/{fleet_world.vm_a.pk}/request/",
                     {"change": "profile", "requested_profile": profile("RTX6000-24Q").pk, "requested_vcpus": "12",
                      "reason": "sim"}, follow=True)
    assert "Request for ws-ana (1 x RTX6000-24Q, 8 -> 12 vCPUs) filed" in _text(filed)

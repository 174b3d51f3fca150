"""Where a request fits: the queue (/requests/), the API and approval ask one pure answer
(`fleet.fit` over `fleet.queries.fleet_snapshot`). The queue locks and writes nothing, what it
says is what approval then does, and a VM's vGPUs go to distinct GPUs unless its host allows
several on one GPU."""

import re

import pytest
from django.db import connection
from django.test import Client
from django.test.utils import CaptureQueriesContext

from fleet import requests as service
from fleet import services
from fleet.choices import ResizeStatus
from fleet.models import AuditEvent, Host, ResizeRequest, Vgpu
from fleet.placement import PlacementError, Rule
from fleet.services import FleetConflict
from fleet.tests.factories import (
    ArtistFactory,
    GpuFactory,
    HostFactory,
    UserFactory,
    VirtualMachineFactory,
    gpu_model,
    profile,
)

pytestmark = pytest.mark.django_db

WRITE = re.compile(r"^\s*(INSERT|UPDATE|DELETE|REPLACE)\b", re.IGNORECASE)


def _queue(admin_user) -> tuple[str, list[str]]:
    """The queue's HTML and every SQL statement its GET ran."""
    client = Client()
    client.force_login(admin_user)
    with CaptureQueriesContext(connection) as queries:
        response = client.get("/requests/")
    assert response.status_code == 200
    return response.content.decode(), [q["sql"] for q in queries.captured_queries]


def _fit_cell(html: str, pk: int) -> str:
    match = re.search(rf'<tr data-request="{pk}">.*?<td class="fit-[a-z_/]+" data-fit="([a-z_/]+)">(.*?)</td>',
                      html, re.S)
    assert match, f"no fit cell for request #{pk}"
    return match.group(1) + " " + re.sub(r"\s+", " ", match.group(2))


@pytest.fixture
def queue_world(admin_user):
    """Four pending requests, each fitting differently on two RTX 6000 hosts:

    - ws-grow (12Q alone on a-1) asks for a 24Q: fits on its own GPU;
    - ws-pair (12Q beside ws-mate's 12Q on a-2) asks for a 24Q: another GPU of its host (a-3);
    - ws-far (24Q on b-1, host b's only GPU) asks for 2 x 24Q: host b has one GPU, host c two;
    - ws-big (24Q on a-3's neighbour...) asks for 4 x 24Q: no host has four free GPUs.
    """
    host_a, host_b, host_c = (HostFactory(name=name) for name in ("host-a", "host-b", "host-c"))
    a1, a2, a3 = (GpuFactory(host=host_a, pci_bus_id=f"00000000:{n}:00.0") for n in ("1A", "2A", "3A"))
    b1 = GpuFactory(host=host_b, pci_bus_id="00000000:1B:00.0")
    GpuFactory(host=host_c, pci_bus_id="00000000:1C:00.0")
    GpuFactory(host=host_c, pci_bus_id="00000000:2C:00.0")
    q12, q24 = profile("RTX6000-12Q"), profile("RTX6000-24Q")
    vms = {}
    for name, gpu, held in (("ws-grow", a1, q12), ("ws-pair", a2, q12), ("ws-mate", a2, q12), ("ws-far", b1, q24)):
        vms[name] = VirtualMachineFactory(name=name)
        services.place_vgpu(vms[name], gpu, held)
    vms["ws-big"] = VirtualMachineFactory(name="ws-big")
    requests = {
        "grow": service.file_request(vms["ws-grow"], admin_user, q24, 1, "bigger scenes"),
        "pair": service.file_request(vms["ws-pair"], admin_user, q24, 1, "bigger scenes"),
        "far": service.file_request(vms["ws-far"], admin_user, q24, 2, "rendering"),
        "big": service.file_request(vms["ws-big"], admin_user, q24, 4, "rendering"),
    }
    return requests


def test_the_queue_locks_nothing_and_writes_nothing_on_a_get(queue_world, admin_user):
    events = AuditEvent.objects.count()
    placed = list(Vgpu.objects.order_by("pk").values_list("pk", "gpu_id", "vm_id"))
    html, statements = _queue(admin_user)
    assert not [sql for sql in statements if "FOR UPDATE" in sql.upper()]
    assert not [sql for sql in statements if WRITE.match(sql) and "django_session" not in sql]
    assert AuditEvent.objects.count() == events
    assert list(Vgpu.objects.order_by("pk").values_list("pk", "gpu_id", "vm_id")) == placed
    assert _fit_cell(html, queue_world["grow"].pk).startswith("same_gpu same gpu: 00000000:1A:00.0 on host-a")


def test_the_queue_reads_the_fleet_once_whatever_its_length(queue_world, admin_user):
    _, four = _queue(admin_user)
    vm = VirtualMachineFactory(name="ws-more")
    services.place_vgpu(vm, GpuFactory(host=Host.objects.get(name="host-c")), profile("RTX6000-6Q"))
    service.file_request(vm, admin_user, profile("RTX6000-8Q"), 1, "more")
    _, five = _queue(admin_user)
    assert len(five) - len(four) <= 1  # at most the evidence of the new row, not a snapshot per row


def test_what_the_queue_says_is_what_approval_does(queue_world, admin_user):
    html, _ = _queue(admin_user)
    said = {key: _fit_cell(html, request.pk) for key, request in queue_world.items()}
    assert said["grow"].startswith("same_gpu same gpu: 00000000:1A:00.0 on host-a")
    assert said["pair"].startswith("other_gpu other gpu: 00000000:3A:00.0 on host-a")
    assert said["far"].startswith("other_host other host: 00000000:1C:00.0, 00000000:2C:00.0 on host-c")
    assert said["big"].startswith("nowhere No room as the fleet stands")
    assert "needs 4 GPUs with room, one for each vGPU of the VM" in said["big"]

    for key in ("grow", "pair", "far"):
        request = queue_world[key]
        fit = service.fits(ResizeRequest.objects.get(pk=request.pk))
        service.approve(request, admin_user, "go")
        held = Vgpu.objects.filter(vm=request.vm).select_related("gpu__host")
        assert sorted(v.gpu.pci_bus_id for v in held) == list(fit.gpus), key
        assert {v.gpu.host.name for v in held} == {fit.host}, key
        assert f"{', '.join(fit.gpus)} on {fit.host}" in said[key]

    big = queue_world["big"]
    with pytest.raises(FleetConflict) as refused:
        service.approve(big, admin_user, "go")
    big.refresh_from_db()
    assert big.status == ResizeStatus.PENDING
    assert str(refused.value) == big.last_error == service.fits(big).reason
    assert "needs 4 GPUs with room, one for each vGPU of the VM" in big.last_error


# Several vGPUs of one VM ---------------------------------------------------------------------


def _l40s(gpus: int, *, sharing: bool = False):
    """A host of `gpus` L40S GPUs (sharing: it lets one VM's vGPUs share a GPU) and a VM holding
    one L40S-12Q on its first GPU."""
    host = HostFactory(name=f"l40s-{gpus}-{'sharing' if sharing else 'spread'}", multi_vgpu_same_gpu=sharing)
    l40s = gpu_model("NVIDIA L40S")
    gpus = [GpuFactory(host=host, gpu_model=l40s) for _ in range(gpus)]
    vm = VirtualMachineFactory(name=f"ws-{host.name}")
    services.place_vgpu(vm, gpus[0], profile("L40S-12Q"))
    return vm


def _approve(admin_user, vm, vgpus: int) -> list[int]:
    request = service.file_request(vm, admin_user, profile("L40S-12Q"), vgpus, "rendering")
    service.approve(request, admin_user)
    return list(Vgpu.objects.filter(vm=vm).order_by("pk").values_list("gpu_id", flat=True))


@pytest.mark.parametrize("vgpus", [2, 4])
def test_an_approval_of_several_vgpus_puts_each_on_a_gpu_of_its_own(admin_user, vgpus):
    held = _approve(admin_user, _l40s(4), vgpus)
    assert len(held) == len(set(held)) == vgpus


@pytest.mark.parametrize(("vgpus", "gpus"), [(2, 1), (4, 3)])
def test_a_host_with_too_few_distinct_gpus_refuses_and_says_why(admin_user, vgpus, gpus):
    vm = _l40s(gpus)
    request = service.file_request(vm, admin_user, profile("L40S-12Q"), vgpus, "rendering")
    assert service.fits(request).where == "nowhere"
    with pytest.raises(FleetConflict) as refused:
        service.approve(request, admin_user)
    assert (f"{vgpus} x L40S-12Q needs {vgpus} GPUs with room, one for each vGPU of the VM; "
            f"{gpus} {'has' if gpus == 1 else 'have'} room") in str(refused.value)
    assert Vgpu.objects.filter(vm=vm).count() == 1  # nothing changed


@pytest.mark.parametrize(("vgpus", "gpus", "distinct"), [(2, 1, 1), (4, 3, 3), (4, 4, 4)])
def test_a_host_that_allows_sharing_stacks_only_what_its_gpus_cannot_spread(admin_user, vgpus, gpus, distinct):
    held = _approve(admin_user, _l40s(gpus, sharing=True), vgpus)
    assert (len(held), len(set(held))) == (vgpus, distinct)


def test_placing_a_second_vgpu_of_a_vm_on_its_gpu_is_refused_with_the_rule(admin_user):
    vm = _l40s(2)
    gpu = Vgpu.objects.get(vm=vm).gpu
    with pytest.raises(PlacementError) as refused:
        services.place_vgpu(vm, gpu, profile("L40S-12Q"))
    assert refused.value.rules == [Rule.VM_SAME_GPU]
    assert f"already holds a vGPU on GPU {gpu.pci_bus_id}" in str(refused.value)


def test_a_host_cannot_stop_sharing_while_a_vm_shares_a_gpu(admin_user):
    vm = _l40s(1, sharing=True)
    _approve(admin_user, vm, 2)
    vm.refresh_from_db()
    host = vm.host
    with pytest.raises(PlacementError) as refused:
        services.update_host(host, multi_vgpu_same_gpu=False)
    assert refused.value.rules == [Rule.VM_SAME_GPU]
    assert f"VM {vm.name} holds several vGPUs on GPU" in str(refused.value)
    assert Host.objects.get(pk=host.pk).multi_vgpu_same_gpu
    services.update_host(host, name="renamed")  # other changes still go through


def test_the_setting_is_read_and_written_through_the_api(admin_user):
    from rest_framework.test import APIClient

    client = APIClient()
    client.force_authenticate(admin_user)
    host = HostFactory(name="api-host")
    assert client.get(f"/api/v1/hosts/{host.pk}/").json()["multi_vgpu_same_gpu"] is False
    response = client.patch(f"/api/v1/hosts/{host.pk}/", {"multi_vgpu_same_gpu": True}, format="json")
    assert response.status_code == 200, response.json()
    assert Host.objects.get(pk=host.pk).multi_vgpu_same_gpu


def test_the_artists_form_says_of_each_choice_what_the_queue_then_says(admin_user):
    artist = ArtistFactory(user=UserFactory(username="lena"), name="Lena")
    vm = _l40s(1)  # one L40S GPU: a second vGPU has no GPU of its own
    vm.artist = artist
    vm.save()
    client = Client()
    client.force_login(artist.user)
    page = client.get("/me/").content.decode()
    more = re.search(r'<option value="more" data-fit="([a-z_]+)">([^<]*)</option>', page)
    assert more.groups() == ("nowhere", "One more vGPU (2 × L40S-12Q): no room now")
    bigger = re.search(rf'<option value="{profile("L40S-24Q").pk}" data-fit="([a-z_]+)">([^<]*)</option>', page)
    assert bigger.groups() == ("same_gpu", "L40S-24Q: fits on its GPU now")

    for choice, said in (({"change": "more"}, "nowhere"), ({"requested_profile": profile("L40S-24Q").pk}, "same_gpu")):
        client.post(f"/me/vms/{vm.pk}/request/", {**choice, "reason": "rendering"})
        filed = ResizeRequest.objects.get(vm=vm, status=ResizeStatus.PENDING)
        assert _fit_cell(_queue(admin_user)[0], filed.pk).startswith(said)
        service.cancel(filed, artist.user)

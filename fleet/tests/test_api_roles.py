"""Who may do what on every inventory endpoint (DESIGN.md "Roles").

Anonymous: 401 everywhere. An artist reads the catalog (GPU models, profiles) and only their
own artist record, VMs, vGPUs and the hosts and GPUs carrying them (others' objects are 404),
and writes nothing (403). Staff do everything.
"""

from dataclasses import dataclass
from typing import Any

import pytest
from rest_framework.test import APIClient

from fleet.models import Artist, Gpu, GpuModel, Host, Vgpu, VgpuProfile, VirtualMachine
from fleet.tests.factories import (
    ArtistFactory,
    GpuFactory,
    HostFactory,
    UserFactory,
    VirtualMachineFactory,
    gpu_model,
    profile,
)


@dataclass(frozen=True)
class Resource:
    """How to exercise one endpoint: its objects, a valid new one and a valid change."""

    route: str
    model: type
    own: Any  # world -> the object the artist may see
    other: Any  # world -> an object of someone else (the catalog: just another row)
    create: Any  # world -> POST body that staff may send
    change: dict | None  # PATCH body; None where the endpoint has no update (405)
    disposable: Any  # world -> an object staff may delete
    catalog: bool = False  # visible to every signed-in user


def _new_gpu_model(world):
    return GpuModel.objects.create(name="Test Board", code="TB", fb_mib=8192)


RESOURCES = {
    "gpu-models": Resource(
        "gpu-models", GpuModel,
        own=lambda w: gpu_model("Quadro RTX 6000"), other=lambda w: gpu_model("Tesla T4"),
        create=lambda w: {"name": "NVIDIA B40", "code": "B40", "fb_mib": 49152, "mixed_size_capable": True},
        change={"gpus_per_board": 2},
        disposable=_new_gpu_model, catalog=True,
    ),
    "vgpu-profiles": Resource(
        "vgpu-profiles", VgpuProfile,
        own=lambda w: profile("RTX6000-12Q"), other=lambda w: profile("T4-4Q"),
        create=lambda w: {"name": "T4-16B", "gpu_model": gpu_model("Tesla T4").pk, "series": "B",
                          "fb_mib": 16384, "max_per_gpu": 1},
        change={"max_per_vm": 1},
        disposable=lambda w: VgpuProfile.objects.create(
            name="TB-8Q", gpu_model=_new_gpu_model(w), series="Q", fb_mib=8192, max_per_gpu=1,
        ),
        catalog=True,
    ),
    "hosts": Resource(
        "hosts", Host, own=lambda w: w.host_a, other=lambda w: w.host_b,
        create=lambda w: {"name": "host-new", "cpu_threads": 64, "ram_gib": 512},
        change={"cpu_model": "2 x EPYC 9354"},
        disposable=lambda w: HostFactory(),
    ),
    "gpus": Resource(
        "gpus", Gpu, own=lambda w: w.gpu_a, other=lambda w: w.gpu_b,
        create=lambda w: {"host": w.host_a.pk, "gpu_model": gpu_model().pk, "pci_bus_id": "00000000:5E:00.0",
                          "uuid": "GPU-new"},
        change={"uuid": "GPU-renamed"},
        disposable=lambda w: GpuFactory(host=w.host_a),
    ),
    "artists": Resource(
        "artists", Artist, own=lambda w: w.ana, other=lambda w: w.bob,
        create=lambda w: {"name": "Cleo Artist"},
        change={"workflow": "lighting"},
        disposable=lambda w: ArtistFactory(),
    ),
    "vms": Resource(
        "vms", VirtualMachine, own=lambda w: w.vm_a, other=lambda w: w.vm_b,
        create=lambda w: {"name": "ws-new", "artist": w.ana.pk},
        change={"vcpus": 12},
        disposable=lambda w: VirtualMachineFactory(),
    ),
    "vgpus": Resource(
        "vgpus", Vgpu, own=lambda w: w.vgpu_a, other=lambda w: w.vgpu_b,
        create=lambda w: {"vm": VirtualMachineFactory(artist=w.ana).pk, "gpu": w.gpu_a.pk,
                          "profile": w.profile_12q.pk},
        change=None,
        disposable=lambda w: w.vgpu_b,
    ),
}

ACTIONS = ["list", "retrieve", "create", "update", "delete"]
ROLES = ["anonymous", "artist_own", "artist_other", "staff"]


def expected_status(resource: Resource, role: str, action: str) -> int:
    if role == "anonymous":
        return 401
    if role.startswith("artist"):
        if action == "list":
            return 200
        if action == "retrieve":
            return 200 if role == "artist_own" or resource.catalog else 404
        return 403
    if action == "update" and resource.change is None:
        return 405
    return {"list": 200, "retrieve": 200, "create": 201, "update": 200, "delete": 204}[action]


MATRIX = [
    pytest.param(name, role, action, expected_status(resource, role, action),
                 id=f"{name}-{role}-{action}-{expected_status(resource, role, action)}")
    for name, resource in RESOURCES.items() for role in ROLES for action in ACTIONS
    # An artist's list is one request whichever object we think of; test it once.
    if not (role == "artist_other" and action in {"list", "create"})
]


@pytest.fixture
def clients(api, artist_api, admin_api):
    return {"anonymous": api, "artist_own": artist_api, "artist_other": artist_api, "staff": admin_api}


@pytest.mark.parametrize(("name", "role", "action", "status"), MATRIX)
def test_role_matrix(name, role, action, status, clients, fleet_world):
    resource = RESOURCES[name]
    client = clients[role]
    base = f"/api/v1/{resource.route}/"
    if action in {"list", "create"}:
        target = None
    elif role == "staff" and action == "delete":
        target = resource.disposable(fleet_world)
    elif role == "artist_own":
        target = resource.own(fleet_world)
    else:
        target = resource.other(fleet_world)
    url = base if target is None else f"{base}{target.pk}/"
    rows_before = resource.model.objects.count()

    if action == "list":
        response = client.get(url, {"limit": 500})  # the whole catalog on one page
    elif action == "retrieve":
        response = client.get(url)
    elif action == "create":
        response = client.post(url, resource.create(fleet_world), format="json")
    elif action == "update":
        response = client.patch(url, resource.change or {"vm": fleet_world.vm_a.pk}, format="json")
    else:
        response = client.delete(url)

    assert response.status_code == status, response.content
    if status == 401:
        assert response["WWW-Authenticate"].startswith("Token")
    if status in {401, 403, 404, 405}:
        assert resource.model.objects.count() == rows_before, "a refused request must write nothing"
        if target is not None and action == "update" and resource.change:
            target.refresh_from_db()
            for field, value in resource.change.items():
                assert getattr(target, field) != value
    if action == "list" and status == 200:
        ids = {row["id"] for row in response.json()["results"]}
        assert resource.own(fleet_world).pk in ids
        assert (resource.other(fleet_world).pk in ids) is (role == "staff" or resource.catalog)
    if action == "retrieve" and status == 200:
        assert response.json()["id"] == target.pk
    if role == "staff" and action == "create":
        assert resource.model.objects.filter(pk=response.json()["id"]).exists()
        assert resource.model.objects.count() == rows_before + 1
    if role == "staff" and action == "update" and status == 200:
        target.refresh_from_db()
        for field, value in resource.change.items():
            assert getattr(target, field) == value
            assert response.json()[field] == value
    if role == "staff" and action == "delete":
        assert not resource.model.objects.filter(pk=target.pk).exists()


@pytest.mark.parametrize("route", [f"{name}/" for name in RESOURCES] + [""])
def test_anonymous_gets_401_with_token_challenge(api, route, db):
    response = api.get(f"/api/v1/{route}")
    assert response.status_code == 401
    assert response["WWW-Authenticate"] == 'Token'


@pytest.mark.parametrize("method", ["put", "patch"])
def test_vgpus_cannot_be_changed_in_place(admin_api, fleet_world, method):
    response = getattr(admin_api, method)(
        f"/api/v1/vgpus/{fleet_world.vgpu_a.pk}/",
        {"vm": fleet_world.vm_a.pk, "gpu": fleet_world.gpu_b.pk, "profile": fleet_world.profile_12q.pk},
        format="json",
    )
    assert response.status_code == 405
    fleet_world.vgpu_a.refresh_from_db()
    assert fleet_world.vgpu_a.gpu_id == fleet_world.gpu_a.pk


def test_artist_sees_shared_host_and_gpu_but_not_the_neighbours_vm(artist_api, fleet_world):
    """Ana's second VM lands on Bob's GPU: she now sees that host and GPU (with total usage), but
    still neither Bob's VM nor his vGPU nor his artist record."""
    from fleet import services

    vm = VirtualMachineFactory(name="ws-ana-2", artist=fleet_world.ana)
    services.place_vgpu(vm, fleet_world.gpu_b, fleet_world.profile_12q)

    hosts = {row["id"] for row in artist_api.get("/api/v1/hosts/").json()["results"]}
    assert hosts == {fleet_world.host_a.pk, fleet_world.host_b.pk}
    gpu = artist_api.get(f"/api/v1/gpus/{fleet_world.gpu_b.pk}/").json()
    assert gpu["used_fb_mib"] == 24576
    assert gpu["vgpu_count"] == 2
    vgpus = artist_api.get("/api/v1/vgpus/", {"gpu": fleet_world.gpu_b.pk}).json()["results"]
    assert [row["vm"] for row in vgpus] == [vm.pk]
    assert artist_api.get(f"/api/v1/vms/{fleet_world.vm_b.pk}/").status_code == 404
    assert artist_api.get(f"/api/v1/vgpus/{fleet_world.vgpu_b.pk}/").status_code == 404
    assert artist_api.get(f"/api/v1/artists/{fleet_world.bob.pk}/").status_code == 404


def test_signed_in_user_without_artist_record_reads_only_the_catalog(fleet_world):
    client = APIClient()
    client.force_authenticate(UserFactory(username="visitor"))
    assert client.get("/api/v1/gpu-models/").json()["count"] == GpuModel.objects.count()
    assert client.get("/api/v1/vgpu-profiles/").json()["count"] == VgpuProfile.objects.count()
    for route in ["hosts", "gpus", "artists", "vms", "vgpus"]:
        body = client.get(f"/api/v1/{route}/").json()
        assert body["count"] == 0, route
        assert body["results"] == []

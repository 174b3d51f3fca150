"""What a script author uses to read the inventory without a lookup per id: filters that take a
name as well as an id, and `?expand=` for related objects as `{id, url, display}`."""

import pytest

from fleet import services
from fleet.tests.factories import ArtistFactory, GpuFactory, HostFactory, VirtualMachineFactory, gpu_model, profile


@pytest.fixture
def named(db):
    l40s_host = HostFactory(name="gpu-node-01")
    rtx_host = HostFactory(name="render-01")
    l40s = GpuFactory(host=l40s_host, gpu_model=gpu_model("NVIDIA L40S"), pci_bus_id="00000000:3B:00.0")
    rtx = GpuFactory(host=rtx_host, pci_bus_id="00000000:3B:00.0")
    ana = ArtistFactory(name="Ana Artist")
    vm = VirtualMachineFactory(name="ws-ana", artist=ana)
    vgpu = services.place_vgpu(vm, l40s, profile("L40S-12Q"))
    services.place_vgpu(VirtualMachineFactory(name="ws-other"), rtx, profile("RTX6000-12Q"))
    return l40s_host, l40s, rtx, ana, vm, vgpu


def _ids(response):
    assert response.status_code == 200, response.content[:300]
    return [row["id"] for row in response.json()["results"]]


def test_a_host_filter_takes_a_name_or_an_id(admin_api, named):
    host, l40s, *_ = named

    by_name = _ids(admin_api.get("/api/v1/gpus/", {"host": "gpu-node-01"}))
    by_id = _ids(admin_api.get("/api/v1/gpus/", {"host": host.pk}))

    assert by_name == by_id == [l40s.pk]


@pytest.mark.parametrize(("url", "params"), [
    ("/api/v1/gpus/", {"gpu_model": "L40S"}),
    ("/api/v1/gpus/", {"gpu_model": "NVIDIA L40S"}),
    ("/api/v1/vgpus/", {"profile": "L40S-12Q"}),
    ("/api/v1/vgpus/", {"host": "gpu-node-01"}),
    ("/api/v1/vms/", {"artist": "Ana Artist"}),
    ("/api/v1/vms/", {"host": "gpu-node-01"}),
    ("/api/v1/suggestions/", {"host": "gpu-node-01", "dismissed": "all"}),
])
def test_filters_by_name_find_the_same_rows_as_by_id(admin_api, named, url, params):
    rows = admin_api.get(url, params)

    assert rows.status_code == 200, rows.content[:300]
    assert rows.json()["count"] <= 1
    if url != "/api/v1/suggestions/":
        assert rows.json()["count"] == 1


def test_profiles_of_a_gpu_model_by_its_code(admin_api, named):
    names = {row["name"] for row in admin_api.get("/api/v1/vgpu-profiles/", {"gpu_model": "L40S", "limit": 500})
             .json()["results"]}

    assert "L40S-12Q" in names
    assert not any(name.startswith("RTX6000") for name in names)


def test_a_name_that_matches_nothing_is_a_400_naming_it(admin_api, named):
    response = admin_api.get("/api/v1/gpus/", {"host": "gpu-node-99"})

    assert response.status_code == 400
    assert "'gpu-node-99'" in response.json()["host"][0]


def test_an_artist_cannot_reach_other_hosts_by_name(artist_api, artist, named):
    """Names are looked up among what the caller may see, as ids are."""
    response = artist_api.get("/api/v1/vms/", {"host": "render-01"})

    assert response.status_code == 400


def test_ids_stay_ids_without_expand(admin_api, named):
    _, l40s, *_ = named

    row = admin_api.get(f"/api/v1/gpus/{l40s.pk}/").json()

    assert row["host"] == l40s.host_id
    assert row["gpu_model"] == l40s.gpu_model_id


def test_expand_reads_related_objects_as_id_url_and_display(admin_api, named):
    host, l40s, _, _, vm, vgpu = named

    gpu = admin_api.get(f"/api/v1/gpus/{l40s.pk}/", {"expand": "host"}).json()
    placed = admin_api.get("/api/v1/vgpus/", {"expand": "all", "host": "gpu-node-01"}).json()["results"][0]

    assert gpu["host"] == {"id": host.pk, "url": f"http://testserver/api/v1/hosts/{host.pk}/",
                           "display": "gpu-node-01"}
    assert gpu["gpu_model"] == l40s.gpu_model_id, "only what was named is expanded"
    assert placed["vm"]["display"] == "ws-ana"
    assert placed["profile"]["display"] == "L40S-12Q"
    assert placed["gpu"]["url"] == f"http://testserver/api/v1/gpus/{l40s.pk}/"
    assert placed["gpu"]["display"] == "gpu-node-01 00000000:3B:00.0 (NVIDIA L40S)"
    assert vm.pk == placed["vm"]["id"]


def test_expand_keeps_a_null_relation_null(admin_api, named):
    VirtualMachineFactory(name="ws-unplaced", artist=None)

    row = admin_api.get("/api/v1/vms/", {"expand": "host,artist", "name": "ws-unplaced"}).json()["results"][0]

    assert row["host"] is None
    assert row["artist"] is None


def test_expand_of_an_unknown_field_is_a_400_listing_the_others(admin_api, named):
    response = admin_api.get("/api/v1/gpus/", {"expand": "hots"})

    assert response.status_code == 400
    assert "'hots'" in response.json()["expand"][0]
    assert "host, gpu_model" in response.json()["expand"][0]


def test_an_expanded_list_costs_the_queries_of_a_plain_one(admin_api, named, django_assert_max_num_queries):
    for n in range(5):
        GpuFactory(host=named[0], pci_bus_id=f"00000000:{0x40 + n:02X}:00.0")
    admin_api.get("/api/v1/gpus/")  # sessions, permissions: warmed once
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    with CaptureQueriesContext(connection) as plain:
        admin_api.get("/api/v1/gpus/", {"ordering": "id"})
    with django_assert_max_num_queries(len(plain.captured_queries)):
        admin_api.get("/api/v1/gpus/", {"expand": "all"})


def test_expand_is_documented_in_the_schema(admin_api):
    schema = admin_api.get("/api/schema/", HTTP_ACCEPT="application/vnd.oai.openapi+json").json()

    gpu_list = {p["name"]: p for p in schema["paths"]["/api/v1/gpus/"]["get"]["parameters"]}
    host_list = {p["name"] for p in schema["paths"]["/api/v1/hosts/"]["get"]["parameters"]}
    assert "host, gpu_model" in gpu_list["expand"]["description"]
    assert "expand" in {p["name"] for p in schema["paths"]["/api/v1/gpus/{id}/"]["get"]["parameters"]}
    assert "expand" not in host_list, "hosts have no related object to expand"


def test_a_gpu_is_named_by_its_uuid_and_a_wrong_one_is_a_400(admin_api, named):
    _, l40s, *_ = named

    by_uuid = admin_api.get("/api/v1/vgpus/", {"gpu": l40s.uuid})

    assert [row["gpu"] for row in by_uuid.json()["results"]] == [l40s.pk]
    for value in ("0", "abc", "nan"):
        assert admin_api.get("/api/v1/vgpus/", {"gpu": value, "format": "csv"}).status_code == 400, value

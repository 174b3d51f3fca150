"""Lists of the inventory API: page shape and size, filters, ordering, annotated figures, and
the number of queries a list costs (the same for 3 rows as for 30)."""

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from fleet import services
from fleet.models import Artist, GpuModel, VgpuProfile
from fleet.tests.factories import ArtistFactory, GpuFactory, HostFactory, VirtualMachineFactory, gpu_model, profile

ROUTES = ["gpu-models", "vgpu-profiles", "hosts", "gpus", "artists", "vms", "vgpus"]


def results(response) -> list[dict]:
    assert response.status_code == 200, response.content
    return response.json()["results"]


def names(response, key="name") -> list:
    return [row[key] for row in results(response)]


# Pagination -----------------------------------------------------------------------------


def test_page_shape_and_links(admin_api, db):
    ArtistFactory.create_batch(5)
    first = admin_api.get("/api/v1/artists/", {"limit": 2}).json()
    assert set(first) == {"count", "next", "previous", "results"}
    assert first["count"] == 5
    assert len(first["results"]) == 2
    assert first["previous"] is None
    assert "limit=2" in first["next"]
    assert "offset=2" in first["next"]
    last = admin_api.get("/api/v1/artists/", {"limit": 2, "offset": 4}).json()
    assert last["next"] is None
    assert len(last["results"]) == 1
    every_row = first["results"] + admin_api.get(first["next"]).json()["results"] + last["results"]
    assert sorted(row["id"] for row in every_row) == sorted(Artist.objects.values_list("id", flat=True))


def test_default_page_is_50_rows(admin_api, db):
    body = admin_api.get("/api/v1/vgpu-profiles/").json()
    assert body["count"] == VgpuProfile.objects.count() > 50
    assert len(body["results"]) == 50


def test_page_size_is_capped_at_500(admin_api, db):
    Artist.objects.bulk_create(Artist(name=f"Artist {n:04d}") for n in range(510))
    body = admin_api.get("/api/v1/artists/", {"limit": 10_000}).json()
    assert body["count"] == 510
    assert len(body["results"]) == 500
    assert body["next"] is not None


# Filters --------------------------------------------------------------------------------


def test_gpus_filter_by_uuid_host_model_and_modes(admin_api, db):
    host = HostFactory(name="render-01")
    rtx = GpuFactory(host=host, uuid="GPU-aaaa")
    l40s = GpuFactory(host=host, uuid="GPU-bbbb", gpu_model=gpu_model("NVIDIA L40S"), size_mode="mixed")
    passthrough = GpuFactory(uuid="GPU-cccc", mode="passthrough")

    assert names(admin_api.get("/api/v1/gpus/", {"uuid": "GPU-bbbb"}), "id") == [l40s.pk]
    assert names(admin_api.get("/api/v1/gpus/", {"uuid": "GPU-zzzz"}), "id") == []
    assert names(admin_api.get("/api/v1/gpus/", {"host": host.pk}), "id") == [rtx.pk, l40s.pk]
    assert names(admin_api.get("/api/v1/gpus/", {"gpu_model": l40s.gpu_model_id}), "id") == [l40s.pk]
    assert names(admin_api.get("/api/v1/gpus/", {"mode": "passthrough"}), "id") == [passthrough.pk]
    assert names(admin_api.get("/api/v1/gpus/", {"size_mode": "mixed"}), "id") == [l40s.pk]


@pytest.mark.parametrize(
    ("route", "params"),
    [
        ("gpus", {"mode": "sli"}),
        ("gpus", {"host": 999_999}),
        ("hosts", {"hypervisor": "vbox"}),
        ("vgpu-profiles", {"series": "Z"}),
        ("vms", {"artist": "ana"}),
    ],
)
def test_unknown_filter_values_are_400(admin_api, db, route, params):
    response = admin_api.get(f"/api/v1/{route}/", params)
    assert response.status_code == 400
    assert set(params) <= set(response.json())


def test_vms_filter_by_name_host_and_artist(admin_api, fleet_world):
    VirtualMachineFactory(name="WS-ANA-SPARE", artist=fleet_world.ana)

    assert names(admin_api.get("/api/v1/vms/", {"name": "ana"})) == ["WS-ANA-SPARE", "ws-ana"]
    assert names(admin_api.get("/api/v1/vms/", {"host": fleet_world.host_b.pk})) == ["ws-bob"]
    assert names(admin_api.get("/api/v1/vms/", {"artist": fleet_world.bob.pk})) == ["ws-bob"]
    assert names(admin_api.get("/api/v1/vms/", {"unplaced": "true"})) == ["WS-ANA-SPARE"]


def test_vgpus_filter_by_vm_gpu_profile_and_host(admin_api, fleet_world):
    w = fleet_world
    extra = services.place_vgpu(VirtualMachineFactory(), w.gpu_b, w.profile_12q)

    assert names(admin_api.get("/api/v1/vgpus/", {"host": w.host_b.pk}), "id") == [w.vgpu_b.pk, extra.pk]
    assert names(admin_api.get("/api/v1/vgpus/", {"vm": w.vm_a.pk}), "id") == [w.vgpu_a.pk]
    assert names(admin_api.get("/api/v1/vgpus/", {"gpu": w.gpu_a.pk}), "id") == [w.vgpu_a.pk]
    assert len(results(admin_api.get("/api/v1/vgpus/", {"profile": w.profile_12q.pk}))) == 3
    assert results(admin_api.get("/api/v1/vgpus/", {"profile": profile("RTX6000-24Q").pk})) == []


def test_profiles_filter_by_model_and_series(admin_api, db):
    a40 = gpu_model("NVIDIA A40")
    shown = names(admin_api.get("/api/v1/vgpu-profiles/", {"gpu_model": a40.pk, "series": "B"}))
    assert shown == ["A40-2B", "A40-1B"]
    small = names(admin_api.get("/api/v1/vgpu-profiles/", {"gpu_model": a40.pk, "fb_mib__lte": 2048}))
    assert set(small) == {"A40-2Q", "A40-2B", "A40-1Q", "A40-1B"}


def test_hosts_filter_by_name_and_hypervisor(admin_api, db):
    HostFactory(name="render-01", hypervisor="esxi")
    HostFactory(name="render-02")
    HostFactory(name="edit-01")
    assert names(admin_api.get("/api/v1/hosts/", {"name": "RENDER"})) == ["render-01", "render-02"]
    assert names(admin_api.get("/api/v1/hosts/", {"hypervisor": "esxi"})) == ["render-01"]


def test_filters_cannot_widen_an_artists_view(artist_api, fleet_world):
    """Naming Bob's host or VM in a filter is refused exactly like naming one that does not exist,
    so Ana learns nothing about Bob's objects; her own still filter."""
    for route, params in [("vms", {"host": fleet_world.host_b.pk}), ("vgpus", {"vm": fleet_world.vm_b.pk}),
                          ("vms", {"artist": fleet_world.bob.pk}), ("artists", {"user": fleet_world.bob.user_id})]:
        response = artist_api.get(f"/api/v1/{route}/", params)
        missing = artist_api.get(f"/api/v1/{route}/", dict.fromkeys(params, 999_999))
        assert response.status_code == missing.status_code == 400
        # The same words, but for the value asked for (echoed back so a script sees which one).
        (value,) = params.values()
        assert str(response.json()).replace(f"'{value}'", "'?'") == str(missing.json()).replace("'999999'", "'?'")
    assert results(artist_api.get("/api/v1/gpus/", {"uuid": fleet_world.gpu_b.uuid})) == []
    assert names(artist_api.get("/api/v1/vms/", {"host": fleet_world.host_a.pk})) == ["ws-ana"]


def test_browsable_filter_form_lists_only_the_artists_own_objects(artist_api, fleet_world):
    html = artist_api.get("/api/v1/vms/", HTTP_ACCEPT="text/html").content.decode()
    assert "host-a" in html
    assert "host-b" not in html
    assert "Bob Artist" not in html


# Ordering and figures -------------------------------------------------------------------


def test_default_orders(admin_api, fleet_world):
    assert names(admin_api.get("/api/v1/hosts/")) == ["host-a", "host-b"]
    assert names(admin_api.get("/api/v1/vms/")) == ["ws-ana", "ws-bob"]
    assert names(admin_api.get("/api/v1/artists/")) == ["Ana Artist", "Bob Artist"]
    rtx = names(admin_api.get("/api/v1/vgpu-profiles/", {"gpu_model": gpu_model().pk}))
    assert rtx[:3] == ["RTX6000-24Q", "RTX6000-12Q", "RTX6000-8Q"]


def test_ordering_by_annotated_figures(admin_api, db):
    busy = HostFactory(name="busy")
    quiet = HostFactory(name="quiet")
    for _ in range(3):
        GpuFactory(host=busy)
    GpuFactory(host=quiet)
    assert names(admin_api.get("/api/v1/hosts/", {"ordering": "-gpu_count"})) == ["busy", "quiet"]
    assert names(admin_api.get("/api/v1/hosts/", {"ordering": "gpu_count"})) == ["quiet", "busy"]


def test_ordering_ties_break_by_id(admin_api, db):
    hosts = [HostFactory(name=name, cpu_threads=64) for name in ("c", "a", "b")]
    shown = names(admin_api.get("/api/v1/hosts/", {"ordering": "-cpu_threads"}), "id")
    assert shown == [host.pk for host in hosts]


def test_ordering_ignores_fields_not_offered(admin_api, db):
    HostFactory(name="b-host", cpu_model="x")
    HostFactory(name="a-host", cpu_model="y")
    assert names(admin_api.get("/api/v1/hosts/", {"ordering": "-cpu_model"})) == ["a-host", "b-host"]


def test_host_figures_count_each_vm_and_gpu_once(admin_api, db):
    """Two GPUs and two VMs on one host: a join of both would double every figure."""
    host = HostFactory(name="render-01")
    first, second = GpuFactory(host=host), GpuFactory(host=host)
    services.place_vgpu(VirtualMachineFactory(vcpus=8, ram_gib=32), first, profile("RTX6000-12Q"))
    services.place_vgpu(VirtualMachineFactory(vcpus=12, ram_gib=64), second, profile("RTX6000-8Q"))
    services.place_vgpu(VirtualMachineFactory(vcpus=4, ram_gib=16), second, profile("RTX6000-8Q"))

    shown = admin_api.get(f"/api/v1/hosts/{host.pk}/").json()
    listed = results(admin_api.get("/api/v1/hosts/"))[0]

    assert shown == listed
    assert (shown["allocated_vcpus"], shown["allocated_ram_gib"], shown["gpu_count"]) == (24, 112, 2)
    gpus = {row["id"]: row for row in results(admin_api.get("/api/v1/gpus/"))}
    assert (gpus[first.pk]["used_fb_mib"], gpus[first.pk]["vgpu_count"]) == (12288, 1)
    assert (gpus[second.pk]["used_fb_mib"], gpus[second.pk]["vgpu_count"]) == (16384, 2)


def test_gpu_detail_has_latest_and_list_does_not(admin_api, fleet_world):
    detail = admin_api.get(f"/api/v1/gpus/{fleet_world.gpu_a.pk}/").json()
    assert "latest" in detail
    assert detail["latest"] is None  # no telemetry collected yet
    assert "latest" not in results(admin_api.get("/api/v1/gpus/"))[0]


# Query counts ---------------------------------------------------------------------------


def grow_fleet(artist: Artist, count: int) -> None:
    """`count` more of everything: GPU models with a profile, and hosts each with a GPU and a VM
    of `artist` holding a vGPU (so the artist's lists grow too), plus an artist record."""
    q12 = profile("RTX6000-12Q")
    for _ in range(count):
        model = GpuModel.objects.create(name=f"Board {GpuModel.objects.count()}", code=f"B{GpuModel.objects.count()}",
                                        fb_mib=16384)
        VgpuProfile.objects.create(name=f"{model.code}-16Q", gpu_model=model, series="Q", fb_mib=16384,
                                   max_per_gpu=1)
        gpu = GpuFactory()
        services.place_vgpu(VirtualMachineFactory(artist=artist), gpu, q12)
        ArtistFactory()


def count_queries(client, url) -> tuple[int, int]:
    with CaptureQueriesContext(connection) as queries:
        response = client.get(url, {"limit": 500})
    assert response.status_code == 200
    return len(queries), len(response.json()["results"])


@pytest.mark.parametrize("route", ROUTES)
@pytest.mark.parametrize("role", ["staff", "artist"])
def test_list_queries_do_not_grow_with_rows(route, role, admin_api, artist_api, artist, django_assert_max_num_queries):
    client = admin_api if role == "staff" else artist_api
    url = f"/api/v1/{route}/"
    grow_fleet(artist, 3)
    few_queries, few_rows = count_queries(client, url)
    grow_fleet(artist, 27)

    with django_assert_max_num_queries(few_queries):
        response = client.get(url, {"limit": 500})

    many_rows = len(response.json()["results"])
    assert many_rows >= few_rows
    if not (role == "artist" and route == "artists"):  # an artist only ever sees their own record
        assert many_rows >= few_rows + 27
    # count + page (+ one prefetch of the VMs' vGPUs): nothing per row.
    assert few_queries <= 3

"""PCI bus ids in NVML's form: `0000:3b:00.0` and `00000000:3B:00.0` are one GPU, through the API
and the form (an agent's reading: telemetry/tests/test_ingest.py), and the migration that
rewrites existing rows refuses to merge two."""

import importlib

import pytest

from fleet.models import Gpu
from fleet.pci import InvalidPciBusId, normalize_pci_bus_id
from fleet.tests.factories import GpuFactory, HostFactory, gpu_model


@pytest.mark.parametrize(("given", "stored"), [
    ("00000000:3B:00.0", "00000000:3B:00.0"),
    ("0000:3b:00.0", "00000000:3B:00.0"),
    ("3b:00.0", "00000000:3B:00.0"),
    (" 0001:af:1f.7 ", "00000001:AF:1F.7"),
])
def test_spellings_of_one_bus_id_are_one(given, stored):
    assert normalize_pci_bus_id(given) == stored


@pytest.mark.parametrize("given", ["", "3B:00", "0000:3b:00.8", "0000:3b:20.0", "000000000:3b:00.0", "gpu0",
                                   "0000:3b:00.0x", "０000:3b:00.0"])
def test_what_is_no_bus_id_is_refused_with_an_example(given):
    with pytest.raises(InvalidPciBusId, match="00000000:3B:00.0"):
        normalize_pci_bus_id(given)


@pytest.fixture
def host(db):
    return HostFactory(name="render-01")


def post_gpu(admin_api, host, bus_id, **fields):
    return admin_api.post("/api/v1/gpus/", {"host": host.pk, "gpu_model": gpu_model().pk, "pci_bus_id": bus_id,
                                            **fields}, format="json")


def test_the_api_stores_the_nvml_form_and_refuses_a_second_spelling(admin_api, host):
    first = post_gpu(admin_api, host, "0000:3b:00.0")
    second = post_gpu(admin_api, host, "00000000:3B:00.0")

    assert first.status_code == 201, first.content
    assert first.json()["pci_bus_id"] == "00000000:3B:00.0"
    assert second.status_code == 400
    assert "non_field_errors" in second.json() or "pci_bus_id" in second.json()
    assert Gpu.objects.count() == 1


def test_the_api_refuses_what_is_no_bus_id_naming_the_field(admin_api, host):
    response = post_gpu(admin_api, host, "slot 3")

    assert response.status_code == 400
    assert "is not a PCI bus id" in response.json()["pci_bus_id"][0]


def test_a_filter_finds_the_gpu_by_any_spelling(admin_api, host):
    gpu = GpuFactory(host=host, pci_bus_id="0000:3b:00.0")

    found = admin_api.get("/api/v1/gpus/", {"pci_bus_id": "3b:00.0"}).json()["results"]

    assert [row["id"] for row in found] == [gpu.pk]
    assert admin_api.get("/api/v1/gpus/", {"pci_bus_id": "nonsense"}).status_code == 400


def test_the_admin_form_reads_a_second_spelling_as_the_same_gpu(host):
    from fleet.forms import GpuForm

    GpuFactory(host=host, pci_bus_id="00000000:3B:00.0")
    form = GpuForm(data={"host": host.pk, "gpu_model": gpu_model().pk, "pci_bus_id": "0000:3b:00.0",
                         "uuid": "", "mode": "vgpu", "size_mode": "equal"})

    assert not form.is_valid()
    assert "already exists" in str(form.errors)


def test_the_migration_refuses_to_merge_two_gpus_and_names_them():
    migration = importlib.import_module("fleet.migrations.0007_gpu_pci_bus_id_normalised")

    merged = migration.collisions([(1, "render-01", "0000:3b:00.0"), (2, "render-01", "00000000:3B:00.0"),
                                   (3, "render-02", "0000:3b:00.0"), (4, "render-01", "garbage")])

    assert merged == ["host render-01: GPUs 1 (0000:3b:00.0), 2 (00000000:3B:00.0) are all 00000000:3B:00.0"]


def test_the_migration_rewrites_existing_rows_and_stops_before_a_merge(host):
    from django.apps import apps

    migration = importlib.import_module("fleet.migrations.0007_gpu_pci_bus_id_normalised")
    gpu = GpuFactory(host=host)
    other = GpuFactory(host=host)
    Gpu.objects.filter(pk=gpu.pk).update(pci_bus_id="0000:5e:00.0")  # as stored before normalising

    migration.normalise(apps, None)
    gpu.refresh_from_db()
    assert gpu.pci_bus_id == "00000000:5E:00.0"

    Gpu.objects.filter(pk=other.pk).update(pci_bus_id="5e:00.0")
    with pytest.raises(RuntimeError, match="render-01: GPUs"):
        migration.normalise(apps, None)
    other.refresh_from_db()
    assert other.pci_bus_id == "5e:00.0", "nothing changed"

"""A POST of a JSON list to `gpus/` or `vms/` creates every object or none, through the same path as
a single POST (the serializer, fleet.services and the audit log); errors come back by position."""

import pytest

from fleet.models import AuditEvent, Gpu, VirtualMachine
from fleet.tests.factories import HostFactory, gpu_model


@pytest.fixture
def host(db):
    return HostFactory(name="render-01")


def gpu(host, bus_id, **fields):
    return {"host": host.pk, "gpu_model": gpu_model().pk, "pci_bus_id": bus_id, **fields}


def test_a_list_of_gpus_is_created_in_one_post(admin_api, host):
    response = admin_api.post("/api/v1/gpus/", [gpu(host, "0000:3b:00.0"), gpu(host, "0000:5e:00.0")], format="json")

    assert response.status_code == 201, response.content
    assert [row["pci_bus_id"] for row in response.json()] == ["00000000:3B:00.0", "00000000:5E:00.0"]
    assert Gpu.objects.filter(host=host).count() == 2
    assert AuditEvent.objects.filter(action="gpu.create").count() == 2, "each one audited as a single create"


def test_one_bad_item_writes_nothing_and_is_named_by_position(admin_api, host):
    response = admin_api.post("/api/v1/gpus/", [
        gpu(host, "0000:3b:00.0"), gpu(host, "slot three"), gpu(host, "0000:af:00.0"),
    ], format="json")

    assert response.status_code == 400
    errors = response.json()
    assert errors[0] == errors[2] == {}
    assert "is not a PCI bus id" in errors[1]["pci_bus_id"][0]
    assert not Gpu.objects.exists()
    assert not AuditEvent.objects.exists()


def test_the_same_gpu_twice_in_one_list_is_refused_at_the_second(admin_api, host):
    response = admin_api.post("/api/v1/gpus/", [gpu(host, "0000:3b:00.0"), gpu(host, "00000000:3B:00.0")],
                              format="json")

    assert response.status_code == 400
    errors = response.json()
    assert errors[0] == {}
    assert errors[1], "the second spelling of one bus id is the same GPU"
    assert not Gpu.objects.exists()


def test_a_rule_refusal_inside_a_list_is_the_rules_body_at_its_position(admin_api, host):
    """A GPU model without mixed-size support refuses size_mode=mixed (a placement rule)."""
    response = admin_api.post("/api/v1/gpus/", [gpu(host, "0000:3b:00.0"),
                                                gpu(host, "0000:5e:00.0", size_mode="mixed")], format="json")

    assert response.status_code == 400
    refused = response.json()[1]
    assert refused["violations"][0]["rule"] == "size_mode_unsupported"
    assert not Gpu.objects.exists()


def test_a_list_of_vms_is_created_in_one_post(admin_api, db):
    response = admin_api.post("/api/v1/vms/", [{"name": f"ws-{n}", "vcpus": 8, "ram_gib": 32} for n in range(3)],
                              format="json")

    assert response.status_code == 201, response.content
    assert [row["name"] for row in response.json()] == ["ws-0", "ws-1", "ws-2"]
    assert [row["host"] for row in response.json()] == [None, None, None]
    assert AuditEvent.objects.filter(action="vm.create").count() == 3


def test_a_vm_name_given_twice_writes_no_vm(admin_api, db):
    response = admin_api.post("/api/v1/vms/", [{"name": "ws-a", "vcpus": 8, "ram_gib": 32},
                                               {"name": "ws-a", "vcpus": 0, "ram_gib": 32}], format="json")

    assert response.status_code == 400
    errors = response.json()
    assert errors[0] == {}
    assert set(errors[1]) == {"name", "vcpus"}
    assert not VirtualMachine.objects.exists()


def test_an_empty_list_and_other_resources_refuse_a_list(admin_api, artist_api, host):
    assert admin_api.post("/api/v1/vms/", [], format="json").status_code == 400
    hosts = admin_api.post("/api/v1/hosts/", [{"name": "x", "cpu_threads": 8, "ram_gib": 8}], format="json")
    assert hosts.status_code == 400
    assert artist_api.post("/api/v1/vms/", [{"name": "ws-x", "vcpus": 8, "ram_gib": 32}],
                           format="json").status_code == 403

"""Sync end to end: a simulated hypervisor seeded from the inventory, changed as an admin would
change a host behind the product's back, read, compared and applied through the real API."""

import pytest
from django.utils import timezone

from fleet.models import AuditEvent, Vgpu, VirtualMachine
from fleet.tests.factories import VirtualMachineFactory, profile
from hypervisors.models import SyncReport
from hypervisors.tests.fixtures import BUS_A, BUS_B
from telemetry.models import VgpuSample

pytestmark = pytest.mark.django_db


def sync(client, host, body=None):
    return client.post(f"/api/v1/hosts/{host.pk}/sync/", body or {}, format="json")


def entry(answer, name):
    return next(e for e in answer.json()["report"]["entries"] if e["name"] == name)


def test_a_seeded_hypervisor_is_in_step(admin_api, linked):
    answer = sync(admin_api, linked.host)
    assert answer.status_code == 200
    report = answer.json()["report"]
    assert report["ok"] is True
    assert report["summary"] == {"new": 0, "changed": 0, "gone": 0, "elsewhere": 0, "same": 2}
    # Seeding gave every vGPU its device id, and the hypervisor has the same ones.
    assert all(Vgpu.objects.values_list("device_id", flat=True))
    devices = {d.id for d in linked.sim.vgpu_devices()}
    assert set(Vgpu.objects.values_list("device_id", flat=True)) == devices

    last = admin_api.get(f"/api/v1/hosts/{linked.host.pk}/sync/")
    assert last.status_code == 200
    assert last.json()["id"] == report["id"]
    assert last.json()["requested_by"] == "admin"


def test_a_new_domain_is_listed_and_applied_with_its_vgpu(admin_api, linked):
    device = linked.sim.create_vgpu(BUS_A, "NVIDIA RTX6000-12Q")
    domain = linked.sim.define_domain("ws-new", vcpus=4, ram_mib=16384, vgpus=(device,), running=True)
    other = linked.sim.define_domain("ws-other", vcpus=2, ram_mib=8192)

    answer = sync(admin_api, linked.host)
    new = entry(answer, "ws-new")
    assert new["kind"] == "new"
    assert new["appliable"] is True
    assert new["vgpus"][0]["profile"] == "RTX6000-12Q"
    assert VirtualMachine.objects.filter(name="ws-new").count() == 0  # reading applies nothing

    answer = sync(admin_api, linked.host, {"apply": [domain.uuid]})
    assert answer.status_code == 200
    [outcome] = answer.json()["applied"]
    assert outcome["ok"] is True, outcome
    vm = VirtualMachine.objects.get(name="ws-new")
    assert (str(vm.uuid), vm.vcpus, vm.ram_gib, vm.host) == (domain.uuid, 4, 16, linked.host)
    [vgpu] = vm.vgpus.select_related("profile", "gpu")
    assert (vgpu.profile.name, vgpu.gpu, vgpu.device_id) == ("RTX6000-12Q", linked.gpu_a, device.id)
    assert not VirtualMachine.objects.filter(uuid=other.uuid).exists()  # not chosen, not created
    assert AuditEvent.objects.filter(action="vm.create", object_id=str(vm.pk)).exists()
    assert AuditEvent.objects.filter(action="vgpu.place", object_repr__contains="ws-new").exists()

    again = sync(admin_api, linked.host).json()["report"]
    assert again["summary"]["new"] == 1  # ws-other only
    assert again["summary"]["same"] == 3


def test_a_gone_vm_is_listed_and_never_deleted(admin_api, linked):
    linked.sim.power_off(str(linked.vm_b.uuid))
    linked.sim.undefine(str(linked.vm_b.uuid))
    answer = sync(admin_api, linked.host, {"apply": "all"})
    gone = entry(answer, "ws-b")
    assert gone["kind"] == "gone"
    assert gone["appliable"] is False
    assert answer.json()["applied"] == []
    assert VirtualMachine.objects.filter(pk=linked.vm_b.pk, host=linked.host).exists()
    assert Vgpu.objects.filter(vm=linked.vm_b).count() == 1

    refused = sync(admin_api, linked.host, {"apply": [str(linked.vm_b.uuid)]})
    assert refused.status_code == 200
    assert refused.json()["applied"][0]["ok"] is False
    assert "gone" in refused.json()["applied"][0]["messages"][0]
    assert VirtualMachine.objects.filter(pk=linked.vm_b.pk).exists()


def test_changed_ram_and_vcpus_are_applied_through_the_capacity_rules(admin_api, linked):
    linked.sim.change_domain(str(linked.vm_a.uuid), ram_mib=65536, vcpus=16)
    changed = entry(sync(admin_api, linked.host), "ws-a")
    assert changed["kind"] == "changed"
    assert {c["field"]: (c["inventory"], c["hypervisor"]) for c in changed["changes"]} == {
        "ram_gib": (32, 64), "vcpus": (8, 16)}

    answer = sync(admin_api, linked.host, {"apply": "all"})
    assert answer.json()["applied"][0]["ok"] is True
    linked.vm_a.refresh_from_db()
    assert (linked.vm_a.ram_gib, linked.vm_a.vcpus) == (64, 16)
    assert AuditEvent.objects.filter(action="vm.update", object_id=str(linked.vm_a.pk)).exists()

    linked.sim.change_domain(str(linked.vm_a.uuid), ram_mib=4096 * 1024)  # more than the host's 768 GiB
    answer = sync(admin_api, linked.host, {"apply": "all"})
    [outcome] = answer.json()["applied"]
    assert outcome["ok"] is False
    assert "RAM" in " ".join(outcome["messages"])
    linked.vm_a.refresh_from_db()
    assert linked.vm_a.ram_gib == 64


def test_a_vgpu_the_placement_rules_refuse_is_reported(admin_api, linked):
    # The inventory gave the first GPU's last 12Q slot to ws-c, which the host does not run;
    # on the host, that slot went to ws-new. Applying ws-new creates the VM, and placement
    # refuses its vGPU (the GPU is full in the inventory).
    from fleet import services as fleet_services

    fleet_services.place_vgpu(VirtualMachineFactory(name="ws-c"), linked.gpu_a, profile("RTX6000-12Q"))
    device = linked.sim.create_vgpu(BUS_A, "NVIDIA RTX6000-12Q")
    domain = linked.sim.define_domain("ws-new", vcpus=4, ram_mib=16384, vgpus=(device,), running=True)

    answer = sync(admin_api, linked.host, {"apply": [domain.uuid]})
    [outcome] = answer.json()["applied"]
    assert outcome["ok"] is False
    refusal = next(m for m in outcome["messages"] if "refused" in m)
    assert BUS_A in refusal
    assert "RTX6000-12Q" in refusal
    vm = VirtualMachine.objects.get(name="ws-new")
    assert vm.vgpus.count() == 0
    assert vm.host == linked.host  # it runs there: on the host without a vGPU, as capacity allows
    assert entry(answer, "ws-c")["kind"] == "gone"


def test_a_vgpu_type_outside_the_catalog_is_reported(admin_api, linked):
    state = linked.sim._read()
    state["gpus"][1]["types"].append({"type_id": "nvidia-999", "name": "NVIDIA RTX9999-7Q", "max_instances": 1})
    linked.sim.seed(state)
    linked.sim.power_off(str(linked.vm_b.uuid))
    linked.sim.change_domain(str(linked.vm_b.uuid), vgpus=())
    linked.sim.remove_vgpu(next(d for d in linked.sim.vgpu_devices() if d.gpu_bus_id == BUS_B))
    device = linked.sim.create_vgpu(BUS_B, "NVIDIA RTX9999-7Q")
    domain = linked.sim.define_domain("ws-odd", vcpus=2, ram_mib=4096, vgpus=(device,))

    answer = sync(admin_api, linked.host, {"apply": [domain.uuid]})
    assert "matches no profile" in " ".join(entry(answer, "ws-odd")["vgpu_notes"])
    changed = entry(answer, "ws-b")
    assert changed["kind"] == "changed"
    assert "1 vGPU(s) in the inventory, 0 on the hypervisor" in changed["vgpu_notes"]
    [outcome] = answer.json()["applied"]
    assert outcome["ok"] is False
    assert VirtualMachine.objects.filter(name="ws-odd", vgpus__isnull=True).exists()


def test_device_ids_are_filled_in_and_a_moved_device_is_noted(admin_api, linked):
    Vgpu.objects.filter(vm=linked.vm_a).update(device_id="")
    answer = sync(admin_api, linked.host)
    changed = entry(answer, "ws-a")
    assert changed["kind"] == "changed"
    assert changed["vgpu_notes"] == []
    [row] = changed["device_ids"]
    sync(admin_api, linked.host, {"apply": [str(linked.vm_a.uuid)]})
    assert Vgpu.objects.get(vm=linked.vm_a).device_id == row["device_id"]
    assert AuditEvent.objects.filter(action="vgpu.device").exists()


def test_the_device_the_agent_reads_joins_the_readings_by_device_id(admin_api, linked):
    recreated = "5c3b2a19-8f7e-4d6c-b5a4-93827160f5e4"  # the agent reads ws-a's vGPU as another mdev
    Vgpu.objects.filter(vm=linked.vm_a).update(reported_device_id=recreated)
    VgpuSample.objects.create(vm=linked.vm_a, gpu=linked.gpu_a, ts=timezone.now(), util_gpu=20)

    changed = entry(sync(admin_api, linked.host), "ws-a")

    assert changed["kind"] == "changed"
    assert changed["telemetry"][0]["device_ids"] == [recreated]
    assert changed["vgpu_notes"] == [f"the agent read device {recreated} of this VM on GPU {BUS_A} at "
                                     f"{changed['telemetry'][0]['last_seen']}, which the domain does not hold on "
                                     "the hypervisor"]


def test_a_domain_renamed_on_the_host_is_matched_by_uuid(admin_api, linked):
    linked.sim.change_domain(str(linked.vm_a.uuid), name="ws-a-renamed")
    changed = entry(sync(admin_api, linked.host), "ws-a-renamed")
    assert changed["kind"] == "changed"
    assert changed["changes"] == [{"field": "name", "inventory": "ws-a", "hypervisor": "ws-a-renamed"}]


def test_an_unreachable_hypervisor_is_a_failed_report(admin_api, linked):
    linked.sim.path.unlink()
    answer = sync(admin_api, linked.host, {"apply": "all"})
    assert answer.status_code == 502
    assert answer.json()["report"]["ok"] is False
    assert "node-01.json" in answer.json()["report"]["error"]
    status = admin_api.get(f"/api/v1/hosts/{linked.host.pk}/hypervisor/").json()["status"]
    assert status["ok"] is False


@pytest.mark.parametrize("body", [{"apply": "some"}, {"apply": ["not-a-uuid"]}, {"apply": []}, {"apply": 3},
                                  {"apply": "all", "force": True}])
def test_a_bad_apply_is_a_400_naming_the_field(admin_api, linked, body):
    answer = sync(admin_api, linked.host, body)
    assert answer.status_code == 400
    assert set(answer.json()) == {"force"} if "force" in body else {"apply"}
    assert not SyncReport.objects.exists()  # refused before the hypervisor was read


def test_applying_a_uuid_outside_the_diff_is_a_400(admin_api, linked):
    answer = sync(admin_api, linked.host, {"apply": ["00000000-0000-4000-8000-000000000000"]})
    assert answer.status_code == 400
    assert "00000000-0000-4000-8000-000000000000" in answer.json()["apply"][0]


def test_never_synced_is_a_404_that_says_so(admin_api, linked):
    answer = admin_api.get(f"/api/v1/hosts/{linked.host.pk}/sync/")
    assert answer.status_code == 404
    assert "never synced" in answer.json()["detail"]


def test_an_unlinked_host_is_a_409(admin_api, linked):
    linked.host.hypervisor_uri = ""
    linked.host.save()
    answer = sync(admin_api, linked.host)
    assert answer.status_code == 409
    assert "no hypervisor URI" in answer.json()["detail"]


def test_hypervisor_link_and_check(admin_api, linked):
    linked.host.hypervisor_secret_ref = "node-01-ssh-key"
    linked.host.save()
    url = f"/api/v1/hosts/{linked.host.pk}/hypervisor/"
    before = admin_api.get(url).json()
    assert before == {"host": linked.host.pk, "linked": True, "uri": "sim://node-01",
                      "secret_ref": "node-01-ssh-key", "status": None}
    checked = admin_api.post(url + "check/").json()
    assert checked["status"]["ok"] is True
    assert checked["status"]["hostname"] == "node-01"
    assert "Connected" in checked["status"]["message"]
    root = admin_api.get("/api/v1/").json()
    assert root["host-sync"].endswith("/api/v1/hosts/{id}/sync/")


@pytest.mark.parametrize(("method", "path"), [("get", "sync/"), ("post", "sync/"), ("get", "hypervisor/"),
                                              ("post", "hypervisor/check/")])
def test_only_admins_reach_the_hypervisor(api, artist_api, linked, method, path):
    url = f"/api/v1/hosts/{linked.host.pk}/{path}"
    assert getattr(artist_api, method)(url, {}, format="json").status_code == 403
    assert getattr(api, method)(url, {}, format="json").status_code in (401, 403)
    assert not SyncReport.objects.exists()

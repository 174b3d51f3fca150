"""gpus/{id}/scheduler/ and the host / GPU model defaults in the v1 API: the role matrix, field
messages on bad input, the generated commands, and what GET shows (source, reported, drift)."""

import pytest

from fleet import services
from fleet.models import AuditEvent, SchedulerPolicy
from fleet.tests.factories import GpuFactory, HostFactory, VirtualMachineFactory, profile

pytestmark = pytest.mark.django_db


@pytest.fixture
def gpu():
    return GpuFactory(host=HostFactory(name="sched-host", hypervisor="kvm"), pci_bus_id="00000000:86:00.0")


def routes(gpu):
    return [f"/api/v1/gpus/{gpu.pk}/scheduler/", f"/api/v1/hosts/{gpu.host_id}/scheduler/",
            f"/api/v1/gpu-models/{gpu.gpu_model_id}/scheduler/"]


def test_anonymous_gets_401_on_every_scheduler_route(api, gpu):
    for route in routes(gpu):
        assert api.get(route).status_code == 401
        assert api.put(route, {"policy": "best_effort"}).status_code == 401
    assert api.post(f"/api/v1/gpus/{gpu.pk}/scheduler/apply/").status_code == 401


def test_artist_gets_403_even_for_reading_their_own_gpu(artist_api, artist, gpu):
    services.place_vgpu(VirtualMachineFactory(artist=artist), gpu, profile("RTX6000-12Q"))
    for route in routes(gpu):
        response = artist_api.get(route)
        assert response.status_code == 403
        assert response.json()["detail"] == "Only fleet admins (staff) may see or change GPU scheduler policies."
        assert artist_api.put(route, {"policy": "best_effort"}).status_code == 403
        assert artist_api.delete(route).status_code == 403
    assert artist_api.post(f"/api/v1/gpus/{gpu.pk}/scheduler/apply/").status_code == 403
    assert not SchedulerPolicy.objects.exists()


def test_admin_reads_the_driver_default_with_its_commands(admin_api, gpu):
    body = admin_api.get(f"/api/v1/gpus/{gpu.pk}/scheduler/").json()
    assert body["source"] == "driver"
    assert body["desired"] == {"policy": "best_effort", "arr": False, "frequency_hz": None, "avg_factor": None,
                               "timeslice_ms": None}
    assert body["commands"]["runtime"] == "nvidia-smi vgpu -i 00000000:86:00.0 set-scheduler-state -p 1 -a 0"
    assert body["reported"] is None
    assert body["drift"] == []


def test_admin_puts_a_policy_and_gets_the_exact_commands(admin_api, gpu):
    response = admin_api.put(f"/api/v1/gpus/{gpu.pk}/scheduler/",
                             {"policy": "fixed_share", "arr": False, "timeslice_ms": 24}, format="json")
    assert response.status_code == 200
    body = response.json()
    assert (body["source"], body["apply_state"]) == ("gpu", "desired")
    assert body["commands"]["runtime"] == (
        "nvidia-smi vgpu -i 00000000:86:00.0 set-scheduler-state -p 3 -a 0 -ts 24000000")
    assert body["commands"]["rmpvmrl"] == "0x00180011"
    assert body["commands"]["persistent"] == [
        {"label": "/etc/modprobe.d/nvidia.conf (all GPUs of the host)",
         "line": 'options nvidia NVreg_RegistryDwords="RmPVMRL=0x00180011"'},
        {"label": "/etc/modprobe.d/nvidia.conf (this GPU only)",
         "line": 'options nvidia NVreg_RegistryDwordsPerDevice="pci=0000:86:00.0;RmPVMRL=0x00180011"'},
    ]
    event = AuditEvent.objects.get(action="scheduler_policy.update")
    assert (event.actor_name, event.source) == ("admin", "api")


def test_esxi_host_gets_the_esxcli_line(admin_api, gpu):
    gpu.host.hypervisor = "esxi"
    gpu.host.save()
    body = admin_api.put(f"/api/v1/gpus/{gpu.pk}/scheduler/", {"policy": "equal_share", "arr": True},
                         format="json").json()
    assert body["commands"]["persistent"] == [{
        "label": "ESXi (all GPUs of the host)",
        "line": 'esxcli system module parameters set -m nvidia -p "NVreg_RegistryDwords=RmPVMRL=0x01"'}]
    assert body["desired_with_defaults"] == {"policy": "equal_share", "arr": True, "frequency_hz": 480,
                                             "avg_factor": 33, "timeslice_ms": None}


def test_bad_input_is_a_400_with_field_messages_and_keeps_the_old_policy(admin_api, gpu):
    route = f"/api/v1/gpus/{gpu.pk}/scheduler/"
    admin_api.put(route, {"policy": "equal_share", "arr": True}, format="json")
    response = admin_api.put(route, {"policy": "equal_share", "arr": True, "frequency_hz": 1000, "timeslice_ms": 2},
                             format="json")
    assert response.status_code == 400
    assert response.json() == {
        "timeslice_ms": ["A time slice applies only with adaptive round-robin off; with ARR the scheduling "
                         "frequency sets the slice."],
        "frequency_hz": ["The scheduling frequency must be 63-960 Hz, not 1000."],
    }
    response = admin_api.put(route, {"policy": "round_robin"}, format="json")
    assert response.status_code == 400
    assert "policy" in response.json()
    assert SchedulerPolicy.objects.get(gpu=gpu).frequency_hz is None
    assert AuditEvent.objects.filter(action="scheduler_policy.update").count() == 1


def test_put_on_a_gpu_with_vgpus_is_staged(admin_api, gpu):
    services.place_vgpu(VirtualMachineFactory(), gpu, profile("RTX6000-12Q"))
    body = admin_api.put(f"/api/v1/gpus/{gpu.pk}/scheduler/", {"policy": "equal_share", "arr": True},
                         format="json").json()
    assert body["apply_state"] == "staged"
    assert body["apply_detail"] == "the GPU holds 1 vGPU; staged until it is empty or the driver reloads"


def test_get_flags_drift_against_the_agents_reading(admin_api, gpu):
    gpu.scheduler_reported = {"policy": "best_effort", "arr_mode": "default", "avg_factor": None,
                              "timeslice_ms": None, "frequency_hz": None}
    gpu.save()
    admin_api.put(f"/api/v1/gpus/{gpu.pk}/scheduler/",
                  {"policy": "equal_share", "arr": True, "frequency_hz": 960}, format="json")
    body = admin_api.get(f"/api/v1/gpus/{gpu.pk}/scheduler/").json()
    assert body["reported"]["policy"] == "best_effort"
    assert body["drift"] == ["policy", "arr", "frequency_hz"]


def test_host_and_model_defaults_are_set_read_and_deleted(admin_api, gpu):
    host_route, model_route = routes(gpu)[1:]
    assert admin_api.get(host_route).json()["policy"] is None
    response = admin_api.put(model_route, {"policy": "equal_share", "arr": True}, format="json")
    assert response.status_code == 200
    assert response.json()["policy"]["policy"] == "equal_share"
    assert admin_api.get(f"/api/v1/gpus/{gpu.pk}/scheduler/").json()["source"] == "gpu_model"
    response = admin_api.put(host_route, {"policy": "best_effort", "arr": True}, format="json")
    assert response.status_code == 400
    assert response.json() == {"arr": ["Adaptive round-robin applies only to equal share and fixed share, "
                                       "not to best effort."]}
    assert admin_api.delete(model_route).json()["policy"] is None
    assert admin_api.get(f"/api/v1/gpus/{gpu.pk}/scheduler/").json()["source"] == "driver"


def test_apply_without_an_agent_is_a_409_with_the_reason(admin_api, gpu):
    response = admin_api.post(f"/api/v1/gpus/{gpu.pk}/scheduler/apply/")
    assert response.status_code == 409
    assert response.json() == {"detail": "No enabled fleet agent polls host sched-host; apply the commands by hand."}


def test_unknown_gpu_is_404(admin_api, db):
    assert admin_api.get("/api/v1/gpus/999999/scheduler/").status_code == 404


@pytest.mark.parametrize(("body", "expected"), [
    ({"policy": "round_robin"}, {"policy": ['"round_robin" is not a valid choice.']}),
    ({"arr": True}, {"policy": ["This field is required."]}),
    ({"policy": "equal_share", "arr": True, "frequency_hz": "fast"},
     {"frequency_hz": ["A valid integer is required."]}),
    ({"policy": "best_effort", "arr": True},
     {"arr": ["Adaptive round-robin applies only to equal share and fixed share, not to best effort."]}),
    ({"policy": "best_effort", "timeslice_ms": 2},
     {"timeslice_ms": ["A time slice applies only to equal share and fixed share, not to best effort."]}),
    ({"policy": "equal_share", "frequency_hz": 480},
     {"frequency_hz": ["The scheduling frequency applies only with adaptive round-robin on."]}),
    ({"policy": "equal_share", "avg_factor": 33},
     {"avg_factor": ["The averaging factor applies only with adaptive round-robin on."]}),
    ({"policy": "fixed_share", "arr": True, "timeslice_ms": 2},
     {"timeslice_ms": ["A time slice applies only with adaptive round-robin off; with ARR the scheduling frequency "
                       "sets the slice."]}),
    ({"policy": "equal_share", "arr": True, "frequency_hz": 62},
     {"frequency_hz": ["The scheduling frequency must be 63-960 Hz, not 62."]}),
    ({"policy": "equal_share", "arr": True, "avg_factor": 61},
     {"avg_factor": ["The averaging factor must be 1-60, not 61."]}),
    ({"policy": "fixed_share", "timeslice_ms": 31}, {"timeslice_ms": ["The time slice must be 1-30 ms, not 31."]}),
])
def test_every_rule_answers_400_with_its_message(admin_api, gpu, body, expected):
    for route in routes(gpu):
        response = admin_api.put(route, body, format="json")
        assert (response.status_code, response.json()) == (400, expected), route
    assert not SchedulerPolicy.objects.exists()


def test_fixed_share_on_a_mixed_size_gpu_and_a_passthrough_gpu_are_400_with_the_reason(admin_api, gpu):
    gpu.size_mode = "mixed"
    gpu.save()
    response = admin_api.put(f"/api/v1/gpus/{gpu.pk}/scheduler/", {"policy": "fixed_share", "arr": True},
                             format="json")
    assert (response.status_code, response.json()) == (400, {"policy": [
        "Fixed share is impossible in mixed-size mode: it gives each vGPU 1/(its type's max count), which needs "
        "vGPUs of one size. Use equal share, or switch the GPU to equal-size mode."]})
    passthrough = GpuFactory(host=gpu.host, mode="passthrough", pci_bus_id="00000000:87:00.0")
    response = admin_api.put(f"/api/v1/gpus/{passthrough.pk}/scheduler/", {"policy": "equal_share"}, format="json")
    assert (response.status_code, response.json()) == (400, {"policy": [
        "The GPU is in passthrough mode; only a GPU in vGPU mode has a vGPU scheduler."]})
    assert not SchedulerPolicy.objects.exists()

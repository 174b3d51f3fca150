"""The scheduler pages: who may open them, desired vs reported with drift and its filter, the
GPU form's messages and commands, the defaults pages, and the box on the GPU detail page."""

import pytest

from fleet import services
from fleet.models import AuditEvent, SchedulerPolicy
from fleet.scheduler import SchedulerSettings as S
from fleet.scheduler_policies import set_gpu_policy
from fleet.tests.factories import GpuFactory, HostFactory, VirtualMachineFactory, profile

pytestmark = pytest.mark.django_db


@pytest.fixture
def gpu():
    return GpuFactory(host=HostFactory(name="sched-host"), pci_bus_id="00000000:86:00.0")


def page_urls(gpu):
    return ["/scheduler/", f"/scheduler/gpus/{gpu.pk}/", f"/scheduler/hosts/{gpu.host_id}/",
            f"/scheduler/models/{gpu.gpu_model_id}/", f"/scheduler/gpus/{gpu.pk}/box/"]


def test_anonymous_is_sent_to_login_and_artist_gets_403(client, artist, gpu):
    for url in page_urls(gpu):
        assert client.get(url).status_code == 302
    client.force_login(artist.user)
    for url in page_urls(gpu):
        assert client.get(url).status_code == 403
    assert client.post(f"/scheduler/gpus/{gpu.pk}/", {"policy": "equal_share", "arr": "on"}).status_code == 403
    assert client.post(f"/scheduler/gpus/{gpu.pk}/apply/").status_code == 403
    assert not SchedulerPolicy.objects.exists()


def test_list_shows_desired_reported_and_drift_and_filters_drift_only(staff, gpu, admin_user):
    calm = GpuFactory(host=gpu.host, pci_bus_id="00000000:87:00.0",
                      scheduler_reported={"policy": "best_effort", "arr_mode": "default"})
    gpu.scheduler_reported = {"policy": "best_effort", "arr_mode": "default"}
    gpu.save()
    set_gpu_policy(gpu, S("equal_share", arr=True, frequency_hz=960), admin_user)
    html = staff.get("/scheduler/").content.decode()
    assert "Equal share, ARR 960 Hz, avg 33" in html
    assert "drift: policy, arr, frequency_hz" in html
    assert "in force" in html
    assert 'href="/scheduler/"' in html
    assert 'aria-current="page">GPU scheduler' in html
    drifting = staff.get("/scheduler/?drift=1")
    assert drifting.context["rows"][0].gpu == gpu
    assert [row.gpu for row in drifting.context["rows"]] == [gpu]
    assert calm.pk not in [row.gpu.pk for row in drifting.context["rows"]]


def test_a_drift_filter_that_is_none_is_a_400_naming_it(staff, gpu):
    response = staff.get("/scheduler/", {"drift": "yes"})

    assert response.status_code == 400
    assert "drift: Select a valid choice. yes is not one of the available choices." in response.content.decode()
    assert f'data-gpu="{gpu.pk}"' in response.content.decode(), "every GPU still listed"


def test_list_query_count_does_not_grow_with_gpus(staff, gpu, django_assert_max_num_queries):
    for n in range(10):
        GpuFactory(host=gpu.host, pci_bus_id=f"00000000:{0x90 + n:02X}:00.0")
    with django_assert_max_num_queries(12):
        assert staff.get("/scheduler/").status_code == 200


def test_gpu_page_shows_the_commands_in_pre_blocks(staff, gpu, admin_user):
    set_gpu_policy(gpu, S("fixed_share", timeslice_ms=24), admin_user)
    html = staff.get(f"/scheduler/gpus/{gpu.pk}/").content.decode()
    assert ('<pre class="command" data-command="runtime">nvidia-smi vgpu -i 00000000:86:00.0 set-scheduler-state '
            '-p 3 -a 0 -ts 24000000</pre>') in html
    assert "options nvidia NVreg_RegistryDwords=&quot;RmPVMRL=0x00180011&quot;" in html
    assert "pci=0000:86:00.0;RmPVMRL=0x00180011" in html


def test_invalid_form_shows_the_rules_messages_and_writes_nothing(staff, gpu):
    response = staff.post(f"/scheduler/gpus/{gpu.pk}/", {"policy": "equal_share", "arr": "on", "avg_factor": "61",
                                                         "timeslice_ms": "2"})
    assert response.status_code == 400
    html = response.content.decode()
    assert "The averaging factor must be 1-60, not 61." in html
    assert "A time slice applies only with adaptive round-robin off" in html
    assert not SchedulerPolicy.objects.exists()


def test_valid_form_saves_stages_when_vgpus_exist_and_is_audited(staff, gpu):
    services.place_vgpu(VirtualMachineFactory(), gpu, profile("RTX6000-12Q"))
    response = staff.post(f"/scheduler/gpus/{gpu.pk}/", {"policy": "equal_share", "arr": "on", "frequency_hz": "480"})
    assert response.status_code == 302
    row = SchedulerPolicy.objects.get(gpu=gpu)
    assert (row.policy, row.arr, row.frequency_hz, row.apply_state) == ("equal_share", True, 480, "staged")
    html = staff.get(f"/scheduler/gpus/{gpu.pk}/").content.decode()
    assert "the GPU holds 1 vGPU; staged until it is empty or the driver reloads" in html
    event = AuditEvent.objects.get(action="scheduler_policy.update")
    assert (event.actor_name, event.source) == ("admin", "web")


def test_apply_without_an_agent_says_so(staff, gpu):
    response = staff.post(f"/scheduler/gpus/{gpu.pk}/apply/", follow=True)
    assert "No enabled fleet agent polls host sched-host; apply the commands by hand." in response.content.decode()


def test_host_default_page_saves_and_refuses_fixed_share_for_mixed_gpus(staff, gpu):
    GpuFactory(host=gpu.host, size_mode="mixed")
    response = staff.post(f"/scheduler/hosts/{gpu.host_id}/", {"policy": "fixed_share", "arr": "on"})
    assert response.status_code == 400
    assert "Fixed share is impossible in mixed-size mode" in response.content.decode()
    assert staff.post(f"/scheduler/hosts/{gpu.host_id}/", {"policy": "equal_share"}).status_code == 302
    assert SchedulerPolicy.objects.get(host=gpu.host).policy == "equal_share"
    assert staff.post(f"/scheduler/hosts/{gpu.host_id}/", {"clear": "1", "policy": "equal_share"}).status_code == 302
    assert not SchedulerPolicy.objects.filter(host=gpu.host).exists()


def test_gpu_detail_page_loads_the_scheduler_box_for_staff(staff, gpu, admin_user):
    detail = staff.get(f"/gpus/{gpu.pk}/").content.decode()
    assert f'hx-get="/scheduler/gpus/{gpu.pk}/box/"' in detail
    set_gpu_policy(gpu, S("equal_share", arr=True), admin_user)
    box = staff.get(f"/scheduler/gpus/{gpu.pk}/box/").content.decode()
    assert "Equal share, ARR 480 Hz, avg 33" in box
    assert f'href="/scheduler/gpus/{gpu.pk}/"' in box

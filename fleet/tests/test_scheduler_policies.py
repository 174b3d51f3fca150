"""Scheduler policy rows: effective policy by precedence, staging while vGPUs exist, release of
staged rows, validation through the services, and the audit events of each change."""

import pytest

from fleet import services
from fleet.audit import acting_as
from fleet.choices import AuditSource
from fleet.models import AuditEvent, SchedulerPolicy
from fleet.scheduler import SchedulerSettings as S
from fleet.scheduler_policies import (
    SchedulerValidationError,
    clear_policy,
    gpu_scheduler,
    release_staged,
    set_default,
    set_gpu_policy,
)
from fleet.tests.factories import GpuFactory, HostFactory, VirtualMachineFactory, profile

pytestmark = pytest.mark.django_db


@pytest.fixture
def gpu():
    return GpuFactory(host=HostFactory(name="sched-host"), pci_bus_id="00000000:86:00.0")


def test_effective_policy_is_own_row_then_host_then_model_then_driver(gpu, admin_user):
    assert (gpu_scheduler(gpu).source, gpu_scheduler(gpu).desired) == ("driver", S())
    set_default(gpu.gpu_model, S("equal_share", arr=True), admin_user)
    assert (gpu_scheduler(gpu).source, gpu_scheduler(gpu).desired.policy) == ("gpu_model", "equal_share")
    set_default(gpu.host, S("fixed_share", timeslice_ms=4), admin_user)
    assert (gpu_scheduler(gpu).source, gpu_scheduler(gpu).desired.policy) == ("host", "fixed_share")
    set_gpu_policy(gpu, S("best_effort"), admin_user)
    assert (gpu_scheduler(gpu).source, gpu_scheduler(gpu).desired.policy) == ("gpu", "best_effort")
    clear_policy(SchedulerPolicy.objects.get(gpu=gpu))
    assert gpu_scheduler(gpu).source == "host"


def test_change_on_an_empty_gpu_is_desired_and_audited(gpu, admin_user):
    with acting_as(admin_user, AuditSource.WEB):
        row = set_gpu_policy(gpu, S("equal_share", arr=True, frequency_hz=480, avg_factor=33), admin_user)
    assert (row.apply_state, row.apply_detail) == ("desired", "")
    event = AuditEvent.objects.get(action="scheduler_policy.update")
    assert (event.actor, event.source, event.object_id) == (admin_user, "web", str(row.pk))
    assert event.before is None
    assert event.after["policy"] == "equal_share"
    assert event.after["frequency_hz"] == 480

    set_gpu_policy(gpu, S("fixed_share", timeslice_ms=24), admin_user)
    second = AuditEvent.objects.filter(action="scheduler_policy.update").order_by("-id").first()
    assert second.before["policy"] == "equal_share"
    assert (second.after["policy"], second.after["timeslice_ms"], second.after["frequency_hz"]) == (
        "fixed_share", 24, None)


def test_change_on_a_gpu_with_vgpus_is_staged_with_the_reason_then_released_when_empty(gpu, admin_user):
    vgpus = [services.place_vgpu(VirtualMachineFactory(), gpu, profile("RTX6000-12Q")) for _ in range(2)]
    row = set_gpu_policy(gpu, S("fixed_share", arr=True), admin_user)
    assert row.apply_state == "staged"
    assert row.apply_detail == "the GPU holds 2 vGPUs; staged until it is empty or the driver reloads"

    services.remove_vgpu(vgpus[0])
    assert release_staged() == 0  # one vGPU left
    services.remove_vgpu(vgpus[1])
    assert release_staged() == 1
    row.refresh_from_db()
    assert (row.apply_state, row.apply_detail) == ("desired", "the GPU is empty now; ready to apply")
    event = AuditEvent.objects.filter(action="scheduler_policy.update").order_by("-id").first()
    assert (event.actor_name, event.source, event.before["apply_state"], event.after["apply_state"]) == (
        "scheduler", "system", "staged", "desired")


def test_staged_row_becomes_applied_when_the_agent_reports_it_after_a_driver_reload(gpu, admin_user):
    services.place_vgpu(VirtualMachineFactory(), gpu, profile("RTX6000-12Q"))
    set_gpu_policy(gpu, S("equal_share", timeslice_ms=3), admin_user)
    gpu.scheduler_reported = {"policy": "equal_share", "arr_mode": "disabled", "avg_factor": None,
                              "timeslice_ms": 3.0, "frequency_hz": None}
    gpu.save()
    assert release_staged() == 1
    row = SchedulerPolicy.objects.get(gpu=gpu)
    assert row.apply_state == "applied"
    assert row.applied_at is not None
    assert gpu_scheduler(gpu).drift == []


def test_invalid_settings_are_refused_with_field_messages_and_nothing_is_written(gpu, admin_user):
    gpu.size_mode = "mixed"
    gpu.save()
    with pytest.raises(SchedulerValidationError) as caught:
        set_gpu_policy(gpu, S("fixed_share", arr=True, avg_factor=90), admin_user)
    assert set(caught.value.errors) == {"policy", "avg_factor"}
    assert caught.value.errors["avg_factor"] == ["The averaging factor must be 1-60, not 90."]
    assert not SchedulerPolicy.objects.exists()
    assert not AuditEvent.objects.filter(action__startswith="scheduler_policy").exists()


def test_fixed_share_default_is_refused_when_a_governed_gpu_is_mixed_size(gpu, admin_user):
    GpuFactory(host=gpu.host, size_mode="mixed")
    with pytest.raises(SchedulerValidationError) as caught:
        set_default(gpu.host, S("fixed_share", arr=True), admin_user)
    assert caught.value.errors["policy"][0].startswith("Fixed share is impossible in mixed-size mode")
    set_default(gpu.host, S("equal_share", arr=True), admin_user)
    assert SchedulerPolicy.objects.get(host=gpu.host).policy == "equal_share"


def test_passthrough_gpu_has_no_scheduler(admin_user):
    passthrough = GpuFactory(mode="passthrough")
    with pytest.raises(SchedulerValidationError) as caught:
        set_gpu_policy(passthrough, S("equal_share", arr=True), admin_user)
    assert "passthrough" in caught.value.errors["policy"][0]


def test_delete_is_audited(gpu, admin_user):
    row = set_gpu_policy(gpu, S("equal_share", arr=True), admin_user)
    clear_policy(row)
    event = AuditEvent.objects.get(action="scheduler_policy.delete")
    assert event.before["policy"] == "equal_share"
    assert event.after is None


def test_inherited_default_shows_staged_while_the_gpu_drifts_and_holds_vgpus(gpu, admin_user):
    services.place_vgpu(VirtualMachineFactory(), gpu, profile("RTX6000-12Q"))
    gpu.scheduler_reported = {"policy": "best_effort", "arr_mode": "default"}
    gpu.save()
    set_default(gpu.gpu_model, S("equal_share", arr=True), admin_user)
    view = gpu_scheduler(gpu)
    assert view.drift == ["policy", "arr"]
    assert (view.apply_state, view.apply_detail) == (
        "staged", "the GPU holds 1 vGPU; staged until it is empty or the driver reloads")

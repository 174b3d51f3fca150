"""The alert pages as the admin on call uses them: the list and the menu's count, an alert's page
with who it hurts, acknowledging, silencing, the rules form, licences and versions."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.test import Client
from django.utils import timezone

from alerts.evaluate import ensure_rules
from alerts.models import Alert, AlertRule, AlertState, LicencePool, Silence
from fleet import services as fleet_services
from fleet.tests.factories import ArtistFactory, GpuFactory, HostFactory, VirtualMachineFactory, profile
from telemetry.models import HostDriverState, VgpuHealthState

pytestmark = pytest.mark.django_db


@pytest.fixture
def staff(admin_user):
    client = Client()
    client.force_login(admin_user)
    return client


@pytest.fixture
def alert():
    host = HostFactory(name="node-09")
    gpu = GpuFactory(host=host)
    vm = VirtualMachineFactory(name="vws-fx-09", artist=ArtistFactory(name="Eve"))
    fleet_services.place_vgpu(vm, gpu, profile("RTX6000-12Q"))
    rules = ensure_rules()
    alert = Alert.objects.create(rule=rules["xid"], key=f"xid:gpu:{gpu.pk}:79", severity="critical",
                                 title="XID 79 on node-09: GPU has fallen off the bus",
                                 summary="The host lost the GPU: its VMs are down.", host=host, gpu=gpu,
                                 details={"code": 79, "count": 1})
    alert.vms.add(vm)
    return alert


def test_the_menu_counts_alerts_firing_and_the_list_shows_them(staff, alert):
    page = staff.get("/alerts/?state=open").content.decode()
    assert 'data-badge="alerts">1<' in page
    assert "GPU has fallen off the bus" in page


def test_an_alert_page_names_the_vms_and_artists_it_hurts(staff, alert):
    page = staff.get(f"/alerts/{alert.pk}/").content.decode()
    assert "vws-fx-09" in page
    assert "Eve" in page
    assert 'data-form="drain"' in page


def test_acknowledging_from_the_page_keeps_the_note_and_clears_the_menu_count(staff, alert):
    answer = staff.post(f"/alerts/{alert.pk}/acknowledge/", {"note": "reseating the board"})
    assert answer.status_code == 302
    alert.refresh_from_db()
    assert alert.state == AlertState.ACKNOWLEDGED
    assert alert.note == "reseating the board"
    assert 'data-badge="alerts"' not in staff.get("/alerts/").content.decode()


def test_a_silence_without_a_reason_is_refused_and_one_with_it_is_kept(staff, alert):
    refused = staff.post(f"/alerts/{alert.pk}/silence/", {"hours": "4", "scope": "gpu", "reason": ""}, follow=True)
    assert "No silence was set" in refused.content.decode()
    assert Silence.objects.count() == 0
    staff.post(f"/alerts/{alert.pk}/silence/", {"hours": "4", "scope": "gpu", "reason": "board swap"})
    (silence,) = Silence.objects.all()
    assert silence.gpu_id == alert.gpu_id
    assert silence.reason == "board swap"
    assert timedelta(hours=3, minutes=59) < silence.ends_at - timezone.now() <= timedelta(hours=4)


def test_the_rules_form_saves_a_threshold_and_refuses_one_out_of_bounds(staff, alert):
    rule = AlertRule.objects.get(kind="gpu_temperature")
    fields = {"rule": rule.pk, "gpu_temperature-enabled": "on", "gpu_temperature-severity": "critical",
              "gpu_temperature-param_margin_c": "3", "gpu_temperature-param_minutes": "10",
              "gpu_temperature-param_fallback_slowdown_c": "85"}
    assert staff.post("/alerts/rules/", fields).status_code == 302
    rule.refresh_from_db()
    assert (rule.severity, rule.effective_params["margin_c"], rule.effective_params["minutes"]) == ("critical", 3, 10)
    page = staff.post("/alerts/rules/", {**fields, "gpu_temperature-param_minutes": "0"}).content.decode()
    assert "was not changed" in page
    rule.refresh_from_db()
    assert rule.effective_params["minutes"] == 10


def test_the_licence_page_sets_a_pool_and_lists_who_is_unlicensed(staff, alert):
    VgpuHealthState.objects.create(vm=alert.vms.get(), gpu=alert.gpu, type_name="RTX6000-12Q",
                                   license_state="unlicensed", changed_at=timezone.now())
    staff.post("/licences/", {"edition": "vws", "owned": "12", "note": "renews in March"})
    assert LicencePool.objects.get(edition="vws").owned == 12
    page = staff.get("/licences/").content.decode()
    assert "vws-fx-09" in page
    assert "renews in March" in page
    refused = staff.post("/licences/", {"edition": "vws", "owned": "-3"}).content.decode()
    assert "was not saved" in refused
    assert LicencePool.objects.get(edition="vws").owned == 12


def test_the_versions_page_flags_a_guest_newer_than_its_host_and_hosts_that_differ(staff, alert):
    other = GpuFactory(host=HostFactory(name="node-10"))
    HostDriverState.objects.create(host=alert.host, driver_version="570.172.07", vgpu_manager_version="18.4",
                                   changed_at=timezone.now())
    HostDriverState.objects.create(host=other.host, driver_version="580.95.02", vgpu_manager_version="19.2",
                                   changed_at=timezone.now())
    VgpuHealthState.objects.create(vm=alert.vms.get(), gpu=alert.gpu, guest_driver_version="580.95.05",
                                   changed_at=timezone.now())
    page = staff.get("/versions/").content.decode()
    assert "newer than host: unsupported" in page
    assert "Quadro RTX 6000 hosts differ: node-09, node-10" in page


def test_the_gpu_page_shows_its_health_open_alerts_and_xids_with_their_meaning(staff, alert):
    from telemetry.models import GpuHealthState, XidError

    GpuHealthState.objects.create(gpu=alert.gpu, ecc_mode="enabled", ecc_uncorrected_volatile=2,
                                  ecc_corrected_volatile=7, remapped_rows_pending=True, remapped_rows_correctable=0,
                                  remapped_rows_uncorrectable=1, throttle_reasons=["hw_thermal_slowdown"],
                                  changed_at=timezone.now())
    XidError.objects.create(gpu=alert.gpu, code=79, at=timezone.now())
    page = staff.get(f"/gpus/{alert.gpu_id}/").content.decode()
    assert "GPU has fallen off the bus" in page
    assert "uncorrectable since reset 2" in page
    assert "reset pending" in page
    assert "hw_thermal_slowdown" in page
    assert f'href="/alerts/{alert.pk}/"' in page


def test_the_host_page_names_its_driver(staff, alert):
    HostDriverState.objects.create(host=alert.host, driver_version="580.95.02", vgpu_manager_version="19.2",
                                   changed_at=timezone.now())
    page = staff.get(f"/hosts/{alert.host_id}/").content.decode()
    assert "580.95.02, vGPU manager 19.2" in page

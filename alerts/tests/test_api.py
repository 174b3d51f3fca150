"""The alerts resources of the v1 API, as a script on call uses them: list what fires, take one,
tune a rule, silence, and read the licence picture. Bad input is a 400 naming the field, and
changes nothing."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone
from rest_framework.test import APIClient

from alerts.evaluate import ensure_rules
from alerts.models import Alert, AlertRule, AlertState, LicencePool, LicenceUsage, Silence
from fleet import services as fleet_services
from fleet.models import AuditEvent
from fleet.tests.factories import ArtistFactory, GpuFactory, HostFactory, UserFactory, VirtualMachineFactory, profile
from telemetry.models import VgpuHealthState

pytestmark = pytest.mark.django_db


@pytest.fixture
def api(admin_user):
    client = APIClient()
    client.force_authenticate(admin_user)
    return client


@pytest.fixture
def fleet():
    host = HostFactory(name="node-07")
    gpu = GpuFactory(host=host)
    vm = VirtualMachineFactory(name="vws-light-07", artist=ArtistFactory(name="Dee"))
    fleet_services.place_vgpu(vm, gpu, profile("RTX6000-6Q"))
    rules = ensure_rules()
    alert = Alert.objects.create(rule=rules["ecc_uncorrectable"], key=f"ecc_uncorrectable:gpu:{gpu.pk}",
                                 severity="critical", title="Uncorrectable ECC errors", summary="2 errors",
                                 host=host, gpu=gpu)
    alert.vms.add(vm)
    resolved = Alert.objects.create(rule=rules["xid"], key=f"xid:gpu:{gpu.pk}:43", severity="warning",
                                    title="XID 43", summary="app fault", host=host, gpu=gpu,
                                    state=AlertState.RESOLVED, resolved_at=timezone.now())
    return {"host": host, "gpu": gpu, "vm": vm, "alert": alert, "resolved": resolved}


def test_open_alerts_list_names_the_gpu_vms_and_artists(api, fleet):
    body = api.get("/api/v1/alerts/", {"state": "open"}).json()
    (row,) = body["results"]
    assert row["rule"] == "ecc_uncorrectable"
    assert row["host_name"] == "node-07"
    assert row["affected_vms"] == [{"id": fleet["vm"].pk, "name": "vws-light-07", "artist": "Dee"}]


def test_acknowledge_takes_an_open_alert_and_refuses_a_resolved_one(api, fleet, admin_user):
    taken = api.post(f"/api/v1/alerts/{fleet['alert'].pk}/acknowledge/", {"note": "on it"}, format="json")
    assert taken.status_code == 200
    assert taken.json()["state"] == "acknowledged"
    assert taken.json()["acknowledged_by"] == admin_user.username
    assert AuditEvent.objects.filter(action="alert.acknowledge").count() == 1
    late = api.post(f"/api/v1/alerts/{fleet['resolved'].pk}/acknowledge/", {}, format="json")
    assert late.status_code == 409
    assert "resolved" in late.json()["detail"]


def test_a_rule_threshold_is_changed_and_a_bad_one_refused_naming_the_parameter(api, fleet):
    rule = AlertRule.objects.get(kind="vgpu_fb_full")
    ok = api.patch(f"/api/v1/alert-rules/{rule.pk}/", {"params": {"percent": 90}}, format="json")
    assert ok.status_code == 200
    assert ok.json()["params"] == {"percent": 90, "minutes": 5}
    bad = api.patch(f"/api/v1/alert-rules/{rule.pk}/", {"params": {"percent": 150}, "enabled": False},
                    format="json")
    assert bad.status_code == 400
    assert "percent" in str(bad.json()["params"])
    rule.refresh_from_db()
    assert rule.enabled is True  # nothing of the refused change was kept
    assert rule.effective_params["percent"] == 90


def test_a_silence_needs_a_matcher_a_reason_and_an_end_after_its_start(api, fleet):
    missing = api.post("/api/v1/silences/", {"reason": "x", "ends_at": (timezone.now() + timedelta(hours=1))
                                             .isoformat()}, format="json")
    assert missing.status_code == 400
    assert "match" in str(missing.json())
    backwards = api.post("/api/v1/silences/", {"host": fleet["host"].pk, "reason": "maintenance",
                                               "ends_at": (timezone.now() - timedelta(hours=1)).isoformat()},
                         format="json")
    assert backwards.status_code == 400
    assert "ends_at" in backwards.json()
    assert Silence.objects.count() == 0
    made = api.post("/api/v1/silences/", {"host": fleet["host"].pk, "reason": "maintenance",
                                          "ends_at": (timezone.now() + timedelta(hours=2)).isoformat()},
                    format="json")
    assert made.status_code == 201
    assert made.json()["active"] is True
    ended = api.post(f"/api/v1/silences/{made.json()['id']}/end/")
    assert ended.json()["active"] is False


def test_the_licence_overview_counts_use_names_the_unlicensed_and_peaks(api, fleet):
    LicencePool.objects.create(edition="vws", owned=4)
    VgpuHealthState.objects.create(vm=fleet["vm"], gpu=fleet["gpu"], type_name="RTX6000-6Q",
                                   license_state="unlicensed", changed_at=timezone.now())
    now = timezone.now().replace(second=0, microsecond=0)
    LicenceUsage.objects.create(ts=now - timedelta(hours=2), edition="vws", in_use=3, unlicensed=0)
    LicenceUsage.objects.create(ts=now - timedelta(hours=1), edition="vws", in_use=1, unlicensed=1)
    body = api.get("/api/v1/licences/").json()
    (vws,) = body["editions"]
    assert (vws["owned"], vws["in_use"], vws["unlicensed"], vws["peak"]) == (4, 0, 1, 3)
    assert vws["forecast_peak"] is None  # less than a week of days to fit
    (who,) = body["unlicensed"]
    assert (who["vm_name"], who["artist"], who["edition"]) == ("vws-light-07", "Dee", "vws")


def test_licence_days_out_of_range_is_refused(api, fleet):
    assert api.get("/api/v1/licences/", {"days": 0}).status_code == 400


def test_a_pool_per_edition_once_and_never_negative(api, fleet):
    assert api.post("/api/v1/licence-pools/", {"edition": "vws", "owned": 20}, format="json").status_code == 201
    again = api.post("/api/v1/licence-pools/", {"edition": "vws", "owned": 5}, format="json")
    assert again.status_code == 400
    assert "edition" in again.json()
    pool = LicencePool.objects.get()
    negative = api.patch(f"/api/v1/licence-pools/{pool.pk}/", {"owned": -1}, format="json")
    assert negative.status_code == 400
    pool.refresh_from_db()
    assert pool.owned == 20


def test_artists_see_no_alerts(fleet):
    client = APIClient()
    client.force_authenticate(UserFactory(username="dee2"))
    assert client.get("/api/v1/alerts/").status_code == 403
    assert client.get("/api/v1/licences/").status_code == 403


def test_a_silence_of_a_rule_that_does_not_exist_is_refused_naming_the_field(api, fleet):
    for bad in ("no_such_rule", "\x00", 7):
        answer = api.post("/api/v1/silences/", {"rule": bad, "reason": "x",
                                                "ends_at": (timezone.now() + timedelta(hours=1)).isoformat()},
                          format="json")
        assert answer.status_code == 400
        assert "rule" in answer.json()
    assert Silence.objects.count() == 0

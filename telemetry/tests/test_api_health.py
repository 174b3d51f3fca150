"""Health in the API: `health` on the GPU detail, `hosts/{id}/driver/`, and their schema."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from rest_framework.test import APIClient

from fleet import queries as fleet_queries
from fleet.tests.factories import ArtistFactory, UserFactory
from telemetry.models import GpuHealthState, HostDriverState, XidError
from telemetry.tests.rollup_world import T0, studio

pytestmark = pytest.mark.django_db


@pytest.fixture
def world(artist):
    """The studio, with the signed-in artist (`artist_api`) as the owner of `ws-ana`."""
    return studio(artist=artist)


def _state(gpu, **fields) -> GpuHealthState:
    values = dict(ecc_mode="enabled", ecc_corrected_volatile=2, ecc_uncorrected_volatile=0,
                  remapped_rows_correctable=1, remapped_rows_uncorrectable=0, remapped_rows_pending=False,
                  remapped_rows_failure=False, throttle_reasons=["hw_thermal_slowdown"], pcie_replay_counter=0,
                  temp_slowdown_c=87.0, temp_shutdown_c=92.0, power_limit_w=350.0, performance_state="P0",
                  unsupported=["retired_pages_sbe", "retired_pages_dbe", "retired_pages_pending", "fan_speed_pct"],
                  changed_at=T0)
    values.update(fields)
    return GpuHealthState.objects.create(gpu=gpu, **values)


def test_gpu_detail_health_is_the_state_and_the_ten_newest_xids(artist_api, admin_api, world):
    _state(world.gpu_1)
    for n in range(12):
        XidError.objects.create(gpu=world.gpu_1, code=40 + n, at=T0 + timedelta(minutes=n), received_at=T0)
    XidError.objects.create(gpu=world.gpu_2, code=79, at=T0 + timedelta(hours=1), received_at=T0)

    health = artist_api.get(f"/api/v1/gpus/{world.gpu_1.pk}/").json()["health"]

    assert health["ecc_mode"] == "enabled"
    assert (health["ecc_corrected_volatile"], health["ecc_uncorrected_aggregate"]) == (2, None)
    assert (health["remapped_rows_correctable"], health["remapped_rows_failure"]) == (1, False)
    assert health["throttle_reasons"] == ["hw_thermal_slowdown"]
    assert (health["fan_speed_pct"], health["retired_pages_sbe"]) == (None, None)
    assert "fan_speed_pct" in health["unsupported"]
    assert (health["power_limit_w"], health["performance_state"]) == (350.0, "P0")
    assert health["changed_at"] == "2026-03-02T10:00:00Z"
    assert [x["code"] for x in health["xid_errors"]] == list(range(51, 41, -1))  # newest first, ten
    assert health["xid_errors"][0]["at"] == "2026-03-02T10:11:00Z"

    # Only an XID known: the state's fields are null.
    only_xid = admin_api.get(f"/api/v1/gpus/{world.gpu_2.pk}/").json()["health"]
    assert (only_xid["ecc_mode"], only_xid["changed_at"], only_xid["unsupported"]) == (None, None, [])
    assert only_xid["xid_errors"] == [{"code": 79, "at": "2026-03-02T11:00:00Z"}]
    # Shared with Bob's VM: an artist sees none of its readings, health included.
    assert artist_api.get(f"/api/v1/gpus/{world.gpu_2.pk}/").json()["health"] is None
    # Nothing reported: null.
    assert admin_api.get(f"/api/v1/gpus/{world.gpu_idle.pk}/").json()["health"] is None
    assert "health" not in admin_api.get("/api/v1/gpus/").json()["results"][0]


def test_gpu_detail_asks_the_artists_visibility_once(artist_api, world, monkeypatch):
    _state(world.gpu_1)
    asked = []
    may_read = fleet_queries.may_read_gpu_telemetry
    monkeypatch.setattr(fleet_queries, "may_read_gpu_telemetry",
                        lambda user, gpu_id: asked.append(gpu_id) or may_read(user, gpu_id))

    detail = artist_api.get(f"/api/v1/gpus/{world.gpu_1.pk}/").json()

    assert detail["latest"] is None  # no sample yet
    assert detail["health"]["ecc_mode"] == "enabled"
    assert asked == [world.gpu_1.pk]  # for latest and health together


def test_host_driver_is_what_the_agent_reported(artist_api, admin_api, world):
    HostDriverState.objects.create(host=world.host, driver_version="580.159.04", vgpu_manager_version="19.2",
                                   nvml_version="12.580.159.04", cuda_driver_version=13000, unsupported=[],
                                   changed_at=datetime(2026, 3, 2, 9, 0, tzinfo=UTC))

    response = artist_api.get(f"/api/v1/hosts/{world.host.pk}/driver/")

    assert response.status_code == 200
    assert response.json() == {"host": world.host.pk, "driver_version": "580.159.04",
                               "vgpu_manager_version": "19.2", "nvml_version": "12.580.159.04",
                               "cuda_driver_version": 13000, "unsupported": [],
                               "changed_at": "2026-03-02T09:00:00Z"}
    never = admin_api.get(f"/api/v1/hosts/{world.gpu_idle.host_id}/driver/").json()
    assert never == {"host": world.gpu_idle.host_id, "driver_version": None, "vgpu_manager_version": None,
                     "nvml_version": None, "cuda_driver_version": None, "unsupported": [], "changed_at": None}


def test_host_driver_is_seen_only_by_who_sees_the_host(world):
    stranger = APIClient()
    stranger.force_authenticate(ArtistFactory(user=UserFactory(username="cleo"), name="Cleo").user)

    assert stranger.get(f"/api/v1/hosts/{world.host.pk}/driver/").status_code == 404
    assert APIClient().get(f"/api/v1/hosts/{world.host.pk}/driver/").status_code == 401
    assert stranger.post(f"/api/v1/hosts/{world.host.pk}/driver/", {}).status_code == 405


def test_schema_documents_health_and_the_driver_route(admin_api, db):
    schema = admin_api.get("/api/schema/", HTTP_ACCEPT="application/vnd.oai.openapi+json").json()

    health = schema["components"]["schemas"]["GpuDetail"]["properties"]["health"]
    assert health["nullable"] is True
    props = schema["components"]["schemas"]["GpuHealth"]["properties"]
    assert {"ecc_mode", "remapped_rows_failure", "throttle_reasons", "xid_errors", "unsupported"} <= props.keys()
    driver = schema["paths"]["/api/v1/hosts/{id}/driver/"]
    assert "get" in driver
    assert not {"post", "put", "patch", "delete"} & driver.keys()
    assert "driver_version" in schema["components"]["schemas"]["HostDriver"]["properties"]

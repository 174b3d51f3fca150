"""Query parameters every API list shares (config/api/filters.py): an unknown one is a 400 naming
it, on every list of every app, while the parameters each list documents keep working."""

import pytest
from django.urls import reverse

from fleet.api import urls as fleet_api
from sizing.api import urls as sizing_api
from telemetry.api import urls as telemetry_api

LISTS = sorted(
    (prefix, basename)
    for router in (fleet_api.router, telemetry_api.router, sizing_api.router)
    for prefix, _, basename in router.registry
)


@pytest.mark.parametrize(("prefix", "basename"), LISTS, ids=[prefix for prefix, _ in LISTS])
def test_every_list_answers_an_unknown_parameter_with_a_400_naming_it(admin_api, prefix, basename):
    url = reverse(f"{basename}-list")

    typo = admin_api.get(url, {"hots": "1"})
    plain = admin_api.get(url, {"limit": "5", "offset": "0", "format": "json"})

    assert typo.status_code == 400, prefix
    assert list(typo.json()) == ["hots"]
    assert typo.json()["hots"][0].startswith("Unknown filter")
    assert "limit" in typo.json()["hots"][0], "the message lists what the list takes"
    assert plain.status_code == 200, (prefix, plain.content[:300])


def test_known_parameters_of_a_list_keep_working(admin_api, fleet_world):
    cases = {
        "/api/v1/hosts/": {"ordering": "-name", "q": "host", "name": "host", "hypervisor": "kvm"},
        "/api/v1/gpus/": {"uuid": fleet_world.gpu_a.uuid, "mode": "vgpu", "expand": "host"},
        "/api/v1/suggestions/": {"dismissed": "all", "ordering": "id"},
        "/api/v1/audit-events/": {"since": "2020-01-01", "actor": "admin", "q": "x"},
        "/api/v1/notifications/": {"read": "false"},
        "/api/v1/resize-requests/": {"status": "pending"},
        "/api/v1/agents/": {"status": "ok", "enabled": "true"},
    }
    for url, params in cases.items():
        response = admin_api.get(url, params)
        assert response.status_code == 200, (url, response.content[:300])


def test_several_unknown_parameters_are_all_named(admin_api):
    body = admin_api.get("/api/v1/vms/", {"hots": "1", "artst": "2", "name": "ws"}).json()

    assert set(body) == {"hots", "artst"}


def test_an_objects_own_address_keeps_ignoring_list_parameters(admin_api, fleet_world):
    """Filters choose rows of a list; one object's URL answers whatever the query string."""
    response = admin_api.get(f"/api/v1/hosts/{fleet_world.host_a.pk}/", {"format": "json"})

    assert response.status_code == 200


@pytest.mark.parametrize("typed", ["100%", "%s", "%(x)s"])
def test_a_percent_sign_typed_into_a_filter_is_quoted_back_as_typed(admin_api, staff, fleet_world, typed):
    answer = admin_api.get("/api/v1/gpus/", {"host": typed})
    assert answer.status_code == 400
    assert answer.json()["host"] == [
        f"Select a valid choice. That choice is not one of the available choices. No host has the id or name "
        f"{typed!r} (or you may not see it)."]
    assert admin_api.get("/api/v1/audit-events/", {"since": typed}).status_code == 400
    page = staff.get("/gpus/", {"host": typed})
    assert page.status_code == 400
    assert f"No host has the id or name {typed!r}".replace("'", "&#x27;") in page.content.decode()

"""`GET /api/v1/` lists every resource of every app's router and every endpoint routed by hand, so a
script (or a person in the browsable API) finds each one from the root."""

import re

from django.urls import get_resolver, resolve
from django.urls.resolvers import URLResolver

from fleet.api import urls as fleet_api
from hypervisors.api import urls as hypervisors_api
from sizing.api import urls as sizing_api
from telemetry.api import urls as telemetry_api


def api_routes():
    """(route text, name) of every URL pattern under /api/v1/ but the format-suffix variants."""
    def walk(patterns, prefix=""):
        for pattern in patterns:
            if isinstance(pattern, URLResolver):
                yield from walk(pattern.url_patterns, prefix + str(pattern.pattern))
            else:
                yield prefix + str(pattern.pattern), pattern.name

    return [(route, name) for route, name in walk(get_resolver().url_patterns)
            if route.startswith("api/v1/") and "format" not in route and name != "api-root"]


def test_the_root_lists_every_registered_resource(admin_api):
    root = admin_api.get("/api/v1/").json()

    for router in (fleet_api.router, telemetry_api.router, sizing_api.router, hypervisors_api.router):
        for prefix, _, _ in router.registry:
            assert root.get(prefix) == f"http://testserver/api/v1/{prefix}/", prefix


def test_the_root_lists_every_endpoint_routed_by_hand(admin_api):
    """Router routes are written as regexes (`^hosts/$`); the hand-routed ones as paths
    (`gpus/<int:pk>/metrics/`), listed as their address with `{id}`."""
    listed = set(admin_api.get("/api/v1/").json().values())
    by_hand = [route for route, _ in api_routes() if not route.removeprefix("api/v1/").startswith("^")]

    assert by_hand, "the hand-routed endpoints were found"
    for route in by_hand:
        address = "http://testserver/" + re.sub(r"<(?:int:)?pk>", "{id}", route)
        assert address in listed, f"{address} is not listed at /api/v1/"


def test_every_address_the_root_lists_is_routed(admin_api, fleet_world):
    """Each address, `{id}` filled in, reaches a view (whatever that view then answers an admin)."""
    ids = {"gpu": fleet_world.gpu_a.pk, "vm": fleet_world.vm_a.pk, "host": fleet_world.host_a.pk,
           "gpu-model": fleet_world.gpu_a.gpu_model_id}
    for name, address in admin_api.get("/api/v1/").json().items():
        kind = next((kind for kind in sorted(ids, key=len, reverse=True) if name.startswith(kind)), None)
        url = address.replace("http://testserver", "").replace("{id}", str(ids.get(kind, 0)))
        response = admin_api.get(url)
        if response.status_code == 404:  # a view's own answer (the host was never synced), not a missing route
            assert resolve(url).url_name == "host-sync", (name, url)
            assert "never synced" in response.json()["detail"]
            continue
        assert response["Content-Type"].startswith("application/json"), (name, url)


def test_the_root_lists_the_drift_report(admin_api):
    assert admin_api.get("/api/v1/").json()["drift"] == "http://testserver/api/v1/drift/"

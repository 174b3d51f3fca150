"""The OpenAPI schema, the Swagger UI (offline: local assets only) and token authentication."""

import re

import yaml
from django.conf import settings
from django.contrib.staticfiles import finders
from django.core.management import call_command
from rest_framework.test import APIClient

from fleet.api_tokens import issue_token

RESOURCES = ["gpu-models", "vgpu-profiles", "hosts", "gpus", "artists", "vms", "vgpus"]


def test_schema_lists_every_resource_and_validates(admin_api, tmp_path):
    response = admin_api.get("/api/schema/", HTTP_ACCEPT="application/vnd.oai.openapi+json")
    assert response.status_code == 200
    schema = response.json()
    for route in RESOURCES:
        assert f"/api/v1/{route}/" in schema["paths"]
        assert f"/api/v1/{route}/{{id}}/" in schema["paths"]
    vgpu_detail = schema["paths"]["/api/v1/vgpus/{id}/"]
    assert "put" not in vgpu_detail
    assert "patch" not in vgpu_detail
    assert set(schema["paths"]["/api/v1/vgpus/"]["post"]["responses"]) == {"201", "400", "409"}
    latest = schema["components"]["schemas"]["GpuDetail"]["properties"]["latest"]
    assert latest["nullable"] is True
    assert "ts" in schema["components"]["schemas"]["GpuSample"]["properties"]
    assert "uuid" in {p["name"] for p in schema["paths"]["/api/v1/gpus/"]["get"]["parameters"]}

    # The same check CI runs: any schema warning (an un-annotated field or view) fails it.
    out = tmp_path / "schema.yaml"
    call_command("spectacular", "--validate", "--fail-on-warn", "--file", str(out))
    assert yaml.safe_load(out.read_text())["info"]["title"] == settings.SPECTACULAR_SETTINGS["TITLE"]


def test_swagger_ui_loads_assets_from_local_static_only(admin_api):
    response = admin_api.get("/api/docs/")
    assert response.status_code == 200
    html = response.content.decode()
    assert "swagger-ui" in html
    assert not re.search(r"(src|href)\s*=\s*[\"']?(https?:)?//", html), "an asset from another site"
    for host in ("cdn.", "unpkg.com", "jsdelivr", "cdnjs"):
        assert host not in html
    assets = re.findall(r"(?:src|href)=\"([^\"]+\.(?:js|css|png))\"", html)
    assert any(a.endswith("swagger-ui-bundle.js") for a in assets)
    assert any(a.endswith("swagger-ui.css") for a in assets)
    for asset in assets:
        assert asset.startswith("/" + settings.STATIC_URL.lstrip("/")), asset
        assert finders.find(asset.removeprefix("/" + settings.STATIC_URL.lstrip("/"))), f"{asset} is not shipped"


def test_token_authentication(fleet_world):
    _, key = issue_token(fleet_world.ana.user)
    client = APIClient()

    client.credentials(HTTP_AUTHORIZATION=f"Token {key}")
    vms = client.get("/api/v1/vms/")
    client.credentials(HTTP_AUTHORIZATION="Token not-a-real-key")
    forged = client.get("/api/v1/vms/")

    assert vms.status_code == 200
    assert [vm["name"] for vm in vms.json()["results"]] == ["ws-ana"]
    assert forged.status_code == 401
    assert forged.json()["detail"] == "Invalid token."


def test_staff_token_can_place_a_vgpu(fleet_world, admin_user):
    """Automation: a staff user's token drives the same writes as the admin UI."""
    from fleet.tests.factories import VirtualMachineFactory

    _, key = issue_token(admin_user)
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Token {key}")
    vm = VirtualMachineFactory(name="ws-auto")
    response = client.post(
        "/api/v1/vgpus/",
        {"vm": vm.pk, "gpu": fleet_world.gpu_a.pk, "profile": fleet_world.profile_12q.pk},
        format="json",
    )
    assert response.status_code == 201
    assert client.get(f"/api/v1/vms/{vm.pk}/").json()["host"] == fleet_world.host_a.pk

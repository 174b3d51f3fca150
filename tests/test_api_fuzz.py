"""Fuzzing of the whole v1 API from its OpenAPI schema (/api/schema/) with schemathesis.

Every operation, reads and writes alike, gets generated requests from a staff token against a
small seeded fleet, through the WSGI app (no server). A request must never end in a 5xx, and
every response must match what the schema promises (body, content type, headers): the schema is
the contract clients are generated from, so a mismatch breaks them as surely as a crash.

Each generated request runs in a savepoint that is rolled back afterwards, so a DELETE or an
approval in one example leaves the next one the same seeded fleet, and `{id}` paths are mapped
onto rows that exist (a random id only ever tests the 404 path).
"""

from __future__ import annotations

import json
import re
from datetime import timedelta
from types import SimpleNamespace

import pytest
import schemathesis
from django.core.signals import request_finished, request_started
from django.core.wsgi import get_wsgi_application
from django.db import close_old_connections, transaction
from django.utils import timezone
from hypothesis import HealthCheck
from hypothesis import settings as hypothesis_settings
from schemathesis.checks import (
    content_type_conformance,
    not_a_server_error,
    response_headers_conformance,
    response_schema_conformance,
)

from fleet.api_tokens import issue_token
from fleet.models import (
    ApiToken,
    Artist,
    AuditEvent,
    Gpu,
    GpuModel,
    Host,
    Notification,
    ResizeRequest,
    Vgpu,
    VgpuProfile,
    VirtualMachine,
)
from sizing import optimizer_runs
from sizing.models import OptimizerRun, Suggestion, WorkflowPreset
from sizing.tasks import run_optimizer
from sizing.tests.optimizer_world import suggestion
from sizing.tests.suggestion_world import END, hourly, rtx_studio
from telemetry.models import Agent

#: Generated requests per operation: enough to reach every field of a body with odd values, and
#: the whole run (about 90 operations) stays within a few minutes on a small CI machine.
EXAMPLES_PER_OPERATION = 12

#: What a response is checked for. Left out: `status_code_conformance` (drf-spectacular documents
#: the success status only, so every 400/404/409 would count as a mismatch) and the negative-data
#: checks (the API accepts unknown query parameters, as DRF does, on purpose).
CHECKS = [not_a_server_error, response_schema_conformance, content_type_conformance, response_headers_conformance]

#: The model behind each `{id}` path of the API, by its first segment after /api/v1/.
MODEL_OF_RESOURCE = {
    "agents": Agent,
    "api-tokens": ApiToken,
    "artists": Artist,
    "audit-events": AuditEvent,
    "gpu-models": GpuModel,
    "gpus": Gpu,
    "hosts": Host,
    "notifications": Notification,
    "optimizer-runs": OptimizerRun,
    "resize-requests": ResizeRequest,
    "suggestions": Suggestion,
    "vgpu-profiles": VgpuProfile,
    "vgpus": Vgpu,
    "vms": VirtualMachine,
    "workflow-presets": WorkflowPreset,
}
RESOURCE_RE = re.compile(r"^/api/v1/(?P<resource>[a-z-]+)/\{")



def _served_schema() -> dict:
    """The schema /api/schema/ serves, built in-process: it is needed when the tests are collected,
    before any database exists (the endpoint itself wants a signed-in user)."""
    from drf_spectacular.generators import SchemaGenerator
    from drf_spectacular.renderers import OpenApiJsonRenderer

    return json.loads(OpenApiJsonRenderer().render(SchemaGenerator().get_schema(request=None, public=True)))


# Loaded when collected, so each operation is a test of its own (`from_fixture` relies on a pytest
# node attribute that pytest 9 no longer has).
schema = schemathesis.openapi.from_dict(_served_schema())
schema.app = get_wsgi_application()


def _seed_fleet(admin) -> None:
    """Three GPUs on one host with three artists' VMs, two weeks of rollups (metrics, heatmap,
    suggestions), an agent, a pending resize request, a suggestion, a finished optimizer run and a
    notification: a row behind every kind of `{id}` the API has."""
    world = rtx_studio()
    for vm in (world.heavy, world.light, world.peer):
        hourly(vm, 48, fb_mib=6_144, profile_fb_mib=12 * 1024, end=END)
    # Port 1 on loopback refuses at once: actions that call the agent fail fast, offline.
    Agent.objects.create(name="render-01-agent", url="http://127.0.0.1:1", host=world.host)
    ResizeRequest.objects.create(
        vm=world.light, current_profile=world.q24, requested_profile=world.q12, requested_vgpus=1,
        reason="Lighter shots this month", requested_by=world.bob.user,
        wished_from=timezone.now() + timedelta(days=1),
    )
    suggestion(world.light, world.q12)
    run_optimizer(optimizer_runs.start_run(admin).pk)
    Notification.objects.create(user=admin, message="Resize request for ws-light", url="/requests/")


@pytest.fixture
def fuzz_world(db, admin_user, settings):
    """The seeded fleet, the staff token's header and the ids behind each resource's `{id}`."""
    settings.ALLOWED_HOSTS = ["localhost"]
    _seed_fleet(admin_user)
    _, key = issue_token(admin_user)
    ids = {resource: list(model.objects.order_by("pk").values_list("pk", flat=True))
           for resource, model in MODEL_OF_RESOURCE.items()}
    # As Django's test client does: the start and end of a request must not close the test's
    # connection, which holds the seeded fleet in its open transaction.
    for signal in (request_started, request_finished):
        signal.disconnect(close_old_connections)
    try:
        yield SimpleNamespace(headers={"Authorization": f"Token {key}"}, ids=ids)
    finally:
        for signal in (request_started, request_finished):
            signal.connect(close_old_connections)


def _point_at_seeded_row(case, ids: dict[str, list[int]]) -> None:
    """A generated `{id}` becomes one of the seeded rows of its resource, so the operation runs
    past its lookup; the 404 path needs no fuzzing."""
    match = RESOURCE_RE.match(case.operation.path)
    known = ids.get(match["resource"]) if match else None
    if known and isinstance(case.path_parameters.get("id"), int):
        case.path_parameters["id"] = known[case.path_parameters["id"] % len(known)]


@schema.parametrize()
@hypothesis_settings(max_examples=EXAMPLES_PER_OPERATION, deadline=None, database=None,
                     suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow,
                                            HealthCheck.filter_too_much, HealthCheck.data_too_large])
def test_api_conforms_to_its_schema(case, fuzz_world):
    """No generated request, valid or not, makes the API fail or answer off-schema."""
    _point_at_seeded_row(case, fuzz_world.ids)
    with transaction.atomic():
        case.call_and_validate(headers=fuzz_world.headers, checks=CHECKS)
        transaction.set_rollback(True)


# What the fuzzing found, pinned down ------------------------------------------------------------


def _call(fuzz_world, path: str, method: str, **case_fields):
    """One hand-written request through the WSGI app, checked against the schema like the fuzzed ones."""
    case = schema[path][method].Case(**case_fields)
    response = case.call(headers=fuzz_world.headers)
    case.validate_response(response, checks=CHECKS)
    return response


@pytest.mark.parametrize(("path", "body", "missing"), [
    ("/api/v1/hosts/", {}, "name"),
    ("/api/v1/gpus/", {"pci_bus_id": "00000000:3B:00.0"}, "host"),
    ("/api/v1/vgpus/", {"vm": 1}, "gpu"),
])
def test_a_write_with_missing_fields_answers_the_documented_400(fuzz_world, path, body, missing):
    """Writes the placement rules govern document a 400; the field messages of plain invalid input
    are one of its shapes, not only a rule's `detail` and `violations`."""
    response = _call(fuzz_world, path, "POST", body=body, media_type="application/json")
    assert response.status_code == 400
    assert response.json()[missing] == ["This field is required."]


def test_a_run_nobody_applied_lists_applied_by_as_documented(fuzz_world):
    """A finished run not yet applied has no `applied_by`: the schema says it may be null."""
    response = _call(fuzz_world, "/api/v1/optimizer-runs/", "GET")
    run = response.json()["results"][0]
    assert run["status"] == "done"
    assert run["applied_by"] is None
    assert run["created_by"] == "admin"

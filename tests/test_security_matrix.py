"""The role matrix: what every role gets on every URL of the site (DESIGN.md "Roles").

One table, one row per URL, one status per role, for a GET and, where the URL takes writes, for
one unsafe request. The URL resolver is walked, so a URL added without a row here fails
`test_every_url_has_a_row` ("no expectation for /new/url/"). The admin site's routes are
generated from its registry and checked the same way (non-staff never get past its login).

Roles: anonymous; Ana (an artist, owner of the objects the URLs name); Bob (another artist);
an admin (staff session); automation (a staff service user's API token); an agent (the bearer
token of a telemetry agent that pushes nvidia-smi documents). Requests come from a LAN address,
not loopback, as a stray process on the studio network would. Each request runs in a rolled
back savepoint, so every role meets the same fleet.

Statuses: an int, LOGIN (302 to /login/?next=<the URL>), ADMIN_LOGIN (302 to the admin's
login), or a path for another redirect. An artist's response never carries the other
artist's names, VM or request text, whatever its status; nor, for Ana, the name of Cleo's VM or
the readings of the GPU she shares with it (a GPU's readings are every tenant's usage together).
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from django.contrib import admin
from django.contrib.contenttypes.models import ContentType
from django.db import transaction
from django.test import Client, RequestFactory
from django.test.client import MULTIPART_CONTENT
from django.urls import URLPattern, URLResolver, get_resolver
from django.utils import timezone

from alerts import services as alert_services
from alerts.models import LicencePool
from alerts.tests.worlds import gpu_alert
from fleet import requests as request_service
from fleet import services
from fleet.api_tokens import issue_token
from fleet.models import AuditEvent, Notification
from fleet.request_preview import preview
from fleet.tests.factories import ArtistFactory, GpuFactory, UserFactory, VirtualMachineFactory, profile
from hypervisors.models import Operation
from notify import services as notify_services
from notify.models import NotificationChannel
from sizing import feedback, optimizer_runs, tasks
from sizing.models import Suggestion, SuggestionAction, WorkflowPreset
from telemetry.aggregation import bucket_floor
from telemetry.models import Agent, AgentKind, GpuRollup, GpuSample
from telemetry.tests.ingest_world import SHARED_CAPTURES

pytestmark = pytest.mark.django_db

ROLES = ("anonymous", "artist", "other_artist", "admin", "automation", "agent")
LAN_ADDR = "10.20.30.40"
LOGIN = "login"
ADMIN_LOGIN = "admin-login"
#: The readings of the GPU Ana shares with Cleo (utilization %, and x100 its frame buffer in MiB).
SHARED_READING = 93.75
# What each artist may never see of the other (names, VM, request reason, notification text), and
# Ana nothing of the co-tenant of her shared GPU, its name or the GPU's readings.
# Each artist's feedback note stands for their ratings: the other never reads it anywhere.
PRIVATE = {"artist": ("ws-bob", "Bob Artist", "ws-cleo", str(SHARED_READING), str(SHARED_READING * 100),
                      "bob-feels: froze"),
           "other_artist": ("ws-ana", "Ana Artist", "ana-reason", "for Ana", "ana-feels: smooth")}

W = Any  # the world namespace


@pytest.fixture
def world(fleet_world, admin_user):
    return security_world(fleet_world, admin_user)


def security_world(fleet_world, admin_user) -> W:
    """fleet_world (Ana and Bob, a VM each on their own host) plus one of every object a URL
    names: Ana's pending request and notification, a suggestion for her VM, a finished
    optimizer run, an audit event, a workflow preset, and a push agent on Ana's host; and a
    second GPU on Ana's host that her second VM shares with Cleo's (an artist with no role
    here), with a reading and a rollup of the last minutes."""
    w = fleet_world
    w.gpu_shared = GpuFactory(host=w.host_a, pci_bus_id="00000000:5E:00.0")
    services.place_vgpu(VirtualMachineFactory(name="ws-ana-2", artist=w.ana), w.gpu_shared, w.profile_12q)
    services.place_vgpu(VirtualMachineFactory(name="ws-cleo", artist=ArtistFactory(name="Cleo Artist")),
                        w.gpu_shared, w.profile_12q)
    recent = timezone.now() - timedelta(minutes=10)
    GpuSample.objects.create(gpu=w.gpu_shared, ts=recent, util_gpu=SHARED_READING, fb_used_mib=SHARED_READING * 100)
    for step in (300, 3600):  # what the heatmap's time columns and its hour-of-week fold read
        GpuRollup.objects.create(gpu=w.gpu_shared, step_s=step, bucket=bucket_floor(recent, step), samples=30,
                                 util_gpu_avg=SHARED_READING, util_gpu_max=SHARED_READING,
                                 util_gpu_p95=SHARED_READING, fb_used_mib_avg=SHARED_READING * 100,
                                 fb_used_mib_max=SHARED_READING * 100, fb_used_mib_p95=SHARED_READING * 100)
    w.admin = admin_user
    w.bot = UserFactory(username="ci-bot", is_staff=True)
    w.request = request_service.file_request(w.vm_a, w.ana.user, profile("RTX6000-24Q"), 1, "ana-reason: bigger scenes")
    w.note = Notification.objects.create(user=w.ana.user, message="for Ana: hello", url="/me/")
    now = timezone.now()
    w.suggestion = Suggestion.objects.create(
        vm=w.vm_a, current_profile=w.profile_12q, suggested_profile=profile("RTX6000-6Q"),
        action=SuggestionAction.DOWNSIZE, reason="small scenes", evidence={}, evidence_key="k1",
        window_start=now, window_end=now, computed_at=now,
    )
    w.run = optimizer_runs.start_run(admin_user)
    tasks.run_optimizer(w.run.pk)
    w.preset = WorkflowPreset.objects.order_by("pk").first()
    w.event = AuditEvent.objects.order_by("pk").first()
    w.agent = Agent.objects.create(name="smi-a", kind=AgentKind.NVIDIA_SMI, host=w.host_a)
    w.token_key = issue_token(w.bot, "ci")[1]
    w.ana_token, _ = issue_token(w.ana.user, "matrix script", scope="read")
    # A pending operation on Ana's VM (host_a is not linked: the row alone, for the routes).
    w.operation = Operation.objects.create(kind="resize", vm=w.vm_a, host=w.host_a, target_host=w.host_a,
                                           origin="the role matrix")
    # An in-app channel (a test through it succeeds without a network) and one delivery of it.
    w.channel, _ = notify_services.save_channel(NotificationChannel(), name="matrix channel", kind="in_app")
    w.delivery = notify_services.send_test(w.channel)
    # An open alert on Ana's GPU (draining it plans moving her VM; each request is rolled back), a
    # silence of it, and a licence pool.
    w.alert = gpu_alert(w.gpu_a)
    w.silence = alert_services.create_silence(admin_user, reason="matrix", alert=w.alert,
                                              ends_at=now + timedelta(hours=1))
    w.pool = LicencePool.objects.create(edition="vws", owned=10)
    # Today's ratings of Ana's and Bob's VMs, each by its artist.
    w.feedback, _ = feedback.file_feedback(w.ana.user, w.vm_a, 5, ["fine"], "ana-feels: smooth")
    w.bob_feedback, _ = feedback.file_feedback(w.bob.user, w.vm_b, 1, ["out_of_gpu_memory"], "bob-feels: froze")
    return w


def clients_for(w: W) -> dict[str, Client]:
    clients = {role: Client(REMOTE_ADDR=LAN_ADDR) for role in ROLES}
    clients["artist"].force_login(w.ana.user)
    clients["other_artist"].force_login(w.bob.user)
    clients["admin"].force_login(w.admin)
    clients["automation"].defaults["HTTP_AUTHORIZATION"] = f"Token {w.token_key}"
    clients["agent"].defaults["HTTP_AUTHORIZATION"] = f"Bearer {w.agent.token}"
    return clients


def send(client: Client, method: str, url: str, body: Any = None, content_type: str = "application/json"):
    """One request whose writes are rolled back, so the next role meets the same fleet."""
    with transaction.atomic():
        if body is None:
            response = getattr(client, method)(url)
        else:
            response = getattr(client, method)(url, body, content_type=content_type)
        transaction.set_rollback(True)
    return response


def outcome(response) -> int | str:
    if response.status_code == 302:
        location = response["Location"]
        if location.startswith("/login/?next="):
            return LOGIN
        if location.startswith("/admin/login/?next="):
            return ADMIN_LOGIN
        return location
    return response.status_code


# --- the table ------------------------------------------------------------------------------

def _range() -> str:
    end = int(time.time())
    return f"start={end - 3600}&end={end}"


def _push_body(w: W) -> bytes:
    """A real nvidia-smi capture stamped now, as a cron job on the agent's host would push it."""
    stamp = datetime.now(UTC)
    raw = (SHARED_CAPTURES / "tesla-t4.xml").read_text()
    return re.sub(r"<timestamp>[^<]*</timestamp>", f"<timestamp>{stamp:%a %b %d %H:%M:%S %Y}</timestamp>",
                  raw, count=1).encode()


@dataclass(frozen=True)
class Unsafe:
    method: str
    expect: tuple
    body: Callable[[W], Any] | None = None
    content_type: str = "application/json"


@dataclass(frozen=True)
class Row:
    route: str  # the resolver's route, as template_of() writes it
    url: Callable[[W], str]
    get: tuple  # one outcome per role, in ROLES order
    unsafe: Unsafe | None = None
    name: str = ""  # test id where two rows share a route


#            anonymous  artist  other  admin  automation  agent
PAGE_ADMINS = (LOGIN, 403, 403, 200, LOGIN, LOGIN)
PAGE_OWN = (LOGIN, 200, 404, 200, LOGIN, LOGIN)
PAGE_SIGNED_IN = (LOGIN, 200, 200, 200, LOGIN, LOGIN)
POST_ONLY = (LOGIN, 405, 405, 405, LOGIN, LOGIN)
POST_ONLY_STAFF = (405,) * 6  # require_POST runs before the login check
API_ADMINS = (401, 403, 403, 200, 200, 401)
API_SIGNED_IN = (401, 200, 200, 200, 200, 401)
API_OWN = (401, 200, 404, 200, 200, 401)
API_POST_ONLY = (401, 405, 405, 405, 405, 401)
API_ADMIN_POST_ONLY = (401, 403, 403, 405, 405, 401)
API_WRITE_ADMINS = (401, 403, 403, 400, 400, 401)  # staff pass the permission, then the empty body fails
API_READ_ONLY = (401, 403, 403, 405, 405, 401)
API_READ_ONLY_SIGNED_IN = (401, 405, 405, 405, 405, 401)


def _staff_form(status_for_admin):
    return (LOGIN, 403, 403, status_for_admin, LOGIN, LOGIN)


ROWS = [
    # pages (fleet)
    # An artist's home is their workstation page.
    Row("", lambda w: "/", (LOGIN, "/me/", "/me/", 200, LOGIN, LOGIN)),
    Row("overview/live/", lambda w: "/overview/live/", PAGE_ADMINS),
    Row("me/", lambda w: "/me/", PAGE_SIGNED_IN),
    Row("hosts/", lambda w: "/hosts/", PAGE_ADMINS),
    Row("hosts/{pk}/", lambda w: f"/hosts/{w.host_a.pk}/", PAGE_ADMINS),
    Row("hosts/{pk}/hypervisor/check/", lambda w: f"/hosts/{w.host_a.pk}/hypervisor/check/", _staff_form(405),
        Unsafe("post", _staff_form("/hosts/{host}/#hypervisor"), lambda w: {})),
    Row("hosts/{pk}/hypervisor/sync/", lambda w: f"/hosts/{w.host_a.pk}/hypervisor/sync/", _staff_form(405),
        Unsafe("post", _staff_form("/hosts/{host}/#hypervisor"), lambda w: {"apply": "all"})),
    Row("gpus/", lambda w: "/gpus/", PAGE_ADMINS),
    Row("gpus/{pk}/", lambda w: f"/gpus/{w.gpu_a.pk}/", PAGE_ADMINS),
    Row("vms/", lambda w: "/vms/", PAGE_ADMINS),
    Row("vms/{pk}/", lambda w: f"/vms/{w.vm_a.pk}/", PAGE_OWN),
    Row("artists/", lambda w: "/artists/", PAGE_ADMINS),
    Row("artists/{pk}/", lambda w: f"/artists/{w.ana.pk}/", PAGE_OWN),
    Row("requests/", lambda w: "/requests/", PAGE_ADMINS),
    Row("requests/{pk}/{verb}/", lambda w: f"/requests/{w.request.pk}/approve/", POST_ONLY,
        Unsafe("post", _staff_form("/requests/"), lambda w: {"comment": "ok", "confirm": "on",
                                                            "fingerprint": preview(w.request).fingerprint},
               MULTIPART_CONTENT),  # a form, as the confirm step posts it
        name="requests/{pk}/approve/"),
    Row("requests/{pk}/review/", lambda w: f"/requests/{w.request.pk}/review/", PAGE_ADMINS),
    Row("requests/{pk}/room/", lambda w: f"/requests/{w.request.pk}/room/", PAGE_ADMINS),
    Row("requests/{pk}/{verb}/", lambda w: f"/requests/{w.request.pk}/cancel/", POST_ONLY,
        Unsafe("post", (LOGIN, "/me/", 403, "/requests/", LOGIN, LOGIN), lambda w: {}),
        name="requests/{pk}/cancel/"),
    Row("me/vms/{vm_pk}/request/", lambda w: f"/me/vms/{w.vm_a.pk}/request/", POST_ONLY,
        Unsafe("post", (LOGIN, "/me/", 403, "/me/", LOGIN, LOGIN), lambda w: {})),
    # The feedback prompt of /me/: Send for one's own VM only (an empty form: a message on /me/), Not now.
    Row("me/vms/{vm_pk}/feedback/", lambda w: f"/me/vms/{w.vm_a.pk}/feedback/", POST_ONLY,
        Unsafe("post", (LOGIN, "/me/", 403, 403, LOGIN, LOGIN), lambda w: {})),
    Row("me/feedback/not-now/", lambda w: "/me/feedback/not-now/", POST_ONLY,
        Unsafe("post", (LOGIN, "/me/", "/me/", "/me/", LOGIN, LOGIN), lambda w: {})),
    Row("notifications/", lambda w: "/notifications/", PAGE_SIGNED_IN),
    Row("scheduler/", lambda w: "/scheduler/", PAGE_ADMINS),
    Row("scheduler/gpus/{pk}/", lambda w: f"/scheduler/gpus/{w.gpu_a.pk}/", PAGE_ADMINS,
        Unsafe("post", _staff_form(400), lambda w: {})),
    Row("scheduler/gpus/{pk}/apply/", lambda w: f"/scheduler/gpus/{w.gpu_a.pk}/apply/", _staff_form(405),
        Unsafe("post", _staff_form("/scheduler/gpus/{gpu}/"), lambda w: {})),
    Row("scheduler/gpus/{pk}/box/", lambda w: f"/scheduler/gpus/{w.gpu_a.pk}/box/", PAGE_ADMINS),
    Row("scheduler/gpus/{pk}/clear/", lambda w: f"/scheduler/gpus/{w.gpu_a.pk}/clear/", _staff_form(405),
        Unsafe("post", _staff_form("/scheduler/gpus/{gpu}/"), lambda w: {})),
    Row("scheduler/hosts/{pk}/", lambda w: f"/scheduler/hosts/{w.host_a.pk}/", PAGE_ADMINS,
        Unsafe("post", _staff_form(400), lambda w: {})),
    Row("scheduler/models/{pk}/", lambda w: f"/scheduler/models/{w.gpu_a.gpu_model_id}/", PAGE_ADMINS,
        Unsafe("post", _staff_form(400), lambda w: {})),
    Row("audit/", lambda w: "/audit/", PAGE_ADMINS),
    # pages (telemetry)
    Row("heatmap/", lambda w: "/heatmap/", PAGE_ADMINS),
    Row("agents/", lambda w: "/agents/", PAGE_ADMINS),
    # pages (hypervisors)
    Row("drift/", lambda w: "/drift/", PAGE_ADMINS),
    Row("operations/", lambda w: "/operations/", PAGE_ADMINS),
    Row("operations/{pk}/", lambda w: f"/operations/{w.operation.pk}/", PAGE_OWN),
    Row("operations/{pk}/run/", lambda w: f"/operations/{w.operation.pk}/run/", POST_ONLY_STAFF,
        Unsafe("post", _staff_form("/operations/{operation}/"), lambda w: {})),
    Row("operations/{pk}/cancel/", lambda w: f"/operations/{w.operation.pk}/cancel/", POST_ONLY_STAFF,
        Unsafe("post", _staff_form("/operations/{operation}/"), lambda w: {"reason": "matrix"})),
    # pages (notification channels)
    Row("alerts/channels/", lambda w: "/alerts/channels/", PAGE_ADMINS),
    Row("alerts/channels/new/", lambda w: "/alerts/channels/new/", PAGE_ADMINS,
        Unsafe("post", _staff_form(400), lambda w: {}, MULTIPART_CONTENT)),
    Row("alerts/channels/{pk}/", lambda w: f"/alerts/channels/{w.channel.pk}/", PAGE_ADMINS,
        Unsafe("post", _staff_form(400), lambda w: {}, MULTIPART_CONTENT)),
    Row("alerts/channels/{pk}/test/", lambda w: f"/alerts/channels/{w.channel.pk}/test/", POST_ONLY_STAFF,
        Unsafe("post", _staff_form("/alerts/channels/{channel}/"), lambda w: {})),
    Row("alerts/channels/{pk}/delete/", lambda w: f"/alerts/channels/{w.channel.pk}/delete/", POST_ONLY_STAFF,
        Unsafe("post", _staff_form("/alerts/channels/"), lambda w: {})),
    Row("alerts/deliveries/", lambda w: "/alerts/deliveries/", PAGE_ADMINS),
    # pages (alerts, licences, versions)
    Row("alerts/", lambda w: "/alerts/", PAGE_ADMINS),
    Row("alerts/{pk}/", lambda w: f"/alerts/{w.alert.pk}/", PAGE_ADMINS),
    Row("alerts/{pk}/acknowledge/", lambda w: f"/alerts/{w.alert.pk}/acknowledge/", POST_ONLY_STAFF,
        Unsafe("post", _staff_form("/alerts/{alert}/"), lambda w: {"note": "mine"})),
    Row("alerts/{pk}/silence/", lambda w: f"/alerts/{w.alert.pk}/silence/", POST_ONLY_STAFF,
        Unsafe("post", _staff_form("/alerts/{alert}/"), lambda w: {})),
    Row("alerts/rules/", lambda w: "/alerts/rules/", PAGE_ADMINS,
        Unsafe("post", _staff_form("/alerts/rules/"), lambda w: {})),
    Row("alerts/silences/", lambda w: "/alerts/silences/", PAGE_ADMINS),
    Row("alerts/silences/{pk}/end/", lambda w: f"/alerts/silences/{w.silence.pk}/end/", POST_ONLY_STAFF,
        Unsafe("post", _staff_form("/alerts/silences/"), lambda w: {})),
    Row("licences/", lambda w: "/licences/", PAGE_ADMINS, Unsafe("post", _staff_form(200), lambda w: {},
                                                                 MULTIPART_CONTENT)),
    Row("versions/", lambda w: "/versions/", PAGE_ADMINS),
    # pages (alerts)
    Row("alerts/{pk}/drain/", lambda w: f"/alerts/{w.alert.pk}/drain/", POST_ONLY_STAFF,
        Unsafe("post", _staff_form("/sizing/optimizer/{next_run}/"), lambda w: {})),
    # pages (sizing)
    Row("sizing/suggestions/", lambda w: "/sizing/suggestions/", PAGE_ADMINS),
    Row("sizing/suggestions/refresh/", lambda w: "/sizing/suggestions/refresh/", POST_ONLY_STAFF,
        Unsafe("post", _staff_form("/sizing/suggestions/"), lambda w: {})),
    Row("sizing/suggestions/{pk}/accept/", lambda w: f"/sizing/suggestions/{w.suggestion.pk}/accept/",
        POST_ONLY_STAFF, Unsafe("post", _staff_form("/sizing/suggestions/"), lambda w: {})),
    Row("sizing/suggestions/{pk}/dismiss/", lambda w: f"/sizing/suggestions/{w.suggestion.pk}/dismiss/",
        POST_ONLY_STAFF, Unsafe("post", _staff_form("/sizing/suggestions/"), lambda w: {})),
    Row("sizing/suggestions/{pk}/restore/", lambda w: f"/sizing/suggestions/{w.suggestion.pk}/restore/",
        POST_ONLY_STAFF, Unsafe("post", _staff_form("/sizing/suggestions/"), lambda w: {})),
    Row("sizing/planner/", lambda w: "/sizing/planner/", PAGE_ADMINS),
    Row("sizing/feedback/", lambda w: "/sizing/feedback/", PAGE_ADMINS),
    Row("sizing/study/", lambda w: "/sizing/study/", PAGE_ADMINS),
    Row("sizing/study.csv", lambda w: "/sizing/study.csv", PAGE_ADMINS),
    Row("sizing/optimizer/", lambda w: "/sizing/optimizer/", PAGE_ADMINS,
        Unsafe("post", _staff_form("/sizing/optimizer/{next_run}/"), lambda w: {})),
    Row("sizing/optimizer/{pk}/", lambda w: f"/sizing/optimizer/{w.run.pk}/", PAGE_ADMINS),
    Row("sizing/optimizer/{pk}/apply/", lambda w: f"/sizing/optimizer/{w.run.pk}/apply/", POST_ONLY_STAFF,
        Unsafe("post", _staff_form("/sizing/optimizer/{run}/"), lambda w: {})),
    Row("sizing/optimizer/{pk}/run-operations/", lambda w: f"/sizing/optimizer/{w.run.pk}/run-operations/",
        POST_ONLY_STAFF, Unsafe("post", _staff_form("/sizing/optimizer/{run}/"), lambda w: {})),
    # sign-in
    Row("login/", lambda w: "/login/", (200, "/", "/", "/", 200, 200)),
    Row("logout/", lambda w: "/logout/", (405,) * 6, Unsafe("post", ("/login/",) * 6)),
    # API: hypervisors (host_a is not linked: a sync is a 409, a check records why)
    Row("api/v1/hosts/{pk}/hypervisor/", lambda w: f"/api/v1/hosts/{w.host_a.pk}/hypervisor/", API_ADMINS),
    Row("api/v1/hosts/{pk}/hypervisor/check/", lambda w: f"/api/v1/hosts/{w.host_a.pk}/hypervisor/check/",
        API_ADMIN_POST_ONLY, Unsafe("post", (401, 403, 403, 200, 200, 401))),
    Row("api/v1/hosts/{pk}/sync/", lambda w: f"/api/v1/hosts/{w.host_a.pk}/sync/", (401, 403, 403, 404, 404, 401),
        Unsafe("post", (401, 403, 403, 409, 409, 401), lambda w: {"apply": "all"})),
    Row("api/v1/drift/", lambda w: "/api/v1/drift/", API_ADMINS, Unsafe("post", API_READ_ONLY, lambda w: {})),
    # API: operations (read like VMs: the artist sees her own; only admins run or cancel)
    Row("api/v1/operations/", lambda w: "/api/v1/operations/", (401, 200, 200, 200, 200, 401),
        Unsafe("post", API_READ_ONLY, lambda w: {})),
    Row("api/v1/operations/{pk}/", lambda w: f"/api/v1/operations/{w.operation.pk}/", API_OWN),
    Row("api/v1/operations/{pk}/run/", lambda w: f"/api/v1/operations/{w.operation.pk}/run/", API_POST_ONLY,
        Unsafe("post", (401, 403, 403, 202, 202, 401), lambda w: {})),
    Row("api/v1/operations/{pk}/cancel/", lambda w: f"/api/v1/operations/{w.operation.pk}/cancel/", API_POST_ONLY,
        Unsafe("post", (401, 403, 403, 200, 200, 401), lambda w: {"reason": "matrix"})),
    # API: scheduler
    Row("api/v1/gpus/{pk}/scheduler/", lambda w: f"/api/v1/gpus/{w.gpu_a.pk}/scheduler/", API_ADMINS,
        Unsafe("put", API_WRITE_ADMINS, lambda w: {})),
    Row("api/v1/gpus/{pk}/scheduler/apply/", lambda w: f"/api/v1/gpus/{w.gpu_a.pk}/scheduler/apply/",
        API_ADMIN_POST_ONLY, Unsafe("post", (401, 403, 403, 409, 409, 401))),
    Row("api/v1/hosts/{pk}/scheduler/", lambda w: f"/api/v1/hosts/{w.host_a.pk}/scheduler/", API_ADMINS,
        Unsafe("put", API_WRITE_ADMINS, lambda w: {})),
    Row("api/v1/gpu-models/{pk}/scheduler/", lambda w: f"/api/v1/gpu-models/{w.gpu_a.gpu_model_id}/scheduler/",
        API_ADMINS, Unsafe("put", API_WRITE_ADMINS, lambda w: {})),
    # API: inventory (catalog readable by every signed-in user; the rest scoped to the artist)
    Row("api/v1/gpu-models/", lambda w: "/api/v1/gpu-models/", API_SIGNED_IN,
        Unsafe("post", API_WRITE_ADMINS, lambda w: {})),
    Row("api/v1/gpu-models/{pk}/", lambda w: f"/api/v1/gpu-models/{w.gpu_a.gpu_model_id}/", API_SIGNED_IN,
        Unsafe("patch", (401, 403, 403, 400, 400, 401), lambda w: {"fb_mib": -1})),
    Row("api/v1/vgpu-profiles/", lambda w: "/api/v1/vgpu-profiles/", API_SIGNED_IN,
        Unsafe("post", API_WRITE_ADMINS, lambda w: {})),
    Row("api/v1/vgpu-profiles/{pk}/", lambda w: f"/api/v1/vgpu-profiles/{w.profile_12q.pk}/", API_SIGNED_IN,
        Unsafe("patch", (401, 403, 403, 400, 400, 401), lambda w: {"fb_mib": -1})),
    Row("api/v1/hosts/", lambda w: "/api/v1/hosts/", API_SIGNED_IN, Unsafe("post", API_WRITE_ADMINS, lambda w: {})),
    Row("api/v1/hosts/{pk}/", lambda w: f"/api/v1/hosts/{w.host_a.pk}/", API_OWN,
        Unsafe("patch", (401, 403, 403, 400, 400, 401), lambda w: {"cpu_threads": -1})),
    # The host's NVIDIA software (telemetry): whoever sees the host; read-only.
    Row("api/v1/hosts/{pk}/driver/", lambda w: f"/api/v1/hosts/{w.host_a.pk}/driver/", API_OWN,
        Unsafe("post", API_READ_ONLY_SIGNED_IN, lambda w: {})),
    Row("api/v1/gpus/", lambda w: "/api/v1/gpus/", API_SIGNED_IN, Unsafe("post", API_WRITE_ADMINS, lambda w: {})),
    Row("api/v1/gpus/{pk}/", lambda w: f"/api/v1/gpus/{w.gpu_a.pk}/", API_OWN,
        Unsafe("patch", (401, 403, 403, 400, 400, 401), lambda w: {"mode": "nonsense"})),
    Row("api/v1/artists/", lambda w: "/api/v1/artists/", API_SIGNED_IN,
        Unsafe("post", API_WRITE_ADMINS, lambda w: {})),
    Row("api/v1/artists/{pk}/", lambda w: f"/api/v1/artists/{w.ana.pk}/", API_OWN,
        Unsafe("patch", (401, 403, 403, 400, 400, 401), lambda w: {"workflow": "nonsense"})),
    Row("api/v1/vms/", lambda w: "/api/v1/vms/", API_SIGNED_IN, Unsafe("post", API_WRITE_ADMINS, lambda w: {})),
    Row("api/v1/vms/{pk}/", lambda w: f"/api/v1/vms/{w.vm_a.pk}/", API_OWN,
        Unsafe("patch", (401, 403, 403, 400, 400, 401), lambda w: {"vcpus": -1})),
    Row("api/v1/vgpus/", lambda w: "/api/v1/vgpus/", API_SIGNED_IN, Unsafe("post", API_WRITE_ADMINS, lambda w: {})),
    Row("api/v1/vgpus/{pk}/", lambda w: f"/api/v1/vgpus/{w.vgpu_a.pk}/", API_OWN,
        Unsafe("delete", (401, 403, 403, 204, 204, 401))),
    # API: resize requests and notifications
    Row("api/v1/resize-requests/", lambda w: "/api/v1/resize-requests/", API_SIGNED_IN,
        Unsafe("post", (401, 400, 403, 400, 400, 401),
               lambda w: {"vm": w.vm_a.pk, "requested_profile": w.profile_12q.pk, "reason": ""})),
    Row("api/v1/resize-requests/{pk}/", lambda w: f"/api/v1/resize-requests/{w.request.pk}/", API_OWN,
        Unsafe("patch", API_READ_ONLY_SIGNED_IN, lambda w: {"reason": "changed"})),
    Row("api/v1/resize-requests/{pk}/approve/", lambda w: f"/api/v1/resize-requests/{w.request.pk}/approve/",
        API_ADMIN_POST_ONLY, Unsafe("post", (401, 403, 403, 200, 200, 401), lambda w: {"comment": "ok"})),
    Row("api/v1/resize-requests/{pk}/reject/", lambda w: f"/api/v1/resize-requests/{w.request.pk}/reject/",
        API_ADMIN_POST_ONLY, Unsafe("post", API_WRITE_ADMINS, lambda w: {})),
    Row("api/v1/resize-requests/{pk}/cancel/", lambda w: f"/api/v1/resize-requests/{w.request.pk}/cancel/",
        API_POST_ONLY, Unsafe("post", (401, 200, 404, 200, 200, 401))),
    Row("api/v1/notifications/", lambda w: "/api/v1/notifications/", API_SIGNED_IN,
        Unsafe("post", API_READ_ONLY_SIGNED_IN, lambda w: {})),
    Row("api/v1/notifications/read-all/", lambda w: "/api/v1/notifications/read-all/", API_POST_ONLY,
        Unsafe("post", API_SIGNED_IN)),
    # A notification is its addressee's alone: even an admin gets 404 on Ana's.
    Row("api/v1/notifications/{pk}/", lambda w: f"/api/v1/notifications/{w.note.pk}/",
        (401, 200, 404, 404, 404, 401)),
    Row("api/v1/notifications/{pk}/read/", lambda w: f"/api/v1/notifications/{w.note.pk}/read/", API_POST_ONLY,
        Unsafe("post", (401, 200, 404, 404, 404, 401))),
    # API: audit, agents, telemetry
    Row("api/v1/audit-events/", lambda w: "/api/v1/audit-events/", API_ADMINS,
        Unsafe("post", API_READ_ONLY, lambda w: {})),
    Row("api/v1/audit-events/{pk}/", lambda w: f"/api/v1/audit-events/{w.event.pk}/", API_ADMINS,
        Unsafe("delete", API_READ_ONLY)),
    Row("api/v1/", lambda w: "/api/v1/", API_SIGNED_IN),
    # API tokens: everyone their own (an empty body issues a write token of the requester), admins all.
    Row("api/v1/api-tokens/", lambda w: "/api/v1/api-tokens/", API_SIGNED_IN,
        Unsafe("post", (401, 201, 201, 201, 201, 401), lambda w: {})),
    Row("api/v1/api-tokens/{pk}/", lambda w: f"/api/v1/api-tokens/{w.ana_token.pk}/", API_OWN,
        Unsafe("delete", API_READ_ONLY_SIGNED_IN)),  # revoking is POST revoke/, which keeps the row
    Row("api/v1/api-tokens/{pk}/revoke/", lambda w: f"/api/v1/api-tokens/{w.ana_token.pk}/revoke/", API_POST_ONLY,
        Unsafe("post", (401, 200, 404, 200, 200, 401), lambda w: {"reason": "matrix"})),
    Row("api/v1/agents/", lambda w: "/api/v1/agents/", API_ADMINS, Unsafe("post", API_WRITE_ADMINS, lambda w: {})),
    # API: notification channels and deliveries (admins only, reading included)
    Row("api/v1/notification-channels/", lambda w: "/api/v1/notification-channels/", API_ADMINS,
        Unsafe("post", API_WRITE_ADMINS, lambda w: {})),
    Row("api/v1/notification-channels/{pk}/", lambda w: f"/api/v1/notification-channels/{w.channel.pk}/",
        API_ADMINS, Unsafe("patch", API_WRITE_ADMINS, lambda w: {"min_severity": "fatal"})),
    Row("api/v1/notification-channels/{pk}/test/", lambda w: f"/api/v1/notification-channels/{w.channel.pk}/test/",
        API_ADMIN_POST_ONLY, Unsafe("post", (401, 403, 403, 200, 200, 401))),
    Row("api/v1/notification-channels/{pk}/deliveries/",
        lambda w: f"/api/v1/notification-channels/{w.channel.pk}/deliveries/", API_ADMINS,
        Unsafe("post", API_READ_ONLY, lambda w: {})),
    Row("api/v1/deliveries/", lambda w: "/api/v1/deliveries/", API_ADMINS, Unsafe("post", API_READ_ONLY, lambda w: {})),
    Row("api/v1/deliveries/{pk}/", lambda w: f"/api/v1/deliveries/{w.delivery.pk}/", API_ADMINS,
        Unsafe("delete", API_READ_ONLY)),
    # API: alerts, their rules, silences and licences (admins only, reading included)
    Row("api/v1/alerts/", lambda w: "/api/v1/alerts/", API_ADMINS, Unsafe("post", API_READ_ONLY, lambda w: {})),
    Row("api/v1/alerts/{pk}/", lambda w: f"/api/v1/alerts/{w.alert.pk}/", API_ADMINS,
        Unsafe("delete", API_READ_ONLY)),
    Row("api/v1/alerts/{pk}/acknowledge/", lambda w: f"/api/v1/alerts/{w.alert.pk}/acknowledge/",
        API_ADMIN_POST_ONLY, Unsafe("post", (401, 403, 403, 200, 200, 401))),
    Row("api/v1/alert-rules/", lambda w: "/api/v1/alert-rules/", API_ADMINS,
        Unsafe("post", API_READ_ONLY, lambda w: {})),
    Row("api/v1/alert-rules/{pk}/", lambda w: f"/api/v1/alert-rules/{w.alert.rule_id}/", API_ADMINS,
        Unsafe("patch", API_WRITE_ADMINS, lambda w: {"params": {"clear_after_minutes": 0}})),
    Row("api/v1/silences/", lambda w: "/api/v1/silences/", API_ADMINS,
        Unsafe("post", API_WRITE_ADMINS, lambda w: {})),
    Row("api/v1/silences/{pk}/", lambda w: f"/api/v1/silences/{w.silence.pk}/", API_ADMINS,
        Unsafe("delete", API_READ_ONLY)),
    Row("api/v1/silences/{pk}/end/", lambda w: f"/api/v1/silences/{w.silence.pk}/end/", API_ADMIN_POST_ONLY,
        Unsafe("post", (401, 403, 403, 200, 200, 401))),
    Row("api/v1/licence-pools/", lambda w: "/api/v1/licence-pools/", API_ADMINS,
        Unsafe("post", API_WRITE_ADMINS, lambda w: {})),
    Row("api/v1/licence-pools/{pk}/", lambda w: f"/api/v1/licence-pools/{w.pool.pk}/", API_ADMINS,
        Unsafe("patch", API_WRITE_ADMINS, lambda w: {"owned": -1})),
    Row("api/v1/licences/", lambda w: "/api/v1/licences/", API_ADMINS, Unsafe("post", API_READ_ONLY, lambda w: {})),
    Row("api/v1/agents/{pk}/", lambda w: f"/api/v1/agents/{w.agent.pk}/", API_ADMINS,
        Unsafe("patch", API_WRITE_ADMINS, lambda w: {"timeout_s": -1})),
    Row("api/v1/agents/{pk}/rotate-token/", lambda w: f"/api/v1/agents/{w.agent.pk}/rotate-token/",
        API_ADMIN_POST_ONLY, Unsafe("post", (401, 403, 403, 200, 200, 401))),
    Row("api/v1/gpus/{pk}/metrics/", lambda w: f"/api/v1/gpus/{w.gpu_a.pk}/metrics/?{_range()}", API_OWN),
    # A GPU Ana shares with Cleo's VM: she sees the GPU (capacity), never its readings.
    Row("api/v1/gpus/{pk}/metrics/", lambda w: f"/api/v1/gpus/{w.gpu_shared.pk}/metrics/?{_range()}",
        (401, 403, 404, 200, 200, 401), name="api/v1/gpus/{pk}/metrics/ shared"),
    Row("api/v1/gpus/{pk}/", lambda w: f"/api/v1/gpus/{w.gpu_shared.pk}/", API_OWN, name="api/v1/gpus/{pk}/ shared"),
    Row("api/v1/vms/{pk}/metrics/", lambda w: f"/api/v1/vms/{w.vm_a.pk}/metrics/?{_range()}", API_OWN),
    # Agent tokens open this URL and nothing else; sessions do not open it. A staff user's API
    # token (ingest or write scope) pushes for the agent it names with ?agent= (400 without).
    Row("api/v1/ingest/nvidia-smi/", lambda w: "/api/v1/ingest/nvidia-smi/", (401, 401, 401, 401, 405, 405),
        Unsafe("post", (401, 401, 401, 401, 400, 201), _push_body, "application/xml")),
    Row("api/v1/heatmap/", lambda w: f"/api/v1/heatmap/?metric=util_gpu&{_range()}", API_SIGNED_IN),
    Row("api/v1/heatmap/", lambda w: f"/api/v1/heatmap/?group=host&metric=fb_used_mib&{_range()}", API_SIGNED_IN,
        name="api/v1/heatmap/ hosts"),
    Row("api/v1/heatmap/", lambda w: f"/api/v1/heatmap/?group=host&fold=hour_of_week&{_range()}", API_SIGNED_IN,
        name="api/v1/heatmap/ host-week"),
    # The typed answer is cached and compressed outside DRF's renderers: the same doors.
    Row("api/v1/heatmap/", lambda w: f"/api/v1/heatmap/?encoding=typed&rows_max=2&{_range()}", API_SIGNED_IN,
        name="api/v1/heatmap/ typed"),
    Row("api/v1/sizing/plan/", lambda w: "/api/v1/sizing/plan/", API_ADMIN_POST_ONLY,
        Unsafe("post", API_WRITE_ADMINS, lambda w: {})),
    # API: sizing
    Row("api/v1/suggestions/", lambda w: "/api/v1/suggestions/", API_SIGNED_IN,
        Unsafe("post", API_READ_ONLY, lambda w: {})),
    Row("api/v1/suggestions/{pk}/", lambda w: f"/api/v1/suggestions/{w.suggestion.pk}/", API_OWN),
    Row("api/v1/suggestions/{pk}/accept/", lambda w: f"/api/v1/suggestions/{w.suggestion.pk}/accept/",
        API_POST_ONLY, Unsafe("post", (401, 403, 403, 409, 409, 401))),
    Row("api/v1/suggestions/{pk}/dismiss/", lambda w: f"/api/v1/suggestions/{w.suggestion.pk}/dismiss/",
        API_POST_ONLY, Unsafe("post", (401, 403, 403, 200, 200, 401))),
    Row("api/v1/suggestions/{pk}/restore/", lambda w: f"/api/v1/suggestions/{w.suggestion.pk}/restore/",
        API_POST_ONLY, Unsafe("post", (401, 403, 403, 200, 200, 401))),
    # Feedback: an artist files for her own VM (a second the same day updates it: 200) and reads her own.
    Row("api/v1/feedback/", lambda w: "/api/v1/feedback/", API_SIGNED_IN,
        Unsafe("post", (401, 200, 403, 403, 403, 401), lambda w: {"vm": w.vm_a.pk, "rating": 4})),
    Row("api/v1/feedback/{pk}/", lambda w: f"/api/v1/feedback/{w.feedback.pk}/", API_OWN,
        Unsafe("patch", API_READ_ONLY_SIGNED_IN, lambda w: {"rating": 1})),
    Row("api/v1/feedback/trends/", lambda w: "/api/v1/feedback/trends/", API_ADMINS),
    Row("api/v1/workflow-presets/", lambda w: "/api/v1/workflow-presets/", API_ADMINS),
    Row("api/v1/workflow-presets/{pk}/", lambda w: f"/api/v1/workflow-presets/{w.preset.pk}/", API_ADMINS,
        Unsafe("patch", API_WRITE_ADMINS, lambda w: {"fb_mib": -1})),
    Row("api/v1/optimizer-runs/", lambda w: "/api/v1/optimizer-runs/", API_ADMINS,
        Unsafe("post", (401, 403, 403, 201, 201, 401), lambda w: {})),
    Row("api/v1/optimizer-runs/{pk}/", lambda w: f"/api/v1/optimizer-runs/{w.run.pk}/", API_ADMINS),
    Row("api/v1/optimizer-runs/{pk}/apply/", lambda w: f"/api/v1/optimizer-runs/{w.run.pk}/apply/",
        API_ADMIN_POST_ONLY, Unsafe("post", (401, 403, 403, 200, 200, 401))),
    # API: alerts (staff only)
    Row("api/v1/alerts/{pk}/drain/", lambda w: f"/api/v1/alerts/{w.alert.pk}/drain/", API_ADMIN_POST_ONLY,
        Unsafe("post", (401, 403, 403, 202, 202, 401))),
    # schema, docs, probes
    Row("api/schema/", lambda w: "/api/schema/", API_SIGNED_IN),
    Row("api/docs/", lambda w: "/api/docs/", API_SIGNED_IN),
    Row("healthz", lambda w: "/healthz", (200,) * 6),
    # Prometheus text: a staff session or API token (or METRICS_TOKEN); no artist, no agent token.
    Row("metrics", lambda w: "/metrics", (401, 403, 403, 200, 200, 401)),
]


def _fill(expect: tuple, w: W) -> tuple:
    names = {"gpu": w.gpu_a.pk, "run": w.run.pk, "next_run": w.run.pk + 1, "host": w.host_a.pk,
             "operation": w.operation.pk, "channel": w.channel.pk, "alert": w.alert.pk}
    return tuple(e.format(**names) if isinstance(e, str) else e for e in expect)


def assert_matches(got: dict, want: dict) -> None:
    wrong = [f"{' '.join(key)}: got {got[key]!r}, expected {want[key]!r}" for key in want if got[key] != want[key]]
    assert not wrong, "\n".join(wrong)


# --- the resolver ---------------------------------------------------------------------------

def walk(patterns, prefix: str = ""):
    """(route, pattern) of every URL the resolver knows, includes flattened."""
    for pattern in patterns:
        if isinstance(pattern, URLResolver):
            yield from walk(pattern.url_patterns, prefix + str(pattern.pattern))
        elif isinstance(pattern, URLPattern):
            yield prefix + str(pattern.pattern), pattern


def template_of(route: str) -> str:
    """`api/v1/^hosts/(?P<pk>[^/.]+)/$` and `hosts/<int:pk>/` both become `.../{pk}/`."""
    route = re.sub(r"\(\?P<(\w+)>[^)]*\)", r"{\1}", route)
    route = re.sub(r"<(?:\w+:)?(\w+)>", r"{\1}", route)
    return route.replace("^", "").replace("$", "").replace("\\.", ".").replace("/?", "/")


def site_routes() -> dict[str, list]:
    """Every route outside the admin site -> its view callbacks. Format-suffix twins
    (`hosts.{format}`, DRF's `.json`) are folded into their route, checked to run the same view."""
    routes: dict[str, list] = {}
    twins = []
    for route, pattern in walk(get_resolver().url_patterns):
        template = template_of(route)
        if template.startswith("admin/"):
            continue
        if "{format}" in template:
            twins.append((template, pattern.callback))
            continue
        routes.setdefault(template, []).append(pattern.callback)
    for template, callback in twins:
        base = re.sub(r"\.?\{format\}/?$", "", template)
        base = base if base.endswith("/") else base + "/"
        assert base in routes, f"no route {base} for the format-suffix route {template}"
        assert any(getattr(c, "cls", c) is getattr(callback, "cls", callback) for c in routes[base]), template
    return routes


def test_every_url_has_a_row():
    covered = {row.route for row in ROWS}
    missing = [f"no expectation for /{route}" for route in site_routes() if route not in covered]
    assert not missing, "\n".join(missing)
    stale = [row.route for row in ROWS if row.route not in site_routes()]
    assert not stale, f"rows for URLs that no longer exist: {stale}"


@pytest.mark.parametrize("row", ROWS, ids=lambda row: row.name or row.route or "/")
def test_role_matrix(world, row):
    check_row(world, row)


def check_row(world, row: Row, outcome_of: Callable[[Any], int | str] = outcome) -> None:
    """Every role's GET of the row's URL, and its unsafe request, get what the row says."""
    clients = clients_for(world)
    url = row.url(world)
    calls = [("get", row.get, None, "application/json")]
    if row.unsafe:
        body = row.unsafe.body(world) if row.unsafe.body else None
        calls.append((row.unsafe.method, _fill(row.unsafe.expect, world), body, row.unsafe.content_type))
    got, want = {}, {}
    for method, expect, body, content_type in calls:
        for role, expected in zip(ROLES, expect, strict=True):
            response = send(clients[role], method, url, body, content_type)
            got[method, role], want[method, role] = outcome_of(response), expected
            for secret in PRIVATE.get(role, ()):
                assert secret.encode() not in response.content, f"{role} sees {secret!r} on {method} {url}"
    assert_matches(got, want)


@pytest.mark.parametrize("scope", ["read", "ingest"])
def test_token_scopes_hold_on_every_api_url(world, scope):
    """The automation user's token of scope read gets what its write token gets on every GET and
    403 naming its scope on every write; of scope ingest, 403 on every API URL and /metrics, reads
    included, but the ingest route. Every row is walked, so a view that sets its own permission
    classes cannot let a token past its scope."""
    client = Client(REMOTE_ADDR=LAN_ADDR, HTTP_AUTHORIZATION=f"Token {issue_token(world.bot, scope=scope)[1]}")
    got, want = {}, {}
    for row in ROWS:
        if not (row.route.startswith("api/") or row.route == "metrics"):
            continue  # pages and sign-in take sessions only
        ingest = row.route.startswith("api/v1/ingest/")
        calls = [("get", (row.get[ROLES.index("automation")] if scope == "read" else 405 if ingest else 403),
                  None, "application/json")]
        if row.unsafe:
            expected = 400 if ingest and scope == "ingest" else 403  # 400: a token push names its agent
            calls.append((row.unsafe.method, expected, row.unsafe.body(world) if row.unsafe.body else None,
                          row.unsafe.content_type))
        for method, expected, body, content_type in calls:
            response = send(client, method, row.url(world), body, content_type)
            key = (row.name or row.route, method)
            got[key], want[key] = outcome(response), expected
            if response.status_code == 403 and "html" not in response["Content-Type"]:  # /api/docs/: the 403 page
                assert f"scope is {scope}".encode() in response.content, key
    assert_matches(got, want)

# --- OpenID Connect's routes (only while it is configured) ------------------------------------
# config/urls.py includes /oidc/ only when OIDC_RP_CLIENT_ID is set. The table above is checked
# with the default settings, where these routes do not exist (a row for them would be stale),
# so they have their own rows, checked with OIDC on for a provider at a closed port
# (identity/tests/oidc_support.py): the resolver's routes then are ROWS' and OIDC_ROWS', every
# one with a row. Anyone may start a sign-in or come back from the provider (a session signed in
# with a password is not sent to the provider for renewal); the sign-in itself is tested against
# a real provider in identity/tests/test_oidc_provider.py.
PROVIDER = "the provider's authorization endpoint"
OIDC_ROWS = [
    Row("oidc/authenticate/", lambda w: "/oidc/authenticate/?next=/vms/", (PROVIDER,) * 6,
        Unsafe("post", (405,) * 6)),
    # Without a sign-in under way: back to the login page.
    Row("oidc/callback/", lambda w: "/oidc/callback/", ("/login/",) * 6, Unsafe("post", (405,) * 6)),
    Row("oidc/logout/", lambda w: "/oidc/logout/", (405,) * 6, Unsafe("post", ("/login/",) * 6)),
]


@pytest.fixture
def oidc_on():
    from identity.tests.oidc_support import oidc_enabled, unreachable_env

    with oidc_enabled(unreachable_env()) as configured:
        yield configured


def test_every_oidc_url_has_a_row(oidc_on):
    routes = site_routes()
    missing = [f"no expectation for /{route}" for route in routes if route not in {r.route for r in ROWS + OIDC_ROWS}]
    assert not missing, "\n".join(missing)
    assert {row.route for row in OIDC_ROWS} <= set(routes)


@pytest.mark.parametrize("row", OIDC_ROWS, ids=lambda row: row.route)
def test_oidc_role_matrix(world, oidc_on, row):
    endpoint = oidc_on["OIDC_OP_AUTHORIZATION_ENDPOINT"]

    def outcome_of(response):
        location = response.get("Location", "") if response.status_code == 302 else ""
        return PROVIDER if location.startswith(f"{endpoint}?") else outcome(response)

    check_row(world, row, outcome_of)


# --- the admin site -------------------------------------------------------------------------

def admin_urls(w: W) -> list[tuple[str, str, int]]:
    """(route, concrete URL, staff status) for every admin route: each registered model's
    changelist, add, object, change, delete and history pages, and the site's own pages."""
    factory = RequestFactory()
    request = factory.get("/admin/")
    request.user = w.admin
    rows = []
    seen = set()
    for model, model_admin in admin.site._registry.items():
        base = f"/admin/{model._meta.app_label}/{model._meta.model_name}/"
        obj = model._default_manager.order_by("pk").first()
        object_id = str(obj.pk) if obj else "0"
        view = model_admin.has_view_or_change_permission(request, obj)
        delete = model_admin.has_delete_permission(request, obj)
        gone = "/admin/"  # the admin's "no such object" redirect
        rows += [
            ("changelist", base, 200 if model_admin.has_view_or_change_permission(request) else 403),
            ("add", base + "add/", 200 if model_admin.has_add_permission(request) else 403),
            ("object", f"{base}{object_id}/", f"{base}{object_id}/change/"),
            ("change", f"{base}{object_id}/change/", (200 if view else 403) if obj else gone),
            ("delete", f"{base}{object_id}/delete/", 403 if not delete else 200 if obj else gone),
            ("history", f"{base}{object_id}/history/", (200 if view else 403) if obj else gone),
        ]
        seen.add(model._meta.app_label)
    vm_type = ContentType.objects.get_for_model(type(w.vm_a))
    rows += [
        ("index", "/admin/", 200),
        ("password_change", "/admin/password_change/", 200),
        ("password_change_done", "/admin/password_change/done/", 200),
        ("autocomplete", "/admin/autocomplete/", 403),
        ("user_password", f"/admin/auth/user/{w.ana.user.pk}/password/", 200),
        # "Sign out everywhere" on a user's page (identity/admin.py) takes a POST only
        ("user_sign_out_everywhere", f"/admin/auth/user/{w.ana.user.pk}/sign-out-everywhere/", 405),
        ("view_on_site", f"/admin/r/{vm_type.pk}/{w.vm_a.pk}/", 404),
        ("catch_all", "/admin/no-such-page/", 404),
        *[("app_list", f"/admin/{label}/", 200) for label in sorted(seen)],
    ]
    return rows


ADMIN_ROUTE_KINDS = {
    "admin/": "index", "admin/login/": "login", "admin/logout/": "logout",
    "admin/password_change/": "password_change", "admin/password_change/done/": "password_change_done",
    "admin/autocomplete/": "autocomplete", "admin/jsi18n/": "jsi18n",
    "admin/r/{content_type_id}/{object_id}/": "view_on_site", "admin/{url}": "catch_all",
}


def admin_route_kind(template: str) -> str:
    """Which kind of admin URL a resolver route is; unknown kinds fail the coverage test."""
    if template in ADMIN_ROUTE_KINDS:
        return ADMIN_ROUTE_KINDS[template]
    if re.fullmatch(r"admin/\{app_label\}/", template):
        return "app_list"
    if re.fullmatch(r"admin/auth/user/\{id\}/password/", template):
        return "user_password"
    if re.fullmatch(r"admin/auth/user/\{object_id\}/sign-out-everywhere/", template):
        return "user_sign_out_everywhere"
    match = re.fullmatch(r"admin/\w+/\w+/(?:(add)/|\{object_id\}/(?:(change|delete|history)/)?)?", template)
    if match:
        return match.group(1) or match.group(2) or ("object" if "{object_id}" in template else "changelist")
    return f"unknown: {template}"


def test_every_admin_url_has_a_row(world):
    kinds = {kind for kind, _, _ in admin_urls(world)} | {"login", "logout", "jsi18n"}
    unknown = sorted({admin_route_kind(template_of(route)) for route, _ in walk(get_resolver().url_patterns)
                      if template_of(route).startswith("admin/")} - kinds)
    assert not unknown, f"no expectation for these admin URLs: {unknown}"


def test_admin_site_admits_staff_sessions_only(world):
    """Everyone but a staff session is sent to the admin's login, for GET and POST alike; the
    automation token (a staff user's) opens no admin page: the admin site takes sessions only."""
    clients = clients_for(world)
    got, want = {}, {}
    for _, url, staff_status in admin_urls(world):
        for role in ROLES:
            expected = staff_status if role == "admin" else ADMIN_LOGIN
            got["get", role, url], want["get", role, url] = outcome(send(clients[role], "get", url)), expected
            if role != "admin":
                response = send(clients[role], "post", url, {})
                got["post", role, url], want["post", role, url] = outcome(response), ADMIN_LOGIN
    assert_matches(got, want)


def test_admin_login_logout_and_translations(world):
    clients = clients_for(world)
    for role in ROLES:
        login = outcome(send(clients[role], "get", "/admin/login/"))
        assert login == ("/admin/" if role == "admin" else 200), role
        logout = outcome(send(clients[role], "get", "/admin/logout/"))
        assert logout == (405 if role == "admin" else "/admin/"), role  # sign-out is a POST
        jsi18n = outcome(send(clients[role], "get", "/admin/jsi18n/"))
        assert jsi18n == (200 if role == "admin" else ADMIN_LOGIN), role

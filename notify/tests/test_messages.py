"""The message and its renderers, without a database."""

from __future__ import annotations

import json

import pytest

from notify import messages
from notify.messages import Message, MessageError

XID = Message(key="alert:42", event="firing", severity="critical", rule="xid",
              title="GPU 0 of host-a reported Xid 79", body="The GPU fell off the bus.", url="/gpus/7/",
              data={"host": "host-a", "gpu": 7, "vms": ["ws-ana"]})


def test_the_webhook_body_carries_the_schema_and_every_field_of_the_message():
    body = json.loads(messages.encode(messages.webhook_payload(XID, delivery_id=5, sent_at=1700000000.0,
                                                               site_url="https://fleet.example")))
    assert body == {"schema": "vgpu-fleet.alert.v1", "delivery": 5, "sent_at": 1700000000.0, "key": "alert:42",
                    "event": "firing", "severity": "critical", "rule": "xid",
                    "title": "GPU 0 of host-a reported Xid 79", "body": "The GPU fell off the bus.",
                    "url": "/gpus/7/", "link": "https://fleet.example/gpus/7/",
                    "data": {"host": "host-a", "gpu": 7, "vms": ["ws-ana"]}}


def test_the_chat_body_is_one_text_with_the_headline_and_the_link():
    assert messages.chat_payload(XID, "https://fleet.example") == {
        "text": "[CRITICAL] firing: GPU 0 of host-a reported Xid 79\nThe GPU fell off the bus.\n"
                "https://fleet.example/gpus/7/"}


def test_the_email_names_severity_event_rule_and_link():
    assert messages.email_subject(XID) == "vGPU fleet [CRITICAL] firing: GPU 0 of host-a reported Xid 79"
    body = messages.email_body(XID)
    assert "The GPU fell off the bus." in body
    assert "Rule: xid" in body
    assert "Details: /gpus/7/" in body


def test_a_signature_verifies_and_any_change_fails_it():
    body = messages.encode(messages.webhook_payload(XID, delivery_id=1, sent_at=1700000000.0))
    headers = messages.signed_headers("s3cret", body, now=1700000000)
    stamp, header = headers["X-Fleet-Timestamp"], headers["X-Fleet-Signature"]
    assert header.startswith("sha256=")
    assert len(header) == 7 + 64
    assert messages.verify_signature("s3cret", stamp, body, header, now=1700000010)
    assert not messages.verify_signature("other", stamp, body, header, now=1700000010)
    assert not messages.verify_signature("s3cret", stamp, body + b" ", header, now=1700000010)
    assert not messages.verify_signature("s3cret", str(int(stamp) + 1), body, header, now=1700000010)
    # a post replayed after the tolerance is refused, however well signed
    assert not messages.verify_signature("s3cret", stamp, body, header, tolerance_s=300, now=1700000301)
    assert not messages.verify_signature("s3cret", "not-a-time", body, header)


@pytest.mark.parametrize(("changes", "complaint"), [
    ({"event": "exploded"}, "event"),
    ({"severity": "fatal"}, "severity"),
    ({"rule": "Xid 79"}, "rule"),
    ({"key": ""}, "key"),
    ({"title": ""}, "title"),
    ({"url": "https://elsewhere.example/"}, "url"),
    ({"data": {"when": object()}}, "JSON"),
])
def test_a_message_built_wrong_is_refused_naming_what(changes, complaint):
    fields = {**XID.as_dict(), **changes}
    with pytest.raises(MessageError, match=complaint):
        Message(**fields)

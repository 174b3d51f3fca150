"""What a notification says and how each kind of channel receives it: pure Python, no ORM.

A `Message` is what a caller (alert evaluation, later other parts of the product) hands to
`notify.services.dispatch`; the renderers below turn it into an e-mail, the generic webhook's
JSON body (schema WEBHOOK_SCHEMA, documented in docs/notifications.md) or a chat body
(`{"text": ...}`, which Slack, Mattermost and Teams incoming webhooks accept). Webhook bodies
are signed with HMAC-SHA256 over "<timestamp>.<body>"; `verify_signature` is the receiver's
side, written to be copied into a receiver as it is (stdlib only).
"""

from __future__ import annotations

import hashlib
import hmac
import json
import re
import time
from dataclasses import asdict, dataclass, field
from typing import Any

#: Version of the generic webhook body; a change that breaks receivers gets a new one.
WEBHOOK_SCHEMA = "vgpu-fleet.alert.v1"
TIMESTAMP_HEADER = "X-Fleet-Timestamp"
SIGNATURE_HEADER = "X-Fleet-Signature"
DELIVERY_HEADER = "X-Fleet-Delivery"

EVENTS = ("firing", "resolved", "acknowledged", "test")
#: Severities, least severe first: a channel takes messages at or above its minimum.
SEVERITIES = ("info", "warning", "critical")
#: A rule's slug: lowercase letters, digits, "_" and "-", starting with a letter.
RULE_SLUG = re.compile(r"^[a-z][a-z0-9_-]{0,63}$")
MAX_KEY = 200
MAX_TITLE = 200


class MessageError(ValueError):
    """A message a caller built wrong (an unknown event or severity, a bad rule slug)."""


def severity_rank(severity: str) -> int:
    """0 for info, 1 for warning, 2 for critical."""
    return SEVERITIES.index(severity)


@dataclass(frozen=True)
class Message:
    """One thing to tell admins about, e.g. an alert firing.

    `key` identifies what it is about across events ("alert:42": its firing and its resolution
    share it), so receivers can group and deduplicate; `url` is the path of the page about it;
    `data` is JSON-serializable detail (host, gpu, vms, artists ...) passed on to webhooks."""

    key: str
    event: str
    severity: str
    rule: str
    title: str
    body: str = ""
    url: str = ""
    data: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self):
        if not self.key or len(self.key) > MAX_KEY:
            raise MessageError(f"key must be 1 to {MAX_KEY} characters")
        if self.event not in EVENTS:
            raise MessageError(f"event {self.event!r} is not one of {', '.join(EVENTS)}")
        if self.severity not in SEVERITIES:
            raise MessageError(f"severity {self.severity!r} is not one of {', '.join(SEVERITIES)}")
        if not RULE_SLUG.match(self.rule):
            raise MessageError(f"rule {self.rule!r} is not a slug (lowercase letters, digits, _ and -)")
        if not self.title:
            raise MessageError("title must not be empty")
        if self.url and not self.url.startswith("/"):
            raise MessageError(f"url {self.url!r} must be a path starting with /")
        try:
            json.dumps(self.data)
        except (TypeError, ValueError) as exc:
            raise MessageError(f"data is not JSON-serializable: {exc}") from None

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def link(message: Message, site_url: str = "") -> str:
    """The message's page as an address: absolute when the site's address is known."""
    if not message.url:
        return ""
    return site_url.rstrip("/") + message.url if site_url else message.url


def headline(message: Message) -> str:
    """"[CRITICAL] firing: GPU 0 of host-a reported Xid 79" and the like."""
    return f"[{message.severity.upper()}] {message.event}: {message.title}"


def email_subject(message: Message) -> str:
    return ("vGPU fleet " + headline(message))[:250]


def email_body(message: Message, site_url: str = "") -> str:
    lines = [headline(message), ""]
    if message.body:
        lines += [message.body, ""]
    lines.append(f"Rule: {message.rule}")
    if address := link(message, site_url):
        lines.append(f"Details: {address}")
    return "\n".join(lines) + "\n"


def webhook_payload(message: Message, *, delivery_id: int | None, sent_at: float, site_url: str = "") -> dict:
    """The generic webhook's body (schema WEBHOOK_SCHEMA): the message's fields, the absolute
    link when known, the delivery's id (the same on every retry of one delivery) and the time
    this attempt was made (Unix seconds)."""
    return {
        "schema": WEBHOOK_SCHEMA, "delivery": delivery_id, "sent_at": sent_at, "key": message.key,
        "event": message.event, "severity": message.severity, "rule": message.rule, "title": message.title,
        "body": message.body, "url": message.url, "link": link(message, site_url), "data": message.data,
    }


def chat_payload(message: Message, site_url: str = "") -> dict:
    """`{"text": ...}`: the one body Slack, Mattermost and (Office 365 connector) Teams incoming
    webhooks all accept. Plain text with the link on its own line, which all three turn into a link."""
    lines = [headline(message)]
    if message.body:
        lines.append(message.body)
    if address := link(message, site_url):
        lines.append(address)
    return {"text": "\n".join(lines)}


def encode(payload: dict) -> bytes:
    """JSON as sent: compact, keys sorted, UTF-8, so the signed bytes are the bytes posted."""
    return json.dumps(payload, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode()


def signature(secret: str, timestamp: str, body: bytes) -> str:
    """"sha256=<hex HMAC-SHA256(secret, "<timestamp>.<body>")>"."""
    mac = hmac.new(secret.encode(), timestamp.encode() + b"." + body, hashlib.sha256)
    return "sha256=" + mac.hexdigest()


def signed_headers(secret: str, body: bytes, now: float | None = None) -> dict[str, str]:
    """The X-Fleet-Timestamp (Unix seconds) and X-Fleet-Signature headers of a webhook post."""
    timestamp = str(int(time.time() if now is None else now))
    return {TIMESTAMP_HEADER: timestamp, SIGNATURE_HEADER: signature(secret, timestamp, body)}


def verify_signature(secret: str, timestamp: str, body: bytes, header: str, tolerance_s: float = 300,
                     now: float | None = None) -> bool:
    """A receiver's check of a webhook post: the signature matches the raw body and timestamp,
    and the timestamp is within `tolerance_s` of now (an old post replayed is refused)."""
    try:
        sent = int(timestamp)
    except (TypeError, ValueError):
        return False
    current = time.time() if now is None else now
    if abs(current - sent) > tolerance_s:
        return False
    return hmac.compare_digest(signature(secret, timestamp, body), header or "")

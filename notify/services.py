"""Notification channels' writes and the deliveries of messages through them.

`dispatch(message)` makes one Delivery per enabled channel whose filters take the message and
hands each to a worker once the transaction commits (`notify.tasks.deliver`). `attempt` sends
one delivery: it first claims the row by a conditional update (attempts + 1 and a lease,
`claimed_until`), so two workers never send the same delivery at once, and records the outcome;
a failure is retried with exponential backoff (NOTIFY_RETRY_BASE_S, doubling, plus up to 10%
jitter) until NOTIFY_MAX_ATTEMPTS attempts, then the delivery is failed. Beat's
`send_due_deliveries` enqueues the retries that are due and the deliveries whose worker was
lost (a lease that ran out, a pending one never taken), so delivery resumes after a crash.
Delivery is at least once: a worker killed after the receiver got the post but before it
recorded so leads to a second post with the same delivery id (X-Fleet-Delivery).
"""

from __future__ import annotations

import logging
import random
import smtplib
import time
import urllib.error
import urllib.request
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime, timedelta

from celery import current_app
from django.conf import settings
from django.contrib.auth import get_user_model
from django.core.mail import EmailMessage, get_connection
from django.db import transaction
from django.db.models import F, Q
from django.utils import timezone

from fleet import audit
from fleet.models import Notification, VirtualMachine
from fleet.requests import notify_artist
from notify import messages
from notify.choices import OPEN_STATUSES, ChannelKind, DeliveryStatus
from notify.models import Delivery, NotificationChannel, new_secret

log = logging.getLogger(__name__)

DELIVER_TASK = "notify.tasks.deliver"
#: Fields of a channel the audit log keeps (never its secret).
AUDIT_FIELDS = ["id", "name", "kind", "enabled", "target", "min_severity", "rules"]
#: A pending delivery not taken this long after it was made lost its task (the worker or the
#: broker went away): beat hands it out again.
PENDING_GRACE_S = 60
#: HTTP answers worth trying again; any other 4xx will not change by itself.
RETRIED_HTTP = frozenset({408, 425, 429})
#: The most of a receiver's answer kept in `last_error`.
ERROR_CHARS = 500


class SendError(Exception):
    """A send failed; `permanent` ones are not tried again, `status` is the HTTP answer if any."""

    def __init__(self, message: str, status: int | None = None, permanent: bool = False):
        super().__init__(message)
        self.status = status
        self.permanent = permanent


def _snapshot(channel: NotificationChannel | None) -> dict | None:
    return audit.snapshot(channel, AUDIT_FIELDS)


# Channels ------------------------------------------------------------------------------------


def save_channel(channel: NotificationChannel, **fields) -> tuple[NotificationChannel, str | None]:
    """Create or update `channel` with `fields` (validated by the model's `clean`) and record it
    in the audit log. Returns the channel and its new secret when one was generated (a webhook
    created without one): the only time it is shown."""
    with transaction.atomic():
        current = NotificationChannel.objects.filter(pk=channel.pk).first() if channel.pk else None
        before, old_secret = _snapshot(current), current.secret if current else ""
        for name, value in fields.items():
            setattr(channel, name, value)
        generated = None
        if channel.kind == ChannelKind.WEBHOOK and not channel.secret:
            channel.secret = generated = new_secret()
        elif channel.kind != ChannelKind.WEBHOOK:
            channel.secret = ""
        channel.full_clean()
        channel.save()
        after = _snapshot(channel)
        comment = "secret changed" if before is not None and channel.secret != old_secret else ""
        if before is None:
            audit.record("notification_channel.create", channel, after=after)
        elif audit.changed(before, after) or comment:
            audit.record("notification_channel.update", channel, before=before, after=after, comment=comment)
    return channel, generated


def delete_channel(channel: NotificationChannel) -> None:
    """Delete the channel; its deliveries stay in the history (an open one fails when its turn comes)."""
    with transaction.atomic():
        before, pk, name = _snapshot(channel), channel.pk, str(channel)
        channel.delete()
        audit.record("notification_channel.delete", before=before, object_type="notification_channel",
                     object_id=pk, object_repr=name)


# Dispatch ------------------------------------------------------------------------------------


def _delivery(channel: NotificationChannel, message: messages.Message, now: datetime) -> Delivery:
    return Delivery(channel=channel, channel_name=channel.name, kind=channel.kind, key=message.key,
                    event=message.event, severity=message.severity, rule=message.rule,
                    title=message.title[:messages.MAX_TITLE], body=message.body, url=message.url[:300],
                    data=message.data, status=DeliveryStatus.PENDING, next_attempt_at=now)


def enqueue(delivery_id: int) -> None:
    """Hand a delivery to a worker (a broker outage leaves it for beat's `send_due_deliveries`)."""
    try:
        # By name: notify.tasks imports this module.
        current_app.tasks[DELIVER_TASK].delay(delivery_id)
    except Exception:  # noqa: BLE001 - beat hands it out again after PENDING_GRACE_S
        log.warning("could not enqueue delivery %s; beat will", delivery_id, exc_info=True)


def dispatch(message: messages.Message) -> list[Delivery]:
    """One pending Delivery per enabled channel that takes `message` (its minimum severity and
    rules), each sent by a worker once the caller's transaction commits. Returns them (none when
    no channel takes it)."""
    return dispatch_many([message])


def dispatch_many(batch: list[messages.Message]) -> list[Delivery]:
    """`dispatch` for several messages at once (an evaluation that opens hundreds of alerts): the
    channels read once, the deliveries written in one statement, handed over after commit."""
    now = timezone.now()
    channels = list(NotificationChannel.objects.filter(enabled=True).order_by("pk"))
    rows = [_delivery(channel, message, now) for message in batch for channel in channels if channel.takes(message)]
    if not rows:
        return []
    with transaction.atomic():
        deliveries = Delivery.objects.bulk_create(rows)
        ids = [delivery.pk for delivery in deliveries]
        transaction.on_commit(lambda: [enqueue(pk) for pk in ids])
    return deliveries


def sample_message(channel: NotificationChannel) -> messages.Message:
    return messages.Message(
        key=f"test:channel:{channel.pk}", event="test", severity="info", rule="test",
        title=f"Test of the channel {channel.name}",
        body="An admin sent this test from the vGPU fleet dashboard. Nothing needs doing.",
        url="/alerts/channels/", data={"channel": channel.pk})


def send_test(channel: NotificationChannel) -> Delivery:
    """Send a test message to `channel` now, whatever its filters and even when disabled (to try
    it before switching it on), and return the delivery with the outcome. A failed first attempt
    is retried like any other delivery."""
    with transaction.atomic():
        delivery = _delivery(channel, sample_message(channel), timezone.now())
        delivery.save()
        audit.record("notification_channel.test", channel, comment=f"delivery {delivery.pk}")
    return attempt(delivery.pk) or Delivery.objects.get(pk=delivery.pk)


# Sending -------------------------------------------------------------------------------------


def retry_delay_s(attempts: int) -> float:
    """Seconds before the attempt after `attempts` failed ones: NOTIFY_RETRY_BASE_S, doubling."""
    return settings.NOTIFY_RETRY_BASE_S * 2 ** max(0, attempts - 1)


def claim_lease_s() -> float:
    """How long a claim holds: longer than a send can take (its timeout, with room to record)."""
    return 2 * settings.NOTIFY_TIMEOUT_S + 30


def _claim(delivery_id: int, now: datetime) -> tuple[Delivery, datetime] | None:
    """Take the delivery for one attempt, or None when it is sent, failed, not due, or another
    worker's claim on it still holds."""
    lease = now + timedelta(seconds=claim_lease_s())
    taken = (Delivery.objects.filter(pk=delivery_id, status__in=OPEN_STATUSES, next_attempt_at__lte=now)
             .filter(Q(claimed_until__isnull=True) | Q(claimed_until__lte=now))
             .update(claimed_until=lease, attempts=F("attempts") + 1))
    if not taken:
        return None
    return Delivery.objects.select_related("channel").get(pk=delivery_id), lease


def attempt(delivery_id: int) -> Delivery | None:
    """Claim and send one delivery, then record the outcome; None when it was not ours to send."""
    claimed = _claim(delivery_id, timezone.now())
    if claimed is None:
        return None
    delivery, lease = claimed
    status = None
    try:
        status = _send(delivery)
    except SendError as exc:
        return _failed(delivery, lease, str(exc), exc.status, exc.permanent)
    except Exception as exc:  # noqa: BLE001 - any failure of one send is that delivery's, recorded
        log.warning("delivery %s to %s failed", delivery.pk, delivery.channel_name, exc_info=True)
        return _failed(delivery, lease, f"{type(exc).__name__}: {exc}", None, False)
    now = timezone.now()
    Delivery.objects.filter(pk=delivery.pk, claimed_until=lease).update(
        status=DeliveryStatus.SENT, sent_at=now, claimed_until=None, next_attempt_at=None, last_error="",
        response_status=status)
    delivery.refresh_from_db()
    return delivery


def _failed(delivery: Delivery, lease: datetime, error: str, status: int | None, permanent: bool) -> Delivery:
    now = timezone.now()
    give_up = permanent or delivery.attempts >= settings.NOTIFY_MAX_ATTEMPTS
    if give_up:
        values = {"status": DeliveryStatus.FAILED, "next_attempt_at": None}
    else:
        delay = retry_delay_s(delivery.attempts) * (1 + random.uniform(0, 0.1))  # noqa: S311 - jitter, not secrets
        values = {"status": DeliveryStatus.RETRYING, "next_attempt_at": now + timedelta(seconds=delay)}
    Delivery.objects.filter(pk=delivery.pk, claimed_until=lease).update(
        claimed_until=None, last_error=error[:4000], response_status=status, **values)
    delivery.refresh_from_db()
    return delivery


def _send(delivery: Delivery) -> int | None:
    """Send one delivery through its channel; the HTTP status for webhooks. SendError on failure."""
    channel = delivery.channel
    if channel is None:
        raise SendError("The channel was deleted.", permanent=True)
    if not channel.enabled and delivery.event != "test":
        raise SendError("The channel is disabled.", permanent=True)
    message = delivery.message
    site_url = settings.NOTIFY_SITE_URL
    if channel.kind == ChannelKind.EMAIL:
        _send_email(channel.addresses, message, site_url)
        return None
    if channel.kind == ChannelKind.IN_APP:
        _send_in_app(message)
        return None
    if channel.kind == ChannelKind.WEBHOOK:
        body = messages.encode(messages.webhook_payload(message, delivery_id=delivery.pk, sent_at=time.time(),
                                                        site_url=site_url))
        headers = messages.signed_headers(channel.secret, body)
    else:
        body = messages.encode(messages.chat_payload(message, site_url))
        headers = {}
    headers[messages.DELIVERY_HEADER] = str(delivery.pk)
    return post_json(channel.target, body, headers)


def _send_email(addresses: list[str], message: messages.Message, site_url: str) -> None:
    connection = get_connection(timeout=settings.NOTIFY_TIMEOUT_S)
    mail = EmailMessage(messages.email_subject(message), messages.email_body(message, site_url),
                        settings.DEFAULT_FROM_EMAIL, addresses, connection=connection)
    try:
        mail.send()
    except smtplib.SMTPRecipientsRefused as exc:
        raise SendError(f"The mail server refused every recipient: {sorted(exc.recipients)}", permanent=True) from exc


def _send_in_app(message: messages.Message) -> None:
    text = messages.headline(message) + (f" {message.body}" if message.body else "")
    admins = get_user_model().objects.filter(is_staff=True, is_active=True).order_by("pk")
    Notification.objects.bulk_create([Notification(user=user, message=text[:500], url=message.url[:300])
                                      for user in admins])


class _NoRedirect(urllib.request.HTTPRedirectHandler):
    """A webhook that answers with a redirect failed: following it would turn the POST into a GET."""

    def redirect_request(self, req, fp, code, msg, headers, newurl):
        return None


_opener = urllib.request.build_opener(_NoRedirect)


def post_json(url: str, body: bytes, headers: dict[str, str]) -> int:
    """POST `body` as JSON within NOTIFY_TIMEOUT_S; the status of a 2xx answer, else SendError
    (permanent for a 4xx other than RETRIED_HTTP)."""
    request = urllib.request.Request(url, data=body, method="POST", headers={
        "Content-Type": "application/json", "User-Agent": "vgpu-fleet-notify/1", **headers})
    try:
        with _opener.open(request, timeout=settings.NOTIFY_TIMEOUT_S) as response:
            response.read(ERROR_CHARS)
            return response.status
    except urllib.error.HTTPError as exc:
        text = exc.read(ERROR_CHARS).decode(errors="replace")
        permanent = 400 <= exc.code < 500 and exc.code not in RETRIED_HTTP
        raise SendError(f"HTTP {exc.code}: {text}".strip(), status=exc.code, permanent=permanent) from None
    except (urllib.error.URLError, OSError) as exc:
        reason = getattr(exc, "reason", exc)
        raise SendError(f"{type(exc).__name__}: {reason}") from None


# Beat ----------------------------------------------------------------------------------------


def due_ids(now: datetime | None = None, limit: int = 500) -> list[int]:
    """Open deliveries to hand out now: retries whose time came, claims that ran out (a worker
    lost mid-send), and pending ones whose task never ran (PENDING_GRACE_S after they were due)."""
    now = now or timezone.now()
    unclaimed = Q(claimed_until__isnull=True) | Q(claimed_until__lte=now)
    due = (Q(status=DeliveryStatus.RETRYING, next_attempt_at__lte=now)
           | Q(status=DeliveryStatus.PENDING, next_attempt_at__lte=now - timedelta(seconds=PENDING_GRACE_S)))
    rows = Delivery.objects.filter(due & unclaimed).order_by("next_attempt_at", "pk")
    return list(rows.values_list("pk", flat=True)[:limit])


def send_due(now: datetime | None = None) -> list[int]:
    """Enqueue every delivery `due_ids` names; returns their ids."""
    ids = due_ids(now)
    for pk in ids:
        enqueue(pk)
    return ids


def prune_deliveries(now: datetime | None = None, batch: int = 5000) -> int:
    """Delete sent deliveries older than NOTIFY_KEEP_DAYS, in batches; failed ones stay for
    admins to see. Returns how many went."""
    cutoff = (now or timezone.now()) - timedelta(days=settings.NOTIFY_KEEP_DAYS)
    deleted = 0
    while True:
        ids = list(Delivery.objects.filter(status=DeliveryStatus.SENT, created_at__lt=cutoff)
                   .order_by("pk").values_list("pk", flat=True)[:batch])
        if not ids:
            return deleted
        deleted += Delivery.objects.filter(pk__in=ids).delete()[0]


# Artists -------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Told:
    vm_id: int
    user_id: int


def tell_artists(vms: Iterable[VirtualMachine], message_text: str, url: str | None = None) -> list[Told]:
    """Tell each VM's artist about their own VM: an in-app note, and mail where they have an
    address (`fleet.requests.notify_artist`). Each note is written per VM: "{vm}" in
    `message_text` (and "{vm_id}" in `url`) becomes that VM's name (id), so one call about
    several VMs never shows an artist another's VM. `url` defaults to the VM's page. VMs
    without an artist are skipped. Returns who was told about which VM."""
    told = []
    for vm in vms:
        user = getattr(getattr(vm, "artist", None), "user", None)
        if user is None:
            continue
        text = message_text.replace("{vm}", vm.name)
        address = (url or "/vms/{vm_id}/").replace("{vm_id}", str(vm.pk))
        notify_artist(vm, text, address)
        told.append(Told(vm.pk, user.pk))
    return told

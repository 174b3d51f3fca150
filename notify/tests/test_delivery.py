"""Dispatch and delivery end to end, through real receivers on loopback: an SMTP server, an HTTP
receiver checking the webhook's signature, retries driven by beat's task under a moved clock."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta

import pytest
from django.utils import timezone

from fleet.models import Notification
from fleet.tests.factories import UserFactory
from notify import messages, services, tasks
from notify.models import Delivery, NotificationChannel
from notify.tests.test_messages import XID

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("eager")]

T0 = datetime(2026, 3, 2, 9, 0, tzinfo=UTC)
SECRET = "a-shared-secret"
UNREACHABLE = messages.Message(key="alert:7", event="firing", severity="warning", rule="agent_unreachable",
                               title="Agent of host-b unreachable", url="/agents/")


@pytest.fixture(autouse=True)
def clock(time_machine, settings):
    time_machine.move_to(T0, tick=False)
    settings.NOTIFY_RETRY_BASE_S, settings.NOTIFY_MAX_ATTEMPTS, settings.NOTIFY_TIMEOUT_S = 30, 6, 5
    settings.NOTIFY_SITE_URL = "https://fleet.example"
    return time_machine


def channel(name, kind, target="", **fields) -> NotificationChannel:
    made, _ = services.save_channel(NotificationChannel(), name=name, kind=kind, target=target, **fields)
    return made


def send(message, capture) -> list[Delivery]:
    """dispatch as a caller does, the commit's callbacks (the enqueued tasks) run eagerly."""
    with capture(execute=True):
        deliveries = services.dispatch(message)
    return [Delivery.objects.get(pk=d.pk) for d in deliveries]


def at(clock, seconds: float):
    clock.move_to(T0 + timedelta(seconds=seconds), tick=False)


def test_email_reaches_the_smtp_server(smtp, django_capture_on_commit_callbacks):
    channel("ops mail", "email", "ops@studio.example; oncall@studio.example")

    (delivery,) = send(XID, django_capture_on_commit_callbacks)

    assert (delivery.status, delivery.attempts) == ("sent", 1)
    (envelope,) = smtp.envelopes
    assert envelope.rcpt_tos == ["ops@studio.example", "oncall@studio.example"]
    text = envelope.content.decode()
    assert "Subject: vGPU fleet [CRITICAL] firing: GPU 0 of host-a reported Xid 79" in text
    assert "Details: https://fleet.example/gpus/7/" in text


def test_the_webhook_is_signed_and_carries_the_versioned_body(receiver, django_capture_on_commit_callbacks):
    hook = channel("siem", "webhook", receiver.url, secret=SECRET)

    (delivery,) = send(XID, django_capture_on_commit_callbacks)

    assert (delivery.status, delivery.response_status, delivery.channel_id) == ("sent", 200, hook.pk)
    (post,) = receiver.posts
    assert post.headers["Content-Type"] == "application/json"
    assert post.headers["X-Fleet-Delivery"] == str(delivery.pk)
    assert messages.verify_signature(SECRET, post.headers["X-Fleet-Timestamp"], post.body,
                                     post.headers["X-Fleet-Signature"], now=T0.timestamp())
    assert not messages.verify_signature("wrong", post.headers["X-Fleet-Timestamp"], post.body,
                                         post.headers["X-Fleet-Signature"], now=T0.timestamp())
    body = json.loads(post.body)
    assert (body["schema"], body["delivery"], body["key"], body["data"]["vms"]) == (
        "vgpu-fleet.alert.v1", delivery.pk, "alert:42", ["ws-ana"])


def test_the_slack_channel_posts_one_text_and_no_signature(receiver, django_capture_on_commit_callbacks):
    channel("chat", "slack", receiver.url)

    send(XID, django_capture_on_commit_callbacks)

    (post,) = receiver.posts
    assert json.loads(post.body) == {"text": "[CRITICAL] firing: GPU 0 of host-a reported Xid 79\n"
                                             "The GPU fell off the bus.\nhttps://fleet.example/gpus/7/"}
    assert "X-Fleet-Signature" not in post.headers


def test_a_failing_receiver_is_retried_with_backoff_until_it_answers(receiver, clock,
                                                                      django_capture_on_commit_callbacks):
    channel("siem", "webhook", receiver.url, secret=SECRET)
    receiver.answers = [500, 500]

    (delivery,) = send(XID, django_capture_on_commit_callbacks)
    assert (delivery.status, delivery.attempts, delivery.response_status) == ("retrying", 1, 500)
    assert "HTTP 500: receiver says no" in delivery.last_error
    first_wait = (delivery.next_attempt_at - T0).total_seconds()
    assert 30 <= first_wait <= 33  # NOTIFY_RETRY_BASE_S, plus at most 10% jitter

    at(clock, 29)
    assert tasks.send_due_deliveries() == 0  # not due yet
    at(clock, 34)
    assert tasks.send_due_deliveries() == 1
    delivery.refresh_from_db()
    assert (delivery.status, delivery.attempts) == ("retrying", 2)
    second_wait = (delivery.next_attempt_at - (T0 + timedelta(seconds=34))).total_seconds()
    assert 60 <= second_wait <= 66  # doubled

    at(clock, 34 + 67)
    assert tasks.send_due_deliveries() == 1
    delivery.refresh_from_db()
    assert (delivery.status, delivery.attempts, delivery.last_error, delivery.next_attempt_at) == ("sent", 3, "", None)
    assert delivery.sent_at == T0 + timedelta(seconds=101)
    assert len(receiver.posts) == 3
    assert {post.headers["X-Fleet-Delivery"] for post in receiver.posts} == {str(delivery.pk)}
    assert tasks.send_due_deliveries() == 0  # nothing left: sent once, never again


def test_it_gives_up_after_notify_max_attempts(receiver, clock, settings, django_capture_on_commit_callbacks):
    settings.NOTIFY_MAX_ATTEMPTS = 3
    channel("siem", "webhook", receiver.url, secret=SECRET)
    receiver.answers = [503] * 10

    (delivery,) = send(XID, django_capture_on_commit_callbacks)
    for minutes in (1, 3, 10, 60):
        at(clock, minutes * 60)
        tasks.send_due_deliveries()

    delivery.refresh_from_db()
    assert (delivery.status, delivery.attempts, delivery.next_attempt_at) == ("failed", 3, None)
    assert len(receiver.posts) == 3


def test_a_refusal_that_will_not_change_is_not_retried(receiver, django_capture_on_commit_callbacks):
    channel("siem", "webhook", receiver.url, secret=SECRET)
    receiver.answers = [404]

    (delivery,) = send(XID, django_capture_on_commit_callbacks)

    assert (delivery.status, delivery.attempts, delivery.response_status) == ("failed", 1, 404)


def test_an_unreachable_receiver_is_retried(django_capture_on_commit_callbacks):
    channel("nobody", "webhook", "http://127.0.0.1:9/hook")

    (delivery,) = send(XID, django_capture_on_commit_callbacks)

    assert (delivery.status, delivery.attempts) == ("retrying", 1)
    assert "refused" in delivery.last_error.lower()


def test_channels_take_only_their_severities_and_rules(receiver, django_capture_on_commit_callbacks):
    everything = channel("everything", "in_app")
    critical = channel("critical only", "slack", receiver.url, min_severity="critical")
    xid = channel("xid only", "slack", receiver.url, rules=["xid"])
    channel("switched off", "slack", receiver.url, enabled=False)

    warned = send(UNREACHABLE, django_capture_on_commit_callbacks)
    fired = send(XID, django_capture_on_commit_callbacks)

    assert [d.channel_id for d in warned] == [everything.pk]
    assert sorted(d.channel_id for d in fired) == sorted([everything.pk, critical.pk, xid.pk])
    assert len(receiver.posts) == 2  # critical-only and xid-only, for the Xid; the disabled channel got nothing


def test_no_channel_takes_it_no_delivery():
    channel("critical only", "in_app", min_severity="critical")
    assert services.dispatch(UNREACHABLE) == []
    assert not Delivery.objects.exists()


def test_in_app_goes_to_every_active_admin_only(admin_user, artist, django_capture_on_commit_callbacks):
    other_admin = UserFactory(username="root2", is_staff=True)
    UserFactory(username="gone", is_staff=True, is_active=False)
    channel("app", "in_app")

    send(XID, django_capture_on_commit_callbacks)

    notes = Notification.objects.order_by("user_id")
    assert [note.user for note in notes] == [admin_user, other_admin]
    assert notes[0].message.startswith("[CRITICAL] firing: GPU 0 of host-a reported Xid 79")
    assert notes[0].url == "/gpus/7/"


def test_a_claimed_delivery_is_not_sent_twice_and_resumes_once_its_worker_is_lost(
        receiver, clock, settings, django_capture_on_commit_callbacks):
    settings.NOTIFY_TIMEOUT_S = 30  # a lease (90 s) longer than a pending delivery's grace
    channel("siem", "webhook", receiver.url, secret=SECRET)
    with django_capture_on_commit_callbacks(execute=False):
        (delivery,) = services.dispatch(XID)
    # A worker takes it and is killed mid-send: its claim holds for the lease.
    assert services._claim(delivery.pk, timezone.now()) is not None

    assert services.attempt(delivery.pk) is None  # a second worker finds it taken
    at(clock, services.PENDING_GRACE_S + 1)
    assert tasks.send_due_deliveries() == 0  # still claimed
    at(clock, services.claim_lease_s() + 1)
    assert tasks.send_due_deliveries() == 1

    delivery.refresh_from_db()
    assert (delivery.status, delivery.attempts) == ("sent", 2)
    assert len(receiver.posts) == 1


def test_a_pending_delivery_whose_task_was_lost_is_sent_by_beat(receiver, clock,
                                                                 django_capture_on_commit_callbacks):
    channel("siem", "webhook", receiver.url, secret=SECRET)
    with django_capture_on_commit_callbacks(execute=False):  # the broker lost the task
        (delivery,) = services.dispatch(XID)

    at(clock, 10)
    assert tasks.send_due_deliveries() == 0  # its task may still come
    at(clock, services.PENDING_GRACE_S + 1)
    assert tasks.send_due_deliveries() == 1
    delivery.refresh_from_db()
    assert delivery.status == "sent"
    assert len(receiver.posts) == 1


def test_a_deleted_channel_keeps_its_deliveries_and_fails_the_open_ones(receiver,
                                                                          django_capture_on_commit_callbacks):
    hook = channel("siem", "webhook", receiver.url, secret=SECRET)
    (sent,) = send(XID, django_capture_on_commit_callbacks)
    with django_capture_on_commit_callbacks(execute=False):
        (open_one,) = services.dispatch(XID)

    services.delete_channel(hook)
    services.attempt(open_one.pk)

    sent.refresh_from_db()
    open_one.refresh_from_db()
    assert (sent.status, sent.channel_id, sent.channel_name) == ("sent", None, "siem")
    assert (open_one.status, open_one.last_error) == ("failed", "The channel was deleted.")
    assert len(receiver.posts) == 1


def test_sent_deliveries_are_pruned_after_notify_keep_days_and_failed_ones_stay(settings):
    settings.NOTIFY_KEEP_DAYS = 30
    app = channel("app", "in_app")
    old_sent, old_failed, new_sent = (services._delivery(app, XID, T0) for _ in range(3))
    for delivery, status in ((old_sent, "sent"), (old_failed, "failed"), (new_sent, "sent")):
        delivery.status = status
        delivery.save()
    Delivery.objects.filter(pk__in=[old_sent.pk, old_failed.pk]).update(created_at=T0 - timedelta(days=31))

    assert tasks.prune_deliveries() == 1
    assert set(Delivery.objects.values_list("pk", flat=True)) == {old_failed.pk, new_sent.pk}


def test_beat_entries_exist_after_migrate():
    from django_celery_beat.models import PeriodicTask

    entries = {task.name: task for task in PeriodicTask.objects.filter(task__startswith="notify.")}
    assert entries["send_due_deliveries"].interval.every == 30
    assert entries["send_due_deliveries"].expire_seconds < 30
    assert entries["prune_deliveries"].task == "notify.tasks.prune_deliveries"

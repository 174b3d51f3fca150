"""The pages: /alerts/channels/ (list, form, test button) and /alerts/deliveries/, admins only,
every change in the audit log; and `tell_artists`, which tells each artist of their own VM only."""

from __future__ import annotations

import pytest

from fleet.models import AuditEvent, Notification
from notify import services
from notify.models import Delivery, NotificationChannel

pytestmark = pytest.mark.django_db


def test_an_admin_creates_a_webhook_sees_its_secret_once_and_tests_it(staff, receiver, admin_user):
    created = staff.post("/alerts/channels/new/", {"name": "siem", "kind": "webhook", "target": receiver.url,
                                                   "enabled": "on", "min_severity": "warning", "rules": "xid, ecc"})

    assert created.status_code == 200
    channel = NotificationChannel.objects.get(name="siem")
    assert channel.secret in created.content.decode()
    assert channel.rules == ["ecc", "xid"]
    assert channel.secret not in staff.get(f"/alerts/channels/{channel.pk}/").content.decode()
    event = AuditEvent.objects.get(action="notification_channel.create")
    assert (event.actor, event.source, event.after["target"]) == (admin_user, "web", receiver.url)

    receiver.answers = [500]
    failed = staff.post(f"/alerts/channels/{channel.pk}/test/", follow=True)
    sent = staff.post(f"/alerts/channels/{channel.pk}/test/", follow=True)

    assert "failed: HTTP 500: receiver says no" in failed.content.decode()
    assert "Test message sent to siem (HTTP 200)" in sent.content.decode()
    listed = staff.get("/alerts/channels/").content.decode()
    assert '<span class="badge delivery-sent">sent</span>' in listed  # the last delivery of the channel


def test_editing_keeps_the_secret_and_is_audited(staff, receiver):
    channel, secret = services.save_channel(NotificationChannel(), name="siem", kind="webhook", target=receiver.url)

    saved = staff.post(f"/alerts/channels/{channel.pk}/", {"name": "siem", "kind": "webhook", "target": receiver.url,
                                                           "min_severity": "critical", "rules": ""})

    assert saved.status_code == 302
    channel.refresh_from_db()
    assert (channel.secret, channel.enabled, channel.min_severity) == (secret, False, "critical")
    event = AuditEvent.objects.get(action="notification_channel.update")
    assert (event.before["min_severity"], event.after["min_severity"]) == ("info", "critical")
    assert "secret" not in event.after


def test_a_bad_form_is_a_400_naming_the_field_and_stores_nothing(staff):
    response = staff.post("/alerts/channels/new/", {"name": "mail", "kind": "email", "target": "ops@x.example, nope",
                                                    "min_severity": "info"})

    assert response.status_code == 400
    assert 'data-errors="target"' in response.content.decode()
    assert "is not an e-mail address" in response.content.decode()
    assert not NotificationChannel.objects.exists()


def test_the_delivery_history_filters_by_channel_and_status(staff):
    app, _ = services.save_channel(NotificationChannel(), name="app", kind="in_app")
    other, _ = services.save_channel(NotificationChannel(), name="other app", kind="in_app")
    services.send_test(app)
    services.send_test(other)

    page = staff.get("/alerts/deliveries/", {"channel": app.pk, "status": "sent"})
    bad = staff.get("/alerts/deliveries/", {"status": "exploded"})

    assert page.status_code == 200
    assert "Test of the channel app" in page.content.decode()
    assert "Test of the channel other app" not in page.content.decode()
    assert bad.status_code == 400


def test_deleting_from_the_page_keeps_the_history(staff):
    app, _ = services.save_channel(NotificationChannel(), name="app", kind="in_app")
    services.send_test(app)

    assert staff.post(f"/alerts/channels/{app.pk}/delete/").status_code == 302

    assert not NotificationChannel.objects.exists()
    assert Delivery.objects.get().channel_name == "app"
    assert "(deleted)" in staff.get("/alerts/deliveries/").content.decode()


def test_artists_get_403_on_every_page(client, artist):
    channel = NotificationChannel.objects.create(name="app", kind="in_app")
    client.force_login(artist.user)
    for url in ("/alerts/channels/", "/alerts/channels/new/", f"/alerts/channels/{channel.pk}/",
                "/alerts/deliveries/"):
        assert client.get(url).status_code == 403, url
    assert client.post(f"/alerts/channels/{channel.pk}/test/").status_code == 403
    assert not Delivery.objects.exists()


def test_tell_artists_names_only_each_artists_own_vm(fleet_world, smtp, django_capture_on_commit_callbacks):
    w = fleet_world
    w.ana.user.email, w.bob.user.email = "ana@studio.example", "bob@studio.example"
    w.ana.user.save()
    w.bob.user.save()

    with django_capture_on_commit_callbacks(execute=True):
        told = services.tell_artists([w.vm_a, w.vm_b], "{vm} restarts tonight at 22:00 for a driver update.")

    assert [(t.vm_id, t.user_id) for t in told] == [(w.vm_a.pk, w.ana.user.pk), (w.vm_b.pk, w.bob.user.pk)]
    ana = Notification.objects.get(user=w.ana.user)
    bob = Notification.objects.get(user=w.bob.user)
    assert (ana.message, ana.url) == ("ws-ana restarts tonight at 22:00 for a driver update.", f"/vms/{w.vm_a.pk}/")
    assert "ws-bob" not in ana.message
    assert "ws-ana" not in bob.message
    mails = {tuple(e.rcpt_tos): e.content.decode() for e in smtp.envelopes}
    assert "ws-ana" in mails[("ana@studio.example",)]
    assert "ws-bob" not in mails[("ana@studio.example",)]
    assert "ws-ana" not in mails[("bob@studio.example",)]

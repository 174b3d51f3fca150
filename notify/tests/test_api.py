"""The notification channels and deliveries API: admins only, the secret write-only (shown once
when generated), bad input a 400 naming the field with nothing stored, the test action's outcome."""

from __future__ import annotations

import pytest

from fleet.models import AuditEvent
from notify.models import Delivery, NotificationChannel

pytestmark = pytest.mark.django_db

URL = "/api/v1/notification-channels/"


def test_creating_a_webhook_without_a_secret_shows_the_generated_one_once(admin_api, receiver):
    created = admin_api.post(URL, {"name": "siem", "kind": "webhook", "target": receiver.url,
                                   "min_severity": "warning", "rules": ["xid", "ecc"]}, format="json")

    assert created.status_code == 201, created.content
    body = created.json()
    secret = body["secret"]
    assert len(secret) == 64
    assert NotificationChannel.objects.get(pk=body["id"]).secret == secret
    assert (body["has_secret"], body["rules"], body["min_severity"]) == (True, ["ecc", "xid"], "warning")
    shown = admin_api.get(f"{URL}{body['id']}/").json()
    listed = admin_api.get(URL).json()["results"][0]
    assert "secret" not in shown
    assert "secret" not in listed
    assert shown["has_secret"] is True
    assert secret not in str(AuditEvent.objects.get(action="notification_channel.create").after)


def test_a_given_secret_is_kept_and_never_shown(admin_api, receiver):
    created = admin_api.post(URL, {"name": "siem", "kind": "webhook", "target": receiver.url,
                                   "secret": "mine-and-only-mine"}, format="json")
    assert created.json()["secret"] is None
    pk = created.json()["id"]

    renamed = admin_api.patch(f"{URL}{pk}/", {"name": "siem-2", "secret": ""}, format="json")

    assert renamed.status_code == 200, renamed.content
    assert "secret" not in renamed.json()
    assert NotificationChannel.objects.get(pk=pk).secret == "mine-and-only-mine"  # empty on update: kept


@pytest.mark.parametrize(("body", "field"), [
    ({"name": "x", "kind": "webhook", "target": "ftp://example.com/hook"}, "target"),
    ({"name": "x", "kind": "slack", "target": "not a url"}, "target"),
    ({"name": "x", "kind": "email", "target": "ops@studio.example, nobody"}, "target"),
    ({"name": "x", "kind": "email", "target": ""}, "target"),
    ({"name": "x", "kind": "in_app", "target": "ops@studio.example"}, "target"),
    ({"name": "x", "kind": "pager"}, "kind"),
    ({"name": "x", "kind": "in_app", "min_severity": "fatal"}, "min_severity"),
    ({"name": "x", "kind": "in_app", "rules": ["Xid 79"]}, "rules"),
    ({"name": "x", "kind": "in_app", "rules": "xid"}, "rules"),
    ({"name": "x", "kind": "in_app", "enabled": -1}, "enabled"),
    ({"name": "x", "kind": "email", "target": "ops@studio.example", "secret": "s"}, "secret"),
    ({"name": "", "kind": "in_app"}, "name"),
])
def test_bad_input_is_a_400_naming_the_field_and_stores_nothing(admin_api, body, field):
    response = admin_api.post(URL, body, format="json")

    assert response.status_code == 400, response.content
    assert field in response.json(), response.json()
    assert not NotificationChannel.objects.exists()
    assert not AuditEvent.objects.exists()


def test_the_test_action_answers_the_delivery_outcome(admin_api, receiver, admin_user):
    ok = admin_api.post(URL, {"name": "chat", "kind": "slack", "target": receiver.url}, format="json").json()
    receiver.answers = [200, 500]

    sent = admin_api.post(f"{URL}{ok['id']}/test/")
    failed = admin_api.post(f"{URL}{ok['id']}/test/")

    assert sent.status_code == 200
    assert (sent.json()["status"], sent.json()["response_status"], sent.json()["event"]) == ("sent", 200, "test")
    assert failed.status_code == 502
    assert (failed.json()["status"], failed.json()["attempts"]) == ("retrying", 1)
    assert "HTTP 500" in failed.json()["last_error"]
    assert len(receiver.posts) == 2
    listed = admin_api.get(f"{URL}{ok['id']}/deliveries/").json()
    assert [d["status"] for d in listed["results"]] == ["retrying", "sent"]
    filtered = admin_api.get("/api/v1/deliveries/", {"channel": ok["id"], "status": "sent"}).json()
    assert [d["id"] for d in filtered["results"]] == [sent.json()["id"]]


def test_deleting_a_channel_keeps_its_history(admin_api):
    pk = admin_api.post(URL, {"name": "app", "kind": "in_app"}, format="json").json()["id"]
    admin_api.post(f"{URL}{pk}/test/")

    assert admin_api.delete(f"{URL}{pk}/").status_code == 204

    (delivery,) = Delivery.objects.all()
    assert (delivery.channel_id, delivery.channel_name, delivery.status) == (None, "app", "sent")
    assert AuditEvent.objects.filter(action="notification_channel.delete", object_id=str(pk)).exists()
    assert admin_api.get("/api/v1/deliveries/").json()["count"] == 1


def test_artists_get_403_everywhere(artist_api):
    channel = NotificationChannel.objects.create(name="app", kind="in_app")
    for method, url in (("get", URL), ("post", URL), ("get", f"{URL}{channel.pk}/"),
                        ("post", f"{URL}{channel.pk}/test/"), ("get", "/api/v1/deliveries/")):
        assert getattr(artist_api, method)(url).status_code == 403, (method, url)


def test_the_schema_lists_the_resources_and_keeps_the_secret_write_only(admin_api):
    schema = admin_api.get("/api/schema/", {"format": "json"}).json()
    assert "/api/v1/notification-channels/{id}/test/" in schema["paths"]
    assert "/api/v1/deliveries/" in schema["paths"]
    channel = schema["components"]["schemas"]["NotificationChannel"]
    assert channel["properties"]["secret"]["writeOnly"] is True
    root = admin_api.get("/api/v1/").json()
    assert root["notification-channels"].endswith("/api/v1/notification-channels/")
    assert root["deliveries"].endswith("/api/v1/deliveries/")

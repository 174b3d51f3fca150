"""Scripts' API tokens: stored as digests only, `Authorization: Token <key>` as before, issued
and revoked by `manage.py api_token` and the admin site, and DRF's plain keys moved over."""

from __future__ import annotations

import importlib
import io
from datetime import UTC, datetime, timedelta
from types import SimpleNamespace

import pytest
from django.apps import apps
from django.core.management import CommandError, call_command
from django.db import connection
from django.test import Client
from django.test.utils import CaptureQueriesContext
from rest_framework.test import APIClient

from fleet.api_tokens import issue_token, key_digest, revoke_token
from fleet.models import ApiToken, AuditEvent
from fleet.tests.factories import UserFactory

pytestmark = pytest.mark.django_db

migration = importlib.import_module("fleet.migrations.0005_api_token")


def api_with(key: str) -> APIClient:
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Token {key}")
    return client


def vm_names(response) -> list[str]:
    assert response.status_code == 200, response.content
    return [vm["name"] for vm in response.json()["results"]]


def run(*args) -> tuple[str, str]:
    out, err = io.StringIO(), io.StringIO()
    call_command("api_token", *args, stdout=out, stderr=err)
    return out.getvalue(), err.getvalue()


# Authentication -----------------------------------------------------------------------------


def test_a_key_signs_in_as_its_user_with_the_token_header(fleet_world):
    _, key = issue_token(fleet_world.ana.user, "ana's sync script")

    assert vm_names(api_with(key).get("/api/v1/vms/")) == ["ws-ana"]


def test_the_database_holds_no_key_only_its_digest_and_a_short_prefix(artist):
    token, key = issue_token(artist.user, "render farm sync")

    row = ApiToken.objects.filter(pk=token.pk).values().get()
    assert not [column for column, value in row.items() if key in str(value)]
    assert row["token_sha256"] == key_digest(key)
    assert key.startswith(row["prefix"])
    assert len(row["prefix"]) == 8
    assert len(key) == 48
    event = AuditEvent.objects.get(action="api_token.create")
    assert key not in str(event.after)
    assert key_digest(key) not in str(event.after)
    assert event.after == {"user_id": artist.user.pk, "name": "render farm sync", "prefix": token.prefix}


@pytest.mark.parametrize("header", ["Token " + "0" * 48, "Token not-a-real-key", "Token", "Token a b"])
def test_a_wrong_key_gets_401_with_www_authenticate(artist, header):
    issue_token(artist.user)
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=header)

    response = client.get("/api/v1/vms/")

    assert response.status_code == 401
    assert response["WWW-Authenticate"] == "Token"


def test_a_revoked_key_gets_401_at_once(fleet_world):
    token, key = issue_token(fleet_world.ana.user)
    client = api_with(key)
    assert vm_names(client.get("/api/v1/vms/")) == ["ws-ana"]

    revoke_token(token)

    assert client.get("/api/v1/vms/").status_code == 401
    assert not ApiToken.objects.exists()
    event = AuditEvent.objects.get(action="api_token.revoke")
    assert (event.object_type, event.before["prefix"], event.after) == ("api_token", token.prefix, None)


def test_the_token_of_an_inactive_user_gets_401(artist):
    token, key = issue_token(artist.user)
    type(artist.user).objects.filter(pk=artist.user.pk).update(is_active=False)

    response = api_with(key).get("/api/v1/vms/")

    assert response.status_code == 401
    assert response.json()["detail"] == "User inactive or deleted."
    token.refresh_from_db()
    assert token.last_used_at is None


def test_last_used_is_stamped_on_use_and_at_most_once_a_minute(artist, time_machine):
    first = datetime(2026, 3, 2, 10, 0, tzinfo=UTC)
    time_machine.move_to(first, tick=False)
    token, key = issue_token(artist.user)
    client = api_with(key)

    client.get("/api/v1/vms/")
    token.refresh_from_db()
    assert token.last_used_at == first

    time_machine.shift(timedelta(seconds=59))
    with CaptureQueriesContext(connection) as queries:
        assert client.get("/api/v1/vms/").status_code == 200
    assert not [q for q in queries if q["sql"].lstrip().upper().startswith("UPDATE")]
    token.refresh_from_db()
    assert token.last_used_at == first

    time_machine.shift(timedelta(seconds=2))
    client.get("/api/v1/vms/")
    token.refresh_from_db()
    assert token.last_used_at == first + timedelta(seconds=61)


def test_the_schema_still_names_the_scheme_token_auth(admin_api):
    schema = admin_api.get("/api/schema/", HTTP_ACCEPT="application/vnd.oai.openapi+json").json()

    assert schema["components"]["securitySchemes"]["tokenAuth"] == {
        "type": "apiKey", "in": "header", "name": "Authorization",
        "description": 'Token-based authentication with required prefix "Token"',
    }
    assert {"tokenAuth": []} in schema["paths"]["/api/v1/vms/"]["get"]["security"]


# manage.py api_token ------------------------------------------------------------------------


def test_create_prints_the_key_once_and_list_never_shows_it(fleet_world):
    out, err = run("create", "ana", "--name", "nightly report")
    key = out.strip()
    token = ApiToken.objects.get()

    assert out == key + "\n"
    assert key not in err
    assert token.prefix in err
    unused, _ = run("list")
    assert vm_names(api_with(key).get("/api/v1/vms/")) == ["ws-ana"]
    listed, _ = run("list")
    listed_ana, _ = run("list", "ana")
    assert key not in unused + listed
    assert key_digest(key) not in unused + listed
    assert listed == listed_ana
    assert "nightly report" in listed
    assert token.prefix in listed
    assert unused.splitlines()[1].endswith("never")
    assert not listed.splitlines()[1].endswith("never")
    assert AuditEvent.objects.filter(action="api_token.create", object_id=str(token.pk)).exists()


def test_revoke_by_prefix_or_id_stops_the_key(fleet_world):
    by_prefix, key = issue_token(fleet_world.ana.user, "old laptop")
    by_id, other_key = issue_token(fleet_world.ana.user, "ci")

    out, _ = run("revoke", by_prefix.prefix)
    run("revoke", str(by_id.pk))

    assert out == f"Revoked token {by_prefix.prefix} (old laptop) of ana.\n"
    assert api_with(key).get("/api/v1/vms/").status_code == 401
    assert api_with(other_key).get("/api/v1/vms/").status_code == 401
    assert AuditEvent.objects.filter(action="api_token.revoke").count() == 2


def test_command_mistakes_are_explained_and_change_nothing(artist):
    token, key = issue_token(artist.user)
    UserFactory(username="gone", is_active=False)
    twin = ApiToken.objects.create(user=artist.user, prefix=token.prefix, token_sha256=key_digest("other"))

    cases = {
        ("create", "nobody"): "No user named 'nobody'.",
        ("create", "gone"): "User 'gone' is inactive",
        ("create", "ana", "--name", "x" * 101): "--name is 101 characters long; at most 100.",
        ("list", "nobody"): "No user named 'nobody'.",
        ("revoke", "99999"): "No API token has the id or prefix '99999'.",
        ("revoke", "abc"): "'abc' is neither a token id nor a 8-character prefix",
        ("revoke", token.prefix): f"Several API tokens have the prefix {token.prefix!r} (ids {token.pk}, {twin.pk})",
    }
    for args, message in cases.items():
        with pytest.raises(CommandError, match=message.replace("(", r"\(").replace(")", r"\)")):
            run(*args)

    assert ApiToken.objects.count() == 2
    assert api_with(key).get("/api/v1/vms/").status_code == 200


# Admin site ---------------------------------------------------------------------------------


def test_admin_add_shows_the_key_once_and_never_the_digest(artist, admin_user):
    client = Client()
    client.force_login(admin_user)

    added = client.post("/admin/fleet/apitoken/add/", {"user": artist.user.pk, "name": "houdini farm"})

    token = ApiToken.objects.get()
    page = added.content.decode()
    key = page.split('<code class="api-token-key">')[1].split("</code>")[0]
    assert added.status_code == 200
    assert "no-cache" in added["Cache-Control"]
    assert key_digest(key) == token.token_sha256
    assert api_with(key).get("/api/v1/vms/").status_code == 200
    for url in ("/admin/fleet/apitoken/", f"/admin/fleet/apitoken/{token.pk}/change/"):
        shown = client.get(url).content.decode()
        assert token.prefix in shown
        assert "houdini farm" in shown
        assert key not in shown
        assert token.token_sha256 not in shown
    event = AuditEvent.objects.get(action="api_token.create")
    assert (event.actor, event.source) == (admin_user, "admin")


def test_admin_delete_revokes_and_is_recorded(artist, admin_user):
    token, key = issue_token(artist.user)
    client = Client()
    client.force_login(admin_user)

    response = client.post("/admin/fleet/apitoken/", {"action": "delete_selected", "_selected_action": [token.pk],
                                                       "post": "yes"})

    assert response.status_code == 302
    assert api_with(key).get("/api/v1/vms/").status_code == 401
    event = AuditEvent.objects.get(action="api_token.revoke")
    assert (event.actor, event.object_id) == (admin_user, str(token.pk))


# Upgrade: DRF's plain keys ------------------------------------------------------------------


def drf_token_table(rows: list[tuple[str, int, str]]) -> None:
    """DRF authtoken's table as an earlier release left it, holding `rows` (key, user id, created)."""
    created_type = "timestamp with time zone" if connection.vendor == "postgresql" else "datetime"
    with connection.cursor() as cursor:
        cursor.execute(f'CREATE TABLE "authtoken_token" ("key" varchar(40) NOT NULL PRIMARY KEY, '
                       f'"created" {created_type} NOT NULL, "user_id" integer NOT NULL UNIQUE)')
        for row in rows:
            cursor.execute('INSERT INTO "authtoken_token" ("key", "user_id", "created") VALUES (%s, %s, %s)', row)


def test_the_upgrade_moves_drf_keys_as_digests_and_deletes_the_plain_keys(fleet_world, admin_user):
    old_key = "9944b09199c62bcf9418ad846dd0e4bbdfc6ee4b"
    drf_token_table([(old_key, fleet_world.ana.user.pk, "2025-03-01 09:30:00")])

    migration.move_drf_tokens(apps, SimpleNamespace(connection=connection))

    token = ApiToken.objects.get()
    assert (token.user, token.prefix, token.token_sha256) == (fleet_world.ana.user, "9944b091", key_digest(old_key))
    assert token.created_at == datetime(2025, 3, 1, 9, 30, tzinfo=UTC)
    with connection.cursor() as cursor:
        cursor.execute('SELECT COUNT(*) FROM "authtoken_token"')
        assert cursor.fetchone()[0] == 0
    assert vm_names(api_with(old_key).get("/api/v1/vms/")) == ["ws-ana"]


def test_the_upgrade_does_nothing_where_drf_tokens_never_existed(artist):
    assert "authtoken_token" not in connection.introspection.table_names()

    migration.move_drf_tokens(apps, SimpleNamespace(connection=connection))

    assert not ApiToken.objects.exists()

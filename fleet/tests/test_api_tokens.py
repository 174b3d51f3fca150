"""Scripts' API tokens: stored as digests only, `Authorization: Token <key>` as before, issued
and revoked by `manage.py api_token` and the admin site, and DRF's plain keys moved over; their
scopes (read, write, ingest) enforced on every API view, their expiry, and revocation that keeps
the row so a presented key is told why it stopped working."""

from __future__ import annotations

import html
import importlib
import io
import json
import re
from datetime import UTC, datetime, timedelta
from types import SimpleNamespace

import pytest
from django.apps import apps
from django.core.management import CommandError, call_command
from django.db import connection
from django.db.migrations.executor import MigrationExecutor
from django.test import Client
from django.test.utils import CaptureQueriesContext
from rest_framework.test import APIClient

from fleet.api_tokens import AlreadyRevoked, issue_token, key_digest, revoke_token
from fleet.models import ApiToken, AuditEvent
from fleet.tests.factories import UserFactory

pytestmark = pytest.mark.django_db

migration = importlib.import_module("fleet.migrations.0005_api_token")


def api_with(key: str) -> APIClient:
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Token {key}")
    return client


def results(response) -> list[dict]:
    """The rows of a list the API answered (200, or the test fails showing the answer)."""
    assert response.status_code == 200, response.content
    return response.json()["results"]


def vm_names(response) -> list[str]:
    return [vm["name"] for vm in results(response)]


def run(*args) -> tuple[str, str]:
    out, err = io.StringIO(), io.StringIO()
    call_command("api_token", *args, stdout=out, stderr=err)
    return out.getvalue(), err.getvalue()


def changelist_rows(page: str) -> list[dict[str, str]]:
    """The rows of an admin changelist: each column's text by its field name."""
    body = page.split('id="result_list"')[1].split("<tbody>")[1].split("</tbody>")[0]
    return [{name: html.unescape(re.sub(r"<[^>]+>", "", cell)).strip()
             for name, cell in re.findall(r'<t[dh] class="field-([\w]+)[^"]*">(.*?)</t[dh]>', row, re.S)}
            for row in re.findall(r"<tr>(.*?)</tr>", body, re.S)]


def listed_rows(out: str) -> list[dict[str, str]]:
    """The rows of `api_token list`, by column title (columns are two or more spaces apart)."""
    header, *lines = out.splitlines()
    titles = re.split(r"\s{2,}", header)
    return [dict(zip(titles, re.split(r"\s{2,}", line), strict=True)) for line in lines]


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
    assert event.after == {"user_id": artist.user.pk, "name": "render farm sync", "prefix": token.prefix,
                           "scope": "write", "expires_at": None}


@pytest.mark.parametrize("header", ["Token " + "0" * 48, "Token not-a-real-key", "Token", "Token a b"])
def test_a_wrong_key_gets_401_with_www_authenticate(artist, header):
    issue_token(artist.user)
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=header)

    response = client.get("/api/v1/vms/")

    assert response.status_code == 401
    assert response["WWW-Authenticate"] == "Token"


def test_a_revoked_key_gets_401_at_once_saying_when_and_why(fleet_world, time_machine):
    time_machine.move_to(datetime(2026, 3, 2, 10, 30, tzinfo=UTC), tick=False)
    token, key = issue_token(fleet_world.ana.user)
    client = api_with(key)
    assert vm_names(client.get("/api/v1/vms/")) == ["ws-ana"]  # the lookup is in the read cache now

    revoke_token(token, reason="laptop stolen", by=fleet_world.ana.user)

    response = client.get("/api/v1/vms/")
    assert response.status_code == 401
    assert response["WWW-Authenticate"] == "Token"
    assert response.json()["detail"] == "Token revoked on 2026-03-02 10:30 UTC (laptop stolen)."
    token.refresh_from_db()
    assert (token.revoked_reason, token.revoked_by, token.state()) == ("laptop stolen", fleet_world.ana.user, "revoked")
    event = AuditEvent.objects.get(action="api_token.revoke")
    assert (event.object_type, event.before["prefix"], event.before["revoked_at"]) == ("api_token", token.prefix, None)
    assert event.after["revoked_reason"] == "laptop stolen"
    assert event.comment == "of ana: laptop stolen"


def test_a_token_revoked_without_a_reason_says_when(artist, time_machine):
    time_machine.move_to(datetime(2026, 3, 2, 10, 30, tzinfo=UTC), tick=False)
    token, key = issue_token(artist.user)
    revoke_token(token)

    assert api_with(key).get("/api/v1/vms/").json()["detail"] == "Token revoked on 2026-03-02 10:30 UTC."
    with pytest.raises(AlreadyRevoked, match="already revoked: Token revoked on 2026-03-02 10:30 UTC."):
        revoke_token(token, reason="again")


def test_an_expired_key_gets_401_saying_when_from_the_next_request_on(fleet_world, time_machine):
    time_machine.move_to(datetime(2026, 3, 2, 10, 0, tzinfo=UTC), tick=False)
    token, key = issue_token(fleet_world.ana.user, expires_at=datetime(2026, 3, 2, 11, 0, tzinfo=UTC))
    client = api_with(key)
    assert vm_names(client.get("/api/v1/vms/")) == ["ws-ana"]

    time_machine.shift(timedelta(minutes=59, seconds=59))
    assert client.get("/api/v1/vms/").status_code == 200
    time_machine.shift(timedelta(seconds=1))
    response = client.get("/api/v1/vms/")

    assert response.status_code == 401
    assert response.json()["detail"] == "Token expired on 2026-03-02 11:00 UTC."
    token.refresh_from_db()
    assert token.state() == "expired"


def test_an_unknown_key_is_still_an_invalid_token(artist):
    token, key = issue_token(artist.user)
    revoke_token(token)

    response = api_with("f" * 48).get("/api/v1/vms/")

    assert response.status_code == 401
    assert response.json()["detail"] == "Invalid token."


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


# Scopes -------------------------------------------------------------------------------------

READ_REFUSED = ("This API token's scope is read: it may read (GET, HEAD, OPTIONS) but not {method}. "
                "Use a token with scope write.")
INGEST_REFUSED = ("This API token's scope is ingest: it may only push samples (POST /api/v1/ingest/...), "
                  "not read or change anything else.")
NEW_HOST = {"name": "render-09", "cpu_threads": 64, "ram_gib": 512}


def test_a_write_token_reads_and_writes(fleet_world, admin_user):
    _, key = issue_token(admin_user, "inventory sync", scope="write")
    client = api_with(key)

    assert client.get("/api/v1/hosts/").status_code == 200
    assert client.post("/api/v1/hosts/", NEW_HOST).status_code == 201


def test_a_read_token_reads_and_gets_403_naming_its_scope_on_any_write(fleet_world, admin_user):
    _, key = issue_token(admin_user, "dashboards", scope="read")
    client = api_with(key)
    host = fleet_world.host_a.pk

    assert client.get("/api/v1/hosts/").status_code == 200
    assert client.get(f"/api/v1/hosts/{host}/").status_code == 200
    assert client.options("/api/v1/hosts/").status_code == 200
    writes = {
        "POST": client.post("/api/v1/hosts/", NEW_HOST),
        "PUT": client.put(f"/api/v1/hosts/{host}/", NEW_HOST),
        "PATCH": client.patch(f"/api/v1/hosts/{host}/", {"cpu_threads": 96}),
        "DELETE": client.delete(f"/api/v1/vgpus/{fleet_world.vgpu_a.pk}/"),
    }
    for method, response in writes.items():
        assert response.status_code == 403, method
        assert response.json() == {"detail": READ_REFUSED.format(method=method)}
    fleet_world.host_a.refresh_from_db()
    assert fleet_world.host_a.cpu_threads == 72
    assert fleet_world.vgpu_a.__class__.objects.filter(pk=fleet_world.vgpu_a.pk).exists()


def test_a_read_token_is_refused_where_a_view_sets_its_own_permissions(fleet_world, admin_user):
    """Views that replace the default permission classes (notifications, request decisions) still
    refuse a read token's writes: the scope is checked with the key, not among the permissions."""
    _, key = issue_token(admin_user, scope="read")
    client = api_with(key)

    for path in ("/api/v1/notifications/read-all/", "/api/v1/resize-requests/1/approve/",
                 "/api/v1/agents/", "/api/v1/optimizer-runs/"):
        response = client.post(path, {})
        assert response.status_code == 403, path
        assert response.json()["detail"] == READ_REFUSED.format(method="POST")


def test_an_artists_read_token_gets_the_scope_message_not_the_roles(fleet_world):
    _, key = issue_token(fleet_world.ana.user, scope="read")

    response = api_with(key).post("/api/v1/resize-requests/", {"vm": fleet_world.vm_a.pk})

    assert response.status_code == 403
    assert response.json()["detail"] == READ_REFUSED.format(method="POST")


@pytest.mark.parametrize(("method", "path"), [
    ("get", "/api/v1/"),
    ("get", "/api/v1/vms/"),
    ("get", "/api/v1/gpus/"),
    ("get", "/api/v1/api-tokens/"),
    ("get", "/api/schema/"),
    ("options", "/api/v1/hosts/"),
    ("post", "/api/v1/hosts/"),
    ("post", "/api/v1/api-tokens/"),
])
def test_an_ingest_token_gets_403_everywhere_but_ingest_reads_included(fleet_world, admin_user, method, path):
    _, key = issue_token(admin_user, "smi cron", scope="ingest")

    accept = {"HTTP_ACCEPT": "application/vnd.oai.openapi+json"} if path == "/api/schema/" else {}

    response = getattr(api_with(key), method)(path, NEW_HOST, **accept)

    assert response.status_code == 403
    assert json.loads(response.content) == {"detail": INGEST_REFUSED}


def test_sessions_are_not_scoped(fleet_world, admin_user):
    client = APIClient()
    client.force_login(admin_user)

    assert client.post("/api/v1/hosts/", NEW_HOST).status_code == 201


# Migrations run outside a transaction on SQLite; serialized_rollback, as every transactional
# test here, so the next one finds the rows the migrations made (content types) as they were.
@pytest.mark.django_db(transaction=True, serialized_rollback=True)
def test_a_token_issued_before_scopes_existed_reads_and_writes():
    """A row written by the release before migration 0011 (no scope, no expiry) becomes a write
    token that never expires: scripts that wrote keep writing after the upgrade."""
    before, after = ("fleet", "0010_vgpu_reported_device"), ("fleet", "0011_api_token_scope_expiry_revocation")
    executor = MigrationExecutor(connection)
    executor.migrate([before])
    try:
        old = executor.loader.project_state([before]).apps
        user = old.get_model("auth", "User").objects.create(username="ci-bot", is_staff=True, is_active=True)
        key = "3f" * 24
        old.get_model("fleet", "ApiToken").objects.create(user_id=user.pk, name="nightly sync", prefix=key[:8],
                                                          token_sha256=key_digest(key))
    finally:
        executor = MigrationExecutor(connection)
        executor.migrate(executor.loader.graph.leaf_nodes())
    assert after in MigrationExecutor(connection).loader.applied_migrations

    token = ApiToken.objects.get()
    assert (token.scope, token.expires_at, token.revoked_at, token.state()) == ("write", None, None, "active")
    client = api_with(key)
    assert client.get("/api/v1/hosts/").status_code == 200
    assert client.post("/api/v1/hosts/", NEW_HOST).status_code == 201


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
    assert listed_rows(unused)[0]["LAST USED"] == "never"
    assert listed_rows(listed)[0]["LAST USED"] != "never"
    assert AuditEvent.objects.filter(action="api_token.create", object_id=str(token.pk)).exists()


@pytest.mark.parametrize(("expires", "expected"), [
    ("90d", datetime(2026, 5, 31, 10, 0, tzinfo=UTC)),
    ("12h", datetime(2026, 3, 2, 22, 0, tzinfo=UTC)),
    ("2w", datetime(2026, 3, 16, 10, 0, tzinfo=UTC)),
    ("2026-06-30", datetime(2026, 6, 30, 0, 0, tzinfo=UTC)),
    ("2026-06-30T18:00", datetime(2026, 6, 30, 18, 0, tzinfo=UTC)),
    ("2026-06-30T18:00+02:00", datetime(2026, 6, 30, 16, 0, tzinfo=UTC)),
])
def test_create_takes_a_scope_and_an_expiry_as_a_lifetime_or_a_date(fleet_world, time_machine, expires, expected):
    time_machine.move_to(datetime(2026, 3, 2, 10, 0, tzinfo=UTC), tick=False)

    out, err = run("create", "ana", "--name", "reports", "--scope", "read", "--expires", expires)

    token = ApiToken.objects.get()
    assert (token.scope, token.expires_at) == ("read", expected)
    assert f"scope read, expires {expected:%Y-%m-%d %H:%M}" in err
    assert vm_names(api_with(out.strip()).get("/api/v1/vms/")) == ["ws-ana"]


def test_list_shows_scope_expiry_last_use_and_state(fleet_world, time_machine):
    time_machine.move_to(datetime(2026, 3, 2, 10, 0, tzinfo=UTC), tick=False)
    ana = fleet_world.ana.user
    _, used_key = issue_token(ana, "farm sync", scope="ingest")
    issue_token(ana, "short", scope="read", expires_at=datetime(2026, 3, 2, 10, 30, tzinfo=UTC))
    revoked, _ = issue_token(ana, "old laptop")
    revoke_token(revoked, reason="stolen")
    api_with(used_key).get("/api/v1/vms/")  # refused (ingest), yet the key was presented
    time_machine.shift(timedelta(hours=1))

    out, _ = run("list", "ana")

    rows = {row["NAME"]: row for row in listed_rows(out)}
    assert {name: (row["SCOPE"], row["EXPIRES"], row["STATE"]) for name, row in rows.items()} == {
        "farm sync": ("ingest", "never", "active"),
        "short": ("read", "2026-03-02 10:30", "expired"),
        "old laptop": ("write", "never", "revoked"),
    }
    assert rows["farm sync"]["LAST USED"] == "2026-03-02 10:00"
    assert rows["short"]["LAST USED"] == "never"


def test_revoke_takes_a_reason_shown_to_the_keys_holder(fleet_world, time_machine):
    time_machine.move_to(datetime(2026, 3, 2, 10, 0, tzinfo=UTC), tick=False)
    token, key = issue_token(fleet_world.ana.user, "old laptop")

    out, _ = run("revoke", token.prefix, "--reason", "left in a taxi")

    assert out == f"Revoked token {token.prefix} (old laptop) of ana.\n"
    assert api_with(key).get("/api/v1/vms/").json() == {
        "detail": "Token revoked on 2026-03-02 10:00 UTC (left in a taxi)."}
    with pytest.raises(CommandError, match=f"Token {token.prefix} was already revoked: Token revoked on "):
        run("revoke", str(token.pk))
    assert AuditEvent.objects.filter(action="api_token.revoke").count() == 1


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
        ("create", "ana", "--scope", "admin"): "argument --scope: invalid choice: 'admin'",
        ("create", "ana", "--expires", "soon"): "--expires: 'soon' is neither a lifetime such as 90d, 12h or 2w",
        ("create", "ana", "--expires", "90"): "--expires: '90' has no unit: write 90d (days), 90h (hours) or 90w",
        ("create", "ana", "--expires", "0d"): "--expires: '0d': a lifetime is 1 to 10,000 days.",
        ("create", "ana", "--expires", "90y"): "--expires: '90y' is neither",
        ("create", "ana", "--expires", "2020-01-01"): "--expires: '2020-01-01' (a date means 00:00 of that day) is in "
                                                      "the past: a token must expire in the future.",
        ("create", "ana", "--expires", "2020-01-01T10:00Z"): "--expires: '2020-01-01T10:00Z' is in the past",
        ("create", "ana", "--expires", "2026-02-30"): "--expires: '2026-02-30' is neither",
        ("revoke", token.prefix, "--reason", "x" * 201): "--reason is 201 characters long; at most 200.",
        ("list", "nobody"): "No user named 'nobody'.",
        ("revoke", "99999"): "No API token has the id or prefix '99999'.",
        ("revoke", "abc"): "'abc' is neither a token id nor a 8-character prefix",
        ("revoke", token.prefix): f"Several API tokens have the prefix {token.prefix!r} (ids {token.pk}, {twin.pk})",
    }
    for args, message in cases.items():
        with pytest.raises(CommandError, match=re.escape(message)):
            run(*args)

    assert ApiToken.objects.count() == 2
    assert api_with(key).get("/api/v1/vms/").status_code == 200


# Admin site ---------------------------------------------------------------------------------


def test_admin_add_shows_the_key_once_and_never_the_digest(artist, admin_user, time_machine):
    time_machine.move_to(datetime(2026, 3, 2, 10, 0, tzinfo=UTC), tick=False)
    client = Client()
    client.force_login(admin_user)

    added = client.post("/admin/fleet/apitoken/add/", {"user": artist.user.pk, "name": "houdini farm",
                                                       "scope": "read", "expires_on": "2026-06-30"})

    token = ApiToken.objects.get()
    page = added.content.decode()
    key = page.split('<code class="api-token-key">')[1].split("</code>")[0]
    assert added.status_code == 200
    assert "no-cache" in added["Cache-Control"]
    assert "<td>Read only</td>" in page
    assert "<td>2026-06-30 00:00 UTC</td>" in page
    assert (token.scope, token.expires_at) == ("read", datetime(2026, 6, 30, tzinfo=UTC))
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


def test_admin_add_refuses_a_past_day_and_an_inactive_user(artist, admin_user, time_machine):
    time_machine.move_to(datetime(2026, 3, 2, 10, 0, tzinfo=UTC), tick=False)
    gone = UserFactory(username="gone", is_active=False)
    client = Client()
    client.force_login(admin_user)

    today = client.post("/admin/fleet/apitoken/add/", {"user": artist.user.pk, "scope": "write",
                                                       "expires_on": "2026-03-02"})
    inactive = client.post("/admin/fleet/apitoken/add/", {"user": gone.pk, "scope": "write"})

    assert today.status_code == inactive.status_code == 200
    assert "2026-03-02 (00:00) is in the past: a token must expire in the future." in today.content.decode()
    assert "gone is inactive: a token of theirs would be refused." in inactive.content.decode()
    assert not ApiToken.objects.exists()


def test_admin_list_shows_scope_expiry_last_use_and_state(artist, admin_user, time_machine):
    time_machine.move_to(datetime(2026, 3, 2, 10, 0, tzinfo=UTC), tick=False)
    used, used_key = issue_token(artist.user, "sync", scope="read")
    api_with(used_key).get("/api/v1/vms/")
    issue_token(artist.user, "short", expires_at=datetime(2026, 3, 2, 10, 30, tzinfo=UTC))
    revoked, _ = issue_token(artist.user, "old", scope="ingest")
    revoke_token(revoked)
    time_machine.shift(timedelta(hours=1))
    client = Client()
    client.force_login(admin_user)

    page = client.get("/admin/fleet/apitoken/").content.decode()
    only_expired = client.get("/admin/fleet/apitoken/?state=expired").content.decode()

    rows = {row["name"]: (row["scope"], row["expires_at"], row["last_used_at"], row["state"])
            for row in changelist_rows(page)}
    assert rows == {
        "sync": ("Read only", "-", "March 2, 2026, 10 a.m.", "Active"),
        "short": ("Read and write", "March 2, 2026, 10:30 a.m.", "-", "Expired"),
        "old": ("Ingest (push samples only)", "-", "-", "Revoked"),
    }
    assert [row["name"] for row in changelist_rows(only_expired)] == ["short"]


def test_admin_revoke_action_keeps_the_tokens_and_records_who(artist, admin_user):
    token, key = issue_token(artist.user)
    already, _ = issue_token(artist.user)
    revoke_token(already)
    client = Client()
    client.force_login(admin_user)

    response = client.post("/admin/fleet/apitoken/", {"action": "revoke_selected",
                                                       "_selected_action": [token.pk, already.pk]}, follow=True)

    assert "Revoked 1 API token. 1 was already revoked." in response.content.decode()
    assert api_with(key).get("/api/v1/vms/").json()["detail"].startswith("Token revoked on ")
    token.refresh_from_db()
    assert (token.state(), token.revoked_by) == ("revoked", admin_user)
    assert ApiToken.objects.count() == 2
    event = AuditEvent.objects.get(action="api_token.revoke", object_id=str(token.pk))
    assert (event.actor, event.source) == (admin_user, "admin")


def test_admin_delete_forgets_the_token_and_is_recorded(artist, admin_user):
    token, key = issue_token(artist.user)
    client = Client()
    client.force_login(admin_user)

    response = client.post("/admin/fleet/apitoken/", {"action": "delete_selected", "_selected_action": [token.pk],
                                                       "post": "yes"})

    assert response.status_code == 302
    assert not ApiToken.objects.exists()
    assert api_with(key).get("/api/v1/vms/").json()["detail"] == "Invalid token."
    event = AuditEvent.objects.get(action="api_token.delete")
    assert (event.actor, event.object_id, event.before["prefix"]) == (admin_user, str(token.pk), token.prefix)


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

"""`/api/v1/api-tokens/`: users list, issue and revoke their own API tokens over the API (admins
everyone's); the key is shown once; a token-signed request creates tokens no broader than itself."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from fleet.api_tokens import issue_token, key_digest, revoke_token
from fleet.models import ApiToken, AuditEvent
from fleet.tests.factories import UserFactory
from fleet.tests.test_api_tokens import api_with, results

pytestmark = pytest.mark.django_db

URL = "/api/v1/api-tokens/"
NOW = datetime(2026, 3, 2, 10, 0, tzinfo=UTC)


@pytest.fixture
def now(time_machine):
    time_machine.move_to(NOW, tick=False)
    return time_machine


def names(response) -> list[str]:
    """The names of the tokens a list answered, in its order."""
    return [token["name"] for token in results(response)]


def test_the_api_root_lists_the_resource(admin_api):
    assert admin_api.get("/api/v1/").json()["api-tokens"] == "http://testserver/api/v1/api-tokens/"


def test_create_answers_the_key_once_and_the_list_never_shows_it(admin_api, admin_user, now):
    created = admin_api.post(URL, {"name": "ci", "scope": "read", "expires_in": "90d"})

    assert created.status_code == 201, created.content
    body = created.json()
    key = body.pop("key")
    token = ApiToken.objects.get()
    assert body == {
        "id": token.pk, "user": admin_user.pk, "name": "ci", "prefix": key[:8], "scope": "read",
        "created_at": "2026-03-02T10:00:00Z", "expires_at": "2026-05-31T10:00:00Z", "last_used_at": None,
        "state": "active", "revoked_at": None, "revoked_reason": "", "revoked_by": None,
    }
    assert token.token_sha256 == key_digest(key)
    for response in (admin_api.get(URL), admin_api.get(f"{URL}{token.pk}/")):
        assert key not in response.content.decode()
        assert token.token_sha256 not in response.content.decode()
    client = api_with(key)
    assert client.get("/api/v1/hosts/").status_code == 200
    assert client.post("/api/v1/hosts/", {"name": "render-09", "cpu_threads": 8, "ram_gib": 8}).status_code == 403
    event = AuditEvent.objects.get(action="api_token.create")
    assert (event.actor, event.source, event.after["scope"]) == (admin_user, "api", "read")


def test_create_takes_an_expiry_time_and_defaults_to_write_never_expiring(admin_api, now):
    dated = admin_api.post(URL, {"name": "dated", "expires_at": "2026-06-30T18:00:00+02:00"}).json()
    plain = admin_api.post(URL, {}).json()

    assert (dated["scope"], dated["expires_at"]) == ("write", "2026-06-30T16:00:00Z")
    assert (plain["scope"], plain["expires_at"], plain["name"]) == ("write", None, "")


def test_last_use_is_shown(artist, artist_api, now):
    token, key = issue_token(artist.user, "sync")
    api_with(key).get("/api/v1/vms/")
    now.shift(timedelta(minutes=5))

    row = artist_api.get(f"{URL}{token.pk}/").json()

    assert row["last_used_at"] == "2026-03-02T10:00:00Z"


def test_artists_manage_their_own_tokens_and_see_no_one_elses(fleet_world, artist_api, admin_user):
    ana, bob = fleet_world.ana.user, fleet_world.bob.user
    bobs, bobs_key = issue_token(bob, "bob's script")
    issue_token(admin_user, "admin's script")

    created = artist_api.post(URL, {"name": "ana's script", "scope": "read"})
    for_bob = artist_api.post(URL, {"name": "for bob", "user": bob.pk})

    assert created.status_code == 201
    assert created.json()["user"] == ana.pk
    assert names(artist_api.get(URL)) == ["ana's script"]
    assert names(artist_api.get(URL, {"user": ana.pk})) == ["ana's script"]
    # Another user is named as one that does not exist: 400, as every list's filters answer it.
    assert artist_api.get(URL, {"user": bob.pk}).json()["user"][0].endswith(
        f"No user has the id or name '{bob.pk}' (or you may not see it).")
    assert for_bob.status_code == 400
    assert for_bob.json() == {"user": [f'Invalid pk "{bob.pk}" - object does not exist.']}
    assert artist_api.get(f"{URL}{bobs.pk}/").status_code == 404
    assert artist_api.post(f"{URL}{bobs.pk}/revoke/", {"reason": "mine now"}).status_code == 404
    assert api_with(bobs_key).get("/api/v1/vms/").status_code == 200
    own = ApiToken.objects.get(name="ana's script")
    revoked = artist_api.post(f"{URL}{own.pk}/revoke/", {})
    assert (revoked.status_code, revoked.json()["state"]) == (200, "revoked")


def test_admins_see_everyones_tokens_and_filter_them(fleet_world, admin_api, admin_user, now):
    ana, bob = fleet_world.ana.user, fleet_world.bob.user
    issue_token(ana, "ana's", scope="ingest")
    old, _ = issue_token(bob, "bob's old")
    revoke_token(old)
    issue_token(bob, "bob's short", expires_at=NOW + timedelta(hours=1))
    now.shift(timedelta(hours=2))

    assert sorted(names(admin_api.get(URL))) == ["ana's", "bob's old", "bob's short"]
    assert sorted(names(admin_api.get(URL, {"user": bob.pk}))) == ["bob's old", "bob's short"]
    assert names(admin_api.get(URL, {"user": "ana"})) == ["ana's"]
    assert names(admin_api.get(URL, {"state": "revoked"})) == ["bob's old"]
    assert names(admin_api.get(URL, {"state": "expired"})) == ["bob's short"]
    assert names(admin_api.get(URL, {"state": "active", "scope": "ingest"})) == ["ana's"]
    assert admin_api.get(URL, {"state": "dormant"}).status_code == 400


def test_an_admin_issues_a_token_for_another_user(fleet_world, admin_api):
    bob = fleet_world.bob.user

    created = admin_api.post(URL, {"name": "for bob", "user": bob.pk})

    assert created.status_code == 201
    assert ApiToken.objects.get().user == bob
    assert api_with(created.json()["key"]).get("/api/v1/vms/").json()["results"][0]["name"] == "ws-bob"


def test_revoke_keeps_the_row_and_the_key_says_why(artist, artist_api, now):
    token, key = issue_token(artist.user, "laptop")

    revoked = artist_api.post(f"{URL}{token.pk}/revoke/", {"reason": "laptop stolen"})
    again = artist_api.post(f"{URL}{token.pk}/revoke/", {"reason": "again"})

    assert revoked.status_code == 200
    assert {name: revoked.json()[name] for name in ("state", "revoked_at", "revoked_reason", "revoked_by")} == {
        "state": "revoked", "revoked_at": "2026-03-02T10:00:00Z", "revoked_reason": "laptop stolen",
        "revoked_by": artist.user.pk}
    assert api_with(key).get("/api/v1/vms/").json() == {
        "detail": "Token revoked on 2026-03-02 10:00 UTC (laptop stolen)."}
    assert again.status_code == 409
    assert again.json() == {"detail": f"Token {token.prefix} was already revoked: Token revoked on 2026-03-02 "
                                      f"10:00 UTC (laptop stolen)."}
    assert artist_api.delete(f"{URL}{token.pk}/").status_code == 405
    assert names(artist_api.get(URL)) == ["laptop"]
    event = AuditEvent.objects.get(action="api_token.revoke")
    assert (event.actor, event.source, event.comment) == (artist.user, "api", "of ana: laptop stolen")


@pytest.mark.parametrize(("body", "field", "message"), [
    ({"scope": "admin"}, "scope", '"admin" is not a valid choice.'),
    ({"expires_in": "soon"}, "expires_in", "'soon' is not a lifetime such as 90d, 12h or 2w (days, hours, weeks)."),
    ({"expires_in": "90"}, "expires_in", "'90' has no unit: write 90d (days), 90h (hours) or 90w (weeks)."),
    ({"expires_at": "2020-01-01T00:00:00Z"}, "expires_at", "The expiry is in the past: a token must expire in the "
                                                           "future."),
    ({"expires_at": "2026-02-30"}, "expires_at", "Datetime has wrong format."),
    ({"expires_in": "1d", "expires_at": "2026-06-30T00:00:00Z"}, "expires_in", "Give expires_at or expires_in, "
                                                                              "not both."),
    ({"name": "x" * 101}, "name", "Ensure this field has no more than 100 characters."),
    ({"user": "abc"}, "user", "Incorrect type. Expected pk value, received str."),
])
def test_bad_input_is_a_400_naming_the_field(admin_api, now, body, field, message):
    response = admin_api.post(URL, body, format="json")

    assert response.status_code == 400
    assert list(response.json()) == [field]
    assert response.json()[field][0].startswith(message)
    assert not ApiToken.objects.exists()


def test_a_token_for_an_inactive_user_is_refused(admin_api):
    gone = UserFactory(username="gone", is_active=False)

    response = admin_api.post(URL, {"user": gone.pk})

    assert response.status_code == 400
    assert response.json() == {"user": ["gone is inactive: a token of theirs would be refused."]}


def test_a_bad_revoke_reason_is_a_400(artist, artist_api):
    token, _ = issue_token(artist.user)

    response = artist_api.post(f"{URL}{token.pk}/revoke/", {"reason": "x" * 201})

    assert response.status_code == 400
    assert list(response.json()) == ["reason"]
    token.refresh_from_db()
    assert token.state() == "active"


# Requests signed with a token -----------------------------------------------------------------


def test_a_token_creates_tokens_that_expire_no_later_than_itself(artist, now):
    _, key = issue_token(artist.user, "parent", expires_at=NOW + timedelta(days=30))
    client = api_with(key)

    forever = client.post(URL, {"name": "forever"})
    later = client.post(URL, {"name": "later", "expires_in": "31d"})
    sooner = client.post(URL, {"name": "sooner", "expires_in": "30d", "scope": "ingest"})

    message = ("The API token this request is signed with expires on 2026-04-01 10:00 UTC: a token it creates "
               "must expire by then (set an expiry no later).")
    assert (forever.status_code, forever.json()) == (400, {"expires_at": [message]})
    assert (later.status_code, later.json()) == (400, {"expires_in": [message]})
    assert sooner.status_code == 201
    assert sooner.json()["expires_at"] == "2026-04-01T10:00:00Z"


def test_a_write_token_without_expiry_creates_any_scope(artist):
    _, key = issue_token(artist.user, "parent")

    scopes = [api_with(key).post(URL, {"scope": scope}).json()["scope"] for scope in ("read", "write", "ingest")]

    assert scopes == ["read", "write", "ingest"]


def test_a_read_token_lists_but_cannot_create_or_revoke(artist):
    token, key = issue_token(artist.user, "reader", scope="read")
    client = api_with(key)

    assert names(client.get(URL)) == ["reader"]
    created = client.post(URL, {"scope": "read"})
    revoked = client.post(f"{URL}{token.pk}/revoke/", {})
    assert created.status_code == revoked.status_code == 403
    assert created.json()["detail"].startswith("This API token's scope is read:")
    assert ApiToken.objects.count() == 1


def test_an_ingest_token_cannot_reach_the_endpoint(artist):
    _, key = issue_token(artist.user, "pusher", scope="ingest")
    client = api_with(key)

    for response in (client.get(URL), client.post(URL, {"scope": "ingest"})):
        assert response.status_code == 403
        assert response.json()["detail"].startswith("This API token's scope is ingest:")


def test_the_list_costs_the_same_queries_for_many_tokens(admin_api, admin_user):
    issue_token(admin_user, "one")
    with CaptureQueriesContext(connection) as few:
        assert admin_api.get(URL).status_code == 200
    for n in range(20):
        issue_token(UserFactory(), f"token {n}")
    with CaptureQueriesContext(connection) as many:
        assert len(names(admin_api.get(URL))) == 21

    assert len(many) == len(few)

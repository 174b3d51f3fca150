"""Signing in with the studio's LDAP directory, against a real slapd (identity/tests/slapd.py).

What a studio's IT team checks when they connect their directory: the admins' group signs in as
admins and the artists' groups as artists (with an artist record, linked to an account made
before by user name or e-mail); someone in neither group is told why; a wrong password is a
wrong password (and is throttled like a local one); removing someone from the groups ends their
access at their next request; a directory outage does not sign the studio out; the periodic sync
keeps accounts in step; StartTLS and ldaps:// with the studio's CA file work, and a wrong CA
does not; local accounts keep working.
"""

from __future__ import annotations

from datetime import timedelta
from io import StringIO

import pytest
from django.contrib.auth import get_user_model
from django.core.management import call_command
from django.core.management.base import CommandError
from django.test import Client

from fleet.models import Artist
from fleet.tests.factories import ArtistFactory, UserFactory
from identity.models import DirectoryAccount, UserSession
from identity.tests.slapd import ADMINS, LIGHTING, MODELING, PASSWORD, person_dn

pytestmark = pytest.mark.django_db

NO_ROLE = "Your Studio directory account is not in a group that may use the fleet dashboard."
MISMATCH = "didn't match"


def sign_in(username: str, password: str = PASSWORD, addr: str = "10.2.0.7"):
    client = Client(REMOTE_ADDR=addr)
    response = client.post("/login/", {"username": username, "password": password})
    return client, response


def signed_in_as(client: Client) -> str | None:
    response = client.get("/me/")
    return response.wsgi_request.user.get_username() if response.status_code == 200 else None


def test_the_sign_in_page_names_the_directory(directory):
    page = Client().get("/login/").content.decode()
    assert "Sign in with your <strong>Studio directory</strong> account" in page
    assert f"127.0.0.1:{directory.uri.rsplit(':', 1)[1]}" in page
    assert "reader-secret" not in page


def test_an_admin_of_the_admins_group_signs_in_as_a_fleet_admin(directory):
    client, response = sign_in("alice")
    assert response.status_code == 302
    user = get_user_model().objects.get(username="alice")
    assert (user.is_staff, user.is_active, user.email, user.get_full_name()) == (
        True, True, "alice@studio.test", "Alice Admin")
    assert not user.has_usable_password()  # the directory holds the password
    account = DirectoryAccount.objects.get(user=user)
    assert (account.source, account.subject, account.role) == ("ldap", person_dn("alice"), "admin")
    assert account.groups == [ADMINS]
    assert account.last_sign_in_at is not None
    assert client.get("/hosts/").status_code == 200  # fleet-wide pages, admins only


def test_an_artist_gets_an_artist_record_and_only_their_own_pages(directory):
    client, response = sign_in("bob")
    assert response.status_code == 302
    user = get_user_model().objects.get(username="bob")
    assert (user.is_staff, user.is_active) == (False, True)
    assert Artist.objects.get(user=user).name == "Bob Lighter"
    assert DirectoryAccount.objects.get(user=user).role == "artist"
    assert client.get("/hosts/").status_code == 403  # fleet-wide pages are for admins
    # A second sign-in keeps the same records.
    sign_in("bob")
    assert Artist.objects.filter(user=user).count() == 1


def test_someone_in_neither_group_is_refused_with_the_reason(directory):
    client, response = sign_in("dave")
    page = response.content.decode()
    assert response.status_code == 200
    assert NO_ROLE in page
    assert MISMATCH not in page
    assert not get_user_model().objects.filter(username="dave").exists()  # no account is made
    assert signed_in_as(client) is None


def test_a_wrong_password_is_a_wrong_password_and_is_throttled(directory):
    for _ in range(4):
        _, response = sign_in("bob", "not-the-password")
        assert response.status_code == 200
        assert MISMATCH in response.content.decode()
    _, response = sign_in("bob", "not-the-password")
    assert response.status_code == 429  # the fifth failure locks the name out from that address
    client, response = sign_in("bob")  # ...even with the right password
    assert response.status_code == 429
    assert signed_in_as(client) is None
    client, response = sign_in("bob", addr="10.2.0.8")  # another desk is not affected
    assert signed_in_as(client) == "bob"


def test_an_account_made_before_is_linked_by_user_name_and_keeps_its_artist(directory):
    artist = ArtistFactory(name="B. Lighter (old)", user=UserFactory(username="bob", is_staff=True))
    sign_in("bob")
    artist.refresh_from_db()
    assert artist.user.username == "bob"
    assert artist.name == "Bob Lighter"
    assert artist.user.is_staff is False  # the directory decides the role now
    assert Artist.objects.filter(user=artist.user).count() == 1


def test_an_account_made_before_is_linked_by_e_mail(directory):
    local = UserFactory(username="erin.c", email="Erin.Comp@studio.test", password="old-local-pass-1")
    artist = ArtistFactory(user=local)
    client, response = sign_in("erin")
    assert response.status_code == 302
    local.refresh_from_db()
    assert local.username == "erin"  # renamed to the directory's user name
    assert DirectoryAccount.objects.get(user=local).subject == person_dn("erin")
    assert Artist.objects.get(user=local).pk == artist.pk
    assert signed_in_as(client) == "erin"
    # The old local password is no second way in: only the directory's works now.
    client, _ = sign_in("erin", "old-local-pass-1", addr="10.2.0.9")
    assert signed_in_as(client) is None
    assert not get_user_model().objects.get(pk=local.pk).has_usable_password()


def test_removal_from_the_groups_ends_access_at_the_next_request(directory):
    client, _ = sign_in("carol")
    assert signed_in_as(client) == "carol"
    directory.remove_member(MODELING, "carol")
    response = client.get("/me/")
    assert response.status_code == 302
    assert response.url.startswith("/login/")
    user = get_user_model().objects.get(username="carol")
    assert user.is_active is False
    page = client.get("/login/").content.decode()
    assert "You were signed out." in page
    assert NO_ROLE in page
    # Added back, they sign in again.
    directory.add_member(MODELING, "carol")
    client, _ = sign_in("carol")
    assert signed_in_as(client) == "carol"


def test_a_demoted_admin_is_an_artist_at_the_next_request(directory):
    client, _ = sign_in("alice")
    assert client.get("/hosts/").status_code == 200
    directory.remove_member(ADMINS, "alice")
    directory.add_member(LIGHTING, "alice")
    try:
        assert client.get("/hosts/").status_code == 403
        assert signed_in_as(client) == "alice"
        assert DirectoryAccount.objects.get(user__username="alice").role == "artist"
    finally:
        directory.remove_member(LIGHTING, "alice")


def test_directory_details_are_kept_in_step_at_the_next_request(directory):
    client, _ = sign_in("bob")
    directory.set_attribute("bob", "sn", "Relit")
    directory.set_attribute("bob", "mail", "bob.relit@studio.test")
    assert signed_in_as(client) == "bob"
    user = get_user_model().objects.get(username="bob")
    assert (user.last_name, user.email) == ("Relit", "bob.relit@studio.test")
    assert Artist.objects.get(user=user).name == "Bob Relit"


def test_an_outage_keeps_recent_sessions_and_refuses_stale_ones(directory, settings):
    client, _ = sign_in("bob")
    directory.stop()
    try:
        assert signed_in_as(client) == "bob"  # checked a moment ago: within the grace
        DirectoryAccount.objects.filter(user__username="bob").update(
            last_synced_at=DirectoryAccount.objects.get(user__username="bob").last_synced_at
            - timedelta(seconds=settings.AUTH_LDAP_OUTAGE_GRACE_S + 1))
        assert signed_in_as(client) is None
        # The user is not deactivated by an outage: nothing the directory said took the role away.
        assert get_user_model().objects.get(username="bob").is_active
    finally:
        directory.start()
    client, _ = sign_in("bob")
    assert signed_in_as(client) == "bob"


def test_the_periodic_sync_keeps_every_directory_account_in_step(directory):
    clients = {name: sign_in(name)[0] for name in ("alice", "bob", "carol")}
    UserFactory(username="breakglass", is_staff=True)
    directory.remove_member(LIGHTING, "bob")
    directory.set_attribute("carol", "sn", "Sculptor")
    out = StringIO()
    call_command("directory_sync", stdout=out)
    assert "3 directory accounts checked, 2 changed, 1 without access" in out.getvalue()
    users = {user.username: user for user in get_user_model().objects.all()}
    assert users["bob"].is_active is False
    assert not UserSession.objects.filter(user=users["bob"]).exists()  # the sync ended bob's sessions
    assert signed_in_as(clients["bob"]) is None
    assert signed_in_as(clients["alice"]) == "alice"
    assert users["carol"].last_name == "Sculptor"
    assert users["alice"].is_active
    assert users["breakglass"].is_active


def test_the_sync_changes_nothing_while_the_directory_is_down(directory):
    sign_in("bob")
    directory.stop()
    try:
        with pytest.raises(CommandError, match="Directory sync stopped"):
            call_command("directory_sync")
        assert get_user_model().objects.get(username="bob").is_active
    finally:
        directory.start()


def test_local_accounts_keep_working_beside_the_directory(directory):
    UserFactory(username="breakglass", is_staff=True, password="local-pass-word-1")
    client, response = sign_in("breakglass", "local-pass-word-1")
    assert signed_in_as(client) == "breakglass"
    assert not DirectoryAccount.objects.filter(user__username="breakglass").exists()


@pytest.mark.parametrize("scheme", ["starttls", "ldaps"])
def test_tls_with_the_studio_ca_file(directory, settings, monkeypatch, scheme):
    from config.directory import ldap_settings

    if scheme == "starttls":
        monkeypatch.setenv("AUTH_LDAP_START_TLS", "true")
        monkeypatch.setenv("AUTH_LDAP_SERVER_URI", directory.uri)
    else:
        monkeypatch.setenv("AUTH_LDAP_SERVER_URI", directory.ldaps_uri)
    monkeypatch.setenv("AUTH_LDAP_CA_FILE", str(directory.ca_file))
    for name, value in ldap_settings().items():
        setattr(settings, name, value)
    client, _ = sign_in("bob")
    assert signed_in_as(client) == "bob"


def test_tls_refuses_a_server_the_ca_file_does_not_vouch_for(directory, settings, monkeypatch, tmp_path):
    from config.directory import ldap_settings
    from identity.tests.slapd import _make_tls

    other_ca, _, _ = _make_tls(tmp_path)
    monkeypatch.setenv("AUTH_LDAP_SERVER_URI", directory.ldaps_uri)
    monkeypatch.setenv("AUTH_LDAP_CA_FILE", str(other_ca))
    for name, value in ldap_settings().items():
        setattr(settings, name, value)
    client, response = sign_in("bob")
    assert response.status_code == 200
    assert signed_in_as(client) is None
    assert not get_user_model().objects.filter(username="bob").exists()


def test_beat_keeps_the_directory_in_step(directory):
    from django_celery_beat.models import PeriodicTask

    from identity.tasks import sync_directory

    entry = PeriodicTask.objects.get(name="sync_directory")
    assert entry.task == "identity.tasks.sync_directory"
    assert entry.interval.every == 900
    sign_in("bob")
    directory.remove_member(LIGHTING, "bob")
    assert sync_directory() == {"checked": 1, "changed": 1, "refused": 1, "error": ""}
    assert get_user_model().objects.get(username="bob").is_active is False


def test_the_sync_task_does_nothing_without_a_directory(settings):
    from identity.tasks import sync_directory

    settings.AUTH_LDAP_ENABLED = False
    assert sync_directory() is None


def test_the_audit_log_says_when_the_directory_grants_changes_and_ends_access(directory):
    from fleet.models import AuditEvent

    client, _ = sign_in("alice")
    sign_in("alice")  # a sign-in that changes nothing leaves no event
    directory.remove_member(ADMINS, "alice")
    directory.add_member(LIGHTING, "alice")
    client.get("/me/")
    directory.remove_member(LIGHTING, "alice")
    client.get("/me/")
    events = list(AuditEvent.objects.filter(object_type="directory_account").order_by("pk")
                  .values_list("action", "object_repr", "after__role"))
    assert events == [("directory_account.grant", "alice", "admin"), ("directory_account.role", "alice", "artist"),
                      ("directory_account.refuse", "alice", "")]
    assert NO_ROLE in AuditEvent.objects.filter(action="directory_account.refuse").get().comment


def test_directory_check_shows_what_the_directory_says(directory):
    out = StringIO()
    call_command("directory_check", "alice", "dave", stdout=out)
    text = out.getvalue()
    assert f"Connected to {directory.uri}" in text
    assert f"alice: {person_dn('alice')}" in text
    assert f"group: {ADMINS}" in text
    assert "role: admin" in text
    assert "role: none: Your Studio directory account is not in a group" in text
    with pytest.raises(CommandError, match="Not found in the directory .*: nobody"):
        call_command("directory_check", "nobody", stdout=StringIO())
    assert not get_user_model().objects.exists()  # a check changes nothing


def test_directory_check_names_a_wrong_bind_password(directory, settings):
    settings.AUTH_LDAP_BIND_PASSWORD = "wrong"
    with pytest.raises(CommandError, match="Invalid credentials"):
        call_command("directory_check", stdout=StringIO())


def test_an_api_token_of_a_removed_user_is_refused_at_its_next_request(directory):
    from fleet.api_tokens import issue_token

    sign_in("bob")
    _, key = issue_token(get_user_model().objects.get(username="bob"), "render sync")
    api = Client(HTTP_AUTHORIZATION=f"Token {key}")
    assert api.get("/api/v1/vms/").status_code == 200
    directory.remove_member(LIGHTING, "bob")
    response = api.get("/api/v1/vms/")
    assert response.status_code == 401
    assert NO_ROLE in response.json()["detail"]
    # A local account's token is not the directory's to judge.
    _, local_key = issue_token(UserFactory(username="breakglass", is_staff=True), "ops")
    assert Client(HTTP_AUTHORIZATION=f"Token {local_key}").get("/api/v1/vms/").status_code == 200


def test_a_superuser_taken_over_by_the_directory_keeps_the_break_glass_password(directory):
    UserFactory(username="alice", is_staff=True, is_superuser=True, password="break-glass-pass-1")
    sign_in("alice")
    client, _ = sign_in("alice", "break-glass-pass-1", addr="10.2.0.10")  # the directory says wrong; local works
    assert signed_in_as(client) == "alice"

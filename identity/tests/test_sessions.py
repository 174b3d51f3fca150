"""Sessions (identity/sessions.py, identity/middleware.py): a session ends after 8 hours without
the user's own activity or 7 days after sign-in, and the sign-in page says which; a page polling
on its own keeps no session alive; each signed-in browser has a UserSession row, and
`end_sessions` signs a user out of every browser at once, through whichever session engine."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.contrib.sessions.models import Session
from django.core.cache import cache
from django.db import connection
from django.test import Client
from django.test.utils import CaptureQueriesContext

from fleet.api_tokens import issue_token
from fleet.models import AuditEvent
from fleet.tests.factories import UserFactory
from identity import sessions
from identity.models import UserSession, method_of
from identity.session_store import SessionStore
from identity.tests.sessions_world import (
    FIREFOX,
    IDLE,
    LIFETIME,
    OFFICE,
    PASSWORD,
    POLL,
    T0,
    sent_to_sign_in_saying,
    sign_in,
    signed_in,
)

pytestmark = pytest.mark.django_db


# --- the rules ------------------------------------------------------------------------------------

@pytest.mark.parametrize(("minutes", "words"), [
    (480, "8 hours"), (60, "1 hour"), (30, "30 minutes"), (1, "1 minute"), (90, "1 hour 30 minutes"),
    (121, "2 hours 1 minute"),
])
def test_timeouts_are_said_as_people_say_them(minutes, words):
    assert sessions.duration_words(minutes) == words


@pytest.mark.parametrize(("hours", "words"), [(168, "7-day"), (24, "1-day"), (12, "12-hour"), (36, "36-hour")])
def test_lifetimes_are_said_in_days_when_they_are_whole_days(hours, words):
    assert sessions.limit_words(hours) == words


def test_the_messages_follow_the_settings(settings):
    assert sessions.message_for(sessions.Ended.IDLE) == IDLE
    assert sessions.message_for(sessions.Ended.LIFETIME) == LIFETIME
    settings.SESSION_IDLE_TIMEOUT_MINUTES, settings.SESSION_MAX_AGE_HOURS = 45, 12
    assert sessions.message_for(sessions.Ended.IDLE) == "You were signed out after 45 minutes without activity."
    assert sessions.message_for(sessions.Ended.LIFETIME) == "Your session reached its 12-hour limit; sign in again."


def test_a_session_past_both_limits_reached_its_lifetime_and_a_clock_set_back_ends_nothing():
    start = T0.timestamp()
    assert sessions.ended_because(start, start, start + 8 * 3600 - 1) is None
    assert sessions.ended_because(start, start, start + 8 * 3600) == sessions.Ended.IDLE
    assert sessions.ended_because(start, start + 7 * 86400 - 60, start + 7 * 86400) == sessions.Ended.LIFETIME
    assert sessions.ended_because(start, start, start + 30 * 86400) == sessions.Ended.LIFETIME
    assert sessions.ended_because(start, start, start - 3600) is None


@pytest.mark.parametrize(("backend", "method"), [
    ("django.contrib.auth.backends.ModelBackend", "Local password"),
    ("config.lockout.SignInThrottleBackend", "Local password"),
    ("identity.ldap_backend.DirectoryBackend", "LDAP"),
    ("django_auth_ldap.backend.LDAPBackend", "LDAP"),
    ("identity.oidc.OidcBackend", "OpenID Connect"),
    ("mozilla_django_oidc.auth.OIDCAuthenticationBackend", "OpenID Connect"),
    ("studio.auth.KerberosBackend", "KerberosBackend"),
    ("", "Unknown"),
])
def test_the_sign_in_method_is_named_from_the_backend_path(backend, method):
    assert method_of(backend) == method


# --- the UserSession rows -------------------------------------------------------------------------

def test_signing_in_records_the_session_and_signing_out_removes_it(clock, ana):
    browser = sign_in("ana")

    row = UserSession.objects.get()
    assert (row.user, row.session_key) == (ana, browser.session.session_key)
    assert (row.signed_in_at, row.last_seen_at, row.address) == (T0, T0, OFFICE)
    assert (row.user_agent, row.method) == (FIREFOX, "Local password")

    browser.post("/logout/")

    assert not UserSession.objects.exists()
    assert not signed_in(browser)


def test_a_long_user_agent_is_cut_and_a_test_clients_sign_in_is_recorded_too(clock, ana):
    browser = sign_in("ana", agent="X" * 5000)
    other = Client()
    other.force_login(ana)

    rows = {row.session_key: row for row in UserSession.objects.all()}
    assert len(rows[browser.session.session_key].user_agent) == 200
    assert rows[other.session.session_key].address is None
    assert signed_in(other)


def test_a_session_from_before_the_limits_existed_is_recorded_at_its_next_request(clock, ana):
    browser = sign_in("ana")
    session = browser.session
    for key in (sessions.SIGNED_IN, sessions.SEEN, sessions.ROW_KEY):
        del session[key]
    session.save()
    UserSession.objects.all().delete()

    assert signed_in(browser)

    row = UserSession.objects.get()
    assert (row.session_key, row.signed_in_at) == (browser.session.session_key, T0)
    assert sessions.end_sessions(ana) == 1
    assert not signed_in(browser)


def test_rows_of_sessions_the_engine_has_forgotten_are_swept_at_the_next_sign_in(clock, ana, boss):
    left = sign_in("ana")
    clock.shift(timedelta(days=3))
    idle = sign_in("ana")  # idle past the timeout, but the engine keeps it: its row stays (hidden)
    clock.shift(timedelta(days=5))

    boss_browser = sign_in("boss")

    kept = set(UserSession.objects.values_list("session_key", flat=True))
    assert kept == {idle.session.session_key, boss_browser.session.session_key}
    assert left.session.session_key not in kept
    assert list(sessions.live_sessions(ana)) == []


def test_a_password_change_gives_the_session_a_new_key_and_its_row_follows(clock, boss):
    browser = sign_in("boss")
    old_key = browser.session.session_key

    response = browser.post("/admin/password_change/", {
        "old_password": PASSWORD, "new_password1": "a-new-long-pass-phrase", "new_password2": "a-new-long-pass-phrase"})

    assert response.status_code == 302, response.content.decode()
    new_key = browser.session.session_key
    assert new_key != old_key
    assert UserSession.objects.get().session_key == new_key
    assert sessions.end_sessions(boss) == 1
    assert browser.get("/admin/").status_code == 302


# --- idle timeout and lifetime --------------------------------------------------------------------

def test_a_session_idle_for_8_hours_is_signed_out_and_the_sign_in_page_says_why(clock, ana):
    browser = sign_in("ana")
    clock.shift(timedelta(hours=7, minutes=59))
    assert signed_in(browser)  # activity: the 8 hours start again
    clock.shift(timedelta(hours=7, minutes=59))
    assert signed_in(browser)

    clock.shift(timedelta(hours=8))
    response = browser.get("/me/")

    assert response.status_code == 302
    assert response["Location"] == "/login/?next=/me/"
    assert sent_to_sign_in_saying(browser, response, IDLE)
    assert not UserSession.objects.exists()
    assert not signed_in(browser)


def test_a_session_ends_7_days_after_sign_in_however_active(clock, ana):
    browser = sign_in("ana")
    for _ in range(7 * 24 // 4 - 1):
        clock.shift(timedelta(hours=4))
        assert signed_in(browser)

    clock.shift(timedelta(hours=4))
    response = browser.get("/me/")

    assert sent_to_sign_in_saying(browser, response, LIFETIME)
    assert not signed_in(browser)


def test_the_limits_are_settings(clock, ana, settings):
    settings.SESSION_IDLE_TIMEOUT_MINUTES, settings.SESSION_MAX_AGE_HOURS = 30, 2
    browser = sign_in("ana")
    clock.shift(timedelta(minutes=29))
    assert signed_in(browser)
    clock.shift(timedelta(minutes=30))
    response = browser.get("/me/")
    assert sent_to_sign_in_saying(browser, response, "You were signed out after 30 minutes without activity.")

    browser = sign_in("ana")
    for _ in range(7):
        clock.shift(timedelta(minutes=15))
        assert signed_in(browser)
    clock.shift(timedelta(minutes=15))
    assert sent_to_sign_in_saying(browser, browser.get("/me/"), "Your session reached its 2-hour limit; sign in again.")


def test_opening_the_sign_in_page_after_the_limit_shows_it_with_the_reason(clock, ana):
    browser = sign_in("ana")
    clock.shift(timedelta(hours=9))

    response = browser.get("/login/")

    assert response.status_code == 200
    assert IDLE in response.content.decode()
    assert not signed_in(browser)


def test_a_form_sent_after_the_limit_goes_to_the_sign_in_page_and_changes_nothing(clock, ana, boss):
    browser = sign_in("boss")
    clock.shift(timedelta(hours=9))

    response = browser.post(f"/admin/auth/user/{ana.pk}/sign-out-everywhere/")

    assert (response.status_code, response["Location"]) == (302, "/login/")
    assert not AuditEvent.objects.exists()


# --- polling --------------------------------------------------------------------------------------

def test_an_overview_left_open_polling_still_times_out_and_goes_to_the_sign_in_page(clock, boss):
    browser = sign_in("boss")
    assert browser.get("/").status_code == 200
    for _ in range(8 * 4 - 1):  # a poll every 15 minutes (the page's are every 15 s: same thing, fewer requests)
        clock.shift(timedelta(minutes=15))
        assert browser.get("/overview/live/", **POLL).status_code == 200

    clock.shift(timedelta(minutes=15))
    response = browser.get("/overview/live/", **POLL)

    # htmx sends the whole tab to the sign-in page (HX-Redirect), rather than swapping the form into the overview
    assert response["HX-Redirect"] == "/login/?next=/"
    assert sent_to_sign_in_saying(browser, response, IDLE)
    assert not UserSession.objects.exists()


def test_a_click_on_an_htmx_button_is_activity(clock, boss):
    browser = sign_in("boss")
    clicked = {"HTTP_HX_REQUEST": "true", "HTTP_HX_CURRENT_URL": "http://testserver/"}
    for _ in range(3):
        clock.shift(timedelta(hours=6))
        assert browser.get("/overview/live/", **clicked).status_code == 200
    assert UserSession.objects.get().last_seen_at == T0 + timedelta(hours=18)


def test_polls_leave_the_last_seen_time_alone(clock, boss):
    browser = sign_in("boss")
    clock.shift(timedelta(hours=2))

    browser.get("/overview/live/", **POLL)

    assert UserSession.objects.get().last_seen_at == T0
    assert browser.session[sessions.SEEN] == int(T0.timestamp())


def test_the_last_seen_time_is_written_at_most_once_a_minute(clock, ana):
    browser = sign_in("ana")
    key = browser.session.session_key
    expiry = Session.objects.get(pk=key).expire_date

    clock.shift(timedelta(seconds=59))
    with CaptureQueriesContext(connection) as quiet:
        assert signed_in(browser)
    clock.shift(timedelta(seconds=1))
    with CaptureQueriesContext(connection) as stamped:
        assert signed_in(browser)

    def writes(queries) -> list[str]:
        return [q["sql"] for q in queries if q["sql"].lstrip().upper().startswith(("UPDATE", "INSERT"))]

    assert writes(quiet) == []
    assert len(writes(stamped)) == 2  # the session and its row, one UPDATE each
    assert UserSession.objects.get().last_seen_at == T0 + timedelta(minutes=1)
    # the cookie and the stored session live SESSION_MAX_AGE_HOURS from the last save
    assert Session.objects.get(pk=key).expire_date == expiry + timedelta(minutes=1) == T0 + timedelta(days=7, minutes=1)


# --- the API --------------------------------------------------------------------------------------

def test_an_api_call_with_an_ended_session_gets_401_json_saying_why(clock, boss):
    browser = sign_in("boss")
    assert browser.get("/api/v1/hosts/").status_code == 200
    clock.shift(timedelta(hours=8))

    response = browser.get("/api/v1/hosts/", HTTP_ACCEPT="application/json")

    assert response.status_code == 401
    assert response.json() == {"detail": IDLE}
    assert response["WWW-Authenticate"] == "Token"
    assert browser.get("/api/v1/hosts/").status_code == 401  # signed out: DRF's own 401 now
    assert not UserSession.objects.exists()


def test_an_api_call_with_a_token_is_answered_for_the_token_though_its_session_ended(clock, boss):
    browser = sign_in("boss")
    _, key = issue_token(boss, "ci")
    clock.shift(timedelta(hours=9))

    response = browser.get("/api/v1/hosts/", HTTP_AUTHORIZATION=f"Token {key}")

    assert response.status_code == 200
    assert not UserSession.objects.exists()


# --- signing out everywhere -----------------------------------------------------------------------

def test_end_sessions_signs_a_user_out_of_every_browser_and_no_one_else(clock, ana):
    UserFactory(username="bob")
    desk, laptop, bob = sign_in("ana"), sign_in("ana", addr="10.1.0.77", agent="Safari"), sign_in("bob")
    clock.shift(timedelta(minutes=5))

    ended = sessions.end_sessions(ana, reason="left the studio")

    assert ended == 2
    assert not signed_in(desk)
    assert not signed_in(laptop)
    assert signed_in(bob)
    assert list(UserSession.objects.values_list("user__username", flat=True)) == ["bob"]
    event = AuditEvent.objects.get(action="user.sign_out_everywhere")
    assert (event.object_type, event.object_id, event.object_repr) == ("user", str(ana.pk), "ana")
    assert (event.before, event.after, event.comment, event.actor_name) == (
        {"sessions": 2}, {"sessions": 0}, "left the studio", "system")


def test_end_sessions_counts_only_live_sessions_and_records_nothing_without_one(clock, ana):
    stale = sign_in("ana")
    clock.shift(timedelta(hours=9))

    assert sessions.end_sessions(ana) == 0
    assert not AuditEvent.objects.exists()
    assert not UserSession.objects.exists()
    assert stale.get("/me/").status_code == 302  # its session was deleted with its row


@pytest.mark.parametrize("engine", ["django.contrib.sessions.backends.cache",
                                    "django.contrib.sessions.backends.cached_db",
                                    "django.contrib.sessions.backends.file"])
def test_end_sessions_works_with_every_server_side_engine(clock, ana, settings, tmp_path, engine):
    settings.SESSION_ENGINE = engine
    settings.SESSION_FILE_PATH = str(tmp_path)
    desk, laptop = sign_in("ana"), sign_in("ana")
    assert signed_in(desk)
    assert signed_in(laptop)

    assert sessions.end_sessions(ana) == 2

    assert not signed_in(desk)
    assert not signed_in(laptop)


def test_sessions_kept_in_signed_cookies_are_refused_by_a_system_check(settings):
    assert sessions.check_session_engine() == []
    settings.SESSION_ENGINE = "django.contrib.sessions.backends.signed_cookies"

    (error,) = sessions.check_session_engine()

    assert error.id == "identity.E001"
    assert "cannot end it" in error.msg


def test_with_a_cache_only_this_process_sees_sessions_are_read_from_the_database(ana, settings):
    """The session engine reads through the cache only when it is Redis (identity/session_store.py,
    faults/test_session_cache.py); a cache of one process's memory, as the tests' and the embedded
    mode's own, would let each process serve its own stale copy."""
    browser = sign_in("ana")
    with CaptureQueriesContext(connection) as captured:
        assert signed_in(browser)
    assert any("django_session" in query["sql"] for query in captured.captured_queries)
    key = browser.cookies[settings.SESSION_COOKIE_NAME].value
    assert cache.get(SessionStore.cache_key_prefix + key) is None

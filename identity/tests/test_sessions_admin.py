"""Sessions in the admin site (identity/admin.py): an admin sees where a user is signed in and
signs them out of every browser, from the user's page or the Users list, with a message saying
how many sessions ended and an audit event."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.contrib import admin
from django.contrib.auth import get_user_model
from django.contrib.auth.admin import UserAdmin as DjangoUserAdmin
from django.contrib.auth.models import Permission

from fleet.models import AuditEvent
from fleet.tests.factories import UserFactory
from identity.models import UserSession
from identity.tests.sessions_world import sign_in, signed_in

pytestmark = pytest.mark.django_db

User = get_user_model()


def messages_on(response) -> list[str]:
    return [str(message) for message in response.context["messages"]]


def test_the_users_admin_is_djangos_with_sessions_added():
    user_admin = admin.site.get_model_admin(User)
    assert isinstance(user_admin, DjangoUserAdmin)
    assert (user_admin.list_display, user_admin.search_fields) == (DjangoUserAdmin.list_display,
                                                                    DjangoUserAdmin.search_fields)
    assert user_admin.fieldsets == DjangoUserAdmin.fieldsets


def test_a_users_page_lists_their_active_sessions(studio):
    ana, _, browsers = studio

    page = browsers["admin"].get(f"/admin/auth/user/{ana.pk}/change/")

    assert page.status_code == 200
    html = page.content.decode()
    assert "Active sessions" in html
    assert "10.1.0.15" in html
    assert "10.9.8.7" in html
    assert "Safari" in html
    assert html.count("Local password") == 2
    assert "Sign out everywhere" in html
    add = browsers["admin"].get("/admin/auth/user/add/").content.decode()
    assert "Active sessions" not in add
    assert "Sign out everywhere" not in add


def test_sessions_past_their_limits_are_not_listed(studio, clock):
    ana, _, browsers = studio
    clock.shift(timedelta(hours=7, minutes=45))
    assert signed_in(browsers["laptop"])
    assert signed_in(browsers["admin"])
    clock.shift(timedelta(minutes=10))

    html = browsers["admin"].get(f"/admin/auth/user/{ana.pk}/change/").content.decode()

    assert "10.9.8.7" in html
    assert "10.1.0.15" not in html  # the desk's session has been idle 8 hours


def test_the_button_on_a_users_page_signs_them_out_of_every_browser(studio):
    ana, bob, browsers = studio

    response = browsers["admin"].post(f"/admin/auth/user/{ana.pk}/sign-out-everywhere/", follow=True)

    assert response.redirect_chain == [(f"/admin/auth/user/{ana.pk}/change/", 302)]
    assert messages_on(response) == ["Signed ana out everywhere: 2 sessions ended."]
    assert not signed_in(browsers["desk"])
    assert not signed_in(browsers["laptop"])
    assert signed_in(browsers["bob"])
    event = AuditEvent.objects.get(action="user.sign_out_everywhere")
    assert (event.actor_name, event.source, event.object_repr, event.before) == ("admin", "admin", "ana",
                                                                                  {"sessions": 2})
    assert "10.1.0.15" not in response.content.decode()


def test_the_button_says_so_when_there_was_nothing_to_end(studio):
    _, _, browsers = studio
    carol = UserFactory(username="carol")

    response = browsers["admin"].post(f"/admin/auth/user/{carol.pk}/sign-out-everywhere/", follow=True)

    assert messages_on(response) == ["carol had no active session; nothing to end."]
    assert not AuditEvent.objects.exists()


def test_the_button_takes_a_post_a_known_user_and_the_right_to_change_users(studio):
    ana, _, browsers = studio
    url = f"/admin/auth/user/{ana.pk}/sign-out-everywhere/"
    assert browsers["admin"].get(url).status_code == 405
    assert browsers["admin"].post("/admin/auth/user/999999/sign-out-everywhere/").status_code == 302
    viewer = UserFactory(username="viewer", is_staff=True)
    viewer.user_permissions.add(Permission.objects.get(codename="view_user"))
    viewer_browser = sign_in("viewer")

    assert viewer_browser.post(url).status_code == 403
    page = viewer_browser.get(f"/admin/auth/user/{ana.pk}/change/").content.decode()
    assert "10.9.8.7" in page  # who may see the user sees their sessions...
    assert "Sign out everywhere" not in page  # ...but may not end them
    assert signed_in(browsers["desk"])
    assert UserSession.objects.filter(user=ana).count() == 2


def test_the_action_of_the_users_list_signs_out_every_selected_user(studio):
    ana, bob, browsers = studio
    carol = UserFactory(username="carol")

    response = browsers["admin"].post("/admin/auth/user/", {
        "action": "sign_out_everywhere", "_selected_action": [ana.pk, bob.pk, carol.pk]}, follow=True)

    assert messages_on(response) == ["Signed 3 users out everywhere: 3 sessions ended."]
    assert not any(signed_in(browsers[name]) for name in ("desk", "laptop", "bob"))
    assert signed_in(browsers["admin"])
    assert sorted(AuditEvent.objects.values_list("object_repr", flat=True)) == ["ana", "bob"]

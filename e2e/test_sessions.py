"""Sessions in a real browser (identity/sessions.py): the overview's own polling keeps no session
alive, so a tab left open goes to the sign-in page at the idle timeout and says why; and after an
admin signs someone out everywhere, their next page is the sign-in page."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from django.contrib.auth.models import User

from e2e.conftest import PASSWORD, VIEWPORT, sign_in

pytestmark = pytest.mark.django_db(transaction=True, serialized_rollback=True)


@pytest.fixture
def admin_user():
    return User.objects.create_superuser("admin", "admin@studio.example", PASSWORD)


def test_an_overview_left_open_is_signed_out_at_the_idle_timeout_and_says_why(page, admin_user, settings,
                                                                              time_machine):
    settings.DASHBOARD_REFRESH_S = 1
    sign_in(page, "admin")
    with page.expect_request(lambda request: "/overview/live/" in request.url) as polled:
        pass
    assert polled.value.headers.get("x-fleet-poll") == "1"  # static/js/polling.js marks the page's own requests

    time_machine.move_to(datetime.now(UTC) + timedelta(hours=8, minutes=1))

    page.wait_for_url("**/login/?next=/", timeout=15_000)
    assert "You were signed out after 8 hours without activity." in page.locator("main").inner_text()


def test_an_admin_signs_an_artist_out_everywhere_and_her_next_page_is_the_sign_in_page(page, browser, live_server,
                                                                                       admin_user):
    ana = User.objects.create_user("ana", password=PASSWORD)
    sign_in(page, "ana", next_path="/me/")
    context = browser.new_context(viewport=VIEWPORT, base_url=live_server.url)
    admin_tab = context.new_page()
    try:
        sign_in(admin_tab, "admin")
        admin_tab.goto(f"/admin/auth/user/{ana.pk}/change/")
        assert "Local password" in admin_tab.locator(".inline-group").inner_text()

        admin_tab.click("input[value='Sign out everywhere']")
        admin_tab.wait_for_load_state()

        assert "Signed ana out everywhere: 1 session ended." in admin_tab.locator(".messagelist").inner_text()
    finally:
        context.close()
    page.reload()
    page.wait_for_url("**/login/?next=/me/")

"""The content security policy in a real browser: it is enforced (an injected inline script does
not run, and the violation is the kind of console error that fails every browser test), and the
pages that script something still work under it."""

from __future__ import annotations

import pytest
from django.contrib.auth.models import User

from e2e.conftest import PASSWORD, VIEWPORT, sign_in

pytestmark = pytest.mark.django_db(transaction=True, serialized_rollback=True)

INJECT = """() => {
  const script = document.createElement("script");
  script.textContent = "window.injectedRan = true";
  document.body.appendChild(script);
  return new Promise((resolve) => setTimeout(() => resolve(window.injectedRan === true), 100));
}"""


@pytest.fixture
def admin_user():
    return User.objects.create_superuser("admin", "admin@studio.example", PASSWORD)


def test_an_injected_inline_script_is_refused_and_reported_as_a_console_error(browser, live_server):
    context = browser.new_context(viewport=VIEWPORT, base_url=live_server.url)
    tab = context.new_page()
    errors: list[str] = []
    tab.on("console", lambda msg: errors.append(msg.text) if msg.type == "error" else None)
    try:
        tab.goto("/login/")
        ran = tab.evaluate(INJECT)
    finally:
        context.close()
    assert ran is False
    assert any("Content Security Policy" in error for error in errors), errors


def test_the_request_status_filter_applies_on_choice(page, admin_user):
    sign_in(page, "admin")
    page.goto("/requests/")
    page.select_option("select[name=status]", "rejected")
    page.wait_for_url("**/requests/?status=rejected")
    assert page.locator("select[name=status]").input_value() == "rejected"


def test_the_api_docs_render_the_operations(page, admin_user):
    sign_in(page, "admin")
    page.goto("/api/docs/")
    page.locator(".opblock").first.wait_for(timeout=20_000)
    assert page.locator(".opblock").count() > 10
    assert page.locator(".opblock-summary-path", has_text="/api/v1/hosts/").count() > 0


def test_the_admin_periodic_task_form_says_the_chosen_crontab_in_words(page, admin_user):
    from django_celery_beat.models import CrontabSchedule

    from fleet.beat import ensure_periodic_task
    from telemetry.schedules import POLL_AGENTS

    task, _ = ensure_periodic_task(POLL_AGENTS, "telemetry.tasks.poll_agents", 10)
    nightly = CrontabSchedule.objects.create(minute="30", hour="2")
    sign_in(page, "admin")
    page.goto("/admin/")
    page.goto(f"/admin/django_celery_beat/periodictask/{task.pk}/change/")
    page.select_option("#id_crontab", str(nightly.pk))
    assert "Translation: " + nightly.human_readable in page.locator(".field-crontab .help").inner_text()

"""The feedback pages: the once-a-day prompt on /me/ (Send, Not now), the artist's own ratings,
and the admins' trends page; nobody sees another artist's ratings."""

from __future__ import annotations

import html
from datetime import datetime, timedelta

import pytest
from django.test import Client
from django.utils import timezone

from sizing import feedback
from sizing.models import Feedback

pytestmark = pytest.mark.django_db

PROMPT = 'data-section="feedback-prompt"'
BOB_NOTE = "bob-private: the crowd scene froze"


@pytest.fixture
def ana(fleet_world):
    client = Client()
    client.force_login(fleet_world.ana.user)
    return client


def page(client, url: str = "/me/") -> str:
    response = client.get(url)
    assert response.status_code == 200, response.content[:2000]
    return html.unescape(response.content.decode())


def test_the_prompt_asks_about_the_artists_vm_with_stars_tags_and_a_note(ana):
    body = page(ana)
    assert PROMPT in body
    assert "How did ws-anim" not in body
    assert "How did ws-ana feel today?" in body
    assert body.count('type="radio" name="rating"') == 5
    for label in ("Viewport stutter", "Out of GPU memory", "Slow to open scenes", "Display lag", "Fine"):
        assert label in body
    assert 'name="csrfmiddlewaretoken"' in body
    assert "Not now" in body


def test_send_stores_the_rating_and_the_prompt_is_gone_for_the_day(ana, fleet_world):
    response = ana.post(f"/me/vms/{fleet_world.vm_a.pk}/feedback/",
                        {"rating": "2", "tags": ["out_of_gpu_memory", "viewport_stutter"], "note": "Crowd shot"},
                        follow=True)
    assert response.redirect_chain == [("/me/", 302)]
    body = html.unescape(response.content.decode())
    assert f"Thanks: ws-ana rated 2 of 5 for {timezone.localdate()}." in body
    assert PROMPT not in body
    stored = Feedback.objects.get()
    assert (stored.rating, stored.tags, stored.note) == (2, ["viewport_stutter", "out_of_gpu_memory"], "Crowd shot")
    # The Feedback section lists it.
    assert 'data-rating="2"' in body
    assert "Viewport stutter, Out of GPU memory" in body


def test_not_now_hides_the_prompt_until_tomorrow(ana, fleet_world, time_machine):
    noon = datetime.combine(timezone.localdate(), datetime.min.time().replace(hour=12),
                            tzinfo=timezone.get_current_timezone())
    time_machine.move_to(noon, tick=False)
    response = ana.post("/me/feedback/not-now/", follow=True)
    assert response.redirect_chain == [("/me/", 302)]
    assert PROMPT not in response.content.decode()
    assert PROMPT not in page(ana)
    assert not Feedback.objects.exists()
    time_machine.move_to(noon + timedelta(days=1), tick=False)
    ana.force_login(fleet_world.ana.user)  # a new day's session (yesterday's timed out)
    assert PROMPT in page(ana)


def test_bad_input_is_a_message_and_nothing_is_stored(ana, fleet_world):
    url = f"/me/vms/{fleet_world.vm_a.pk}/feedback/"
    for data, words in (
        ({}, "Choose a rating from 1 to 5 stars."),
        ({"rating": "9"}, "Choose a rating from 1 to 5 stars (not 9)."),
        ({"rating": "3", "tags": ["laggy"]}, "Unknown tag laggy"),
        ({"rating": "3", "tags": ["fine", "display_lag"]}, "'fine' cannot go with a problem tag"),
        ({"rating": "3", "note": "x" * 1001}, "Keep the note to 1000 characters (it has 1001)."),
    ):
        response = ana.post(url, data, follow=True)
        assert response.status_code == 200
        assert f"Feedback not sent: {words}" in html.unescape(response.content.decode()), data
    assert not Feedback.objects.exists()


def test_rating_another_artists_vm_is_refused(ana, fleet_world):
    assert ana.post(f"/me/vms/{fleet_world.vm_b.pk}/feedback/", {"rating": "5"}).status_code == 403
    assert ana.get(f"/me/vms/{fleet_world.vm_a.pk}/feedback/").status_code == 405
    assert not Feedback.objects.exists()


def test_an_artist_sees_only_their_own_ratings(ana, fleet_world):
    feedback.file_feedback(fleet_world.bob.user, fleet_world.vm_b, 1, ["out_of_gpu_memory"], BOB_NOTE)
    body = page(ana)
    assert BOB_NOTE not in body
    assert "ws-bob" not in body
    assert "No ratings yet." in body
    assert ana.get("/sizing/feedback/").status_code == 403


def test_admins_see_trends_and_the_latest_ratings(client, admin_user, fleet_world):
    w = fleet_world
    feedback.file_feedback(w.ana.user, w.vm_a, 5, ["fine"], "all good")
    feedback.file_feedback(w.bob.user, w.vm_b, 1, ["out_of_gpu_memory"], BOB_NOTE)
    client.force_login(admin_user)
    body = page(client, "/sizing/feedback/")
    assert 'data-section="trends-workflow"' in body
    assert 'data-section="trends-host"' in body
    # Both are modeling artists: one row, mean 3.00 of 2 ratings; per host one row each.
    assert '<tr data-key="modeling"><td>Modeling</td><td class="num">2</td>' in body
    assert '<tr data-key="host-b"><td>host-b</td><td class="num">1</td>' in body
    assert "Out of GPU memory (50%)" in body
    assert "Bob Artist" in body
    assert BOB_NOTE in body
    assert "/api/v1/feedback/?format=csv" in body


def test_the_trends_page_with_no_ratings(client, admin_user):
    client.force_login(admin_user)
    body = page(client, "/sizing/feedback/")
    assert "No ratings in the last four weeks" in body

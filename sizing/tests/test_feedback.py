"""Filing a day's rating, the once-a-day prompt, and the reads of `sizing.feedback`: who may rate
what, what is refused in which words, and the trends' figures on a known set of ratings."""

from __future__ import annotations

from datetime import date, datetime, timedelta

import pytest
from django.utils import timezone

from fleet.tests.factories import ArtistFactory, HostFactory, UserFactory, VirtualMachineFactory
from sizing import feedback
from sizing.models import Feedback

pytestmark = pytest.mark.django_db


def test_an_artist_rates_their_own_vm_for_today(fleet_world):
    w = fleet_world
    filed, created = feedback.file_feedback(w.ana.user, w.vm_a, 2, ["out_of_gpu_memory", "viewport_stutter"],
                                            "Crashed opening the crowd shot")
    assert created
    stored = Feedback.objects.get()
    assert (stored.artist, stored.vm, stored.host, stored.rating) == (w.ana, w.vm_a, w.host_a, 2)
    assert stored.tags == ["viewport_stutter", "out_of_gpu_memory"]
    assert stored.session_date == timezone.localdate()
    assert stored.created_by == w.ana.user
    assert filed == stored


def test_a_second_rating_the_same_day_replaces_the_first(fleet_world):
    w = fleet_world
    feedback.file_feedback(w.ana.user, w.vm_a, 2, ["display_lag"], "laggy")
    again, created = feedback.file_feedback(w.ana.user, w.vm_a, 4, ["fine"], "")
    assert not created
    assert list(Feedback.objects.values_list("rating", "tags", "note")) == [(4, ["fine"], "")]
    assert again.pk == Feedback.objects.get().pk


def test_an_earlier_day_is_its_own_rating(fleet_world):
    w = fleet_world
    yesterday = timezone.localdate() - timedelta(days=1)
    feedback.file_feedback(w.ana.user, w.vm_a, 3, day=yesterday)
    feedback.file_feedback(w.ana.user, w.vm_a, 5)
    assert sorted(Feedback.objects.values_list("session_date", "rating")) == [(yesterday, 3),
                                                                             (timezone.localdate(), 5)]


@pytest.mark.parametrize("who", ["bob", "admin"])
def test_nobody_rates_someone_elses_vm(fleet_world, admin_user, who):
    user = fleet_world.bob.user if who == "bob" else admin_user
    with pytest.raises(PermissionError, match="only rate your own workstation"):
        feedback.file_feedback(user, fleet_world.vm_a, 5)
    assert not Feedback.objects.exists()


@pytest.mark.parametrize(("fields", "field", "words"), [
    ({"rating": 0}, "rating", "from 1 to 5 stars (not 0)"),
    ({"rating": 6}, "rating", "from 1 to 5 stars (not 6)"),
    ({"rating": True}, "rating", "from 1 to 5 stars"),
    ({"rating": "5"}, "rating", "from 1 to 5 stars"),
    ({"tags": ["laggy"]}, "tags", "Unknown tag 'laggy'"),
    ({"tags": ["fine", "display_lag"]}, "tags", "'fine' cannot go with a problem tag"),
    ({"tags": "fine"}, "tags", "Tags are a list"),
    ({"note": "x" * 1001}, "note", "1000 characters (it has 1001)"),
    ({"day": date.today() + timedelta(days=2)}, "session_date", "or an earlier day"),
    ({"day": date.today() - timedelta(days=30)}, "session_date", "last 14 days"),
])
def test_bad_values_are_refused_in_words_and_nothing_is_stored(fleet_world, fields, field, words):
    values = {"rating": 3, "tags": [], "note": "", "day": None, **fields}
    with pytest.raises(feedback.FeedbackError) as refused:
        feedback.file_feedback(fleet_world.ana.user, fleet_world.vm_a, values["rating"], values["tags"],
                               values["note"], values["day"])
    assert list(refused.value.errors) == [field]
    assert words in refused.value.errors[field]
    assert not Feedback.objects.exists()


# The prompt ---------------------------------------------------------------------------------


def test_the_prompt_asks_once_a_day_until_rated_or_not_now(fleet_world):
    w = fleet_world
    second = VirtualMachineFactory(name="ws-ana-2", artist=w.ana)
    now = timezone.now()
    assert feedback.prompt_due(w.ana.user, now) == [w.vm_a, second]

    feedback.file_feedback(w.ana.user, w.vm_a, 4)
    assert feedback.prompt_due(w.ana.user, now) == [second]  # the other VM is still to rate today

    feedback.dismiss_prompt(w.ana.user, now)
    feedback.dismiss_prompt(w.ana.user, now)  # twice is harmless
    assert feedback.prompt_due(w.ana.user, now) == []
    assert feedback.prompt_due(w.ana.user, now + timedelta(days=1)) == [w.vm_a, second]


def test_the_prompt_is_for_the_artists_own_vms_only(fleet_world, admin_user):
    assert feedback.prompt_due(fleet_world.bob.user) == [fleet_world.vm_b]
    assert feedback.prompt_due(admin_user) == []  # no artist, no VMs, no prompt
    assert feedback.prompt_due(UserFactory()) == []


# Reads ----------------------------------------------------------------------------------------


def test_an_artist_reads_only_what_they_filed(fleet_world, admin_user):
    w = fleet_world
    feedback.file_feedback(w.ana.user, w.vm_a, 2)
    feedback.file_feedback(w.bob.user, w.vm_b, 5)
    assert [f.rating for f in feedback.feedback_for(w.ana.user)] == [2]
    assert [f.rating for f in feedback.feedback_for(w.bob.user)] == [5]
    assert sorted(f.rating for f in feedback.feedback_for(admin_user)) == [2, 5]


def test_a_vm_given_to_another_artist_does_not_show_them_the_previous_ratings(fleet_world):
    w = fleet_world
    feedback.file_feedback(w.ana.user, w.vm_a, 1, ["display_lag"], "ana's private words",
                           day=timezone.localdate() - timedelta(days=1))
    w.vm_a.artist = w.bob
    w.vm_a.save()
    assert list(feedback.feedback_for(w.bob.user)) == []
    assert w.vm_a.pk not in feedback.ratings_by_vm(date(2000, 1, 1))  # nor in the evidence bob reads
    assert feedback.prompt_due(w.bob.user) == [w.vm_a, w.vm_b]


def test_ratings_by_vm_give_each_vms_days_oldest_first_for_the_summary(fleet_world):
    w = fleet_world
    today = timezone.localdate()
    feedback.file_feedback(w.ana.user, w.vm_a, 2, ["out_of_gpu_memory"], day=today - timedelta(days=3))
    feedback.file_feedback(w.ana.user, w.vm_a, 3, [], day=today - timedelta(days=1))
    feedback.file_feedback(w.ana.user, w.vm_a, 5, ["fine"], day=today - timedelta(days=10))
    feedback.file_feedback(w.bob.user, w.vm_b, 1)
    since = today - timedelta(days=7)
    want = [(today - timedelta(days=3), 2, ["out_of_gpu_memory"]), (today - timedelta(days=1), 3, [])]
    assert feedback.ratings_by_vm(since) == {w.vm_a.pk: want, w.vm_b.pk: [(today, 1, [])]}
    assert feedback.ratings_by_vm(since, [w.vm_a.pk]) == {w.vm_a.pk: want}
    assert feedback.ratings_by_vm(since, [w.vm_b.pk]) == {w.vm_b.pk: [(today, 1, [])]}


def known_ratings():
    """Two modeling artists on host-a, one lighting artist on host-b, over two weeks."""
    monday = date(2026, 11, 9)
    host_a, host_b = HostFactory(name="host-a"), HostFactory(name="host-b")
    modelers = [ArtistFactory(workflow="modeling") for _ in range(2)]
    lighter = ArtistFactory(workflow="lighting")
    vms = [VirtualMachineFactory(artist=a, host=host_a) for a in modelers]
    vm_l = VirtualMachineFactory(artist=lighter, host=host_b)
    rows = [
        (vms[0], monday, 2, ["out_of_gpu_memory"]),
        (vms[1], monday, 4, ["fine"]),
        (vms[0], monday + timedelta(days=7), 1, ["out_of_gpu_memory", "viewport_stutter"]),
        (vm_l, monday + timedelta(days=1), 5, []),
        (vm_l, monday + timedelta(days=8), 3, ["display_lag"]),
    ]
    for vm, day, rating, tags in rows:
        Feedback.objects.create(artist=vm.artist, vm=vm, host=vm.host, session_date=day, rating=rating, tags=tags)
    return monday


def test_trends_per_workflow_are_exact(db):
    monday = known_ratings()
    rows = feedback.trends("workflow", monday, monday + timedelta(days=13))
    got = {row.label: row.as_dict() for row in rows}
    assert list(got) == ["Lighting", "Modeling"]
    modeling = got["Modeling"]
    assert (modeling["count"], modeling["mean"], modeling["low_share"], modeling["high_share"]) == (3, 2.33, 0.667,
                                                                                                   0.333)
    assert modeling["tags"] == {"out_of_gpu_memory": 0.667, "viewport_stutter": 0.333, "fine": 0.333}
    assert [(w["week"], w["count"], w["mean"]) for w in modeling["weeks"]] == [("2026-11-09", 2, 3.0),
                                                                             ("2026-11-16", 1, 1.0)]
    assert (got["Lighting"]["count"], got["Lighting"]["mean"]) == (2, 4.0)
    assert "Artist" not in repr(rows)  # grouped: no artist's name


def test_trends_per_host_and_the_window(db):
    monday = known_ratings()
    rows = feedback.trends("host", monday, monday + timedelta(days=6))  # the first week only
    assert [(row.label, row.summary["count"], row.summary["mean"]) for row in rows] == [("host-a", 2, 3.0),
                                                                                      ("host-b", 1, 5.0)]


def test_trends_default_to_the_last_four_weeks(db, time_machine):
    monday = known_ratings()
    time_machine.move_to(datetime(2026, 12, 8, 12, 0, tzinfo=timezone.get_current_timezone()), tick=False)
    # 2026-11-11 .. 2026-12-08: the ratings of Nov 9 and 10 are out.
    rows = feedback.trends("host")
    assert [(row.label, row.summary["count"]) for row in rows] == [("host-a", 1), ("host-b", 1)]
    assert feedback.trend_window() == (monday + timedelta(days=2), date(2026, 12, 8))


def test_admins_read_ratings_on_the_admin_site_and_may_delete_one_with_its_audit(fleet_world, admin_client):
    from fleet.models import AuditEvent

    w = fleet_world
    filed, _ = feedback.file_feedback(w.ana.user, w.vm_a, 1, ["display_lag"], "something that should not stay")
    listed = admin_client.get("/admin/sizing/feedback/")
    assert listed.status_code == 200
    assert w.vm_a.name in listed.content.decode()
    assert admin_client.get("/admin/sizing/feedback/add/").status_code == 403  # nobody rates for an artist

    gone = admin_client.post(f"/admin/sizing/feedback/{filed.pk}/delete/", {"post": "yes"})

    assert gone.status_code == 302
    assert not Feedback.objects.exists()
    assert AuditEvent.objects.filter(action="feedback.delete", object_id=str(filed.pk)).exists()

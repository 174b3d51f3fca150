"""The refresh as Celery, beat and `manage.py` run it: the task, its hourly beat entry and the command."""

from __future__ import annotations

import json

import pytest
from django.core.management import CommandError, call_command
from django_celery_beat.models import IntervalSchedule, PeriodicTask

from config.celery import app as celery_app
from sizing import tasks
from sizing.models import Suggestion
from sizing.schedules import ensure_default_schedules
from sizing.tests.suggestion_world import NOW, rtx_studio, two_weeks_of_use

pytestmark = pytest.mark.django_db


@pytest.fixture
def world(time_machine):
    """The suggestion world with its two weeks ending at the hour in progress, which the task and
    command judge by the clock: it stands still at NOW (half past ten), so the hour cannot turn
    between writing the rollups and the run."""
    time_machine.move_to(NOW, tick=False)
    world = rtx_studio()
    two_weeks_of_use(world)
    return world


def test_the_task_refreshes_every_vm_and_reports_counts_that_survive_json(world):
    counts = tasks.refresh_suggestions.run()

    assert json.loads(json.dumps(counts)) == counts
    assert (counts["upsize"], counts["downsize"], counts["keep"]) == (1, 1, 1)
    assert Suggestion.objects.count() == 3


def test_the_task_run_twice_leaves_one_suggestion_per_vm(world):
    tasks.refresh_suggestions.run()
    tasks.refresh_suggestions.run([world.heavy.pk])
    tasks.refresh_suggestions.run()

    assert Suggestion.objects.count() == 3
    assert Suggestion.objects.filter(vm=world.heavy).count() == 1


def test_the_task_travels_as_json_keeps_no_result_and_has_time_limits():
    task = tasks.refresh_suggestions
    assert task.name == "sizing.tasks.refresh_suggestions"
    assert task.ignore_result is True
    assert task.serializer == "json"
    assert 0 < task.soft_time_limit < task.time_limit
    # The worker finds it: the app's autodiscovery imports sizing.tasks.
    assert task.name in celery_app.tasks


def test_migrate_schedules_the_refresh_hourly_expiring_before_the_next_run():
    periodic = PeriodicTask.objects.get(name="refresh_suggestions")
    assert periodic.task in celery_app.tasks
    assert periodic.task == tasks.refresh_suggestions.name
    assert periodic.enabled
    assert (periodic.interval.every, periodic.interval.period) == (3600, IntervalSchedule.SECONDS)
    assert 0 < periodic.expire_seconds < 3600


def test_an_interval_an_admin_changed_survives_the_next_migrate():
    periodic = PeriodicTask.objects.get(name="refresh_suggestions")
    periodic.interval = IntervalSchedule.objects.create(every=4 * 3600, period=IntervalSchedule.SECONDS)
    periodic.enabled = False
    periodic.save()

    ensure_default_schedules()

    periodic.refresh_from_db()
    assert (periodic.interval.every, periodic.enabled) == (4 * 3600, False)
    assert PeriodicTask.objects.filter(name="refresh_suggestions").count() == 1


def test_the_command_refreshes_and_says_what_it_found(world, capsys):
    call_command("refresh_suggestions")

    out = capsys.readouterr().out
    assert "1 upsize, 1 downsize, 1 keep, 0 not enough data; 0 removed." in out
    assert Suggestion.objects.count() == 3


def test_the_command_refreshes_the_vms_named_only(world, capsys):
    call_command("refresh_suggestions", "--vm", "ws-light")

    assert list(Suggestion.objects.values_list("vm__name", flat=True)) == ["ws-light"]
    assert "1 downsize" in capsys.readouterr().out


def test_the_command_refuses_an_unknown_vm_and_writes_nothing(world):
    with pytest.raises(CommandError, match="no VM named ws-ghost"):
        call_command("refresh_suggestions", "--vm", "ws-light", "--vm", "ws-ghost")

    assert not Suggestion.objects.exists()


def test_the_command_can_hand_the_work_to_a_worker(world, monkeypatch, capsys):
    sent = []
    monkeypatch.setattr(tasks.refresh_suggestions, "delay", lambda *args: sent.append(args))

    call_command("refresh_suggestions", "--enqueue", "--vm", "ws-heavy")

    assert sent == [([world.heavy.pk],)]
    assert not Suggestion.objects.exists()
    assert "Sent" in capsys.readouterr().out

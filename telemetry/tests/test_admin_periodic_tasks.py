"""The admin site's periodic tasks (django-celery-beat), with the broker down."""

from __future__ import annotations

import logging

import pytest
from celery.app.task import Task
from django.contrib.messages import get_messages
from django_celery_beat.models import PeriodicTask
from kombu.exceptions import OperationalError

from telemetry import schedules

pytestmark = pytest.mark.django_db

CHANGELIST = "/admin/django_celery_beat/periodictask/"


@pytest.fixture
def poll_task(db) -> PeriodicTask:
    schedules.ensure_default_schedules()
    return PeriodicTask.objects.get(task="telemetry.tasks.poll_agents")


def run_selected(client, task: PeriodicTask):
    return client.post(CHANGELIST, {"action": "run_tasks", "_selected_action": [task.pk]})


def test_running_a_task_while_redis_is_down_says_why_instead_of_a_server_error(client, admin_user, poll_task,
                                                                             monkeypatch):
    def refuse(*args, **kwargs):
        raise OperationalError("Error 111 connecting to redis:6379. Connection refused.")

    monkeypatch.setattr(Task, "apply_async", refuse)
    client.force_login(admin_user)
    # On the module's logger itself: Celery's task loader, which the action runs first, sets
    # Django up again, and the logging settings replace the root logger's handlers (caplog's).
    logged = []
    handler = logging.Handler(logging.WARNING)
    handler.emit = logged.append
    logging.getLogger("telemetry.admin").addHandler(handler)
    try:
        response = run_selected(client, poll_task)
    finally:
        logging.getLogger("telemetry.admin").removeHandler(handler)
    assert response.status_code == 302
    shown = [str(m) for m in get_messages(response.wsgi_request)]
    assert shown == ["Could not queue the selected tasks: the task queue (Redis) is unreachable. "
                     "Run them again once it is back."]
    assert [r.getMessage() for r in logged] == [
        "could not queue the selected periodic tasks: the task queue is unreachable "
        "(OperationalError: Error 111 connecting to redis:6379. Connection refused.)"]


def test_running_a_task_with_the_broker_up_queues_it(client, admin_user, poll_task, monkeypatch):
    sent = []
    monkeypatch.setattr(Task, "apply_async", lambda self, *args, **kwargs: sent.append(self.name))
    client.force_login(admin_user)
    response = run_selected(client, poll_task)
    assert response.status_code == 302
    assert sent == ["telemetry.tasks.poll_agents"]
    assert [str(m) for m in get_messages(response.wsgi_request)] == ["1 task was successfully run"]

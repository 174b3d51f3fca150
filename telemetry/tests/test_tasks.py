"""The collection tasks called as Celery runs them, and the beat schedule they run on."""

from __future__ import annotations

import json

import pytest
from django_celery_beat.models import IntervalSchedule, PeriodicTask

from config.celery import app as celery_app
from fleet.beat import ensure_periodic_task
from telemetry import shards, tasks
from telemetry.models import Agent, AgentStatus, GpuSample, VgpuSample
from telemetry.schedules import ensure_default_schedules
from telemetry.tests.loopback import FakeAgent, inventory_host, polled_agent, real_agent, sim_payload

pytestmark = pytest.mark.django_db


@pytest.fixture
def sent(monkeypatch):
    """The poll_batch messages poll_agents sends, as (args, options), instead of a broker."""
    messages = []

    def apply_async(args=None, kwargs=None, **options):
        # What would go over the wire must survive JSON (STYLE.md: never pickle).
        json.dumps({"args": args, "kwargs": kwargs})
        messages.append((args, options))

    monkeypatch.setattr(tasks.poll_batch, "apply_async", apply_async)
    return messages


def test_poll_agents_sends_one_batch_of_ids_per_batch_size(settings, sent, django_capture_on_commit_callbacks):
    settings.TELEMETRY_BATCH_SIZE = 2
    settings.TELEMETRY_POLL_INTERVAL_S = 10
    ids = [polled_agent(f"agent-{n}", f"http://127.0.0.1:{9000 + n}").pk for n in range(5)]

    with django_capture_on_commit_callbacks(execute=True):
        summary = tasks.poll_agents()

    assert summary == {"agents": 5, "batches": 3}
    assert [args for args, _ in sent] == [[ids[0:2]], [ids[2:4]], [ids[4:5]]]
    for _, options in sent:
        assert 0 < options["expires"] < 10, "a batch not started before the next tick is dropped"


def test_one_shard_sends_every_batch_to_the_default_queue(settings, sent, django_capture_on_commit_callbacks):
    """The setting's default: deployments from before shards keep their one queue."""
    settings.TELEMETRY_COLLECT_SHARDS = 1
    for n in range(3):
        polled_agent(f"agent-{n}", f"http://127.0.0.1:{9000 + n}")
    with django_capture_on_commit_callbacks(execute=True):
        tasks.poll_agents()
    assert [options.get("queue") for _, options in sent] == [None]


def test_sharded_collection_sends_each_agent_to_its_shards_queue_once(settings, sent,
                                                                      django_capture_on_commit_callbacks):
    settings.TELEMETRY_COLLECT_SHARDS = 3
    settings.TELEMETRY_BATCH_SIZE = 4
    settings.CELERY_TASK_DEFAULT_QUEUE = "studio"
    ids = [polled_agent(f"agent-{n}", f"http://127.0.0.1:{9000 + n}").pk for n in range(30)]

    with django_capture_on_commit_callbacks(execute=True):
        summary = tasks.poll_agents()

    queued: dict[str, list[int]] = {}
    for args, options in sent:
        assert len(args[0]) <= 4
        queued.setdefault(options["queue"], []).extend(args[0])
    assert sorted(agent for share in queued.values() for agent in share) == sorted(ids)
    assert set(queued) == {"studio.collect.0", "studio.collect.1", "studio.collect.2"}
    for queue, share in queued.items():
        assert {shards.shard_of(agent, 3) for agent in share} == {int(queue.rsplit(".", 1)[1])}
    assert summary == {"agents": 30, "batches": len(sent)}


def test_overlapping_poll_agents_runs_send_each_agent_once(sent, django_capture_on_commit_callbacks):
    for n in range(3):
        polled_agent(f"agent-{n}", f"http://127.0.0.1:{9000 + n}")
    with django_capture_on_commit_callbacks(execute=True):
        tasks.poll_agents()
        tasks.poll_agents()
    assert sum(len(args[0]) for args, _ in sent) == 3


def test_nothing_is_sent_before_the_claim_commits(sent, django_capture_on_commit_callbacks):
    polled_agent("agent", "http://127.0.0.1:9000")
    with django_capture_on_commit_callbacks(execute=False) as callbacks:
        tasks.poll_agents()
    assert sent == []
    assert len(callbacks) == 1


@pytest.fixture
def eager():
    celery_app.conf.task_always_eager = True
    yield
    celery_app.conf.task_always_eager = False


@pytest.mark.usefixtures("eager")
def test_poll_agents_eagerly_end_to_end(django_capture_on_commit_callbacks):
    """Through Celery's own call path (eager): claim, shard, poll, store, record."""
    host = inventory_host("eager", gpus=2, vgpus_per_gpu=1)
    agent = polled_agent("eager", "http://placeholder", host=host)
    with real_agent(host, agent.token) as server:
        Agent.objects.filter(pk=agent.pk).update(url=server.url)
        with django_capture_on_commit_callbacks(execute=True):
            tasks.poll_agents.delay()
    agent.refresh_from_db()
    assert agent.status == AgentStatus.OK
    assert GpuSample.objects.filter(gpu__host=host).count() == 2
    assert VgpuSample.objects.filter(gpu__host=host).count() == 2


def test_poll_batch_is_safe_to_run_twice():
    host = inventory_host("twice", gpus=2, vgpus_per_gpu=1)
    with FakeAgent("fixed", payload=sim_payload(host)) as fixed:
        agent = polled_agent("twice", fixed.url, host=host)
        first = tasks.poll_batch.run([agent.pk])
        again = tasks.poll_batch.run([agent.pk])
    assert (first["gpu_samples"], first["vgpu_samples"]) == (2, 2)
    assert (again["ok"], again["gpu_samples"], again["vgpu_samples"]) == (1, 0, 0)
    assert GpuSample.objects.count() == 2


def test_poll_batch_skips_agents_disabled_since_they_were_claimed():
    agent = polled_agent("switched-off", "http://127.0.0.1:9")
    Agent.objects.filter(pk=agent.pk).update(enabled=False)
    assert tasks.poll_batch.run([agent.pk])["polled"] == 0
    agent.refresh_from_db()
    assert agent.consecutive_failures == 0


def test_tasks_travel_as_json_keep_no_result_and_have_time_limits():
    for task in (tasks.poll_agents, tasks.poll_batch):
        assert task.ignore_result is True
        assert task.serializer == "json"
        assert 0 < task.soft_time_limit < task.time_limit
    assert celery_app.conf.accept_content == ["json"]
    assert "telemetry.tasks.poll_batch" in celery_app.tasks


# -- schedule ------------------------------------------------------------------------------------


def test_migrate_creates_the_poll_agents_schedule(settings):
    periodic = PeriodicTask.objects.get(name="poll_agents")
    assert periodic.task == "telemetry.tasks.poll_agents"
    assert periodic.task in celery_app.tasks
    assert periodic.enabled
    assert periodic.interval.period == IntervalSchedule.SECONDS
    assert periodic.interval.every == int(settings.TELEMETRY_POLL_INTERVAL_S)
    assert 0 < periodic.expire_seconds < periodic.interval.every


@pytest.mark.parametrize(("name", "every_s"), [("build_rollups", 60), ("prune_samples", 3600),
                                               ("create_sample_partitions", 3600)])
def test_migrate_schedules_rollups_and_retention(name, every_s):
    """Without these beat entries charts stay empty, raw samples grow without bound and, on
    PostgreSQL, every sample lands in the default partition that retention cannot drop."""
    periodic = PeriodicTask.objects.get(name=name)
    celery_app.loader.import_default_modules()  # what a worker loads as it starts (CELERY_IMPORTS)
    assert periodic.task in celery_app.tasks
    assert periodic.enabled
    assert periodic.interval.every == every_s
    assert 0 < periodic.expire_seconds < every_s


def test_a_schedule_an_admin_changed_survives_the_next_migrate():
    periodic = PeriodicTask.objects.get(name="poll_agents")
    periodic.interval = IntervalSchedule.objects.create(every=60, period=IntervalSchedule.SECONDS)
    periodic.enabled = False
    periodic.save()

    ensure_default_schedules()

    periodic.refresh_from_db()
    assert (periodic.interval.every, periodic.enabled) == (60, False)
    assert PeriodicTask.objects.filter(name="poll_agents").count() == 1


def test_ensure_periodic_task_creates_once_with_an_expiry_before_the_next_run():
    created_task, created = ensure_periodic_task("rollups-again", "telemetry.rollup_tasks.build_rollups", 60)
    again, created_again = ensure_periodic_task("rollups-again", "telemetry.rollup_tasks.build_rollups", 60)
    assert (created, created_again) == (True, False)
    assert again.pk == created_task.pk
    assert created_task.interval.every == 60
    assert created_task.expire_seconds == 54

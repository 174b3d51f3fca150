"""End to end with a REAL Celery worker process: poll_agents sent through the broker, polls over
loopback HTTP, samples in the test database.

The worker runs against the database this test run uses: the PostgreSQL test database when
DATABASE_URL points at PostgreSQL (CI), else the SQLite test database file. The broker is
Redis database 15 when REDIS_URL is set (CI sets it), else the embedded filesystem broker in
a temporary folder. A queue name unique to the test keeps it apart from any other worker on
the same broker.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import threading
import time
import uuid
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import quote, urlsplit, urlunsplit

import pytest
from celery import Celery
from django.conf import settings
from django.db import connection

from telemetry import shards
from telemetry.models import Agent, AgentStatus, GpuSample, VgpuSample
from telemetry.tests.loopback import closed_port_url, inventory_host, polled_agent, real_agent

BASE_DIR = Path(settings.BASE_DIR)
TEST_REDIS_DB = 15
START_TIMEOUT_S = 60
LAND_TIMEOUT_S = 60


def database_env() -> dict[str, str]:
    """Environment pointing a child process at the database of this test run."""
    db = connection.settings_dict
    if connection.vendor == "postgresql":
        auth = quote(db["USER"] or "", safe="")
        if db.get("PASSWORD"):
            auth += ":" + quote(db["PASSWORD"], safe="")
        netloc = f"{auth}@{db['HOST'] or '127.0.0.1'}:{db['PORT'] or 5432}"
        return {"DATABASE_URL": f"postgres://{netloc}/{quote(db['NAME'], safe='')}"}
    assert connection.vendor == "sqlite", connection.vendor
    return {"DATABASE_URL": "", "SQLITE_PATH": str(db["NAME"])}


def shared_broker(tmp_path: Path) -> tuple[dict[str, str], Celery]:
    """(environment of the worker, a Celery app of this process publishing to the same broker)."""
    if settings.REDIS_URL:
        parts = urlsplit(settings.REDIS_URL)
        url = urlunsplit((parts.scheme, parts.netloc, f"/{TEST_REDIS_DB}", "", ""))
        return {"CELERY_BROKER_URL": url}, Celery("publisher", broker=url)
    folder = tmp_path / "queue"
    options = {"data_folder_in": str(folder), "data_folder_out": str(folder),
               "control_folder": str(folder / "control"), "processed_folder": str(folder / "processed")}
    for path in options.values():
        Path(path).mkdir(parents=True, exist_ok=True)
    publisher = Celery("publisher", broker="filesystem://")
    publisher.conf.broker_transport_options = options
    return {"CELERY_BROKER_URL": "filesystem://", "CELERY_QUEUE_DIR": str(folder)}, publisher


class Worker:
    """A `celery worker` child process and its output."""

    def __init__(self, env: dict[str, str], queues: list[str] | None = None):
        """`queues`: those it consumes (`-Q`), else the default queue of `env`'s CELERY_QUEUE."""
        self.lines: list[str] = []
        self.ready = threading.Event()
        self.process = subprocess.Popen(
            [sys.executable, "-m", "celery", "-A", "config", "worker", "--loglevel", "INFO", "--pool", "threads",
             "--concurrency", "2", "--without-gossip", "--without-mingle", "--without-heartbeat",
             "--hostname", f"test-{uuid.uuid4().hex[:8]}@%h", *(["--queues", ",".join(queues)] if queues else [])],
            cwd=BASE_DIR, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
            text=True,
        )
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        for line in self.process.stdout:
            self.lines.append(line.rstrip())
            if " ready." in line:
                self.ready.set()

    @property
    def output(self) -> str:
        return "\n".join(self.lines[-60:])

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()


def worker_env(broker_env: dict[str, str], queue: str, **extra: str) -> dict[str, str]:
    """The environment of a worker of this test run: its database, the broker, the queue name."""
    return {**os.environ, **database_env(), **broker_env, "CELERY_QUEUE": queue, "PYTHONUNBUFFERED": "1",
            "TELEMETRY_POLL_INTERVAL_S": str(settings.TELEMETRY_POLL_INTERVAL_S), **extra}


def started(process: Worker) -> Worker:
    if not process.ready.wait(START_TIMEOUT_S):
        pytest.fail(f"the worker did not start within {START_TIMEOUT_S} s:\n{process.output}")
    return process


@pytest.fixture
def worker(tmp_path) -> Iterator[tuple[Worker, Celery, str]]:
    queue = f"test-worker-{uuid.uuid4().hex[:10]}"
    broker_env, publisher = shared_broker(tmp_path)
    process = Worker(worker_env(broker_env, queue))
    try:
        yield started(process), publisher, queue
    finally:
        # Before the database is flushed: the worker holds connections to it.
        process.stop()
        publisher.close()


def wait_for(condition, timeout_s: float) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(0.25)
    return condition()


# The worker is another process: what the test writes must be committed (transaction=True);
# serialized_rollback gives the catalog and the schedule, loaded at migrate, back afterwards.
@pytest.mark.django_db(transaction=True, serialized_rollback=True)
def test_a_real_worker_polls_the_agents_and_stores_their_samples(worker):
    process, publisher, queue = worker
    studio = inventory_host("studio-01", gpus=2, vgpus_per_gpu=2)
    render = inventory_host("render-01", gpus=1, vgpus_per_gpu=1)
    good = [polled_agent("studio-01", "http://placeholder", host=studio),
            polled_agent("render-01", "http://placeholder", host=render)]
    down = polled_agent("down-01", closed_port_url(), timeout_s=1)

    with real_agent(studio, good[0].token) as studio_agent, real_agent(render, good[1].token) as render_agent:
        Agent.objects.filter(pk=good[0].pk).update(url=studio_agent.url)
        Agent.objects.filter(pk=good[1].pk).update(url=render_agent.url)

        publisher.send_task("telemetry.tasks.poll_agents", queue=queue)

        def landed() -> bool:
            return (GpuSample.objects.count() == 3 and VgpuSample.objects.count() == 5
                    and Agent.objects.filter(pk=down.pk, consecutive_failures__gte=1).exists())

        assert wait_for(landed, LAND_TIMEOUT_S), f"samples did not land:\n{process.output}"

    assert GpuSample.objects.filter(gpu__host=studio).count() == 2
    assert VgpuSample.objects.filter(gpu__host=render).count() == 1
    statuses = dict(Agent.objects.values_list("name", "last_error"))
    assert {Agent.objects.get(name=name).status for name in ("studio-01", "render-01")} == {AgentStatus.OK}
    assert Agent.objects.get(pk=down.pk).status == AgentStatus.ERROR
    assert statuses["down-01"].startswith("connection refused"), statuses
    assert wait_for(lambda: "poll_batch: 3 agents, 2 ok, 1 failed" in process.output, 5), process.output


# -- collection split across queues (telemetry.shards) ---------------------------------------------


def agents_on_both_shards(per_shard: int = 2) -> list[Agent]:
    """Hosts with their agents (URLs set once served) until each of 2 shards has `per_shard`."""
    agents: list[Agent] = []
    while min(Counter(shards.shard_of(a.pk, 2) for a in agents).get(k, 0) for k in (0, 1)) < per_shard:
        n = len(agents)
        host = inventory_host(f"shard-host-{n:02d}", gpus=1 + n % 2, vgpus_per_gpu=1)
        agents.append(polled_agent(host.name, "http://placeholder", host=host))
        assert len(agents) < 20, "crc32 put 20 consecutive ids on one shard"
    return agents


def poll_once(publisher: Celery, queue: str, workers: list[Worker], servers: list, agents: list[Agent]) -> dict:
    """Send one poll_agents, wait until every agent's readings landed; what was stored."""
    expected_gpus = sum(agent.host.gpus.count() for agent in agents)
    publisher.send_task("telemetry.tasks.poll_agents", queue=queue)

    def landed() -> bool:
        return (GpuSample.objects.count() == expected_gpus
                and not Agent.objects.filter(last_seen__isnull=True).exists())

    output = "\n\n".join(process.output for process in workers)
    assert wait_for(landed, LAND_TIMEOUT_S), f"samples did not land:\n{output}"
    return {"gpu samples": GpuSample.objects.count(), "vGPU samples": VgpuSample.objects.count(),
            "polls served": sum(server.served for server in servers),
            "agents ok": sum(agent.status == AgentStatus.OK for agent in Agent.objects.all())}


@pytest.mark.django_db(transaction=True, serialized_rollback=True)
def test_two_workers_on_their_own_shard_queues_poll_each_agent_once_with_one_workers_totals(tmp_path):
    """Collection split over 2 shards, each consumed by its own worker process (as on two
    machines): every agent is polled once, by the worker of its shard, and the fleet's totals are
    those one worker with no shards stores."""
    queue = f"test-shards-{uuid.uuid4().hex[:10]}"
    broker_env, publisher = shared_broker(tmp_path)
    agents = agents_on_both_shards()
    share = {k: [a for a in agents if shards.shard_of(a.pk, 2) == k] for k in (0, 1)}
    processes: list[Worker] = []
    with contextlib.ExitStack() as stack:
        stack.callback(publisher.close)
        servers = [stack.enter_context(real_agent(agent.host, agent.token)) for agent in agents]
        for agent, server in zip(agents, servers, strict=True):
            Agent.objects.filter(pk=agent.pk).update(url=server.url)
        stack.callback(lambda: [process.stop() for process in processes])

        # One worker, one shard: the default queue, as before shards.
        processes.append(started(Worker(worker_env(broker_env, queue, TELEMETRY_COLLECT_SHARDS="1"))))
        one_worker = poll_once(publisher, queue, processes, servers, agents)
        processes.pop().stop()

        GpuSample.objects.all().delete()
        VgpuSample.objects.all().delete()
        Agent.objects.update(last_attempt=None, last_seen=None)
        for server in servers:
            server.served = 0

        # Two shards: the first worker takes beat's queue and shard 0, the second shard 1 only.
        env = worker_env(broker_env, queue, TELEMETRY_COLLECT_SHARDS="2")
        first = Worker(env, queues=[queue, shards.queue_name(queue, 0)])
        second = Worker(env, queues=[shards.queue_name(queue, 1)])
        processes += [first, second]
        started(first), started(second)
        two_workers = poll_once(publisher, queue, processes, servers, agents)

        assert two_workers == one_worker
        assert two_workers["polls served"] == len(agents)
        assert [server.served for server in servers] == [1] * len(agents)
        for process, k in ((first, 0), (second, 1)):
            line = f"poll_batch: {len(share[k])} agents, {len(share[k])} ok, 0 failed"
            assert wait_for(lambda process=process, line=line: line in process.output, 5), process.output

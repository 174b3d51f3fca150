"""Collection over real HTTP on loopback: one batch of good and broken agents, claims, limits."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import threading
import time
from datetime import timedelta
from pathlib import Path

import pytest
from django.db import connection
from django.utils import timezone

from fleet.models import Gpu, VirtualMachine
from telemetry import collect
from telemetry.fetch import ConnectionPool, tls_context
from telemetry.models import Agent, AgentKind, AgentStatus, GpuSample, VgpuSample
from telemetry.tests.loopback import (
    FakeAgent,
    closed_port_url,
    inventory_host,
    polled_agent,
    real_agent,
    sim_payload,
)

pytestmark = pytest.mark.django_db

DCGM_FIXTURE = Path(__file__).parent / "fixtures" / "dcgm-exporter" / "render-07-l40s.prom"


def samples_of(host):
    return (GpuSample.objects.filter(gpu__host=host).count(),
            VgpuSample.objects.filter(gpu__host=host).count())


def test_one_batch_stores_the_good_agents_and_gives_each_bad_one_its_own_error(settings):
    settings.TELEMETRY_MAX_RESPONSE_BYTES = 256 * 1024
    good_a = inventory_host("good-a", gpus=2, vgpus_per_gpu=2)
    good_b = inventory_host("good-b", gpus=3, vgpus_per_gpu=1)
    skewed = inventory_host("skewed", gpus=1, vgpus_per_gpu=2)
    agent_a = polled_agent("good-a", "http://placeholder", host=good_a)
    agent_b = polled_agent("good-b", "http://placeholder", host=good_b)
    wrong_token = polled_agent("wrong-token", "http://placeholder", host=good_a)

    with (
        real_agent(good_a, agent_a.token) as server_a,
        real_agent(good_b, agent_b.token) as server_b,
        real_agent(good_a, "not-the-token-we-hold") as server_other,
        FakeAgent("slow", payload=sim_payload(good_a), delay_s=3.0) as slow,
        FakeAgent("http500") as http500,
        FakeAgent("invalid_json") as invalid_json,
        FakeAgent("wrong_shape") as wrong_shape,
        FakeAgent("endless") as endless,
        FakeAgent("fixed", payload=sim_payload(skewed, collected_at=time.time() - 3600)) as clock_off,
    ):
        Agent.objects.filter(pk=agent_a.pk).update(url=server_a.url)
        Agent.objects.filter(pk=agent_b.pk).update(url=server_b.url + "/")
        Agent.objects.filter(pk=wrong_token.pk).update(url=server_other.url)
        bad = {
            polled_agent("slow", slow.url, timeout_s=0.5).pk: "within 0.5 s (timeout)",
            polled_agent("http500", http500.url).pk: "HTTP 500 Internal Server Error from",
            polled_agent("invalid-json", invalid_json.url).pk: "invalid payload from",
            polled_agent("wrong-shape", wrong_shape.url).pk: "payload.agent: required key missing",
            polled_agent("endless", endless.url).pk: "exceeds the limit of 262144 bytes",
            polled_agent("clock-off", clock_off.url, host=skewed).pk: "behind the server's clock",
            polled_agent("down", closed_port_url()).pk: "connection refused",
            wrong_token.pk: "HTTP 401 Unauthorized",
        }
        ids = [agent_a.pk, agent_b.pk, *bad]

        result = collect.poll_batch(ids, pool=ConnectionPool())

    assert samples_of(good_a) == (2, 4)
    assert samples_of(good_b) == (3, 3)
    assert samples_of(skewed) == (0, 0), "a refused report stores nothing, not even part of it"
    assert (result.polled, result.ok, result.failed) == (10, 2, 8)
    # Concurrent: the agents after the slow one in the batch were all asked before the collector
    # gave up on it at its timeout (when it hung up), not one after the other. How long such a
    # batch lasts is measured by bench/deadlines.py.
    [(_, slow_hung_up)] = slow.calls
    for other in (http500, invalid_json, wrong_shape, endless, clock_off):
        [(arrived, _)] = other.calls
        assert arrived < slow_hung_up, other.behaviour
    for agent in Agent.objects.filter(pk__in=[agent_a.pk, agent_b.pk]):
        assert agent.status == AgentStatus.OK
        assert (agent.last_error, agent.consecutive_failures) == ("", 0)
        assert abs(agent.clock_skew_s) < 1
    for agent in Agent.objects.filter(pk__in=bad):
        assert agent.status == AgentStatus.ERROR, agent.name
        assert bad[agent.pk] in agent.last_error, (agent.name, agent.last_error)
        assert agent.consecutive_failures == 1
        assert agent.last_seen is None
    assert "the agent refused our bearer token" in Agent.objects.get(name="wrong-token").last_error
    assert "check the clock of skewed" in Agent.objects.get(name="clock-off").last_error
    assert Agent.objects.get(name="clock-off").clock_skew_s == pytest.approx(-3600, abs=5)


def test_failures_count_up_until_the_agent_answers_again():
    host = inventory_host("flaky", gpus=1, vgpus_per_gpu=1)
    agent = polled_agent("flaky", closed_port_url(), host=host)

    collect.poll_batch([agent.pk])
    collect.poll_batch([agent.pk])
    agent.refresh_from_db()
    assert (agent.status, agent.consecutive_failures) == (AgentStatus.ERROR, 2)

    with real_agent(host, agent.token) as server:
        Agent.objects.filter(pk=agent.pk).update(url=server.url)
        collect.poll_batch([agent.pk])
    agent.refresh_from_db()
    assert (agent.status, agent.consecutive_failures) == (AgentStatus.OK, 0)
    assert agent.last_error.startswith("connection refused"), "the last error stays readable after recovery"
    assert samples_of(host) == (1, 1)


def test_a_batch_of_mixed_outcomes_records_each_agents_own_status(settings, django_assert_max_num_queries):
    settings.TELEMETRY_POLL_INTERVAL_S = 10
    fine, refused, down = (polled_agent(name, f"http://127.0.0.1:{9100 + n}")
                           for n, name in enumerate(("fine", "clock-off", "down")))
    Agent.objects.filter(pk=down.pk).update(clock_skew_s=0.25, consecutive_failures=2, last_error="earlier")
    claim = timezone.now() - timedelta(seconds=2)
    Agent.objects.filter(pk__in=[fine.pk, refused.pk]).update(last_attempt=claim)  # claimed by this beat
    agents = Agent.objects.in_bulk([fine.pk, refused.pk, down.pk])
    attempted = timezone.now()
    outcomes = [
        collect.PollOutcome(agent=agents[fine.pk], attempted_at=attempted, clock_skew_s=0.5),
        collect.PollOutcome(agent=agents[refused.pk], attempted_at=attempted, clock_skew_s=-3600.0,
                            error="report refused: stamped an hour behind"),
        collect.PollOutcome(agent=agents[down.pk], attempted_at=attempted, error="connection refused"),
    ]

    with django_assert_max_num_queries(1 if connection.vendor == "postgresql" else 10):
        collect.record_outcomes(outcomes)

    fine, refused, down = (Agent.objects.get(pk=agent.pk) for agent in (fine, refused, down))
    assert (fine.status, fine.consecutive_failures, fine.clock_skew_s, fine.last_error) == (AgentStatus.OK, 0, 0.5, "")
    assert fine.last_seen is not None
    assert fine.last_attempt == claim, "a claimed agent keeps its claim instant"
    assert (refused.status, refused.consecutive_failures, refused.clock_skew_s, refused.last_seen) == (
        AgentStatus.ERROR, 1, -3600.0, None)
    assert refused.last_error == "report refused: stamped an hour behind"
    assert (down.consecutive_failures, down.clock_skew_s, down.last_error) == (3, 0.25, "connection refused")
    assert down.last_attempt == attempted, "an agent polled without a claim gets the attempt's time"


@pytest.mark.parametrize("given", [True, False], ids=["a given pool", "the worker's own pool"])
def test_polls_reuse_one_keep_alive_connection(given):
    host = inventory_host("keepalive", gpus=1, vgpus_per_gpu=1)
    agent = polled_agent("keepalive", "http://placeholder", host=host)
    pool = ConnectionPool() if given else None
    with real_agent(host, agent.token) as server:
        Agent.objects.filter(pk=agent.pk).update(url=server.url)
        for _ in range(3):
            assert collect.poll_batch([agent.pk], pool=pool).ok == 1
        assert server.accepted == 1


def test_a_pooled_connection_the_agent_closed_is_replaced_transparently():
    host = inventory_host("restarted", gpus=1, vgpus_per_gpu=0)
    agent = polled_agent("restarted", "http://placeholder", host=host)
    pool = ConnectionPool()
    with real_agent(host, agent.token) as first:
        Agent.objects.filter(pk=agent.pk).update(url=first.url)
        assert collect.poll_batch([agent.pk], pool=pool).ok == 1
        port = first.server_address[1]
    # The agent restarted on the same port: the idle connection in the pool is dead.
    from telemetry.agent.server import AgentServer
    from telemetry.agent.sim_backend import SimBackend
    from telemetry.demo import host_scenario
    from telemetry.tests.loopback import serving

    with serving(AgentServer(("127.0.0.1", port), SimBackend(host_scenario(host)), agent.token, "restarted")):
        result = collect.poll_batch([agent.pk], pool=pool)
    assert (result.ok, result.errors) == (1, {})


def test_a_kept_alive_connection_the_agent_closes_as_it_is_reused_is_retried_once_on_a_new_one():
    host = inventory_host("closing", gpus=1, vgpus_per_gpu=1)
    pool = ConnectionPool()
    with FakeAgent("hangup_kept_alive", payload=sim_payload(host)) as closing:
        agent = polled_agent("closing", closing.url, host=host)
        first = collect.poll_batch([agent.pk], pool=pool)
        closing.payload = sim_payload(host, collected_at=time.time() + 1)
        second = collect.poll_batch([agent.pk], pool=pool)
    assert (first.ok, second.ok, second.errors) == (1, 1, {})
    assert closing.requests == 3, "answered, hung up on the kept-alive connection, answered on a new one"


def test_an_agent_sending_one_byte_at_a_time_is_cut_off_at_its_timeout():
    agent = None
    with FakeAgent("trickle") as trickle:
        agent = polled_agent("trickle", trickle.url, timeout_s=0.6)
        result = collect.poll_batch([agent.pk], pool=ConnectionPool())
    assert result.failed == 1
    assert "within 0.6 s (timeout)" in result.errors["trickle"]
    # The collector hung up while the agent was still trickling (it would send 100 bytes over
    # 10 s); how soon after the timeout is measured by bench/deadlines.py.
    assert trickle.bytes_sent < 100


def test_one_hanging_agent_holds_only_its_own_slot_of_the_batch(settings):
    # Two requests in flight at most: while the hanging agent holds one slot until its timeout,
    # the others go through the other one after the other.
    settings.TELEMETRY_POLL_CONCURRENCY = 2
    with contextlib.ExitStack() as stack:
        hanging = stack.enter_context(FakeAgent("slow", payload={}, delay_s=10.0))
        quick = [stack.enter_context(FakeAgent("http500")) for _ in range(4)]
        ids = [polled_agent("hanging", hanging.url, timeout_s=1.0).pk]
        ids += [polled_agent(f"quick-{n}", fake.url).pk for n, fake in enumerate(quick)]
        result = collect.poll_batch(ids, pool=ConnectionPool())
    assert "within 1 s (timeout)" in result.errors["hanging"]
    for n in range(4):
        assert result.errors[f"quick-{n}"].startswith("HTTP 500 Internal Server Error from"), "answered, not timed out"
    [(_, gave_up)] = hanging.calls
    for fake in quick:
        [(_, answered)] = fake.calls
        assert answered < gave_up, "the quick agents did not wait for the hanging one"


def test_an_agent_closing_a_new_connection_without_answering_is_asked_once():
    with FakeAgent("hangup") as hangup:
        agent = polled_agent("hangup", hangup.url)
        result = collect.poll_batch([agent.pk], pool=ConnectionPool())
    assert result.errors["hangup"] == f"{hangup.url}/v1/metrics closed the connection without answering"
    assert hangup.requests == 1, "only a kept-alive connection the agent closed is retried"


def test_a_chunked_body_is_read_in_full():
    host = inventory_host("chunked", gpus=2, vgpus_per_gpu=2)
    with FakeAgent("chunked", payload=sim_payload(host), chunk_bytes=700) as chunked:
        agent = polled_agent("chunked", chunked.url, host=host)
        result = collect.poll_batch([agent.pk], pool=ConnectionPool())
    assert (result.ok, result.errors) == (1, {})
    assert samples_of(host) == (2, 4)


def test_a_chunked_body_over_the_size_cap_is_cut_off(settings):
    host = inventory_host("chunked", gpus=2, vgpus_per_gpu=2)
    payload = sim_payload(host)
    settings.TELEMETRY_MAX_RESPONSE_BYTES = cap = len(json.dumps(payload)) // 2
    with FakeAgent("chunked", payload=payload, chunk_bytes=700) as chunked:
        agent = polled_agent("chunked", chunked.url, host=host)
        result = collect.poll_batch([agent.pk], pool=ConnectionPool())
    assert f"exceeds the limit of {cap} bytes (TELEMETRY_MAX_RESPONSE_BYTES); stopped reading" in result.errors[
        "chunked"]
    assert samples_of(host) == (0, 0)


@contextlib.contextmanager
def served_agent(name: str):
    """A host with one GPU and one vGPU, its agent row, and the real agent serving it (yields both)."""
    host = inventory_host(name, gpus=1, vgpus_per_gpu=1)
    agent = polled_agent(name, "http://placeholder", host=host)
    with real_agent(host, agent.token) as server:
        Agent.objects.filter(pk=agent.pk).update(url=server.url)
        yield agent, server


def test_a_forked_worker_polls_on_connections_of_its_own_and_the_parents_keep_working():
    with served_agent("forked") as (agent, server):
        assert collect.poll_batch([agent.pk]).ok == 1
        row = Agent.objects.get(pk=agent.pk)
        read_end, write_end = os.pipe()
        child = os.fork()
        if child == 0:  # a prefork worker's child: polls without the database, reports, exits
            try:
                [outcome] = collect.fetch_all([row])
                os.write(write_end, (outcome.error or "ok").encode())
            finally:
                os._exit(0)
        os.close(write_end)
        with os.fdopen(read_end, "rb") as pipe:
            said = pipe.read().decode()
        os.waitpid(child, 0)
        after = collect.poll_batch([agent.pk])
    assert said == "ok"
    assert (after.ok, after.errors) == (1, {})
    assert server.accepted == 2, "the parent's kept-alive connection, and the child's own"


def test_an_https_agent_is_polled_when_its_certificate_is_trusted_and_refused_when_not(tmp_path, monkeypatch):
    from identity.tests.slapd import _make_tls

    ca, certificate, key = _make_tls(tmp_path)
    host = inventory_host("tls", gpus=1, vgpus_per_gpu=1)
    with FakeAgent("fixed", payload=sim_payload(host), tls=(str(certificate), str(key))) as agent_tls:
        agent = polled_agent("tls", agent_tls.url, host=host)
        untrusted = collect.poll_batch([agent.pk], pool=ConnectionPool())
        monkeypatch.setenv("SSL_CERT_FILE", str(ca))  # the studio's CA in the system's store
        tls_context.cache_clear()  # as a worker started with it would load it
        try:
            trusted = collect.poll_batch([agent.pk], pool=ConnectionPool())
        finally:
            tls_context.cache_clear()
    assert untrusted.errors["tls"].startswith(f"TLS error talking to {agent_tls.url}/v1/metrics: ")
    assert "certificate verify failed" in untrusted.errors["tls"]
    assert (trusted.ok, trusted.errors) == (1, {})
    assert samples_of(host) == (1, 1)


class _TimeLimit(Exception):
    """What a task's soft time limit raises in the worker's main thread (Celery's SoftTimeLimitExceeded)."""


def test_a_batch_cut_short_by_the_tasks_time_limit_hangs_up_and_the_next_batch_polls_as_usual():
    pool = ConnectionPool()

    def time_limit(signum, frame):
        raise _TimeLimit

    previous = signal.signal(signal.SIGALRM, time_limit)
    try:
        with served_agent("after") as (agent, server), FakeAgent("slow", payload={}, delay_s=120.0) as slow:
            hanging = polled_agent("hanging", slow.url, timeout_s=60.0)
            signal.setitimer(signal.ITIMER_REAL, 0.5)
            with pytest.raises(_TimeLimit):
                collect.poll_batch([hanging.pk], pool=pool)
            signal.setitimer(signal.ITIMER_REAL, 0)
            result = collect.poll_batch([agent.pk], pool=pool)
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
    assert (result.ok, result.errors) == (1, {})
    # The fake agent saw the collector hang up (its call ended) long before the request's timeout.
    assert len(slow.calls) == 1, "the interrupted request was abandoned, not cancelled"


def test_reading_stops_at_the_size_cap(settings):
    settings.TELEMETRY_MAX_RESPONSE_BYTES = 100_000
    with FakeAgent("endless") as endless:
        polled_agent("endless", endless.url)
        result = collect.poll_batch(list(Agent.objects.values_list("pk", flat=True)), pool=ConnectionPool())
        time.sleep(0.2)
        sent = endless.bytes_sent
    assert "exceeds the limit of 100000 bytes (TELEMETRY_MAX_RESPONSE_BYTES); stopped reading" in result.errors[
        "endless"]
    # The agent could push far more (64 MiB); the collector hung up soon after the cap.
    assert sent < 16 * 1024 * 1024


def test_a_declared_oversize_body_is_refused_before_reading(settings):
    settings.TELEMETRY_MAX_RESPONSE_BYTES = 1000
    host = inventory_host("big", gpus=2, vgpus_per_gpu=2)
    with FakeAgent("fixed", payload=sim_payload(host)) as big:
        polled_agent("big", big.url, host=host)
        result = collect.poll_batch(list(Agent.objects.values_list("pk", flat=True)), pool=ConnectionPool())
    assert "bytes from http://127.0.0.1" in result.errors["big"]
    assert "exceeds the limit of 1000 bytes" in result.errors["big"]
    assert samples_of(host) == (0, 0)


def test_dcgm_exporter_agents_are_parsed_as_prometheus_text():
    host = inventory_host("render-07", gpus=0)
    with FakeAgent("text", body=DCGM_FIXTURE.read_bytes(), content_type="text/plain; version=0.0.4") as exporter:
        agent = polled_agent("render-07-dcgm", exporter.url + "/metrics", host=host, kind=AgentKind.DCGM_EXPORTER)
        result = collect.poll_batch([agent.pk], pool=ConnectionPool())
    agent.refresh_from_db()
    assert (result.ok, result.errors) == (1, {})
    assert agent.status == AgentStatus.OK
    gpus = Gpu.objects.filter(host=host)
    assert gpus.count() == 3, "the exporter's GPUs are discovered on the agent's host"
    sample = GpuSample.objects.get(gpu__uuid="GPU-2f6b0a3e-7c41-4d9a-b1e2-8f3c5d7a9b10")
    assert sample.sm_clock_mhz == 2235
    assert agent.clock_skew_s is None, "dcgm-exporter stamps nothing, so there is no clock to judge"


def test_the_same_poll_stored_twice_keeps_one_sample_per_gpu_and_vm():
    host = inventory_host("twice", gpus=2, vgpus_per_gpu=2)
    with FakeAgent("fixed", payload=sim_payload(host)) as fixed:
        agent = polled_agent("twice", fixed.url, host=host)
        first = collect.poll_batch([agent.pk], pool=ConnectionPool())
        second = collect.poll_batch([agent.pk], pool=ConnectionPool())
    assert (first.gpu_samples, first.vgpu_samples) == (2, 4)
    assert (second.ok, second.gpu_samples, second.vgpu_samples) == (1, 0, 0)
    assert samples_of(host) == (2, 4)


def test_samples_map_to_the_inventory_vms():
    host = inventory_host("mapped", gpus=1, vgpus_per_gpu=2)
    agent = polled_agent("mapped", "http://placeholder", host=host)
    with real_agent(host, agent.token) as server:
        Agent.objects.filter(pk=agent.pk).update(url=server.url)
        collect.poll_batch([agent.pk], pool=ConnectionPool())
    vms = set(VirtualMachine.objects.filter(host=host).values_list("pk", flat=True))
    assert set(VgpuSample.objects.values_list("vm_id", flat=True)) == vms
    assert all(sample.vgpu_id is not None for sample in VgpuSample.objects.all())


# -- claims and shards ------------------------------------------------------------------------


def test_claims_prevent_double_polls_within_an_interval(settings):
    settings.TELEMETRY_POLL_INTERVAL_S = 10
    polled = [polled_agent(f"agent-{n}", f"http://127.0.0.1:{9000 + n}") for n in range(5)]
    Agent.objects.create(name="disabled", url="http://127.0.0.1:1", enabled=False)
    Agent.objects.create(name="pushes", kind=AgentKind.NVIDIA_SMI)
    now = timezone.now()

    first = collect.claim_due_agents(now)
    overlapping = collect.claim_due_agents(now + timedelta(seconds=1))
    next_tick = collect.claim_due_agents(now + timedelta(seconds=10))

    assert first == [agent.pk for agent in polled]
    assert overlapping == [], "a second beat moments later polls nobody twice"
    assert next_tick == first


# Commits for real (threads need their own connections); serialized_rollback gives the catalog
# and the schedule, loaded at migrate, back to the tests after it.
@pytest.mark.django_db(transaction=True, serialized_rollback=True)
def test_concurrent_claims_split_the_agents_without_overlap():
    ids = {polled_agent(f"agent-{n}", f"http://127.0.0.1:{9000 + n}").pk for n in range(40)}
    results: list[list[int]] = []
    barrier = threading.Barrier(4)

    def claim():
        from django.db import connection

        barrier.wait()
        try:
            results.append(collect.claim_due_agents())
        finally:
            connection.close()

    threads = [threading.Thread(target=claim) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    claimed = [pk for result in results for pk in result]
    assert sorted(claimed) == sorted(ids), "every agent claimed exactly once"


def test_shards_respect_the_batch_size(settings):
    settings.TELEMETRY_BATCH_SIZE = 3
    assert collect.shard([1, 2, 3, 4, 5, 6, 7]) == [[1, 2, 3], [4, 5, 6], [7]]
    assert collect.shard([]) == []


@pytest.mark.parametrize(
    ("kind", "url", "polled"),
    [
        (AgentKind.NVML, "http://gpu-01:9410", "http://gpu-01:9410/v1/metrics"),
        (AgentKind.NVML, "http://gpu-01:9410/", "http://gpu-01:9410/v1/metrics"),
        (AgentKind.DCGM_EXPORTER, "http://gpu-01:9400", "http://gpu-01:9400/metrics"),
        (AgentKind.DCGM_EXPORTER, "http://gpu-01:9400/metrics", "http://gpu-01:9400/metrics"),
    ],
)
def test_metrics_url(kind, url, polled):
    assert collect.metrics_url(Agent(kind=kind, url=url)) == polled


# One bad report must not cost the batch ------------------------------------------------------------

# A database that refuses the rows of one GPU: a trigger raising as PostgreSQL or SQLite would for a
# value the column cannot hold, for the first `failures` inserts (all, by default). The trigger and
# its counter are the test transaction's and go with it.
_POISON_PG = """
CREATE SEQUENCE poison_seq;
CREATE FUNCTION poison_gpu() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
  IF NEW.gpu_id = {gpu_id} AND nextval('poison_seq') <= {failures} THEN
    RAISE EXCEPTION 'sample of GPU % refused', NEW.gpu_id USING ERRCODE = '{sqlstate}';
  END IF;
  RETURN NEW;
END $$;
CREATE TRIGGER poison_gpu BEFORE INSERT ON telemetry_gpusample FOR EACH ROW EXECUTE FUNCTION poison_gpu();
"""
_POISON_SQLITE = """
CREATE TRIGGER poison_gpu BEFORE INSERT ON telemetry_gpusample WHEN NEW.gpu_id = {gpu_id}
BEGIN SELECT RAISE(ABORT, 'sample refused'); END
"""
NUMERIC_VALUE_OUT_OF_RANGE = "22003"
DEADLOCK_DETECTED = "40P01"


def poison(gpu: Gpu, sqlstate: str = NUMERIC_VALUE_OUT_OF_RANGE, failures: int = 1_000_000) -> None:
    with connection.cursor() as cursor:
        if connection.vendor == "postgresql":
            cursor.execute(_POISON_PG.format(gpu_id=gpu.pk, failures=failures, sqlstate=sqlstate))
        else:
            cursor.execute(_POISON_SQLITE.format(gpu_id=gpu.pk))


@contextlib.contextmanager
def three_hosts_one_poisoned_agent(behaviour: str | None = None):
    """Hosts calm-a and calm-b served by real agents, and host poisoned's agent: real too, or a
    FakeAgent of `behaviour` (serving a body given by the caller). Yields (ids, hosts, agents)."""
    hosts = [inventory_host(name, gpus=2, vgpus_per_gpu=2) for name in ("calm-a", "calm-b", "poisoned")]
    agents = [polled_agent(host.name, "http://placeholder", host=host) for host in hosts]
    with contextlib.ExitStack() as stack:
        for host, agent in zip(hosts, agents, strict=True):
            server = stack.enter_context(real_agent(host, agent.token))
            Agent.objects.filter(pk=agent.pk).update(url=server.url)
        yield [agent.pk for agent in agents], hosts, agents


def test_a_report_the_database_refuses_costs_only_its_agent(caplog):
    with three_hosts_one_poisoned_agent() as (ids, (calm_a, calm_b, poisoned), _):
        poison(Gpu.objects.filter(host=poisoned).first())
        result = collect.poll_batch(ids, pool=ConnectionPool())

    assert samples_of(calm_a) == (2, 4)
    assert samples_of(calm_b) == (2, 4)
    assert samples_of(poisoned) == (0, 0)
    assert (result.polled, result.ok, result.failed) == (3, 2, 1)
    assert (result.gpu_samples, result.vgpu_samples) == (4, 8)
    bad = Agent.objects.get(name="poisoned")
    assert bad.status == AgentStatus.ERROR
    assert bad.last_error.startswith("samples could not be stored: ")
    assert "refused" in bad.last_error
    for agent in Agent.objects.filter(name__startswith="calm-"):
        assert (agent.status, agent.last_error) == (AgentStatus.OK, "")
    assert "storing them one by one" in caplog.text


@pytest.mark.skipif(connection.vendor != "postgresql", reason="a transient error raised by the database: PostgreSQL's")
@pytest.mark.django_db(transaction=True, serialized_rollback=True)
def test_a_transient_database_error_is_retried_and_nothing_is_lost():
    # Transactional: the retry closes the broken connection, as a worker's would be.
    with three_hosts_one_poisoned_agent() as (ids, hosts, _):
        # The first insert of the batch meets a deadlock: the store is tried again.
        poison(Gpu.objects.filter(host=hosts[2]).first(), DEADLOCK_DETECTED, failures=1)
        try:
            result = collect.poll_batch(ids, pool=ConnectionPool())
        finally:
            with connection.cursor() as cursor:
                cursor.execute("DROP TRIGGER poison_gpu ON telemetry_gpusample; DROP FUNCTION poison_gpu(); "
                               "DROP SEQUENCE poison_seq")

    assert (result.ok, result.failed) == (3, 0)
    assert [samples_of(host) for host in hosts] == [(2, 4)] * 3
    assert GpuSample.objects.count() == 6, "each sample once, though the batch was stored twice"


def test_a_body_that_crashes_the_parser_costs_only_its_agent(caplog):
    hosts = [inventory_host(name, gpus=2, vgpus_per_gpu=2) for name in ("calm-a", "calm-b")]
    agents = [polled_agent(host.name, "http://placeholder", host=host) for host in hosts]
    # Nested deeper than any parser's recursion: not a PayloadError the parser foresaw.
    deep = b"[" * 200_000 + b"]" * 200_000
    with contextlib.ExitStack() as stack:
        for host, agent in zip(hosts, agents, strict=True):
            server = stack.enter_context(real_agent(host, agent.token))
            Agent.objects.filter(pk=agent.pk).update(url=server.url)
        crash = stack.enter_context(FakeAgent("text", body=deep))
        crasher = polled_agent("crasher", crash.url)
        result = collect.poll_batch([agent.pk for agent in agents] + [crasher.pk], pool=ConnectionPool())

    assert [samples_of(host) for host in hosts] == [(2, 4)] * 2
    assert (result.ok, result.failed) == (2, 1)
    crasher.refresh_from_db()
    assert crasher.status == AgentStatus.ERROR
    assert crasher.last_error.startswith(f"cannot read the answer of {crash.url}/v1/metrics: RecursionError")
    assert "unexpected error parsing" in caplog.text

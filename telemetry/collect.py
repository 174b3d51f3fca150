"""Collection: which agents to poll now, and one batch of polls from request to stored samples.

The flow (DESIGN.md, "Data flow" 2; tasks in `telemetry.tasks`):

1. `claim_due_agents` picks the enabled polled agents (kinds nvml and dcgm-exporter) whose
   last attempt is older than most of a poll interval and claims them by a conditional
   UPDATE that stamps `last_attempt` with this run's unique instant: two overlapping beats
   (a second beat process, a manual run) each get only the agents their own UPDATE changed,
   so no agent is polled twice in one interval (healthchecks' `sendalerts` does the same).
2. `shard` cuts the claimed ids into batches of TELEMETRY_BATCH_SIZE; one `poll_batch` task each.
3. `poll_batch` fetches its agents concurrently on one asyncio event loop in the calling
   thread (`telemetry.fetch`: aiohttp, keep-alive connections kept for the worker's life),
   each within its own `timeout_s` and under TELEMETRY_MAX_RESPONSE_BYTES, parses each body
   as it arrives, then stores every good report with ONE `store_reports` call (one
   transaction). A failure belongs to its agent alone: its `last_error` says what went wrong,
   the others' samples are stored all the same.

Nothing here retries a failed poll: the next beat polls the agent again, and a sample is a
reading of an instant that a late retry could not take anyway. Only the store is retried,
on the database's transient errors (a lock timeout, a dropped connection), with jittered
backoff, because the readings in hand would otherwise be lost.
"""

from __future__ import annotations

import asyncio
import gc
import logging
import random
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta

import aiohttp
from django.conf import settings
from django.db import OperationalError, close_old_connections, connection, transaction
from django.db.models import Case, F, FloatField, Q, Value, When
from django.utils import timezone

from telemetry.fetch import ConnectionPool, FetchError, fetch
from telemetry.ingest import IngestStats, store_reports
from telemetry.models import Agent, AgentKind
from telemetry.payload import PayloadError, Report, parse_agent_payload
from telemetry.sources.dcgm import parse_dcgm_metrics

logger = logging.getLogger(__name__)

POLLED_KINDS = (AgentKind.NVML, AgentKind.DCGM_EXPORTER)
METRICS_PATH = "/v1/metrics"
# An agent is due again once this share of the poll interval has passed since its claim:
# beat's ticks jitter by a little, and a claim must not outlive the next tick.
CLAIM_FRACTION = 0.9
STORE_ATTEMPTS = 3


def poll_interval_s() -> float:
    return float(settings.TELEMETRY_POLL_INTERVAL_S)


def claim_due_agents(now: datetime | None = None) -> list[int]:
    """Claim the polled agents due now and return their ids, ascending.

    Two queries whatever the fleet's size: a conditional UPDATE stamping `last_attempt` with
    a value unique to this call, then a SELECT of the rows carrying that stamp. A concurrent
    claimer's UPDATE sees the stamp (recent) and skips those rows.
    """
    now = now or timezone.now()
    # Unique per call: microseconds plus a random offset, so two claims in the same
    # microsecond (two processes) still tell their rows apart.
    stamp = now.replace(microsecond=0) + timedelta(microseconds=random.randrange(1_000_000))
    due_before = now - timedelta(seconds=poll_interval_s() * CLAIM_FRACTION)
    with transaction.atomic():
        Agent.objects.filter(
            Q(last_attempt__isnull=True) | Q(last_attempt__lte=due_before),
            enabled=True, kind__in=POLLED_KINDS,
        ).update(last_attempt=stamp)
        return list(Agent.objects.filter(last_attempt=stamp).order_by("pk").values_list("pk", flat=True))


def shard(ids: Sequence[int], size: int | None = None) -> list[list[int]]:
    """`ids` in consecutive batches of at most `size` (TELEMETRY_BATCH_SIZE)."""
    size = max(1, size or settings.TELEMETRY_BATCH_SIZE)
    return [list(ids[start:start + size]) for start in range(0, len(ids), size)]


def metrics_url(agent: Agent) -> str:
    """The URL polled: the agent's base URL plus /v1/metrics, or dcgm-exporter's URL as given
    (its /metrics added when the admin gave only the base)."""
    base = agent.url.rstrip("/")
    if agent.kind == AgentKind.DCGM_EXPORTER:
        return base if base.split("://", 1)[-1].count("/") else base + "/metrics"
    return base if base.endswith(METRICS_PATH) else base + METRICS_PATH


@dataclass
class PollOutcome:
    """One agent's poll: a report to store, or the error its admin will read."""

    agent: Agent
    attempted_at: datetime
    report: Report | None = None
    error: str | None = None
    clock_skew_s: float | None = None


@dataclass
class BatchResult:
    """What a batch did; `errors` maps agent name to its message (the task logs them)."""

    polled: int = 0
    ok: int = 0
    failed: int = 0
    gpu_samples: int = 0
    vgpu_samples: int = 0
    errors: dict[str, str] = field(default_factory=dict)
    stats: IngestStats | None = None

    def as_dict(self) -> dict:
        return {"polled": self.polled, "ok": self.ok, "failed": self.failed, "gpu_samples": self.gpu_samples,
                "vgpu_samples": self.vgpu_samples, "errors": self.errors}


def parse_body(agent: Agent, body: bytes, received_at: float) -> Report:
    """The Report in an agent's body (PayloadError if it is not one), by the agent's kind.

    dcgm-exporter stamps nothing: its report is dated when its answer arrived, and named
    after the agent's host (its own Hostname label is a pod name under Kubernetes).
    """
    if agent.kind == AgentKind.DCGM_EXPORTER:
        hostname = agent.host.name if agent.host_id else ""
        return parse_dcgm_metrics(body, hostname=hostname, collected_at=received_at)
    return parse_agent_payload(body)


async def poll_one(agent: Agent, *, session: aiohttp.ClientSession, max_bytes: int) -> PollOutcome:
    """Fetch and parse one agent's metrics; never raises for the agent's own faults."""
    outcome = PollOutcome(agent=agent, attempted_at=timezone.now())
    url = metrics_url(agent)
    try:
        fetched = await fetch(session, url, token=agent.token, timeout_s=agent.timeout_s, max_bytes=max_bytes)
        outcome.report = parse_body(agent, fetched.body, fetched.received_at)
    except FetchError as exc:
        outcome.error = str(exc)
        return outcome
    except PayloadError as exc:
        outcome.error = f"invalid payload from {url}: {exc}"
        return outcome
    except Exception as exc:  # noqa: BLE001 - a parser bug must cost one agent, not the batch
        logger.exception("unexpected error parsing %s", url)
        outcome.error = f"cannot read the answer of {url}: {type(exc).__name__}: {exc}"
        return outcome
    if agent.kind != AgentKind.DCGM_EXPORTER:
        # The agent stamped collected_at while answering: compare with the middle of our request.
        midpoint = (fetched.sent_at + fetched.received_at) / 2
        outcome.clock_skew_s = round(outcome.report.collected_at - midpoint, 3)
    return outcome


def fetch_all(agents: Sequence[Agent], *, pool: ConnectionPool | None = None, max_bytes: int | None = None,
              concurrency: int | None = None) -> list[PollOutcome]:
    """Poll `agents` concurrently; one outcome per agent, in the order given.

    All of the batch runs on the event loop of `pool` (this process's, by default) in the
    calling thread: each body is parsed as it arrives, between the other agents' reads. At most
    `concurrency` (TELEMETRY_POLL_CONCURRENCY) requests are in flight; each ends at its agent's
    timeout, so one agent trickling bytes cannot stretch the batch.
    """
    if not agents:
        return []
    max_bytes = max_bytes or settings.TELEMETRY_MAX_RESPONSE_BYTES
    limit = max(1, concurrency or settings.TELEMETRY_POLL_CONCURRENCY)
    for agent in agents:
        if agent.kind == AgentKind.DCGM_EXPORTER and agent.host_id:
            agent.host  # noqa: B018 - loaded here: no query may run on the event loop (parse_body)
    pool = pool or ConnectionPool.current()
    return pool.run(_poll_all(agents, pool, max_bytes, limit))


async def _poll_all(agents: Sequence[Agent], pool: ConnectionPool, max_bytes: int, limit: int) -> list[PollOutcome]:
    session = pool.session
    semaphore = asyncio.Semaphore(limit)

    async def bounded(agent: Agent) -> PollOutcome:
        async with semaphore:
            return await poll_one(agent, session=session, max_bytes=max_bytes)

    return await asyncio.gather(*(bounded(agent) for agent in agents))


def _store(pairs: list[tuple[Agent, Report]]) -> IngestStats:
    """`store_reports` with retries on transient database errors (lock timeouts, lost connections)."""
    for attempt in range(1, STORE_ATTEMPTS + 1):
        try:
            return store_reports(pairs)
        except OperationalError:
            if attempt == STORE_ATTEMPTS:
                raise
            close_old_connections()
            time.sleep(0.2 * 2 ** attempt * random.uniform(0.5, 1.5))
    raise AssertionError("unreachable")


def store_outcomes(outcomes: list[PollOutcome], result: BatchResult) -> None:
    """Store every good report in one call; a report the store refuses becomes its agent's error."""
    good = [o for o in outcomes if o.report is not None and o.error is None]
    if not good:
        return
    try:
        stats = _store([(o.agent, o.report) for o in good])
    except OperationalError:
        raise
    except Exception:  # noqa: BLE001 - one poisoned report must not cost the batch its samples
        logger.exception("storing a batch of %d reports failed; storing them one by one", len(good))
        stats = None
        for outcome in good:
            try:
                item_stats = _store([(outcome.agent, outcome.report)])
            except OperationalError:
                raise
            except Exception as exc:  # noqa: BLE001
                outcome.error = f"samples could not be stored: {type(exc).__name__}: {exc}"
                continue
            _apply_refusals(item_stats, [outcome])
            _count(item_stats, result)
        result.stats = stats
        return
    _apply_refusals(stats, good)
    _count(stats, result)
    result.stats = stats


def _apply_refusals(stats: IngestStats, outcomes: Iterable[PollOutcome]) -> None:
    """Agents whose reports the ingest refused (clock far off) get its message as their error."""
    for outcome in outcomes:
        message = stats.errors.get(outcome.agent.pk)
        if message:
            outcome.error = message


def _count(stats: IngestStats, result: BatchResult) -> None:
    result.gpu_samples += stats.gpu_samples
    result.vgpu_samples += stats.vgpu_samples


def record_outcomes(outcomes: list[PollOutcome]) -> None:
    """Write each agent's collection status in one statement whatever the batch size (PostgreSQL;
    elsewhere a few), in a transaction that does not wait for the disk (synchronous_commit off).

    A success sets `last_seen`, clears the failure count and stores the clock skew; a failure
    keeps its message and counts one more. A claimed agent keeps its claim instant as
    `last_attempt`: moving it to now (a second later, through the broker) would make the next
    tick find it not yet due and skip a whole interval; agents polled without a claim (a manual
    poll_batch) get the attempt's time.
    """
    if not outcomes:
        return
    now = timezone.now()
    lease = timedelta(seconds=poll_interval_s() * CLAIM_FRACTION)
    unclaimed = {o.agent.pk for o in outcomes
                 if o.agent.last_attempt is None or o.agent.last_attempt < o.attempted_at - lease}
    attempted = min(o.attempted_at for o in outcomes)
    if connection.vendor == "postgresql":
        _record_outcomes_pg(outcomes, now, unclaimed, attempted)
        return
    succeeded = [o for o in outcomes if o.error is None]
    failed = []
    for outcome in outcomes:
        if outcome.error is None:
            continue
        agent = outcome.agent
        agent.last_error = outcome.error
        agent.last_error_at = now
        agent.consecutive_failures = F("consecutive_failures") + 1
        if outcome.clock_skew_s is not None:  # known when the store refused the stamp
            agent.clock_skew_s = outcome.clock_skew_s
        failed.append(agent)
    with transaction.atomic():
        if succeeded:
            skews = [When(pk=o.agent.pk, then=Value(o.clock_skew_s)) for o in succeeded
                     if o.clock_skew_s is not None]
            Agent.objects.filter(pk__in=[o.agent.pk for o in succeeded]).update(
                last_seen=now, consecutive_failures=0,
                clock_skew_s=Case(*skews, default=Value(None), output_field=FloatField()) if skews else None,
            )
        if failed:
            Agent.objects.bulk_update(failed, ["last_error", "last_error_at", "clock_skew_s", "consecutive_failures"])
        if unclaimed:
            Agent.objects.filter(pk__in=unclaimed).update(last_attempt=attempted)


def _record_outcomes_pg(outcomes: list[PollOutcome], now: datetime, unclaimed: set[int], attempted: datetime) -> None:
    """`record_outcomes` on PostgreSQL: one UPDATE joined to the outcomes passed as arrays, in its
    own transaction (autocommit) that does not wait for the disk: a crash may lose the last
    instant's statuses, which the next poll writes again; the samples' commit is not affected.
    The ORM's form (an UPDATE with a CASE of 50 branches, another for the claims, SET, BEGIN and
    COMMIT) cost a batch of 50 agents ~25 ms, mostly building the CASE."""
    ids, ok, skews, errors, claims = [], [], [], [], []
    for outcome in outcomes:
        ids.append(outcome.agent.pk)
        ok.append(outcome.error is None)
        skews.append(outcome.clock_skew_s)
        errors.append(outcome.error)
        claims.append(outcome.agent.pk in unclaimed)
    with connection.cursor() as cursor:
        # set_config(.., true) is SET LOCAL: for this statement's transaction only. In a CTE
        # (volatile, so evaluated once) because parameters allow one statement per execute.
        cursor.execute(
            "WITH async AS (SELECT set_config('synchronous_commit', 'off', true)) "
            f"UPDATE {Agent._meta.db_table} AS a SET "
            "last_seen = CASE WHEN o.ok THEN %s ELSE a.last_seen END, "
            "consecutive_failures = CASE WHEN o.ok THEN 0 ELSE a.consecutive_failures + 1 END, "
            # A failure's skew is known when the store refused the report's stamp; else the last one stays.
            "clock_skew_s = CASE WHEN o.ok OR o.skew IS NOT NULL THEN o.skew ELSE a.clock_skew_s END, "
            "last_error = CASE WHEN o.ok THEN a.last_error ELSE o.error END, "
            "last_error_at = CASE WHEN o.ok THEN a.last_error_at ELSE %s END, "
            "last_attempt = CASE WHEN o.unclaimed THEN %s ELSE a.last_attempt END "
            "FROM async, unnest(%s::bigint[], %s::boolean[], %s::float8[], %s::text[], %s::boolean[]) "
            "AS o(id, ok, skew, error, unclaimed) WHERE a.id = o.id",
            [now, now, attempted, ids, ok, skews, errors, claims])


#: The cyclic garbage collector's young-generation threshold in a process that collects.
GC_YOUNG_THRESHOLD = 20_000


def _raise_young_gc_threshold() -> None:
    """Collect the young generation less often in this process (once set, kept).

    A batch decodes ~1,500 containers per agent report (the JSON, then the readings) that all
    die with the batch: with Python's default threshold (700) the young generation was collected
    ~90 times a second and the middle one ~9 times, finding next to nothing, ~0.2 ms of CPU per
    poll (bench/ingest.py). Garbage in cycles is still collected, a little later.
    """
    young, middle, old = gc.get_threshold()
    if young < GC_YOUNG_THRESHOLD:
        gc.set_threshold(GC_YOUNG_THRESHOLD, middle, old)


def poll_batch(agent_ids: Sequence[int], *, pool: ConnectionPool | None = None) -> BatchResult:
    """Poll the given agents (those still enabled and polled), store their samples, record how
    each poll went. Safe to run twice: samples are unique per entity and instant."""
    _raise_young_gc_threshold()
    agents = list(
        Agent.objects.filter(pk__in=list(agent_ids), enabled=True, kind__in=POLLED_KINDS)
        .select_related("host").order_by("pk")
    )
    result = BatchResult(polled=len(agents))
    outcomes = fetch_all(agents, pool=pool)
    store_outcomes(outcomes, result)
    record_outcomes(outcomes)
    for outcome in outcomes:
        if outcome.error is None:
            result.ok += 1
        else:
            result.failed += 1
            result.errors[outcome.agent.name] = outcome.error
    return result

"""A worker killed with SIGKILL in the middle of storing a batch (its pool processes with it, as the
kernel's OOM killer or `docker kill` would).

The moment is made deterministic without a hook in the product: the test holds row locks on
the GPUs, so the worker's ingest, having already inserted the batch's samples in its
transaction, waits to lock the GPU rows it updates next (a changed scheduler reading).
PostgreSQL shows that wait in pg_stat_activity; the worker is killed then.

What must hold: the batch is stored entirely or not at all (one transaction per batch), the
next worker's polls store complete batches, and no sample is ever stored twice.
"""

from __future__ import annotations

import signal
import time
from datetime import UTC, datetime

import psycopg
import pytest
from django.db.models import Count

from faults.services import wait_for
from faults.world import assert_no_duplicates, build_world, start_collecting
from fleet.models import Gpu
from telemetry.models import GpuSample, VgpuSample

pytestmark = pytest.mark.faults


def assert_whole_batches() -> None:
    """Every host's poll stored all its GPUs' samples and every GPU sample its vGPU's (one each here)."""
    gpus_of = dict(Gpu.objects.values_list("host_id").annotate(n=Count("id")))
    per_poll = GpuSample.objects.values_list("gpu__host_id", "ts").annotate(n=Count("id"))
    partial = [(host, ts, n) for host, ts, n in per_poll if n != gpus_of[host]]
    assert not partial, f"polls stored in part: {partial}"
    assert GpuSample.objects.count() == VgpuSample.objects.count()


def test_a_worker_killed_mid_batch_leaves_no_partial_batch_and_the_next_one_stores_no_duplicate(stack):
    world = build_world()
    gpus = start_collecting(stack, world)
    worker = next(child for child in stack.children if child.name == "worker")

    with psycopg.connect(stack.database_url, autocommit=True) as admin:
        # The next ingest sees a changed scheduler reading and updates the GPU rows, after its samples.
        admin.execute("UPDATE fleet_gpu SET scheduler_reported = NULL")
        with psycopg.connect(stack.database_url) as holder:
            holder.execute("SELECT id FROM fleet_gpu FOR UPDATE")

            def ingest_waiting() -> list[int]:
                return [pid for (pid,) in admin.execute(
                    "SELECT pid FROM pg_stat_activity WHERE datname = current_database() "
                    "AND wait_event_type = 'Lock' AND (query ILIKE 'UPDATE %%fleet_gpu%%' "
                    "OR query ILIKE '%%FROM %%fleet_gpu%%FOR NO KEY UPDATE%%')")]

            assert wait_for(ingest_waiting, 30), f"no ingest reached the GPU update\n{stack.outputs()}"
            blocked = ingest_waiting()
            stored_before = GpuSample.objects.count()
            # Its transaction has written the samples (it holds the insert lock), not committed them.
            wrote_samples = admin.execute(
                "SELECT 1 FROM pg_locks l JOIN pg_class c ON c.oid = l.relation WHERE l.pid = ANY(%s) "
                "AND c.relname = 'telemetry_gpusample' AND l.mode = 'RowExclusiveLock' AND l.granted",
                [blocked]).fetchone()
            killed_at = datetime.now(tz=UTC)
            worker.kill_group(signal.SIGKILL)
            holder.rollback()
        # The dead client's sessions end and roll back once they look for its next command.
        assert wait_for(lambda: not admin.execute(
            "SELECT 1 FROM pg_stat_activity WHERE pid = ANY(%s)", [blocked]).fetchone(), 30)
    assert wrote_samples is not None
    assert GpuSample.objects.count() == stored_before
    assert_whole_batches()
    assert_no_duplicates()

    # A new worker: the claims of the killed polls lapse within an interval, and polling goes on.
    stack.start_worker()

    def polled_again() -> bool:
        return set(GpuSample.objects.filter(ts__gt=killed_at).values_list("gpu_id", flat=True).distinct()) == gpus

    assert wait_for(polled_again, 60), f"no poll stored after the kill\n{stack.outputs()}"
    time.sleep(2)
    assert_whole_batches()
    assert_no_duplicates()

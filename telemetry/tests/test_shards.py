"""Collection shards: each agent belongs to one shard, the same in every process, and the shards
share a fleet roughly evenly."""

from __future__ import annotations

import subprocess
import sys
from collections import Counter

import pytest

from telemetry import shards


def test_every_agent_has_exactly_one_shard_within_range():
    for count in (1, 2, 3, 8):
        split = shards.split(range(1, 2001), count)
        assert set(split) <= set(range(count))
        assert sorted(agent for share in split.values() for agent in share) == list(range(1, 2001))


def test_one_shard_takes_every_agent_in_the_order_given():
    assert shards.split([7, 3, 11], 1) == {0: [7, 3, 11]}


def test_the_shards_of_a_fleet_are_roughly_even():
    """10,000 agents over 2, 4 and 10 shards: every shard within 10% of an even share (as random, not round-robin)."""
    for count in (2, 4, 10):
        sizes = Counter(shards.shard_of(agent_id, count) for agent_id in range(1, 10_001))
        assert set(sizes) == set(range(count))
        even = 10_000 / count
        assert all(abs(size - even) < 0.10 * even for size in sizes.values()), sizes


def test_small_fleets_use_every_shard():
    """Consecutive ids, as a new fleet's agents get them, reach every shard early."""
    assert set(shards.split(range(1, 41), 4)) == {0, 1, 2, 3}


def test_an_agents_shard_is_the_same_in_another_process():
    """Not Python's hash(), which is salted per process: a worker must keep its agents."""
    ids = [1, 2, 17, 4242, 10**9]
    here = [shards.shard_of(agent_id, 3) for agent_id in ids]
    script = f"from telemetry import shards; print([shards.shard_of(i, 3) for i in {ids!r}])"
    there = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True,
                           env={"PYTHONHASHSEED": "random", "PATH": ""}, cwd=shards.__file__.rsplit("/", 2)[0])
    assert there.stdout.strip() == str(here)


def test_queue_names_follow_the_deployments_queue():
    assert shards.queue_names("fleet", 2) == ["fleet.collect.0", "fleet.collect.1"]
    assert shards.queue_name("celery", 3) == "celery.collect.3"


def test_no_shards_is_refused():
    with pytest.raises(ValueError, match="shards=0 must be 1 or more"):
        shards.shard_of(1, 0)

"""Collection shards: which worker queue polls which agent, so that workers on several machines
each take a share of the fleet (docs/operations.md, "Scaling out").

With TELEMETRY_COLLECT_SHARDS = N above 1, `poll_agents` sends the batches of shard k to the
queue `<CELERY_QUEUE>.collect.<k>`, and a worker started with `-Q <CELERY_QUEUE>.collect.<k>`
polls those agents only. An agent's shard is crc32 of its id modulo N: the same in every
process and every release (Python's `hash()` of a string changes with each interpreter start),
so a worker keeps polling the same agents from one tick to the next, and its connections and
copy of their inventory stay warm. With one shard nothing is routed: the batches go to the
default queue, as before shards existed.

Pure functions: no ORM, no settings.
"""

from __future__ import annotations

import zlib
from collections.abc import Iterable


def shard_of(agent_id: int, shards: int) -> int:
    """The shard (0 .. shards - 1) polling the agent with this id."""
    if shards < 1:
        raise ValueError(f"shards={shards} must be 1 or more")
    return zlib.crc32(str(agent_id).encode()) % shards


def split(agent_ids: Iterable[int], shards: int) -> dict[int, list[int]]:
    """The ids of each shard that has any, in the order given (shard -> ids), shards ascending."""
    by_shard: dict[int, list[int]] = {}
    for agent_id in agent_ids:
        by_shard.setdefault(shard_of(agent_id, shards), []).append(agent_id)
    return dict(sorted(by_shard.items()))


def queue_name(base_queue: str, shard: int) -> str:
    """The queue of one shard's poll batches: `<base_queue>.collect.<shard>`."""
    return f"{base_queue}.collect.{shard}"


def queue_names(base_queue: str, shards: int) -> list[str]:
    """Every shard's queue, shard 0 first (what the workers must consume between them)."""
    return [queue_name(base_queue, shard) for shard in range(shards)]

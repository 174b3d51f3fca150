"""The collector's copy of the inventory rows it maps reports onto, kept by each worker process
between batches and dropped as soon as any process changes the inventory.

Why: every batch of 50 agents names 400 GPUs, 1,600 VMs and their vGPUs. Reading them afresh
each batch was a third of the collector's time (bench/ingest.py), for rows that change a few
times a day while the samples arrive every few seconds.

How it stays right: every SQL write Django makes in any process bumps the written table's
version in the shared cache (`config.read_cache`: Redis in production, a folder shared by the
processes of the embedded mode), at the statement and again once its transaction commits.
Each batch first reads the versions of the inventory tables (`INVENTORY_TABLES`, one cache
round trip); if any differs from those the copy was filled under, the copy is dropped and the
batch reads the database, so an admin's change (a GPU moved, a VM renamed or placed, a vGPU
removed, a profile renamed) counts from the first batch after its commit, in every worker, as
it did when nothing was kept. Writes the ingest makes itself (a discovered GPU, a reported
device) bump the versions the same way.

Limits, as the read cache's: a change made outside Django (SQL by hand) is not seen, so the
copy is also dropped after TELEMETRY_INVENTORY_CACHE_MAX_AGE_S; with the read cache off
(READ_CACHE_ENABLED, CACHE_URL=none://) or unreachable, nothing is kept and every batch reads
the database. A process-local cache (locmem://, the tests) sees only its own process's writes,
which is right for one process only. The copy holds at most TELEMETRY_INVENTORY_CACHE_MAX_ROWS
rows (then it starts over), and a key the database did not have is kept as absent too, so an
unknown GPU or VM costs no query per batch until the inventory changes.
"""

from __future__ import annotations

import gc
import logging
import time
from collections.abc import Iterable

from django.conf import settings

from config import read_cache

logger = logging.getLogger(__name__)

#: The tables whose rows the copy holds (fleet's hosts, GPUs, models, VMs, vGPUs, profiles).
INVENTORY_TABLES = ("fleet_host", "fleet_gpu", "fleet_gpumodel", "fleet_virtualmachine", "fleet_vgpu",
                    "fleet_vgpuprofile")

#: Kept in a map for a key the database does not have.
ABSENT = None
#: How often a growing copy may be frozen out of the garbage collector's sight (`InventoryCache.grew`).
FREEZE_EVERY_S = 10.0


class InventoryCache:
    """Maps of inventory rows by lookup key, valid while `versions` are the tables' current ones.

    `gpus` by GPU UUID, `vms_by_uuid` by VM UUID, `vms_by_name` by VM name, `vgpus` by VM id (the
    declared vGPUs' rows, a tuple); a key mapped to ABSENT is known not to exist. The rows are
    the ingest's own slotted rows, shared by the batches of this process: never changed.
    """

    def __init__(self):
        self.versions: dict[str, str] | None = None
        self.filled_at = 0.0
        self.frozen_at = 0.0
        self.unfrozen = False  # rows were added since the last freeze
        self.gpus: dict = {}
        self.vms_by_uuid: dict = {}
        self.vms_by_name: dict = {}
        self.vgpus: dict = {}

    def clear(self) -> None:
        self.versions = None
        self.gpus, self.vms_by_uuid, self.vms_by_name, self.vgpus = {}, {}, {}, {}

    def rows(self) -> int:
        return len(self.gpus) + len(self.vms_by_uuid) + len(self.vms_by_name) + len(self.vgpus)

    def validate(self) -> bool:
        """Read the inventory tables' versions (once per batch) and drop the copy if any changed, it
        is too old or too large. False when the copy must not be used (read cache off or failing):
        the caller reads the database and keeps nothing."""
        if not read_cache.enabled():
            self.clear()
            return False
        try:
            if read_cache.pending_bumps():
                self.clear()
                return False
            current = read_cache.versions(INVENTORY_TABLES)
        except Exception as exc:  # noqa: BLE001 - an unreachable cache means reading the database
            read_cache.cache_failed(exc)
            self.clear()
            return False
        now = time.monotonic()
        if (current != self.versions or now - self.filled_at > settings.TELEMETRY_INVENTORY_CACHE_MAX_AGE_S
                or self.rows() > settings.TELEMETRY_INVENTORY_CACHE_MAX_ROWS):
            self.clear()
            self.versions = current
            self.filled_at = now
        else:
            self._freeze_when_due()
        return True

    def grew(self) -> None:
        """After rows were added: move the process's objects out of the cyclic garbage collector's
        sight (`gc.freeze`), at most every FREEZE_EVERY_S; rows added since the last freeze are
        frozen by the first batch after that interval, even if the copy grows no more (a worker's
        first pass over its agents fills it within seconds, then it stays as it is). The copy is
        hundreds of thousands of acyclic rows that every full collection would otherwise walk: over
        a tenth of the collector's CPU in bench/ingest.py while half of it was left unfrozen.
        They are still freed by reference counting when the copy is dropped."""
        self.unfrozen = True
        self._freeze_when_due()

    def _freeze_when_due(self) -> None:
        now = time.monotonic()
        if self.unfrozen and now - self.frozen_at >= FREEZE_EVERY_S:
            self.frozen_at = now
            self.unfrozen = False
            gc.collect(1)  # the young garbage is collected, not frozen
            gc.freeze()

    @staticmethod
    def missing(kept: dict, keys: Iterable) -> list:
        """The `keys` that `kept` has no entry for (neither a row nor ABSENT)."""
        return [key for key in keys if key not in kept]


#: This process's copy. A forked worker starts with its parent's, which the versions check
#: validates like any other.
CACHE = InventoryCache()

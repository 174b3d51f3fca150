"""Daily partitions of the raw sample tables on PostgreSQL.

Scheme (migration 0007 builds it): `telemetry_gpusample` and `telemetry_vgpusample` are
partitioned by range of `ts`, one partition per UTC day named `<table>_pYYYYMMDD`, plus a
DEFAULT partition `<table>_default`. The periodic task `create_sample_partitions` keeps
partitions TELEMETRY_PARTITION_DAYS_AHEAD days ahead of today, so ingest's COPY always finds
one; a sample whose day has no partition (beat stopped for longer than that, a clock far
off) lands in the DEFAULT partition instead of being refused, and the next run of the task
gives its day a partition and moves it there. Retention (`telemetry.retention`) drops a
partition once it is wholly older than its cutoff, and deletes expired rows of the DEFAULT
partition in batches.

Locks, because ingest writes all the time: a new partition is created as a plain table and
ATTACHed (which holds the parent in SHARE UPDATE EXCLUSIVE mode, so COPY goes on) rather than
created with PARTITION OF (ACCESS EXCLUSIVE on the parent). Dropping a partition needs ACCESS
EXCLUSIVE on the parent for an instant; it waits at most DROP_LOCK_TIMEOUT_MS behind a long
query and otherwise leaves the partition for the next run rather than queue ingest behind it.
(DETACH ... CONCURRENTLY would avoid that lock, but PostgreSQL refuses it while a DEFAULT
partition exists, and losing no late sample matters more to a studio than an instant's wait.)

On SQLite nothing here applies: the tables are plain and retention deletes in batches.
"""

from __future__ import annotations

import logging
import re
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

from django.conf import settings
from django.db import OperationalError, connection, transaction
from django.utils import timezone

from telemetry.models import GpuSample, VgpuSample

logger = logging.getLogger(__name__)

SAMPLE_MODELS = (GpuSample, VgpuSample)
DROP_LOCK_TIMEOUT_MS = 5000
DAY = timedelta(days=1)


@dataclass(frozen=True)
class Partition:
    """One day partition: rows with start <= ts < end."""

    name: str
    start: datetime

    @property
    def end(self) -> datetime:
        return self.start + DAY


def day_floor(moment: datetime) -> datetime:
    """Midnight UTC of the day `moment` falls in."""
    return moment.astimezone(UTC).replace(hour=0, minute=0, second=0, microsecond=0)


def partition_name(table: str, day: datetime) -> str:
    return f"{table}_p{day:%Y%m%d}"


def default_partition(table: str) -> str:
    return f"{table}_default"


def is_partitioned(table: str) -> bool:
    """Whether `table` is a partitioned table here (PostgreSQL after migration 0007)."""
    if connection.vendor != "postgresql":
        return False
    with connection.cursor() as cursor:
        cursor.execute("SELECT relkind FROM pg_class WHERE oid = to_regclass(%s)", [table])
        row = cursor.fetchone()
    return row is not None and row[0] == "p"


def partitions(table: str) -> list[Partition]:
    """The day partitions of `table`, oldest first (the DEFAULT partition is not among them)."""
    pattern = re.compile(rf"^{re.escape(table)}_p(\d{{8}})$")
    with connection.cursor() as cursor:
        cursor.execute("SELECT c.relname FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid "
                       "WHERE i.inhparent = to_regclass(%s)", [table])
        names = [name for (name,) in cursor.fetchall()]
    found = []
    for name in names:
        match = pattern.match(name)
        if match:
            found.append(Partition(name, datetime.strptime(match.group(1), "%Y%m%d").replace(tzinfo=UTC)))
    return sorted(found, key=lambda p: p.start)


def _literal(moment: datetime) -> str:
    return f"'{moment.astimezone(UTC).isoformat()}'::timestamptz"


def days_in_default(table: str) -> list[datetime]:
    """UTC days of the rows waiting in the DEFAULT partition (normally none)."""
    with connection.cursor() as cursor:
        cursor.execute(f"SELECT DISTINCT date_trunc('day', ts AT TIME ZONE 'UTC') FROM {default_partition(table)}")
        return sorted(day.replace(tzinfo=UTC) for (day,) in cursor.fetchall())


def create_partition(table: str, day: datetime) -> int:
    """Give `day` its partition of `table`, moving the day's rows out of the DEFAULT partition;
    return how many rows moved. One transaction: a failure leaves the rows where they were."""
    day = day_floor(day)
    name, default = partition_name(table, day), default_partition(table)
    start, end = _literal(day), _literal(day + DAY)
    with transaction.atomic(), connection.cursor() as cursor:
        # New rows of that day keep landing in DEFAULT until the ATTACH: hold them off meanwhile.
        cursor.execute(f"LOCK TABLE {default} IN SHARE ROW EXCLUSIVE MODE")
        cursor.execute(f"CREATE TABLE {name} (LIKE {table} INCLUDING DEFAULTS, "
                       f"CONSTRAINT {name}_range CHECK (ts >= {start} AND ts < {end}))")
        cursor.execute(f"WITH moved AS (DELETE FROM {default} WHERE ts >= {start} AND ts < {end} RETURNING *) "
                       f"INSERT INTO {name} SELECT * FROM moved")
        moved = cursor.rowcount
        cursor.execute(f"ALTER TABLE {table} ATTACH PARTITION {name} FOR VALUES FROM ({start}) TO ({end})")
        # The CHECK spared ATTACH a scan of the new table; the partition bound now says the same.
        cursor.execute(f"ALTER TABLE {name} DROP CONSTRAINT {name}_range")
    return moved


def ensure_partitions(now: datetime | None = None, days_ahead: int | None = None) -> dict[str, int]:
    """Create the missing day partitions: today to `days_ahead` days from now, and the days of
    rows waiting in the DEFAULT partition that retention would still keep. Safe to run twice.
    Returns {"<model>_partitions": created, "<model>_moved": rows moved out of DEFAULT} per
    sample model; empty where the tables are not partitioned (SQLite)."""
    now = now or timezone.now()
    days_ahead = settings.TELEMETRY_PARTITION_DAYS_AHEAD if days_ahead is None else days_ahead
    today = day_floor(now)
    kept_from = day_floor(now - timedelta(days=settings.TELEMETRY_RETENTION_RAW_DAYS))
    result: dict[str, int] = {}
    for model in SAMPLE_MODELS:
        table = model._meta.db_table
        if not is_partitioned(table):
            continue
        have = {p.start for p in partitions(table)}
        wanted = {today + DAY * n for n in range(days_ahead + 1)}
        wanted |= {day for day in days_in_default(table) if day >= kept_from}
        created = moved = 0
        for day in sorted(wanted - have):
            moved += create_partition(table, day)
            created += 1
        key = model._meta.model_name
        result[f"{key}_partitions"], result[f"{key}_moved"] = created, moved
        if created:
            logger.info("%s: %d day partition(s) created, %d row(s) moved out of the default one", table, created,
                        moved)
    return result


def drop_partitions_before(table: str, cutoff: datetime) -> int:
    """Drop the day partitions of `table` that end at or before `cutoff`; return how many went.
    A partition whose lock is not granted within DROP_LOCK_TIMEOUT_MS stays for the next run."""
    dropped = 0
    for partition in partitions(table):
        if partition.end > cutoff:
            break
        try:
            with transaction.atomic(), connection.cursor() as cursor:
                cursor.execute(f"SET LOCAL lock_timeout = {DROP_LOCK_TIMEOUT_MS}")
                cursor.execute(f"DROP TABLE {partition.name}")
        except OperationalError as exc:
            logger.warning("retention: %s not dropped this run (%s)", partition.name, exc)
            break
        dropped += 1
    return dropped


def delete_from_default(table: str, cutoff: datetime, batch_size: int, max_batches: int | None = None) -> int:
    """Delete the DEFAULT partition's rows stamped before `cutoff`, `batch_size` per statement
    (each its own transaction, like `retention.delete_in_batches`); return how many went."""
    default = default_partition(table)
    deleted = batches = 0
    while max_batches is None or batches < max_batches:
        with connection.cursor() as cursor:
            cursor.execute(f"DELETE FROM {default} WHERE ctid = ANY(ARRAY(SELECT ctid FROM {default} "
                           f"WHERE ts < %s LIMIT {int(batch_size)}))", [cutoff])
            count = cursor.rowcount
        deleted += count
        batches += 1
        if count < batch_size:
            break
    return deleted

"""CPU seconds of processes, read from /proc (Linux), for the benches that split a run's CPU by part.

CPU time, unlike wall-clock figures, is barely moved by other work on a shared machine, so
"milliseconds of CPU per operation, by part" is what compares code changes there.
"""

from __future__ import annotations

import os
import resource
from pathlib import Path

CLOCK_TICKS = os.sysconf("SC_CLK_TCK")


def process_cpu_s(pid: int, *, children: bool = False) -> float:
    """CPU seconds (user + system) of process `pid`, with its exited children's if `children`;
    0 if it is gone."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    ticks = int(fields[11]) + int(fields[12]) + (int(fields[13]) + int(fields[14]) if children else 0)
    return ticks / CLOCK_TICKS


def own_cpu_s() -> float:
    """CPU seconds of the calling process, all its threads."""
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def backend_pid(connection) -> int:
    """The PostgreSQL server process of a Django connection (opened if need be)."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_backend_pid()")
        return cursor.fetchone()[0]


#: PostgreSQL's long-lived background processes (`pg_stat_activity.backend_type`).
BACKGROUND = ("walwriter", "checkpointer", "background writer")


def postgres_background_pids(connection, kinds: tuple[str, ...] = BACKGROUND) -> list[int]:
    """PostgreSQL's background processes of `kinds` (by default the WAL writer, checkpointer and
    background writer): the share of the server's work that no session's figure counts."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT pid FROM pg_stat_activity WHERE backend_type = ANY(%s)", [list(kinds)])
        return [row[0] for row in cursor.fetchall()]

"""Two writers forced into the interleaving where the order of their row locks decides everything.

`first_then_second(first, second)` runs each call in its own thread, with its own database
connection (Django's are per thread). The first runs until it holds its first row lock: on
PostgreSQL once its first SELECT ... FOR [NO KEY] UPDATE has returned, on SQLite once it runs
a statement inside a transaction (IMMEDIATE transactions hold the database's write lock from
BEGIN). There it pauses, and the second starts. The first goes on once the second is stuck
behind a lock (PostgreSQL: pg_locks shows it waiting), has finished, or, on SQLite, where a
writer waiting at BEGIN cannot be seen, after RENDEZVOUS_S (as in test_concurrency.py).

So the second always reads the fleet while the first is half-way through its change. Writers
that lock in one order make the second wait at its first lock until the first commits, then
see what it wrote; writers that do not can each hold what the other needs next, which
PostgreSQL ends by aborting one ("deadlock detected", a 503 through the pages and the API).
"""

from __future__ import annotations

import re
import threading
import time

from django.db import connection

RENDEZVOUS_S = 1.0
#: Upper bound of the first writer's pause on PostgreSQL; the second is normally seen waiting in
#: milliseconds, so only a writer that never takes a lock reaches it.
STUCK_WAIT_S = 20.0
TAKES_ROW_LOCK = re.compile(r"\bFOR (NO KEY )?UPDATE\b")


def outcome_of(call) -> object:
    """What `call` returns, or the exception it raises (handed to the test, which decides)."""
    try:
        return call()
    except Exception as exc:  # noqa: BLE001 - any failure is an outcome the test asserts on
        return exc


def first_then_second(first, second) -> list[object]:
    """Run the two calls as the module docstring says; returns each one's result or exception."""
    first_holds, second_ready, second_done = threading.Event(), threading.Event(), threading.Event()
    second_pid: list[int] = []
    outcomes: list[object] = [None, None]

    def second_is_waiting() -> bool:
        if not second_pid:
            return False
        with connection.cursor() as cursor:
            cursor.execute("SELECT count(*) FROM pg_locks WHERE pid = %s AND NOT granted", [second_pid[0]])
            return cursor.fetchone()[0] > 0

    def let_the_second_in() -> None:
        first_holds.set()
        second_ready.wait(timeout=STUCK_WAIT_S)
        if connection.vendor != "postgresql":
            second_done.wait(timeout=RENDEZVOUS_S)
            return
        deadline = time.monotonic() + STUCK_WAIT_S
        while not second_done.is_set() and not second_is_waiting() and time.monotonic() < deadline:
            time.sleep(0.005)

    def pause_after_first_lock(execute, sql, params, many, context):
        result = execute(sql, params, many, context)
        holds = TAKES_ROW_LOCK.search(sql) if connection.vendor == "postgresql" else connection.in_atomic_block
        if holds and not first_holds.is_set():
            let_the_second_in()
        return result

    def run_first() -> None:
        with connection.execute_wrapper(pause_after_first_lock):
            outcomes[0] = outcome_of(first)
        first_holds.set()
        connection.close()

    def start_second():
        connection.ensure_connection()
        if connection.vendor == "postgresql":
            second_pid.append(connection.connection.info.backend_pid)
        second_ready.set()
        return second()

    def run_second() -> None:
        first_holds.wait(timeout=STUCK_WAIT_S)
        outcomes[1] = outcome_of(start_second)
        second_ready.set()
        second_done.set()
        connection.close()

    run_in_threads(run_first, run_second)
    return outcomes


def run_in_threads(*targets) -> None:
    """Run each target in its own thread and wait for all of them; a thread still running after
    a minute fails the test (a writer hung)."""
    threads = [threading.Thread(target=target) for target in targets]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    assert not any(thread.is_alive() for thread in threads), "a racing writer hung"


def record_locks(monkeypatch) -> list[tuple[type, list[int]]]:
    """Every call of `fleet.locks.lock_rows` from now on, as (model, ids locked), in call order."""
    from fleet import locks

    calls: list[tuple[type, list[int]]] = []
    real = locks.lock_rows

    def recording(queryset):
        rows = real(queryset)
        calls.append((queryset.model, [row.pk for row in rows]))
        return rows

    monkeypatch.setattr(locks, "lock_rows", recording)
    return calls


def assert_lock_order(calls: list[tuple[type, list[int]]]) -> None:
    """Each newly locked row comes in `fleet.locks`' order: never a row of an earlier group, nor
    a lower id of the same fleet group, than one already held (re-locking a held row is free)."""
    from fleet import locks

    rank = {model: index for index, (_, model, _, _) in enumerate(locks.ORDER)}
    held: set[tuple[type, int]] = set()
    top = -1
    for model, ids in calls:
        new = sorted(pk for pk in ids if (model, pk) not in held)
        if not new:
            continue
        group = rank.get(model, len(rank))
        assert group >= top, f"{model.__name__} {new} locked after a later group: {calls}"
        same = [pk for each, pk in held if each is model]
        assert group == len(rank) or not same or new[0] > max(same), f"{model.__name__} {new} after {same}: {calls}"
        top = group
        held |= {(model, pk) for pk in new}

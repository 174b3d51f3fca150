"""Private services for the fault tests: a Redis server, a PostgreSQL cluster and child processes
(Celery worker and beat, gunicorn, simulated agents) that the tests start, break and restart.

Every service runs on a free port in a temporary folder, so stopping it cannot disturb the
PostgreSQL and Redis that other test runs share. A missing binary skips the test with the
reason, unless REQUIRE_SERVICES=1 (CI), where it fails instead.
"""

from __future__ import annotations

import glob
import importlib
import os
import random
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from types import ModuleType
from typing import NoReturn

import pytest

BASE_DIR = Path(__file__).resolve().parent.parent
START_TIMEOUT_S = 60


def missing_service(message: str) -> NoReturn:
    """Skip the test with `message`, or fail it under REQUIRE_SERVICES=1 (CI), where every service
    the tests start must be installed."""
    if os.environ.get("REQUIRE_SERVICES") == "1":
        pytest.fail(message + " (REQUIRE_SERVICES=1)")
    pytest.skip(message, allow_module_level=True)


def require_binary(name: str, candidates: list[str] | None = None, *, purpose: str = "") -> str:
    """The path of `name` (on PATH or among `candidates`); skip, or fail under REQUIRE_SERVICES=1."""
    found = shutil.which(name) or next((c for c in candidates or [] if os.access(c, os.X_OK)), None)
    if found:
        return found
    missing_service(f"{name} is not installed; "
                    + (purpose or f"the fault tests start their own private {name.split('-')[0]} server"))


def require_module(name: str, *, purpose: str) -> ModuleType:
    """The Python module `name` (an optional dependency); skip, or fail under REQUIRE_SERVICES=1."""
    try:
        return importlib.import_module(name)
    except ImportError as exc:
        missing_service(f"the Python module {name} is not installed ({exc}); {purpose}")


def postgres_binary(name: str) -> str:
    """initdb / pg_ctl: on PATH, else in the newest /usr/lib/postgresql/<version>/bin (Debian, Ubuntu)."""
    versions = sorted(glob.glob("/usr/lib/postgresql/*/bin"), key=lambda p: int(Path(p).parent.name or 0))
    return require_binary(name, [str(Path(v) / name) for v in reversed(versions)])


def _bindable(port: int) -> bool:
    with socket.socket() as sock:
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
        return True


def _ephemeral_start() -> int:
    try:
        return int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


def _port_range() -> tuple[int, int]:
    """[low, high) of the ports this process may take: below the ephemeral range, and under
    pytest-xdist a slice of its own for each worker (gw0, gw1, ...), so that two workers never
    pick the same port between probing it and binding it."""
    low, high = 20000, _ephemeral_start()
    worker = os.environ.get("PYTEST_XDIST_WORKER", "")
    workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "0") or 0)
    if worker.startswith("gw") and worker[2:].isdigit() and workers > 1:
        size = (high - low) // workers
        low += int(worker[2:]) % workers * size
        high = low + size
    return low, high


def free_ports(count: int = 1) -> int:
    """The first of `count` consecutive free ports below the ephemeral range, so that no outgoing
    connection takes one meanwhile: a service restarted on its port finds it free again."""
    low, top = _port_range()
    rng = random.Random()
    for _ in range(200):
        first = rng.randrange(low, top - count)
        if all(_bindable(first + i) for i in range(count)):
            return first
    raise RuntimeError("no free port found")


def free_port() -> int:
    return free_ports(1)


def port_open(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=0.5):
            return True
    except OSError:
        return False


def wait_for(condition: Callable[[], bool], timeout_s: float, interval_s: float = 0.25) -> bool:
    """Poll `condition` until it holds or `timeout_s` passes; its last answer."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(interval_s)
    return condition()


class Child:
    """A child process in its own process group, its output kept for assertions and failure messages."""

    def __init__(self, name: str, argv: list[str], env: dict[str, str], ready_marker: str | None = None):
        self.name, self.argv, self.env = name, argv, env
        self.lines: list[str] = []
        self.ready = threading.Event()
        self.ready_marker = ready_marker
        self.process = subprocess.Popen(
            argv, cwd=BASE_DIR, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
            text=True, start_new_session=True,
        )
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        for line in self.process.stdout:
            self.lines.append(line.rstrip())
            if self.ready_marker and self.ready_marker in line:
                self.ready.set()

    def wait_ready(self, timeout_s: float = START_TIMEOUT_S) -> None:
        if not self.ready.wait(timeout_s):
            pytest.fail(f"{self.name} did not start within {timeout_s} s:\n{self.output}")

    def count(self, text: str) -> int:
        return sum(text in line for line in list(self.lines))

    @property
    def output(self) -> str:
        return "\n".join(self.lines[-80:])

    @property
    def alive(self) -> bool:
        return self.process.poll() is None

    def kill_group(self, sig: int = signal.SIGKILL) -> None:
        """Signal the whole process group (a prefork worker's pool children too), as `docker kill` does."""
        try:
            os.killpg(self.process.pid, sig)
        except ProcessLookupError:
            return
        self.process.wait(timeout=30)

    def stop(self) -> None:
        if not self.alive:
            return
        try:
            os.killpg(self.process.pid, signal.SIGTERM)
        except ProcessLookupError:
            return
        try:
            self.process.wait(timeout=20)
        except subprocess.TimeoutExpired:
            self.kill_group(signal.SIGKILL)


class RedisServer:
    """redis-server on a free port without persistence: a restart loses the queue, as an unsaved broker would."""

    def __init__(self, folder: Path):
        self.binary = require_binary("redis-server")
        self.folder = folder
        self.port = free_port()
        self.process: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> None:
        self.process = subprocess.Popen(
            [self.binary, "--port", str(self.port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
             "--dir", str(self.folder), "--protected-mode", "no"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True,
        )
        if not wait_for(lambda: port_open(self.port), 20, 0.05):
            pytest.fail(f"redis-server did not open port {self.port}")

    def stop(self) -> None:
        if self.process and self.process.poll() is None:
            self.process.terminate()
            self.process.wait(timeout=20)
        assert wait_for(lambda: not port_open(self.port), 10, 0.05)


class PostgresCluster:
    """A PostgreSQL cluster of its own (initdb, pg_ctl) in a temporary folder, trust auth on 127.0.0.1.

    PostgreSQL refuses to run as root: under root (a container), the cluster belongs to the
    `postgres` account, else `nobody`, and its folder is made theirs.
    """

    def __init__(self):
        self.initdb = postgres_binary("initdb")
        self.pg_ctl = postgres_binary("pg_ctl")
        self.folder = Path(tempfile.mkdtemp(prefix="faults-pg-"))
        self.data = self.folder / "data"
        self.port = free_port()
        self.user: str | None = None
        if os.geteuid() == 0:
            import pwd

            for name in ("postgres", "nobody"):
                try:
                    account = pwd.getpwnam(name)
                except KeyError:
                    continue
                self.user = name
                os.chown(self.folder, account.pw_uid, account.pw_gid)
                break

    def _run(self, argv: list[str]) -> None:
        done = subprocess.run(argv, capture_output=True, text=True, user=self.user, cwd=self.folder)
        if done.returncode:
            raise RuntimeError(f"{' '.join(argv)} failed: {done.stdout}{done.stderr}")

    def url(self, database: str) -> str:
        return f"postgres://postgres@127.0.0.1:{self.port}/{database}"

    def init(self) -> None:
        self._run([self.initdb, "-D", str(self.data), "-U", "postgres", "--auth=trust", "--no-sync",
                   "-E", "UTF8", "--locale=C"])

    def start(self) -> None:
        options = (f"-p {self.port} -c listen_addresses=127.0.0.1 -k {self.folder} -c fsync=off "
                   "-c full_page_writes=off -c synchronous_commit=off")
        self._run([self.pg_ctl, "-D", str(self.data), "-o", options, "-l", str(self.folder / "log"),
                   "-w", "-t", "60", "start"])

    def stop(self) -> None:
        """A fast shutdown: open sessions are ended, as on a restart by the admin or an upgrade."""
        self._run([self.pg_ctl, "-D", str(self.data), "-m", "fast", "-w", "-t", "60", "stop"])

    def ensure_running(self) -> None:
        """Start the cluster unless it runs: a test that failed during an outage must not break the next."""
        status = subprocess.run([self.pg_ctl, "-D", str(self.data), "status"], capture_output=True, user=self.user,
                                cwd=self.folder)
        if status.returncode != 0:
            self.start()

    def remove(self) -> None:
        shutil.rmtree(self.folder, ignore_errors=True)

    def sql(self, statement: str, database: str = "postgres") -> None:
        import psycopg

        with psycopg.connect(self.url(database), autocommit=True) as conn:
            conn.execute(statement)


def child_env(**overrides: str) -> dict[str, str]:
    """The environment of a child of the dashboard: production-like (DEBUG off), unbuffered output."""
    own = ("DATABASE_URL", "REDIS_URL", "CELERY_BROKER_URL", "SECRET_KEY", "AGENT_TOKEN_KEY", "POSTGRES_PASSWORD")
    # The run's own services and secrets stay out, whether given as NAME or as NAME_FILE.
    env = {key: value for key, value in os.environ.items()
           if key.removesuffix("_FILE") not in own and key not in ("SQLITE_PATH", "CELERY_QUEUE_DIR", "CELERY_QUEUE")}
    env.update(PYTHONUNBUFFERED="1", DEBUG="false", ALLOWED_HOSTS="127.0.0.1,localhost", LOG_LEVEL="INFO")
    env.update(overrides)
    return env


def python() -> str:
    return sys.executable

"""`manage.py runfleet`: the whole embedded product in one terminal.

Starts the simulated agents listed by `demo_agents` (one process serving every host's agent
on its own port, `telemetry.agent.simfleet`), a Celery worker, Celery beat and the development
web server as child processes, prints their output line by line with a name prefix, and stops
them all on Ctrl-C or SIGTERM, or as soon as one of them exits (a fleet with a dead worker
would look alive while collecting nothing).

Each child runs in its own session (process group), so Ctrl-C reaches this launcher only and
every child gets exactly one SIGTERM from it: Celery's worker takes a second signal as "cold
shutdown", and runserver's autoreloader has a child of its own that the group signal reaches.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError

from config.celery import ensure_broker_folders
from telemetry import demo

STOP_GRACE_S = 10.0
COLOURS = ("36", "33", "35", "32", "34", "31", "96", "93")


@dataclass
class Child:
    name: str
    argv: list[str]
    process: subprocess.Popen | None = None
    reader: threading.Thread | None = field(default=None, repr=False)


class Command(BaseCommand):
    help = (
        "Run the embedded fleet: the simulated agents written by demo_agents (one process, a port per host), "
        "a Celery worker (thread pool), Celery beat (schedule in the database) and the development web server; "
        "output prefixed by process; Ctrl-C stops them all."
    )

    def add_arguments(self, parser):
        parser.add_argument("addrport", nargs="?", default="127.0.0.1:8000",
                            help="web server address (default 127.0.0.1:8000)")
        parser.add_argument("--agents-dir", default=str(demo.DEFAULT_DIR),
                            help="folder of demo_agents' manifest (default var/agents)")
        parser.add_argument("--no-agents", action="store_true", help="do not start the simulated agents")
        parser.add_argument("--concurrency", type=int, default=2,
                            help="worker threads (default 2: each fetches its batches on an event loop of its own)")
        parser.add_argument("--noreload", action="store_true", help="run the web server without the autoreloader")

    def handle(self, *args, **options):
        ensure_broker_folders()
        children = self.plan(options)
        self._lock = threading.Lock()
        self._colour = self.stdout.isatty()
        self._width = max(len(child.name) for child in children)
        stop = threading.Event()
        received: list[int] = []

        def on_signal(signum, frame):
            received.append(signum)
            stop.set()

        previous = {sig: signal.signal(sig, on_signal) for sig in (signal.SIGINT, signal.SIGTERM)}
        failed: Child | None = None
        try:
            for index, child in enumerate(children):
                self.start(child, COLOURS[index % len(COLOURS)])
            self.say("runfleet", f"started {len(children)} processes; Ctrl-C stops them all")
            while not stop.is_set():
                failed = next((c for c in children if c.process.poll() is not None), None)
                if failed is not None:
                    break
                stop.wait(0.3)
        finally:
            if failed is not None:
                self.say("runfleet", f"{failed.name} exited with status {failed.process.returncode}; "
                                     f"stopping the others")
            elif received:
                self.say("runfleet", f"{signal.Signals(received[0]).name} received; stopping")
            self.stop_all(children)
            for sig, handler in previous.items():
                signal.signal(sig, handler)
        if failed is not None:
            raise CommandError(f"{failed.name} exited with status {failed.process.returncode}")

    def plan(self, options) -> list[Child]:
        """The children to start, agents first so the first poll finds them listening."""
        python = sys.executable
        manage = str(Path(settings.BASE_DIR) / "manage.py")
        children = []
        if not options["no_agents"]:
            agents = demo.read_manifest(Path(options["agents_dir"]))
            if not agents:
                raise CommandError(f"no simulated agents in {options['agents_dir']}: run `manage.py demo_agents` "
                                   f"first, or pass --no-agents")
            children.append(Child("agents", [
                python, "-m", "telemetry.agent.simfleet",
                "--manifest", str(Path(options["agents_dir"]) / demo.MANIFEST_NAME),
            ]))
        celery = [python, "-m", "celery", "-A", "config"]
        children.append(Child("worker", [
            *celery, "worker", "--loglevel", "INFO", "--pool", "threads", "--concurrency", str(options["concurrency"]),
            # No broadcast chatter: with the filesystem broker each would be files to list and remove.
            "--without-gossip", "--without-mingle", "--without-heartbeat",
        ]))
        children.append(Child("beat", [*celery, "beat", "--loglevel", "INFO"]))
        web = [python, manage, "runserver", options["addrport"]]
        if options["noreload"]:
            web.append("--noreload")
        children.append(Child("web", web))
        return children

    def start(self, child: Child, colour: str) -> None:
        env = {**os.environ, "PYTHONUNBUFFERED": "1"}
        try:
            child.process = subprocess.Popen(
                child.argv, cwd=settings.BASE_DIR, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT, start_new_session=True,
            )
        except OSError as exc:
            raise CommandError(f"cannot start {child.name} ({child.argv[0]}): {exc}") from exc
        child.reader = threading.Thread(target=self.relay, args=(child, colour), daemon=True)
        child.reader.start()

    def relay(self, child: Child, colour: str) -> None:
        for raw in child.process.stdout:
            self.say(child.name, raw.decode("utf-8", "replace").rstrip("\n"), colour)

    def say(self, name: str, line: str, colour: str = "1") -> None:
        prefix = f"{name:<{self._width}} | "
        if self._colour:
            prefix = f"\033[{colour}m{prefix}\033[0m"
        with self._lock:
            self.stdout.write(prefix + line)
            self.stdout.flush()

    def stop_all(self, children: list[Child]) -> None:
        """SIGTERM every child's process group once, then SIGKILL what is left after the grace period."""
        running = [c for c in children if c.process is not None and c.process.poll() is None]
        for child in reversed(running):  # web and beat first, agents last
            self._signal(child, signal.SIGTERM)
        deadline = time.monotonic() + STOP_GRACE_S
        for child in running:
            try:
                child.process.wait(timeout=max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                self.say("runfleet", f"{child.name} did not stop within {STOP_GRACE_S:g} s; killing it")
                self._signal(child, signal.SIGKILL)
                child.process.wait()
        # Grandchildren (runserver's reloaded server) share the child's group: make sure none is left.
        for child in children:
            if child.process is not None:
                self._signal(child, signal.SIGKILL)
        for child in children:
            if child.reader is not None:
                child.reader.join(timeout=2)

    @staticmethod
    def _signal(child: Child, signum: int) -> None:
        # The child leads its own group (start_new_session): its pid is the group id.
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(child.process.pid, signum)

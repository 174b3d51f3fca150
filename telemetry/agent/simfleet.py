"""Several simulated hosts served by one process: the demo fleet's agents.

    python -m telemetry.agent.simfleet --manifest var/agents/agents.json [--workers 2]
        [--max-connections 64] [--log-level INFO]

Why it exists: the demo (`make run`) simulates every host of its fleet, nine by default, and
one `python -m telemetry.agent` process per host would cost nine interpreters on a laptop
that also runs the web server, a Celery worker and beat. Here every host keeps an agent of its
own, with its own port, token and scenario, answering protocol v1 exactly as `python -m
telemetry.agent --backend sim` does (the same `AgentServer` and `SimBackend`), so the
collector polls them as separate hosts; they only share the process, each server's loop
running on a thread of its own. Unless --no-events, the hosts take turns showing GPU and vGPU
trouble (XIDs, ECC errors, thermal slowdown, licence lapses, a full frame buffer, a few minutes
of 503s) from the moment the process starts: `sim_events.py` gives the schedule.

The manifest is a JSON list with one object per agent: {"name", "listen": "HOST:PORT",
"token_file", "scenario"} (other keys are ignored). `manage.py demo_agents` writes it. Relative
paths are taken from the working directory, as the single agent's options are.

Stdlib only, like the rest of the package. SIGTERM or Ctrl-C stops every server; if one
server's loop dies, the others are stopped and the exit status is 1, so a launcher notices.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import signal
import sys
import threading
import time
from pathlib import Path
from typing import Any

from . import __version__
from .__main__ import ConfigError, fit_open_files, parse_listen, positive_int, read_token
from .scenario import ScenarioError, load_scenario
from .server import AgentServer
from .sim_backend import SimBackend

logger = logging.getLogger("telemetry.agent.simfleet")

MANIFEST_KEYS = ("name", "listen", "token_file", "scenario")


def load_manifest(path: str | Path) -> list[dict[str, Any]]:
    """The manifest's agents, each checked for the keys this module reads; errors name the entry."""
    path = Path(path)
    try:
        entries = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ConfigError(f"manifest {path} does not exist (run `manage.py demo_agents` first)") from None
    except (OSError, ValueError) as exc:
        raise ConfigError(f"manifest {path} cannot be read: {exc}") from None
    if not isinstance(entries, list) or not entries:
        raise ConfigError(f"manifest {path} must be a non-empty JSON list of agents")
    for index, entry in enumerate(entries):
        if not isinstance(entry, dict):
            raise ConfigError(f"manifest {path}: entry {index} must be an object")
        for key in MANIFEST_KEYS:
            if not isinstance(entry.get(key), str) or not entry[key]:
                raise ConfigError(f"manifest {path}: entry {index} lacks {key!r}")
    return entries


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m telemetry.agent.simfleet",
        description="Serve several simulated hosts (protocol v1, sim backend) from one process, one port each.",
    )
    parser.add_argument("--manifest", required=True, metavar="FILE",
                        help="JSON list of agents: name, listen (HOST:PORT), token_file, scenario")
    parser.add_argument("--workers", type=positive_int, default=2, metavar="N",
                        help="threads answering requests, per agent (default 2)")
    parser.add_argument("--max-connections", type=positive_int, default=64, metavar="N",
                        help="connections open at once, per agent (default 64)")
    parser.add_argument("--no-events", action="store_true",
                        help="a healthy fleet: no XIDs, ECC errors, licence lapses or outages (sim_events.py)")
    parser.add_argument("--log-level", default="INFO", choices=("DEBUG", "INFO", "WARNING", "ERROR"))
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    return parser


def _plan(entries: list[dict[str, Any]],
          events_from: float | None = None) -> list[tuple[tuple[str, int], SimBackend, str]]:
    """(address, backend, token) of every agent; raises ConfigError or ScenarioError naming it.

    With `events_from`, the agents share one event schedule from that instant, each host taking
    its turn by its place in the manifest (sim_events.py)."""
    planned = []
    for slot, entry in enumerate(entries):
        try:
            address = parse_listen(entry["listen"])
        except argparse.ArgumentTypeError as exc:
            raise ConfigError(f"agent {entry['name']}: {exc}") from None
        backend = SimBackend(load_scenario(entry["scenario"]), events_from=events_from, slot=slot, hosts=len(entries))
        planned.append((address, backend, read_token(entry["token_file"])))
    return planned


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=args.log_level, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        planned = _plan(load_manifest(args.manifest), None if args.no_events else time.time())
    except (ConfigError, ScenarioError) as exc:
        print(f"telemetry.agent.simfleet: error: {exc}", file=sys.stderr)
        return 2
    # The open-file limit is one for the whole process: share what fits between the agents.
    per_agent = max(1, fit_open_files(args.max_connections * len(planned)) // len(planned))
    servers: list[AgentServer] = []
    try:
        for address, backend, token in planned:
            try:
                servers.append(AgentServer(address, backend, token, backend.hostname,
                                           max_connections=per_agent, workers=args.workers))
            except OSError as exc:
                print(f"telemetry.agent.simfleet: error: cannot listen on {address[0]}:{address[1]} "
                      f"({backend.hostname}): {exc}", file=sys.stderr)
                return 2
        return _serve(servers)
    finally:
        for server in servers:
            server.server_close()
            server.backend.close()


def _serve(servers: list[AgentServer]) -> int:
    """Run every server's loop on a thread until a signal arrives or a loop dies."""
    stop = threading.Event()
    previous = {sig: signal.signal(sig, lambda signum, frame: stop.set()) for sig in (signal.SIGINT, signal.SIGTERM)}
    threads = [threading.Thread(target=server.serve_forever, name=f"agent-{server.hostname}", daemon=True)
               for server in servers]
    for thread in threads:
        thread.start()
    for server in servers:
        # The same start-up line as the single agent's, one per host, for launchers and tests.
        print(f"telemetry.agent {__version__} pid {os.getpid()}: serving sim metrics of {server.hostname} "
              f"on {server.url}", file=sys.stderr, flush=True)
    dead = None
    try:
        # Woken every second to notice a dead loop; a signal sets the event at once.
        while not stop.wait(1.0):
            dead = next((t for t in threads if not t.is_alive()), None)
            if dead is not None:
                logger.error("%s stopped serving; stopping the other agents", dead.name)
                break
    finally:
        for server, thread in zip(servers, threads, strict=True):
            if thread.is_alive():
                server.shutdown()
            thread.join(timeout=5)
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    return 1 if dead is not None else 0


if __name__ == "__main__":
    sys.exit(main())

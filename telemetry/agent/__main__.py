"""Command line of the host agent.

    python -m telemetry.agent --listen 0.0.0.0:9410 --token-file /etc/vgpu-agent/token \\
        [--write-token-file /etc/vgpu-agent/write-token] [--device-token-file /etc/vgpu-agent/device-token]
        [--sysfs-root /] [--backend nvml|sim] [--scenario FILE] [--hostname NAME]
        [--max-connections 512] [--request-timeout 10] [--idle-timeout 120] [--workers 8]

Connections are bounded (telemetry/agent/connections.py): --max-connections open at once (the
one waiting longest, idle or still sending its request, is closed to make room), --request-timeout
for a request to arrive in full, --idle-timeout between keep-alive requests, --workers threads
answering. The open-file limit is raised to fit --max-connections where the hard limit allows,
else the cap is lowered.

With --write-token-file the agent also accepts PUT /v1/gpus/<uuid>/scheduler from holders of that
second token (`python manage.py scheduler_write_token <agent>` prints it) and says
`"scheduler_write": true` in its metrics, so the dashboard offers to apply policies through it.

With --device-token-file it also lists, creates and removes vGPU instances (GET /v1/vgpu-types,
GET and POST /v1/vgpu-devices, DELETE /v1/vgpu-devices/<id>) for holders of that third token
(`python manage.py agent_device_token <agent>` prints it), by writing the host's sysfs under
--sysfs-root (default /) in either NVIDIA layout (`vgpu_devices.py`). Each token does one thing:
the three must differ.

Configuration problems (token file missing or empty, NVML unavailable, bad scenario, port
in use) end the process with exit status 2 and one line saying what to fix, because the
agent usually runs under systemd or docker where a traceback is the least readable answer.
"""

from __future__ import annotations

import argparse
import hmac
import logging
import math
import os
import signal
import socket
import stat
import sys
from pathlib import Path
from typing import Any

from . import __version__

logger = logging.getLogger("telemetry.agent")
# Descriptors kept for what is not a client connection: the listener, the loop's wake-up pair,
# the selector, NVML's device files, log files.
RESERVED_FILES = 64


class ConfigError(Exception):
    """The agent cannot start as configured; the message says what to fix."""


def parse_listen(value: str) -> tuple[str, int]:
    """HOST:PORT (IPv6 as [::1]:9410; an empty host means all IPv4 addresses) -> (host, port)."""
    host, sep, port = value.rpartition(":")
    if not sep or not port.isdigit() or int(port) > 65535:
        raise argparse.ArgumentTypeError(f"expected HOST:PORT, got {value!r}")
    return host.strip("[]") or "0.0.0.0", int(port)


def positive_int(value: str) -> int:
    if not value.isascii() or not value.isdigit() or int(value) < 1:
        raise argparse.ArgumentTypeError(f"expected a whole number of at least 1, got {value!r}")
    return int(value)


def positive_seconds(value: str) -> float:
    try:
        seconds = float(value)
    except ValueError:
        seconds = math.nan
    if not 0 < seconds < math.inf:
        raise argparse.ArgumentTypeError(f"expected a number of seconds above 0, got {value!r}")
    return seconds


def fit_open_files(max_connections: int) -> int:
    """`max_connections`, or fewer when the open-file limit cannot hold that many sockets.

    Raises the soft RLIMIT_NOFILE as far as the hard limit allows first (systemd's default soft
    limit is 1,024). Without room, accept() would fail with EMFILE under load instead of the
    server closing the longest-waiting connection as designed.
    """
    try:
        import resource
    except ImportError:  # not a Unix
        return max_connections
    needed = max_connections + RESERVED_FILES
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != resource.RLIM_INFINITY and soft < needed:
        target = needed if hard == resource.RLIM_INFINITY else min(needed, hard)
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
            soft = target
        except (ValueError, OSError):
            pass
    if soft == resource.RLIM_INFINITY or soft >= needed:
        return max_connections
    fitted = max(1, soft - RESERVED_FILES)
    logger.warning("the open-file limit (ulimit -n) is %d: serving at most %d connections instead of "
                   "--max-connections %d; raise LimitNOFILE (systemd) or --ulimit nofile (docker)",
                   soft, fitted, max_connections)
    return fitted


def read_token(path: str | Path) -> str:
    """The bearer token: the file's content stripped of surrounding whitespace; read once at start."""
    path = Path(path)
    try:
        token = path.read_text(encoding="utf-8").strip()
    except FileNotFoundError:
        raise ConfigError(f"token file {path} does not exist") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"token file {path} cannot be read: {exc}") from None
    if not token:
        raise ConfigError(f"token file {path} is empty")
    if not token.isascii() or not token.isprintable() or any(c.isspace() for c in token):
        raise ConfigError(f"token in {path} must be one word of printable ASCII (it travels in an HTTP header)")
    try:
        if stat.S_IMODE(path.stat().st_mode) & 0o077:
            logger.warning("token file %s is readable by other users; chmod 600 it", path)
    except OSError:
        pass
    return token


def open_devices(sysfs_root: str, device_token: str | None, token: str, write_token: str | None) -> Any:
    """The host's vGPU devices under `sysfs_root` when a device token is given, else None."""
    if device_token is None:
        return None
    if any(other is not None and hmac.compare_digest(device_token, other) for other in (token, write_token)):
        raise ConfigError("the device token must differ from the read and write tokens")
    if not (Path(sysfs_root) / "sys").is_dir():
        raise ConfigError(f"--sysfs-root {sysfs_root}: there is no sys/ folder in it")
    from .vgpu_devices import HostSysfs

    devices = HostSysfs(sysfs_root)
    if not devices.gpu_addresses():
        logger.warning("no GPU under %s offers vGPUs (no /sys/class/mdev_bus GPU, no SR-IOV VF with nvidia/ files): "
                       "is the NVIDIA vGPU manager loaded, and for vGPU 17+ were the VFs enabled (sriov-manage -e)?",
                       sysfs_root)
    return devices


def make_backend(name: str, scenario: str | None) -> Any:
    """The backend named on the command line; imports pynvml only for nvml."""
    if name == "sim":
        from .scenario import POC_SCENARIO_PATH, load_scenario
        from .sim_backend import SimBackend

        return SimBackend(load_scenario(scenario or POC_SCENARIO_PATH))
    try:
        import pynvml
    except ImportError:
        raise ConfigError("the nvml backend needs nvidia-ml-py: pip install nvidia-ml-py") from None
    from .nvml_backend import NvmlBackend

    try:
        return NvmlBackend(pynvml)
    except pynvml.NVMLError as exc:
        raise ConfigError(f"NVML initialization failed: {exc} (is the NVIDIA driver loaded?)") from None


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m telemetry.agent",
        description="Serve NVML (or simulated) GPU and vGPU metrics over HTTP (protocol v1).",
    )
    parser.add_argument(
        "--listen",
        type=parse_listen,
        default=("0.0.0.0", 9410),
        metavar="HOST:PORT",
        help="address to listen on (default 0.0.0.0:9410; port 0 picks a free one)",
    )
    parser.add_argument(
        "--token-file", required=True, metavar="PATH", help="file holding the bearer token that scrapers must present"
    )
    parser.add_argument(
        "--write-token-file",
        metavar="PATH",
        help="file holding the separate token that allows PUT /v1/gpus/<uuid>/scheduler; without it the agent "
        "is read-only",
    )
    parser.add_argument(
        "--device-token-file",
        metavar="PATH",
        help="file holding the separate token that allows listing, creating and removing vGPU instances "
        "(/v1/vgpu-types, /v1/vgpu-devices); without it those paths answer 403",
    )
    parser.add_argument(
        "--sysfs-root",
        default="/",
        metavar="PATH",
        help="folder holding the sys/ tree the device paths read and write (default /; a test's fake tree)",
    )
    parser.add_argument("--backend", choices=("nvml", "sim"), default="nvml")
    parser.add_argument(
        "--scenario",
        metavar="FILE",
        help="scenario JSON of the sim backend (default: the sizing guide's proof of concept)",
    )
    parser.add_argument("--hostname", help="name reported in the payload (default: scenario or system hostname)")
    parser.add_argument(
        "--max-connections",
        type=positive_int,
        default=512,
        metavar="N",
        help="connections open at once; one more closes the one waiting longest (default 512)",
    )
    parser.add_argument(
        "--request-timeout",
        type=positive_seconds,
        default=10.0,
        metavar="SECONDS",
        help="close a connection whose request (line, headers, body) is not in within this long of its "
        "first byte, or of the connect (default 10)",
    )
    parser.add_argument(
        "--idle-timeout",
        type=positive_seconds,
        default=120.0,
        metavar="SECONDS",
        help="close keep-alive connections idle this long between requests (default 120)",
    )
    parser.add_argument(
        "--workers",
        type=positive_int,
        default=8,
        metavar="N",
        help="threads answering complete requests; idle connections use none (default 8)",
    )
    parser.add_argument("--log-level", default="INFO", choices=("DEBUG", "INFO", "WARNING", "ERROR"))
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    return parser


def _stop(signum: int, frame: Any) -> None:
    raise KeyboardInterrupt


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=args.log_level, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    from .scenario import ScenarioError
    from .server import AgentServer

    try:
        token = read_token(args.token_file)
        write_token = read_token(args.write_token_file) if args.write_token_file else None
        if write_token is not None and hmac.compare_digest(write_token, token):
            raise ConfigError("the write token must differ from the read token")
        device_token = read_token(args.device_token_file) if args.device_token_file else None
        devices = open_devices(args.sysfs_root, device_token, token, write_token)
        backend = make_backend(args.backend, args.scenario)
    except (ConfigError, ScenarioError) as exc:
        print(f"telemetry.agent: error: {exc}", file=sys.stderr)
        return 2
    hostname = args.hostname or getattr(backend, "hostname", None) or socket.gethostname()
    try:
        server = AgentServer(
            args.listen,
            backend,
            token,
            hostname,
            idle_timeout_s=args.idle_timeout,
            request_timeout_s=args.request_timeout,
            max_connections=fit_open_files(args.max_connections),
            workers=args.workers,
            write_token=write_token,
            device_token=device_token,
            devices=devices,
        )
    except OSError as exc:
        print(f"telemetry.agent: error: cannot listen on {args.listen[0]}:{args.listen[1]}: {exc}", file=sys.stderr)
        backend.close()
        return 2
    signal.signal(signal.SIGTERM, _stop)
    # Tests and wrappers read this line to learn the port when --listen asked for port 0.
    print(
        f"telemetry.agent {__version__} pid {os.getpid()}: "
        f"serving {backend.name} metrics of {hostname} on {server.url}"
        + (f"; vGPU devices under {args.sysfs_root}" if devices is not None else ""),
        file=sys.stderr,
        flush=True,
    )
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        server.server_close()
        backend.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())

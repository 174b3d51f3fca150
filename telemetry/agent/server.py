"""HTTP side of the agent: protocol v1 over the standard library's ThreadingHTTPServer.

Why it is written the way it is:
- Keep-alive scrapes must not wait on TCP delayed ACK. With the stdlib defaults a response
  leaves in two writes (headers, then body); Nagle holds the second until the client ACKs
  the first, which the client delays ~40 ms: measured 23 scrapes/s instead of 1,022. So
  every response goes out in ONE write (status line, headers and body joined) and accepted
  sockets get TCP_NODELAY.
- The bearer token is compared with hmac.compare_digest (no timing oracle), read once at
  start; /healthz answers without it so a load balancer or `docker compose` can probe.
- Changing anything is a separate permission: PUT /v1/gpus/<uuid>/scheduler needs the WRITE
  token (`--write-token-file`), never the read token, so a scraper's credential cannot change
  the driver; an agent started without one answers 403 "read-only agent". An agent holding one
  says so in its metrics (`"agent": {..., "scheduler_write": true}`), and the dashboard offers
  to apply through it only then.
- `server_bind` skips HTTPServer's reverse-DNS lookup of the listen address, which can
  stall agent start-up for seconds on hosts without DNS.
"""

from __future__ import annotations

import hmac
import json
import logging
import re
import socket
import socketserver
import time
from collections.abc import Iterable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Protocol

from . import __version__
from .scheduler_write import SchedulerRefused, parse_settings

logger = logging.getLogger(__name__)

METRICS_PATH = "/v1/metrics"
HEALTH_PATH = "/healthz"
KNOWN_PATHS = (METRICS_PATH, HEALTH_PATH)
REALM = "vgpu-agent"
SCHEDULER_PATH = re.compile(r"^/v1/gpus/(?P<uuid>[A-Za-z0-9-]{1,80})/scheduler$")
MAX_BODY_BYTES = 4096


class Backend(Protocol):
    name: str

    def collect(self, now: float | None = None) -> list[dict[str, Any]]: ...

    def close(self) -> None: ...


class AgentServer(ThreadingHTTPServer):
    """Serves one backend's metrics to bearer-token holders; one thread per connection."""

    daemon_threads = True
    allow_reuse_address = True

    def __init__(
        self,
        address: tuple[str, int],
        backend: Backend,
        token: str,
        hostname: str,
        *,
        idle_timeout_s: float = 120.0,
        write_token: str | None = None,
    ):
        if ":" in address[0]:
            self.address_family = socket.AF_INET6
        self.backend = backend
        self.token = token.encode()
        # None: a read-only agent (the default); scheduler changes are refused with 403.
        self.write_token = write_token.encode() if write_token else None
        self.hostname = hostname
        # Longer than any sane scrape interval so pollers keep their connection, short
        # enough that abandoned connections do not pin a thread each for ever.
        self.idle_timeout_s = idle_timeout_s
        super().__init__(address, AgentRequestHandler)

    def server_bind(self) -> None:
        """Bind without HTTPServer's getfqdn() (a reverse-DNS lookup that can hang start-up)."""
        socketserver.TCPServer.server_bind(self)
        host, port = self.server_address[:2]
        self.server_name = host
        self.server_port = port

    @property
    def url(self) -> str:
        host, port = self.server_address[:2]
        return f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"

    def metrics_body(self) -> bytes:
        """The JSON document of GET /v1/metrics, collected now."""
        collected_at = time.time()
        gpus = self.backend.collect(collected_at)
        agent: dict[str, Any] = {"version": __version__, "hostname": self.hostname, "backend": self.backend.name}
        if self.write_token is not None:
            # Added in protocol v1 without a version bump: absent (older or read-only agents) means
            # false, so the dashboard offers to apply scheduler policies only through this agent.
            agent["scheduler_write"] = True
        document = {"agent": agent, "collected_at": collected_at, "gpus": gpus}
        return json.dumps(document, separators=(",", ":")).encode()


class AgentRequestHandler(BaseHTTPRequestHandler):
    """Routes GET /v1/metrics and GET /healthz; everything else is 404 or 405 in JSON."""

    server: AgentServer
    protocol_version = "HTTP/1.1"
    server_version = f"vgpu-agent/{__version__}"
    sys_version = ""
    # socketserver.StreamRequestHandler sets TCP_NODELAY on the accepted socket when true.
    disable_nagle_algorithm = True

    def setup(self) -> None:
        self.timeout = self.server.idle_timeout_s
        super().setup()

    def do_GET(self) -> None:
        path = self.path.split("?", 1)[0]
        if path == METRICS_PATH:
            if not self._authorized():
                return
            try:
                body = self.server.metrics_body()
            except Exception:
                logger.exception("collection failed")
                self._send_json(500, {"error": "collection failed; see the agent's log"})
                return
            self._send(200, body)
        elif path == HEALTH_PATH:
            self._send_json(200, {"status": "ok"})
        else:
            self._send_json(404, {"error": f"no such path; use GET {METRICS_PATH} or GET {HEALTH_PATH}"})

    def _method_not_allowed(self) -> None:
        # The request may carry a body we do not read: close rather than parse it as the next request.
        self.close_connection = True
        self._send_json(405, {"error": f"method {self.command} not allowed; use GET"}, [("Allow", "GET")])

    def do_PUT(self) -> None:
        match = SCHEDULER_PATH.match(self.path.split("?", 1)[0])
        if match is None:
            self._method_not_allowed()
            return
        # Whatever happens, the body is not parsed as the next request.
        self.close_connection = True
        if self.server.write_token is None:
            self._send_json(403, {"error": "read-only agent: start it with --write-token-file to apply "
                                           "scheduler changes"})
            return
        if not self._authorized(self.server.write_token):
            return
        apply = getattr(self.server.backend, "set_scheduler", None)
        if apply is None:
            self._send_json(501, {"error": f"the {self.server.backend.name} backend cannot change the scheduler"})
            return
        try:
            length = int(self.headers.get("Content-Length") or 0)
            if not 0 < length <= MAX_BODY_BYTES:
                raise SchedulerRefused(400, f"send a JSON body of 1 to {MAX_BODY_BYTES} bytes")
            try:
                document = json.loads(self.rfile.read(length))
            except ValueError:
                raise SchedulerRefused(400, "the body is not valid JSON") from None
            reading = apply(match["uuid"], parse_settings(document))
        except SchedulerRefused as exc:
            self._send_json(exc.status, {"error": exc.message})
            return
        except Exception:
            logger.exception("scheduler change failed")
            self._send_json(500, {"error": "scheduler change failed; see the agent's log"})
            return
        logger.info("scheduler of GPU %s set to %s", match["uuid"], document)
        self._send_json(200, {"uuid": match["uuid"], "scheduler": reading})

    do_POST = do_PATCH = do_DELETE = do_HEAD = do_OPTIONS = do_TRACE = do_CONNECT = _method_not_allowed

    def __getattr__(self, name: str) -> Any:
        # BaseHTTPRequestHandler answers 501 to a method without do_<METHOD>; the protocol says 405.
        if name.startswith("do_"):
            return self._method_not_allowed
        raise AttributeError(name)

    def _authorized(self, expected: bytes | None = None) -> bool:
        """True if the request carries `expected` (the read token by default) as its bearer token;
        otherwise sends the 401."""
        header = self.headers.get("Authorization")
        if header is None:
            self._send_json(401, {"error": "missing bearer token"}, [("WWW-Authenticate", f'Bearer realm="{REALM}"')])
            return False
        scheme, _, credentials = header.strip().partition(" ")
        presented = credentials.strip().encode("latin-1", "replace")
        if scheme.lower() == "bearer" and hmac.compare_digest(presented, expected or self.server.token):
            return True
        self._send_json(
            401,
            {"error": "invalid bearer token"},
            [("WWW-Authenticate", f'Bearer realm="{REALM}", error="invalid_token"')],
        )
        return False

    def _send_json(self, status: int, document: Any, headers: Iterable[tuple[str, str]] = ()) -> None:
        self._send(status, json.dumps(document).encode(), headers)

    def _send(self, status: int, body: bytes, headers: Iterable[tuple[str, str]] = ()) -> None:
        """Write status line, headers and body with a single write (one sendall): see the module doc."""
        lines = [
            f"HTTP/1.1 {status} {self.responses[status][0]}",
            f"Server: {self.server_version}",
            f"Date: {self.date_time_string()}",
            "Content-Type: application/json",
            f"Content-Length: {len(body)}",
            "Cache-Control: no-store",
        ]
        lines.extend(f"{name}: {value}" for name, value in headers)
        if self.close_connection:
            lines.append("Connection: close")
        head = ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")
        self.wfile.write(head if self.command == "HEAD" else head + body)
        self.log_request(status, len(body))

    def log_message(self, format: str, *args: Any) -> None:
        # Access logs at debug: a scrape every few seconds per poller would flood the journal.
        logger.debug("%s %s", self.address_string(), format % args)

    def log_error(self, format: str, *args: Any) -> None:
        # An idle keep-alive connection reaching idle_timeout_s is routine, not a warning.
        level = logging.DEBUG if format.startswith("Request timed out") else logging.WARNING
        logger.log(level, "%s %s", self.address_string(), format % args)

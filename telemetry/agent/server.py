"""HTTP side of the agent: protocol v1 over the bounded server of `connections.py`.

Why it is written the way it is:
- Idle and slow connections cost no thread, the number of connections is capped, headers and
  bodies are capped and a malformed Content-Length is a 400: a few hundred idle or trickling
  sockets cannot keep a scrape from being answered (`connections.py` says how).
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
- Creating and removing vGPU instances is a third permission, with a third token
  (`--device-token-file`): an agent started without one answers 403 on these paths, saying how
  to enable them. With it (and `--sysfs-root` where sysfs is not at /), protocol v1 adds:
    GET    /v1/vgpu-types            {"types": [{gpu, layout, id, name, available}, ...]}
    GET    /v1/vgpu-devices          {"devices": [{kind, id, gpu, type, type_id}, ...]}
    POST   /v1/vgpu-devices          body {"gpu": "<PCI address>", "type": "<type name>"}
                                     -> 201 with the device (and its Location)
    DELETE /v1/vgpu-devices/<id>     (mdev UUID or VF address) -> 204
  Refusals carry {"error": ..., "reason": ...}: 400 bad_request; 404 no_gpu, no_type or
  no_device; 409 no_instance (the GPU has no room for that type now) or busy (a running VM holds
  the device); 500 kernel. `vgpu_devices.py` says how each layout is written.
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
import urllib.parse
import uuid
from collections.abc import Callable, Iterable
from http.server import BaseHTTPRequestHandler
from typing import Any, Protocol

from . import BackendUnavailable, __version__
from .connections import MAX_BODY_BYTES, BoundedHTTPServer, Exchange, response_bytes
from .scheduler_write import SchedulerRefused, parse_settings
from .vgpu_devices import MAX_TYPE_NAME, DeviceRefused, HostSysfs, bus_id

logger = logging.getLogger(__name__)

METRICS_PATH = "/v1/metrics"
HEALTH_PATH = "/healthz"
KNOWN_PATHS = (METRICS_PATH, HEALTH_PATH)
REALM = "vgpu-agent"
SCHEDULER_PATH = re.compile(r"^/v1/gpus/(?P<uuid>[A-Za-z0-9-]{1,80})/scheduler$")
VGPU_TYPES_PATH = "/v1/vgpu-types"
VGPU_DEVICES_PATH = "/v1/vgpu-devices"
VGPU_DEVICE_PATH = re.compile(r"^/v1/vgpu-devices/(?P<id>[A-Za-z0-9:.-]{1,64})$")
DEVICES_DISABLED = ("this agent does not manage vGPU devices: start it with --device-token-file (and --sysfs-root "
                    "where sysfs is not at /) to create and remove vGPUs through it")
SERVER_VERSION = f"vgpu-agent/{__version__}"


class Backend(Protocol):
    name: str

    def collect(self, now: float | None = None) -> list[dict[str, Any]]: ...

    def close(self) -> None: ...


class AgentServer(BoundedHTTPServer):
    """Serves one backend's metrics to bearer-token holders (limits: `connections.py`)."""

    server_version = SERVER_VERSION

    def __init__(
        self,
        address: tuple[str, int],
        backend: Backend,
        token: str,
        hostname: str,
        *,
        idle_timeout_s: float = 120.0,
        request_timeout_s: float = 10.0,
        max_connections: int = 512,
        workers: int = 8,
        write_token: str | None = None,
        device_token: str | None = None,
        devices: HostSysfs | None = None,
    ):
        if ":" in address[0]:
            self.address_family = socket.AF_INET6
        self.backend = backend
        self.token = token.encode()
        # None: a read-only agent (the default); scheduler changes are refused with 403.
        self.write_token = write_token.encode() if write_token else None
        # None: vGPU devices are not managed here; the device paths answer 403.
        self.device_token = device_token.encode() if device_token else None
        self.devices = (devices or HostSysfs("/")) if device_token else None
        self.hostname = hostname
        # idle_timeout_s: longer than any sane scrape interval so pollers keep their connection.
        super().__init__(address, AgentRequestHandler, idle_timeout_s=idle_timeout_s,
                         request_timeout_s=request_timeout_s, max_connections=max_connections, workers=workers)

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
        driver = getattr(self.backend, "driver", None)
        if driver is not None:
            # Added in protocol v1 without a version bump (issue 19): older agents omit it.
            document["driver"] = driver()
        return json.dumps(document, separators=(",", ":")).encode()


class AgentRequestHandler(BaseHTTPRequestHandler):
    """Routes GET /v1/metrics and GET /healthz; everything else is 404 or 405 in JSON."""

    server: AgentServer
    request: Exchange
    protocol_version = "HTTP/1.1"
    server_version = SERVER_VERSION
    sys_version = ""

    def setup(self) -> None:
        # One complete request, read by the server's loop; answers go out on its socket.
        self.connection = self.request.sock
        self.rfile = self.request.reader()
        self.wfile = self.request.writer()

    def handle(self) -> None:
        self.handle_one_request()

    def finish(self) -> None:
        pass

    def handle_expect_100(self) -> bool:
        # The body has arrived already (the loop sent 100 Continue if the client waited for it).
        return True

    def send_error(self, code: int, message: str | None = None, explain: str | None = None) -> None:
        """Errors of the request line (400, 505...) in JSON like every other answer, then close."""
        self.close_connection = True
        self._send_json(code, {"error": message or self.responses[code][0]})

    def do_GET(self) -> None:
        path = self.path.split("?", 1)[0]
        if path == METRICS_PATH:
            if not self._authorized():
                return
            try:
                body = self.server.metrics_body()
            except BackendUnavailable as exc:
                self._send_json(503, {"error": str(exc)}, [("Retry-After", str(exc.retry_after_s))])
                return
            except Exception:
                logger.exception("collection failed")
                self._send_json(500, {"error": "collection failed; see the agent's log"})
                return
            self._send(200, body)
        elif path == HEALTH_PATH:
            self._send_json(200, {"status": "ok"})
        elif path == VGPU_TYPES_PATH:
            if self._devices_authorized():
                self._send_json(200, {"types": [offer.as_document() for offer in self.server.devices.offers()]})
        elif path == VGPU_DEVICES_PATH:
            if self._devices_authorized():
                self._send_json(200, {"devices": [item.as_document() for item in self.server.devices.instances()]})
        else:
            self._send_json(404, {"error": f"no such path; use GET {METRICS_PATH} or GET {HEALTH_PATH}"})

    def _method_not_allowed(self) -> None:
        # Whatever the client meant by this request, it is not a scraper that keeps its connection.
        self.close_connection = True
        path = self.path.split("?", 1)[0]
        allowed = "GET, POST" if path == VGPU_DEVICES_PATH else "DELETE" if VGPU_DEVICE_PATH.match(path) else "GET"
        self._send_json(405, {"error": f"method {self.command} not allowed; use {allowed.replace(', ', ' or ')}"},
                        [("Allow", allowed)])

    def do_PUT(self) -> None:
        match = SCHEDULER_PATH.match(self.path.split("?", 1)[0])
        if match is None:
            self._method_not_allowed()
            return
        # A change to the driver is a one-off request, not a scraper's: close after answering.
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
            # The server's loop has checked Content-Length (one number, at most MAX_BODY_BYTES)
            # and read that many bytes: the rest of rfile is the body.
            body = self.rfile.read()
            if not body:
                raise SchedulerRefused(400, f"send a JSON body of 1 to {MAX_BODY_BYTES} bytes")
            try:
                document = json.loads(body)
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

    def do_POST(self) -> None:
        if self.path.split("?", 1)[0] != VGPU_DEVICES_PATH:
            self._method_not_allowed()
            return
        created = self._change_devices("vGPU creation", lambda devices: devices.create(
            *parse_device_request(self.rfile.read())))
        if created is not None:
            logger.info("created vGPU %s (%s) on GPU %s", created.id, created.type, created.gpu)
            self._send_json(201, created.as_document(),
                            [("Location", f"{VGPU_DEVICES_PATH}/{urllib.parse.quote(created.id, safe=':')}")])

    def do_DELETE(self) -> None:
        match = VGPU_DEVICE_PATH.match(urllib.parse.unquote(self.path.split("?", 1)[0]))
        if match is None:
            self._method_not_allowed()
            return
        if self._change_devices("vGPU removal", lambda devices: devices.remove(match["id"]) or match["id"]):
            logger.info("removed vGPU %s", match["id"])
            self._send(204, b"")

    def _change_devices(self, what: str, change: Callable[[HostSysfs], Any]) -> Any:
        """`change(devices)`'s result for a holder of the device token; otherwise None, with the
        refusal (401, 403, DeviceRefused's status, or 500) already answered."""
        # A change to the host is a one-off request, not a scraper's: close after answering.
        self.close_connection = True
        if not self._devices_authorized():
            return None
        try:
            return change(self.server.devices)
        except DeviceRefused as exc:
            self._send_json(exc.status, exc.as_document())
        except Exception:
            logger.exception("%s failed", what)
            self._send_json(500, {"error": f"{what} failed; see the agent's log", "reason": "kernel"})
        return None

    do_PATCH = do_HEAD = do_OPTIONS = do_TRACE = do_CONNECT = _method_not_allowed

    def __getattr__(self, name: str) -> Any:
        # BaseHTTPRequestHandler answers 501 to a method without do_<METHOD>; the protocol says 405.
        if name.startswith("do_"):
            return self._method_not_allowed
        raise AttributeError(name)

    def _devices_authorized(self) -> bool:
        """True if this agent manages vGPU devices and the request carries its device token;
        otherwise sends the 403 or 401."""
        if self.server.device_token is None:
            self._send_json(403, {"error": DEVICES_DISABLED})
            return False
        return self._authorized(self.server.device_token)

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
        self.wfile.write(response_bytes(status, body, headers, server=self.server_version,
                                        close=self.close_connection, head_only=self.command == "HEAD"))
        self.log_request(status, len(body))

    def log_message(self, format: str, *args: Any) -> None:
        # Access logs at debug: a scrape every few seconds per poller would flood the journal.
        logger.debug("%s %s", self.address_string(), format % args)

    def log_error(self, format: str, *args: Any) -> None:
        # A client that stops reading its answer (the send times out) is routine, not a warning.
        level = logging.DEBUG if format.startswith("Request timed out") else logging.WARNING
        logger.log(level, "%s %s", self.address_string(), format % args)


def parse_device_request(body: bytes) -> tuple[str, str, str]:
    """(GPU address, type name, wanted id) of a POST /v1/vgpu-devices body, or DeviceRefused(400)
    naming what is wrong. `id` is optional: the mdev UUID to create the device with (so the
    dashboard, retrying, finds the device it asked for); a VF is chosen by the agent."""
    if not body:
        raise DeviceRefused(400, "bad_request", f"send a JSON body of 1 to {MAX_BODY_BYTES} bytes")
    try:
        document = json.loads(body)
    except ValueError:
        raise DeviceRefused(400, "bad_request", "the body is not valid JSON") from None
    if not isinstance(document, dict):
        raise DeviceRefused(400, "bad_request", 'the body must be a JSON object: {"gpu": ..., "type": ...}')
    gpu, type_name = document.get("gpu"), document.get("type")
    if not isinstance(gpu, str) or bus_id(gpu) is None:
        raise DeviceRefused(400, "bad_request", "gpu must be the GPU's PCI address, e.g. 00000000:3B:00.0")
    if not isinstance(type_name, str) or not 0 < len(type_name.strip()) <= MAX_TYPE_NAME:
        raise DeviceRefused(400, "bad_request", f"type must be a vGPU type name of 1 to {MAX_TYPE_NAME} characters, "
                                                "e.g. NVIDIA L40S-12Q")
    wanted = document.get("id", "")
    try:
        wanted = str(uuid.UUID(wanted)) if wanted else ""
    except (TypeError, ValueError, AttributeError):
        raise DeviceRefused(400, "bad_request", "id, when given, must be a UUID (the mdev to create)") from None
    return gpu, type_name.strip(), wanted

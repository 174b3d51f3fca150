"""Agents on loopback for the collector's tests: real agents, and small misbehaving fakes.

- `real_agent(host, token)`: the real `telemetry.agent` server with the sim backend, serving a
  scenario built from `host`'s inventory rows (`telemetry.demo.host_scenario`), so what it
  reports maps onto those rows.
- `FakeAgent(behaviour)`: a stdlib `http.server` answering GET /v1/metrics the way a broken
  agent would: too slow, HTTP 500, invalid JSON, the wrong shape, an endless body, a clock
  an hour off, one byte at a time, hanging up without an answer; or a body in chunks
  (Transfer-Encoding: chunked); over TLS with `tls=(certificate file, key file)`. It records
  when each request arrived and when its handling ended (`calls`, monotonic stamps), so a test
  can tell which requests were in flight together.
- `closed_port_url()`: a URL on which nothing listens (connection refused).
- `inventory_host(...)`: a host with GPUs and placed vGPUs to poll.

Every server listens on 127.0.0.1 port 0 and runs in a daemon thread; they only serve the
test process itself.
"""

from __future__ import annotations

import contextlib
import json
import select
import socket
import socketserver
import ssl
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from fleet import services
from fleet.models import Host
from fleet.tests.factories import GpuFactory, HostFactory, VirtualMachineFactory, profile
from telemetry.agent.server import AgentServer
from telemetry.agent.sim_backend import SimBackend
from telemetry.demo import host_scenario
from telemetry.models import Agent, AgentKind


def inventory_host(name: str, gpus: int = 2, vgpus_per_gpu: int = 2, profile_name: str = "RTX6000-12Q") -> Host:
    """A Quadro RTX 6000 host with `gpus` GPUs, each holding `vgpus_per_gpu` placed vGPUs."""
    host = HostFactory(name=name)
    for g in range(gpus):
        gpu = GpuFactory(host=host, pci_bus_id=f"00000000:{0x3B + g:02X}:00.0")
        for v in range(vgpus_per_gpu):
            services.place_vgpu(VirtualMachineFactory(name=f"{name}-vm-{g}-{v}"), gpu, profile(profile_name))
    return host


def polled_agent(name: str, url: str, host: Host | None = None, timeout_s: float = 2.0,
                 kind: str = AgentKind.NVML) -> Agent:
    return Agent.objects.create(name=name, url=url, host=host, timeout_s=timeout_s, kind=kind)


class CountingAgentServer(AgentServer):
    """The real agent server, counting the TCP connections it accepts (keep-alive shows as one)
    and the metrics documents it served (`served`: one a poll)."""

    accepted = 0
    served = 0

    def get_request(self):
        request = super().get_request()
        self.accepted += 1
        return request

    def metrics_body(self) -> bytes:
        body = super().metrics_body()
        with _served_lock:
            self.served += 1
        return body


_served_lock = threading.Lock()


@contextlib.contextmanager
def serving(server) -> Iterator:
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    try:
        yield server
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=5)


@contextlib.contextmanager
def real_agent(host: Host, token: str) -> Iterator[CountingAgentServer]:
    """The real agent (sim backend) serving `host`'s inventory, expecting `token`."""
    backend = SimBackend(host_scenario(host, timezone="UTC"))
    with serving(CountingAgentServer(("127.0.0.1", 0), backend, token, host.name)) as server:
        yield server


def sim_payload(host: Host, collected_at: float | None = None) -> dict:
    """What the real agent would answer for `host` at `collected_at` (now by default)."""
    at = time.time() if collected_at is None else collected_at
    backend = SimBackend(host_scenario(host, timezone="UTC"))
    return {"agent": {"version": "1.0.0", "hostname": host.name, "backend": "sim"}, "collected_at": at,
            "gpus": backend.collect(at)}


class FakeAgent(ThreadingHTTPServer):
    """A misbehaving agent. `behaviour`: slow, http500, invalid_json, wrong_shape, endless,
    trickle, hangup (reads the request, closes the connection), hangup_kept_alive (answers a
    connection's first request with `payload`, hangs up on its next: an idle connection the
    agent closed just as the collector used it again), fixed (the given `payload`,
    e.g. with its clock off), text (a body given as `body`), chunked (the given `payload` in
    chunks of `chunk_bytes`)."""

    daemon_threads = True
    allow_reuse_address = True

    def __init__(self, behaviour: str, *, payload: dict | None = None, body: bytes = b"", delay_s: float = 0.0,
                 content_type: str = "application/json", chunk_bytes: int = 1000,
                 tls: tuple[str, str] | None = None):
        self.behaviour = behaviour
        self.chunk_bytes = chunk_bytes
        self.payload = payload
        self.body = body
        self.delay_s = delay_s
        self.content_type = content_type
        self.requests = 0
        self.bytes_sent = 0
        #: (arrived, ended) of each request handled, time.monotonic() stamps.
        self.calls: list[tuple[float, float]] = []
        self._in_flight = 0
        self._settled = threading.Condition()
        super().__init__(("127.0.0.1", 0), _FakeHandler)
        if tls is not None:
            context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
            context.load_cert_chain(*tls)
            self.socket = context.wrap_socket(self.socket, server_side=True)

    def server_bind(self):
        # No reverse-DNS lookup of 127.0.0.1 (HTTPServer.server_bind does one).
        socketserver.TCPServer.server_bind(self)
        self.server_name, self.server_port = self.server_address[:2]

    @property
    def url(self) -> str:
        scheme = "https" if isinstance(self.socket, ssl.SSLSocket) else "http"
        return f"{scheme}://127.0.0.1:{self.server_address[1]}"

    def handle_error(self, request, client_address):
        # The collector hanging up on a slow or endless answer is the point of these fakes.
        pass

    def __enter__(self):
        self._thread = threading.Thread(target=self.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self.shutdown()
        self.server_close()
        self._thread.join(timeout=5)
        # The handlers run in threads of their own: let those still ending (after the collector
        # hung up) record their stamps before the test reads them.
        with self._settled:
            self._settled.wait_for(lambda: self._in_flight == 0, timeout=5)


class _FakeHandler(BaseHTTPRequestHandler):
    server: FakeAgent
    protocol_version = "HTTP/1.1"

    def log_message(self, format, *args):
        pass

    def _reply(self, status: int, body: bytes, content_type: str | None = None) -> None:
        self.send_response(status)
        self.send_header("Content-Type", content_type or self.server.content_type)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)
        self.server.bytes_sent += len(body)

    def do_GET(self):
        server = self.server
        arrived = time.monotonic()
        with server._settled:
            server._in_flight += 1
        try:
            self._answer(server)
        finally:
            with server._settled:
                server.calls.append((arrived, time.monotonic()))
                server._in_flight -= 1
                server._settled.notify_all()

    def _answer(self, server: FakeAgent) -> None:
        server.requests += 1
        behaviour = server.behaviour
        if behaviour == "slow":
            # Answers after `delay_s`, unless the collector gives up first and hangs up (the
            # socket turns readable at its end of file): the call then ends when it gave up.
            hung_up, _, _ = select.select([self.connection], [], [], server.delay_s)
            if not hung_up:
                self._reply(200, json.dumps(server.payload).encode())
        elif behaviour == "http500":
            self._reply(500, b'{"error": "collection failed; see the agent\'s log"}')
        elif behaviour == "invalid_json":
            self._reply(200, b'{"agent": {"hostname": "x", "backend": "sim"}, "collected_at": 17')
        elif behaviour == "wrong_shape":
            self._reply(200, json.dumps({"hostname": "x", "metrics": []}).encode())
        elif behaviour == "fixed":  # a given payload, e.g. one stamped an hour ago
            self._reply(200, json.dumps(server.payload).encode())
        elif behaviour == "text":
            self._reply(200, server.body)
        elif behaviour == "chunked":
            body = json.dumps(server.payload).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Transfer-Encoding", "chunked")
            self.end_headers()
            for start in range(0, len(body), server.chunk_bytes):
                chunk = body[start:start + server.chunk_bytes]
                self.wfile.write(b"%x\r\n%s\r\n" % (len(chunk), chunk))
                server.bytes_sent += len(chunk)
            self.wfile.write(b"0\r\n\r\n")
        elif behaviour == "hangup":
            self.close_connection = True  # the request read, the connection closed without a word
        elif behaviour == "hangup_kept_alive":
            if getattr(self, "answered", False):  # one handler per connection
                self.close_connection = True
            else:
                self.answered = True
                self._reply(200, json.dumps(server.payload).encode())
        elif behaviour == "endless":
            # No Content-Length: the body ends when the connection does, so only the reader's
            # cap stops it. Counts what it managed to send before the collector hung up.
            self.close_connection = True
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.end_headers()
            chunk = b'{"pad": "' + b"x" * 65536
            try:
                for _ in range(1024):  # 64 MiB at most
                    self.wfile.write(chunk)
                    server.bytes_sent += len(chunk)
            except OSError:
                pass
        elif behaviour == "trickle":
            self.close_connection = True
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", "100000")
            self.end_headers()
            try:
                for _ in range(100):
                    self.wfile.write(b" ")
                    self.wfile.flush()
                    server.bytes_sent += 1
                    time.sleep(0.1)
            except OSError:
                pass
        else:
            raise AssertionError(behaviour)


def closed_port_url() -> str:
    """http://127.0.0.1:PORT where PORT was free a moment ago and nothing listens on it."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    return f"http://127.0.0.1:{port}"

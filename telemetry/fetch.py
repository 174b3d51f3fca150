"""HTTP GET of agents' metrics for the collector: keep-alive, a total deadline, a size cap.

Why the standard library's `http.client` and not requests/httpx/urllib3: the collector needs
four things, a per-request total deadline, a bearer header, a hard cap on the body it reads,
and connections kept alive between polls, and http.client gives all of them in ~150 lines
without a new dependency in the worker. Its socket timeout bounds each read, not the
request, so `fetch` re-arms it with the time left before every read, and `Deadlines` lets
the batch's coordinating thread shut a socket down when its owner overruns anyway (an agent
trickling one byte per second would otherwise hold a pool thread for ever).

Connections are pooled per (scheme, host, port) for the life of the worker process: an agent
polled every 10 s keeps one TCP connection (the agent closes idle ones after 120 s). A pooled
connection the agent has closed meanwhile fails on first use; that request is retried once
on a fresh connection, as urllib3 does, and no other error is retried here.
"""

from __future__ import annotations

import contextlib
import http.client
import json
import socket
import ssl
import threading
import time
from collections import defaultdict
from dataclasses import dataclass
from urllib.parse import urlsplit

USER_AGENT = "vgpu-fleet-collector/1"
CHUNK_BYTES = 256 * 1024
# Bytes of an error response kept for the message (the agent's {"error": "..."}).
ERROR_BODY_BYTES = 512


class FetchError(Exception):
    """A poll that produced no usable body; the message is what the agent's admin reads."""


@dataclass(frozen=True)
class Fetched:
    """A body read in full, with the times around it (Unix seconds) to judge the agent's clock."""

    body: bytes
    sent_at: float
    received_at: float
    reused_connection: bool


class ConnectionPool:
    """Idle keep-alive connections by origin; thread-safe. At most `per_origin` idle ones kept."""

    def __init__(self, per_origin: int = 4):
        self.per_origin = per_origin
        self._idle: dict[tuple[str, str, int], list[http.client.HTTPConnection]] = defaultdict(list)
        self._lock = threading.Lock()

    def take(self, origin: tuple[str, str, int]) -> http.client.HTTPConnection | None:
        with self._lock:
            idle = self._idle.get(origin)
            return idle.pop() if idle else None

    def give_back(self, origin: tuple[str, str, int], conn: http.client.HTTPConnection) -> None:
        with self._lock:
            idle = self._idle[origin]
            if len(idle) < self.per_origin:
                idle.append(conn)
                return
        conn.close()

    def clear(self) -> None:
        with self._lock:
            conns = [conn for idle in self._idle.values() for conn in idle]
            self._idle.clear()
        for conn in conns:
            conn.close()


#: The worker process's pool, shared by every batch it runs.
POOL = ConnectionPool()


class Deadlines:
    """In-flight requests and when each must be over; `expire` shuts down the overdue ones."""

    def __init__(self):
        self._active: dict[int, tuple[float, http.client.HTTPConnection]] = {}
        self._lock = threading.Lock()

    def start(self, key: int, deadline: float, conn: http.client.HTTPConnection) -> None:
        with self._lock:
            self._active[key] = (deadline, conn)

    def finish(self, key: int) -> None:
        with self._lock:
            self._active.pop(key, None)

    def expire(self, now: float) -> float | None:
        """Shut down the sockets of requests past their deadline; return the next deadline, if any."""
        with self._lock:
            overdue = [conn for deadline, conn in self._active.values() if deadline <= now]
            upcoming = [deadline for deadline, _ in self._active.values() if deadline > now]
        for conn in overdue:
            sock = conn.sock
            if sock is not None:
                with contextlib.suppress(OSError):
                    sock.shutdown(socket.SHUT_RDWR)
        return min(upcoming, default=None)


def _origin(url: str) -> tuple[tuple[str, str, int], str]:
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise FetchError(f"URL {url!r} is not an http:// or https:// URL")
    try:
        port = parts.port or (443 if parts.scheme == "https" else 80)
    except ValueError:
        raise FetchError(f"URL {url!r} has an invalid port") from None
    path = parts.path or "/"
    if parts.query:
        path += "?" + parts.query
    return (parts.scheme, parts.hostname, port), path


def _connect(origin: tuple[str, str, int], timeout: float) -> http.client.HTTPConnection:
    scheme, host, port = origin
    if scheme == "https":
        return http.client.HTTPSConnection(host, port, timeout=timeout, context=ssl.create_default_context())
    return http.client.HTTPConnection(host, port, timeout=timeout)


def _arm(conn: http.client.HTTPConnection, deadline: float, timeout_s: float) -> None:
    """Give the next socket operation only the time left before the deadline."""
    left = deadline - time.monotonic()
    if left <= 0:
        raise TimeoutError
    conn.timeout = left
    if conn.sock is not None:
        conn.sock.settimeout(left)


def _describe(exc: BaseException, url: str, timeout_s: float, overdue: bool) -> str:
    """A message an admin can act on, for a low-level failure of a request to `url`."""
    if overdue or isinstance(exc, TimeoutError | socket.timeout):
        return f"no complete answer from {url} within {timeout_s:g} s (timeout)"
    if isinstance(exc, ConnectionRefusedError):
        return f"connection refused by {url}: is the agent running and listening there?"
    if isinstance(exc, socket.gaierror):
        return f"cannot resolve the host of {url}: {exc.strerror or exc}"
    if isinstance(exc, ssl.SSLError):
        return f"TLS error talking to {url}: {exc}"
    if isinstance(exc, http.client.RemoteDisconnected | ConnectionResetError | BrokenPipeError):
        return f"{url} closed the connection without answering"
    if isinstance(exc, http.client.HTTPException):
        return f"invalid HTTP response from {url}: {type(exc).__name__} {exc}".rstrip()
    return f"cannot reach {url}: {exc.strerror if isinstance(exc, OSError) and exc.strerror else exc}"


def fetch(
    url: str,
    *,
    token: str,
    timeout_s: float,
    max_bytes: int,
    pool: ConnectionPool = POOL,
    deadlines: Deadlines | None = None,
    key: int = 0,
) -> Fetched:
    """GET `url` with the bearer `token`; return the body if the answer is 200 and at most
    `max_bytes` long, all within `timeout_s`. Raises FetchError with a readable message otherwise.
    """
    origin, path = _origin(url)
    deadline = time.monotonic() + timeout_s
    headers = {
        "Authorization": f"Bearer {token}",
        "Accept": "application/json, text/plain;q=0.9",
        "User-Agent": USER_AGENT,
    }
    conn = pool.take(origin)
    reused = conn is not None
    attempt = 0
    while True:
        attempt += 1
        if conn is None:
            conn = _connect(origin, timeout_s)
        if deadlines is not None:
            deadlines.start(key, deadline, conn)
        keep = False
        try:
            _arm(conn, deadline, timeout_s)
            sent_at = time.time()
            conn.request("GET", path, headers=headers)
            _arm(conn, deadline, timeout_s)
            response = conn.getresponse()
            body = _read_body(conn, response, url, deadline, timeout_s, max_bytes)
            keep = not response.will_close
            return Fetched(body=body, sent_at=sent_at, received_at=time.time(), reused_connection=reused)
        except FetchError:
            raise
        except (http.client.RemoteDisconnected, ConnectionResetError, BrokenPipeError) as exc:
            # A kept-alive connection the agent closed while idle: one retry on a new one.
            if reused and attempt == 1 and time.monotonic() < deadline:
                conn.close()
                conn, reused = None, False
                continue
            raise FetchError(_describe(exc, url, timeout_s, time.monotonic() >= deadline)) from None
        except (OSError, http.client.HTTPException) as exc:
            raise FetchError(_describe(exc, url, timeout_s, time.monotonic() >= deadline)) from None
        finally:
            if deadlines is not None:
                deadlines.finish(key)
            if conn is not None:
                if keep:
                    pool.give_back(origin, conn)
                else:
                    conn.close()


def _read_body(conn, response, url: str, deadline: float, timeout_s: float, max_bytes: int) -> bytes:
    """Read the body within the deadline and the cap; FetchError on a non-200 or oversize answer."""
    if response.status != 200:
        detail = _error_detail(conn, response, deadline, timeout_s)
        hint = ""
        if response.status == 401:
            hint = " (the agent refused our bearer token: write the agent's current token to its token file)"
        raise FetchError(f"HTTP {response.status} {response.reason} from {url}{hint}{detail}")
    length = response.getheader("Content-Length")
    if length and length.isascii() and length.isdigit() and int(length) > max_bytes:
        raise FetchError(
            f"response of {int(length)} bytes from {url} exceeds the limit of {max_bytes} bytes "
            f"(TELEMETRY_MAX_RESPONSE_BYTES)"
        )
    chunks: list[bytes] = []
    size = 0
    while True:
        _arm(conn, deadline, timeout_s)
        chunk = response.read(min(CHUNK_BYTES, max_bytes + 1 - size))
        if not chunk:
            break
        chunks.append(chunk)
        size += len(chunk)
        if size > max_bytes:
            raise FetchError(
                f"response from {url} exceeds the limit of {max_bytes} bytes (TELEMETRY_MAX_RESPONSE_BYTES); "
                f"stopped reading"
            )
    return b"".join(chunks)


def _error_detail(conn, response, deadline: float, timeout_s: float) -> str:
    """': <the agent's error message>' from an error body, or '' if there is none readable."""
    try:
        _arm(conn, deadline, timeout_s)
        raw = response.read(ERROR_BODY_BYTES)
    except (OSError, http.client.HTTPException):
        return ""
    text = raw.decode("utf-8", "replace").strip()
    if text.startswith("{"):
        try:
            document = json.loads(text)
        except ValueError:
            document = None
        if isinstance(document, dict) and isinstance(document.get("error"), str):
            text = document["error"]
    text = " ".join(text.split())[:200]
    return f": {text}" if text else ""

"""The agent's connection handling: one event loop owns every socket, a few workers answer.

Why not the standard library's ThreadingHTTPServer (what the agent used before): it gives each
connection a thread from accept to close, so every idle or trickling socket pins a thread, and
a few hundred sockets that never finish a request (slowloris) hold that many threads for their
whole timeout, a few thousand exhaust the process. Here:

- One thread (the one running `serve_forever`) accepts connections and reads from all of them
  through a `selectors` loop, buffering each request's line, headers and body. A request is
  handed to one of `workers` threads only once it is complete, so an idle or trickling socket
  costs a file descriptor and at most ~36 KB of buffer, never a thread, and a scrape that
  arrives is answered by a free worker however many such sockets are open.
- `request_timeout_s`: a request must be complete within that long of its first byte (of the
  accept, for a new connection); a socket that sends nothing or trickles is then closed
  without an answer. `idle_timeout_s`: how long a keep-alive connection may wait between
  requests; longer than any poll interval, so the collector keeps its connection.
- `max_connections`: when that many are open, accepting one more closes the connection that
  has been waiting longest, idle or still sending its request, never one being answered. An
  attacker's sockets are the oldest, so they go first; a scraper's fresh request is usually
  complete before the next accept, and one whose idle keep-alive connection was closed simply
  reconnects (`telemetry.fetch` retries once on a fresh connection).
- The header block is capped at MAX_HEADER_BYTES and MAX_HEADER_LINES (431; 414 when even the
  request line does not end within the cap). Content-Length must be one decimal number of at
  most MAX_BODY_BYTES (identical repeats, "5, 5", are allowed as RFC 9110 says); anything else
  (a sign, non-ASCII digits, differing values, huge numbers, a malformed header line,
  Transfer-Encoding) is a 400 before any of the body is read, and the connection is closed
  since where the body ends is unknown.
- After answering an error (or whenever a connection is to close), the server stops writing and
  reads and discards what the client still sends for up to LINGER_S before closing (a
  "lingering close"): closing with unread input would reset the connection, and the client
  could lose the 431 or 400 it was sent.
- Workers hand connections back through a queue and a socketpair that wakes the loop; only
  the loop thread touches the selector and the connection table.

Stdlib only: the agent runs on hypervisor hosts without Django (see the package docstring).
"""

from __future__ import annotations

import collections
import contextlib
import email.utils
import http
import http.client
import io
import json
import logging
import queue
import re
import selectors
import socket
import socketserver
import threading
import time
from collections.abc import Iterable
from typing import Any

logger = logging.getLogger(__name__)

MAX_BODY_BYTES = 4096
# A scrape sends ~150 bytes of headers; nginx's default for a whole request header is 8 KiB per
# buffer, Node's 16 KiB.
MAX_HEADER_BYTES = 16 * 1024
MAX_HEADER_LINES = 100  # http.client's own limit on header lines
LINGER_S = 2.0
RECV_BYTES = 16 * 1024
HEADER_END = re.compile(rb"\r?\n\r?\n")
DIGITS = re.compile(r"[0-9]+")
# Without these names anywhere in the block, the request has no body and nothing to check: a
# scrape skips the email parser (~40 us; the handler parses the headers again anyway).
FRAMING_NAMES = re.compile(rb"content-length|transfer-encoding|expect", re.IGNORECASE)
OVERLOAD_LOG_EVERY_S = 60.0


def response_bytes(status: int, body: bytes, headers: Iterable[tuple[str, str]] = (), *, server: str,
                   close: bool, head_only: bool = False) -> bytes:
    """Status line, headers and body as ONE buffer, so a response leaves in one write: with two,
    Nagle holds the second until the client's delayed ACK (~40 ms a keep-alive scrape)."""
    lines = [
        f"HTTP/1.1 {status} {http.HTTPStatus(status).phrase}",
        f"Server: {server}",
        f"Date: {email.utils.formatdate(usegmt=True)}",
        "Content-Type: application/json",
        f"Content-Length: {len(body)}",
        "Cache-Control: no-store",
    ]
    if status == 204:  # no body, and RFC 9110 forbids saying how long it is
        del lines[3:5]
    lines.extend(f"{name}: {value}" for name, value in headers)
    if close:
        lines.append("Connection: close")
    head = ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")
    return head if head_only else head + body


class Refused(Exception):
    """A request refused before it reached a handler: its framing or its size is wrong."""

    def __init__(self, status: int, message: str):
        super().__init__(message)
        self.status = status
        self.message = message


def _shown(value: str) -> str:
    return repr(value if len(value) <= 40 else value[:40] + "...")


def content_length(values: list[str] | None) -> int:
    """The body length that the Content-Length header(s) announce, or Refused(400)."""
    if not values:
        return 0
    raw = ", ".join(values)
    items = [item.strip() for value in values for item in value.split(",")]
    numbers = {item.lstrip("0") or "0" for item in items if DIGITS.fullmatch(item)}
    if len(numbers) != 1 or not all(DIGITS.fullmatch(item) for item in items):
        raise Refused(400, f"Content-Length must be one decimal number of bytes, got {_shown(raw)}")
    (number,) = numbers
    # Compared as text first: int() of a 5,000-digit string raises (sys.int_info's digit limit).
    if len(number) > len(str(MAX_BODY_BYTES)) or int(number) > MAX_BODY_BYTES:
        raise Refused(400, f"Content-Length {_shown(raw)} is over the {MAX_BODY_BYTES}-byte limit of a request body")
    return int(number)


def request_framing(block: bytes) -> tuple[int, bool]:
    """(body length, whether the client waits for 100 Continue) of a complete header block
    (request line included), or Refused(400) when where the body ends is not certain."""
    if FRAMING_NAMES.search(block) is None:
        return 0, False
    headers = http.client.parse_headers(io.BytesIO(block[block.index(b"\n") + 1:]))
    if headers.defects:
        # A line without a colon (or a leading continuation) ends the email parser's headers:
        # what follows, a Content-Length included, would silently be ignored.
        raise Refused(400, "a header line is malformed (every header is 'Name: value')")
    if headers.get("Transfer-Encoding") is not None:
        raise Refused(400, "Transfer-Encoding is not accepted; send the body with a Content-Length")
    length = content_length(headers.get_all("Content-Length"))
    expects = headers.get("Expect", "").strip().lower() == "100-continue"
    return length, expects and length > 0


class _Connection:
    """A client connection while the loop owns it: its unparsed input and when it must be done."""

    __slots__ = ("sock", "address", "buffer", "scanned", "need", "deadline", "started", "draining", "continued")

    def __init__(self, sock: socket.socket, address: Any, deadline: float):
        self.sock = sock
        self.address = address
        self.buffer = bytearray()
        self.scanned = 0  # bytes of `buffer` already searched for the end of the headers
        self.need: int | None = None  # request size once its headers are complete
        self.deadline = deadline
        self.started = False  # a byte of the next request has arrived
        self.draining = False
        self.continued = False  # 100 Continue sent for the current request

    def reset(self) -> None:
        self.scanned, self.need, self.started, self.continued = 0, None, bool(self.buffer), False


class _SocketWriter:
    """The handler's wfile: each write is one sendall (responses are built whole)."""

    def __init__(self, sock: socket.socket):
        self.sock = sock

    def write(self, data: bytes) -> int:
        self.sock.sendall(data)
        return len(data)

    def flush(self) -> None:
        pass


class Exchange:
    """What a worker gives a request handler: the socket to answer on and the request's bytes."""

    def __init__(self, sock: socket.socket, data: bytes):
        self.sock = sock
        self.data = data

    def reader(self) -> io.BytesIO:
        return io.BytesIO(self.data)

    def writer(self) -> _SocketWriter:
        return _SocketWriter(self.sock)


class BoundedHTTPServer(socketserver.TCPServer):
    """An HTTP/1.1 server whose idle and slow connections cost no thread (see the module doc).

    `RequestHandlerClass` is built once per request with an `Exchange` as its request; it must
    leave `close_connection` true when the connection is to close after its answer.
    """

    allow_reuse_address = True
    request_queue_size = socket.SOMAXCONN
    server_version = "bounded-http"

    def __init__(self, address: tuple[str, int], handler: type, *, idle_timeout_s: float = 120.0,
                 request_timeout_s: float = 10.0, max_connections: int = 512, workers: int = 8):
        if max_connections < 1 or workers < 1 or idle_timeout_s <= 0 or request_timeout_s <= 0:
            raise ValueError("max_connections, workers and the timeouts must be positive")
        self.idle_timeout_s = idle_timeout_s
        self.request_timeout_s = request_timeout_s
        self.max_connections = max_connections
        self.workers = workers
        self._waiting: collections.OrderedDict[_Connection, None] = collections.OrderedDict()
        self._busy = 0
        self._jobs: queue.SimpleQueue = queue.SimpleQueue()
        self._returned: collections.deque[tuple[_Connection, bool]] = collections.deque()
        self._return_lock = threading.Lock()
        self._serving = False
        self._stop = False
        self._is_shut_down = threading.Event()
        self._is_shut_down.set()
        self._wake_r, self._wake_w = socket.socketpair()
        self._wake_r.setblocking(False)
        self._wake_w.setblocking(False)
        self._selector: selectors.BaseSelector | None = None
        self._listening = False
        self._next_deadline = float("inf")
        self._evicted = 0
        self._overload_logged_at = float("-inf")
        super().__init__(address, handler)

    @property
    def open_connections(self) -> int:
        """Client connections open now: waiting for a request or being answered."""
        return len(self._waiting) + self._busy

    # -- the loop -------------------------------------------------------------------------------

    def serve_forever(self, poll_interval: float = 0.5) -> None:
        """Serve until `shutdown()`; `poll_interval` bounds how long the loop sleeps at a time."""
        self._is_shut_down.clear()
        self._stop = False
        with self._return_lock:
            self._serving = True
        self.socket.setblocking(False)
        self._selector = selectors.DefaultSelector()
        self._selector.register(self._wake_r, selectors.EVENT_READ, None)
        threads = [threading.Thread(target=self._work, name=f"agent-worker-{n}", daemon=True)
                   for n in range(self.workers)]
        for thread in threads:
            thread.start()
        try:
            while not self._stop:
                self._update_listening()
                now = time.monotonic()
                timeout = min(poll_interval, max(0.0, self._next_deadline - now))
                for key, _ in self._selector.select(timeout):
                    if key.fileobj is self._wake_r:
                        self._drain_wakeups()
                    elif key.fileobj is self.socket:
                        self._accept()
                    elif key.data in self._waiting:  # not evicted by an accept of this same round
                        self._on_readable(key.data)
                self._take_back()
                now = time.monotonic()
                if now >= self._next_deadline:
                    self._expire(now)
        finally:
            with self._return_lock:
                self._serving = False
            for conn in list(self._waiting):
                self._close(conn)
            while self._returned:
                self._returned.popleft()[0].sock.close()
            for _ in threads:
                self._jobs.put(None)
            self._selector.close()
            self._selector = None
            self._listening = False
            self._is_shut_down.set()

    def shutdown(self) -> None:
        """Stop `serve_forever` and wait until it has; call it from another thread."""
        self._stop = True
        self._wake()
        self._is_shut_down.wait()

    def server_close(self) -> None:
        super().server_close()
        self._wake_r.close()
        self._wake_w.close()

    def _wake(self) -> None:
        # Full: the loop is awake anyway; closed: so is the server.
        with contextlib.suppress(OSError):
            self._wake_w.send(b"\0")

    def _drain_wakeups(self) -> None:
        try:
            while self._wake_r.recv(4096):
                pass
        except OSError:
            pass

    def _update_listening(self) -> None:
        """Accept only while a slot is free or one can be freed (some connection is waiting)."""
        want = self.open_connections < self.max_connections or bool(self._waiting)
        if want and not self._listening:
            self._selector.register(self.socket, selectors.EVENT_READ, None)
        elif self._listening and not want:
            self._selector.unregister(self.socket)
        self._listening = want

    def _accept(self) -> None:
        for _ in range(64):  # then let the other sockets have a turn
            if self.open_connections >= self.max_connections and not self._waiting:
                return
            try:
                sock, address = self.get_request()
            except (BlockingIOError, InterruptedError, ConnectionAbortedError):
                return
            except OSError as exc:  # EMFILE and kin: free a descriptor if any is waiting
                logger.warning("cannot accept a connection: %s", exc)
                if self._waiting:
                    self._evict_oldest()
                return
            if self.open_connections >= self.max_connections:
                self._evict_oldest()
            if sock.family in (socket.AF_INET, socket.AF_INET6):
                # Responses leave in one write; without this, Nagle can still hold a short one back.
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            self._watch(_Connection(sock, address, time.monotonic() + self.request_timeout_s))

    def _watch(self, conn: _Connection) -> None:
        conn.sock.setblocking(False)
        self._selector.register(conn.sock, selectors.EVENT_READ, conn)
        self._waiting[conn] = None
        self._next_deadline = min(self._next_deadline, conn.deadline)

    def _close(self, conn: _Connection) -> None:
        del self._waiting[conn]
        self._selector.unregister(conn.sock)
        conn.sock.close()

    def _evict_oldest(self) -> None:
        oldest = next(iter(self._waiting))
        self._close(oldest)
        self._evicted += 1
        now = time.monotonic()
        if now - self._overload_logged_at >= OVERLOAD_LOG_EVERY_S:
            self._overload_logged_at = now
            logger.warning(
                "%d connections open (--max-connections): closing those waiting longest "
                "(%d so far); a client opening many idle connections?", self.open_connections + 1, self._evicted)

    def _expire(self, now: float) -> None:
        expired = [conn for conn in self._waiting if conn.deadline <= now]
        for conn in expired:
            self._close(conn)
        self._next_deadline = min((conn.deadline for conn in self._waiting), default=float("inf"))

    def _on_readable(self, conn: _Connection) -> None:
        try:
            data = conn.sock.recv(RECV_BYTES)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            data = b""
        if not data:
            self._close(conn)
            return
        if conn.draining:
            return
        if not conn.started:
            conn.started = True
            conn.deadline = min(conn.deadline, time.monotonic() + self.request_timeout_s)
            self._next_deadline = min(self._next_deadline, conn.deadline)
        conn.buffer += data
        self._advance(conn)

    def _advance(self, conn: _Connection) -> None:
        """Hand `conn`'s request to a worker if it is complete, refuse it if it cannot be served."""
        if conn.need is None:
            # RFC 9112 2.2: empty lines before a request line are ignored (some clients send
            # one after a body).
            if conn.buffer[:1] in (b"\r", b"\n"):
                conn.buffer = conn.buffer.lstrip(b"\r\n")
                conn.scanned = 0
            found = HEADER_END.search(conn.buffer, max(0, conn.scanned - 3), MAX_HEADER_BYTES + 4)
            conn.scanned = len(conn.buffer)
            if found is None:
                if len(conn.buffer) > MAX_HEADER_BYTES and b"\n" not in conn.buffer[:MAX_HEADER_BYTES]:
                    self._dispatch(conn, Refused(414, f"the request line is over {MAX_HEADER_BYTES} bytes"))
                elif len(conn.buffer) > MAX_HEADER_BYTES or conn.buffer.count(b"\n") - 1 > MAX_HEADER_LINES:
                    self._dispatch(conn, self._headers_too_large())
                return
            block = bytes(conn.buffer[:found.end()])
            if block.count(b"\n") - 2 > MAX_HEADER_LINES:  # less the request line and the blank line
                self._dispatch(conn, self._headers_too_large())
                return
            try:
                length, expects_continue = request_framing(block)
            except Refused as refused:
                self._dispatch(conn, refused)
                return
            conn.need = found.end() + length
            if expects_continue and len(conn.buffer) < conn.need and not conn.continued:
                conn.continued = True
                with contextlib.suppress(OSError):  # the client sends its body after a pause anyway
                    conn.sock.send(b"HTTP/1.1 100 Continue\r\n\r\n")
        if len(conn.buffer) >= conn.need:
            request = bytes(conn.buffer[:conn.need])
            del conn.buffer[:conn.need]
            self._dispatch(conn, request)

    @staticmethod
    def _headers_too_large() -> Refused:
        return Refused(431, f"the request's headers are over {MAX_HEADER_BYTES} bytes or "
                            f"{MAX_HEADER_LINES} lines")

    def _dispatch(self, conn: _Connection, work: bytes | Refused) -> None:
        del self._waiting[conn]
        self._selector.unregister(conn.sock)
        self._busy += 1
        self._jobs.put((conn, work))

    def _take_back(self) -> None:
        """Connections the workers have answered: wait for their next request, or close them."""
        while self._returned:
            conn, keep_alive = self._returned.popleft()
            self._busy -= 1
            now = time.monotonic()
            if keep_alive:
                conn.reset()
                conn.deadline = now + (self.request_timeout_s if conn.buffer else self.idle_timeout_s)
                self._watch(conn)
                if conn.buffer:  # a pipelined request
                    self._advance(conn)
                continue
            try:
                conn.sock.shutdown(socket.SHUT_WR)
            except OSError:
                conn.sock.close()
                continue
            conn.draining, conn.deadline = True, now + LINGER_S
            conn.buffer.clear()
            self._watch(conn)

    # -- the workers ----------------------------------------------------------------------------

    def _work(self) -> None:
        while (job := self._jobs.get()) is not None:
            conn, work = job
            keep_alive = False
            try:
                conn.sock.settimeout(self.request_timeout_s)
                if isinstance(work, Refused):
                    self.log_refused(conn.address, work)
                    conn.sock.sendall(response_bytes(work.status, json.dumps({"error": work.message}).encode(),
                                                     server=self.server_version, close=True))
                else:
                    handler = self.RequestHandlerClass(Exchange(conn.sock, work), conn.address, self)
                    keep_alive = not handler.close_connection
            except OSError:
                pass  # the client went away mid-answer
            except Exception:
                logger.exception("request from %s failed", conn.address)
            with self._return_lock:
                if not self._serving:
                    conn.sock.close()
                    continue
                self._returned.append((conn, keep_alive))
            self._wake()

    def log_refused(self, address: Any, refused: Refused) -> None:
        # Debug, as access logs are: a client sending garbage in a loop must not flood the journal.
        logger.debug("%s refused with %d: %s", address[0] if address else "-", refused.status, refused.message)


__all__ = ["MAX_BODY_BYTES", "MAX_HEADER_BYTES", "MAX_HEADER_LINES", "BoundedHTTPServer", "Exchange", "Refused",
           "response_bytes"]

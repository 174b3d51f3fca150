"""HTTP GET of agents' metrics for the collector, on one asyncio event loop: keep-alive, a total
deadline per agent, a size cap.

Why aiohttp on an event loop, and not threads: a batch of ~50 agents is fetched concurrently,
and each fetch spends its time waiting on a socket. On a pool of threads (http.client, the
previous form of this module) the GIL changed hands at every socket call, and the parsing of
each body shared it with up to 50 threads; on one event loop in the calling thread nothing
changes hands. aiohttp is the maintained asyncio HTTP client with what the collector needs: a
pool of keep-alive connections, TLS, chunked bodies, a C parser of responses. Measured
(docs/benchmarks.md, issue 21 item 1, "Third pass"): fetching and parsing 0.64-0.72 -> 0.50-0.52
ms of CPU a poll; with two collector processes on 2 cores, 789-904 -> 949-1,025 polls/s.

`ConnectionPool` is an event loop with an aiohttp session on it, made once per worker process
(and thread) and kept for its life, so an agent polled every 10 s keeps one TCP connection (the
agent closes idle ones after 120 s). A process forked from one that has polled (Celery's prefork
children) makes its own: a loop and its sockets must never be shared across a fork.

`fetch` bounds each request by a total deadline (an agent trickling one byte per second is cut
off at its timeout, whatever each read gets), refuses a declared Content-Length over the cap
before reading and stops reading at the cap, and turns every failure into a FetchError whose
message the agent's admin reads. A kept-alive connection the agent closed meanwhile fails on
first use: that request is retried once on a fresh connection, and no other failure is retried
here (aiohttp's own retry, which also retries a fresh connection, is off).
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import errno
import functools
import json
import os
import socket
import ssl
import sys
import threading
import time
import weakref
from collections.abc import Coroutine
from dataclasses import dataclass
from typing import Any, TypeVar
from urllib.parse import urlsplit

import aiohttp
import yarl

USER_AGENT = "vgpu-fleet-collector/1"
# Bytes of an error response kept for the message (the agent's {"error": "..."}).
ERROR_BODY_BYTES = 512

T = TypeVar("T")


class FetchError(Exception):
    """A poll that produced no usable body; the message is what the agent's admin reads."""


@dataclass(frozen=True)
class Fetched:
    """A body read in full, with the times around it (Unix seconds) to judge the agent's clock."""

    body: bytes
    sent_at: float
    received_at: float
    reused_connection: bool


# Whether the connection the current request got was kept alive from an earlier request: set by
# `_Connector.connect` in the request's own task, read by `fetch` (each fetch runs in a task).
_reused: contextvars.ContextVar[bool] = contextvars.ContextVar("reused", default=False)


class _Connector(aiohttp.TCPConnector):
    """aiohttp's connector, telling the request whether its connection served an earlier one."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self._served: weakref.WeakSet = weakref.WeakSet()

    async def connect(self, req, traces, timeout):
        connection = await super().connect(req, traces, timeout)
        protocol = connection.protocol
        _reused.set(protocol in self._served)
        self._served.add(protocol)
        return connection


class ConnectionPool:
    """Keep-alive connections to agents (an aiohttp session) and the event loop they live on.

    `run` runs a coroutine on the loop, in the calling thread. The loop and session are made on
    first use; `close` (or the pool's garbage collection) closes them. A pool belongs to the
    process that made it: a forked child must make its own (`current()` does).
    """

    def __init__(self):
        self.pid = os.getpid()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._session: aiohttp.ClientSession | None = None
        self._finalizer: weakref.finalize | None = None

    @classmethod
    def current(cls) -> ConnectionPool:
        """This process's pool for the calling thread, made on first use and kept.

        By thread too: Celery's thread pool (`make run`) runs two batches at once in one
        process, and an event loop runs in one thread at a time. Pools of a parent process stay
        in the registry of a forked child, untouched: dropping them would close the parent's
        loop, whose selector the child shares.
        """
        key = (os.getpid(), threading.get_ident())
        pool = _pools.get(key)
        if pool is None:  # only this thread writes this key: no lock (none to inherit held at a fork)
            pool = _pools[key] = cls()
        return pool

    @property
    def session(self) -> aiohttp.ClientSession:
        if self._session is None:
            raise RuntimeError("the pool's session exists only while it runs a coroutine (ConnectionPool.run)")
        return self._session

    def run(self, coroutine: Coroutine[Any, Any, T]) -> T:
        """Run `coroutine` to its end on this pool's loop, in the calling thread."""
        if os.getpid() != self.pid:
            coroutine.close()
            raise RuntimeError("a connection pool cannot be used in a process forked from its own")
        if self._loop is None:
            self._loop = asyncio.new_event_loop()
            self._session = self._loop.run_until_complete(_new_session())
            self._finalizer = weakref.finalize(self, _close, self.pid, self._loop, self._session)
        task = self._loop.create_task(coroutine)
        try:
            return self._loop.run_until_complete(task)
        except BaseException:
            # Interrupted from outside the loop (the task's soft time limit, a signal): the
            # batch's requests are cancelled now, so they hang up and none resumes in a later run.
            if not task.done():
                task.cancel()
                with contextlib.suppress(BaseException):
                    self._loop.run_until_complete(task)  # raises CancelledError once cancelled
                self._loop.run_until_complete(asyncio.sleep(0))  # the closed sockets' callbacks
            raise

    def close(self) -> None:
        """Close the connections and the loop (a pool used after this opens new ones)."""
        if self._finalizer is not None:
            self._finalizer()
        self._loop = self._session = self._finalizer = None


#: Pools by (process id, thread id). A thread that ends leaves its pool idle here; a later thread
#: given the same id takes it over (a loop may run in any thread, one at a time).
_pools: dict[tuple[int, int], ConnectionPool] = {}


@functools.cache
def tls_context() -> ssl.SSLContext:
    """TLS for https:// agents: verified against the system's CA store (SSL_CERT_FILE or
    SSL_CERT_DIR name another), as ssl.create_default_context() gives. Made once a process:
    loading the store takes ~35 ms."""
    return ssl.create_default_context()


async def _new_session() -> aiohttp.ClientSession:
    connector = _Connector(
        ssl=tls_context(),
        # Concurrency is bounded by the batch (TELEMETRY_POLL_CONCURRENCY), not here.
        limit=0,
        # Idle connections are kept until the agent closes them (after 120 s idle), whatever the
        # poll interval; one it closed meanwhile is retried once (see the module doc).
        keepalive_timeout=None,
        # Aborts TLS connections whose peer never answers our close (CPython before 3.12.8).
        enable_cleanup_closed=sys.version_info < (3, 12, 8),
    )
    session = aiohttp.ClientSession(
        connector=connector,
        # Each fetch has its own deadline (asyncio.timeout_at); none of aiohttp's.
        timeout=aiohttp.ClientTimeout(total=None),
        # The body is read as sent (the request asks for identity, as http.client's did): the size
        # cap applies to what crosses the network; our agent never compresses.
        auto_decompress=False,
        # Neither proxies nor .netrc from the environment: agents are on the studio's network.
        trust_env=False,
    )
    # aiohttp retries any idempotent request once after a reset, on a fresh connection too;
    # `fetch` retries only a kept-alive connection the agent closed.
    session._retry_connection = False
    return session


def _close(pid: int, loop: asyncio.AbstractEventLoop, session: aiohttp.ClientSession) -> None:
    """Close a pool's session and loop, in the process that made them and outside a running loop."""
    if os.getpid() != pid or loop.is_closed() or loop.is_running():
        return
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        pass
    else:  # collected while another loop runs in this thread: cannot run this one now
        return
    loop.run_until_complete(session.close())
    loop.close()


@functools.lru_cache(maxsize=100_000)
def _target(url: str) -> yarl.URL:
    """`url` parsed once (a worker polls the same agents' URLs every interval); FetchError if it is
    not an http(s) URL with a host and a valid port."""
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise FetchError(f"URL {url!r} is not an http:// or https:// URL")
    try:
        parts.port  # noqa: B018 - validates the port
    except ValueError:
        raise FetchError(f"URL {url!r} has an invalid port") from None
    return yarl.URL(url)


def _describe(exc: BaseException, url: str, timeout_s: float) -> str:
    """A message an admin can act on, for a low-level failure of a request to `url`."""
    if isinstance(exc, TimeoutError):
        return f"no complete answer from {url} within {timeout_s:g} s (timeout)"
    cause = exc.os_error if isinstance(exc, aiohttp.ClientConnectorError) else exc
    if isinstance(exc, aiohttp.ClientConnectorCertificateError):
        cause = exc.certificate_error
    if isinstance(cause, ConnectionRefusedError):
        return f"connection refused by {url}: is the agent running and listening there?"
    if isinstance(cause, socket.gaierror):
        return f"cannot resolve the host of {url}: {cause.strerror or cause}"
    if isinstance(cause, ssl.SSLError | ssl.CertificateError):
        return f"TLS error talking to {url}: {cause}"
    if _closed_by_agent(exc):
        return f"{url} closed the connection without answering"
    if isinstance(exc, aiohttp.ClientResponseError):
        return f"invalid HTTP response from {url}: {exc.message}".rstrip()
    if isinstance(exc, aiohttp.ClientPayloadError):
        return f"invalid HTTP response from {url}: {exc}".rstrip()
    if isinstance(cause, OSError) and cause.strerror:
        return f"cannot reach {url}: {cause.strerror}"
    return f"cannot reach {url}: {cause}"


def _closed_by_agent(exc: BaseException) -> bool:
    """Whether `exc` is a connection the agent closed before answering (not a failed connect)."""
    if isinstance(exc, aiohttp.ClientConnectorError):
        return False
    return isinstance(exc, aiohttp.ServerDisconnectedError | ConnectionResetError | BrokenPipeError) or (
        isinstance(exc, OSError) and exc.errno in (errno.ECONNRESET, errno.EPIPE))


async def fetch(
    session: aiohttp.ClientSession, url: str, *, token: str, timeout_s: float, max_bytes: int,
) -> Fetched:
    """GET `url` with the bearer `token`; return the body if the answer is 200 and at most
    `max_bytes` long, all within `timeout_s`. Raises FetchError with a readable message otherwise.
    """
    target = _target(url)
    deadline = asyncio.get_running_loop().time() + timeout_s
    headers = {
        "Authorization": f"Bearer {token}",
        "Accept": "application/json, text/plain;q=0.9",
        "Accept-Encoding": "identity",
        "User-Agent": USER_AGENT,
    }
    try:
        async with asyncio.timeout_at(deadline):  # one timer for the request, the retry and the body
            response, sent_at, reused = await _request(session, target, headers)
            if response.status == 200:
                try:
                    body = await _read_body(response, url, max_bytes)
                except BaseException:
                    response.close()  # hangs up: a body not read to its end leaves nothing to reuse
                    raise
    except TimeoutError:
        raise FetchError(_describe(TimeoutError(), url, timeout_s)) from None
    except (aiohttp.ClientError, OSError) as exc:
        raise FetchError(_describe(exc, url, timeout_s)) from None
    if response.status != 200:
        detail = await _error_detail(response, deadline)
        hint = ""
        if response.status == 401:
            hint = " (the agent refused our bearer token: write the agent's current token to its token file)"
        raise FetchError(f"HTTP {response.status} {response.reason} from {url}{hint}{detail}")
    response.release()  # the connection goes back to the pool (unless the agent said close)
    return Fetched(body=body, sent_at=sent_at, received_at=time.time(), reused_connection=reused)


async def _request(session: aiohttp.ClientSession, target: yarl.URL,
                   headers: dict[str, str]) -> tuple[aiohttp.ClientResponse, float, bool]:
    """(the response, its headers read; when it was sent; whether on a kept-alive connection)."""
    attempt = 0
    while True:
        attempt += 1
        sent_at = time.time()
        _reused.set(False)
        try:
            response = await session.get(target, headers=headers, allow_redirects=False)
        except (aiohttp.ClientError, OSError) as exc:
            # A kept-alive connection the agent closed while idle: one retry on a new one.
            if _reused.get() and attempt == 1 and _closed_by_agent(exc):
                continue
            raise
        return response, sent_at, _reused.get()


async def _read_body(response: aiohttp.ClientResponse, url: str, max_bytes: int) -> bytes:
    """The body of a 200 answer, within the cap; FetchError for an oversize one."""
    length = response.content_length
    if length is not None and length > max_bytes:
        raise FetchError(
            f"response of {length} bytes from {url} exceeds the limit of {max_bytes} bytes "
            f"(TELEMETRY_MAX_RESPONSE_BYTES)"
        )
    if length is not None:  # the parser stops at the declared length, within the cap
        return await response.read()
    chunks: list[bytes] = []
    size = 0
    while chunk := await response.content.readany():
        chunks.append(chunk)
        size += len(chunk)
        if size > max_bytes:
            raise FetchError(
                f"response from {url} exceeds the limit of {max_bytes} bytes "
                f"(TELEMETRY_MAX_RESPONSE_BYTES); stopped reading"
            )
    return b"".join(chunks)


async def _error_detail(response: aiohttp.ClientResponse, deadline: float) -> str:
    """': <the agent's error message>' from an error body, or '' if there is none readable in time.
    Closes the response (a connection that answered an error is not reused)."""
    raw = b""
    try:
        async with asyncio.timeout_at(deadline):
            while len(raw) < ERROR_BODY_BYTES:
                chunk = await response.content.read(ERROR_BODY_BYTES - len(raw))
                if not chunk:
                    break
                raw += chunk
    except (TimeoutError, aiohttp.ClientError, OSError):
        pass
    finally:
        response.close()
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

"""The agent's connection limits over real HTTP on loopback, tried as an attacker would: hundreds
of idle and trickling sockets (slowloris), the connection cap, oversized headers, and every
malformed Content-Length on the scheduler's PUT (telemetry/agent/connections.py)."""

from __future__ import annotations

import contextlib
import http.client
import json
import socket
import threading
import time
from collections.abc import Iterator

import pytest

from telemetry.agent.scenario import build_scenario, poc_scenario
from telemetry.agent.server import AgentServer
from telemetry.agent.sim_backend import SimBackend
from telemetry.tests.loopback import serving
from telemetry.tests.test_agent_scheduler import EQUAL_ARR, READ, UUID, WRITE, scenario
from telemetry.tests.test_agent_server import AUTH, TOKEN, request

WAIT_S = 20.0  # a generous deadline for events, never an upper bound asserted on a duration


@pytest.fixture(autouse=True, scope="module")
def enough_open_files():
    """300 idle sockets are 600 descriptors in this process (both ends): raise a low soft limit."""
    import resource

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    wanted = 4096 if hard == resource.RLIM_INFINITY else min(4096, hard)
    if soft != resource.RLIM_INFINITY and soft < wanted:
        resource.setrlimit(resource.RLIMIT_NOFILE, (wanted, hard))
    assert resource.getrlimit(resource.RLIMIT_NOFILE)[0] >= 1024, "the hard open-file limit is below 1024"
    yield
    resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


@contextlib.contextmanager
def agent(**limits) -> Iterator[AgentServer]:
    """The real agent (sim backend, proof-of-concept host) with the given limits, on loopback."""
    server = AgentServer(("127.0.0.1", 0), SimBackend(poc_scenario()), TOKEN, "test-host", **limits)
    with serving(server) as started:
        yield started


class Attack:
    """Idle sockets of three kinds: silent, half a request line, and slowloris (headers trickled
    one byte every 20 ms for as long as the server keeps the socket)."""

    def __init__(self, address, silent: int, half_line: int, trickling: int):
        self.silent = [socket.create_connection(address) for _ in range(silent)]
        self.half_line = [socket.create_connection(address) for _ in range(half_line)]
        for sock in self.half_line:
            sock.sendall(b"GET /v1/met")
        self.trickling = [socket.create_connection(address) for _ in range(trickling)]
        for sock in self.trickling:
            sock.sendall(b"GET /v1/metrics HTTP/1.1\r\nHost: agent\r\n")
        self.bytes_trickled = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._trickle, daemon=True)
        self._thread.start()

    @property
    def sockets(self) -> list[socket.socket]:
        return self.silent + self.half_line + self.trickling

    def _trickle(self) -> None:
        header = b"X-Slow: " + b"a" * 10_000
        alive = list(self.trickling)
        position = 0
        while alive and not self._stop.wait(0.02):
            byte = header[position % len(header):][:1]
            position += 1
            for sock in list(alive):
                try:
                    sock.send(byte)
                    self.bytes_trickled += 1
                except OSError:  # closed by the server: the point of some tests
                    alive.remove(sock)

    def wait_trickled(self, rounds: int) -> None:
        deadline = time.monotonic() + WAIT_S
        while self.bytes_trickled < rounds * len(self.trickling) and time.monotonic() < deadline:
            time.sleep(0.01)
        assert self.bytes_trickled >= rounds * len(self.trickling)

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)
        for sock in self.sockets:
            sock.close()


@contextlib.contextmanager
def attack(server: AgentServer, silent: int = 100, half_line: int = 100, trickling: int = 100) -> Iterator[Attack]:
    opened = Attack(server.server_address[:2], silent, half_line, trickling)
    try:
        yield opened
    finally:
        opened.close()


def is_open(sock: socket.socket) -> bool:
    """True if the server has neither closed nor reset `sock` (nothing to read, no EOF)."""
    sock.setblocking(False)
    try:
        return sock.recv(1) != b""
    except BlockingIOError:
        return True
    except OSError:
        return False
    finally:
        sock.setblocking(True)


def closed_by_server(sock: socket.socket) -> bool:
    """Waits (up to WAIT_S) for the server to close `sock`: EOF or a reset. False if it stays open."""
    sock.settimeout(WAIT_S)
    try:
        while data := sock.recv(4096):
            assert not data.startswith(b"HTTP/1.1 200"), "an unfinished request was answered"
        return True
    except (ConnectionResetError, BrokenPipeError):
        return True
    except TimeoutError:
        return False


def wait_for(condition, what: str) -> None:
    deadline = time.monotonic() + WAIT_S
    while not condition():
        assert time.monotonic() < deadline, f"still waiting for {what}"
        time.sleep(0.01)


# -- idle sockets --------------------------------------------------------------------------------

def test_a_scrape_is_answered_while_300_idle_and_trickling_sockets_are_open_and_they_cost_no_thread():
    with agent(request_timeout_s=120) as server:
        scraper = http.client.HTTPConnection(*server.server_address[:2], timeout=10)
        scraper.request("GET", "/v1/metrics", headers=AUTH)
        assert scraper.getresponse().read()
        kept = scraper.sock
        threads_before = threading.active_count()
        with attack(server) as idle:
            wait_for(lambda: server.open_connections == 301, "the agent to accept the 300 sockets")
            idle.wait_trickled(rounds=5)

            fresh, payload = request(server, "GET", "/v1/metrics", AUTH)
            scraper.request("GET", "/v1/metrics", headers=AUTH)
            reused = scraper.getresponse()
            reused_payload = json.loads(reused.read())

            assert fresh.status == 200
            assert payload["agent"]["hostname"] == "test-host"
            assert [len(gpu["vgpus"]) for gpu in payload["gpus"]] == [2, 1, 1]
            assert (reused.status, scraper.sock) == (200, kept), "the keep-alive scraper lost its connection"
            assert reused_payload["gpus"][0]["uuid"] == payload["gpus"][0]["uuid"]
            # The attacker's sockets are all still open, and holding them pins no thread of the agent
            # (a thread per connection would have started 300; the attack itself runs one).
            assert [sock for sock in idle.sockets if not is_open(sock)] == []
            assert threading.active_count() - threads_before <= 2
        scraper.close()


def test_sockets_that_never_finish_a_request_are_closed_at_the_request_timeout_even_when_trickling():
    with agent(request_timeout_s=1.5, idle_timeout_s=1.5) as server:
        keep_alive = http.client.HTTPConnection(*server.server_address[:2], timeout=10)
        keep_alive.request("GET", "/healthz")
        assert keep_alive.getresponse().read() == b'{"status": "ok"}'
        with attack(server, silent=20, half_line=20, trickling=20) as idle:
            still_open = [sock for sock in idle.sockets if not closed_by_server(sock)]
            assert still_open == [], f"{len(still_open)} of 60 sockets outlived the request timeout"
            assert idle.bytes_trickled >= 20, "the slowloris sockets were closed before they trickled"
        assert closed_by_server(keep_alive.sock), "an idle keep-alive connection outlived the idle timeout"
        wait_for(lambda: server.open_connections == 0, "the agent to let go of every connection")
        response, _ = request(server, "GET", "/v1/metrics", AUTH)
        assert response.status == 200


def test_at_the_connection_cap_the_longest_waiting_sockets_are_closed_to_make_room():
    with agent(max_connections=20, workers=2, request_timeout_s=120) as server, \
            attack(server, silent=60, half_line=0, trickling=0) as idle:
        oldest, newest = idle.silent[:40], idle.silent[40:]
        assert all(closed_by_server(sock) for sock in oldest)

        response, payload = request(server, "GET", "/v1/metrics", AUTH)

        assert response.status == 200
        assert len(payload["gpus"]) == 3
        # Accepting the scrape closed the one then waiting longest, and nothing else.
        assert closed_by_server(newest[0])
        assert [is_open(sock) for sock in newest[1:]] == [True] * 19


# -- header limits -------------------------------------------------------------------------------

def exchange(server: AgentServer, raw: bytes) -> tuple[int, dict, socket.socket]:
    """Send `raw` on a new connection; (status, JSON body, the still-open client socket)."""
    sock = socket.create_connection(server.server_address[:2], timeout=10)
    sock.sendall(raw)
    response = http.client.HTTPResponse(sock)
    response.begin()
    return response.status, json.loads(response.read()), sock


def metrics_request(*headers: str) -> bytes:
    lines = ["GET /v1/metrics HTTP/1.1", "Host: agent", f"Authorization: Bearer {TOKEN}", *headers]
    return ("\r\n".join(lines) + "\r\n\r\n").encode()


@pytest.mark.parametrize(("raw", "status"), [
    (metrics_request("X-Pad: " + "a" * 70_000), 431),
    (metrics_request(*[f"X-Pad-{n}: " + "a" * 10_000 for n in range(7)]), 431),
    (metrics_request(*[f"X-Header-{n}: {n}" for n in range(200)]), 431),
    (b"GET /v1/metrics?" + b"a" * 20_000 + b" HTTP/1.1\r\nAuthorization: Bearer " + TOKEN.encode() + b"\r\n\r\n", 414),
], ids=["one-70KB-header", "70KB-in-7-headers", "200-header-lines", "20KB-request-line"])
def test_oversized_headers_are_refused_and_the_connection_closed(raw, status):
    with agent() as server:
        got, body, sock = exchange(server, raw)
        assert (got, body) == (status, {"error": body["error"]})
        assert "16384 bytes" in body["error"]
        assert closed_by_server(sock)
        sock.close()
        assert request(server, "GET", "/v1/metrics", AUTH)[0].status == 200


@pytest.mark.parametrize(("raw", "status", "error"), [
    (b"NOT-A-REQUEST\r\n\r\n", 400, "Bad request syntax ('NOT-A-REQUEST')"),
    (b"GET /v1/metrics HTTP/2.0\r\n\r\n", 505, "Invalid HTTP version (2.0)"),
    (b"GET /v1/metrics HTTP/1.x\r\n\r\n", 400, "Bad request version ('HTTP/1.x')"),
], ids=["garbage", "http2", "bad-version"])
def test_a_malformed_request_line_is_answered_in_json_and_the_connection_closed(raw, status, error):
    with agent() as server:
        got, body, sock = exchange(server, raw)
        assert (got, body) == (status, {"error": error})
        assert closed_by_server(sock)
        sock.close()


def test_headers_just_under_the_caps_are_served():
    with agent() as server:
        status, body, sock = exchange(server, metrics_request(*[f"X-Header-{n}: {'a' * 100}" for n in range(90)]))
        sock.close()
    assert status == 200
    assert len(body["gpus"]) == 3


# -- Content-Length --------------------------------------------------------------------------------

def writable_agent():
    raw = scenario()
    backend = SimBackend(build_scenario(raw["hostname"], raw["gpus"]))
    return serving(AgentServer(("127.0.0.1", 0), backend, READ, "h", write_token=WRITE))


def scheduler_put(*framing: str, body: bytes) -> bytes:
    lines = [f"PUT /v1/gpus/{UUID}/scheduler HTTP/1.1", "Host: agent", f"Authorization: Bearer {WRITE}",
             "Content-Type: application/json", *framing]
    return ("\r\n".join(lines) + "\r\n\r\n").encode() + body


def scheduler_policy(server: AgentServer) -> str:
    return json.loads(server.metrics_body())["gpus"][0]["scheduler"]["policy"]


BODY = json.dumps(EQUAL_ARR).encode()


CHUNKED = b"%x\r\n%s\r\n0\r\n\r\n" % (len(BODY), BODY)
BAD_NUMBER = "Content-Length must be one decimal number of bytes, got "


@pytest.mark.parametrize(("framing", "body", "error"), [
    (["Content-Length: abc"], BODY, BAD_NUMBER + "'abc'"),
    (["Content-Length: -1"], BODY, BAD_NUMBER + "'-1'"),
    (["Content-Length: +5"], BODY, BAD_NUMBER + "'+5'"),
    (["Content-Length: 5, 6"], BODY, BAD_NUMBER + "'5, 6'"),
    (["Content-Length: 5", "Content-Length: 6"], BODY, BAD_NUMBER + "'5, 6'"),
    (["Content-Length: 5,"], BODY, BAD_NUMBER + "'5,'"),
    (["Content-Length: "], BODY, BAD_NUMBER + "''"),
    (["Content-Length: ٥"], BODY, BAD_NUMBER),  # an Arabic-Indic five: int() would take it
    (["Content-Length: 1_0"], BODY, BAD_NUMBER + "'1_0'"),  # int() would take this too
    (["Content-Length: 0x10"], BODY, BAD_NUMBER + "'0x10'"),
    (["Content-Length: 99999999999999999999"], BODY,
     "Content-Length '99999999999999999999' is over the 4096-byte limit of a request body"),
    (["Content-Length: " + "9" * 5000], BODY, "Content-Length '" + "9" * 40 + "...' is over the 4096-byte limit"),
    ([f"Content-Length: {len(BODY)}", "Transfer-Encoding: chunked"], CHUNKED,
     "Transfer-Encoding is not accepted; send the body with a Content-Length"),
    (["Transfer-Encoding: chunked"], CHUNKED, "Transfer-Encoding is not accepted"),
    ([f"Content-Length : {len(BODY)}"], BODY, "a header line is malformed"),
    (["Bogus line", f"Content-Length: {len(BODY)}"], BODY, "a header line is malformed"),
], ids=["letters", "negative", "plus", "differing-list", "differing-headers", "trailing-comma", "empty",
        "non-ascii-digit", "underscore", "hex", "huge", "5000-digits", "with-chunked", "chunked",
        "space-before-colon", "line-without-colon"])
def test_a_malformed_content_length_is_400_and_nothing_is_applied(framing, body, error):
    with writable_agent() as server:
        status, answer, sock = exchange(server, scheduler_put(*framing, body=body))
        assert status == 400
        assert answer["error"].startswith(error)
        assert closed_by_server(sock), "the connection stayed open after a request of unknown length"
        sock.close()
        assert scheduler_policy(server) == "best_effort"


def test_a_content_length_repeated_with_the_same_value_is_one_length():
    with writable_agent() as server:
        status, body, sock = exchange(server, scheduler_put(f"Content-Length: {len(BODY)}, {len(BODY)}", body=BODY))
        sock.close()
        assert (status, body["scheduler"]["policy"]) == (200, "equal_share")
        assert scheduler_policy(server) == "equal_share"


def test_a_client_that_waits_for_100_continue_gets_it_and_its_change_applied():
    with writable_agent() as server:
        sock = socket.create_connection(server.server_address[:2], timeout=10)
        sock.sendall(scheduler_put(f"Content-Length: {len(BODY)}", "Expect: 100-continue", body=b""))
        assert sock.recv(4096) == b"HTTP/1.1 100 Continue\r\n\r\n"
        sock.sendall(BODY)
        response = http.client.HTTPResponse(sock)
        response.begin()
        assert (response.status, json.loads(response.read())["scheduler"]["policy"]) == (200, "equal_share")
        sock.close()


# -- keep-alive framing ----------------------------------------------------------------------------

class _Unclosed:
    """One buffered reader shared by successive HTTPResponses (each closes its file when read)."""

    def __init__(self, fp):
        self.fp = fp

    def makefile(self, *args, **kwargs):
        return self

    def __getattr__(self, name):
        return getattr(self.fp, name)

    def close(self):
        pass


def test_a_body_on_a_get_is_not_read_as_the_next_request_and_pipelined_requests_are_answered_in_order():
    with agent() as server:
        sock = socket.create_connection(server.server_address[:2], timeout=10)
        smuggled = b"GET /v1/metrics HTTP/1.1\r\n\r\n"  # no token: must not be served as a request
        sock.sendall(b"GET /healthz HTTP/1.1\r\nContent-Length: %d\r\n\r\n%s" % (len(smuggled), smuggled)
                     + metrics_request())
        stream = _Unclosed(sock.makefile("rb"))
        answers = []
        for _ in range(2):
            response = http.client.HTTPResponse(stream)
            response.begin()
            answers.append((response.status, json.loads(response.read())))
        sock.close()
    assert answers[0] == (200, {"status": "ok"})
    assert answers[1][0] == 200
    assert len(answers[1][1]["gpus"]) == 3

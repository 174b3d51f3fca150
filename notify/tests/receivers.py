"""Real receivers on loopback for the notify tests: an SMTP server (aiosmtpd) that keeps what it
receives, and an HTTP server that records each POST (headers and raw body) and answers with
the statuses it is told to, in turn."""

from __future__ import annotations

import socket
import threading
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from aiosmtpd.controller import Controller

from config.celery import app as celery_app


@dataclass
class Post:
    path: str
    headers: dict[str, str]
    body: bytes


@dataclass
class Receiver:
    """An HTTP receiver: `answers` are the statuses of the next posts (then 200), `posts` what came."""

    url: str
    answers: list[int] = field(default_factory=list)
    posts: list[Post] = field(default_factory=list)


@pytest.fixture
def receiver():
    state = Receiver(url="")

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self):  # noqa: N802 - http.server's name
            body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
            state.posts.append(Post(self.path, dict(self.headers.items()), body))
            code = state.answers.pop(0) if state.answers else 200
            self.send_response(code)
            self.send_header("Content-Type", "text/plain")
            self.end_headers()
            self.wfile.write(b"ok" if code < 300 else b"receiver says no")

        def log_message(self, *args):
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    state.url = f"http://127.0.0.1:{server.server_address[1]}/hook"
    yield state
    server.shutdown()
    server.server_close()


class Inbox:
    """aiosmtpd handler keeping each envelope (sender, recipients, content)."""

    def __init__(self):
        self.envelopes = []

    async def handle_DATA(self, server, session, envelope):  # noqa: N802 - aiosmtpd's name
        self.envelopes.append(envelope)
        return "250 OK"


@pytest.fixture
def smtp(settings):
    """An SMTP server on loopback, and Django's SMTP backend pointed at it."""
    inbox = Inbox()
    with socket.socket() as probe:  # a free port: the controller checks readiness by connecting to it
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    controller = Controller(inbox, hostname="127.0.0.1", port=port)
    controller.start()
    settings.EMAIL_BACKEND = "django.core.mail.backends.smtp.EmailBackend"
    settings.EMAIL_HOST, settings.EMAIL_PORT = "127.0.0.1", port
    settings.EMAIL_HOST_USER, settings.EMAIL_HOST_PASSWORD, settings.EMAIL_USE_TLS = "", "", False
    yield inbox
    controller.stop()


@pytest.fixture
def eager():
    """Celery tasks run where they are sent (the queue itself is not what these tests are about)."""
    celery_app.conf.task_always_eager = True
    yield
    celery_app.conf.task_always_eager = False

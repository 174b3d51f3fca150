"""The dashboard's processes of a fault test (`Stack`), a plain HTTP client of its web server, and
the ORM pointed at the test's private database (`orm_on`)."""

from __future__ import annotations

import contextlib
import http.cookiejar
import json
import urllib.error
import urllib.request
import uuid
from collections.abc import Iterator
from pathlib import Path

import dj_database_url

from faults.services import (
    Child,
    PostgresCluster,
    RedisServer,
    child_env,
    free_port,
    free_ports,
    port_open,
    python,
    wait_for,
)

TEMPLATE_DB = "faults_template"
# Short enough for a test to see several polls; beat's entries expire within it (STYLE.md).
POLL_INTERVAL_S = 2
STALE_AFTER_S = 6


@contextlib.contextmanager
def orm_on(url: str) -> Iterator[None]:
    """Point this process's `default` connection at `url` while the block runs."""
    from django.contrib.contenttypes.models import ContentType
    from django.db import connections
    from django.db.utils import load_backend

    config = connections.configure_settings({"default": dj_database_url.parse(url)})["default"]
    wrapper = load_backend(config["ENGINE"]).DatabaseWrapper(config, "default")
    previous = connections["default"]
    connections["default"] = wrapper
    ContentType.objects.clear_cache()
    try:
        yield
    finally:
        wrapper.close()
        connections["default"] = previous
        ContentType.objects.clear_cache()


class Web:
    """An HTTP client of the gunicorn child: a session cookie or an API token, never a redirect followed."""

    class _NoRedirect(urllib.request.HTTPRedirectHandler):
        def redirect_request(self, *args, **kwargs):
            return None

    def __init__(self, port: int):
        self.base = f"http://127.0.0.1:{port}"
        self.cookies = http.cookiejar.CookieJar()
        self.opener = urllib.request.build_opener(urllib.request.HTTPCookieProcessor(self.cookies), self._NoRedirect)
        self.headers: dict[str, str] = {}

    def request(self, method: str, path: str, body: dict | None = None, timeout_s: float = 30) -> tuple[int, str, dict]:
        """(status, body, headers); an answer that takes longer than `timeout_s` raises (a hang)."""
        data = None if body is None else json.dumps(body).encode()
        headers = {**self.headers, **({"Content-Type": "application/json"} if data else {})}
        req = urllib.request.Request(self.base + path, data=data, method=method, headers=headers)
        try:
            with self.opener.open(req, timeout=timeout_s) as response:
                return response.status, response.read().decode(), dict(response.headers)
        except urllib.error.HTTPError as exc:
            return exc.code, exc.read().decode(), dict(exc.headers)

    def get(self, path: str, timeout_s: float = 30) -> tuple[int, str, dict]:
        return self.request("GET", path, timeout_s=timeout_s)

    def post(self, path: str, body: dict, timeout_s: float = 30) -> tuple[int, str, dict]:
        return self.request("POST", path, body, timeout_s=timeout_s)


class Stack:
    """The dashboard's processes against this test's private database and Redis."""

    def __init__(self, tmp_path: Path, cluster: PostgresCluster, database: str, redis: RedisServer, secret: str):
        self.tmp_path, self.cluster, self.database, self.redis = tmp_path, cluster, database, redis
        self.children: list[Child] = []
        self.agents: dict[str, Child] = {}
        self.manifest = []
        self.web_child: Child | None = None
        self.env = child_env(
            DJANGO_SETTINGS_MODULE="faults.settings", DATABASE_URL=cluster.url(database), REDIS_URL=redis.url,
            CELERY_BROKER_URL=redis.url, SECRET_KEY=secret, AGENT_TOKEN_KEY=secret,
            TELEMETRY_POLL_INTERVAL_S=str(POLL_INTERVAL_S), TELEMETRY_STALE_AFTER_S=str(STALE_AFTER_S),
            # Mail goes to a port where nothing listens: every notification e-mail fails.
            EMAIL_BACKEND="django.core.mail.backends.smtp.EmailBackend", EMAIL_HOST="127.0.0.1",
            EMAIL_PORT=str(free_port()), EMAIL_TIMEOUT="2",
        )

    @property
    def database_url(self) -> str:
        return self.cluster.url(self.database)

    def _start(self, name: str, argv: list[str], ready_marker: str | None) -> Child:
        child = Child(name, argv, self.env, ready_marker)
        self.children.append(child)
        return child

    def start_worker(self) -> Child:
        """A prefork worker like production's (docker-compose), two pool processes."""
        child = self._start("worker", [
            python(), "-m", "celery", "-A", "config", "worker", "--loglevel", "INFO", "--pool", "prefork",
            "--concurrency", "2", "--without-gossip", "--without-mingle",
            "--hostname", f"faults-{uuid.uuid4().hex[:8]}@%h",
        ], " ready.")
        child.wait_ready()
        return child

    def start_beat(self) -> Child:
        child = self._start("beat", [
            python(), "-m", "celery", "-A", "config", "beat", "--loglevel", "INFO",
            "--schedule", str(self.tmp_path / "beat-schedule"),
        ], "beat: Starting")
        child.wait_ready()
        return child

    def start_web(self) -> Web:
        port = free_port()
        child = self._start("web", [
            python(), "-m", "gunicorn", "config.wsgi:application", "--bind", f"127.0.0.1:{port}", "--workers", "1",
            "--timeout", "60", "--error-logfile", "-", "--control-socket", str(self.tmp_path / "gunicorn.ctl"),
        ], "Booting worker")
        child.wait_ready()
        assert wait_for(lambda: port_open(port), 30), child.output
        self.web_child = child
        return Web(port)

    def write_agents(self, hosts) -> None:
        """Scenario and token files and an Agent row per host (`demo_agents`), on consecutive free ports."""
        from telemetry import demo

        self.manifest = demo.write_demo_agents(hosts, out_dir=self.tmp_path / "agents",
                                               base_port=free_ports(len(hosts)))

    def start_agent(self, name: str) -> Child:
        """The real agent, simulated backend (`python -m telemetry.agent --backend sim`)."""
        agent = next(a for a in self.manifest if a.name == name)
        child = Child(f"agent {name}", [
            python(), "-m", "telemetry.agent", "--listen", agent.listen, "--token-file", agent.token_file,
            "--backend", "sim", "--scenario", agent.scenario,
        ], self.env)
        self.children.append(child)
        self.agents[name] = child
        port = int(agent.listen.rsplit(":", 1)[1])
        assert wait_for(lambda: port_open(port), 30), child.output
        return child

    def stop_agent(self, name: str) -> None:
        agent = self.agents.pop(name)
        agent.stop()
        port = int(next(a for a in self.manifest if a.name == name).listen.rsplit(":", 1)[1])
        assert wait_for(lambda: not port_open(port), 10)

    def outputs(self) -> str:
        return "\n\n".join(f"--- {c.name} ---\n{c.output}" for c in self.children)

    def stop(self) -> None:
        for child in reversed(self.children):
            child.stop()



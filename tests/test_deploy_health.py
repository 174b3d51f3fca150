"""The container health checks of docker-compose.yml (config/health.py): beat turns unhealthy
when its frequent entries stop running, web when /healthz does not answer 200."""

from __future__ import annotations

import threading
from datetime import timedelta
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from django.db import OperationalError
from django.utils import timezone

import config.urls
from config.health import main, stale_beat_entries, web_problem
from fleet.beat import ensure_periodic_task
from telemetry.schedules import POLL_AGENTS


@pytest.fixture
def poll_entry(db):
    """The agent poll entry; every other default entry (rollups...) ran just now."""
    from django_celery_beat.models import PeriodicTask

    entry, _ = ensure_periodic_task(POLL_AGENTS, "telemetry.tasks.poll_agents", 10)
    PeriodicTask.objects.exclude(pk=entry.pk).update(last_run_at=timezone.now())
    return entry


def test_beat_is_healthy_while_the_poll_entry_runs(poll_entry):
    poll_entry.last_run_at = timezone.now() - timedelta(seconds=200)
    poll_entry.save()
    assert stale_beat_entries(max_age_s=420) == []


def test_beat_is_unhealthy_when_the_poll_entry_stopped_or_never_ran(poll_entry, capsys):
    poll_entry.last_run_at = timezone.now() - timedelta(minutes=30)
    poll_entry.save()
    assert stale_beat_entries(max_age_s=420) == [POLL_AGENTS]
    assert main(["beat"]) == 1
    assert f"beat sent none of {POLL_AGENTS} in the last 420 s" in capsys.readouterr().err
    poll_entry.last_run_at = None
    poll_entry.save()
    assert stale_beat_entries(max_age_s=420) == [POLL_AGENTS]


def test_disabled_and_rare_entries_do_not_make_beat_unhealthy(poll_entry):
    poll_entry.last_run_at = timezone.now() - timedelta(days=1)
    poll_entry.enabled = False
    poll_entry.save()
    ensure_periodic_task("weekly-report", "telemetry.tasks.poll_agents", 7 * 86400)  # never ran: not due yet
    assert stale_beat_entries(max_age_s=420) == []


class Healthz(BaseHTTPRequestHandler):
    """/healthz of a web container: 200 for the allowed host, 400 (as Django) for another."""

    def do_GET(self):  # noqa: N802 - http.server's name
        ok = self.headers["Host"] == "fleet.example"
        body = b'{"status": "ok"}' if ok else b"Bad Request (400)"
        self.send_response(200 if ok else 400)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


def test_web_check_asks_for_the_first_allowed_host_and_reports_a_refusal(monkeypatch):
    server = ThreadingHTTPServer(("127.0.0.1", 0), Healthz)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        monkeypatch.setenv("ALLOWED_HOSTS", "fleet.example,localhost")
        assert web_problem(server.server_port, timeout_s=5) is None
        monkeypatch.setenv("ALLOWED_HOSTS", "other.example")
        assert web_problem(server.server_port, timeout_s=5) == "/healthz answered HTTP 400: Bad Request (400)"
    finally:
        server.shutdown()
        server.server_close()


class UnreachableDatabase:
    """`django.db.connection` while PostgreSQL refuses us, as psycopg words it."""

    reason = ('connection to server at "db.studio.internal" (10.20.0.5), port 5432 failed: FATAL:  '
              'password authentication failed for user "fleet"')

    def cursor(self):
        raise OperationalError(self.reason)


def test_healthz_tells_anonymous_callers_only_that_the_database_is_unreachable(client, monkeypatch, caplog):
    """Anyone may call /healthz: the driver's error names the database's host and user, so it goes
    to the log for the operator, and the caller learns only that the database is unreachable."""
    monkeypatch.setattr(config.urls, "connection", UnreachableDatabase())

    with caplog.at_level("WARNING", logger="config.urls"):
        response = client.get("/healthz")

    assert response.status_code == 503
    assert response.json() == {"status": "error", "database": "unreachable"}
    assert "db.studio.internal" not in response.content.decode()
    assert f"healthz: database unreachable (OperationalError: {UnreachableDatabase.reason})" in caplog.text

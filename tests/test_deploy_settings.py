"""Production settings: DEBUG is off unless the environment says true, `check --deploy` passes
with no warning, HTTPS is enforced in production and plain http keeps working in development
(DEBUG=true, as `make run` sets it), the content security policy is on everywhere, secrets come
from the environment or *_FILE paths, and no secret reaches a log.

Production settings are read once per process, so those tests start `manage.py` or a short
Python script in a subprocess with the production environment."""

from __future__ import annotations

import json
import os
import re
import secrets
import subprocess
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
from django.core.exceptions import ImproperlyConfigured

from config.secrets import env_secret
from identity.tests.oidc_support import unreachable_env

ROOT = Path(__file__).resolve().parents[1]
SECRET_ENV = ("SECRET_KEY", "DATABASE_URL", "DATABASE_REPLICA_URL", "POSTGRES_PASSWORD", "REDIS_URL",
              "CELERY_BROKER_URL", "AGENT_TOKEN_KEY", "EMAIL_HOST_PASSWORD", "METRICS_TOKEN")


def production_env(tmp_path: Path, **extra: str) -> dict[str, str]:
    """The environment of a production process: no DEBUG (off by default), a 50-character secret
    key, one host, SQLite in `tmp_path` and the embedded broker, unless `extra` says otherwise."""
    env = {k: v for k, v in os.environ.items()
           if k.removesuffix("_FILE") not in SECRET_ENV and not k.startswith(("SECURE_", "DJANGO_"))
           and k != "DEBUG"}
    env.update(SECRET_KEY=secrets.token_urlsafe(48)[:50], ALLOWED_HOSTS="fleet.example",
               SQLITE_PATH=str(tmp_path / "prod.sqlite3"), CELERY_QUEUE_DIR=str(tmp_path / "queue"),
               PYTHONPATH=str(ROOT), DJANGO_SETTINGS_MODULE="config.settings")
    env.update(extra)
    return {k: v for k, v in env.items() if v is not None}


def run(args: list[str], env: dict[str, str], timeout_s: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run(args, cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout_s)


def manage(env: dict[str, str], *args: str) -> subprocess.CompletedProcess:
    return run([sys.executable, "manage.py", *args], env)


# What a production process answers over the test client, as JSON on stdout.
PROBE = """
import json, os, django
django.setup()
from django.conf import settings
from django.test import Client
from django.test.utils import override_settings
# pages name their static files; the manifest of collectstatic (built into the image) is not here
override_settings(STORAGES={"staticfiles": {
    "BACKEND": "django.contrib.staticfiles.storage.StaticFilesStorage"}}).enable()
client = Client(HTTP_HOST=os.environ.get("PROBE_HOST", "fleet.example"))
out = {"debug": settings.DEBUG}
for name, kwargs in {"http": {}, "https": {"secure": True},
                     "forwarded": {"HTTP_X_FORWARDED_PROTO": "https"}}.items():
    r = client.get("/login/", **kwargs)
    out[name] = {"status": r.status_code, "location": r.headers.get("Location"),
                 "hsts": r.headers.get("Strict-Transport-Security"),
                 "csp": r.headers.get("Content-Security-Policy"), "frame": r.headers.get("X-Frame-Options"),
                 "nosniff": r.headers.get("X-Content-Type-Options"), "referrer": r.headers.get("Referrer-Policy"),
                 "csrf_cookie_secure": bool(r.cookies["csrftoken"]["secure"]) if "csrftoken" in r.cookies else None}
out["healthz"] = client.get("/healthz").status_code
print(json.dumps(out))
"""


def probe(env: dict[str, str]) -> dict:
    result = run([sys.executable, "-c", PROBE], env)
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout.strip().splitlines()[-1])


# --- check --deploy ----------------------------------------------------------------------------

def test_production_settings_pass_check_deploy_with_no_warning(tmp_path):
    result = manage(production_env(tmp_path), "check", "--deploy", "--fail-level", "WARNING")
    assert result.returncode == 0, result.stdout + result.stderr
    assert "System check identified no issues" in result.stdout


def test_switching_https_off_in_production_is_reported_by_check_deploy(tmp_path):
    env = production_env(tmp_path, SECURE_SSL_REDIRECT="false", SECURE_HSTS_SECONDS="0")
    result = manage(env, "check", "--deploy", "--fail-level", "WARNING")
    assert result.returncode != 0
    assert "security.W008" in result.stderr  # SECURE_SSL_REDIRECT
    assert "security.W004" in result.stderr  # HSTS


def test_production_with_openid_connect_passes_check_deploy(tmp_path):
    """OIDC on in a production process (its session renewal among production's middleware, the
    client secret from a file): the deploy check passes, and the https login page's policy lets
    its forms' redirects go on to the provider."""
    secret = tmp_path / "oidc_client_secret"
    secret.write_text("from-a-file\n")
    env = production_env(tmp_path, **unreachable_env(OIDC_RP_CLIENT_SECRET=None,
                                                      OIDC_RP_CLIENT_SECRET_FILE=str(secret)))
    result = manage(env, "check", "--deploy", "--fail-level", "WARNING")
    assert result.returncode == 0, result.stdout + result.stderr
    directives = dict(part.strip().split(" ", 1) for part in probe(env)["https"]["csp"].split(";") if part.strip())
    assert directives["form-action"] == "'self' http://127.0.0.1:9"  # directives come in any order


def test_production_without_secret_key_refuses_to_start(tmp_path):
    result = manage(production_env(tmp_path, SECRET_KEY=None), "check")
    assert result.returncode != 0
    assert "SECRET_KEY must be set when DEBUG is off" in result.stderr


# --- DEBUG: off unless set to a true value -------------------------------------------------------

# Imports the settings and prints DEBUG as JSON, or the error that stopped the import.
SHOW_DEBUG = """
import json
from django.core.exceptions import ImproperlyConfigured
try:
    from config.settings import DEBUG
except ImproperlyConfigured as exc:
    DEBUG = str(exc)
print(json.dumps(DEBUG))
"""


@pytest.mark.parametrize(("value", "debug"), [
    (None, False), ("", False), ("0", False), ("false", False), ("no", False), ("off", False), ("FALSE", False),
    ("1", True), ("true", True), ("yes", True), ("on", True), ("True", True),
    ("maybe", "DEBUG='maybe' is not a boolean (use true or false)"),
    ("2", "DEBUG='2' is not a boolean (use true or false)"),
    ("ture", "DEBUG='ture' is not a boolean (use true or false)"),
])
def test_debug_is_off_unless_set_to_a_true_value(tmp_path, value, debug):
    result = run([sys.executable, "-c", SHOW_DEBUG], production_env(tmp_path, DEBUG=value))
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout.strip().splitlines()[-1]) == debug


def test_a_deployment_that_sets_no_debug_runs_as_production(tmp_path):
    """Nothing said about DEBUG: https enforced, secure cookies, and no start without a secret key."""
    answers = probe(production_env(tmp_path))
    assert answers["debug"] is False
    assert answers["http"]["status"] == 301
    assert answers["https"]["csrf_cookie_secure"] is True
    result = manage(production_env(tmp_path, SECRET_KEY=None), "check")
    assert result.returncode != 0
    assert "SECRET_KEY must be set when DEBUG is off" in result.stderr


def test_a_bad_debug_value_stops_start_up_with_a_clear_message(tmp_path):
    result = manage(production_env(tmp_path, DEBUG="maybe"), "check")
    assert result.returncode != 0
    assert "DEBUG='maybe' is not a boolean (use true or false)" in result.stderr


def test_debug_true_serves_the_demo_on_plain_http_without_a_secret_key(tmp_path):
    """What `make run` and `make serve` start (the Makefile sets DEBUG=true and nothing else)."""
    env = production_env(tmp_path, DEBUG="true", SECRET_KEY=None, ALLOWED_HOSTS=None, PROBE_HOST="127.0.0.1")
    answers = probe(env)
    assert answers["debug"] is True
    http = answers["http"]
    assert http["status"] == 200
    assert http["hsts"] is None
    assert http["csrf_cookie_secure"] is False
    assert "script-src 'self'" in http["csp"]


# --- session limits -------------------------------------------------------------------------------

# Imports the settings and prints the session limits as JSON, or the error that stopped the import.
SHOW_SESSIONS = """
import json
from django.core.exceptions import ImproperlyConfigured
try:
    from config import settings
    seen = [settings.SESSION_IDLE_TIMEOUT_MINUTES, settings.SESSION_MAX_AGE_HOURS, settings.SESSION_COOKIE_AGE]
except ImproperlyConfigured as exc:
    seen = str(exc)
print(json.dumps(seen))
"""


@pytest.mark.parametrize(("idle", "lifetime", "seen"), [
    (None, None, [480, 168, 7 * 24 * 3600]),  # a working day's pause, a week
    ("30", "12", [30, 12, 12 * 3600]),
    ("720", "12", [720, 12, 12 * 3600]),  # idle as long as the lifetime: only the lifetime ends it
    ("0", None, "SESSION_IDLE_TIMEOUT_MINUTES=0 must be 1 or more"),
    (None, "-3", "SESSION_MAX_AGE_HOURS=-3 must be 1 or more"),
    ("8h", None, "SESSION_IDLE_TIMEOUT_MINUTES='8h' is not a whole number"),
    ("721", "12", "SESSION_IDLE_TIMEOUT_MINUTES=721 is longer than a session may last (SESSION_MAX_AGE_HOURS=12, "
                  "720 minutes): lower it or raise SESSION_MAX_AGE_HOURS"),
    (None, "4", "SESSION_IDLE_TIMEOUT_MINUTES=480 is longer than a session may last (SESSION_MAX_AGE_HOURS=4, "
                "240 minutes): lower it or raise SESSION_MAX_AGE_HOURS"),
])
def test_session_limits_are_read_checked_and_set_the_cookies_age(tmp_path, idle, lifetime, seen):
    env = production_env(tmp_path, SESSION_IDLE_TIMEOUT_MINUTES=idle, SESSION_MAX_AGE_HOURS=lifetime)
    result = run([sys.executable, "-c", SHOW_SESSIONS], env)
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout.strip().splitlines()[-1]) == seen


def test_a_bad_session_limit_stops_start_up_with_its_message(tmp_path):
    result = manage(production_env(tmp_path, SESSION_MAX_AGE_HOURS="0"), "check")
    assert result.returncode != 0
    assert "SESSION_MAX_AGE_HOURS=0 must be 1 or more" in result.stderr


# --- .env.example and docker-compose.yml ----------------------------------------------------------

# Development-only variables (SQLite, the embedded broker), and those docker-compose.yml sets
# itself from other variables (DEBUG, DATABASE_URL, REDIS_URL): not passed through from .env.
NOT_PASSED_BY_COMPOSE = {"SQLITE_PATH", "SQLITE_TEST_PATH", "CELERY_QUEUE_DIR", "CELERY_BROKER_URL"}


def documented_variables() -> set[str]:
    text = (ROOT / ".env.example").read_text()
    return set(re.findall(r"^([A-Z][A-Z0-9_]+)=", text, flags=re.MULTILINE))


def test_every_variable_the_settings_read_is_documented_in_env_example():
    read = set(re.findall(r'env_\w+\(\s*"([A-Z][A-Z0-9_]+)"', (ROOT / "config" / "settings.py").read_text()))
    directory = (ROOT / "config" / "directory.py").read_text()  # the LDAP settings, read on their own
    read |= set(re.findall(r'(?:environ\.get|_bool|_number|env_secret)\(\s*"([A-Z][A-Z0-9_]+)"', directory))
    read |= {f"{name}_FILE" for name in re.findall(r'env_secret\(\s*"([A-Z][A-Z0-9_]+)"', directory)}
    assert {"SECRET_KEY", "SECURE_HSTS_SECONDS", "POSTGRES_PASSWORD", "AUTH_LDAP_SERVER_URI",
            "AUTH_LDAP_BIND_PASSWORD_FILE"} <= read
    assert sorted(read - documented_variables()) == []


def test_docker_compose_passes_every_documented_variable_to_the_containers():
    compose = (ROOT / "docker-compose.yml").read_text()
    missing = [name for name in sorted(documented_variables() - NOT_PASSED_BY_COMPOSE)
               if not re.search(rf"\b{name}\b", compose)]
    assert missing == []


# --- HTTPS and headers --------------------------------------------------------------------------

def test_production_redirects_to_https_and_sends_hsts_secure_cookies_and_headers(tmp_path):
    answers = probe(production_env(tmp_path))
    assert answers["http"]["status"] == 301
    assert answers["http"]["location"] == "https://fleet.example/login/"
    https = answers["https"]
    assert https["status"] == 200
    assert https["hsts"] == "max-age=31536000; includeSubDomains; preload"
    assert https["csrf_cookie_secure"] is True
    assert https["frame"] == "DENY"
    assert https["nosniff"] == "nosniff"
    assert https["referrer"] == "same-origin"
    assert "script-src 'self'" in https["csp"]
    # X-Forwarded-Proto is not trusted unless the deployment says a proxy sets it
    assert answers["forwarded"]["status"] == 301
    # container health probes speak plain http inside the network
    assert answers["healthz"] in (200, 503)


def test_forwarded_proto_is_trusted_when_the_proxy_is_declared_and_hsts_is_configurable(tmp_path):
    env = production_env(tmp_path, SECURE_PROXY_SSL_HEADER="true", SECURE_HSTS_SECONDS="3600",
                         SECURE_HSTS_INCLUDE_SUBDOMAINS="false", SECURE_HSTS_PRELOAD="false")
    forwarded = probe(env)["forwarded"]
    assert forwarded["status"] == 200
    assert forwarded["hsts"] == "max-age=3600"


def test_development_serves_plain_http_under_the_content_security_policy(client):
    response = client.get("/login/")
    assert response.status_code == 200
    assert "Strict-Transport-Security" not in response.headers
    policy = dict(part.strip().split(" ", 1) for part in response.headers["Content-Security-Policy"].split(";"))
    assert policy["script-src"] == "'self'"  # no inline script, no eval, no nonce unless a page uses one
    assert policy["default-src"] == "'self'"
    assert policy["frame-ancestors"] == "'none'"
    assert "<script>" not in response.content.decode()


def test_api_docs_run_their_start_up_script_by_nonce_only(admin_client):
    response = admin_client.get("/api/docs/")
    assert response.status_code == 200
    policy = response.headers["Content-Security-Policy"]
    nonce = policy.split("'nonce-")[1].split("'")[0]
    html = response.content.decode()
    assert f'<script nonce="{nonce}">' in html
    assert "SwaggerUIBundle({" in html
    assert "'unsafe-inline'" not in policy.split("script-src")[1].split(";")[0]


# --- secrets from *_FILE ------------------------------------------------------------------------

def test_env_secret_reads_the_file_and_strips_one_trailing_newline(tmp_path, monkeypatch):
    path = tmp_path / "key"
    path.write_text("  s3cret with spaces \n")
    monkeypatch.delenv("DEPLOY_TEST_SECRET", raising=False)
    monkeypatch.setenv("DEPLOY_TEST_SECRET_FILE", str(path))
    assert env_secret("DEPLOY_TEST_SECRET") == "  s3cret with spaces "


def test_env_secret_falls_back_to_the_variable_then_the_default(monkeypatch):
    monkeypatch.delenv("DEPLOY_TEST_SECRET_FILE", raising=False)
    monkeypatch.delenv("DEPLOY_TEST_SECRET", raising=False)
    assert env_secret("DEPLOY_TEST_SECRET", "fallback") == "fallback"
    monkeypatch.setenv("DEPLOY_TEST_SECRET", "from-env")
    assert env_secret("DEPLOY_TEST_SECRET", "fallback") == "from-env"


def test_env_secret_refuses_both_the_variable_and_the_file(tmp_path, monkeypatch):
    path = tmp_path / "key"
    path.write_text("one")
    monkeypatch.setenv("DEPLOY_TEST_SECRET", "two")
    monkeypatch.setenv("DEPLOY_TEST_SECRET_FILE", str(path))
    with pytest.raises(ImproperlyConfigured, match="DEPLOY_TEST_SECRET and DEPLOY_TEST_SECRET_FILE are both set"):
        env_secret("DEPLOY_TEST_SECRET")


def test_env_secret_names_a_missing_or_empty_file(tmp_path, monkeypatch):
    monkeypatch.delenv("DEPLOY_TEST_SECRET", raising=False)
    missing = tmp_path / "nope"
    monkeypatch.setenv("DEPLOY_TEST_SECRET_FILE", str(missing))
    with pytest.raises(ImproperlyConfigured, match=f"DEPLOY_TEST_SECRET_FILE={missing}: cannot read the file "
                                                   r"\(No such file or directory\)"):
        env_secret("DEPLOY_TEST_SECRET")
    empty = tmp_path / "empty"
    empty.write_text("\n")
    monkeypatch.setenv("DEPLOY_TEST_SECRET_FILE", str(empty))
    with pytest.raises(ImproperlyConfigured, match="the file is empty"):
        env_secret("DEPLOY_TEST_SECRET")


SHOW_SECRETS = """
import json, django
django.setup()
from django.conf import settings
print(json.dumps({"secret_key": settings.SECRET_KEY, "db_password": settings.DATABASES["default"]["PASSWORD"],
                  "broker": settings.CELERY_BROKER_URL, "agent_key": settings.AGENT_TOKEN_KEY,
                  "mail": settings.EMAIL_HOST_PASSWORD, "metrics": settings.METRICS_TOKEN,
                  "replica_password": settings.DATABASES["replica"]["PASSWORD"]}))
"""


def test_every_secret_of_a_deployment_can_come_from_a_file(tmp_path):
    values = {name: f"{name.lower()}-{secrets.token_hex(8)}" for name in
              ("SECRET_KEY", "POSTGRES_PASSWORD", "AGENT_TOKEN_KEY", "EMAIL_HOST_PASSWORD", "METRICS_TOKEN")}
    values["DATABASE_URL"] = "postgres://fleet@db:5432/fleet"
    values["REDIS_URL"] = f"redis://:{secrets.token_hex(8)}@redis:6379/0"
    replica_password = secrets.token_hex(8)
    values["DATABASE_REPLICA_URL"] = f"postgres://fleet:{replica_password}@db-replica:5432/fleet"
    files = {}
    for name, value in values.items():
        (tmp_path / name).write_text(value + "\n")
        files[f"{name}_FILE"] = str(tmp_path / name)
    env = production_env(tmp_path, **files)
    del env["SECRET_KEY"]
    result = run([sys.executable, "-c", SHOW_SECRETS], env)
    assert result.returncode == 0, result.stderr
    seen = json.loads(result.stdout)
    assert seen == {"secret_key": values["SECRET_KEY"], "db_password": values["POSTGRES_PASSWORD"],
                    "broker": values["REDIS_URL"], "agent_key": values["AGENT_TOKEN_KEY"],
                    "mail": values["EMAIL_HOST_PASSWORD"], "metrics": values["METRICS_TOKEN"],
                    "replica_password": replica_password}


def test_a_secret_set_twice_stops_start_up_with_a_clear_message(tmp_path):
    (tmp_path / "key").write_text("x" * 50)
    result = manage(production_env(tmp_path, SECRET_KEY_FILE=str(tmp_path / "key")), "check")
    assert result.returncode != 0
    assert "SECRET_KEY and SECRET_KEY_FILE are both set: set only one of them" in result.stderr


# --- no secret in a log -------------------------------------------------------------------------

TRIGGER_LOGS = """
import logging, django
django.setup()
from django.conf import settings
from django.test import Client
from django.views.debug import get_default_exception_reporter_filter
log = logging.getLogger("deploy-test")
# what an error page or error mail shows of the settings
log.error("settings: %s", get_default_exception_reporter_filter().get_safe_settings())
# the health check with the database down: its answer and whatever it logs
response = Client(HTTP_HOST="fleet.example").get("/healthz")
log.error("healthz %s %s", response.status_code, response.content.decode())
# a database error in a request (a sign-in), as the server logs it
response = Client(HTTP_HOST="fleet.example", raise_request_exception=False).post(
    "/login/", {"username": "admin", "password": "wrong"}, secure=True)
log.error("sign-in %s", response.status_code)
"""


def secrets_under_test(tmp_path: Path) -> tuple[dict[str, str], list[str]]:
    """A production environment whose every secret is set (some in files) with a database
    and a broker that refuse connections; and the secret values to look for."""
    db_password = "dbpw-" + secrets.token_hex(8)
    replica_password = "replicapw-" + secrets.token_hex(8)
    redis_password = "redispw-" + secrets.token_hex(8)
    file_secrets = {"AGENT_TOKEN_KEY": "agentkey-" + secrets.token_hex(8),
                    "EMAIL_HOST_PASSWORD": "mailpw-" + secrets.token_hex(8)}
    env = production_env(
        tmp_path, LOG_LEVEL="DEBUG", METRICS_TOKEN="metrics-" + secrets.token_hex(8),
        DATABASE_URL=f"postgres://fleet:{db_password}@127.0.0.1:1/fleet",
        DATABASE_REPLICA_URL=f"postgres://fleet:{replica_password}@127.0.0.1:1/fleet",
        REDIS_URL=f"redis://:{redis_password}@127.0.0.1:1/0",
    )
    for name, value in file_secrets.items():
        (tmp_path / name).write_text(value)
        env[f"{name}_FILE"] = str(tmp_path / name)
    values = [env["SECRET_KEY"], db_password, replica_password, redis_password, env["METRICS_TOKEN"],
              *file_secrets.values()]
    return env, values


def test_database_failures_and_error_reports_log_no_secret(tmp_path):
    env, values = secrets_under_test(tmp_path)
    result = run([sys.executable, "-c", TRIGGER_LOGS], env)
    migrate = manage(env, "migrate", "--noinput")
    logs = result.stdout + result.stderr + migrate.stdout + migrate.stderr
    assert result.returncode == 0, logs
    # the failures did happen and were logged
    assert "healthz 503" in logs
    assert re.search(r"sign-in 50[03]", logs)
    assert re.search(r"(Internal Server Error: |database unavailable, answered 503 to POST )/login/", logs)
    assert migrate.returncode != 0
    assert "port 1 failed" in migrate.stderr
    assert "'DATABASE_URL': '********************'" in logs
    assert "'DATABASE_REPLICA_URL': '********************'" in logs
    for value in values:
        assert value not in logs


def test_the_worker_logs_no_broker_password_when_the_broker_is_down(tmp_path):
    env, values = secrets_under_test(tmp_path)
    worker = subprocess.Popen([sys.executable, "-m", "celery", "-A", "config", "worker", "--pool=solo",
                               "--without-heartbeat", "--without-mingle", "--without-gossip"],
                              cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    lines = []
    # Stop reading at the first connection error (the worker then retries forever), or if it exits.
    timer = threading.Timer(180, worker.kill)
    timer.start()
    try:
        for line in worker.stdout:
            lines.append(line)
            if "Cannot connect to redis" in line:
                break
    finally:
        timer.cancel()
        worker.kill()
        lines.extend(worker.stdout.readlines())
        worker.wait()
    logs = "".join(lines)
    assert "Cannot connect to redis://:**@127.0.0.1:1/0" in logs
    for value in values:
        assert value not in logs


class RefusingAgent(BaseHTTPRequestHandler):
    """An agent that refuses the token it is sent (HTTP 401), remembering what it received."""

    received: list[str] = []

    def do_GET(self):  # noqa: N802 - http.server's name
        RefusingAgent.received.append(self.headers.get("Authorization", ""))
        body = b'{"error": "invalid token"}'
        self.send_response(401)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


@pytest.mark.django_db
def test_a_failed_agent_poll_logs_the_url_but_never_the_token(caplog, settings):
    from telemetry.models import Agent
    from telemetry.tasks import poll_batch

    settings.AGENT_TOKEN_KEY = "agent-key-" + secrets.token_hex(8)
    server = ThreadingHTTPServer(("127.0.0.1", 0), RefusingAgent)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        url = f"http://127.0.0.1:{server.server_port}"
        agent = Agent.objects.create(name="render-01-agent", url=url, timeout_s=5)
        with caplog.at_level("DEBUG"):
            poll_batch([agent.pk])
    finally:
        server.shutdown()
        server.server_close()
    token = RefusingAgent.received[-1].removeprefix("Bearer ")
    assert len(token) >= 32
    agent.refresh_from_db()
    assert "agent render-01-agent: HTTP 401" in caplog.text
    assert url in caplog.text
    for text in (caplog.text, agent.last_error):
        assert token not in text
        assert settings.AGENT_TOKEN_KEY not in text

"""OpenID Connect in the tests: the real test provider (identity/tests/oidc_provider/) started
once per test process, the product's settings and URLs with OIDC on, and a person going through
the provider's sign-in without a browser (the browser tests do it in Chromium).

A pytest plugin (the root conftest.py lists it): its fixtures serve identity/tests and the
security tests in tests/.
"""

from __future__ import annotations

import importlib
import os
import runpy
import secrets
import select
import subprocess
import sys
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from unittest import mock
from urllib.parse import urljoin, urlsplit

import pytest
import requests
from django.conf import settings
from django.test.utils import override_settings
from django.urls import clear_url_caches

ROOT = Path(__file__).resolve().parents[2]
#: The product's settings that config/settings.py derives from the OIDC variables, besides OIDC_*.
DERIVED = ("MIDDLEWARE", "AUTHENTICATION_BACKENDS", "CONTENT_SECURITY_POLICY", "LOGIN_REDIRECT_URL_FAILURE",
           "AXES_WHITELIST_CALLABLE")
ADMINS, ARTISTS = "fleet-admins", "fleet-artists"
DISPLAY_NAME = "Studio SSO"
PASSWORD = "provider-pass-123"
START_TIMEOUT_S = 60


# --- the product with OIDC on ---------------------------------------------------------------------


def oidc_settings(env: Mapping[str, str]) -> dict:
    """The settings config/settings.py makes with the variables `env` set: its OIDC_* names and
    the ones it changes for OIDC (DERIVED), computed by running it, so the tests get exactly
    what a deployment with this environment gets."""
    with mock.patch.dict(os.environ, env):
        computed = runpy.run_path(str(ROOT / "config" / "settings.py"), run_name="config.settings")
    return {name: value for name, value in computed.items() if name.startswith("OIDC_") or name in DERIVED}


def reload_urls() -> None:
    """config/urls.py read again: it includes the /oidc/ routes only while OIDC is on."""
    clear_url_caches()
    importlib.reload(importlib.import_module(settings.ROOT_URLCONF))
    clear_url_caches()


@contextmanager
def oidc_enabled(env: Mapping[str, str]) -> Iterator[dict]:
    """The product as configured by the OIDC variables `env`, settings and URLs, until the end of
    the block; yields the OIDC settings. A test client or live server made inside it runs the
    middleware of these settings (a handler reads MIDDLEWARE when it is made)."""
    overrides = oidc_settings(env)
    try:
        with override_settings(**overrides):
            reload_urls()
            yield overrides
    finally:
        reload_urls()


def unreachable_env(**extra: str) -> dict[str, str]:
    """OIDC variables of a provider at a closed loopback port: the routes, the login page and the
    settings work; a token exchange fails to connect."""
    base = "http://127.0.0.1:9/realms/studio/protocol/openid-connect"
    return {"OIDC_RP_CLIENT_ID": "fleet", "OIDC_RP_CLIENT_SECRET": "secret",
            "OIDC_OP_AUTHORIZATION_ENDPOINT": f"{base}/auth", "OIDC_OP_TOKEN_ENDPOINT": f"{base}/token",
            "OIDC_OP_USER_ENDPOINT": f"{base}/userinfo", "OIDC_OP_JWKS_ENDPOINT": f"{base}/certs",
            "OIDC_ADMIN_GROUP": ADMINS, "OIDC_ARTIST_GROUPS": f"{ARTISTS},lookdev", "OIDC_DISPLAY_NAME": DISPLAY_NAME,
            **extra}


# --- the provider -----------------------------------------------------------------------------------


@dataclass
class Provider:
    """The running test provider: its address (host `localhost`), the dashboard's client, and the
    token of its user management."""

    url: str
    client_id: str
    client_secret: str
    admin_token: str
    log: Path

    def env(self, **extra: str) -> dict[str, str]:
        """The dashboard's OIDC variables for this provider, as docs/operations.md has them set."""
        return {"OIDC_RP_CLIENT_ID": self.client_id, "OIDC_RP_CLIENT_SECRET": self.client_secret,
                "OIDC_OP_AUTHORIZATION_ENDPOINT": f"{self.url}/o/authorize/",
                "OIDC_OP_TOKEN_ENDPOINT": f"{self.url}/o/token/", "OIDC_OP_USER_ENDPOINT": f"{self.url}/o/userinfo/",
                "OIDC_OP_JWKS_ENDPOINT": f"{self.url}/o/.well-known/jwks.json", "OIDC_ADMIN_GROUP": ADMINS,
                "OIDC_ARTIST_GROUPS": f"{ARTISTS},lookdev", "OIDC_DISPLAY_NAME": DISPLAY_NAME, **extra}

    def put_user(self, username: str, *, groups: tuple[str, ...] = (), email: str = "", first_name: str = "",
                 last_name: str = "", password: str = PASSWORD) -> str:
        """Create or update a user of the provider, as IT does in its console; returns their `sub`."""
        response = requests.put(f"{self.url}/testing/users/{username}", timeout=10,
                                headers={"Authorization": f"Bearer {self.admin_token}"},
                                json={"password": password, "email": email, "first_name": first_name,
                                      "last_name": last_name, "groups": list(groups)})
        response.raise_for_status()
        return response.json()["sub"]


@pytest.fixture(scope="session")
def oidc_provider(tmp_path_factory) -> Iterator[Provider]:
    """The test provider in a process of its own, for the whole test process (each xdist worker
    has its own): a fresh database, a fresh signing key, a free port."""
    folder = tmp_path_factory.mktemp("oidc-provider")
    client_id, client_secret, admin_token = "vgpu-fleet", secrets.token_urlsafe(24), secrets.token_urlsafe(24)
    env = {k: v for k, v in os.environ.items() if k != "DJANGO_SETTINGS_MODULE"}
    env["PYTHONPATH"] = str(ROOT)
    log = folder / "provider.log"
    with open(log, "w") as stderr:
        process = subprocess.Popen(
            [sys.executable, "-m", "identity.tests.oidc_provider", "--db", str(folder / "provider.sqlite3"),
             f"--client-id={client_id}", f"--client-secret={client_secret}", f"--admin-token={admin_token}",
             # The test client's host, and the live servers' loopback address (any port: RFC 8252).
             "--redirect-uri", "http://testserver/oidc/callback/", "--redirect-uri", "http://127.0.0.1/oidc/callback/"],
            cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=stderr, text=True)
    try:
        port = _port_of(process, log)
        provider = Provider(f"http://localhost:{port}", client_id, client_secret, admin_token, log)
        _wait_for(f"{provider.url}/o/.well-known/openid-configuration", process, log)
        yield provider
    finally:
        process.terminate()
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def _port_of(process: subprocess.Popen, log: Path) -> int:
    ready, _, _ = select.select([process.stdout], [], [], START_TIMEOUT_S)
    line = process.stdout.readline() if ready else ""
    if not line.startswith("port "):
        process.kill()
        pytest.fail(f"the test OIDC provider did not start: {line!r}\n{log.read_text()[-3000:]}")
    return int(line.split()[1])


def _wait_for(url: str, process: subprocess.Popen, log: Path) -> None:
    deadline = time.monotonic() + START_TIMEOUT_S
    while time.monotonic() < deadline and process.poll() is None:
        try:
            if requests.get(url, timeout=2).status_code == 200:
                return
        except requests.ConnectionError:
            pass
        time.sleep(0.05)
    pytest.fail(f"the test OIDC provider does not answer {url}\n{log.read_text()[-3000:]}")


# --- a person at the provider, without a browser -------------------------------------------------


@dataclass
class Person:
    """Someone's browser as far as the provider sees it (its cookies), and their password there."""

    username: str
    password: str = PASSWORD
    session: requests.Session | None = None

    def __post_init__(self):
        self.session = self.session or requests.Session()

    def at_provider(self, url: str) -> str:
        """Follow the dashboard's redirect `url` at the provider, signing in on its login page when
        it asks, to where the provider sends the browser back; returns that URL (the callback)."""
        response = self.session.get(url, allow_redirects=False, timeout=10)
        location = urljoin(url, response.headers.get("Location", ""))
        if response.status_code == 302 and urlsplit(location).path == "/accounts/login/":
            self.session.get(location, timeout=10)
            response = self.session.post(location, timeout=10, allow_redirects=False, data={
                "username": self.username, "password": self.password,
                "csrfmiddlewaretoken": self.session.cookies["provider_csrftoken"]})
            assert response.status_code == 302, f"the provider refused {self.username}'s password"
            response = self.session.get(urljoin(location, response.headers["Location"]), allow_redirects=False,
                                        timeout=10)
        assert response.status_code == 302, f"the provider answered {response.status_code}: {response.text[:300]}"
        return urljoin(url, response.headers["Location"])


def back_at_dashboard(client, callback_url: str):
    """The test client's request of the provider's redirect back to the dashboard."""
    parts = urlsplit(callback_url)
    return client.get(f"{parts.path}?{parts.query}")


def sign_in_through(client, person: Person, next_path: str = "/"):
    """`person` signs in to the dashboard (`client`, a test client) through the provider: the
    dashboard's button, the provider's login page, the callback. Returns the callback's response."""
    response = client.get("/oidc/authenticate/", {"next": next_path})
    assert response.status_code == 302, response
    return back_at_dashboard(client, person.at_provider(response["Location"]))

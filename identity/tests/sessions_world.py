"""What the session tests share: a Monday morning, browsers signed in through the sign-in form,
and the messages the sign-in page shows after a session ended."""

from __future__ import annotations

from datetime import UTC, datetime

from django.test import Client

T0 = datetime(2026, 3, 2, 9, 0, tzinfo=UTC)  # a Monday morning
PASSWORD = "pass-word-123"  # UserFactory's
OFFICE = "10.1.0.15"
FIREFOX = "Mozilla/5.0 (X11; Linux x86_64; rv:128.0) Gecko/20100101 Firefox/128.0"
IDLE = "You were signed out after 8 hours without activity."
LIFETIME = "Your session reached its 7-day limit; sign in again."
#: What htmx sends when the overview polls on its own (static/js/polling.js adds the last header).
POLL = {"HTTP_HX_REQUEST": "true", "HTTP_X_FLEET_POLL": "1", "HTTP_HX_CURRENT_URL": "http://testserver/"}


def sign_in(username: str, addr: str = OFFICE, agent: str = FIREFOX) -> Client:
    """A browser signed in through the sign-in form."""
    client = Client(REMOTE_ADDR=addr, HTTP_USER_AGENT=agent)
    response = client.post("/login/", {"username": username, "password": PASSWORD})
    assert response.status_code == 302, response.content.decode()
    return client


def signed_in(client: Client) -> bool:
    return client.get("/me/").status_code == 200


def sent_to_sign_in_saying(client: Client, response, message: str) -> bool:
    """Whether the response sends the browser to the sign-in page, and that page shows `message`."""
    location = response.get("HX-Redirect") or response.get("Location") or ""
    return location.startswith("/login/") and message in client.get(location).content.decode()

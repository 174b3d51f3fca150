"""The page and the API answer while the database is unreachable, in-process (the real outage is
in test_postgres_restart.py): a 503 that says what happened, with a retry hint, no traceback."""

from __future__ import annotations

import pytest
from django.db import OperationalError

REFUSED = 'connection failed: connection to server at "127.0.0.1", port 5432 failed: Connection refused'


@pytest.fixture
def unreachable(monkeypatch):
    """Every query fails as it does while PostgreSQL is down."""

    def refuse(*args, **kwargs):
        raise OperationalError(REFUSED)

    def cut():
        monkeypatch.setattr("django.db.backends.utils.CursorWrapper.execute", refuse)
        monkeypatch.setattr("django.db.backends.utils.CursorWrapper.executemany", refuse)

    return cut


@pytest.mark.django_db
def test_a_page_that_cannot_reach_the_database_answers_503_with_a_retry_hint(client, admin_user, unreachable, caplog):
    client.force_login(admin_user)
    unreachable()
    response = client.get("/hosts/")
    assert response.status_code == 503
    assert response["Retry-After"] == "30"
    body = response.content.decode()
    assert "Temporarily unavailable" in body
    assert "cannot reach its database right now (it may be restarting)" in body
    assert "Traceback" not in body
    assert REFUSED not in body  # the server's address stays in the server log
    assert "database unavailable, answered 503 to GET /hosts/: connection failed" in caplog.text


@pytest.mark.django_db
def test_an_api_call_that_cannot_reach_the_database_answers_503_in_json(admin_api, unreachable):
    unreachable()
    response = admin_api.get("/api/v1/hosts/")
    assert response.status_code == 503
    assert response.json() == {"detail": "The dashboard cannot reach its database right now (it may be "
                                          "restarting). Try again in a minute."}


@pytest.mark.django_db
def test_other_errors_are_not_reported_as_an_outage(client, admin_user, monkeypatch):
    client.force_login(admin_user)
    client.raise_request_exception = False

    def broken(*args, **kwargs):
        raise ValueError("a bug, not an outage")

    monkeypatch.setattr("django.db.backends.utils.CursorWrapper.execute", broken)
    assert client.get("/hosts/").status_code == 500

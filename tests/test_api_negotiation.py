"""The API's answer follows each request's format and Accept header, though the renderer chosen
for a header is kept per process (config/api/negotiation.py): JSON, indented JSON, the browsable
page, CSV, and a refusal, each the same on the second request as on the first, whatever came
between; headers past what is kept are negotiated each time."""

from __future__ import annotations

import pytest

from config.api import negotiation
from fleet.tests.factories import HostFactory

pytestmark = pytest.mark.django_db

HOSTS = "/api/v1/hosts/"


@pytest.fixture(autouse=True)
def nothing_kept(monkeypatch):
    monkeypatch.setattr(negotiation, "_chosen", {})


def kinds(admin_api) -> list[tuple[int, str, bool]]:
    """Status, content type and whether the body is indented, for each way of asking."""
    answers = [admin_api.get(HOSTS, HTTP_ACCEPT="application/json"),
               admin_api.get(HOSTS, HTTP_ACCEPT="application/json; indent=4"),
               admin_api.get(HOSTS, HTTP_ACCEPT="text/html"),
               admin_api.get(HOSTS + "?format=csv", HTTP_ACCEPT="*/*"),
               admin_api.get(HOSTS, HTTP_ACCEPT="image/png"),
               admin_api.get(HOSTS + "?format=xml"),
               admin_api.get(HOSTS)]
    return [(answer.status_code, answer.get("Content-Type", ""), b'\n    "' in answer.content) for answer in answers]


def test_each_way_of_asking_gets_its_own_answer_the_second_time_too(admin_api):
    HostFactory(name="render-01")

    first = kinds(admin_api)
    again = kinds(admin_api)

    assert first == again
    assert first == [
        (200, "application/json", False),
        (200, "application/json", True),
        (200, "text/html; charset=utf-8", False),
        (200, "text/csv; charset=utf-8", False),
        (406, "application/json", False),
        (404, "application/json", False),
        (200, "application/json", False),
    ]


def test_headers_past_what_is_kept_are_still_answered_by_what_they_ask(admin_api, monkeypatch):
    monkeypatch.setattr(negotiation, "MAX_KEPT", 2)
    for n in range(5):
        assert admin_api.get(HOSTS, HTTP_ACCEPT=f"application/json; indent={n + 1}").content.startswith(b"{\n")
    assert len(negotiation._chosen) == 2
    assert admin_api.get(HOSTS, HTTP_ACCEPT="text/html")["Content-Type"].startswith("text/html")
    assert admin_api.get(HOSTS, HTTP_ACCEPT="application/json").content.startswith(b'{"')


@pytest.mark.parametrize("query", ["?format=csv", "?form%61t=csv", "?limit=5&format=csv", "?format=csv&format=json"])
def test_a_format_in_the_query_string_is_read_however_it_is_spelled(admin_api, query):
    HostFactory(name="render-01")
    answer = admin_api.get(HOSTS + query, HTTP_ACCEPT="*/*")
    assert answer["Content-Type"].startswith("text/csv" if query != "?format=csv&format=json" else "application/json")

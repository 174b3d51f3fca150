"""Request body limits (config/body_limits.py): a page form, API JSON or multipart body over
DATA_UPLOAD_MAX_MEMORY_SIZE is refused with 413 and a message naming the limit, before the
server reads it or checks who is asking; a body under the limit goes through as before."""

from __future__ import annotations

import json

import pytest
from django.test import Client

from fleet.models import Host

pytestmark = pytest.mark.django_db

LIMIT = 1024 * 1024
MESSAGE = ("The request body is larger than 1048576 bytes, the most this server accepts "
           "(DATA_UPLOAD_MAX_MEMORY_SIZE).")


def test_the_limit_is_set_deliberately(settings):
    assert settings.DATA_UPLOAD_MAX_MEMORY_SIZE == LIMIT
    assert settings.FILE_UPLOAD_MAX_MEMORY_SIZE == LIMIT


def test_an_oversize_json_body_is_413_with_the_limit_in_the_message(staff):
    body = json.dumps({"name": "h" * LIMIT, "cpu_threads": 8, "ram_gib": 64})

    response = staff.post("/api/v1/hosts/", body, content_type="application/json")

    assert response.status_code == 413
    assert response.json() == {"detail": MESSAGE}
    assert not Host.objects.exists()


def test_an_oversize_page_form_is_413_in_plain_text(staff):
    response = staff.post("/scheduler/", {"note": "x" * (LIMIT + 1)})

    assert response.status_code == 413
    assert response["Content-Type"].startswith("text/plain")
    assert response.content.decode().strip() == MESSAGE


def test_an_oversize_file_part_is_refused_too(staff, tmp_path):
    """Django leaves file parts out of DATA_UPLOAD_MAX_MEMORY_SIZE; the API parses multipart."""
    upload = tmp_path / "big.bin"
    upload.write_bytes(b"\0" * (LIMIT + 1))
    with upload.open("rb") as handle:
        response = staff.post("/api/v1/hosts/", {"name": "h1", "attachment": handle})

    assert response.status_code == 413
    assert response.json() == {"detail": MESSAGE}


def test_an_anonymous_oversize_body_is_refused_before_the_sign_in_check():
    response = Client().post("/login/", {"username": "u" * (LIMIT + 1), "password": "p"})

    assert response.status_code == 413


def test_a_body_under_the_limit_goes_through(staff):
    body = json.dumps({"name": "render-01", "cpu_model": "x" * 50, "cpu_threads": 64, "ram_gib": 512})
    padded = body[:-1] + ", " + json.dumps({"_": " " * (LIMIT - len(body) - 20)})[1:]
    assert len(padded.encode()) < LIMIT

    response = staff.post("/api/v1/hosts/", padded, content_type="application/json")

    assert response.status_code == 201, response.content[:300]

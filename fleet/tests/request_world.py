"""A resize request filed through the API, for the tests of requests in every app."""

import pytest

from fleet.models import ResizeRequest
from fleet.tests.factories import profile

URL = "/api/v1/resize-requests/"


@pytest.fixture
def filed(fleet_world, artist_api, django_capture_on_commit_callbacks):
    """Ana's request for a 24Q; the e-mails queued on commit are sent (mail.outbox)."""
    body = {"vm": fleet_world.vm_a.pk, "requested_profile": profile("RTX6000-24Q").pk, "reason": "big scenes"}
    with django_capture_on_commit_callbacks(execute=True):
        response = artist_api.post(URL, body, format="json")
    assert response.status_code == 201, response.json()
    return ResizeRequest.objects.get(pk=response.json()["id"])


@pytest.fixture
def admin_with_mail(admin_user):
    admin_user.email = "admin@example.com"
    admin_user.save()
    return admin_user

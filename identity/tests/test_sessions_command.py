"""`manage.py signout_user USERNAME`: an admin at the console signs a user out of every browser."""

from __future__ import annotations

from io import StringIO

import pytest
from django.core.management import CommandError, call_command

from fleet.models import AuditEvent
from identity.tests.sessions_world import signed_in

pytestmark = pytest.mark.django_db


def test_signout_user_ends_the_sessions_and_says_how_many(studio):
    ana, _, browsers = studio
    out = StringIO()

    call_command("signout_user", "ana", stdout=out)

    assert out.getvalue() == "Signed ana out everywhere: 2 sessions ended.\n"
    assert not signed_in(browsers["desk"])
    assert not signed_in(browsers["laptop"])
    assert signed_in(browsers["bob"])
    event = AuditEvent.objects.get(action="user.sign_out_everywhere")
    assert (event.actor_name, event.source, event.comment) == ("system", "system", "manage.py signout_user")

    call_command("signout_user", "ana", "--reason", "laptop stolen", stdout=out)
    assert out.getvalue().endswith("ana had no active session; nothing to end.\n")


def test_signout_user_names_an_unknown_user(db):
    with pytest.raises(CommandError, match="No user named 'nobody'."):
        call_command("signout_user", "nobody")

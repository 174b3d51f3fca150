"""Fixtures of the identity tests."""

from __future__ import annotations

from datetime import timedelta

import pytest

from fleet.tests.factories import UserFactory
from identity.tests.sessions_world import T0, sign_in


@pytest.fixture
def clock(time_machine):
    """Time stands at T0 until a test moves it (`clock.shift`)."""
    time_machine.move_to(T0, tick=False)
    return time_machine


@pytest.fixture
def ana(db):
    return UserFactory(username="ana")


@pytest.fixture
def boss(db):
    return UserFactory(username="boss", is_staff=True, is_superuser=True)


@pytest.fixture
def studio(clock):
    """Ana signed in at her desk and on her laptop, Bob at his desk, and an admin's browser, ten
    minutes ago: (ana, bob, browsers by name)."""
    UserFactory(username="admin", is_staff=True, is_superuser=True)
    ana, bob = UserFactory(username="ana"), UserFactory(username="bob")
    browsers = {"desk": sign_in("ana", addr="10.1.0.15"), "laptop": sign_in("ana", addr="10.9.8.7", agent="Safari"),
                "bob": sign_in("bob"), "admin": sign_in("admin", addr="10.1.0.2")}
    clock.shift(timedelta(minutes=10))
    return ana, bob, browsers

"""Fixtures shared by every app's tests."""

import pytest
from rest_framework.test import APIClient

from fleet.tests.factories import ArtistFactory, UserFactory


@pytest.fixture(autouse=True)
def _fast_password_hasher(settings):
    """MD5 instead of PBKDF2 for test users: factories give every user a password, and the
    production hasher is slow on purpose (~0.25 s a user)."""
    settings.PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]


#: The tests' own cache: this process's memory, never the folder a running `make run` shares.
TEST_CACHES = {"default": {"BACKEND": "django.core.cache.backends.locmem.LocMemCache", "KEY_PREFIX": "tests",
                           "OPTIONS": {"MAX_ENTRIES": 5000}}}


@pytest.fixture(autouse=True)
def _empty_read_cache(settings):
    """Each test starts with an empty read cache of its own: a test's rows are rolled back without
    a write the cache could see, so the next test's reads must not find entries computed from them."""
    from config import read_cache

    settings.CACHES = TEST_CACHES
    read_cache.clear()


@pytest.fixture
def admin_user(db):
    return UserFactory(username="admin", is_staff=True, is_superuser=True)


@pytest.fixture
def artist(db):
    return ArtistFactory(user=UserFactory(username="ana"), name="Ana Artist")


@pytest.fixture
def staff(client, admin_user):
    """The test client signed in as an admin (the pages)."""
    client.force_login(admin_user)
    return client


@pytest.fixture
def api():
    """An API client with nobody logged in."""
    return APIClient()


@pytest.fixture
def admin_api(admin_user):
    client = APIClient()
    client.force_authenticate(admin_user)
    return client


@pytest.fixture
def artist_api(artist):
    client = APIClient()
    client.force_authenticate(artist.user)
    return client

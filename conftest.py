"""Fixtures shared by every app's tests, and the two tiers of the suite.

Tiers: a test is `slow` when it starts services of its own (faults/: PostgreSQL, Redis, worker
and agents; e2e/: a browser on the live server; a real Celery worker or `runfleet`), runs
subprocesses of the product, or generates its cases (Hypothesis, schemathesis, the walks over
every URL, form and changelist with bad input or every role); every other test is fast. The
marker is given here, by path and by kind, not in each file: `make test-fast` runs
`-m "not slow"`, `make test` runs both tiers together in parallel workers (pytest-xdist).
"""

import pytest
from rest_framework.test import APIClient

from fleet.tests.factories import ArtistFactory, UserFactory

#: Test files (or folders, ending in /) of the slow tier, relative to the repository root.
SLOW_PATHS = (
    "e2e/",
    "faults/",
    "fleet/tests/test_api_fuzz.py",
    "fleet/tests/test_deploy_settings.py",
    "fleet/tests/test_placement_properties.py",
    "fleet/tests/test_security_bad_input.py",
    "fleet/tests/test_security_matrix.py",
    "sizing/tests/test_optimizer_exact.py",
    "sizing/tests/test_optimizer_properties.py",
    "telemetry/tests/test_demo_agents.py",
    "telemetry/tests/test_worker.py",
)


def _is_slow(item: pytest.Item) -> bool:
    path = item.nodeid.split("::", 1)[0]
    if any(path.startswith(slow) if slow.endswith("/") else path == slow for slow in SLOW_PATHS):
        return True
    return getattr(getattr(item, "obj", None), "is_hypothesis_test", False)


def pytest_collection_modifyitems(config, items):
    """Mark the slow tier (before `-m` deselects), and keep the fault tests on one xdist worker:
    they share one private PostgreSQL cluster per worker process. `--dist loadgroup` hands out
    the largest group first, so the longest stretch of work does not start last."""
    for item in items:
        if _is_slow(item):
            item.add_marker(pytest.mark.slow)
        if item.nodeid.startswith("faults/"):
            item.add_marker(pytest.mark.xdist_group("faults"))


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

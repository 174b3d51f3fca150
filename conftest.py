"""Fixtures shared by every app's tests, the dashboard's and the whole-product tests in tests/,
and the two tiers of the suite. This file sits above the apps, so a fixture here may build rows
of any of them.

Tiers: a test is `slow` when it starts services of its own (faults/: PostgreSQL, Redis, worker
and agents; e2e/: a browser on the live server; a real Celery worker or `runfleet`), runs
subprocesses of the product, or generates its cases (Hypothesis, schemathesis, the walks over
every URL, form and changelist with bad input or every role); every other test is fast. The
marker is given here, by path and by kind, not in each file: `make test-fast` runs
`-m "not slow"`, `make test` runs both tiers together in parallel workers (pytest-xdist).
"""

from types import SimpleNamespace

import pytest
from kombu.exceptions import OperationalError
from rest_framework.test import APIClient

from fleet import services
from fleet.tests.factories import (
    BUS,
    ArtistFactory,
    GpuFactory,
    HostFactory,
    UserFactory,
    VirtualMachineFactory,
    profile,
)

#: Fixture modules of one app that tests of other apps use too.
pytest_plugins = ["fleet.tests.request_world", "hypervisors.tests.fixtures", "hypervisors.tests.worlds",
                  "notify.tests.receivers", "identity.tests.slapd", "identity.tests.oidc_support"]

#: Test files (or folders, ending in /) of the slow tier, relative to the repository root.
SLOW_PATHS = (
    "dashboard/tests/test_demo.py",
    "e2e/",
    "faults/",
    "fleet/tests/test_placement_properties.py",
    "hypervisors/tests/test_end_to_end_libvirt.py",
    "hypervisors/tests/test_end_to_end_proxmox.py",
    "hypervisors/tests/test_end_to_end_vsphere.py",
    "hypervisors/tests/test_libvirt_backend.py",
    "hypervisors/tests/test_vsphere.py",
    "identity/tests/test_oidc_browser.py",
    "identity/tests/test_oidc_provider.py",
    "tests/test_api_fuzz.py",
    "tests/test_deploy_settings.py",
    "tests/test_security_bad_input.py",
    "tests/test_security_matrix.py",
    "tests/test_import_direction.py",
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


@pytest.fixture(scope="session")
def django_db_setup(django_db_setup):
    """The test databases, whose serialized contents (the rows migrations wrote: content types,
    the GPU catalog) follow every connection object Django makes for them in this process.

    Playwright's sync API leaves its event loop marked as running in the test's thread while a
    browser is open, and Django then keeps a second set of connection objects for that "async"
    context. Without this, a serialized-rollback test run while a browser is open neither
    restores those rows nor keeps the flush from re-creating content types under new keys, and
    the next one run after the browser closes fails on a duplicate content type."""
    from django.db import connections
    from django.db.utils import ConnectionHandler

    contents = {alias: connections[alias]._test_serialized_contents for alias in connections
                if hasattr(connections[alias], "_test_serialized_contents")}
    create_connection = ConnectionHandler.create_connection

    def create_with_contents(handler, alias):
        connection = create_connection(handler, alias)
        if alias in contents:
            connection._test_serialized_contents = contents[alias]
        return connection

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(ConnectionHandler, "create_connection", create_with_contents)
        yield


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


# -- a small fleet ------------------------------------------------------------------------------


@pytest.fixture
def fleet_world(artist):
    """Ana (the `artist` fixture, signed in by `artist_api`) and Bob, each with one VM holding one
    RTX6000-12Q vGPU, on separate hosts. Objects are reloaded so no test sees stale caches."""
    bob = ArtistFactory(name="Bob Artist")
    host_a = HostFactory(name="host-a")
    host_b = HostFactory(name="host-b")
    gpu_a = GpuFactory(host=host_a, pci_bus_id="00000000:3B:00.0")
    gpu_b = GpuFactory(host=host_b, pci_bus_id="00000000:3B:00.0")
    vm_a = VirtualMachineFactory(name="ws-ana", artist=artist)
    vm_b = VirtualMachineFactory(name="ws-bob", artist=bob)
    q12 = profile("RTX6000-12Q")
    vgpu_a = services.place_vgpu(vm_a, gpu_a, q12)
    vgpu_b = services.place_vgpu(vm_b, gpu_b, q12)
    return SimpleNamespace(
        ana=artist, bob=bob, host_a=host_a, host_b=host_b, gpu_a=gpu_a, gpu_b=gpu_b,
        vm_a=vm_a, vm_b=vm_b, vgpu_a=vgpu_a, vgpu_b=vgpu_b, profile_12q=q12,
    )


@pytest.fixture
def rtx():
    """A host with a Quadro RTX 6000 holding two RTX6000-8Q (8192 MiB left) and an empty one."""
    host = HostFactory(name="rtx-host")
    gpu = GpuFactory(host=host, pci_bus_id=BUS)
    for name in ("ws-8q-a", "ws-8q-b"):
        services.place_vgpu(VirtualMachineFactory(name=name), gpu, profile("RTX6000-8Q"))
    empty = GpuFactory(host=host, pci_bus_id="00000000:5E:00.0")
    return SimpleNamespace(host=host, gpu=gpu, empty=empty, vm=VirtualMachineFactory(name="ws-new"))


# -- the broker is down -------------------------------------------------------------------------

#: What kombu raises from a publish while Redis is stopped.
CONNECTION_REFUSED = "Error 111 connecting to 127.0.0.1:6379. Connection refused."


@pytest.fixture
def broker_down(monkeypatch) -> list[str]:
    """Redis is stopped: sending the optimizer or refresh task fails as kombu reports it.
    Returns the names of the tasks that were tried."""
    tried: list[str] = []

    def refusing(name: str):
        def apply_async(*args, **kwargs):
            tried.append(name)
            raise OperationalError(CONNECTION_REFUSED)
        return apply_async

    from sizing import tasks

    for task in (tasks.run_optimizer, tasks.refresh_suggestions):
        monkeypatch.setattr(task, "apply_async", refusing(task.name))
    return tried

"""Fixtures of the hypervisors app's tests: private libvirt daemons serving libvirt's test driver
(the simulated hypervisors' fixtures are in fixtures.py, a plugin of the root conftest.py).

Without libvirtd or libvirt-python the tests that need them are skipped with the reason, and
fail under REQUIRE_SERVICES=1 (CI installs both: .ci/run).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from faults.services import missing_service, require_binary
from hypervisors.testing.libvirtd import CANDIDATES, Libvirtd, LibvirtdUnavailable

#: A vGPU host as the test driver describes it (GPUs with mdev types, existing vGPUs, a domain).
GPU_HOST_XML = Path(__file__).resolve().parent / "data" / "gpu-host.xml"

def _start_libvirtd() -> Libvirtd:
    binary = require_binary("libvirtd", list(CANDIDATES), purpose="the libvirt backend tests start their own private "
                            "libvirtd (apt-get install libvirt-daemon libvirt-clients)")
    try:
        daemon = Libvirtd(binary=binary)
        daemon.start()
    except LibvirtdUnavailable as exc:
        missing_service(str(exc))
    return daemon


@pytest.fixture
def libvirtd() -> Iterator[Libvirtd]:
    """A fresh libvirtd for the test (it starts in a tenth of a second): the test driver's
    default host, with its one running domain `test`, and nothing left by another test."""
    daemon = _start_libvirtd()
    yield daemon
    daemon.remove()


@pytest.fixture
def other_libvirtd() -> Iterator[Libvirtd]:
    """A second host, the target of a move."""
    daemon = _start_libvirtd()
    yield daemon
    daemon.remove()

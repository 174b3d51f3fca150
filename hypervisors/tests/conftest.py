"""Fixtures of the hypervisors app's tests: simulated hypervisors in the test's own folder, and
private libvirt daemons serving libvirt's test driver.

Without libvirtd or libvirt-python the tests that need them are skipped with the reason, and
fail under REQUIRE_SERVICES=1 (CI installs both: .ci/run).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from faults.services import missing_service, require_binary
from hypervisors.backends import sim
from hypervisors.testing.libvirtd import CANDIDATES, Libvirtd, LibvirtdUnavailable
from hypervisors.tests.worlds import BUS_A, BUS_B, L40S_TYPES

#: A vGPU host as the test driver describes it (GPUs with mdev types, existing vGPUs, a domain).
GPU_HOST_XML = Path(__file__).resolve().parent / "data" / "gpu-host.xml"

@pytest.fixture
def sim_dir(settings, tmp_path):
    """HYPERVISOR_SIM_DIR in tmp_path, so a test's simulated hosts are its own."""
    settings.HYPERVISOR_SIM_DIR = tmp_path / "sim"
    return settings.HYPERVISOR_SIM_DIR


@pytest.fixture
def node(sim_dir):
    """sim://node-01: two L40S GPUs, no domains, guests that power off in 0.1 s."""
    state = sim.empty_state("node-01")
    state["shutdown_s"] = 0.1
    sim.add_gpu(state, BUS_A, "NVIDIA L40S", L40S_TYPES)
    sim.add_gpu(state, BUS_B, "NVIDIA L40S", L40S_TYPES)
    backend = sim.SimBackend.open("sim://node-01")
    backend.seed(state)
    return backend


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

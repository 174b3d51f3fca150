"""Fixtures of the hypervisors app's tests: private libvirt daemons serving libvirt's test driver,
vCenter simulators, and fake Proxmox VE clusters (the simulated hypervisors' fixtures are in
fixtures.py, a plugin of the root conftest.py).

Without libvirtd or libvirt-python the tests that need them are skipped with the reason, and
fail under REQUIRE_SERVICES=1 (CI installs both: .ci/run). Without Go or govmomi's source the
vSphere tests fail, saying what to install (.ci/run installs both).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace

import pytest

from faults.services import missing_service, require_binary
from hypervisors.testing import pvefake
from hypervisors.testing import vcsim as vcsim_harness
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


@pytest.fixture(scope="session")
def vcsim_binary() -> Path:
    """The vCenter simulator's launcher, built once (and cached across runs); a machine without
    Go or govmomi's source fails the tests, saying what to install."""
    try:
        return vcsim_harness.build()
    except vcsim_harness.VcsimUnavailable as exc:
        pytest.fail(f"{exc} The vSphere backend tests need it.", pytrace=False)


@pytest.fixture
def vcenter_secret(settings, tmp_path) -> str:
    """The simulated vCenter's password in the secrets folder: the secret reference to give."""
    settings.HYPERVISOR_SECRETS_DIR = tmp_path / "secrets"
    settings.HYPERVISOR_SECRETS_DIR.mkdir()
    (settings.HYPERVISOR_SECRETS_DIR / "vcenter").write_text(vcsim_harness.PASSWORD + "\n")
    return "vcenter"


@pytest.fixture
def vcsim(vcsim_binary, vcenter_secret) -> Iterator[SimpleNamespace]:
    """A fresh vCenter simulator for the test (see hypervisors.testing.vcsim for its inventory),
    with its password in the secrets folder under `secret_ref`."""
    server = vcsim_harness.Vcsim(binary=vcsim_binary)
    try:
        server.start()
    except vcsim_harness.VcsimUnavailable as exc:
        server.remove()
        pytest.fail(str(exc), pytrace=False)
    yield SimpleNamespace(server=server, secret_ref=vcenter_secret, uri=server.uri)
    server.remove()


@pytest.fixture
def vcenter_admin(vcsim):
    """The simulated vCenter as its admin sees it (a pyvmomi session of its own), to look at what
    the backend did."""
    from pyVim.connect import Disconnect, SmartConnect

    server = vcsim.server
    si = SmartConnect(host=server.host, port=server.port, user=server.username, pwd=server.password,
                      disableSslCertValidation=True)
    yield si
    Disconnect(si)


@pytest.fixture
def pve(settings, tmp_path) -> Iterator[SimpleNamespace]:
    """A fresh fake Proxmox VE cluster over HTTPS on loopback (hypervisors.testing.pvefake says what
    it holds), with root@pam's password in the secrets folder under `secret_ref` and its API
    token's secret under `token_ref`; `uri(node, ...)` links one of its nodes."""
    settings.HYPERVISOR_SECRETS_DIR = tmp_path / "pve-secrets"
    settings.HYPERVISOR_SECRETS_DIR.mkdir()
    (settings.HYPERVISOR_SECRETS_DIR / "pve-root").write_text(pvefake.PASSWORD + "\n")
    (settings.HYPERVISOR_SECRETS_DIR / "pve-token").write_text(pvefake.TOKEN_SECRET + "\n")
    with pvefake.PveFake() as server:
        yield SimpleNamespace(server=server, secret_ref="pve-root", token_ref="pve-token", uri=server.uri)


@pytest.fixture
def pve_sriov(settings, tmp_path) -> Iterator[SimpleNamespace]:
    """A fresh fake Proxmox VE cluster whose node pve3 holds an NVIDIA L40S in the SR-IOV layout
    (pvefake.sriov_inventory), with root@pam's password in the secrets folder under `secret_ref`;
    `uri(...)` links pve3."""
    settings.HYPERVISOR_SECRETS_DIR = tmp_path / "pve-secrets"
    settings.HYPERVISOR_SECRETS_DIR.mkdir()
    (settings.HYPERVISOR_SECRETS_DIR / "pve-root").write_text(pvefake.PASSWORD + "\n")
    with pvefake.PveFake(inventory=pvefake.sriov_inventory()) as server:
        yield SimpleNamespace(server=server, secret_ref="pve-root",
                              uri=lambda **query: server.uri(pvefake.SRIOV_NODE, **query))

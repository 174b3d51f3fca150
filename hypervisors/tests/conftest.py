"""Fixtures of the hypervisors app's tests: simulated hypervisors in the test's own folder."""

import pytest

from hypervisors.backends import sim


@pytest.fixture
def sim_dir(settings, tmp_path):
    """HYPERVISOR_SIM_DIR in tmp_path, so a test's simulated hosts are its own."""
    settings.HYPERVISOR_SIM_DIR = tmp_path / "sim"
    return settings.HYPERVISOR_SIM_DIR


L40S_TYPES = [("NVIDIA L40S-48Q", 1), ("NVIDIA L40S-24Q", 2), ("NVIDIA L40S-12Q", 4)]
BUS_A, BUS_B = "00000000:3B:00.0", "00000000:5E:00.0"


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

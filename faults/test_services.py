"""The fault tests' own rules: a missing server binary skips them with the reason, or fails them in CI."""

from __future__ import annotations

import pytest

from faults.services import _ephemeral_start, free_ports, require_binary


def test_a_missing_binary_skips_with_the_reason(monkeypatch):
    monkeypatch.delenv("REQUIRE_SERVICES", raising=False)
    with pytest.raises(pytest.skip.Exception, match="redis-server-none is not installed; the fault tests start"):
        require_binary("redis-server-none")


def test_a_missing_binary_fails_under_require_services(monkeypatch):
    monkeypatch.setenv("REQUIRE_SERVICES", "1")
    with pytest.raises(pytest.fail.Exception, match=r"initdb-none is not installed.*\(REQUIRE_SERVICES=1\)"):
        require_binary("initdb-none")


def test_ports_for_restarted_services_lie_below_the_ephemeral_range():
    """An outgoing connection could otherwise take a stopped service's port before it restarts."""
    first = free_ports(3)
    assert 20000 <= first < _ephemeral_start() - 3


@pytest.mark.parametrize("worker", [0, 1])
def test_each_xdist_worker_takes_ports_from_a_slice_of_its_own(monkeypatch, worker):
    """Two workers starting services at once never probe the same port."""
    monkeypatch.setenv("PYTEST_XDIST_WORKER", f"gw{worker}")
    monkeypatch.setenv("PYTEST_XDIST_WORKER_COUNT", "2")
    middle = 20000 + (_ephemeral_start() - 20000) // 2
    first = free_ports(3)
    assert (first >= middle) == (worker == 1)
    assert 20000 <= first < _ephemeral_start() - 3

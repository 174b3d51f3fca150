"""Fixtures of the sizing tests."""

from __future__ import annotations

import pytest
from kombu.exceptions import OperationalError

from sizing import tasks

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

    for task in (tasks.run_optimizer, tasks.refresh_suggestions):
        monkeypatch.setattr(task, "apply_async", refusing(task.name))
    return tried

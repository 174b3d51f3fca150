"""Settings of a deployment for the benches that size one (bench/ingest.py, bench/ingest_ab.py,
bench/deployment_sizing.py): DEBUG off, as the workers run.

With DEBUG on, Django keeps the SQL of each connection's last 9,000 statements and formats every
statement with its parameters to keep it. The collector's state comparison sends a batch's
readings as one JSON parameter of tens of kB, so a collector under DEBUG grew by ~5 kB a poll
until the log was full (2.5 MiB a pass over 500 hosts: "memory per 1,000 hosts" read 84-89 MiB
instead of what the collector holds) and spent ~0.1 ms of CPU a poll more.
"""

from __future__ import annotations

import os
import secrets


def use_production_settings() -> None:
    """DEBUG off and, unless given, a secret key of this run (DEBUG off requires one). Set in the
    environment, so the processes the bench starts (agents, collectors) share them."""
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")
    os.environ.setdefault("DEBUG", "false")
    os.environ.setdefault("SECRET_KEY", "bench-" + secrets.token_urlsafe(40))

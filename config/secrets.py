"""Secrets read from the environment or from files (config.settings imports this module, so
it imports nothing that reads settings).

Each secret NAME comes from the variable NAME or from the file named by NAME_FILE (Docker and
Kubernetes secrets are mounted as files, so the value never shows in `docker inspect` or in
the process environment). Setting both is an error: a deployment that sets one in .env and
the other in a secrets mount would otherwise run with whichever this code happened to prefer.
"""

from __future__ import annotations

import os

from django.core.exceptions import ImproperlyConfigured


def env_secret(name: str, default: str = "") -> str:
    """The secret `name`: the contents of the file at `name`_FILE (one trailing newline
    stripped, as `echo` and editors leave one), else the variable `name`, else `default`."""
    value = os.environ.get(name, "")
    path = os.environ.get(f"{name}_FILE", "")
    if path and value:
        raise ImproperlyConfigured(f"{name} and {name}_FILE are both set: set only one of them")
    if not path:
        return value or default
    try:
        with open(path, encoding="utf-8") as handle:
            content = handle.read()
    except OSError as exc:
        raise ImproperlyConfigured(f"{name}_FILE={path}: cannot read the file ({exc.strerror})") from None
    content = content.removesuffix("\n").removesuffix("\r")
    if not content:
        raise ImproperlyConfigured(f"{name}_FILE={path}: the file is empty")
    return content

"""A hypervisor's credentials, by reference: `secret_ref` names a file or folder in
HYPERVISOR_SECRETS_DIR (a password file, an SSH private key, a folder of TLS material). Shared by
the backends; a secret's content is never logged nor put in a message."""

from __future__ import annotations

from pathlib import Path

from django.conf import settings

from fleet.hypervisor_link import InvalidLink, check_secret_ref
from hypervisors.backends.base import Unreachable


def shown(uri: str) -> str:
    """The URI as messages show it: without its query (socket paths, key files)."""
    return uri.partition("?")[0]


def secret_path(secret_ref: str, uri: str) -> Path:
    """The file or folder `secret_ref` names in HYPERVISOR_SECRETS_DIR; Unreachable naming the
    reference (never a content) when it is not there."""
    try:
        name = check_secret_ref(secret_ref)
    except InvalidLink as exc:
        raise Unreachable(f"The secret reference of {shown(uri)} is unusable: {exc}") from None
    path = Path(settings.HYPERVISOR_SECRETS_DIR) / name
    if not path.exists():
        raise Unreachable(f"The credentials {secret_ref!r} for {shown(uri)} are missing: there is no file or "
                          f"folder named {secret_ref!r} in the secrets folder (HYPERVISOR_SECRETS_DIR).")
    return path


def read_password(secret: Path, secret_ref: str, uri: str) -> str:
    """The password in the file `secret` (its last line break dropped); Unreachable when it is a
    folder or cannot be read."""
    if not secret.is_file():
        raise Unreachable(f"The credentials {secret_ref!r} for {shown(uri)} should be a password file, "
                          "but it is a folder.")
    try:
        text = secret.read_text()
    except (OSError, UnicodeDecodeError) as exc:
        raise Unreachable(f"The credentials {secret_ref!r} for {shown(uri)} could not be read: "
                          f"{type(exc).__name__}.") from None
    return text.rstrip("\r\n")

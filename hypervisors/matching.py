"""A host's vGPU type names against the catalog's profile names: by name, never by type number.

NVIDIA's driver names a type after its profile with a prefix: "NVIDIA L40S-12Q" (vGPU 13+),
"GRID RTX6000-12Q" or "GRID T4-8Q" (older releases); the catalog (`fleet.catalog`) names the
profile "L40S-12Q". The key is telemetry's (`telemetry.payload.profile_key`: the prefix dropped,
compared without regard to case), the one ingest matches an agent's reported types on, so a host
and its agent name a profile alike; nothing here lists type ids (nvidia-222, 1414: they differ
between GPU models, releases and layouts).
"""

from __future__ import annotations

from collections.abc import Iterable

from telemetry.payload import profile_key, strip_vendor


def profile_name_of(type_name: str) -> str:
    """The catalog's spelling of a host's type name: "NVIDIA L40S-12Q" -> "L40S-12Q"."""
    return strip_vendor(type_name)


def type_name_for(profile_name: str) -> str:
    """How a current driver names the type of a catalog profile ("L40S-12Q" -> "NVIDIA L40S-12Q")."""
    return f"NVIDIA {profile_name}"


def _first_alike(name: str, candidates: Iterable[str]) -> str | None:
    wanted = profile_key(name)
    return next((candidate for candidate in candidates if profile_key(candidate) == wanted), None) if wanted else None


def match_profile(type_name: str, profile_names: Iterable[str]) -> str | None:
    """The catalog profile among `profile_names` that the host's `type_name` is, or None."""
    return _first_alike(type_name, profile_names)


def host_type_name(profile_name: str, offered: Iterable[str]) -> str | None:
    """The host's name of the type that is `profile_name`, among the names it `offered`; None
    when the host offers no such type."""
    return _first_alike(profile_name, offered)

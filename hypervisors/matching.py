"""A host's vGPU type names against the catalog's profile names: by name, never by type number.
Pure: no Django.

NVIDIA's driver names a type after its profile with a prefix: "NVIDIA L40S-12Q" (vGPU 13+),
"GRID RTX6000-12Q" or "GRID T4-8Q" (older releases); the catalog (`fleet.catalog`) names the
profile "L40S-12Q". Matching strips the prefix and compares without regard to case, so a host
of any driver release finds its profiles, and nothing here lists type ids (nvidia-222, 1414:
they differ between GPU models, releases and layouts).
"""

from __future__ import annotations

from collections.abc import Iterable

PREFIXES = ("NVIDIA ", "GRID ")


def profile_name_of(type_name: str) -> str:
    """The catalog's spelling of a host's type name: "NVIDIA L40S-12Q" -> "L40S-12Q"."""
    name = type_name.strip()
    for prefix in PREFIXES:
        if name.upper().startswith(prefix):
            return name[len(prefix):].strip()
    return name


def type_name_for(profile_name: str) -> str:
    """How a current driver names the type of a catalog profile ("L40S-12Q" -> "NVIDIA L40S-12Q")."""
    return f"NVIDIA {profile_name}"


def match_profile(type_name: str, profile_names: Iterable[str]) -> str | None:
    """The catalog profile among `profile_names` that the host's `type_name` is, or None."""
    wanted = profile_name_of(type_name).casefold()
    return next((name for name in profile_names if name.casefold() == wanted), None) if wanted else None


def host_type_name(profile_name: str, offered: Iterable[str]) -> str | None:
    """The host's name of the type that is `profile_name`, among the names it `offered`; None
    when the host offers no such type."""
    return next((name for name in offered if match_profile(name, [profile_name])), None)

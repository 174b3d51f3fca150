"""Which vGPU type of a host is which catalog profile: by name, never by type number.

A host names its types as its driver does ("NVIDIA L40S-12Q" on recent drivers, "GRID T4-8Q"
on older ones) and numbers them per GPU model and driver (nvidia-222, 1414): the number means
nothing elsewhere, the name after the vendor prefix is the profile's name. Pure: no Django.
"""

from __future__ import annotations

_PREFIXES = ("NVIDIA ", "GRID ")


def profile_key(name: str) -> str:
    """`name` without the vendor prefix, upper case, without blanks: "NVIDIA L40S-12Q",
    "GRID L40S-12Q" and "l40s-12q" are one key."""
    text = name.strip().upper()
    for prefix in _PREFIXES:
        if text.startswith(prefix):
            text = text[len(prefix):]
            break
    return "".join(text.split())


def same_profile(type_name: str, profile_name: str) -> bool:
    return bool(type_name.strip()) and profile_key(type_name) == profile_key(profile_name)


def host_type_name(profile_name: str, offered: list[str]) -> str | None:
    """The host's name of the type that is `profile_name`, among the names it `offered`; None
    when the host offers no such type."""
    return next((name for name in offered if same_profile(name, profile_name)), None)

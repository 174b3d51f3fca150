"""PCI bus ids in one spelling: NVML's, with the 8-hex-digit domain (`00000000:3B:00.0`).

The same GPU is written `0000:3b:00.0` by lspci and sysfs, `00000000:3B:00.0` by NVML and
nvidia-smi, and `3b:00.0` by a person leaving out domain 0. Stored and compared in one form,
they are one GPU: the unique constraint on (host, pci_bus_id) then refuses a second row for it,
and an agent's reading finds the row an admin typed. Pure: no Django.
"""

from __future__ import annotations

import re

#: domain (optional, up to 8 hex digits), bus, device (up to 0x1f) and function (0-7).
_PCI_BUS_ID = re.compile(
    r"(?:(?P<domain>[0-9a-fA-F]{1,8}):)?(?P<bus>[0-9a-fA-F]{2}):(?P<device>[0-9a-fA-F]{2})\.(?P<function>[0-7])",
)
EXAMPLE = "00000000:3B:00.0"


class InvalidPciBusId(ValueError):
    """Not a PCI bus id; the message says what one looks like."""


def normalize_pci_bus_id(text: str) -> str:
    """`text` in NVML's form (`00000000:3B:00.0`: 8-digit domain, upper-case hex), or
    InvalidPciBusId. Surrounding blanks are dropped; a missing domain is domain 0."""
    value = str(text).strip()
    match = _PCI_BUS_ID.fullmatch(value) if value.isascii() else None
    if match is None or int(match["device"], 16) > 0x1F:
        shown = value if len(value) <= 40 else value[:40] + "…"
        raise InvalidPciBusId(
            f"{shown!r} is not a PCI bus id: use domain:bus:device.function in hex, e.g. {EXAMPLE} or "
            f"{EXAMPLE[4:].lower()}.")
    domain = int(match["domain"] or "0", 16)
    return f"{domain:08X}:{match['bus'].upper()}:{match['device'].upper()}.{match['function']}"


def canonical_pci_bus_id(text: str | None) -> str | None:
    """`text` in NVML's form where it is a PCI bus id, else as it came (None stays None): for
    matching what a source reports against the inventory, which stores the normalised form."""
    if text is None:
        return None
    try:
        return normalize_pci_bus_id(text)
    except InvalidPciBusId:
        return text

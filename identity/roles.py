"""The role a directory grants (pure: no ORM, no directory client).

A studio maps its directory groups onto the product's two roles (DESIGN.md, "Roles"): members of
the admins' group are fleet admins (staff); members of an artists' group are artists, who see
their own workstations. Someone in neither group has no role and may not sign in. Group names are
compared the way directories compare them: LDAP DNs case-insensitively with the spaces around
their separators ignored, claim values (OIDC) as given but for case.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable


class Role(enum.StrEnum):
    ADMIN = "admin"
    ARTIST = "artist"


#: What a person without a role is told, on the sign-in page and when a later request is refused.
NO_ROLE = ("Your {directory} account is not in a group that may use the fleet dashboard. "
           "Ask your IT team to add you to the artists' or the admins' group.")


def normalize_group(name: str) -> str:
    """A group's DN or name as compared: lower case, no spaces around ',' and '='."""
    parts = [part.strip() for part in name.strip().lower().split(",")]
    return ",".join("=".join(side.strip() for side in part.split("=", 1)) for part in parts)


def role_of(groups: Iterable[str], admin_groups: Iterable[str], artist_groups: Iterable[str]) -> Role | None:
    """The role that membership of `groups` grants: admin before artist, None for neither."""
    member = {normalize_group(group) for group in groups}
    if member & {normalize_group(group) for group in admin_groups if group}:
        return Role.ADMIN
    if member & {normalize_group(group) for group in artist_groups if group}:
        return Role.ARTIST
    return None

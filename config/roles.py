"""The roles of DESIGN.md, as one test each: every app, the API plumbing and the pages ask here."""


def is_fleet_admin(user) -> bool:
    """Whether `user` manages the whole inventory (DESIGN.md "admin" role: a staff user)."""
    return bool(user and user.is_authenticated and user.is_active and user.is_staff)

"""Template context every page gets (config/settings.py TEMPLATES "context_processors")."""

from __future__ import annotations

from django.utils.functional import SimpleLazyObject

from alerts.queries import firing_count_query
from config import read_cache
from config.roles import is_fleet_admin
from fleet import requests as resize_requests

#: Badges are reused until a table they count changes; this bounds a change made outside Django.
BADGES_MAX_AGE_S = 60


def _badge_counts(user) -> resize_requests.BadgeCounts:
    """The user's badge counts, from the read cache while no table they count has changed: every
    page a signed-in user opens shows them, and they change a few times an hour."""
    if not (user and user.is_authenticated):
        return resize_requests.BadgeCounts()
    return read_cache.cached(
        f"badges:{user.pk}:{int(is_fleet_admin(user))}",
        lambda: resize_requests.badge_counts(user, admin_counts={"firing": firing_count_query()}),
        max_age_s=BADGES_MAX_AGE_S)


def badges(request) -> dict:
    """`badges.unread` (the user's unread notifications), `badges.pending` (pending resize
    requests, admins only) and `badges.more.firing` (alerts firing, admins only) for the navigation.

    Lazy: the one query runs when a template reads a count, so htmx partials, CSV exports and
    pages without the navigation pay nothing, and anonymous visitors never query.
    """
    return {"badges": SimpleLazyObject(lambda: _badge_counts(getattr(request, "user", None)))}

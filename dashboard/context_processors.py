"""Template context every page gets (config/settings.py TEMPLATES "context_processors")."""

from __future__ import annotations

from django.utils.functional import SimpleLazyObject

from alerts.queries import firing_count
from config.roles import is_fleet_admin
from fleet import requests as resize_requests


def badges(request) -> dict:
    """`badges.unread` (the user's unread notifications) and `badges.pending` (pending resize
    requests, admins only) for the navigation.

    Lazy: the one query runs when a template reads a count, so htmx partials, CSV exports and
    pages without the navigation pay nothing, and anonymous visitors never query.
    """
    return {"badges": SimpleLazyObject(lambda: resize_requests.badge_counts(getattr(request, "user", None)))}


def alert_badge(request) -> dict:
    """`alert_badge.firing`: open, unsilenced alerts nobody acknowledged yet (admins only), lazy as above."""
    user = getattr(request, "user", None)
    return {"alert_badge": SimpleLazyObject(
        lambda: {"firing": firing_count() if user is not None and is_fleet_admin(user) else 0})}

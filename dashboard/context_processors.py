"""Template context every page gets (config/settings.py TEMPLATES "context_processors")."""

from __future__ import annotations

from django.utils.functional import SimpleLazyObject

from alerts.queries import firing_count_query
from fleet import requests as resize_requests


def badges(request) -> dict:
    """`badges.unread` (the user's unread notifications), `badges.pending` (pending resize
    requests, admins only) and `badges.more.firing` (alerts firing, admins only) for the navigation.

    Lazy: the one query runs when a template reads a count, so htmx partials, CSV exports and
    pages without the navigation pay nothing, and anonymous visitors never query.
    """
    return {"badges": SimpleLazyObject(lambda: resize_requests.badge_counts(
        getattr(request, "user", None), admin_counts={"firing": firing_count_query}))}


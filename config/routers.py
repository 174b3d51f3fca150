"""The routers of every app's API: DRF's, with ids of ASCII digits in detail routes.

An id in a path is ASCII digits, as in the pages' `<int:pk>`: `/api/v1/hosts/٣/` is a 404 (JSON,
config/api/__init__.py) like `/hosts/٣/`, not host 3, which the ORM would make of it through `int()`.
Kept apart from config/api/__init__.py, which DRF's settings import while its views are still loading.
"""

from __future__ import annotations

from rest_framework import routers

#: Ids of API paths (a viewset may set `lookup_value_regex` for another kind of lookup).
ID_REGEX = "[0-9]+"


class IdLookupMixin:
    """A router whose detail routes take ASCII-digit ids unless the viewset says otherwise."""

    def get_lookup_regex(self, viewset, lookup_prefix=""):
        lookup = getattr(viewset, "lookup_url_kwarg", None) or getattr(viewset, "lookup_field", "pk")
        return f"(?P<{lookup_prefix}{lookup}>{getattr(viewset, 'lookup_value_regex', ID_REGEX)})"


class DefaultRouter(IdLookupMixin, routers.DefaultRouter):
    pass


class SimpleRouter(IdLookupMixin, routers.SimpleRouter):
    pass


class AppRouter(DefaultRouter):
    """An app's router: its resources, with format suffixes, and no root view of its own: the
    root of /api/v1/ lists every app's resources (config/api/root.py)."""

    include_root_view = False

"""Who may open a page (DESIGN.md, "Roles"), in one place for every page of the dashboard.

Anonymous visitors are sent to the login page. Fleet-wide pages (overview, heatmaps, agents)
are for admins; a signed-in artist gets a 403 page that points to their own workstation, not a
login loop. Pages about single objects use `fleet.queries` scoping instead, so an artist
reaches their own VM and nothing else (404 for the rest, as in the API).
"""

from __future__ import annotations

from functools import wraps

from django.contrib.auth.decorators import login_required
from django.contrib.auth.mixins import LoginRequiredMixin
from django.core.exceptions import PermissionDenied

from config.roles import is_fleet_admin

ADMINS_ONLY = "This page shows the whole fleet, which only fleet admins may see."


def staff_required(view):
    """Decorate a function view: login required, then admins only (403 otherwise)."""

    @wraps(view)
    def wrapper(request, *args, **kwargs):
        if not is_fleet_admin(request.user):
            raise PermissionDenied(ADMINS_ONLY)
        return view(request, *args, **kwargs)

    return login_required(wrapper)


class StaffRequiredMixin(LoginRequiredMixin):
    """Class-based views: login required, then admins only (403 otherwise)."""

    def dispatch(self, request, *args, **kwargs):
        if request.user.is_authenticated and not is_fleet_admin(request.user):
            raise PermissionDenied(ADMINS_ONLY)
        return super().dispatch(request, *args, **kwargs)

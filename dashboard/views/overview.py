"""The fleet overview, the admins' home page (`/`), and its live-refreshed part.

The page renders the live partial inline, so it works without JavaScript; htmx then re-fetches
the partial from `overview_live` every settings.DASHBOARD_REFRESH_S seconds and swaps it in.
Everything shown is read by `dashboard.overview.load_overview` in a fixed number of queries.
"""

from __future__ import annotations

from django.conf import settings
from django.contrib.auth.decorators import login_required
from django.http import HttpResponse
from django.shortcuts import redirect, render
from django.template.loader import render_to_string
from django.utils import timezone
from django_htmx.http import HttpResponseClientRefresh

from config import read_cache
from config.roles import is_fleet_admin
from dashboard.access import staff_required
from dashboard.overview import load_overview


def _live_html() -> str:
    """The live part, rendered. Every admin sees the same figures, so it is computed once per
    refresh interval, or at once after an inventory change (telemetry tables only age it; see
    config/read_cache.py): at 1,000 hosts reading and rendering it costs half a second of CPU.
    """
    def render_live() -> str:
        context = {"overview": load_overview(timezone.now()), "refresh_s": settings.DASHBOARD_REFRESH_S}
        return render_to_string("fleet/partials/overview_live.html", context)

    # render_to_string's SafeString keeps its class through the cache's pickling: the page
    # includes it as the markup it is, and nothing else is marked safe.
    return read_cache.cached("overview-live", render_live, max_age_s=settings.DASHBOARD_REFRESH_S,
                             lazy_prefixes=("telemetry_",))


@login_required
def overview(request):
    """Admins get the fleet overview; anyone else signed in is an artist, whose home is /me/."""
    if not is_fleet_admin(request.user):
        return redirect("fleet:workstation")
    return render(request, "fleet/overview.html", {"live_html": _live_html()})


def overview_live(request):
    """Only the live part of the overview (figures and tables), for htmx to swap in.

    A poll from a page whose session has ended (signed out elsewhere, expired, no longer staff)
    reloads the whole page, whose own checks then send the browser to the login page or to /me/,
    rather than swapping a login form into the middle of the overview.
    """
    if request.htmx and not is_fleet_admin(request.user):
        return HttpResponseClientRefresh()
    return _overview_live(request)


@staff_required
def _overview_live(request):
    return HttpResponse(_live_html())

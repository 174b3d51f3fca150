"""`{% main_menu %}`: the main menu's links (templates/includes/main_menu.html), for templates/base.html.

Every page shows the menu, and rendering its ~30 links with their badges through the template
engine cost about a third of a page served from the read cache (the overview). What it shows
depends only on the user's role, the page's path and query (which link is current), the badge
counts and the URL prefix the site is served under, so each process keeps the rendered menu for
those and renders it again only for a combination it has not seen. The badge counts stay those
of the request (its one badge query), so a new notification or request shows at once.
"""

from __future__ import annotations

import threading

from django import template
from django.template.loader import get_template
from django.urls import get_script_prefix

from dashboard.navigation import menu_for

register = template.Library()

#: Rendered menus by what they show; emptied when full (detail pages make many paths).
_rendered: dict[tuple, str] = {}
_MAX_KEPT = 512
#: Longer paths and queries (filters typed into a list) are rendered each time, not kept.
_MAX_KEY_CHARS = 300
_lock = threading.Lock()


@register.simple_tag(takes_context=True)
def main_menu(context) -> str:
    request, user, badges = context.get("request"), context.get("user"), context.get("badges")
    if request is None or badges is None:
        return ""
    query = request.META.get("QUERY_STRING", "")
    more = tuple(sorted(badges.more.items()))
    key = (get_script_prefix(), bool(user and user.is_authenticated), bool(user and user.is_staff), request.path,
           query, badges.unread, badges.pending, more)
    html = _rendered.get(key)
    if html is None:
        html = get_template("includes/main_menu.html").render(
            {"menu": menu_for(user, request.path, request.GET), "badges": badges})
        if len(request.path) + len(query) <= _MAX_KEY_CHARS:
            with _lock:
                if len(_rendered) >= _MAX_KEPT:
                    _rendered.clear()
                _rendered[key] = html
    return html

"""The dashboard's main menu (templates/base.html), in one place: which links each role sees, in
which group, and which of them is the page being shown.

Admins get six groups (Fleet, Telemetry, Sizing, Requests, Health, Admin), each a dropdown; an artist
gets the one page that is theirs, which also covers their own VM and artist pages. Who is an
admin is decided as everywhere else in the dashboard (`user.is_staff`, DESIGN.md "Roles"); the
pages check it again themselves, the menu only leaves out what a role may not open.

Links are named by URL name, so the menu follows the pages wherever their views live (like
NetBox's netbox/navigation/menu.py).
"""

from __future__ import annotations

from dataclasses import dataclass

from django.http import QueryDict
from django.urls import reverse
from django.utils.functional import SimpleLazyObject


@dataclass(frozen=True)
class Link:
    """One entry of the menu. `query` narrows it to a filtered view of its page (the decided
    requests of one status); `also` lists other paths that count as this entry's pages; `badge`
    names the count of `badges` (fleet/context_processors.py) shown next to it."""

    label: str
    url_name: str
    query: str = ""
    also: tuple[str, ...] = ()
    badge: str = ""


@dataclass(frozen=True)
class Group:
    label: str
    links: tuple[Link, ...]
    badge: str = ""


ADMIN_MENU = (
    Group("Fleet", (
        Link("Overview", "fleet:overview"),
        Link("Hosts", "fleet:host-list"),
        Link("GPUs", "fleet:gpu-list"),
        Link("VMs", "fleet:vm-list"),
        Link("Artists", "fleet:artist-list"),
        Link("GPU scheduler", "fleet:scheduler"),
        Link("Drift", "hypervisors:drift"),
    )),
    Group("Telemetry", (
        Link("Heatmaps", "telemetry:heatmap"),
        Link("Agents", "telemetry:agent-list"),
    )),
    Group("Sizing", (
        Link("Right-sizing", "sizing:suggestion-list"),
        Link("Density planner", "sizing:planner"),
        Link("Placement optimizer", "sizing:optimizer"),
        Link("Artist feedback", "sizing:feedback"),
        Link("PoC study", "sizing:study"),
    )),
    Group("Requests", (
        Link("Resize requests", "fleet:requests", badge="pending"),
        Link("Approved", "fleet:requests", query="status=approved"),
        Link("Rejected", "fleet:requests", query="status=rejected"),
        Link("Cancelled", "fleet:requests", query="status=cancelled"),
        Link("Operations", "hypervisors:operation-list"),
    ), badge="pending"),
    Group("Health", (
        Link("Alerts", "alerts:alert-list", query="state=open", badge="firing"),
        Link("Alert rules", "alerts:rule-list"),
        Link("Silences", "alerts:silence-list"),
        Link("Licences", "alerts:licences"),
        Link("Driver versions", "alerts:versions"),
        Link("Notification channels", "notify:channel-list"),
        Link("Deliveries", "notify:delivery-list"),
    ), badge="firing"),
    Group("Admin", (
        Link("Audit log", "fleet:audit"),
        Link("Admin site", "admin:index"),
        Link("API docs", "swagger-ui"),
    )),
)

ARTIST_MENU = (
    Link("My workstation", "fleet:workstation", also=("/vms/", "/artists/")),
)


@dataclass(frozen=True)
class Entry:
    """A link as rendered: its URL and whether it is the page being shown."""

    label: str
    url: str
    current: bool
    badge: str


@dataclass(frozen=True)
class Section:
    label: str
    entries: tuple[Entry, ...]
    badge: str

    @property
    def current(self) -> bool:
        return any(entry.current for entry in self.entries)


def _shows(link: Link, path: str, query: QueryDict) -> bool:
    """Whether the page at `path?query` is `link`'s page: its path (or a page below it; the
    overview, at "/", only itself), or one of its `also` paths, with its query's values."""
    url = reverse(link.url_name)
    on_path = path == url or (url != "/" and path.startswith(url)) or any(path.startswith(p) for p in link.also)
    wanted = QueryDict(link.query)
    return on_path and all(query.getlist(key) == wanted.getlist(key) for key in wanted)


def _entries(links: tuple[Link, ...], path: str, query: QueryDict) -> tuple[Entry, ...]:
    """`links` as entries; of several links to one page, a narrower one (with a query) that
    matches is the current one rather than the plain link."""
    shown = [_shows(link, path, query) for link in links]
    narrowed = {link.url_name for link, hit in zip(links, shown, strict=True) if hit and link.query}
    return tuple(
        Entry(link.label, reverse(link.url_name) + (f"?{link.query}" if link.query else ""),
              hit and (bool(link.query) or link.url_name not in narrowed), link.badge)
        for link, hit in zip(links, shown, strict=True)
    )


def menu_for(user, path: str, query: QueryDict) -> dict:
    """The menu of `user` on the page at `path`: `sections` (admins: the groups) or `links`
    (artists: the plain links). Empty for a visitor who is not signed in."""
    if not (user and user.is_authenticated):
        return {"sections": (), "links": ()}
    if user.is_staff:
        sections = tuple(Section(group.label, _entries(group.links, path, query), group.badge) for group in ADMIN_MENU)
        return {"sections": sections, "links": ()}
    return {"sections": (), "links": _entries(ARTIST_MENU, path, query)}


def menu(request) -> dict:
    """Context processor: `menu` for templates/base.html. Lazy, so fragments and exports that
    never show the menu pay nothing."""
    return {"menu": SimpleLazyObject(lambda: menu_for(getattr(request, "user", None), request.path, request.GET))}

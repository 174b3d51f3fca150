"""API list pages served from the read cache (config/read_cache.py).

Scripts poll the lists; at a studio's scale each page costs several milliseconds of CPU to
read and serialize, while the rows change a few times a minute. A page is reused until a
table it read is written (by anyone, in any process sharing the cache), so a script that
changes something and lists again sees its change.

The key holds what decides the page's content: the user and their role (a demoted admin must
not be served the whole fleet), the host and scheme (the pagination links name them) and the
path with its query, and the media type asked for (`application/json; indent=4` renders
otherwise). Only JSON answers of 200 are kept, as the bytes they were rendered to: a page served
from the cache is neither unpickled into rows nor rendered again (together a third of a cached
request's CPU). The browsable API and CSV export are computed each time.
"""

from __future__ import annotations

import hashlib
import json

from rest_framework.response import Response

from config import read_cache
from config.roles import is_fleet_admin

#: A longer path (a long query string) is keyed by its digest: cache backends warn of keys past
#: memcached's 250 characters, and a client should not choose how long a key Redis keeps.
MAX_KEY_PATH_CHARS = 150


class KeptJsonResponse(Response):
    """A list page as the JSON it was rendered to: rendering it again only sets its headers.
    `data` reads the JSON back, for whoever looks at it (tests); the server never does."""

    def __init__(self, content: bytes):
        self.kept_json = content
        super().__init__()

    @property
    def data(self):
        return json.loads(self.kept_json)

    @data.setter
    def data(self, value) -> None:
        assert value is None, "a kept page's data is its JSON"

    @property
    def rendered_content(self) -> bytes:
        renderer = self.accepted_renderer  # the Content-Type header, as Response.rendered_content sets it
        self["Content-Type"] = self.content_type or (
            f"{renderer.media_type}; charset={renderer.charset}" if renderer.charset else renderer.media_type)
        return self.kept_json


class CachedListMixin:
    #: Rows can also age without a write (an agent turning stale): no page is older than this.
    read_cache_max_age_s: float = 60

    def list_cache_key(self, request, user_pk, admin: bool) -> str | None:
        """The read cache's key of the page this request asks for, as the user `user_pk` (an admin
        or not); None when the page is not kept (not the JSON list). The token authentication
        asks it before it knows the user, to fetch the page along with the token."""
        if getattr(self, "action", None) != "list" or getattr(request.accepted_renderer, "format", None) != "json":
            return None
        path = request.get_full_path()
        if len(path) > MAX_KEY_PATH_CHARS:
            path = f"{request.path}?sha256={hashlib.sha256(path.encode()).hexdigest()}"
        media_type = request.accepted_media_type
        if len(media_type) > MAX_KEY_PATH_CHARS:
            media_type = hashlib.sha256(media_type.encode()).hexdigest()
        return (f"api-list:{user_pk}:{'admin' if admin else 'user'}:{request.scheme}:{request.get_host()}:"
                f"{media_type}:{path}")

    def dispatch(self, request, *args, **kwargs):
        try:
            return super().dispatch(request, *args, **kwargs)
        finally:
            read_cache.forget_fetched_along()

    def list(self, request, *args, **kwargs):
        user = request.user
        key = self.list_cache_key(request, user.pk, is_fleet_admin(user))
        if key is None:
            return super().list(request, *args, **kwargs)
        renderer = request.accepted_renderer
        refused = []

        def compute() -> bytes | None:
            response = super(CachedListMixin, self).list(request, *args, **kwargs)
            if response.status_code != 200:
                refused.append(response)
                return None
            return renderer.render(response.data, request.accepted_media_type, self.get_renderer_context())

        content = read_cache.cached(key, compute, max_age_s=self.read_cache_max_age_s,
                                    should_store=lambda value: value is not None)
        return refused[0] if refused else KeptJsonResponse(content)

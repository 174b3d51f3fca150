"""API list pages served from the read cache (config/read_cache.py).

Scripts poll the lists; at a studio's scale each page costs several milliseconds of CPU to
read and serialize, while the rows change a few times a minute. A page is reused until a
table it read is written (by anyone, in any process sharing the cache), so a script that
changes something and lists again sees its change.

The key holds what decides the page's content: the user and their role (a demoted admin must
not be served the whole fleet), the host and scheme (the pagination links name them) and the
path with its query. Only JSON answers of 200 are kept; the browsable API and CSV export are
computed each time.
"""

from __future__ import annotations

import hashlib

from rest_framework.response import Response

from config import read_cache
from config.roles import is_fleet_admin

#: A longer path (a long query string) is keyed by its digest: cache backends warn of keys past
#: memcached's 250 characters, and a client should not choose how long a key Redis keeps.
MAX_KEY_PATH_CHARS = 150


class CachedListMixin:
    #: Rows can also age without a write (an agent turning stale): no page is older than this.
    read_cache_max_age_s: float = 60

    def list(self, request, *args, **kwargs):
        if getattr(request.accepted_renderer, "format", None) != "json":
            return super().list(request, *args, **kwargs)
        user = request.user
        path = request.get_full_path()
        if len(path) > MAX_KEY_PATH_CHARS:
            path = f"{request.path}?sha256={hashlib.sha256(path.encode()).hexdigest()}"
        key = (f"api-list:{user.pk}:{'admin' if is_fleet_admin(user) else 'user'}:{request.scheme}:"
               f"{request.get_host()}:{path}")
        computed = []

        def compute():
            response = super(CachedListMixin, self).list(request, *args, **kwargs)
            computed.append(response)
            return response.data if response.status_code == 200 else None

        data = read_cache.cached(key, compute, max_age_s=self.read_cache_max_age_s,
                                 should_store=lambda value: value is not None)
        return computed[0] if computed else Response(data)

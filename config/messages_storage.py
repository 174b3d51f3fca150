"""Django's message storage (the cookie, then the session), built when a request first uses it.

MessageMiddleware builds the storage for every request before the view runs, and building
FallbackStorage (a cookie storage with its signer, and a session storage) was ~3 % of an API
request's CPU under load (bench/load.py), though API requests never show or add a message.
Here the storage is built on first use (a message added, the page listing them); a request that
used none has nothing to store, which is what FallbackStorage's own `update` would have found.
"""

from __future__ import annotations

from django.contrib.messages.storage.fallback import FallbackStorage


class LazyFallbackStorage:
    def __init__(self, request, *args, **kwargs):
        self._request = request
        self._args = args, kwargs
        self._built: FallbackStorage | None = None

    @property
    def _storage(self) -> FallbackStorage:
        if self._built is None:
            args, kwargs = self._args
            self._built = FallbackStorage(self._request, *args, **kwargs)
        return self._built

    def update(self, response):
        """Store what the request added or left unread (MessageMiddleware, as the response leaves)."""
        return None if self._built is None else self._built.update(response)

    def __getattr__(self, name):
        return getattr(self._storage, name)

    def __len__(self) -> int:
        return len(self._storage)

    def __iter__(self):
        return iter(self._storage)

    def __contains__(self, item) -> bool:
        return item in self._storage

    def __repr__(self) -> str:
        return f"<LazyFallbackStorage: {self._storage!r}>"

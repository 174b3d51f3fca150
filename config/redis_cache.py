"""Django's Redis cache backend, keeping its redis-py client instead of building one per call.

Django's RedisCacheClient makes a new `redis.Redis` for every get or set, and each one copies
redis-py's ~170 response callbacks: at the read cache's two calls a request that was an eighth
of an API request's CPU (bench/load.py). A client only wraps its connection pool, and Django
keeps a cache backend per thread, so one client per pool serves every call of that thread.
"""

from __future__ import annotations

from django.core.cache.backends import redis as django_redis


class RedisCacheClient(django_redis.RedisCacheClient):
    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self._clients = {}

    def get_client(self, key=None, *, write=False):
        pool = self._get_connection_pool(write)
        client = self._clients.get(id(pool))
        if client is None:
            client = self._clients[id(pool)] = self._client(connection_pool=pool)
        return client


class RedisCache(django_redis.RedisCache):
    def __init__(self, server, params):
        super().__init__(server, params)
        self._class = RedisCacheClient

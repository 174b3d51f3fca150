"""Settings of the dashboard's processes in the fault tests: production's (DEBUG off, the
environment's database and broker), except what plain HTTP on loopback needs.

Static files are served by URL only: the compressed manifest storage of production would
need a `collectstatic` run, which is not what these tests are about. HTTPS redirects and
secure-only cookies are off, as behind a proxy that terminates TLS on the same machine.
"""

from config.settings import *  # noqa: F403

STORAGES = {**STORAGES, "staticfiles": {"BACKEND": "django.contrib.staticfiles.storage.StaticFilesStorage"}}  # noqa: F405
SECURE_SSL_REDIRECT = False
SESSION_COOKIE_SECURE = False
CSRF_COOKIE_SECURE = False
SECURE_HSTS_SECONDS = 0

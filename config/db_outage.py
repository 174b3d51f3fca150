"""Requests that find the database unreachable answer 503 with a page saying so, not a 500.

While PostgreSQL restarts (an upgrade, a failover, a host reboot) every view that reads the
inventory fails with a connection error. The user gets a short page that says what happened
and to try again (the API gets the same in its JSON error shape), with Retry-After; the
server log gets one line per request, without the traceback of a known outage. Once the
database is back the next request works on its own: CONN_HEALTH_CHECKS replaces a dead
persistent connection before the view runs.

Only exceptions raised by views pass through `process_exception`; this middleware comes
after Django's own in MIDDLEWARE, so that it sees them first.
"""

from __future__ import annotations

import logging

from django.db import InterfaceError, OperationalError
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.template.loader import render_to_string

logger = logging.getLogger(__name__)

RETRY_AFTER_S = 30
MESSAGE = "The dashboard cannot reach its database right now (it may be restarting). Try again in a minute."


class DatabaseUnavailableMiddleware:
    def __init__(self, get_response):
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        return self.get_response(request)

    def process_exception(self, request: HttpRequest, exception: Exception) -> HttpResponse | None:
        if not isinstance(exception, OperationalError | InterfaceError):
            return None
        logger.error("database unavailable, answered 503 to %s %s: %s", request.method, request.path,
                     str(exception).strip().splitlines()[0] if str(exception).strip() else type(exception).__name__)
        if request.path.startswith("/api/") or "application/json" in request.headers.get("Accept", ""):
            response = JsonResponse({"detail": MESSAGE}, status=503)
        else:
            # Rendered without the request: context processors and the user would query the database.
            response = HttpResponse(render_to_string("503.html", {"message": MESSAGE}), status=503)
        response["Retry-After"] = str(RETRY_AFTER_S)
        return response

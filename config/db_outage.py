"""Requests that find the database unreachable answer 503 with a page saying so, not a 500.

While PostgreSQL restarts (an upgrade, a failover, a host reboot) every view that reads the
inventory fails with a connection error. The user gets a short page that says what happened
and to try again (the API gets the same in its JSON error shape), with Retry-After; the
server log gets one line per request, without the traceback of a known outage. Once the
database is back the next request works on its own: CONN_HEALTH_CHECKS replaces a dead
persistent connection before the view runs.

One OperationalError is not an outage: PostgreSQL aborting a transaction to let a concurrent
one through (a deadlock, a serialization failure). The database answered, the aborted
transaction wrote nothing, and trying again will most likely work, so the user gets 409
"another change ran at the same moment; reload and try again", never a 503. The writers of
this product lock rows in one order (`fleet.locks`), so this comes only from a writer outside
them (a manual SQL session, a script of the studio's); it is not retried here, since only the
user knows whether the change still makes sense on the fleet the winner left
(docs/concurrency.md).

Only exceptions raised by views pass through `process_exception`; this middleware comes
after Django's own in MIDDLEWARE, so that it sees them first.
"""

from __future__ import annotations

import logging

from django.db import InterfaceError, OperationalError
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.template.loader import render_to_string

from config.api import is_api

logger = logging.getLogger(__name__)

RETRY_AFTER_S = 30
MESSAGE = "The dashboard cannot reach its database right now (it may be restarting). Try again in a minute."
#: SQLSTATEs of a transaction the database aborted in favour of a concurrent one: deadlock_detected,
#: serialization_failure.
CONCURRENT_CHANGE_STATES = frozenset({"40P01", "40001"})
CONCURRENT_CHANGE = ("Another change to the fleet ran at the same moment and needed the same rows, so this one was "
                     "stopped before it changed anything. Reload the page and try again.")


def concurrent_change(exception: Exception) -> bool:
    """Whether `exception` is the database aborting this transaction for a concurrent one."""
    cause = exception.__cause__
    # psycopg 3 names it sqlstate, psycopg2 pgcode.
    return (getattr(cause, "sqlstate", None) or getattr(cause, "pgcode", None)) in CONCURRENT_CHANGE_STATES


class DatabaseUnavailableMiddleware:
    def __init__(self, get_response):
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        return self.get_response(request)

    def process_exception(self, request: HttpRequest, exception: Exception) -> HttpResponse | None:
        if not isinstance(exception, OperationalError | InterfaceError):
            return None
        if concurrent_change(exception):
            logger.warning("concurrent change, answered 409 to %s %s: %s", request.method, request.path,
                           str(exception).strip().splitlines()[0])
            return _answer(request, CONCURRENT_CHANGE, 409, "The fleet changed meanwhile")
        logger.error("database unavailable, answered 503 to %s %s: %s", request.method, request.path,
                     str(exception).strip().splitlines()[0] if str(exception).strip() else type(exception).__name__)
        response = _answer(request, MESSAGE, 503, "Temporarily unavailable")
        response["Retry-After"] = str(RETRY_AFTER_S)
        return response


def _answer(request: HttpRequest, message: str, status: int, title: str) -> HttpResponse:
    """`message` in the API's JSON error shape, or as a short page for a browser."""
    if is_api(request) or "application/json" in request.headers.get("Accept", ""):
        return JsonResponse({"detail": message}, status=status)
    # Rendered without the request: context processors and the user would query the database.
    return HttpResponse(render_to_string("503.html", {"message": message, "title": title}), status=status)

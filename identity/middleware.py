"""Ends sessions idle or old past their limits (identity/sessions.py), and says why.

A page gets the sign-in page, which shows the reason ("You were signed out after 8 hours without
activity"), with `next` set to come back: a plain request by a redirect, an htmx request (an
overview's polling, a button) by `HX-Redirect`, so that the whole tab goes there rather than the
sign-in form being swapped into a box of the page. The sign-in page itself is simply shown. The
API answers as it answers any request without credentials, 401 with `WWW-Authenticate: Token`,
its detail saying why; a request that carries its own `Authorization` goes on, signed out of the
session, for its token to speak for it.
"""

from __future__ import annotations

import contextlib

from django.conf import settings
from django.contrib import messages
from django.contrib.auth import logout
from django.contrib.auth.views import redirect_to_login
from django.db import InterfaceError, OperationalError
from django.http import HttpRequest, HttpResponse, HttpResponseRedirect, JsonResponse
from django.shortcuts import resolve_url
from django_htmx.http import HttpResponseClientRedirect

from config.api import is_api
from identity import sessions

DATABASE_DOWN = (OperationalError, InterfaceError)
#: The scheme of the API's token (fleet.api.authentication), which a 401 names as DRF's does.
API_AUTH_SCHEME = "Token"


class SessionTimeoutMiddleware:
    """After the session, authentication and messages middleware (config/settings.py)."""

    def __init__(self, get_response):
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        # With the database down the session cannot be read: the view meets the outage too and
        # answers 503 (config/db_outage.py), which must not become a 500 here.
        try:
            ended = sessions.check_session(request)
        except DATABASE_DOWN:
            ended = None
        if ended is not None:
            response = self.signed_out(request, sessions.message_for(ended))
            if response is not None:
                return response
        response = self.get_response(request)
        with contextlib.suppress(DATABASE_DOWN):
            sessions.follow_key(request)
        return response

    def signed_out(self, request: HttpRequest, message: str) -> HttpResponse | None:
        """Sign the session out; the answer that says so, or None for the request to go on anonymous."""
        logout(request)
        if is_api(request):
            if "HTTP_AUTHORIZATION" in request.META:
                return None
            response = JsonResponse({"detail": message}, status=401)
            response["WWW-Authenticate"] = API_AUTH_SCHEME
            return response
        messages.info(request, message, fail_silently=True)
        login_url = resolve_url(settings.LOGIN_URL)
        if request.path == login_url:
            return None
        htmx = getattr(request, "htmx", None)
        if htmx:
            return HttpResponseClientRedirect(redirect_to_login(htmx.current_url_abs_path or "/", login_url).url)
        if request.method in ("GET", "HEAD"):
            return redirect_to_login(request.get_full_path(), login_url)
        return HttpResponseRedirect(login_url)  # a form sent after the limit: its page may not be there to go back to

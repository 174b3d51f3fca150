"""Sign-in throttling (django-axes): the backend that guards HTTP sign-ins, and the page a
locked-out user sees.

After AXES_FAILURE_LIMIT failed sign-ins from one address for one user name, that pair is
refused (even with the right password) until AXES_COOLOFF_TIME has passed since the last
failure; other users, and the same user from another address, are not affected, so a
guessing attacker cannot lock the studio out. API tokens never pass through `authenticate()`,
so automation is not throttled. Admins lift a lockout early with `manage.py axes_reset_username
<name>` (or `axes_reset` for all).

The address is the connection's, or behind reverse proxies (TRUSTED_PROXY_COUNT) the one
the outermost proxy saw: see `client_address`.
"""

from __future__ import annotations

import ipaddress
import math

from axes.backends import AxesStandaloneBackend
from axes.helpers import get_cool_off
from django.conf import settings
from django.shortcuts import render

LOCKED_OUT = "Too many failed sign-ins; try again in {minutes} minute{s}."
#: Django's User.username holds at most 150 characters.
USERNAME_MAX_CHARS = 150


class SignInThrottleBackend(AxesStandaloneBackend):
    """Axes' standalone backend for sign-ins over HTTP.

    `authenticate()` called without a request (management commands, the shell, the demo
    seeding's password checks) has no client address to throttle by; axes would raise, so
    such calls pass on to the model backend. Every web sign-in (the login page, the admin's
    login, DRF's session and basic authentication) passes the request.
    """

    def authenticate(self, request, username=None, password=None, **kwargs):
        if request is None:
            return None
        return super().authenticate(request, username=username, password=password, **kwargs)


def client_address(request) -> str | None:
    """The client address sign-in failures are counted against (AXES_CLIENT_IP_CALLABLE).

    With TRUSTED_PROXY_COUNT = 0, the connection's peer (REMOTE_ADDR). Behind N proxies that
    each append the address they received the request from, the N-th X-Forwarded-For entry
    from the right: the one the outermost proxy wrote. Entries left of it came from the
    client, which can write anything there, so a forged entry neither moves a client out of
    its lockout nor into someone else's. A header too short to hold that entry, or holding no
    address there, did not pass through every proxy: the connection's peer counts.
    (django-ipware's proxy_count reads the chain from the other end, counting the client's own
    entries, hence this function.)
    """
    peer = request.META.get("REMOTE_ADDR")
    count = settings.TRUSTED_PROXY_COUNT
    if count <= 0:
        return peer
    header = request.META.get("HTTP_X_FORWARDED_FOR", "")
    entries = [entry.strip() for entry in header.split(",")] if header.strip() else []
    if len(entries) < count:
        return peer
    try:
        return str(ipaddress.ip_address(entries[-count]))
    except ValueError:
        return peer


def username_of(request, credentials=None) -> str | None:
    """The user name a failure counts against (AXES_USERNAME_CALLABLE): as the form sent it, cut
    to the longest a user name can be and without NUL characters. Django's sign-in form hands any
    length on to `authenticate()`, and axes stored it as it came: PostgreSQL refused a name of
    5,000 characters or with a NUL in it, and the sign-in answered 500."""
    username = (credentials or {}).get("username") if credentials else request.POST.get("username")
    if username is None:
        return None
    return str(username).replace("\x00", "")[:USERNAME_MAX_CHARS]


def lockout_minutes(request) -> int:
    """The cool-off, in whole minutes (rounded up, at least 1)."""
    cool_off = get_cool_off(request)
    return max(1, math.ceil(cool_off.total_seconds() / 60)) if cool_off else 1


def lockout_response(request, original_response=None, credentials=None):
    """The sign-in page again, status 429, saying how long to wait; the user name stays filled."""
    minutes = lockout_minutes(request)
    return render(request, "registration/login.html", {
        "lockout_message": LOCKED_OUT.format(minutes=minutes, s="" if minutes == 1 else "s"),
        "username": (credentials or {}).get("username") or request.POST.get("username", ""),
        "next": request.POST.get("next", "") or request.GET.get("next", ""),
    }, status=429)

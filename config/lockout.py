"""Sign-in throttling (django-axes): the backend that guards HTTP sign-ins, the handler that
counts failures per name and per address, and the page a locked-out user sees.

After AXES_FAILURE_LIMIT failed sign-ins from one address for one user name, that pair is
refused (even with the right password) until AXES_COOLOFF_TIME has passed since the last
failure; other users, and the same user from another address, are not affected, so a
guessing attacker cannot lock the studio out. Password spraying (a few guesses at each of
many names) is caught by the address: AXES_ADDRESS_FAILURE_LIMIT failures from one address,
whatever the names, refuse every sign-in from it, fresh names and right passwords included
(see `SignInThrottleHandler`). API tokens never pass through `authenticate()`, so automation is
not throttled. Admins lift a lockout early with `manage.py axes_reset_username <name>`, an
address's with `manage.py axes_reset_ip <address>` (or `axes_reset` for all).

The address is the connection's, or behind reverse proxies (TRUSTED_PROXY_COUNT) the one
the outermost proxy saw: see `client_address`.
"""

from __future__ import annotations

import ipaddress
import math

from axes.attempts import get_cool_off_threshold
from axes.backends import AxesStandaloneBackend
from axes.handlers.database import AxesDatabaseHandler
from axes.helpers import get_client_username, get_cool_off
from axes.models import AccessAttempt
from axes.signals import user_locked_out
from django.conf import settings
from django.db.models import Sum, Value
from django.db.models.functions import Least
from django.shortcuts import render

LOCKED_OUT = "Too many failed sign-ins; try again in {minutes} minute{s}."
ADDRESS_LOCKED_OUT = "Too many failed sign-ins from your network address; try again in {minutes} minute{s}."
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


class SignInThrottleHandler(AxesDatabaseHandler):
    """Axes' database handler (AXES_HANDLER), plus a limit on the failures of one address.

    Axes compares every lockout parameter with one limit, and the per-name limit (a handful) is
    far too low for an address a whole studio may share behind NAT. So the address has its own
    limit, AXES_ADDRESS_FAILURE_LIMIT, counted from axes' own records: the failures from the
    address whose last attempt is within the cool-off, each name counting at most
    AXES_FAILURE_LIMIT. A name's records are deleted when it signs in (AXES_RESET_ON_SUCCESS),
    so colleagues' corrected typos never add up, and one user hammering a locked name counts
    as one locked name. An attacker spraying one guess at each of many names reaches the limit
    after AXES_ADDRESS_FAILURE_LIMIT guesses. Refused attempts are still recorded, so the
    lockout lasts until the address has been quiet for the cool-off; `axes_reset_ip` deletes
    the address's records and lifts it at once.
    """

    def is_locked(self, request, credentials=None) -> bool:
        return super().is_locked(request, credentials) or self.address_locked(request)

    def user_login_failed(self, sender, credentials: dict, request=None, **kwargs):
        super().user_login_failed(sender, credentials, request=request, **kwargs)
        if request is None or getattr(request, "axes_locked_out", False):
            return  # nothing to throttle by, or the name's own limit already locked it out
        if self.is_whitelisted(request, credentials) or not self.address_locked(request):
            return
        # What axes does when a name reaches its limit, so its middleware answers with the lockout page.
        request.axes_locked_out = True
        request.axes_credentials = credentials
        user_locked_out.send("axes", request=request, username=get_client_username(request, credentials),
                             ip_address=request.axes_ip_address)

    @staticmethod
    def address_failures(request) -> int:
        """Failures from the request's address within the cool-off, at most AXES_FAILURE_LIMIT a name."""
        per_name = (AccessAttempt.objects
                    .filter(ip_address=request.axes_ip_address, attempt_time__gte=get_cool_off_threshold(request))
                    .values("username")
                    .annotate(failures=Least(Sum("failures_since_start"), Value(settings.AXES_FAILURE_LIMIT))))
        return per_name.aggregate(total=Sum("failures"))["total"] or 0

    def address_locked(self, request) -> bool:
        """Whether the request's address has reached AXES_ADDRESS_FAILURE_LIMIT; marks the request
        so that the lockout page names the address rather than the user name."""
        limit = settings.AXES_ADDRESS_FAILURE_LIMIT
        if not limit or not settings.AXES_LOCK_OUT_AT_FAILURE or request.axes_ip_address is None:
            return False
        locked = self.address_failures(request) >= limit
        request.axes_address_locked = locked
        return locked


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
    """The sign-in page again, status 429, saying how long to wait and whether the name or the
    whole address is locked; the user name stays filled."""
    minutes = lockout_minutes(request)
    message = ADDRESS_LOCKED_OUT if getattr(request, "axes_address_locked", False) else LOCKED_OUT
    return render(request, "registration/login.html", {
        "lockout_message": message.format(minutes=minutes, s="" if minutes == 1 else "s"),
        "username": (credentials or {}).get("username") or request.POST.get("username", ""),
        "next": request.POST.get("next", "") or request.GET.get("next", ""),
    }, status=429)

"""LDAP / Active Directory sign-in settings, read from environment variables (docs/operations.md,
"Signing in with the studio directory").

Directory sign-in is on when AUTH_LDAP_SERVER_URI is set. It needs python-ldap and
django-auth-ldap (`make install-ldap`; python-ldap compiles against the system's OpenLDAP and SASL
headers), which a machine with only Python lacks: `make run` works without them, and setting
AUTH_LDAP_SERVER_URI there stops start-up with a message that says what to install. Every value
is checked here, so a typo in a DN or a flag fails at start-up, not at the first sign-in.

config.settings calls `ldap_settings()`; this module reads settings from nowhere else.
"""

from __future__ import annotations

import os
from urllib.parse import urlsplit

from django.core.exceptions import ImproperlyConfigured

from config.secrets import env_secret

#: The backend that signs people in against the directory (identity/ldap_backend.py).
LDAP_BACKEND = "identity.ldap_backend.DirectoryBackend"

#: AUTH_LDAP_GROUP_TYPE values: (django-auth-ldap group type class, default group search filter).
GROUP_TYPES = {
    "groupOfNames": ("GroupOfNamesType", "(objectClass=groupOfNames)"),
    "nestedGroupOfNames": ("NestedGroupOfNamesType", "(objectClass=groupOfNames)"),
    "groupOfUniqueNames": ("GroupOfUniqueNamesType", "(objectClass=groupOfUniqueNames)"),
    "posixGroup": ("PosixGroupType", "(objectClass=posixGroup)"),
    "activeDirectory": ("NestedActiveDirectoryGroupType", "(objectClass=group)"),
}

MISSING_LIBRARY = ("AUTH_LDAP_SERVER_URI is set, but directory sign-in needs python-ldap and django-auth-ldap, "
                   "which are not installed: run `make install-ldap` (python-ldap builds against "
                   "libldap2-dev and libsasl2-dev: apt-get install libldap2-dev libsasl2-dev), or unset "
                   "AUTH_LDAP_SERVER_URI to sign in with local accounts only.")


def _bool(name: str, default: bool = False) -> bool:
    value = os.environ.get(name, "").strip().lower()
    if not value:
        return default
    if value in {"1", "true", "yes", "on"}:
        return True
    if value in {"0", "false", "no", "off"}:
        return False
    raise ImproperlyConfigured(f"{name}={value!r} is not a boolean (use true or false)")


def _number(name: str, default: float) -> float:
    value = os.environ.get(name, "").strip()
    if not value:
        return default
    try:
        number = float(value)
    except ValueError:
        raise ImproperlyConfigured(f"{name}={value!r} is not a number of seconds") from None
    if number < 0:
        raise ImproperlyConfigured(f"{name}={value!r} must be 0 or more")
    return number


def _required(name: str, what: str) -> str:
    value = os.environ.get(name, "").strip()
    if not value:
        raise ImproperlyConfigured(f"{name} must be set with AUTH_LDAP_SERVER_URI ({what})")
    return value


def split_dns(value: str) -> list[str]:
    """DNs separated by ';' (a DN itself holds commas)."""
    return [part.strip() for part in value.split(";") if part.strip()]


def _check_dn(name: str, dn: str) -> str:
    import ldap.dn

    try:
        if not ldap.dn.str2dn(dn):
            raise ValueError
    except (ValueError, ldap.DECODING_ERROR):
        raise ImproperlyConfigured(f"{name}={dn!r} is not a distinguished name "
                                   f"(e.g. cn=fleet-admins,ou=groups,dc=studio,dc=example)") from None
    return dn


def server_label(uri: str) -> str:
    """How the login page names the server: its host (and port), never credentials or a path."""
    first = uri.split()[0] if uri.split() else uri
    parts = urlsplit(first)
    return parts.hostname + (f":{parts.port}" if parts.port else "") if parts.hostname else first


def ldap_settings() -> dict:
    """The AUTH_LDAP_* settings of django-auth-ldap and the product's own, or {} when off."""
    uri = os.environ.get("AUTH_LDAP_SERVER_URI", "").strip()
    if not uri:
        return {}
    try:
        import ldap
        from django_auth_ldap import config as ldap_config
    except ImportError:
        raise ImproperlyConfigured(MISSING_LIBRARY) from None
    for each in uri.split():
        if urlsplit(each).scheme not in ("ldap", "ldaps", "ldapi"):
            raise ImproperlyConfigured(f"AUTH_LDAP_SERVER_URI={uri!r}: each server must be an ldap://, ldaps:// "
                                       f"or ldapi:// URI")

    user_base = _required("AUTH_LDAP_USER_SEARCH_BASE", "the people subtree, e.g. ou=people,dc=studio,dc=example")
    user_filter = os.environ.get("AUTH_LDAP_USER_FILTER", "").strip() or "(uid=%(user)s)"
    if "%(user)s" not in user_filter:
        raise ImproperlyConfigured(f"AUTH_LDAP_USER_FILTER={user_filter!r} must contain %(user)s, where the "
                                   f"user name goes: (uid=%(user)s), or (sAMAccountName=%(user)s) for Active "
                                   f"Directory")
    group_base = _required("AUTH_LDAP_GROUP_SEARCH_BASE", "the subtree holding the admins' and artists' groups")
    group_type_name = os.environ.get("AUTH_LDAP_GROUP_TYPE", "").strip() or "groupOfNames"
    if group_type_name not in GROUP_TYPES:
        raise ImproperlyConfigured(f"AUTH_LDAP_GROUP_TYPE={group_type_name!r}: use one of "
                                   f"{', '.join(GROUP_TYPES)}")
    type_class, default_filter = GROUP_TYPES[group_type_name]
    group_filter = os.environ.get("AUTH_LDAP_GROUP_FILTER", "").strip() or default_filter

    admin_group = os.environ.get("AUTH_LDAP_ADMIN_GROUP", "").strip()
    artist_groups = split_dns(os.environ.get("AUTH_LDAP_ARTIST_GROUP", ""))
    if not admin_group and not artist_groups:
        raise ImproperlyConfigured("Set AUTH_LDAP_ADMIN_GROUP and/or AUTH_LDAP_ARTIST_GROUP (group DNs; several "
                                   "artists' groups separated by ';'): only their members may sign in")
    if admin_group:
        _check_dn("AUTH_LDAP_ADMIN_GROUP", admin_group)
    for dn in artist_groups:
        _check_dn("AUTH_LDAP_ARTIST_GROUP", dn)
    for name, dn in (("AUTH_LDAP_USER_SEARCH_BASE", user_base), ("AUTH_LDAP_GROUP_SEARCH_BASE", group_base)):
        _check_dn(name, dn)

    bind_dn = os.environ.get("AUTH_LDAP_BIND_DN", "").strip()
    bind_password = env_secret("AUTH_LDAP_BIND_PASSWORD")
    if bind_password and not bind_dn:
        raise ImproperlyConfigured("AUTH_LDAP_BIND_PASSWORD is set without AUTH_LDAP_BIND_DN")

    options = {ldap.OPT_REFERRALS: 0,  # Active Directory's referrals need credentials we do not have
               ldap.OPT_NETWORK_TIMEOUT: _number("AUTH_LDAP_TIMEOUT_S", 5.0),
               ldap.OPT_TIMEOUT: _number("AUTH_LDAP_TIMEOUT_S", 5.0)}
    ca_file = os.environ.get("AUTH_LDAP_CA_FILE", "").strip()
    start_tls = _bool("AUTH_LDAP_START_TLS")
    if ca_file:
        if not os.path.isfile(ca_file):
            raise ImproperlyConfigured(f"AUTH_LDAP_CA_FILE={ca_file}: no such file")
        options[ldap.OPT_X_TLS_CACERTFILE] = ca_file
    if ca_file or start_tls or uri.startswith("ldaps://"):
        options[ldap.OPT_X_TLS_REQUIRE_CERT] = ldap.OPT_X_TLS_DEMAND
        options[ldap.OPT_X_TLS_NEWCTX] = 0  # last: applies the TLS options above to this connection

    return {
        "AUTH_LDAP_SERVER_URI": uri,
        "AUTH_LDAP_BIND_DN": bind_dn,
        "AUTH_LDAP_BIND_PASSWORD": bind_password,
        "AUTH_LDAP_START_TLS": start_tls,
        "AUTH_LDAP_CONNECTION_OPTIONS": options,
        "AUTH_LDAP_USER_SEARCH": ldap_config.LDAPSearch(user_base, ldap.SCOPE_SUBTREE, user_filter),
        "AUTH_LDAP_GROUP_SEARCH": ldap_config.LDAPSearch(group_base, ldap.SCOPE_SUBTREE, group_filter),
        "AUTH_LDAP_GROUP_TYPE": getattr(ldap_config, type_class)(),
        "AUTH_LDAP_USER_ATTR_MAP": {"first_name": "givenName", "last_name": "sn", "email": "mail"},
        "AUTH_LDAP_ALWAYS_UPDATE_USER": True,
        "AUTH_LDAP_CACHE_TIMEOUT": 0,  # group membership is asked afresh: removals count at once
        # The product's own (identity/ldap_backend.py):
        "AUTH_LDAP_ADMIN_GROUP": admin_group,
        "AUTH_LDAP_ARTIST_GROUPS": artist_groups,
        "AUTH_LDAP_RECHECK_S": _number("AUTH_LDAP_RECHECK_S", 0.0),
        "AUTH_LDAP_OUTAGE_GRACE_S": _number("AUTH_LDAP_OUTAGE_GRACE_S", 900.0),
        "AUTH_LDAP_SYNC_INTERVAL_S": max(60.0, _number("AUTH_LDAP_SYNC_INTERVAL_S", 900.0)),
        "AUTH_LDAP_DISPLAY_NAME": os.environ.get("AUTH_LDAP_DISPLAY_NAME", "").strip() or "studio directory",
        "AUTH_LDAP_SERVER_LABEL": server_label(uri),
    }

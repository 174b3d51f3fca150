"""`Authorization: Token <key>`: scripts' API tokens, stored hashed (`fleet.api_tokens`).

The header is the one DRF's authtoken used, so existing scripts keep working; keys DRF stored
in plain text were moved into `ApiToken` as digests by migration fleet 0005. A wrong key, a
revoked or expired token (the message says when, and why it was revoked) or the token of an
inactive user gets 401 with `WWW-Authenticate: Token`.

The token's scope is enforced here too (`fleet.token_rules.scope_refusal`): a read token's
write and an ingest token's request to anything but an ingest view are 403 with a message
naming the scope. Here, because every API view that accepts a token authenticates it through
this class, while a view may replace the default permission classes with its own: a check among
the permissions would be dropped by the first view that sets `permission_classes`. A view that
takes pushed samples says so with `api_token_ingest = True`.
"""

from __future__ import annotations

import threading

from drf_spectacular.extensions import OpenApiAuthenticationExtension
from rest_framework import exceptions
from rest_framework.authentication import TokenAuthentication

from config.roles import is_fleet_admin
from fleet import api_tokens, token_rules

#: Whose each key was at its last request here (digest -> user id, admin or not): the list page
#: a script asks for is then fetched from the read cache with its token, in one round trip. Only
#: a guess: the page is taken only if the token found is still that user's, in that role.
_user_of_key: dict[str, tuple[int, bool]] = {}
_USERS_KEPT = 10_000
_lock = threading.Lock()


class ApiTokenAuthentication(TokenAuthentication):
    """`Token <key>` -> (the token's user, the ApiToken). DRF's parent class parses the header;
    a token whose scope does not cover the request is refused (403) before the view runs."""

    keyword = "Token"

    def authenticate(self, request):
        self.request = request  # an instance per request (APIView.get_authenticators)
        found = super().authenticate(request)
        if found is None:
            return None
        token = found[1]
        view = (getattr(request, "parser_context", None) or {}).get("view")
        refusal = token_rules.scope_refusal(token.scope, request.method,
                                            ingest_view=getattr(view, "api_token_ingest", False))
        if refusal is not None:
            raise exceptions.PermissionDenied(refusal)
        return found

    def authenticate_credentials(self, key: str):
        digest = api_tokens.key_digest(key)
        try:
            token = api_tokens.authenticate(key, along=self._page_along(digest))
        except api_tokens.KeyRefused as refused:
            raise exceptions.AuthenticationFailed(str(refused)) from None
        user_of = (token.user.pk, is_fleet_admin(token.user))
        if _user_of_key.get(digest) != user_of:
            with _lock:
                if len(_user_of_key) >= _USERS_KEPT:
                    _user_of_key.clear()
                _user_of_key[digest] = user_of
        return token.user, token

    def _page_along(self, digest: str) -> tuple[str, ...]:
        """The read-cache key of the list page this request asks for, if its key was seen before."""
        request = getattr(self, "request", None)
        view = (getattr(request, "parser_context", None) or {}).get("view")
        user_of = _user_of_key.get(digest)
        if user_of is None or not hasattr(view, "list_cache_key"):
            return ()
        key = view.list_cache_key(request, *user_of)
        return (key,) if key else ()


class ApiTokenScheme(OpenApiAuthenticationExtension):
    """Names the scheme "tokenAuth", as the schema did when DRF's own token class served it."""

    target_class = ApiTokenAuthentication
    name = "tokenAuth"
    priority = 1  # before drf-spectacular's extension for DRF's TokenAuthentication and its subclasses

    def get_security_definition(self, auto_schema):
        return {
            "type": "apiKey",
            "in": "header",
            "name": "Authorization",
            "description": f'Token-based authentication with required prefix "{self.target.keyword}"',
        }

"""`Authorization: Token <key>`: scripts' API tokens, stored hashed (`fleet.api_tokens`).

The header is the one DRF's authtoken used, so existing scripts keep working; keys DRF stored
in plain text were moved into `ApiToken` as digests by migration fleet 0005. A wrong or
revoked key, or the token of an inactive user, gets 401 with `WWW-Authenticate: Token`.
"""

from __future__ import annotations

from drf_spectacular.extensions import OpenApiAuthenticationExtension
from rest_framework import exceptions
from rest_framework.authentication import TokenAuthentication

from fleet import api_tokens


class ApiTokenAuthentication(TokenAuthentication):
    """`Token <key>` -> (the token's user, the ApiToken). DRF's parent class parses the header."""

    keyword = "Token"

    def authenticate_credentials(self, key: str):
        try:
            token = api_tokens.authenticate(key)
        except api_tokens.KeyRefused as refused:
            raise exceptions.AuthenticationFailed(str(refused)) from None
        return token.user, token


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

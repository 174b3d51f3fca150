"""Print the dashboard's OpenID Connect variables for a provider, from its discovery document.

    manage.py oidc_discover https://sso.studio.example/realms/studio

reads ISSUER_URL/.well-known/openid-configuration and prints the OIDC_OP_* endpoints and the
signing algorithm as lines for .env (docs/operations.md, "Signing in with OpenID Connect"); the
client id and secret, the groups and the claims are the studio's to add. Nothing is written.
"""

from __future__ import annotations

import requests
from django.conf import settings
from django.core.management.base import BaseCommand, CommandError

DISCOVERY = "/.well-known/openid-configuration"
#: The variables and the discovery document's keys they come from.
ENDPOINTS = {
    "OIDC_OP_AUTHORIZATION_ENDPOINT": "authorization_endpoint",
    "OIDC_OP_TOKEN_ENDPOINT": "token_endpoint",
    "OIDC_OP_USER_ENDPOINT": "userinfo_endpoint",
    "OIDC_OP_JWKS_ENDPOINT": "jwks_uri",
}


def env_lines(document: dict, source: str) -> list[str]:
    """The .env lines for the discovery `document` read from `source`; CommandError naming the
    keys the dashboard needs and the document lacks."""
    missing = [key for key in ENDPOINTS.values() if not isinstance(document.get(key), str) or not document[key]]
    if missing:
        raise CommandError(f"{source} does not give {', '.join(missing)}: is it an OpenID Connect provider?")
    lines = [f"# From {source}"]
    lines += [f"{name}={document[key]}" for name, key in ENDPOINTS.items()]
    offered = document.get("id_token_signing_alg_values_supported") or ["RS256"]
    algorithm = next((alg for alg in ("RS256", *settings.OIDC_SIGN_ALGOS) if alg in offered), None)
    if algorithm is None:
        raise CommandError(f"{source}: the provider signs ID tokens with {', '.join(map(str, offered))} only, "
                           f"none of {', '.join(settings.OIDC_SIGN_ALGOS)}")
    lines.append(f"OIDC_RP_SIGN_ALGO={algorithm}")
    methods = document.get("token_endpoint_auth_methods_supported") or ["client_secret_basic"]
    if "client_secret_post" not in methods:
        lines.append("OIDC_TOKEN_USE_BASIC_AUTH=true")
    if "groups" in (document.get("scopes_supported") or []):
        lines.append("# The provider has a `groups` scope: if its groups claim needs it (Okta), request it with")
        lines.append("# OIDC_RP_SCOPES=openid email profile groups")
    return lines


class Command(BaseCommand):
    help = "Print the OIDC_OP_* variables of an OpenID Connect provider, read from its discovery document."

    def add_arguments(self, parser):
        parser.add_argument("issuer", help="the provider's issuer URL, e.g. https://sso.studio.example/realms/studio")
        parser.add_argument("--timeout", type=float, default=10.0, help="seconds to wait for the provider")

    def handle(self, *args, issuer: str, timeout: float, **options):
        url = issuer if issuer.rstrip("/").endswith(DISCOVERY) else issuer.rstrip("/") + DISCOVERY
        try:
            response = requests.get(url, timeout=timeout, headers={"Accept": "application/json"})
            response.raise_for_status()
            document = response.json()
        except requests.RequestException as exc:
            raise CommandError(f"{url}: {exc}") from None
        if not isinstance(document, dict):
            raise CommandError(f"{url} is not a discovery document (a JSON object)")
        self.stdout.write("\n".join(env_lines(document, url)))

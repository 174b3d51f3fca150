"""A real OpenID Connect provider for the tests: django-oauth-toolkit with OIDC on, in a process of
its own (`python -m identity.tests.oidc_provider`), with its own settings, SQLite database and
RSA signing key, serving on loopback at a port of its own.

It stands in for a studio's Keycloak, Entra ID or Okta: people sign in on its login page, it
sends the dashboard back an authorization code (PKCE), and its token, userinfo and key endpoints
answer the dashboard's server-to-server calls. Like Entra ID and Okta's org server, it lists the
groups in the ID token only, not at the userinfo endpoint. The tests create its users and their
groups over HTTP (`views.put_user`, behind a token of the run); identity/tests/oidc_support.py
starts it and drives it. Nothing here imports the product.
"""

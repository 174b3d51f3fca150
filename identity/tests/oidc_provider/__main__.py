"""python -m identity.tests.oidc_provider --db PATH --client-id ID --client-secret SECRET
    --redirect-uri URI [--redirect-uri URI ...] --admin-token TOKEN

Migrates a fresh database, registers the dashboard as a confidential client of the authorization
code flow (RS256 ID tokens, no consent screen, as a studio's in-house application), then serves
on 127.0.0.1 at a port the system picks, which it prints as `port N` once it listens."""

import argparse
import os
import sys


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m identity.tests.oidc_provider")
    parser.add_argument("--db", required=True)
    parser.add_argument("--client-id", required=True)
    parser.add_argument("--client-secret", required=True)
    parser.add_argument("--redirect-uri", action="append", required=True)
    parser.add_argument("--admin-token", required=True)
    args = parser.parse_args(argv)
    os.environ["DJANGO_SETTINGS_MODULE"] = "identity.tests.oidc_provider.settings"
    os.environ["OIDC_PROVIDER_DB"] = args.db
    os.environ["OIDC_PROVIDER_ADMIN_TOKEN"] = args.admin_token

    import django

    django.setup()
    from django.core.management import call_command
    from django.core.servers.basehttp import ThreadedWSGIServer, WSGIRequestHandler
    from django.core.wsgi import get_wsgi_application
    from oauth2_provider.models import Application

    call_command("migrate", run_syncdb=True, verbosity=0)
    Application.objects.create(
        name="vGPU fleet dashboard", client_id=args.client_id, client_secret=args.client_secret,
        client_type=Application.CLIENT_CONFIDENTIAL, authorization_grant_type=Application.GRANT_AUTHORIZATION_CODE,
        redirect_uris=" ".join(args.redirect_uri), algorithm=Application.RS256_ALGORITHM, skip_authorization=True)
    server = ThreadedWSGIServer(("127.0.0.1", 0), WSGIRequestHandler)
    server.set_app(get_wsgi_application())
    print(f"port {server.server_address[1]}", flush=True)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        sys.exit(0)


if __name__ == "__main__":
    main()

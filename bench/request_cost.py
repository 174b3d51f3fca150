"""CPU cost of one request, in process (Django's test client), on the database bench/load.py seeded.

    cd <checkout to measure> && N=9 SECRET_KEY=... python <path>/bench/request_cost.py

Run from the checkout whose code is measured (its directory comes first on the import path),
with the DATABASE_URL and CACHE_URL bench/load.py used. For each target: `hit` is the same
request again with no write in between; `after write` has a host edited (an ORM save, as the
writer of bench/load.py does) before each request. The median CPU time of this process, so
PostgreSQL's and Redis's own time is not included, and a loaded machine disturbs it far less
than it does wall-clock figures.
"""
import os
import sys
import time

sys.path.insert(0, os.getcwd())
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")
os.environ.setdefault("DATABASE_URL", "postgres://postgres@127.0.0.1:5432/bench_load")
os.environ.setdefault("CACHE_URL", "redis://127.0.0.1:6379/0")
os.environ.update(DEBUG="false", ALLOWED_HOSTS="testserver", SECURE_PROXY_SSL_HEADER="true")
import django  # noqa: E402

django.setup()
from django.contrib.auth import get_user_model  # noqa: E402
from django.test import Client  # noqa: E402

from fleet.api_tokens import issue_token  # noqa: E402
from fleet.models import Host  # noqa: E402

N = int(os.environ.get("N", "15"))
admin = get_user_model().objects.get(username="admin")
key = issue_token(admin, "cost.py")[1]
web = Client(HTTP_X_FORWARDED_PROTO="https")
web.force_login(admin)
api = Client(HTTP_X_FORWARDED_PROTO="https", HTTP_AUTHORIZATION=f"Token {key}")
targets = [("/", web), ("/overview/live/", web)] + [(p, api) for p in (
    "/api/v1/hosts/", "/api/v1/gpus/", "/api/v1/vms/", "/api/v1/audit-events/", "/api/v1/agents/")]
host = Host.objects.order_by("pk").last()


def cost(path, client, write):
    client.get(path)
    spent = []
    for _ in range(N):
        if write:
            host.ram_gib = 1024 if host.ram_gib != 1024 else 768
            host.save(update_fields=["ram_gib"])
        start = time.process_time()
        response = client.get(path)
        spent.append((time.process_time() - start) * 1000)
        assert response.status_code == 200, (path, response.status_code)
    spent.sort()
    return spent[len(spent) // 2]


print(f"{'target':24} {'hit ms':>8} {'after write ms':>15}   (median CPU ms of {N})")
for path, client in targets:
    print(f"{path:24} {cost(path, client, False):8.1f} {cost(path, client, True):15.1f}", flush=True)

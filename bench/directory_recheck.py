"""What asking the directory on every request costs: one page (/me/) for a directory user whose
role is re-checked against a real slapd (AUTH_LDAP_RECHECK_S=0, the default), beside the same
page for the same user with the answer cached (AUTH_LDAP_RECHECK_S=60) and for a local account.

    DEBUG=true python bench/directory_recheck.py        (needs slapd and `make install-ldap`)

Starts a private slapd (identity/tests/slapd.py) on loopback and an SQLite database in a
temporary folder; prints the median wall-clock time per request of each (the three interleaved), and the ratio.
"""
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, os.getcwd())
folder = Path(tempfile.mkdtemp(prefix="bench-directory-"))
os.environ.update(DEBUG="true", DATABASE_URL="", CACHE_URL="locmem://", DJANGO_SETTINGS_MODULE="config.settings",
                  SQLITE_PATH=str(folder / "db.sqlite3"))
from identity.tests.slapd import PASSWORD, ldap_env, start_slapd  # noqa: E402

server = start_slapd(folder / "slapd")
os.environ.update(ldap_env(server))
import django  # noqa: E402

django.setup()
from django.conf import settings  # noqa: E402
from django.core.management import call_command  # noqa: E402
from django.test import Client  # noqa: E402
from django.test.utils import setup_test_environment  # noqa: E402

from fleet.tests.factories import ArtistFactory, UserFactory  # noqa: E402

setup_test_environment()
call_command("migrate", verbosity=0)
N = int(os.environ.get("N", "200"))
ArtistFactory(name="Local Artist", user=UserFactory(username="local", password="local-pass-word-1"))


def signed_in(username: str, password: str) -> Client:
    client = Client(REMOTE_ADDR="10.9.0.1")
    assert client.post("/login/", {"username": username, "password": password}).status_code == 302
    return client


def timed(client: Client) -> float:
    start = time.perf_counter()
    assert client.get("/me/").status_code == 200
    return time.perf_counter() - start


try:
    directory_user, local_user = signed_in("bob", PASSWORD), signed_in("local", "local-pass-word-1")
    times = {"every": [], "cached": [], "local": []}
    for _ in range(N):  # interleaved, so a busy moment of the machine falls on all three alike
        settings.AUTH_LDAP_RECHECK_S = 0
        times["every"].append(timed(directory_user))
        settings.AUTH_LDAP_RECHECK_S = 60
        times["cached"].append(timed(directory_user))
        times["local"].append(timed(local_user))
    every, cached, local = (statistics.median(times[k]) * 1000 for k in ("every", "cached", "local"))
    print(f"GET /me/, median of {N}: directory user checked every request {every:.2f} ms, "
          f"checked once a minute {cached:.2f} ms, local account {local:.2f} ms")
    print(f"asking the directory adds {every - cached:.2f} ms a request ({every / cached:.2f}x the cached page)")
finally:
    server.stop()

"""Health checks of the web and beat containers (docker-compose.yml): `python -m config.health
web` and `python -m config.health beat`. Each exits 0 when healthy, 1 with the reason.

web: GET /healthz on the container's own port, named by the first of ALLOWED_HOSTS (a request
for 127.0.0.1 is refused once ALLOWED_HOSTS names only the public name). /healthz needs no
login, is exempt from the https redirect and answers 503 while PostgreSQL is unreachable.

beat: a running beat process is not enough: a beat stuck on a lost database connection sends
nothing while its container looks up. django-celery-beat's DatabaseScheduler writes each
entry's last run time back to the database every few minutes (Celery's `sync_every`, 180 s),
so an enabled entry that runs often (the agent poll, every 10 s) and has not run for longer
than `--max-age-s` means beat has stopped sending.
"""

from __future__ import annotations

import argparse
import os
import sys
import urllib.error
import urllib.request
from datetime import timedelta


def web_problem(port: int, timeout_s: float) -> str | None:
    """Why GET /healthz on this container's `port` failed, or None when it answered 200."""
    host = os.environ.get("ALLOWED_HOSTS", "").split(",")[0].strip().lstrip(".")
    if host in ("", "*"):
        host = "localhost"
    request = urllib.request.Request(f"http://127.0.0.1:{port}/healthz", headers={"Host": host})
    try:
        with urllib.request.urlopen(request, timeout=timeout_s):
            return None
    except urllib.error.HTTPError as exc:
        return f"/healthz answered HTTP {exc.code}: {exc.read(500).decode(errors='replace')}"
    except OSError as exc:
        return f"/healthz unreachable: {exc}"


def stale_beat_entries(max_age_s: float) -> list[str]:
    """Names of the enabled interval entries, due at least twice per `max_age_s`, whose last
    run is older than `max_age_s` (or that never ran)."""
    from django.utils import timezone
    from django_celery_beat.models import PeriodicTask

    now = timezone.now()
    stale = []
    for task in PeriodicTask.objects.filter(enabled=True, interval__isnull=False).select_related("interval"):
        every_s = task.interval.schedule.run_every.total_seconds()
        if every_s * 2 > max_age_s:
            continue
        if task.last_run_at is None or now - task.last_run_at > timedelta(seconds=max_age_s):
            stale.append(task.name)
    return sorted(stale)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m config.health", description=__doc__.splitlines()[0])
    parser.add_argument("component", choices=["web", "beat"])
    parser.add_argument("--port", type=int, default=8000, help="web: the port gunicorn listens on (default 8000)")
    parser.add_argument("--max-age-s", type=float, default=420.0,
                        help="oldest acceptable last run of a frequent entry (default 420: sync every 180 s, "
                             "plus margin)")
    args = parser.parse_args(argv)
    if args.component == "web":
        problem = web_problem(args.port, timeout_s=5)
        if problem:
            print(problem, file=sys.stderr)
            return 1
        print("web ok")
        return 0
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")
    import django

    django.setup()
    stale = stale_beat_entries(args.max_age_s)
    if stale:
        print(f"beat sent none of {', '.join(stale)} in the last {args.max_age_s:g} s", file=sys.stderr)
        return 1
    print("beat ok")
    return 0


if __name__ == "__main__":
    sys.exit(main())

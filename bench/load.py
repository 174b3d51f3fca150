"""Load figure: the overview page and the main API lists under concurrent clients, through gunicorn.

    python bench/load.py [--hosts 1000] [--clients 50] [--seconds 60] [--workers N] [--threads N] [--reuse]
                         [--compare] [--no-writes]

Seeds a studio of `--hosts` hosts (`fleet.demo.seed_demo`, plus an agent per host, resize
requests and audit events) in a private PostgreSQL database (DATABASE_URL, default
postgres://postgres@127.0.0.1:5432/bench_load, dropped and created here; `--reuse` keeps one
already seeded), collects the static files and starts gunicorn as production runs it: DEBUG off,
whitenoise, TLS ended by a proxy in front (X-Forwarded-Proto: https). Then `--clients` threads,
each with its own keep-alive connection, cycle through the targets for `--seconds` seconds: `/`
with a signed-in admin session, the API lists with a staff token. Prints requests/s and
p50/p95/p99 latency per target and overall, and the errors (any answer but 200, or a failed
connection). Meanwhile a writer thread writes as a live fleet does (`writer`; `--no-writes`
turns it off), so the read cache (config/read_cache.py) is measured with entries going stale.
The clients run on the same machine as the server and take some of its CPU.
Asserts nothing; exits 1 when a request failed.
"""

from __future__ import annotations

import argparse
import http.client
import os
import re
import secrets
import socket
import subprocess
import sys
import threading
import time
from collections import defaultdict
from pathlib import Path
from urllib.parse import urlencode, urlsplit

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")
os.environ.setdefault("DATABASE_URL", "postgres://postgres@127.0.0.1:5432/bench_load")
# The writer thread below and the server share the read cache, as a worker and the web do.
os.environ.setdefault("CACHE_URL", "redis://127.0.0.1:6379/0")

import django  # noqa: E402

django.setup()

from django.core.management import call_command  # noqa: E402
from django.db import connection  # noqa: E402
from proc_cpu import process_cpu_s  # noqa: E402 (bench/)

ADMIN_USERNAME = "admin"
PAGE = "/"
API_LISTS = ["/api/v1/hosts/", "/api/v1/gpus/", "/api/v1/vms/", "/api/v1/vgpus/", "/api/v1/agents/",
             "/api/v1/resize-requests/", "/api/v1/audit-events/"]
#: Rows the lists would hold after months of use by a studio of this size, per host.
RESIZE_REQUESTS_PER_HOST = 0.5
#: Hosts seeded through `seed_demo` itself (the proof-of-concept server and the first studio hosts).
DEMO_HOSTS = 8
AUDIT_EVENTS_PER_HOST = 20


def recreate_database() -> None:
    """Drop and create the database DATABASE_URL names, from the server's `postgres` database."""
    import psycopg

    url = urlsplit(os.environ["DATABASE_URL"])
    name = url.path.lstrip("/")
    if not re.fullmatch(r"[a-z_][a-z0-9_]*", name):
        raise SystemExit(f"refusing to drop database {name!r}: not a plain lower-case name")
    admin_url = url._replace(path="/postgres").geturl()
    connection.close()
    with psycopg.connect(admin_url, autocommit=True) as conn:
        conn.execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")
        conn.execute(f"CREATE DATABASE {name}")


def seeded_hosts() -> int:
    from fleet.models import Host

    try:
        return Host.objects.count()
    except Exception:  # noqa: BLE001 - no database or no tables yet: nothing seeded
        return 0


def seed(hosts: int, admin_password: str) -> None:
    """The demo studio: its first hosts through `seed_demo` (services, rules checked, logins),
    the rest from the same plans in bulk (seed_demo takes about a second a host). Then the rows
    of the other lists: an agent per host, resize requests and audit events."""
    from datetime import timedelta

    from django.contrib.auth import get_user_model
    from django.contrib.auth.hashers import make_password
    from django.utils import timezone

    from fleet import demo
    from fleet.choices import GpuMode, ResizeStatus
    from fleet.models import Artist, AuditEvent, Gpu, GpuModel, Host, ResizeRequest, Vgpu, VgpuProfile, VirtualMachine
    from telemetry.models import Agent

    started = time.perf_counter()
    demo.seed_demo(hosts=min(hosts, DEMO_HOSTS), admin_username=ADMIN_USERNAME, admin_password=admin_password)
    plans = demo.plan_studio(demo.resolve_boards(demo.DEFAULT_GPU_MODELS), hosts, demo.DEFAULT_SEED)
    plans = [plan for plan in plans if not Host.objects.filter(name=plan.name).exists()]
    models = {m.name: m for m in GpuModel.objects.all()}
    profiles = {p.name: p for p in VgpuProfile.objects.all()}
    host_rows = Host.objects.bulk_create(
        Host(name=p.name, hypervisor=p.hypervisor, cpu_model=p.cpu_model, cpu_threads=p.cpu_threads,
             ram_gib=p.ram_gib) for p in plans)
    gpu_rows = Gpu.objects.bulk_create(
        Gpu(host=host, gpu_model=models[p.board.name], pci_bus_id=g.pci_bus_id, mode=GpuMode.VGPU,
            size_mode=g.size_mode, uuid=f"GPU-bench-{p.name}-{i}")
        for host, p in zip(host_rows, plans, strict=True) for i, g in enumerate(p.gpus))
    gpus_of = defaultdict(list)
    for gpu in gpu_rows:
        gpus_of[gpu.host_id].append(gpu)
    User = get_user_model()
    taken = set(User.objects.values_list("username", flat=True))
    password_hash = make_password(secrets.token_urlsafe(12))
    seats = [(host, seat) for host, p in zip(host_rows, plans, strict=True) for seat in p.seats]
    users = []
    for _, seat in seats:
        username, suffix = seat.username, 1
        while username in taken:
            suffix += 1
            username = f"{seat.username}{suffix}"
        taken.add(username)
        users.append(User(username=username, password=password_hash))
    users = User.objects.bulk_create(users)
    artists = Artist.objects.bulk_create(
        Artist(user=user, name=seat.artist_name, workflow=seat.workflow, user_type=seat.user_type)
        for user, (_, seat) in zip(users, seats, strict=True))
    vms = VirtualMachine.objects.bulk_create(
        VirtualMachine(name=seat.vm_name, artist=artist, host=host, vcpus=seat.vcpus, ram_gib=seat.ram_gib)
        for artist, (host, seat) in zip(artists, seats, strict=True))
    # Straight rows, not placement: the figures are about reading; one slot per vGPU keeps them unique.
    next_slot = defaultdict(int)
    vgpu_rows = []
    for vm, (host, seat) in zip(vms, seats, strict=True):
        for index in seat.gpus:
            gpu = gpus_of[host.pk][index]
            vgpu_rows.append(Vgpu(vm=vm, gpu=gpu, profile=profiles[seat.profile], placement_id=next_slot[gpu.pk]))
            next_slot[gpu.pk] += 1
    Vgpu.objects.bulk_create(vgpu_rows)

    Agent.objects.bulk_create(
        Agent(name=f"agent-{host.name}", url=f"http://{host.name}:9410", host=host, token_salt=secrets.token_hex(8),
              token_sha256=secrets.token_hex(32))
        for host in Host.objects.order_by("pk")
    )
    requests = int(hosts * RESIZE_REQUESTS_PER_HOST)
    vgpus = list(Vgpu.objects.select_related("vm__artist__user", "profile").order_by("pk")[:requests])
    statuses = [ResizeStatus.PENDING, ResizeStatus.APPROVED, ResizeStatus.REJECTED]
    ResizeRequest.objects.bulk_create(
        ResizeRequest(vm=v.vm, current_profile=v.profile, requested_profile=v.profile, requested_vgpus=1,
                      reason="More frame buffer for the next sequence", status=statuses[i % 3],
                      requested_by=v.vm.artist.user if v.vm.artist else None)
        for i, v in enumerate(vgpus)
    )
    now = timezone.now()
    AuditEvent.objects.bulk_create(
        AuditEvent(at=now - timedelta(minutes=i), actor_name=ADMIN_USERNAME, source="web", action="host.update",
                   object_type="host", object_id=str(i % hosts + 1), object_repr=f"host {i % hosts + 1}",
                   before={"ram_gib": 512}, after={"ram_gib": 1024})
        for i in range(hosts * AUDIT_EVENTS_PER_HOST)
    )
    print(f"seeded {hosts} hosts in {time.perf_counter() - started:.0f} s")


def inventory() -> str:
    from fleet.models import AuditEvent, Gpu, Host, ResizeRequest, Vgpu, VirtualMachine
    from telemetry.models import Agent

    counts = {model.__name__: model.objects.count()
              for model in (Host, Gpu, VirtualMachine, Vgpu, Agent, ResizeRequest, AuditEvent)}
    return ", ".join(f"{n} {name}" for name, n in counts.items())


def staff_token() -> str:
    from django.contrib.auth import get_user_model

    from fleet.api_tokens import issue_token

    admin = get_user_model().objects.get(username=ADMIN_USERNAME)
    return issue_token(admin, "bench/load.py")[1]


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def production_env(port: int) -> dict[str, str]:
    """Settings of a production deployment behind a TLS proxy, on loopback."""
    return {**os.environ, "DEBUG": "false", "SECRET_KEY": secrets.token_urlsafe(40), "ALLOWED_HOSTS": "127.0.0.1",
            "SECURE_PROXY_SSL_HEADER": "true", "CSRF_TRUSTED_ORIGINS": f"https://127.0.0.1:{port}",
            "DJANGO_SETTINGS_MODULE": "config.settings",
            # Production shares its read cache through Redis (REDIS_URL); the web workers here do too.
            "CACHE_URL": os.environ["CACHE_URL"]}


def start_gunicorn(port: int, workers: int | None, threads: int | None, *, read_cache: bool = True) -> subprocess.Popen:
    """gunicorn with the web container's own settings (config/gunicorn.conf.py), access log included."""
    env = {**production_env(port), "WEB_BIND": f"127.0.0.1:{port}", "READ_CACHE_ENABLED": str(read_cache).lower()}
    if workers:
        env["WEB_WORKERS"] = str(workers)
    if threads:
        env["WEB_THREADS"] = str(threads)
    # With DEBUG off the pages name the hashed files of whitenoise's manifest.
    subprocess.run([sys.executable, "manage.py", "collectstatic", "--noinput", "-v0"], cwd=ROOT, env=env, check=True)
    command = [str(Path(sys.executable).with_name("gunicorn")), "config.wsgi:application",
               "--config", "config/gunicorn.conf.py", "--log-level", "warning"]
    server = subprocess.Popen(command, cwd=ROOT, env=env, stdout=subprocess.DEVNULL)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            status, _, _ = request(http.client.HTTPConnection("127.0.0.1", port, timeout=5), "/healthz", {})
            if status == 200:
                return server
        except OSError:
            time.sleep(0.3)
    server.terminate()
    raise SystemExit("gunicorn did not answer /healthz within 60 s")


BASE_HEADERS = {"X-Forwarded-Proto": "https", "Host": "127.0.0.1"}


def request(conn: http.client.HTTPConnection, path: str, headers: dict, method: str = "GET",
            body: str | None = None) -> tuple[int, http.client.HTTPMessage, bytes]:
    conn.request(method, path, body=body, headers={**BASE_HEADERS, **headers})
    response = conn.getresponse()
    return response.status, response.headers, response.read()


def cookies_of(headers: http.client.HTTPMessage) -> dict[str, str]:
    return dict(c.split(";", 1)[0].split("=", 1) for c in headers.get_all("Set-Cookie") or [])


def sign_in(port: int, password: str) -> str:
    """Sign in through the login page, as a browser does; returns the Cookie header of the session."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    status, headers, body = request(conn, "/login/", {})
    csrf_cookie = cookies_of(headers)["csrftoken"]
    csrf_form = re.search(rb'name="csrfmiddlewaretoken" value="([^"]+)"', body).group(1).decode()
    form = urlencode({"username": ADMIN_USERNAME, "password": password, "csrfmiddlewaretoken": csrf_form, "next": "/"})
    status, headers, _ = request(conn, "/login/", {
        "Cookie": f"csrftoken={csrf_cookie}", "Content-Type": "application/x-www-form-urlencoded",
        "Referer": f"https://127.0.0.1:{port}/login/", "Origin": f"https://127.0.0.1:{port}",
    }, method="POST", body=form)
    session = cookies_of(headers).get("sessionid")
    if status != 302 or not session:
        raise SystemExit(f"signing in failed: {status}")
    return f"sessionid={session}; csrftoken={csrf_cookie}"


class Results:
    def __init__(self):
        self.lock = threading.Lock()
        self.latencies_ms: dict[str, list[float]] = defaultdict(list)
        self.errors: dict[str, list[str]] = defaultdict(list)


def client(port: int, targets: list[tuple[str, dict]], start: int, until: float, record_after: float,
           results: Results) -> None:
    """One user: a keep-alive connection, the targets in turn from `start`, until `until`."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    latencies, errors = defaultdict(list), defaultdict(list)
    i = start
    while (now := time.monotonic()) < until:
        path, headers = targets[i % len(targets)]
        i += 1
        began = time.perf_counter()
        try:
            status, _, _ = request(conn, path, headers)
            error = None if status == 200 else f"HTTP {status}"
        except (OSError, http.client.HTTPException) as exc:
            error = f"{type(exc).__name__}: {exc}"
            conn.close()
        elapsed_ms = (time.perf_counter() - began) * 1000
        if now < record_after:
            continue
        latencies[path].append(elapsed_ms)
        if error:
            errors[path].append(error)
    conn.close()
    with results.lock:
        for path, values in latencies.items():
            results.latencies_ms[path].extend(values)
        for path, values in errors.items():
            results.errors[path].extend(values)


#: The writer's pace: the collector's status writes of a 1,000-agent fleet polled every 10 s, and
#: an admin's inventory edit (with its audit event) every few seconds.
AGENTS_SEEN_PER_S = 100
INVENTORY_EDIT_EVERY_S = 5


def writer(until: float, done: list[int]) -> None:
    """Writes while the clients read, as a live fleet does, so the read cache is measured with
    its entries going stale: each second the collector's UPDATE of 100 agents' last_seen (the
    agents list is recomputed), every INVENTORY_EDIT_EVERY_S an admin edit of a host and its
    audit event (the hosts, GPUs and audit lists and the overview are recomputed)."""
    from django.db import connection, transaction
    from django.utils import timezone

    from fleet import audit, locks
    from fleet.models import Host
    from telemetry.models import Agent

    agent_ids = list(Agent.objects.order_by("pk").values_list("pk", flat=True))
    host_ids = list(Host.objects.order_by("pk").values_list("pk", flat=True))
    tick = 0
    while time.monotonic() < until:
        next_tick = time.monotonic() + 1
        start = tick * AGENTS_SEEN_PER_S % len(agent_ids)
        Agent.objects.filter(pk__in=agent_ids[start:start + AGENTS_SEEN_PER_S]).update(last_seen=timezone.now())
        done[0] += 1
        if tick % INVENTORY_EDIT_EVERY_S == 0:
            with transaction.atomic():
                host_id = host_ids[tick % len(host_ids)]
                host = locks.lock_for_change(hosts=[host_id]).hosts[host_id]
                before = audit.snapshot(host)
                host.ram_gib = 1024 if host.ram_gib != 1024 else 768
                host.save(update_fields=["ram_gib"])
                audit.record("host.update", host, before=before, after=audit.snapshot(host), comment="bench/load.py")
            done[1] += 1
        tick += 1
        time.sleep(max(0.0, next_tick - time.monotonic()))
    connection.close()


def percentile(sorted_values: list[float], pct: float) -> float:
    return sorted_values[min(len(sorted_values) - 1, int(len(sorted_values) * pct / 100))]


def report(results: Results, seconds: float) -> int:
    rows = [*results.latencies_ms, "overall"]
    every = sorted(v for values in results.latencies_ms.values() for v in values)
    print(f"\n{'target':28} {'req/s':>7} {'p50 ms':>7} {'p95 ms':>7} {'p99 ms':>7} {'errors':>7}")
    failed = 0
    for path in rows:
        values = every if path == "overall" else sorted(results.latencies_ms[path])
        errors = sum(map(len, results.errors.values())) if path == "overall" else len(results.errors[path])
        failed = max(failed, errors)
        print(f"{path:28} {len(values) / seconds:7.1f} {percentile(values, 50):7.1f} {percentile(values, 95):7.1f} "
              f"{percentile(values, 99):7.1f} {errors:7d}")
    for path, errors in results.errors.items():
        if errors:
            print(f"  {path}: {len(errors)} errors, first: {errors[0]}")
    return 1 if failed else 0


def gunicorn_shape(args) -> str:
    env = {**os.environ, **({"WEB_WORKERS": str(args.workers)} if args.workers else {}),
           **({"WEB_THREADS": str(args.threads)} if args.threads else {})}
    shape = subprocess.run([sys.executable, "-c", "import runpy; c = runpy.run_path('config/gunicorn.conf.py'); "
                            "print(c['workers'], c['threads'])"], cwd=ROOT, env=env, capture_output=True, text=True,
                           check=True).stdout.split()
    cache_url = production_env(0)["CACHE_URL"]
    return f"{shape[0]} workers x {shape[1]} threads (config/gunicorn.conf.py), read cache {cache_url}"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--hosts", type=int, default=1000, help="hosts of the seeded studio (default 1000)")
    parser.add_argument("--clients", type=int, default=50, help="concurrent clients (default 50)")
    parser.add_argument("--seconds", type=float, default=60, help="measured duration (default 60)")
    parser.add_argument("--warmup", type=float, default=5, help="seconds of load before measuring (default 5)")
    parser.add_argument("--workers", type=int, help="gunicorn worker processes (default: config/gunicorn.conf.py)")
    parser.add_argument("--threads", type=int, help="threads per gunicorn worker (default: config/gunicorn.conf.py)")
    parser.add_argument("--target", action="append", help="only this path (repeatable; default: all)")
    parser.add_argument("--reuse", action="store_true", help="keep the database if it holds --hosts hosts")
    parser.add_argument("--compare", action="store_true",
                        help="run twice, the read cache off then on, and print the ratio")
    parser.add_argument("--no-writes", action="store_true",
                        help="no writer thread, so every read may come from the read cache "
                             "(default: write as a live fleet does)")
    args = parser.parse_args()

    admin_password = "bench-" + secrets.token_urlsafe(12)
    if not (args.reuse and seeded_hosts() >= args.hosts):
        recreate_database()
        call_command("migrate", verbosity=0, interactive=False)
        seed(args.hosts, admin_password)
    else:
        from django.contrib.auth import get_user_model

        admin = get_user_model().objects.get(username=ADMIN_USERNAME)
        admin.set_password(admin_password)
        admin.save(update_fields=["password"])
    token = staff_token()
    with connection.cursor() as cursor:
        cursor.execute("ANALYZE")
        cursor.execute("SHOW server_version")
        pg_version = cursor.fetchone()[0]
    print(f"database: {inventory()}")
    connection.close()

    print(f"load: {args.clients} clients for {args.seconds:.0f} s (after {args.warmup:.0f} s warm-up) on "
          f"gunicorn {gunicorn_shape(args)}, PostgreSQL {pg_version}, {os.cpu_count()} CPUs")
    if not args.compare:
        return measure(args, admin_password, token, read_cache=True)[0]
    # Side by side on the same database: the same load with the read cache off, then on.
    failed_off, off = measure(args, admin_password, token, read_cache=False)
    failed_on, on = measure(args, admin_password, token, read_cache=True)
    print(f"\nread cache on / off: {on[0] / off[0]:.1f}x the requests/s, p95 {on[1]:.0f} ms vs {off[1]:.0f} ms "
          f"({off[1] / on[1]:.1f}x lower)")
    return max(failed_off, failed_on)


def _children(pid: int) -> list[int]:
    return [int(child) for task in Path(f"/proc/{pid}/task").glob("*") for child in _read(task / "children").split()]


def _database_backends() -> list[int]:
    """PostgreSQL's server processes serving this database (the pages' and the writer's)."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT pid FROM pg_stat_activity WHERE datname = current_database()")
        return [row[0] for row in cursor.fetchall()]


def _redis_pids() -> list[int]:
    return [int(p.parent.name) for p in Path("/proc").glob("[0-9]*/comm")
            if p.exists() and _read(p).strip() == "redis-server"]


def _read(path: Path) -> str:
    try:
        return path.read_text()
    except OSError:
        return ""


class CpuMeter:
    """CPU seconds used by each part of the stack between `start()` and `stop()`: the gunicorn
    master and its workers (exited, recycled workers included through the master's children's
    time), PostgreSQL's backends of the bench database, Redis (shared with whatever else uses
    that server), and this process (the clients and the writer). CPU time, unlike latency, is
    barely disturbed by other work on a shared machine, so CPU ms per request is the figure
    that compares code changes there."""

    def __init__(self, server_pid: int):
        self.server_pid = server_pid

    def snapshot(self) -> dict[str, float | dict[int, float]]:
        return {
            "gunicorn": process_cpu_s(self.server_pid, children=True)
            + sum(map(process_cpu_s, _children(self.server_pid))),
            # By backend: one that ended in the window (a connection closed and opened again) is
            # left out rather than counted against the others.
            "postgresql": {pid: process_cpu_s(pid) for pid in _database_backends()},
            "redis": sum(map(process_cpu_s, _redis_pids())),
            "clients": time.process_time(),
        }

    def start(self) -> None:
        self.started = self.snapshot()

    def stop(self) -> dict[str, float]:
        ended = self.snapshot()
        used = {}
        for part, value in ended.items():
            if isinstance(value, dict):
                used[part] = sum(cpu - self.started[part].get(pid, 0.0) for pid, cpu in value.items())
            else:
                used[part] = value - self.started[part]
        return used


def clients_per_worker(server_pid: int, port: int) -> list[int]:
    """How many open client connections each gunicorn worker holds (a keep-alive connection stays
    with the worker that accepted it), from /proc: the established sockets on the server's port,
    matched to the workers' file descriptors."""
    established = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for line in _read(Path(table)).splitlines()[1:]:
            fields = line.split()
            if int(fields[1].rsplit(":", 1)[1], 16) == port and fields[3] == "01":
                established.add(fields[9])
    counts = []
    for worker in _children(server_pid):
        sockets = set()
        for fd in Path(f"/proc/{worker}/fd").glob("*"):
            try:
                target = os.readlink(fd)
            except OSError:
                continue
            if target.startswith("socket:["):
                sockets.add(target[8:-1])
        counts.append(len(sockets & established))
    return sorted(counts, reverse=True)


def measure(args, admin_password: str, token: str, *, read_cache: bool) -> tuple[int, tuple[float, float]]:
    """One run: gunicorn started with the read cache on or off, the clients and the writer.
    Returns the exit status of `report` and (requests/s, p95 ms) over all targets."""
    port = free_port()
    server = start_gunicorn(port, args.workers, args.threads, read_cache=read_cache)
    try:
        session = sign_in(port, admin_password)
        targets = [(PAGE, {"Cookie": session})] + [(path, {"Authorization": f"Token {token}"}) for path in API_LISTS]
        if args.target:
            targets = [t for t in targets if t[0] in args.target]
        print(f"\nread cache {'on' if read_cache else 'off'}; load average before {os.getloadavg()[0]:.2f}")
        results = Results()
        record_after = time.monotonic() + args.warmup
        until = record_after + args.seconds
        threads = [threading.Thread(target=client, args=(port, targets, i, until, record_after, results))
                   for i in range(args.clients)]
        writes = [0, 0]
        if not args.no_writes:
            threads.append(threading.Thread(target=writer, args=(until, writes)))
        meter, used = CpuMeter(server.pid), {}

        spread = []

        def meter_the_measured_window() -> None:
            time.sleep(max(0.0, record_after - time.monotonic()))
            meter.start()
            time.sleep(max(0.0, (record_after + until) / 2 - time.monotonic()))
            spread.extend(clients_per_worker(server.pid, port))
            time.sleep(max(0.0, until - time.monotonic()))
            used.update(meter.stop())

        threads.append(threading.Thread(target=meter_the_measured_window))
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        print(f"load average after: {os.getloadavg()[0]:.2f}; writes: {writes[0]} agent status updates of "
              f"{AGENTS_SEEN_PER_S} agents, {writes[1]} host edits")
        every = sorted(v for values in results.latencies_ms.values() for v in values)
        status = report(results, args.seconds)
        print(f"client connections per worker, mid-run: {', '.join(map(str, spread))}")
        if every:
            print("CPU per request (ms), measured window: " + ", ".join(
                f"{part} {seconds * 1000 / len(every):.2f}" for part, seconds in used.items())
                + f"; all {sum(used.values()) * 1000 / len(every):.2f} (of a core: "
                + ", ".join(f"{part} {seconds / args.seconds:.2f}" for part, seconds in used.items()) + ")")
        return status, (len(every) / args.seconds, percentile(every, 95))
    finally:
        server.terminate()
        server.wait(timeout=30)


if __name__ == "__main__":
    sys.exit(main())

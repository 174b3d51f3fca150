"""gunicorn's settings for the web container (Dockerfile CMD) and bench/load.py, which measures
the server as production runs it.

Workers: the pages and the API spend their time in Python (PostgreSQL and Redis answer in a
fraction of a millisecond), so the processes are what uses the cores; one more process than
cores keeps them busy while one waits on a query. Threads (gthread) hold the keep-alive
connections of open dashboards and polling scripts without a process each, and let a worker
answer a cheap request while another of its threads waits. WEB_WORKERS and WEB_THREADS
override both (.env.example).
"""

import os

workers = int(os.environ.get("WEB_WORKERS") or (os.cpu_count() or 1) + 1)
threads = int(os.environ.get("WEB_THREADS") or 4)
worker_class = "gthread"
bind = os.environ.get("WEB_BIND") or "0.0.0.0:8000"
# Each worker listens on its own socket (SO_REUSEPORT) and the kernel spreads new connections
# over them. With one shared socket, whichever worker woke first accepted: a burst of clients
# opening keep-alive connections at once landed 33, 12 and 5 on three workers (39/9/2, 42/2/6
# in other runs), and since a keep-alive connection stays with its worker, the clients on the
# crowded one waited for it while the others idled (bench/load.py: p95 118-212 ms against
# 82 ms spread). A worker replaced after max_requests resets the few connections still in its
# own accept queue; Linux 5.14+ hands them to the other workers with the sysctl
# net.ipv4.tcp_migrate_req=1 (docs/operations.md).
reuse_port = True
# Longer than the dashboard's refresh interval (15 s), so an open page keeps its connection.
keepalive = 30
# A request stuck longer than this (a hung query) gets its worker replaced.
timeout = 60
# Recycle workers now and then, so a slow leak in a long-running deployment cannot grow forever.
# Not too often: a busy server answers several hundred requests a second, and each new worker
# costs a second of CPU to start and answers its first requests with cold per-process state
# (bench/load.py: at 5,000 each worker was replaced every half minute under load).
max_requests = 100_000
max_requests_jitter = 10_000
# One line per request on stdout (the container's log); "off" for none.
_access_log = os.environ.get("WEB_ACCESS_LOG") or "-"
accesslog = None if _access_log == "off" else _access_log

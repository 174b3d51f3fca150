"""Settings of the vGPU fleet dashboard, read from environment variables.

Every variable is documented in .env.example. With nothing set the product runs on SQLite in
the project folder and an embedded broker, with production's safeguards: DEBUG is off unless
the variable DEBUG says true, and then SECRET_KEY must be set (start-up fails otherwise) and
https is enforced. Development (`make run`, the tests) sets DEBUG=true, which brings a
development secret and plain http. Secrets (SECRET_KEY, DATABASE_URL, DATABASE_REPLICA_URL,
POSTGRES_PASSWORD, REDIS_URL, CELERY_BROKER_URL, AGENT_TOKEN_KEY, EMAIL_HOST_PASSWORD,
METRICS_TOKEN, OIDC_RP_CLIENT_SECRET) may instead be read from a file named by NAME_FILE.
"""

import hashlib
import os
import re
from datetime import timedelta
from pathlib import Path
from urllib.parse import urlsplit

import dj_database_url
from csp.constants import NONCE, NONE, SELF, UNSAFE_INLINE
from django.core.exceptions import ImproperlyConfigured

from config.directory import LDAP_BACKEND, ldap_settings
from config.secrets import env_secret

BASE_DIR = Path(__file__).resolve().parent.parent


def env_str(name: str, default: str = "") -> str:
    return os.environ.get(name, default)


def env_bool(name: str, default: bool = False) -> bool:
    value = os.environ.get(name)
    if value is None or value == "":
        return default
    if value.lower() in {"1", "true", "yes", "on"}:
        return True
    if value.lower() in {"0", "false", "no", "off"}:
        return False
    raise ImproperlyConfigured(f"{name}={value!r} is not a boolean (use true or false)")


def env_float(name: str, default: float) -> float:
    value = os.environ.get(name)
    if value is None or value == "":
        return default
    try:
        return float(value)
    except ValueError as exc:
        raise ImproperlyConfigured(f"{name}={value!r} is not a number") from exc


def env_int(name: str, default: int, minimum: int = 0) -> int:
    """A whole number of at least `minimum` (a count or a limit), `default` when unset."""
    value = os.environ.get(name)
    if value is None or value == "":
        return default
    try:
        number = int(value)
    except ValueError:
        raise ImproperlyConfigured(f"{name}={value!r} is not a whole number") from None
    if number < minimum:
        raise ImproperlyConfigured(f"{name}={number} must be {minimum} or more")
    return number


def env_list(name: str, default: str = "") -> list[str]:
    return [item.strip() for item in os.environ.get(name, default).split(",") if item.strip()]


# Off unless asked for: a deployment that forgets the variable gets production's safeguards.
# `make run` and the tests set DEBUG=true (Makefile, config/test_settings.py).
DEBUG = env_bool("DEBUG", default=False)
SECRET_KEY = env_secret("SECRET_KEY")
if not SECRET_KEY:
    if not DEBUG:
        raise ImproperlyConfigured("SECRET_KEY must be set when DEBUG is off")
    SECRET_KEY = "insecure-development-key-set-SECRET_KEY-in-production"

ALLOWED_HOSTS = env_list("ALLOWED_HOSTS", "127.0.0.1,localhost,[::1]" if DEBUG else "")
CSRF_TRUSTED_ORIGINS = env_list("CSRF_TRUSTED_ORIGINS")

INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "rest_framework",
    "django_filters",
    "drf_spectacular",
    "drf_spectacular_sidecar",
    "django_celery_beat",
    "django_htmx",
    "csp",
    "fleet",
    "identity",  # sign-in through the studio's directory, roles from its groups, sessions
    "notify",  # notification channels and deliveries (above fleet, below telemetry)
    "telemetry",
    "hypervisors",  # acts on each host's hypervisor (above telemetry, whose agents it asks)
    "sizing",
    "alerts",  # health alerts and licences, judged from what telemetry stored
    "dashboard",  # the pages, on top of the domain apps
]

MIDDLEWARE = [
    "django.middleware.security.SecurityMiddleware",
    "csp.middleware.CSPMiddleware",  # early, so error responses carry the policy too
    # Which database a request reads: the replica for GET and HEAD when one is configured, the
    # primary for anything else and for a client that wrote lately (config/db_router.py).
    "config.db_router.ReplicaReadsMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "fleet.audit.AuditMiddleware",
    "django_htmx.middleware.HtmxMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
    # Signs out sessions idle or old past SESSION_IDLE_TIMEOUT_MINUTES / SESSION_MAX_AGE_HOURS; after
    # the session, the user and the messages (the sign-in page then says why), and inside the
    # middleware that add headers, so that its redirects carry them too.
    "identity.middleware.SessionTimeoutMiddleware",
]

# Database outages: a view that cannot reach the database answers 503 with a retry hint
# (config/db_outage.py); after Django's own middleware, so that it sees the views' exceptions first.
MIDDLEWARE.append("config.db_outage.DatabaseUnavailableMiddleware")
# Unknown paths under /api/ answer JSON also with DEBUG on (config/api/).
MIDDLEWARE.append("config.api.ApiNotFoundMiddleware")

if not DEBUG:
    # Production serves collected static files itself; runserver serves them in development.
    MIDDLEWARE.insert(1, "whitenoise.middleware.WhiteNoiseMiddleware")

ROOT_URLCONF = "config.urls"

TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [BASE_DIR / "templates"],
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
                "dashboard.context_processors.badges",  # menu badges: unread notifications, pending requests, alerts
                "dashboard.navigation.menu",  # the main menu: its groups, links and the current page
                "identity.oidc.sign_in_options",  # the login page's "Sign in with ..." button, when OIDC is on
            ],
        },
    },
]

WSGI_APPLICATION = "config.wsgi.application"

# SQLite when DATABASE_URL is unset. IMMEDIATE transactions take SQLite's write lock at
# BEGIN, so two placements cannot both read the same free slot (PostgreSQL uses row locks).
DATABASE_URL = env_secret("DATABASE_URL")
if DATABASE_URL:
    # Persistent connections, checked before each request reuses one: after a database restart
    # the first request reconnects instead of failing on the dead connection.
    DATABASES = {"default": dj_database_url.parse(DATABASE_URL, conn_max_age=60, conn_health_checks=True)}
    # The PostgreSQL image's own variable: one secret for the server and the app, and a
    # DATABASE_URL that carries no password (it then appears in no config file).
    _postgres_password = env_secret("POSTGRES_PASSWORD")
    if _postgres_password:
        DATABASES["default"]["PASSWORD"] = _postgres_password
else:
    DATABASES = {
        "default": {
            "ENGINE": "django.db.backends.sqlite3",
            "NAME": env_str("SQLITE_PATH", str(BASE_DIR / "db.sqlite3")),
            # WAL lets the pages read while the worker writes; synchronous=NORMAL is WAL's
            # recommended durability (no corruption on power loss; the last commits may be lost)
            # and makes each rollup/ingest commit an order of magnitude cheaper than FULL.
            "OPTIONS": {
                "transaction_mode": "IMMEDIATE",
                "timeout": 20,
                "init_command": "PRAGMA journal_mode=WAL; PRAGMA synchronous=NORMAL;",
            },
            # A file, not memory, so that tests with several threads share one database.
            "TEST": {"NAME": env_str("SQLITE_TEST_PATH", str(BASE_DIR / ".test-db.sqlite3"))},
        }
    }

# Read replica (config/db_router.py; docs/operations.md, "Scaling out"): with DATABASE_REPLICA_URL
# (a PostgreSQL hot standby of DATABASE_URL's server), the pages' and the API's GET requests read
# fleet, telemetry and sizing rows from it; sessions, users, API tokens, sign-in throttling,
# transactions, the read cache's computations, Celery tasks and commands use the primary. A client
# that wrote reads the primary for DATABASE_REPLICA_PIN_S seconds afterwards (read-your-writes).
DATABASE_REPLICA_URL = env_secret("DATABASE_REPLICA_URL")
DATABASE_REPLICA_PIN_S = env_int("DATABASE_REPLICA_PIN_S", 15, minimum=1)
#: The alias pages read from (None: every read goes to the primary, "default").
DATABASE_READ_REPLICA = None
if DATABASE_REPLICA_URL:
    if not DATABASE_URL:
        raise ImproperlyConfigured("DATABASE_REPLICA_URL is set but DATABASE_URL is not: a read replica is a "
                                   "PostgreSQL standby of the server DATABASE_URL names")
    _replica = dj_database_url.parse(DATABASE_REPLICA_URL, conn_max_age=60, conn_health_checks=True)
    if _postgres_password and not _replica.get("PASSWORD"):
        _replica["PASSWORD"] = _postgres_password
    # A standby refuses writes by itself; this makes a replica URL that names a writable server
    # (a pooler in front of the primary, a typo) refuse them too, instead of splitting the writes.
    _replica.setdefault("OPTIONS", {})["options"] = "-c default_transaction_read_only=on"
    # The tests point it at their own database (config/test_settings.py), never at the standby.
    _replica["TEST"] = {"MIRROR": "default"}
    DATABASES["replica"] = _replica
    DATABASE_READ_REPLICA = "replica"
DATABASE_ROUTERS = ["config.db_router.ReplicaRouter"]

DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

AUTH_PASSWORD_VALIDATORS = [
    {"NAME": "django.contrib.auth.password_validation.UserAttributeSimilarityValidator"},
    {"NAME": "django.contrib.auth.password_validation.MinimumLengthValidator"},
    {"NAME": "django.contrib.auth.password_validation.CommonPasswordValidator"},
    {"NAME": "django.contrib.auth.password_validation.NumericPasswordValidator"},
]

LANGUAGE_CODE = "en-us"
TIME_ZONE = env_str("TIME_ZONE", "UTC")
USE_I18N = True
USE_TZ = True

STATIC_URL = "static/"
STATIC_ROOT = BASE_DIR / "staticfiles"
STATICFILES_DIRS = [BASE_DIR / "static"]
# Every script and stylesheet is served by the app itself (studios often run offline):
# htmx ships in django-htmx, plotly.js in the plotly package (config.staticfiles).
STATICFILES_FINDERS = [
    "django.contrib.staticfiles.finders.FileSystemFinder",
    "django.contrib.staticfiles.finders.AppDirectoriesFinder",
    "config.staticfiles.PackageFileFinder",
]
STORAGES = {
    "default": {"BACKEND": "django.core.files.storage.FileSystemStorage"},
    "staticfiles": {
        "BACKEND": "django.contrib.staticfiles.storage.StaticFilesStorage"
        if DEBUG
        else "whitenoise.storage.CompressedManifestStaticFilesStorage"
    },
}

LOGIN_URL = "login"
LOGIN_REDIRECT_URL = "fleet:overview"
LOGOUT_REDIRECT_URL = "login"
# Messages (a change saved, a sign-out's reason): Django's cookie-then-session storage, built only
# for the requests that use it (config/messages_storage.py).
MESSAGE_STORAGE = "config.messages_storage.LazyFallbackStorage"
# Sessions (identity/sessions.py): one ends after SESSION_IDLE_TIMEOUT_MINUTES without a request of
# the user's own (a page refreshing itself does not count, so an overview left open on a screen
# still times out) and SESSION_MAX_AGE_HOURS after sign-in however active; the sign-in page says
# which. The cookie lasts the lifetime from the session's last save.
SESSION_IDLE_TIMEOUT_MINUTES = env_int("SESSION_IDLE_TIMEOUT_MINUTES", 480, minimum=1)
SESSION_MAX_AGE_HOURS = env_int("SESSION_MAX_AGE_HOURS", 168, minimum=1)
if SESSION_IDLE_TIMEOUT_MINUTES > SESSION_MAX_AGE_HOURS * 60:
    raise ImproperlyConfigured(f"SESSION_IDLE_TIMEOUT_MINUTES={SESSION_IDLE_TIMEOUT_MINUTES} is longer than a "
                               f"session may last (SESSION_MAX_AGE_HOURS={SESSION_MAX_AGE_HOURS}, "
                               f"{SESSION_MAX_AGE_HOURS * 60} minutes): lower it or raise SESSION_MAX_AGE_HOURS")
SESSION_COOKIE_AGE = SESSION_MAX_AGE_HOURS * 3600
# How often the overview and the agent list refresh themselves in the browser.
DASHBOARD_REFRESH_S = int(env_float("DASHBOARD_REFRESH_S", 15))

REST_FRAMEWORK = {
    # Token first: an anonymous API call gets 401 with a WWW-Authenticate header. Scripts' tokens
    # are stored as digests (fleet.api_tokens), not in DRF's authtoken table.
    "DEFAULT_AUTHENTICATION_CLASSES": [
        "fleet.api.authentication.ApiTokenAuthentication",
        "rest_framework.authentication.SessionAuthentication",
    ],
    "DEFAULT_PERMISSION_CLASSES": ["rest_framework.permissions.IsAuthenticated"],
    "DEFAULT_PAGINATION_CLASS": "config.api.pagination.FleetPagination",
    # JSON, the browsable API, and `?format=csv` through the one CSV writer (config/csv_export.py).
    "DEFAULT_RENDERER_CLASSES": [
        "rest_framework.renderers.JSONRenderer",
        "rest_framework.renderers.BrowsableAPIRenderer",
        "config.csv_export.CsvRenderer",
    ],
    # DRF's negotiation, its answer kept per process for each Accept header (config/api/negotiation.py).
    "DEFAULT_CONTENT_NEGOTIATION_CLASS": "config.api.negotiation.KeptContentNegotiation",
    # DRF's parsers, with a nesting limit on JSON bodies (config/api/).
    "DEFAULT_PARSER_CLASSES": [
        "config.api.JSONParser",
        "rest_framework.parsers.FormParser",
        "rest_framework.parsers.MultiPartParser",
    ],
    # Unknown query parameters of a list are a 400; `?expand=`; FilterSets; `?ordering=` with an id
    # tiebreak (config/api/filters.py).
    "DEFAULT_FILTER_BACKENDS": [
        "config.api.filters.KnownParametersFilter",
        "config.api.filters.ExpandFilter",
        "django_filters.rest_framework.DjangoFilterBackend",
        "config.api.filters.StableOrderingFilter",
    ],
    # drf-spectacular's, documenting `?expand=` (config/api/schema.py).
    "DEFAULT_SCHEMA_CLASS": "config.api.schema.AutoSchema",
    # Placement refusals -> 400, fleet changed under the request / object still in use -> 409.
    "EXCEPTION_HANDLER": "config.api.exceptions.exception_handler",
    "TEST_REQUEST_DEFAULT_FORMAT": "json",
}

SPECTACULAR_SETTINGS = {
    "TITLE": "vGPU fleet API",
    "DESCRIPTION": "Inventory, placement and telemetry of a fleet of NVIDIA vGPU workstations.",
    "VERSION": "1.0.0",
    "SERVE_INCLUDE_SCHEMA": False,
    # Anonymous visitors get the login page and /healthz only (DESIGN.md, Roles).
    "SERVE_PERMISSIONS": ["rest_framework.permissions.IsAuthenticated"],
    "SWAGGER_UI_DIST": "SIDECAR",
    "SWAGGER_UI_FAVICON_HREF": "SIDECAR",
    "REDOC_DIST": "SIDECAR",
    # Several resources have a `status` field with their own choices: name each set.
    "ENUM_NAME_OVERRIDES": {
        "AgentStatusEnum": "telemetry.models.AgentStatus",
        "AgentKindEnum": "telemetry.models.AgentKind",
        "OptimizerRunStatusEnum": "sizing.models.OptimizerStatus",
        "GuestAdviceEnum": "sizing.models.GUEST_ADVICE_CHOICES",
        "ResizeRequestStatusEnum": "fleet.choices.ResizeStatus",
        "OperationKindEnum": "hypervisors.choices.OperationKind",
        "OperationStepKindEnum": "hypervisors.choices.StepKind",
        "NotificationChannelKindEnum": "notify.choices.ChannelKind",
        "NotificationSeverityEnum": "notify.choices.Severity",
        "DeliveryStatusEnum": "notify.choices.DeliveryStatus",
        "AlertRuleKindEnum": "alerts.models.RULE_CHOICES",
        "AlertStateEnum": "alerts.models.AlertState",
        "LicenceEditionEnum": "alerts.models.Edition",
        "ApiTokenScopeEnum": "fleet.choices.TokenScope",
        "ApiTokenStateEnum": "fleet.choices.TokenState",
    },
}

# Host capacity: vCPUs and RAM the VMs of one host may claim, as a multiple of what it has.
# Each host can override these; these are the defaults for new hosts.
FLEET_DEFAULT_VCPU_OVERCOMMIT = env_float("FLEET_DEFAULT_VCPU_OVERCOMMIT", 1.0)
FLEET_DEFAULT_RAM_OVERCOMMIT = env_float("FLEET_DEFAULT_RAM_OVERCOMMIT", 1.0)

# Celery: Redis when REDIS_URL is set (production, docker-compose); otherwise kombu's
# filesystem transport in a local folder, so the embedded default needs no server.
REDIS_URL = env_secret("REDIS_URL")
CELERY_BROKER_URL = env_secret("CELERY_BROKER_URL", REDIS_URL or "filesystem://")
if CELERY_BROKER_URL == "filesystem://":
    _queue_dir = Path(env_str("CELERY_QUEUE_DIR", str(BASE_DIR / "var" / "celery-queue")))
    # config/celery.py creates these folders; kombu's defaults are relative to the working directory.
    CELERY_BROKER_TRANSPORT_OPTIONS = {
        "data_folder_in": str(_queue_dir),
        "data_folder_out": str(_queue_dir),
        "processed_folder": str(_queue_dir / "processed"),
        "control_folder": str(_queue_dir / "control"),
        "store_processed": False,
    }
elif CELERY_BROKER_URL.startswith(("redis://", "rediss://")):
    # kombu waits forever on a Redis that accepts connections but never answers (a hung server,
    # a dropped NAT entry), and a web request sending a task would hang with it. The worker's
    # BRPOP returns every second, well within these.
    CELERY_BROKER_TRANSPORT_OPTIONS = {"socket_connect_timeout": 3, "socket_timeout": 5}
# The cache holds the read cache's entries and table versions (config/read_cache.py), so every
# process that writes or serves must share it (a revoked API token is refused by the web server
# once `manage.py api_token revoke` has bumped the version it checks): Redis when REDIS_URL is
# set (production), else a folder every process of the embedded mode reads (runfleet's web
# server and worker, manage.py commands). locmem:// is one process's memory (the tests);
# none:// turns the read cache off. Keys carry the database's identity, so two deployments
# (or test runs) sharing one Redis never serve each other's rows.
CACHE_URL = env_secret("CACHE_URL", REDIS_URL or f"file://{BASE_DIR / 'var' / 'cache'}")


def cache_backend(url: str) -> dict:
    """The CACHES entry (without its key prefix) for a CACHE_URL."""
    scheme, _, rest = url.partition("://")
    if scheme in ("redis", "rediss", "unix"):
        return {"BACKEND": "config.redis_cache.RedisCache", "LOCATION": url,
                "OPTIONS": {"socket_connect_timeout": 0.5, "socket_timeout": 0.5}}
    if scheme == "file":
        return {"BACKEND": "django.core.cache.backends.filebased.FileBasedCache", "LOCATION": rest,
                "OPTIONS": {"MAX_ENTRIES": 5000}}
    if scheme == "locmem":
        return {"BACKEND": "django.core.cache.backends.locmem.LocMemCache", "OPTIONS": {"MAX_ENTRIES": 5000}}
    if scheme == "none":
        return {"BACKEND": "django.core.cache.backends.dummy.DummyCache"}
    raise ImproperlyConfigured(f"CACHE_URL must start with redis://, rediss://, file://, locmem:// or none://, "
                               f"not {scheme}://")


def cache_key_prefix(database: dict) -> str:
    """The cache keys' prefix: the database's identity (host, port, name), hashed."""
    identity = ":".join(str(database.get(k) or "") for k in ("HOST", "PORT", "NAME"))
    return hashlib.sha256(identity.encode()).hexdigest()[:12]


CACHES = {"default": {**cache_backend(CACHE_URL), "KEY_PREFIX": cache_key_prefix(DATABASES["default"])}}
# Sessions are kept in the database and, with Redis as the cache, read through it (a page's session
# costs a GET, not a query; identity/session_store.py).
SESSION_ENGINE = "identity.session_store"
READ_CACHE_ENABLED = env_bool("READ_CACHE_ENABLED", default=True) and not CACHE_URL.startswith("none://")

# Deployments (or test runs) sharing one Redis keep apart by queue name.
CELERY_TASK_DEFAULT_QUEUE = env_str("CELERY_QUEUE", "celery")
CELERY_TASK_SERIALIZER = "json"
CELERY_RESULT_SERIALIZER = "json"
CELERY_ACCEPT_CONTENT = ["json"]
CELERY_TASK_IGNORE_RESULT = True
CELERY_TASK_TIME_LIMIT = 300
CELERY_TASK_SOFT_TIME_LIMIT = 240
CELERY_TIMEZONE = TIME_ZONE
# Task modules outside an app's tasks.py (which autodiscover_tasks finds on its own).
CELERY_IMPORTS = ["telemetry.rollup_tasks"]
# Beat reads its schedule from the database (django-celery-beat), so admins edit periodic
# tasks in the admin site; telemetry.schedules creates the default entries after migrate.
CELERY_BEAT_SCHEDULER = "django_celery_beat.schedulers:DatabaseScheduler"
CELERY_WORKER_PREFETCH_MULTIPLIER = 1
CELERY_BROKER_CONNECTION_RETRY_ON_STARTUP = True
# A worker whose broker went away keeps trying to reconnect however long the outage lasts
# (Celery's default gives up and exits after 100 attempts, some 45 minutes).
CELERY_BROKER_CONNECTION_MAX_RETRIES = None

# Hypervisors: a host's `hypervisor_secret_ref` names a file in this folder (a password, an SSH
# private key, or a folder of TLS material); secrets never live in the database. Simulated
# hypervisors (sim:// URIs, the demo) keep their state in HYPERVISOR_SIM_DIR. An operation waits
# this long for a guest to power off before it gives up and rolls back.
HYPERVISOR_SECRETS_DIR = Path(env_str("HYPERVISOR_SECRETS_DIR", str(BASE_DIR / "var" / "secrets")))
HYPERVISOR_SIM_DIR = Path(env_str("HYPERVISOR_SIM_DIR", str(BASE_DIR / "var" / "sim-hypervisors")))
HYPERVISOR_SHUTDOWN_TIMEOUT_S = env_float("HYPERVISOR_SHUTDOWN_TIMEOUT_S", 300.0)
# The CA that signed vCenter's or Proxmox VE's certificate (a PEM file), for every vsphere:// and
# proxmox:// link without a cafile= of its own; empty: the system's trusted CAs.
HYPERVISOR_CA_FILE = env_str("HYPERVISOR_CA_FILE", "")
# A running operation whose worker has given no sign for this long is resumed by another; one
# stopped on an unreachable hypervisor is tried again after HYPERVISOR_RETRY_S. The last step
# waits up to HYPERVISOR_VERIFY_WAIT_S for the host's agent to report the VM's new vGPUs.
HYPERVISOR_HEARTBEAT_STALE_S = env_float("HYPERVISOR_HEARTBEAT_STALE_S", 120.0)
HYPERVISOR_RETRY_S = env_float("HYPERVISOR_RETRY_S", 30.0)
HYPERVISOR_VERIFY_WAIT_S = env_float("HYPERVISOR_VERIFY_WAIT_S", 30.0)
# How often beat reads every linked hypervisor and stores its diff against the inventory
# (hypervisors.tasks.sync_hypervisors; the entry is created once, after migrate).
HYPERVISOR_SYNC_INTERVAL_S = env_float("HYPERVISOR_SYNC_INTERVAL_S", 900.0)
# How often beat reads the guest CPU and memory of every linked host's running VMs through its
# hypervisor (hypervisors.tasks.read_guest_stats): one GuestSample a VM a reading.
HYPERVISOR_GUEST_INTERVAL_S = env_float("HYPERVISOR_GUEST_INTERVAL_S", 60.0)

# Alerts: beat evaluates the rules every ALERTS_EVALUATION_INTERVAL_S (alerts.tasks); one
# evaluation at a time, a lost one's lease lapsing after ALERTS_LEASE_S. Resolved alerts and the
# licence-use series are kept ALERTS_KEEP_DAYS.
ALERTS_EVALUATION_INTERVAL_S = env_float("ALERTS_EVALUATION_INTERVAL_S", 30.0)
ALERTS_LEASE_S = env_float("ALERTS_LEASE_S", 120.0)
ALERTS_KEEP_DAYS = env_float("ALERTS_KEEP_DAYS", 400.0)

# Telemetry: agent tokens are derived from this key (defaults to SECRET_KEY; changing it
# revokes every agent token). An agent not seen for TELEMETRY_STALE_AFTER_S is stale.
AGENT_TOKEN_KEY = env_secret("AGENT_TOKEN_KEY")
TELEMETRY_POLL_INTERVAL_S = env_float("TELEMETRY_POLL_INTERVAL_S", 10.0)
TELEMETRY_STALE_AFTER_S = env_float("TELEMETRY_STALE_AFTER_S", 60.0)
TELEMETRY_BATCH_SIZE = int(env_float("TELEMETRY_BATCH_SIZE", 50))
# Agents of one batch fetched at once (threads of one poll_batch task). By default all of
# them, so a batch ends within its longest timeout even when every agent in it is down.
TELEMETRY_POLL_CONCURRENCY = int(env_float("TELEMETRY_POLL_CONCURRENCY", TELEMETRY_BATCH_SIZE))
# Collection split across worker queues (telemetry/shards.py; docs/operations.md, "Scaling out"):
# above 1, each agent's batches go to the queue <CELERY_QUEUE>.collect.<k> of its shard k, and
# every one of those queues needs a worker consuming it. 1: the default queue, as before.
TELEMETRY_COLLECT_SHARDS = env_int("TELEMETRY_COLLECT_SHARDS", 1, minimum=1)
TELEMETRY_MAX_RESPONSE_BYTES = int(env_float("TELEMETRY_MAX_RESPONSE_BYTES", 4 * 1024 * 1024))
TELEMETRY_MAX_CLOCK_SKEW_S = env_float("TELEMETRY_MAX_CLOCK_SKEW_S", 300.0)
# The collector's per-process copy of the inventory (telemetry/inventory_cache.py): dropped when
# any process changes the inventory, and at the latest after this age (changes made outside
# Django) or past this many rows.
TELEMETRY_INVENTORY_CACHE_MAX_AGE_S = env_float("TELEMETRY_INVENTORY_CACHE_MAX_AGE_S", 300.0)
TELEMETRY_INVENTORY_CACHE_MAX_ROWS = int(env_float("TELEMETRY_INVENTORY_CACHE_MAX_ROWS", 2_000_000))
# GPUs the inventory does not know (and so new GPU models) that one report may add: a report
# naming more is refused whole. 16 is the most GPUs a real server carries (0: no discovery, every
# report naming an unknown GPU is refused).
TELEMETRY_MAX_NEW_GPUS = int(env_float("TELEMETRY_MAX_NEW_GPUS", 16))
TELEMETRY_RETENTION_RAW_DAYS = env_float("TELEMETRY_RETENTION_RAW_DAYS", 14)
TELEMETRY_RETENTION_5M_DAYS = env_float("TELEMETRY_RETENTION_5M_DAYS", 90)
TELEMETRY_RETENTION_1H_DAYS = env_float("TELEMETRY_RETENTION_1H_DAYS", 730)
AUDIT_RETENTION_DAYS = env_float("AUDIT_RETENTION_DAYS", 0)  # audit events pruned after this; 0: kept forever
# Rollups: buckets holding samples built per run and series (bounded work; the next run goes
# on), and how long after a bucket closes its late samples are still folded in.
TELEMETRY_ROLLUP_MAX_BUCKETS = int(env_float("TELEMETRY_ROLLUP_MAX_BUCKETS", 120))
TELEMETRY_ROLLUP_LATE_S = env_float("TELEMETRY_ROLLUP_LATE_S", 120.0)
# Rows deleted per statement by retention, so no DELETE holds its locks for long.
TELEMETRY_PRUNE_BATCH = int(env_float("TELEMETRY_PRUNE_BATCH", 10_000))
# PostgreSQL: raw sample tables are partitioned by UTC day; a periodic task keeps partitions
# this many days ahead of today (a sample with no partition lands in the DEFAULT partition).
TELEMETRY_PARTITION_DAYS_AHEAD = env_int("TELEMETRY_PARTITION_DAYS_AHEAD", 7, minimum=1)
# Prometheus exposition at /metrics (telemetry/exposition.py): it names artists and their VMs,
# so it needs credentials, from loopback too (a reverse proxy on the same machine makes every
# request loopback's): `Authorization: Bearer <METRICS_TOKEN>`, or the API token or session of a
# staff user. METRICS_PUBLIC=true lets anyone read it.
METRICS_TOKEN = env_secret("METRICS_TOKEN")
METRICS_PUBLIC = env_bool("METRICS_PUBLIC", default=False)

# Sizing: right-sizing suggestions judge each VM on its hourly rollups of the last
# SIZING_WINDOW_DAYS days (NVIDIA's proof-of-concept advice: two weeks of real work).
SIZING_WINDOW_DAYS = int(env_float("SIZING_WINDOW_DAYS", 14))
if not 1 <= SIZING_WINDOW_DAYS <= 90:
    raise ImproperlyConfigured(f"SIZING_WINDOW_DAYS={SIZING_WINDOW_DAYS} must be between 1 and 90")

LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "handlers": {"console": {"class": "logging.StreamHandler"}},
    "root": {"handlers": ["console"], "level": env_str("LOG_LEVEL", "INFO")},
}

# Mail (resize request notifications): console backend in development.
EMAIL_BACKEND = env_str("EMAIL_BACKEND", "django.core.mail.backends.console.EmailBackend")
DEFAULT_FROM_EMAIL = env_str("DEFAULT_FROM_EMAIL", "vgpu-fleet@localhost")
EMAIL_HOST = env_str("EMAIL_HOST", "localhost")
EMAIL_PORT = int(env_str("EMAIL_PORT", "25"))
EMAIL_HOST_USER = env_str("EMAIL_HOST_USER")
EMAIL_HOST_PASSWORD = env_secret("EMAIL_HOST_PASSWORD")
EMAIL_USE_TLS = env_bool("EMAIL_USE_TLS")

# Notification channels (notify/): a failed delivery is tried again after NOTIFY_RETRY_BASE_S,
# doubling each time, up to NOTIFY_MAX_ATTEMPTS attempts in all; each send (SMTP or HTTP) may take
# NOTIFY_TIMEOUT_S. Sent deliveries are kept NOTIFY_KEEP_DAYS (failed ones until deleted).
# NOTIFY_SITE_URL (e.g. https://fleet.studio.example) makes the links in messages absolute.
NOTIFY_RETRY_BASE_S = env_float("NOTIFY_RETRY_BASE_S", 30.0)
NOTIFY_MAX_ATTEMPTS = env_int("NOTIFY_MAX_ATTEMPTS", 6, minimum=1)
NOTIFY_TIMEOUT_S = env_float("NOTIFY_TIMEOUT_S", 10.0)
NOTIFY_KEEP_DAYS = env_float("NOTIFY_KEEP_DAYS", 30.0)
NOTIFY_SITE_URL = env_str("NOTIFY_SITE_URL").rstrip("/")
if NOTIFY_RETRY_BASE_S <= 0 or NOTIFY_TIMEOUT_S <= 0 or NOTIFY_KEEP_DAYS <= 0:
    raise ImproperlyConfigured("NOTIFY_RETRY_BASE_S, NOTIFY_TIMEOUT_S and NOTIFY_KEEP_DAYS must be more than 0")

# --- HTTPS, cookies, headers and content security policy (production) ---------------------
# With DEBUG off every HTTPS setting is on unless switched off: the dashboard sits behind a
# TLS-terminating reverse proxy (docs/operations.md, Deploying). In DEBUG (development, tests)
# plain http keeps working. `manage.py check --deploy` passes with no warning on the defaults.
SECURE_SSL_REDIRECT = env_bool("SECURE_SSL_REDIRECT", default=not DEBUG)
# Health probes of docker compose and load balancers speak plain http inside the network.
SECURE_REDIRECT_EXEMPT = [r"^healthz$"]
SESSION_COOKIE_SECURE = env_bool("SESSION_COOKIE_SECURE", default=not DEBUG)
CSRF_COOKIE_SECURE = env_bool("CSRF_COOKIE_SECURE", default=not DEBUG)
# HSTS: one year once in production; 0 switches it off. Preload only marks the header as
# eligible for the browsers' preload list; nothing is submitted anywhere.
SECURE_HSTS_SECONDS = int(env_float("SECURE_HSTS_SECONDS", 0 if DEBUG else 31_536_000))
SECURE_HSTS_INCLUDE_SUBDOMAINS = env_bool("SECURE_HSTS_INCLUDE_SUBDOMAINS", default=True)
SECURE_HSTS_PRELOAD = env_bool("SECURE_HSTS_PRELOAD", default=True)
# Only behind a proxy that sets X-Forwarded-Proto itself (and strips the client's): trusting
# the header otherwise lets any client claim https.
if env_bool("SECURE_PROXY_SSL_HEADER"):
    SECURE_PROXY_SSL_HEADER = ("HTTP_X_FORWARDED_PROTO", "https")
X_FRAME_OPTIONS = "DENY"
SECURE_CONTENT_TYPE_NOSNIFF = True
SECURE_REFERRER_POLICY = "same-origin"
SECURE_CROSS_ORIGIN_OPENER_POLICY = "same-origin"
SESSION_COOKIE_HTTPONLY = True
# Error pages and mails hide connection URLs too (their passwords sit in the URL).
DEFAULT_EXCEPTION_REPORTER_FILTER = "config.error_reports.SecretSafeExceptionReporterFilter"

# Content security policy, enforced in development and tests as in production, so a page
# that would break under it breaks in the browser tests. Scripts come from our own static
# files only: no inline script, no eval (htmx and plotly.js need neither for what the pages
# use). The one exception is the API docs page, whose Swagger UI start-up script (rendered
# per request by drf-spectacular) carries a per-response nonce. Styles allow inline because
# plotly.js injects <style> elements and sets style attributes as it draws, and the capacity
# bars set their width in a style attribute; inline CSS cannot run script.
CONTENT_SECURITY_POLICY = {
    "DIRECTIVES": {
        "default-src": [SELF],
        "script-src": [SELF, NONCE],
        "style-src": [SELF, UNSAFE_INLINE],
        # plotly.js draws heatmaps as data: images
        "img-src": [SELF, "data:"],
        "font-src": [SELF],
        "connect-src": [SELF],
        "object-src": [NONE],
        "base-uri": [SELF],
        "form-action": [SELF],
        "frame-ancestors": [NONE],
    },
}

# --- Sign-in throttling (django-axes; config/lockout.py) ------------------------------------
# AXES_FAILURE_LIMIT failed sign-ins for one user name from one address lock that pair out for
# AXES_COOLOFF_MINUTES (counted from the last failure); the sign-in page says how long. Against
# password spraying (a few guesses at each of many names), AXES_ADDRESS_FAILURE_LIMIT failures
# from one address, whatever the names, lock the whole address out (0: never). Each name counts
# at most AXES_FAILURE_LIMIT failures there, and a name's failures stop counting once it signs in,
# so one user who keeps mistyping, or colleagues' typos, do not lock out a studio behind one NAT
# address. API tokens are not throttled. `manage.py axes_reset_username <name>` lifts a name's
# lockout early, `manage.py axes_reset_ip <address>` an address's (docs/operations.md).
INSTALLED_APPS.append("axes")
MIDDLEWARE.append("axes.middleware.AxesMiddleware")  # last, as axes asks
AUTHENTICATION_BACKENDS = [
    "config.lockout.SignInThrottleBackend",  # an AxesStandaloneBackend; must come first
    "django.contrib.auth.backends.ModelBackend",
]
# Directory sign-in (config/directory.py; docs/operations.md): on when AUTH_LDAP_SERVER_URI is set.
# Its backend comes after the throttle, so a wrong directory password counts like a local one, and
# before the model backend, whose local accounts (the break-glass admin) keep working.
_ldap = ldap_settings()
globals().update(_ldap)
AUTH_LDAP_ENABLED = bool(_ldap)
if AUTH_LDAP_ENABLED:
    AUTHENTICATION_BACKENDS.insert(1, LDAP_BACKEND)
AXES_FAILURE_LIMIT = env_int("AXES_FAILURE_LIMIT", 5, minimum=1)
AXES_ADDRESS_FAILURE_LIMIT = env_int("AXES_ADDRESS_FAILURE_LIMIT", 30)  # ours (config/lockout.py), not axes'
AXES_HANDLER = "config.lockout.SignInThrottleHandler"
AXES_COOLOFF_TIME = timedelta(minutes=env_float("AXES_COOLOFF_MINUTES", 15))
AXES_LOCKOUT_PARAMETERS = [["username", "ip_address"]]
AXES_RESET_ON_SUCCESS = True
AXES_LOCKOUT_CALLABLE = "config.lockout.lockout_response"
# The user name as typed, cut to a user name's length: axes would store 5,000 characters as sent.
AXES_USERNAME_CALLABLE = "config.lockout.username_of"
# Which address a failure counts against (config/lockout.py client_address): the connection's,
# or behind TRUSTED_PROXY_COUNT reverse proxies that append to X-Forwarded-For (nginx's
# $proxy_add_x_forwarded_for, Traefik), the one the outermost of them saw. Leave it 0 unless
# every request passes through them: X-Forwarded-For is otherwise the client's to forge.
AXES_CLIENT_IP_CALLABLE = "config.lockout.client_address"
TRUSTED_PROXY_COUNT = env_float("TRUSTED_PROXY_COUNT", 0.0)
if TRUSTED_PROXY_COUNT < 0 or not TRUSTED_PROXY_COUNT.is_integer():
    raise ImproperlyConfigured(f"TRUSTED_PROXY_COUNT={TRUSTED_PROXY_COUNT:g} must be a whole number of proxies, "
                               f"0 or more")
TRUSTED_PROXY_COUNT = int(TRUSTED_PROXY_COUNT)

# --- Request size limits (config/body_limits.py) ---------------------------------------------
# No page or API call needs a body near 1 MiB (the largest are admin forms and sizing plans);
# a larger one is refused with 413 before it is read. Nothing uploads files, so file parts get
# the same in-memory threshold. The nvidia-smi push has its own limit, TELEMETRY_MAX_RESPONSE_BYTES.
DATA_UPLOAD_MAX_MEMORY_SIZE = 1024 * 1024
FILE_UPLOAD_MAX_MEMORY_SIZE = 1024 * 1024
DATA_UPLOAD_MAX_NUMBER_FIELDS = 1000
REQUEST_BODY_LIMIT_EXEMPT = ["/api/v1/ingest/"]
MIDDLEWARE.insert(MIDDLEWARE.index("django.middleware.security.SecurityMiddleware") + 1,
                  "config.body_limits.RequestBodyLimitMiddleware")

# --- Signing in with OpenID Connect (identity/oidc.py; docs/operations.md) --------------------
# Off unless OIDC_RP_CLIENT_ID is set. The studio's provider (Keycloak, Entra ID, Okta) signs
# people in, and the groups its OIDC_GROUPS_CLAIM claim lists give them their role
# (identity.roles): OIDC_ADMIN_GROUP admins, OIDC_ARTIST_GROUPS artists, anyone else is refused.
# Local accounts keep signing in with their passwords (the break-glass admin). A signed-in
# session is checked with the provider again once OIDC_RENEW_ID_TOKEN_EXPIRY_SECONDS have passed
# (mozilla-django-oidc's SessionRefresh, without a prompt while the provider's own session
# lasts), so someone taken out of the groups loses access then, not at their next sign-in.
OIDC_SIGN_ALGOS = ("RS256", "RS384", "RS512", "ES256", "ES384", "ES512", "HS256", "HS384", "HS512")


def oidc_endpoint(name: str, required: bool = True) -> str | None:
    """The provider's endpoint `name`: an http(s) URL (`manage.py oidc_discover` prints them)."""
    value = env_str(name).strip()
    if not value:
        if not required:
            return None
        raise ImproperlyConfigured(f"{name} must be set when OIDC_RP_CLIENT_ID is: the provider's endpoint, from "
                                   f"its /.well-known/openid-configuration (manage.py oidc_discover ISSUER_URL)")
    parts = urlsplit(value)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ImproperlyConfigured(f"{name}={value!r} is not an http(s) URL")
    return value


OIDC_RP_CLIENT_ID = env_str("OIDC_RP_CLIENT_ID").strip()
OIDC_ENABLED = bool(OIDC_RP_CLIENT_ID)
OIDC_DISPLAY_NAME = env_str("OIDC_DISPLAY_NAME").strip() or "single sign-on"
if OIDC_ENABLED:
    OIDC_RP_CLIENT_SECRET = env_secret("OIDC_RP_CLIENT_SECRET")
    if not OIDC_RP_CLIENT_SECRET:
        raise ImproperlyConfigured("OIDC_RP_CLIENT_SECRET (or OIDC_RP_CLIENT_SECRET_FILE) must be set when "
                                   "OIDC_RP_CLIENT_ID is: the secret the provider issued with the client id")
    OIDC_RP_SIGN_ALGO = env_str("OIDC_RP_SIGN_ALGO").strip().upper() or "RS256"
    if OIDC_RP_SIGN_ALGO not in OIDC_SIGN_ALGOS:
        raise ImproperlyConfigured(f"OIDC_RP_SIGN_ALGO={OIDC_RP_SIGN_ALGO!r} is not one of "
                                   f"{', '.join(OIDC_SIGN_ALGOS)}")
    OIDC_OP_AUTHORIZATION_ENDPOINT = oidc_endpoint("OIDC_OP_AUTHORIZATION_ENDPOINT")
    OIDC_OP_TOKEN_ENDPOINT = oidc_endpoint("OIDC_OP_TOKEN_ENDPOINT")
    OIDC_OP_USER_ENDPOINT = oidc_endpoint("OIDC_OP_USER_ENDPOINT")
    # The provider's public keys check RS* and ES* ID tokens; HS* ones are signed with the client secret.
    OIDC_OP_JWKS_ENDPOINT = oidc_endpoint("OIDC_OP_JWKS_ENDPOINT", required=not OIDC_RP_SIGN_ALGO.startswith("HS"))
    OIDC_RP_SCOPES = " ".join(env_str("OIDC_RP_SCOPES").split()) or "openid email profile"
    if "openid" not in OIDC_RP_SCOPES.split():
        raise ImproperlyConfigured(f"OIDC_RP_SCOPES={OIDC_RP_SCOPES!r} must include openid")
    OIDC_USERNAME_CLAIM = env_str("OIDC_USERNAME_CLAIM").strip() or "preferred_username"
    OIDC_GROUPS_CLAIM = env_str("OIDC_GROUPS_CLAIM").strip() or "groups"
    OIDC_ADMIN_GROUP = env_str("OIDC_ADMIN_GROUP").strip()
    OIDC_ARTIST_GROUPS = env_list("OIDC_ARTIST_GROUPS")
    if not OIDC_ADMIN_GROUP and not OIDC_ARTIST_GROUPS:
        raise ImproperlyConfigured("OIDC_ADMIN_GROUP or OIDC_ARTIST_GROUPS (or both) must be set when "
                                   "OIDC_RP_CLIENT_ID is: without them nobody may sign in with OpenID Connect")
    OIDC_RENEW_ID_TOKEN_EXPIRY_SECONDS = env_int("OIDC_RENEW_ID_TOKEN_EXPIRY_SECONDS", 900, minimum=60)
    # Okta's applications authenticate at the token endpoint with HTTP Basic by default.
    OIDC_TOKEN_USE_BASIC_AUTH = env_bool("OIDC_TOKEN_USE_BASIC_AUTH")
    # PKCE on every sign-in (a provider that does not know it ignores it), and no call to the
    # provider waits longer than this (requests would wait forever).
    OIDC_USE_PKCE = True
    OIDC_TIMEOUT = 10
    # The pages' scripts call the API with fetch(), which cannot follow a redirect to the provider;
    # the pages around them (and their htmx refreshes) are checked instead.
    OIDC_EXEMPT_URLS = [re.compile(r"^/api/")]
    LOGIN_REDIRECT_URL_FAILURE = "/login/"  # where a refused sign-in says why
    AUTHENTICATION_BACKENDS.append("identity.oidc.OidcBackend")
    MIDDLEWARE.insert(MIDDLEWARE.index("django.contrib.auth.middleware.AuthenticationMiddleware") + 1,
                      "identity.oidc.SessionRefresh")
    # The provider checks the password and throttles its own sign-ins; refusals of the callback
    # (someone in neither group) must not lock a studio's address out of the password form.
    AXES_WHITELIST_CALLABLE = "identity.oidc.unthrottled"
    # A form's POST redirects to the next page, whose session check may redirect on to the
    # provider: Chromium holds every hop of a form's navigation to form-action.
    _provider = urlsplit(OIDC_OP_AUTHORIZATION_ENDPOINT)
    CONTENT_SECURITY_POLICY["DIRECTIVES"]["form-action"].append(f"{_provider.scheme}://{_provider.netloc}")

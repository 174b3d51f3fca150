"""The Celery application: Redis as broker when REDIS_URL is set, else an embedded broker.

Tasks take ids and primitives and travel as JSON (never pickle), as STYLE.md asks. Web
requests send tasks through `send_from_request`, which gives up within seconds when the
broker is unreachable and says so, instead of answering 500 (or hanging) during an outage.
"""

import logging
import os
from pathlib import Path

from celery import Celery
from kombu.exceptions import OperationalError

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")

logger = logging.getLogger(__name__)

#: How a task sent from a web request retries: once more at once, so a pooled connection that
#: Redis closed on a restart reconnects, then gives up (Celery's default keeps the request
#: waiting for several seconds per attempt; a worker's own connection retries forever instead).
WEB_PUBLISH_RETRY_POLICY = {"max_retries": 1, "interval_start": 0, "interval_step": 0.5, "interval_max": 0.5}

app = Celery("config")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.autodiscover_tasks()


@app.on_after_configure.connect
def _on_configured(sender, **kwargs):
    ensure_broker_folders()


def ensure_broker_folders() -> None:
    """Create the embedded (filesystem://) broker's folders: kombu expects them to exist, and
    on a fresh checkout the first process to publish or consume a task would fail otherwise."""
    from django.conf import settings

    if getattr(settings, "CELERY_BROKER_URL", "") != "filesystem://":
        return
    for key in ("data_folder_in", "data_folder_out", "processed_folder", "control_folder"):
        folder = settings.CELERY_BROKER_TRANSPORT_OPTIONS.get(key)
        if folder:
            Path(folder).mkdir(parents=True, exist_ok=True)


#: What sending a task raises when the broker cannot take it: kombu reports an unreachable
#: Redis as OperationalError (the redis-py error is its cause); OSError covers the embedded
#: broker's folder.
BROKER_UNREACHABLE = (OperationalError, OSError)


class QueueUnavailable(Exception):
    """The task could not be handed to the broker (Redis down, unreachable or refusing us)."""


def send_from_request(task, *args) -> None:
    """Queue `task` with `args` from a web request, or raise QueueUnavailable within seconds.

    The log names the task and the error, never the broker URL, which may hold Redis's password.
    """
    try:
        task.apply_async(args=args, retry=True, retry_policy=WEB_PUBLISH_RETRY_POLICY)
    except BROKER_UNREACHABLE as exc:
        logger.warning("could not queue %s: the task queue is unreachable (%s: %s)",
                       task.name, type(exc).__name__, exc)
        raise QueueUnavailable(task.name) from exc

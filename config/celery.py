"""The Celery application: Redis as broker when REDIS_URL is set, else an embedded broker.

Tasks take ids and primitives and travel as JSON (never pickle), as STYLE.md asks.
"""

import os
from pathlib import Path

from celery import Celery

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")

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

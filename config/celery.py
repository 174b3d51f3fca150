"""The Celery application: Redis as broker when REDIS_URL is set, else an embedded broker.

Tasks take ids and primitives and travel as JSON (never pickle), as STYLE.md asks.
"""

import os

from celery import Celery

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")

app = Celery("config")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.autodiscover_tasks()

from django.apps import AppConfig
from django.db.models.signals import post_migrate


class NotifyConfig(AppConfig):
    """Notification channels (e-mail, signed webhooks, chat webhooks, in-app) and the deliveries
    of messages through them, retried until sent; used by alerts and any other part that
    needs to tell admins something."""

    default_auto_field = "django.db.models.BigAutoField"
    name = "notify"
    verbose_name = "Notifications"

    def ready(self):
        # Registers the delivery task in every process: `dispatch` hands deliveries over by the
        # task's name, and a web process (or an evaluation outside a worker) never runs Celery's
        # autodiscovery, which only a worker's start triggers.
        from notify import tasks  # noqa: F401
        from notify.schedules import ensure_default_schedules

        post_migrate.connect(ensure_default_schedules, sender=self, dispatch_uid="notify_default_schedules")

from django.apps import AppConfig
from django.db.models.signals import post_migrate


class AlertsConfig(AppConfig):
    """Alert rules judged from the stored samples and health state, the alerts they raise,
    silences, and the licences the studio owns against what its vGPUs use."""

    default_auto_field = "django.db.models.BigAutoField"
    name = "alerts"
    verbose_name = "Alerts"

    def ready(self):
        from alerts.schedules import ensure_default_schedules

        post_migrate.connect(ensure_default_schedules, sender=self, dispatch_uid="alerts_default_schedules")

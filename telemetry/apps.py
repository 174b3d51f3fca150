from django.apps import AppConfig
from django.db.models.signals import post_migrate


class TelemetryConfig(AppConfig):
    default_auto_field = "django.db.models.BigAutoField"
    name = "telemetry"

    def ready(self):
        from telemetry.schedules import ensure_default_schedules

        # Sender: this app, so the hook runs once per migrate, after every app's migrations.
        post_migrate.connect(ensure_default_schedules, sender=self, dispatch_uid="telemetry_default_schedules")

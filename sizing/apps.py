from django.apps import AppConfig
from django.db.models.signals import post_migrate


class SizingConfig(AppConfig):
    default_auto_field = "django.db.models.BigAutoField"
    name = "sizing"

    def ready(self):
        from sizing.schedules import ensure_default_schedules

        # Sender: this app, so the hook runs once per migrate, after every app's migrations.
        post_migrate.connect(ensure_default_schedules, sender=self, dispatch_uid="sizing_default_schedules")

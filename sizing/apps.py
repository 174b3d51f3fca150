from django.apps import AppConfig
from django.db.models.signals import post_delete, post_migrate, post_save


class SizingConfig(AppConfig):
    default_auto_field = "django.db.models.BigAutoField"
    name = "sizing"

    def ready(self):
        from fleet.models import Vgpu
        from sizing.schedules import ensure_default_schedules
        from sizing.suggestions import vgpus_written

        # Sender: this app, so the hook runs once per migrate, after every app's migrations.
        post_migrate.connect(ensure_default_schedules, sender=self, dispatch_uid="sizing_default_schedules")
        # A VM whose vGPUs change gets advice about its new size at once (sizing.suggestions).
        post_save.connect(vgpus_written, sender=Vgpu, dispatch_uid="sizing_vgpus_written_save")
        post_delete.connect(vgpus_written, sender=Vgpu, dispatch_uid="sizing_vgpus_written_delete")

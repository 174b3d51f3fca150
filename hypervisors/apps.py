from django.apps import AppConfig
from django.db.models.signals import post_migrate


class HypervisorsConfig(AppConfig):
    """The link to each host's hypervisor: reading its domains and vGPU devices, carrying out
    approved changes as operations, and comparing inventory, hypervisor and telemetry."""

    default_auto_field = "django.db.models.BigAutoField"
    name = "hypervisors"
    verbose_name = "Hypervisors"

    def ready(self):
        from fleet.signals import change_approved
        from hypervisors import operations

        change_approved.connect(operations.on_change_approved, dispatch_uid="hypervisors_operations")

        from hypervisors.schedules import ensure_default_schedules

        post_migrate.connect(ensure_default_schedules, sender=self, dispatch_uid="hypervisors_default_schedules")

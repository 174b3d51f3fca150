from django.apps import AppConfig


class HypervisorsConfig(AppConfig):
    """The link to each host's hypervisor: reading its domains and vGPU devices, carrying out
    approved changes as operations, and comparing inventory, hypervisor and telemetry."""

    default_auto_field = "django.db.models.BigAutoField"
    name = "hypervisors"
    verbose_name = "Hypervisors"

from django.apps import AppConfig


class FleetConfig(AppConfig):
    """Inventory of the fleet and the placement rules that govern it."""

    default_auto_field = "django.db.models.BigAutoField"
    name = "fleet"
    verbose_name = "Fleet inventory"

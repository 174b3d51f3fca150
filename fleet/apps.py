from django.apps import AppConfig


class FleetConfig(AppConfig):
    """Inventory of the fleet and the placement rules that govern it."""

    default_auto_field = "django.db.models.BigAutoField"
    name = "fleet"
    verbose_name = "Fleet inventory"

    def ready(self) -> None:
        from django.db.backends.signals import connection_created

        from config import read_cache

        # Every connection of every process reports its writes to the read cache.
        connection_created.connect(read_cache.install, dispatch_uid="read_cache.install")

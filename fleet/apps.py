from django.apps import AppConfig


class FleetConfig(AppConfig):
    """Inventory of the fleet and the placement rules that govern it."""

    default_auto_field = "django.db.models.BigAutoField"
    name = "fleet"
    verbose_name = "Fleet inventory"

    def ready(self) -> None:
        from django.db.backends.signals import connection_created
        from django.db.models.signals import post_migrate

        from config import lookups, read_cache

        # `pk__in=[10**30]` matches nothing instead of failing on SQLite (config/lookups.py).
        lookups.install()
        # Every connection of every process reports its writes to the read cache.
        connection_created.connect(read_cache.install, dispatch_uid="read_cache.install")
        # A new release must not serve what the previous one computed (its fields, its pages).
        post_migrate.connect(read_cache.clear_after_migrate, sender=self, dispatch_uid="read_cache.clear")

from django.apps import AppConfig
from django.db.models.signals import post_migrate


class IdentityConfig(AppConfig):
    """Who signs in and as what: the studio's directory (LDAP / Active Directory, OpenID Connect)
    mapped onto the product's two roles, the accounts it keeps in step, and sessions."""

    default_auto_field = "django.db.models.BigAutoField"
    name = "identity"
    verbose_name = "Identity"

    def ready(self):
        from identity.schedules import ensure_default_schedules

        post_migrate.connect(ensure_default_schedules, sender=self, dispatch_uid="identity_default_schedules")

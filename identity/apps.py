from django.apps import AppConfig


class IdentityConfig(AppConfig):
    """Who signs in and as what: the studio's directory (LDAP / Active Directory, OpenID Connect)
    mapped onto the product's two roles, the accounts it keeps in step, and sessions."""

    default_auto_field = "django.db.models.BigAutoField"
    name = "identity"
    verbose_name = "Identity"

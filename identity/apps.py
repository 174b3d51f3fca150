from django.apps import AppConfig
from django.conf import settings
from django.db.models.signals import post_migrate


class IdentityConfig(AppConfig):
    """Who signs in and as what: the studio's directory (LDAP / Active Directory, OpenID Connect)
    mapped onto the product's two roles, the accounts it keeps in step, and sessions."""

    default_auto_field = "django.db.models.BigAutoField"
    name = "identity"
    verbose_name = "Identity"

    def ready(self) -> None:
        from django.contrib.auth.signals import user_logged_in, user_logged_out
        from django.core import checks

        from identity import sessions
        from identity.schedules import ensure_default_schedules

        # Every signed-in session gets its row, and loses it on sign-out (identity/sessions.py).
        user_logged_in.connect(sessions.on_sign_in, dispatch_uid="identity.sessions.on_sign_in")
        user_logged_out.connect(sessions.on_sign_out, dispatch_uid="identity.sessions.on_sign_out")
        checks.register(sessions.check_session_engine, "sessions")
        post_migrate.connect(ensure_default_schedules, sender=self, dispatch_uid="identity_default_schedules")
        if getattr(settings, "AUTH_LDAP_ENABLED", False):
            connect_directory()


def connect_directory() -> None:
    """A directory user's API tokens answer to the directory too (identity/ldap_backend.py); only
    with a directory configured, whose libraries may otherwise be absent."""
    from fleet.api_tokens import presented
    from identity.ldap_backend import refuse_token_of_removed_user

    presented.connect(refuse_token_of_removed_user, dispatch_uid="identity_ldap_tokens")

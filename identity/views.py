"""The sign-in page: local accounts, the studio's directory, and why someone was refused or
signed out."""

from __future__ import annotations

from django import forms
from django.conf import settings
from django.contrib.auth import SESSION_KEY
from django.contrib.auth.forms import AuthenticationForm
from django.contrib.auth.views import LoginView

from identity.models import DirectoryAccount

#: The request attribute a directory backend sets when it refuses someone whose password was right
#: (identity/ldap_backend.py sets it).
REFUSAL_ATTR = "directory_refusal"


class SignInForm(AuthenticationForm):
    """Django's sign-in form; a directory refusal (right password, no role) replaces the
    "didn't match" message with the directory's reason."""

    refusal = ""

    def clean(self):
        try:
            return super().clean()
        except forms.ValidationError:
            self.refusal = getattr(self.request, REFUSAL_ATTR, "")
            raise


def directory_in_use() -> dict | None:
    """What the sign-in page says about the directory: its name and server, or None when off."""
    if not getattr(settings, "AUTH_LDAP_ENABLED", False):
        return None
    return {"name": settings.AUTH_LDAP_DISPLAY_NAME, "server": settings.AUTH_LDAP_SERVER_LABEL}


class SignInView(LoginView):
    form_class = SignInForm
    redirect_authenticated_user = True

    def get_context_data(self, **kwargs):
        context = super().get_context_data(**kwargs)
        context["directory"] = directory_in_use()
        context["signed_out_reason"] = self.signed_out_reason()
        return context

    def signed_out_reason(self) -> str:
        """Why a session that was signed in is not any more (the directory took the role away),
        shown once: the stale session is ended here."""
        user_id = self.request.session.get(SESSION_KEY)
        if user_id is None or self.request.user.is_authenticated:
            return ""
        reason = (DirectoryAccount.objects.filter(user_id=user_id).values_list("refused_reason", flat=True).first()
                  or "")
        self.request.session.flush()
        return reason

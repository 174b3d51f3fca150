"""Forms of the pages' own controls: parameters that steer a page (where to go back to, which
rows to show) rather than domain input, which the apps' forms hold. Each refusal is an error of
the field it concerns, so the answer can name it."""

from __future__ import annotations

from django import forms
from django.http import HttpRequest
from django.utils.http import url_has_allowed_host_and_scheme


def field_errors(form: forms.Form) -> str:
    """Every error of `form` as "field: why", for a 400 answer or a message."""
    return "; ".join(f"{name}: {error}" if name != "__all__" else str(error)
                     for name, errors in form.errors.items() for error in errors)


class NextForm(forms.Form):
    """A POST form that comes back where it was sent from: `next`, kept only when it is a path
    of this site (anything else, or nothing, goes to the page's default)."""

    next = forms.CharField(required=False, max_length=2000, strip=False)

    def next_url(self, request: HttpRequest, default: str) -> str:
        target = self.cleaned_data.get("next", "") if self.is_valid() else ""
        if target.startswith("/") and url_has_allowed_host_and_scheme(
                target, allowed_hosts={request.get_host()}, require_https=request.is_secure()):
            return target
        return default


class SuggestionActionForm(NextForm):
    """Accept or dismiss a suggestion: the evidence the admin saw (`evidence_key`, so a refresh
    in between is noticed) and where to go back to."""

    evidence_key = forms.CharField(required=False, max_length=64)


class SchedulerListForm(forms.Form):
    """The scheduler list's filter: `?drift=1` keeps only the GPUs whose reported policy
    differs from the desired one."""

    drift = forms.ChoiceField(choices=[("", "All GPUs"), ("1", "Drifting only")], required=False)

"""Forms of the pages' own controls: parameters that steer a page (where to go back to, which
rows to show) rather than domain input, which the apps' forms hold. Each refusal is an error of
the field it concerns, so the answer can name it."""

from __future__ import annotations

from django import forms
from django.http import HttpRequest
from django.utils.http import url_has_allowed_host_and_scheme

from sizing import feedback_rules
from telemetry.ranges import DEFAULT_PRESET, RangeError, TimeRange, resolve_range


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


class RangeForm(forms.Form):
    """A detail page's time range: a preset (`?range=`), a custom `?start=&end=`, or `?at=`
    (a heatmap click), read by `telemetry.ranges` as every page reads them. An unusable range
    is an error of the field it concerns; `time_range` is then the page's default, so the page
    still draws and keeps what was typed."""

    range = forms.CharField(required=False, max_length=16)
    start = forms.CharField(required=False, max_length=64)
    end = forms.CharField(required=False, max_length=64)
    at = forms.CharField(required=False, max_length=64)

    def __init__(self, data, *, now, default: str = DEFAULT_PRESET):
        super().__init__(data)
        self.now, self.default = now, default

    def clean(self):
        data = super().clean()
        asked = {name: value for name, value in data.items() if value}
        try:
            data["time_range"] = resolve_range(asked or {"range": self.default}, self.now)
        except RangeError as exc:
            self.add_error(exc.param, str(exc))
        return data

    @property
    def time_range(self) -> TimeRange:
        if self.is_valid():
            return self.cleaned_data["time_range"]
        return resolve_range({"range": self.default}, self.now)

    @property
    def error(self) -> str:
        """The refusal to show above the page ("" for a usable range)."""
        return "" if self.is_valid() else " ".join(e for errors in self.errors.values() for e in errors)


class DecisionForm(NextForm):
    """An admin's approval or rejection of a request: the comment (free text; a NUL character,
    which PostgreSQL cannot store, is refused by the field) and where to go back to."""

    comment = forms.CharField(required=False, strip=False)


class HypervisorSyncForm(forms.Form):
    """The host page's sync buttons: read the hypervisor and apply nothing ("none"), every
    appliable entry ("all"), or one entry (`entry`, a domain UUID)."""

    apply = forms.ChoiceField(choices=[("none", "none"), ("all", "all"), ("entry", "one entry")], initial="none")
    entry = forms.UUIDField(required=False)

    def clean(self):
        cleaned = super().clean()
        if cleaned.get("apply") == "entry" and not cleaned.get("entry"):
            self.add_error("entry", "Name the entry (its domain UUID) to apply.")
        return cleaned

    def choice(self):
        """What `hypervisors.services.apply_report` takes."""
        if self.cleaned_data["apply"] == "entry":
            return [str(self.cleaned_data["entry"])]
        return self.cleaned_data["apply"]


class FeedbackForm(forms.Form):
    """The feedback prompt of /me/: a rating as five radio buttons, the quick tags as
    checkboxes and an optional note. The rules (which tags go together, the note's length) are
    `sizing.feedback`'s, so the page and the API refuse the same things in the same words."""

    rating = forms.TypedChoiceField(
        choices=[(n, "★" * n) for n in range(5, 0, -1)], coerce=int, widget=forms.RadioSelect,
        error_messages={"required": "Choose a rating from 1 to 5 stars.",
                        "invalid_choice": "Choose a rating from 1 to 5 stars (not %(value)s)."},
    )
    tags = forms.MultipleChoiceField(required=False, widget=forms.CheckboxSelectMultiple)
    note = forms.CharField(required=False, widget=forms.Textarea(attrs={"rows": 2}), strip=True)

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.fields["tags"].choices = list(feedback_rules.TAG_LABELS.items())
        self.fields["tags"].error_messages["invalid_choice"] = (
            "Unknown tag %(value)s; choose among " + ", ".join(feedback_rules.TAGS) + ".")
        self.fields["note"].widget.attrs["maxlength"] = feedback_rules.NOTE_MAX_CHARS

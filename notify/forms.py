"""The channel form of the pages (/alerts/channels/): the model's own checks, rules typed as
comma-separated slugs, and a secret that is written, never shown back."""

from __future__ import annotations

from django import forms

from notify.choices import ChannelKind
from notify.models import NotificationChannel


class RulesField(forms.CharField):
    """Rule slugs separated by commas or spaces; empty: every rule."""

    def prepare_value(self, value):
        return ", ".join(value) if isinstance(value, list) else value

    def to_python(self, value):
        text = super().to_python(value) or ""
        return [part for part in text.replace(",", " ").split() if part]


class NotificationChannelForm(forms.ModelForm):
    rules = RulesField(required=False, max_length=2000,
                       help_text="Rule slugs this channel takes, separated by commas (e.g. xid, agent_unreachable); "
                                 "empty: every rule")
    secret = forms.CharField(
        required=False, max_length=128, strip=False, widget=forms.PasswordInput(render_value=False),
        help_text="Webhook only: the HMAC key of X-Fleet-Signature. Empty: a new channel gets a generated one "
                  "(shown once); an existing one keeps its own.")

    class Meta:
        model = NotificationChannel
        fields = ["name", "kind", "enabled", "target", "secret", "min_severity", "rules"]
        widgets = {"target": forms.TextInput(attrs={"size": 60, "class": "wide"})}

    def clean(self):
        data = super().clean()
        if not data.get("secret") and self.instance.pk:
            # Kept: the model's checks see the secret the channel has, or none once it is not a webhook.
            data["secret"] = self.instance.secret if data.get("kind") == ChannelKind.WEBHOOK else ""
        return data

    def changes(self) -> dict:
        """The validated values for `notify.services.save_channel`."""
        fields = {name: self.cleaned_data[name] for name in self.Meta.fields}
        fields["target"], fields["rules"] = self.instance.target, self.instance.rules  # as the model's clean left them
        return fields

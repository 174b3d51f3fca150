"""Notification channels (where messages go) and deliveries (one message to one channel, with
its attempts): the history of what was sent, kept NOTIFY_KEEP_DAYS once sent."""

from __future__ import annotations

import secrets

from django.core.exceptions import ValidationError
from django.core.validators import URLValidator, validate_email
from django.db import models

from notify import messages
from notify.choices import ChannelKind, DeliveryStatus, Severity

#: Bytes of a generated webhook secret (shown once, as hex).
SECRET_BYTES = 32


def new_secret() -> str:
    return secrets.token_hex(SECRET_BYTES)


def email_addresses(target: str) -> list[str]:
    """The addresses of an e-mail channel's target ("a@x, b@y"), in order."""
    return [part.strip() for part in target.replace(";", ",").split(",") if part.strip()]


class NotificationChannel(models.Model):
    """Where messages go: an e-mail list, a signed JSON webhook, a chat webhook, or the app's
    own notifications for every active admin. A channel takes a message when it is enabled, the
    message is at least `min_severity`, and its rule is in `rules` (empty: every rule)."""

    name = models.CharField(max_length=100, unique=True)
    kind = models.CharField(max_length=10, choices=ChannelKind.choices)
    enabled = models.BooleanField(default=True)
    target = models.CharField(
        max_length=1000, blank=True,
        help_text="E-mail: addresses separated by commas. Webhook, Slack: the http(s) URL to post to. "
                  "In the app: empty (every active admin).")
    secret = models.CharField(max_length=128, blank=True,
                              help_text="Webhook: the HMAC-SHA256 key of X-Fleet-Signature; generated when empty")
    min_severity = models.CharField(max_length=10, choices=Severity.choices, default=Severity.INFO)
    rules = models.JSONField(default=list, blank=True,
                             help_text="Rule slugs this channel takes (e.g. [\"xid\"]); empty: every rule")
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["name", "id"]

    def __str__(self):
        return self.name

    def clean(self):
        """Each kind's target, and the rule slugs; errors name the field. Normalizes an e-mail
        list to "a@x, b@y" and strips a URL."""
        errors: dict[str, str] = {}
        target = (self.target or "").strip()
        if self.kind == ChannelKind.EMAIL:
            addresses = email_addresses(target)
            if not addresses:
                errors["target"] = "Give at least one e-mail address (several separated by commas)."
            for address in addresses:
                try:
                    validate_email(address)
                except ValidationError:
                    errors["target"] = f"{address[:100]!r} is not an e-mail address."
                    break
            target = ", ".join(addresses)
        elif self.kind in (ChannelKind.WEBHOOK, ChannelKind.SLACK):
            try:
                URLValidator(schemes=["http", "https"])(target)
            except ValidationError:
                errors["target"] = "Give the http:// or https:// URL to post to."
        elif self.kind == ChannelKind.IN_APP and target:
            errors["target"] = "Leave empty: in-app notifications go to every active admin."
        if len(target) > 1000:
            errors["target"] = "At most 1000 characters."
        self.target = target
        if self.kind != ChannelKind.WEBHOOK and self.secret:
            errors["secret"] = "Only webhook channels sign their posts; leave the secret empty."
        rules = self.rules
        if not isinstance(rules, list) or not all(isinstance(rule, str) for rule in rules):
            errors["rules"] = "A list of rule slugs, e.g. [\"xid\", \"agent_unreachable\"]."
        else:
            bad = [rule for rule in rules if not messages.RULE_SLUG.match(rule)]
            if bad:
                errors["rules"] = (f"{bad[0][:70]!r} is not a rule slug (lowercase letters, digits, _ and -, "
                                   f"starting with a letter).")
            elif len(rules) > 100:
                errors["rules"] = "At most 100 rules."
            else:
                self.rules = sorted(set(rules))
        if errors:
            raise ValidationError(errors)

    def takes(self, message: messages.Message) -> bool:
        """Whether this channel's filters let `message` through (enabled is the caller's to check)."""
        if messages.severity_rank(message.severity) < messages.severity_rank(self.min_severity):
            return False
        return not self.rules or message.rule in self.rules

    @property
    def addresses(self) -> list[str]:
        return email_addresses(self.target)


class Delivery(models.Model):
    """One message to one channel: its copy of the message, its state and its last attempt.

    A delivery outlives its channel (history): the channel's name and kind are copied, and a
    deleted channel leaves `channel` empty; one still open then fails ("channel deleted")."""

    channel = models.ForeignKey(NotificationChannel, null=True, on_delete=models.SET_NULL,
                                related_name="deliveries")
    channel_name = models.CharField(max_length=100)
    kind = models.CharField(max_length=10, choices=ChannelKind.choices)
    key = models.CharField(max_length=200)
    event = models.CharField(max_length=20)
    severity = models.CharField(max_length=10, choices=Severity.choices)
    rule = models.CharField(max_length=64)
    title = models.CharField(max_length=200)
    body = models.TextField(blank=True)
    url = models.CharField(max_length=300, blank=True)
    data = models.JSONField(default=dict, blank=True)
    status = models.CharField(max_length=10, choices=DeliveryStatus.choices, default=DeliveryStatus.PENDING)
    attempts = models.PositiveIntegerField(default=0)
    next_attempt_at = models.DateTimeField(null=True, blank=True,
                                           help_text="When the next attempt is due (open deliveries)")
    claimed_until = models.DateTimeField(null=True, blank=True,
                                         help_text="A worker is sending it until then; past it, another may")
    last_error = models.TextField(blank=True)
    response_status = models.PositiveIntegerField(null=True, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)
    sent_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-created_at", "-id"]
        verbose_name_plural = "deliveries"
        indexes = [
            models.Index(fields=["status", "next_attempt_at"], name="delivery_due_idx"),
            models.Index(fields=["channel", "-created_at"], name="delivery_channel_idx"),
            models.Index(fields=["key"], name="delivery_key_idx"),
        ]

    def __str__(self):
        return f"{self.channel_name}: {self.title[:60]} ({self.status})"

    @property
    def message(self) -> messages.Message:
        return messages.Message(key=self.key, event=self.event, severity=self.severity, rule=self.rule,
                                title=self.title, body=self.body, url=self.url, data=self.data)

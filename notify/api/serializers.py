"""Bodies of the notify API: channels (the secret write-only) and deliveries (read-only)."""

from __future__ import annotations

from django.core.exceptions import ValidationError as DjangoValidationError
from rest_framework import serializers

from notify.models import Delivery, NotificationChannel


class NotificationChannelSerializer(serializers.ModelSerializer):
    """A channel as admins see it. `secret` is written, never read back: `has_secret` says
    whether there is one."""

    secret = serializers.CharField(
        write_only=True, required=False, allow_blank=True, max_length=128, trim_whitespace=False,
        help_text="Webhook only: the HMAC-SHA256 key of X-Fleet-Signature. Left empty on create, one is "
                  "generated and shown once in the response; never shown again.")
    rules = serializers.ListField(child=serializers.CharField(max_length=64), required=False, max_length=100,
                                  help_text='Rule slugs this channel takes, e.g. ["xid"]; empty: every rule')
    has_secret = serializers.SerializerMethodField()

    class Meta:
        model = NotificationChannel
        fields = ["id", "name", "kind", "enabled", "target", "secret", "has_secret", "min_severity", "rules",
                  "created_at", "updated_at"]
        read_only_fields = ["created_at", "updated_at"]

    def get_has_secret(self, obj) -> bool:
        return bool(obj.secret)

    def validate(self, attrs):
        """The model's own checks (`NotificationChannel.clean`), on the channel as it would be saved."""
        instance = self.instance
        values = {field: getattr(instance, field) for field in ("name", "kind", "enabled", "target", "secret",
                                                              "min_severity", "rules")} if instance else {}
        if instance and not attrs.get("secret"):
            attrs.pop("secret", None)  # an update without a secret keeps the current one
        values.update(attrs)
        candidate = NotificationChannel(**values)
        if candidate.kind != "webhook" and "secret" not in attrs:
            candidate.secret = ""  # a channel no longer a webhook loses its secret (notify.services)
        try:
            candidate.clean()
        except DjangoValidationError as exc:
            raise serializers.ValidationError(exc.message_dict) from None
        attrs["target"], attrs["rules"] = candidate.target, candidate.rules
        return attrs


class NotificationChannelCreatedSerializer(NotificationChannelSerializer):
    """A channel just created: `secret` carries the generated webhook secret, once."""

    secret = serializers.CharField(read_only=True, allow_null=True,
                                   help_text="The generated webhook secret, shown only in this response; "
                                             "null when you gave one or the kind has none")

    class Meta(NotificationChannelSerializer.Meta):
        pass


class DeliverySerializer(serializers.ModelSerializer):
    """One message to one channel, its state and its last attempt."""

    class Meta:
        model = Delivery
        fields = ["id", "channel", "channel_name", "kind", "key", "event", "severity", "rule", "title", "body", "url",
                  "data", "status", "attempts", "next_attempt_at", "last_error", "response_status", "created_at",
                  "sent_at"]
        read_only_fields = fields

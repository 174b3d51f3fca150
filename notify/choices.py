from django.db import models


class ChannelKind(models.TextChoices):
    EMAIL = "email", "E-mail"
    WEBHOOK = "webhook", "Webhook (signed JSON)"
    SLACK = "slack", "Slack / Mattermost / Teams"
    IN_APP = "in_app", "In the app (every active admin)"


class Severity(models.TextChoices):
    """Least severe first (notify.messages.SEVERITIES)."""

    INFO = "info", "Info"
    WARNING = "warning", "Warning"
    CRITICAL = "critical", "Critical"


class DeliveryStatus(models.TextChoices):
    PENDING = "pending", "Pending"
    RETRYING = "retrying", "Retrying"
    SENT = "sent", "Sent"
    FAILED = "failed", "Failed (gave up)"


OPEN_STATUSES = (DeliveryStatus.PENDING, DeliveryStatus.RETRYING)

"""What Django's error pages and error mails may show of the settings."""

import re

from django.views.debug import SafeExceptionReporterFilter


class SecretSafeExceptionReporterFilter(SafeExceptionReporterFilter):
    """Django's filter for error pages and error mails, also hiding the settings that hold
    connection URLs (DATABASE_URL, DATABASE_REPLICA_URL, REDIS_URL, CELERY_BROKER_URL, CACHE_URL and the CACHES built
    from it): their passwords sit in the URL, where Django's default pattern (API, TOKEN, KEY,
    SECRET, PASS...) does not look."""

    hidden_settings = re.compile(
        "API|TOKEN|KEY|SECRET|PASS|SIGNATURE|HTTP_COOKIE|DATABASE_URL|DATABASE_REPLICA_URL|REDIS_URL|BROKER_URL|CACHE_URL|CACHES",
        flags=re.IGNORECASE,
    )

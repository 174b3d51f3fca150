"""API tokens stored as SHA-256 digests, and the move of DRF's plain-text keys into them.

Until this migration scripts signed in with DRF's authtoken, whose table holds every key in
plain text. `move_drf_tokens` hashes each of those keys into ApiToken (so every script keeps
working with the key it has) and then empties DRF's table, so no plain key stays in the
database. The table is read with raw SQL, and only where it exists: rest_framework.authtoken
is no longer installed, and a fresh database never had it. Migrating back drops ApiToken:
keys would have to be issued again.
"""

import hashlib
from datetime import UTC

import django.db.models.deletion
import django.utils.timezone
from django.conf import settings
from django.db import migrations, models
from django.utils import timezone
from django.utils.dateparse import parse_datetime

DRF_TABLE = "authtoken_token"
MIGRATED_NAME = "moved from DRF authtoken"
PREFIX_CHARS = 8


def _aware(value):
    """DRF's `created` as an aware datetime (SQLite hands back text or a naive UTC time)."""
    if isinstance(value, str):
        value = parse_datetime(value)
    if value is None:
        return timezone.now()
    return value.replace(tzinfo=UTC) if timezone.is_naive(value) else value


def move_drf_tokens(apps, schema_editor):
    """Store each DRF key's digest as an ApiToken of the same user, then delete DRF's rows."""
    connection = schema_editor.connection
    if DRF_TABLE not in connection.introspection.table_names():
        return
    ApiToken = apps.get_model("fleet", "ApiToken")
    quote = connection.ops.quote_name
    with connection.cursor() as cursor:
        cursor.execute(f"SELECT {quote('key')}, {quote('user_id')}, {quote('created')} FROM {quote(DRF_TABLE)}")
        rows = cursor.fetchall()
    tokens = [
        ApiToken(user_id=user_id, name=MIGRATED_NAME, prefix=key[:PREFIX_CHARS],
                 token_sha256=hashlib.sha256(key.encode()).hexdigest(), created_at=_aware(created))
        for key, user_id, created in rows
    ]
    # A key moved by an earlier, interrupted run is kept once (the digest is unique).
    ApiToken.objects.using(connection.alias).bulk_create(tokens, batch_size=500, ignore_conflicts=True)
    with connection.cursor() as cursor:
        cursor.execute(f"DELETE FROM {quote(DRF_TABLE)}")


class Migration(migrations.Migration):

    dependencies = [
        ("fleet", "0004_requests_scheduler_audit"),
        migrations.swappable_dependency(settings.AUTH_USER_MODEL),
    ]

    operations = [
        migrations.CreateModel(
            name="ApiToken",
            fields=[
                ("id", models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name="ID")),
                ("name", models.CharField(blank=True, help_text="What the token is for, e.g. 'render farm sync'",
                                          max_length=100)),
                ("prefix", models.CharField(editable=False, help_text="The key's first characters", max_length=8)),
                ("token_sha256", models.CharField(editable=False, max_length=64)),
                ("created_at", models.DateTimeField(default=django.utils.timezone.now, editable=False)),
                ("last_used_at", models.DateTimeField(blank=True, editable=False,
                                                      help_text="Written at most once a minute", null=True)),
                ("user", models.ForeignKey(on_delete=django.db.models.deletion.CASCADE, related_name="api_tokens",
                                           to=settings.AUTH_USER_MODEL)),
            ],
            options={
                "verbose_name": "API token",
                "ordering": ["-created_at", "-id"],
                "indexes": [models.Index(fields=["prefix"], name="apitoken_prefix_idx")],
                "constraints": [models.UniqueConstraint(fields=("token_sha256",),
                                                        name="apitoken_token_sha256_unique")],
            },
        ),
        migrations.RunPython(move_drf_tokens, migrations.RunPython.noop),
    ]


from django.db import migrations, models

from telemetry import state_digest

#: Each state model and the columns that name a row (not part of its reading).
KEYS = {"gpuhealthstate": ("gpu_id",), "vgpuhealthstate": ("vm_id", "gpu_id"), "hostdriverstate": ("host_id",)}


def digest_stored_rows(apps, schema_editor):
    """Give every stored state row the digest of the reading it holds, so the first batch after the
    upgrade finds them unchanged (a row without a digest would be rewritten, its `changed_at` moved)."""
    for name, keys in KEYS.items():
        model = apps.get_model("telemetry", name)
        digest = state_digest.for_model(model, keys)
        rows = []
        for row in model.objects.order_by("pk").iterator(chunk_size=2000):
            row.reading_digest = digest.of_row(row)
            rows.append(row)
            if len(rows) == 2000:
                model.objects.bulk_update(rows, ["reading_digest"])
                rows = []
        model.objects.bulk_update(rows, ["reading_digest"])


class Migration(migrations.Migration):

    dependencies = [
        ('telemetry', '0011_sample_references_unconstrained'),
    ]

    operations = [
        migrations.AddField(
            model_name='gpuhealthstate',
            name='reading_digest',
            field=models.BigIntegerField(editable=False, null=True),
        ),
        migrations.AddField(
            model_name='hostdriverstate',
            name='reading_digest',
            field=models.BigIntegerField(editable=False, null=True),
        ),
        migrations.AddField(
            model_name='vgpuhealthstate',
            name='reading_digest',
            field=models.BigIntegerField(editable=False, null=True),
        ),
        migrations.RunPython(digest_stored_rows, migrations.RunPython.noop, elidable=True),
    ]

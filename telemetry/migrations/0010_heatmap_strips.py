"""Heatmap strips (telemetry.strips): each GPU's UTC day of a % metric as the typed heatmap's
codes, and from when on they are complete.

On PostgreSQL the strips table leaves room in each page (fillfactor 70): the strips of the day
in progress are rewritten at every 5-minute bucket, and a new row version that fits in the
page of the old one needs no index entry (a HOT update).
"""

import django.db.models.deletion
from django.db import migrations, models


def leave_room(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute("ALTER TABLE telemetry_gpustrip SET (fillfactor = 70)")


class Migration(migrations.Migration):

    dependencies = [
        ('fleet', '0011_api_token_scope_expiry_revocation'),
        ('telemetry', '0009_vmrollup_partial'),
    ]

    operations = [
        migrations.CreateModel(
            name='StripCoverage',
            fields=[
                ('id', models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name='ID')),
                ('name', models.CharField(max_length=40, unique=True)),
                ('since', models.DateTimeField()),
                ('updated_at', models.DateTimeField(auto_now=True)),
            ],
        ),
        migrations.CreateModel(
            name='GpuStrip',
            fields=[
                ('id', models.BigAutoField(primary_key=True, serialize=False)),
                ('series', models.CharField(help_text='The rollup column the codes encode, e.g. util_gpu_avg', max_length=24)),
                ('day', models.DateField(help_text='UTC day of the first bucket')),
                ('codes', models.BinaryField(help_text='One byte a 5-minute bucket of the day; 255: no reading')),
                ('gpu', models.ForeignKey(on_delete=django.db.models.deletion.CASCADE, related_name='strips', to='fleet.gpu')),
            ],
            options={
                'ordering': ['day', 'series', 'gpu_id'],
                'constraints': [models.UniqueConstraint(fields=('day', 'series', 'gpu'), name='gpustrip_unique_day_series_gpu')],
            },
        ),
        migrations.RunPython(leave_room, migrations.RunPython.noop),
    ]

"""Ships NVIDIA's vGPU catalog (GPU models and profiles) with the database."""

from django.db import migrations

from fleet.catalog import load_catalog


def forwards(apps, schema_editor):
    load_catalog(apps.get_model("fleet", "GpuModel"), apps.get_model("fleet", "VgpuProfile"))


class Migration(migrations.Migration):
    dependencies = [("fleet", "0001_initial")]

    # Reversing keeps the rows: inventory may point at them.
    operations = [migrations.RunPython(forwards, migrations.RunPython.noop)]

"""Load the sizing guide's workflow presets (sizing/presets.py); rows that exist are left as edited."""

from django.db import migrations


def load_presets(apps, schema_editor):
    from sizing.presets import load_presets as load

    load(apps.get_model("sizing", "WorkflowPreset"))


class Migration(migrations.Migration):
    dependencies = [("sizing", "0001_initial")]

    operations = [migrations.RunPython(load_presets, migrations.RunPython.noop)]

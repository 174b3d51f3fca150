"""Load the sizing guide's workflow presets (sizing/presets.py); rows that exist are left as edited."""

from django.db import migrations


def load_presets(apps, schema_editor):
    from sizing.presets import DEFAULT_PRESETS

    WorkflowPreset = apps.get_model("sizing", "WorkflowPreset")
    for workflow, (fb_mib, vgpus, vcpus, ram_gib, note) in DEFAULT_PRESETS.items():
        WorkflowPreset.objects.get_or_create(
            workflow=workflow,
            defaults={"fb_mib": fb_mib, "series": "Q", "vgpus": vgpus, "vcpus": vcpus, "ram_gib": ram_gib,
                      "note": note},
        )


class Migration(migrations.Migration):
    dependencies = [("sizing", "0001_initial")]

    operations = [migrations.RunPython(load_presets, migrations.RunPython.noop)]

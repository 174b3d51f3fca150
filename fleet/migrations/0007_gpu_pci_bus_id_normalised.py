"""PCI bus ids in NVML's form (fleet/pci.py): existing rows are rewritten, so that 0000:3b:00.0
typed by an admin and 00000000:3B:00.0 reported by an agent are one GPU from now on.

Two GPUs of one host whose ids are two spellings of one bus id would become one row: the
migration stops, naming them, and changes nothing (delete or correct one of them, then migrate
again). An id that is no PCI bus id at all is left as it is; the GPU's form asks for a valid
one at its next change."""

from collections import defaultdict

from django.db import migrations, models

import fleet.models
from fleet.pci import InvalidPciBusId, normalize_pci_bus_id


def collisions(rows) -> list[str]:
    """Descriptions of the GPUs that normalising would merge, from (id, host name, bus id) rows."""
    groups = defaultdict(list)
    for pk, host_name, bus_id in rows:
        try:
            groups[(host_name, normalize_pci_bus_id(bus_id))].append((pk, bus_id))
        except InvalidPciBusId:
            continue
    return [
        f"host {host_name}: GPUs {', '.join(f'{pk} ({bus_id})' for pk, bus_id in members)} are all {canonical}"
        for (host_name, canonical), members in sorted(groups.items()) if len(members) > 1
    ]


def normalise(apps, schema_editor):
    Gpu = apps.get_model("fleet", "Gpu")
    rows = list(Gpu.objects.values_list("pk", "host__name", "pci_bus_id").order_by("pk"))
    merged = collisions(rows)
    if merged:
        raise RuntimeError(
            "Cannot normalise PCI bus ids: two GPUs of one host would have the same id ("
            + "; ".join(merged) + "). Delete or correct one of each, then migrate again.")
    for pk, _, bus_id in rows:
        try:
            canonical = normalize_pci_bus_id(bus_id)
        except InvalidPciBusId:
            continue
        if canonical != bus_id:
            Gpu.objects.filter(pk=pk).update(pci_bus_id=canonical)


class Migration(migrations.Migration):

    dependencies = [
        ('fleet', '0006_host_multi_vgpu_same_gpu'),
    ]

    operations = [
        migrations.AlterField(
            model_name='gpu',
            name='pci_bus_id',
            field=models.CharField(help_text='e.g. 00000000:3B:00.0 (0000:3b:00.0 is read as the same)', max_length=32, validators=[fleet.models.validate_pci_bus_id], verbose_name='PCI bus id'),
        ),
        migrations.RunPython(normalise, migrations.RunPython.noop),
    ]

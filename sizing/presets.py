"""The workflow presets the product starts with, from NVIDIA's Maya/Arnold sizing guide.

[SEED] in ../shared/reference/vgpu-facts.md section 5: modeling, texturing and shading take
half a 24 GB Quadro RTX 6000 (12Q); animation a whole one (24Q); lighting and rendering the
largest (24Q, with multi-vGPU up to four GPUs per VM). vCPU and RAM follow NVIDIA's RTX vWS
sizing pages (medium users 8 vCPU / 16-32 GB, heavy users 12+ vCPU / 32-64 GB). Workflows the
guide does not size start at medium-user figures. Loaded once by a data migration; admins
edit the rows afterwards.
"""

from django.db import transaction

from fleet import audit, locks
from sizing.models import WorkflowPreset

GIB = 1024

# workflow: (frame buffer per vGPU in MiB, vGPUs, vCPUs, RAM GiB, note)
DEFAULT_PRESETS: dict[str, tuple[int, int, int, int, str]] = {
    "modeling": (12 * GIB, 1, 8, 32, "Sizing guide: 12Q, half a Quadro RTX 6000"),
    "texturing": (12 * GIB, 1, 8, 32, "Sizing guide: 12Q, half a Quadro RTX 6000"),
    "shading": (12 * GIB, 1, 8, 32, "Sizing guide: 12Q, half a Quadro RTX 6000"),
    "animation": (24 * GIB, 1, 12, 64, "Sizing guide: 24Q, a whole Quadro RTX 6000"),
    "lighting": (24 * GIB, 1, 16, 64, "Sizing guide: 24Q; multi-vGPU up to four for heavy scenes"),
    "rendering": (24 * GIB, 1, 16, 64, "Sizing guide: 24Q; multi-vGPU up to four for heavy scenes"),
    "layout": (8 * GIB, 1, 8, 32, "Medium user (RTX vWS sizing: 4Q-8Q, 8 vCPU)"),
    "fx": (24 * GIB, 1, 16, 64, "Heavy user (RTX vWS sizing: 12Q-24Q, 12+ vCPU)"),
    "compositing": (8 * GIB, 1, 8, 32, "Medium user (RTX vWS sizing: 4Q-8Q, 8 vCPU)"),
    "other": (8 * GIB, 1, 8, 32, "Medium user (RTX vWS sizing: 4Q-8Q, 8 vCPU)"),
}


def load_presets(workflow_preset_model) -> None:
    """Create the presets that do not exist; rows that exist are left as admins edited them.
    Takes the model class so the data migration can pass its historical model."""
    for workflow, (fb_mib, vgpus, vcpus, ram_gib, note) in DEFAULT_PRESETS.items():
        workflow_preset_model.objects.get_or_create(
            workflow=workflow,
            defaults={"fb_mib": fb_mib, "series": "Q", "vgpus": vgpus, "vcpus": vcpus, "ram_gib": ram_gib,
                      "note": note},
        )


def save_preset(preset: WorkflowPreset, **fields) -> WorkflowPreset:
    """Save a preset (new, or changed by `fields` or in memory) and record the change in the
    audit log: the one write path of the API and the admin page, which the planner reads."""
    with transaction.atomic():
        before = None
        if preset.pk is not None:
            stored = locks.lock_rows(WorkflowPreset.objects.filter(pk=preset.pk))
            before = audit.snapshot(stored[0] if stored else None)
        for name, value in fields.items():
            setattr(preset, name, value)
        preset.save()
        after = audit.snapshot(preset)
        if before is None:
            audit.record("workflow_preset.create", preset, after=after)
        elif audit.changed(before, after):
            audit.record("workflow_preset.update", preset, before=before, after=after)
    return preset

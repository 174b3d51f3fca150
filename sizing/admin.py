"""Admin site for sizing: workflow presets (editable), suggestions, optimizer runs and artists'
feedback (read-mostly; a rating whose note should not stay can be deleted).

Every save and deletion here is in the audit log: presets save through `sizing.presets.save_preset`
(as the API does), deletions of suggestions and runs through `fleet.admin_audit`.
"""

from django import forms
from django.contrib import admin

from fleet.admin_audit import AuditedAdmin
from fleet.choices import Workflow
from sizing.models import Feedback, OptimizerRun, Suggestion, WorkflowPreset
from sizing.presets import save_preset

# --- workflow presets (density planner) ---


class WorkflowPresetForm(forms.ModelForm):
    """Bounds a preset to what a vGPU profile can be: 1 GiB to a whole 80 GB GPU per vGPU."""

    fb_mib = forms.IntegerField(
        label="Frame buffer per vGPU, MiB", min_value=1024, max_value=80 * 1024,
        help_text="12288 is a 12Q. The planner takes the smallest profile of the board with at least this much.",
    )

    class Meta:
        model = WorkflowPreset
        fields = ["workflow", "fb_mib", "series", "vgpus", "vcpus", "ram_gib", "note"]


@admin.register(WorkflowPreset)
class WorkflowPresetAdmin(AuditedAdmin):
    """What each workflow gets by default in the density planner; edited in the list itself."""

    form = WorkflowPresetForm
    list_display = ("workflow", "fb_mib", "frame_buffer", "series", "vgpus", "vcpus", "ram_gib", "note", "updated_at")
    list_editable = ("fb_mib", "series", "vgpus", "vcpus", "ram_gib", "note")
    ordering = ("workflow",)

    def save_model(self, request, obj, form, change):
        save_preset(obj)

    @admin.display(description="Frame buffer")
    def frame_buffer(self, obj: WorkflowPreset) -> str:
        return f"{obj.fb_mib / 1024:g} GiB"

    def get_readonly_fields(self, request, obj=None):
        # The workflow is the preset's identity: the planner looks presets up by it.
        return ("workflow",) if obj is not None else ()

    def has_add_permission(self, request) -> bool:
        # One preset per workflow: adding is for a workflow that has none.
        return super().has_add_permission(request) and WorkflowPreset.objects.count() < len(Workflow.values)

    def has_delete_permission(self, request, obj=None) -> bool:
        # A workflow without a preset could not be planned; change its figures instead.
        return False

class RecordAdmin(AuditedAdmin):
    """A record the product writes (a suggestion, an optimizer run, a rating): every field read
    here, none added or changed; deleting one is what the admin site is for."""

    def get_readonly_fields(self, request, obj=None):
        return [f.name for f in self.model._meta.fields]

    def has_add_permission(self, request) -> bool:
        return False

    def has_change_permission(self, request, obj=None) -> bool:
        return False


# --- suggestions ---


@admin.register(Suggestion)
class SuggestionAdmin(RecordAdmin):
    """Suggestions are written by the hourly refresh and acted on from the right-sizing page (or
    the API); here their figures are read. A deleted one comes back at the next refresh."""

    list_display = ("vm", "action", "current_profile", "suggested_profile", "suggested_vgpus", "fits", "gpus_delta",
                    "computed_at", "dismissed")
    list_filter = ("action", "fits")
    list_select_related = ("vm", "current_profile", "suggested_profile")
    search_fields = ("vm__name",)
    ordering = ("vm__name",)

    @admin.display(boolean=True, description="Dismissed")
    def dismissed(self, obj: Suggestion) -> bool:
        return obj.is_dismissed


# --- optimizer runs ---


@admin.register(OptimizerRun)
class OptimizerRunAdmin(RecordAdmin):
    """Runs are started and applied from the optimizer page (or the API), which re-check the
    fleet; here they are read, and old ones deleted."""

    list_display = ("id", "status", "progress", "stage", "created_by", "created_at", "finished_at", "applied_by")
    list_filter = ("status",)
    list_select_related = ("created_by", "applied_by")
    ordering = ("-created_at", "-id")


# --- artists' feedback ---


@admin.register(Feedback)
class FeedbackAdmin(RecordAdmin):
    """Artists rate their own workstation from their page (or the API); here admins read the
    ratings and may delete one, e.g. a note that should not stay. Nobody rates for an artist."""

    list_display = ("session_date", "vm", "artist", "host", "rating", "tags", "created_at")
    list_filter = ("rating", "artist__workflow")
    list_select_related = ("vm", "artist", "host")
    search_fields = ("vm__name", "artist__name")
    ordering = ("-session_date", "vm__name")

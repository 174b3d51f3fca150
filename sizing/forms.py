"""Forms of the sizing pages.

Density planner: a server configuration (`PlannerServerForm`) and an artist mix (a formset of
`ArtistRowForm`), submitted by GET so every plan is a link. Choices come from a
`PlannerCatalog` loaded once per request, so the page costs the same number of queries with 2
rows as with 50.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from django import forms
from django.core.exceptions import ValidationError
from django.forms import BaseFormSet, formset_factory

from fleet import placement
from fleet.choices import SizeMode, Workflow
from fleet.models import GpuModel, Host, VgpuProfile, VirtualMachine
from sizing import planner, planning, study
from sizing.models import WorkflowPreset

# --- density planner ---

MAX_ARTIST_ROWS = 50
WORKFLOW_PREFIX = "workflow:"
PROFILE_PREFIX = "profile:"


@dataclass(frozen=True)
class PlannerCatalog:
    """What the planner's choices are made of: GPU models, profiles, presets and hosts (four queries)."""

    gpu_models: dict[int, GpuModel]
    profiles: dict[int, VgpuProfile]
    presets: dict[str, WorkflowPreset]
    hosts: list[tuple[int, str]]

    @classmethod
    def load(cls) -> PlannerCatalog:
        gpu_models = {m.pk: m for m in GpuModel.objects.order_by("name")}
        profiles = {}
        for profile in VgpuProfile.objects.order_by("gpu_model__name", "-fb_mib", "series", "id"):
            profile.gpu_model = gpu_models[profile.gpu_model_id]  # shared rows, no join per profile
            profiles[profile.pk] = profile
        return cls(
            gpu_models=gpu_models, profiles=profiles, presets=planning.presets_by_workflow(),
            hosts=list(Host.objects.order_by("name").values_list("pk", "name")),
        )

    def profile_specs(self, gpu_model: GpuModel) -> list[placement.ProfileSpec]:
        return sorted((p.to_spec() for p in self.profiles.values() if p.gpu_model_id == gpu_model.pk),
                      key=lambda spec: (spec.fb_mib, spec.id))

    def guide_model(self) -> GpuModel | None:
        """The sizing guide's board, or the first one the catalog has."""
        by_name = {m.name: m for m in self.gpu_models.values()}
        return by_name.get(planning.GUIDE_GPU_MODEL) or next(iter(self.gpu_models.values()), None)

    def demand_choices(self) -> list:
        """Workflows (with what their preset gives), then each board's profiles, grouped."""
        workflows = []
        for value, label in Workflow.choices:
            preset = self.presets.get(value)
            if preset is not None:
                vgpus = f"{preset.vgpus} x " if preset.vgpus > 1 else ""
                label = f"{label} ({vgpus}{preset.fb_mib / 1024:g} GiB, {preset.vcpus} vCPU, {preset.ram_gib} GiB)"
            workflows.append((WORKFLOW_PREFIX + value, label))
        groups: dict[str, list] = {}
        for profile in self.profiles.values():
            groups.setdefault(f"{profile.gpu_model.name} profiles", []).append(
                (f"{PROFILE_PREFIX}{profile.pk}", profile.name))
        return [("", "—"), ("Workflow presets", workflows), *groups.items()]


class PlannerServerForm(forms.Form):
    """One server configuration; the plan uses as many identical servers as it needs."""

    gpu_model = forms.TypedChoiceField(label="GPU model", coerce=int)
    gpus = forms.IntegerField(label="GPUs per server", min_value=1, max_value=planner.MAX_GPUS_PER_SERVER)
    cpu_threads = forms.IntegerField(label="CPU threads", min_value=1, max_value=4096,
                                     help_text="Hardware threads per server")
    ram_gib = forms.IntegerField(label="RAM, GiB", min_value=1, max_value=65536)
    vcpu_overcommit = forms.FloatField(label="vCPU overcommit", min_value=0.1, max_value=16,
                                       help_text="vCPUs per hardware thread")
    ram_overcommit = forms.FloatField(label="RAM overcommit", min_value=0.1, max_value=4)
    size_mode = forms.ChoiceField(label="Size mode", choices=SizeMode.choices)
    from_measurements = forms.BooleanField(
        label="From measurements", required=False,
        help_text="Plan the fleet's VMs with their suggested profiles instead of the artist mix",
    )
    measured_cpu_ram = forms.BooleanField(
        label="vCPUs and RAM from measurements", required=False,
        help_text="Each workflow's vCPUs and RAM as the fleet's measured VMs of it need them (the 75th percentile "
                  "of their right-sized vCPUs and RAM), instead of the presets'",
    )
    hosts = forms.TypedMultipleChoiceField(
        label="Only VMs on", coerce=int, required=False, help_text="With From measurements; none: every host",
    )

    def __init__(self, *args, catalog: PlannerCatalog, **kwargs):
        super().__init__(*args, **kwargs)
        self.catalog = catalog
        self.fields["gpu_model"].choices = [(m.pk, m.name) for m in catalog.gpu_models.values()]
        self.fields["hosts"].choices = catalog.hosts

    def clean_gpu_model(self) -> GpuModel:
        return self.catalog.gpu_models[self.cleaned_data["gpu_model"]]

    def clean(self):
        cleaned = super().clean()
        model, size_mode = cleaned.get("gpu_model"), cleaned.get("size_mode")
        if model is not None and size_mode:
            error = planning.size_mode_error(model, size_mode)
            if error:
                self.add_error("size_mode", error)
        if cleaned.get("hosts") and not cleaned.get("from_measurements"):
            self.add_error("hosts", "Hosts choose VMs only in From measurements mode.")
        return cleaned

    def board(self) -> GpuModel | None:
        """The chosen GPU model when it is valid (row forms check explicit profiles against it)."""
        if self.is_bound and "gpu_model" not in self.errors:
            return self.cleaned_data.get("gpu_model")
        return None


class ArtistRowForm(forms.Form):
    """A row of the artist mix: a workflow (its preset) or a profile, how many, and overrides."""

    demand = forms.ChoiceField(label="Workflow or profile",
                               error_messages={"required": "Choose a workflow or a profile for this row."})
    count = forms.IntegerField(label="Artists", min_value=1, max_value=planner.MAX_ARTISTS, required=False)
    vcpus = forms.IntegerField(label="vCPUs", min_value=1, max_value=1024, required=False)
    ram_gib = forms.IntegerField(label="RAM, GiB", min_value=1, max_value=16384, required=False)
    vgpus = forms.IntegerField(label="vGPUs", min_value=1, max_value=placement.MAX_VGPUS_PER_VM, required=False)
    label = forms.CharField(label="Label", max_length=60, required=False)

    def __init__(self, *args, catalog: PlannerCatalog, demand_choices: list, board: GpuModel | None, **kwargs):
        super().__init__(*args, **kwargs)
        self.catalog = catalog
        self.board = board
        self.fields["demand"].choices = demand_choices

    def clean_demand(self) -> tuple[str, object]:
        """("workflow", name) or ("profile", VgpuProfile), the profile of the server's board."""
        value = self.cleaned_data["demand"]
        if value.startswith(WORKFLOW_PREFIX):
            workflow = value.removeprefix(WORKFLOW_PREFIX)
            if workflow not in self.catalog.presets:
                raise ValidationError(f"No preset for {workflow}: add one under workflow presets.")
            return "workflow", workflow
        profile = self.catalog.profiles[int(value.removeprefix(PROFILE_PREFIX))]
        error = planning.profile_board_error(profile, self.board) if self.board is not None else None
        if error:
            raise ValidationError(error)
        return "profile", profile

    def row(self) -> planning.ArtistRow:
        data = self.cleaned_data
        kind, value = data["demand"]
        return planning.ArtistRow(
            count=data.get("count") or 1, workflow=value if kind == "workflow" else None,
            profile=value if kind == "profile" else None, vcpus=data.get("vcpus"), ram_gib=data.get("ram_gib"),
            vgpus=data.get("vgpus"), label=data.get("label", ""),
        )


class BaseArtistFormSet(BaseFormSet):
    """Blank rows are skipped; the rows filled in may ask for at most `planner.MAX_ARTISTS` artists."""

    def filled_rows(self) -> list[planning.ArtistRow]:
        return [form.row() for form in self.forms if form.has_changed() and form.is_valid()]

    def clean(self):
        if any(self.errors):
            return
        error = planning.total_artists_error(row.count for row in self.filled_rows())
        if error:
            raise ValidationError(error)


ArtistFormSet = formset_factory(
    ArtistRowForm, formset=BaseArtistFormSet, extra=0, max_num=MAX_ARTIST_ROWS, validate_max=True,
    absolute_max=MAX_ARTIST_ROWS,
)
ARTISTS_PREFIX = "artists"


# --- proof-of-concept study ---


VM_NAME_MAX = VirtualMachine._meta.get_field("name").max_length


class StudyForm(forms.Form):
    """Which hosts' VMs and which days the study covers, and the server whose like the density is
    planned on (GET, so every study is a link). No host chosen: every host; no days given: the
    last 14; no server: the first chosen host with GPUs."""

    hosts = forms.TypedMultipleChoiceField(label="Hosts", coerce=int, required=False,
                                           help_text="None chosen: every host")
    vms = forms.CharField(label="VMs named", required=False, max_length=2000,
                          help_text="Names or patterns (poc-*), by spaces or commas; empty: every VM of the hosts")
    workflows = forms.MultipleChoiceField(label="Workflows", required=False, choices=Workflow.choices,
                                          help_text="None chosen: every workflow")
    server = forms.TypedChoiceField(label="Plan on a server like", coerce=int, required=False, empty_value=None,
                                    help_text="A host with GPUs; none: the first chosen host with GPUs")
    start = forms.DateField(label="From", required=False,
                            widget=forms.DateInput(attrs={"type": "date"}, format="%Y-%m-%d"))
    end = forms.DateField(label="To", required=False,
                          widget=forms.DateInput(attrs={"type": "date"}, format="%Y-%m-%d"))

    def __init__(self, *args, hosts=(), servers=(), today=None, **kwargs):
        super().__init__(*args, **kwargs)
        self.fields["hosts"].choices = [(host.pk, host.name) for host in hosts]
        self.fields["server"].choices = [("", "First chosen host with GPUs")] + [
            (host.pk, host.name) for host in servers]
        self.default_start, self.default_end = study.default_days(today)
        self.fields["start"].initial, self.fields["end"].initial = self.default_start, self.default_end

    def clean_vms(self) -> tuple[str, ...]:
        """The names and patterns asked for; each must name at least one VM, so a typo is said
        rather than studied as an empty group."""
        names = tuple(dict.fromkeys(n for n in re.split(r"[\s,]+", self.cleaned_data["vms"]) if n))
        if len(names) > study.MAX_NAMES:
            raise forms.ValidationError(f"Name at most {study.MAX_NAMES} VMs or patterns; use patterns (poc-*).")
        if too_long := next((n for n in names if len(n) > VM_NAME_MAX), None):
            raise forms.ValidationError(f"{too_long[:40]}… is longer than any VM name ({VM_NAME_MAX} characters).")
        known = VirtualMachine.objects.filter(study.names_q(names)).values_list("name", flat=True)
        if missing := study.unmatched(names, list(known)):
            raise forms.ValidationError("No VM is named " + ", ".join(missing) + ".")
        return names

    def clean(self):
        cleaned = super().clean()
        if self.errors:
            return cleaned
        cleaned["group"] = study.Group(names=cleaned.get("vms") or (), workflows=tuple(cleaned.get("workflows") or ()))
        start = cleaned.get("start") or self.default_start
        end = cleaned.get("end") or self.default_end
        if end > self.default_end:
            self.add_error("end", f"The last day ({end}) is in the future: the study reads what was measured.")
        elif start > end:
            self.add_error("end", f"The last day ({end}) is before the first ({start}).")
        elif (end - start).days + 1 > study.MAX_DAYS:
            self.add_error("start", f"A study covers at most {study.MAX_DAYS} days; this one asks for "
                                    f"{(end - start).days + 1}: choose a later first day.")
        cleaned["start"], cleaned["end"] = start, end
        return cleaned

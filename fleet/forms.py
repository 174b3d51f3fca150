"""Forms of the fleet inventory: they ask `fleet.placement` (through `fleet.services`) before
anything is written, and show each refusal as the rule's own sentence with its numbers.

Validation (`clean`) checks the rules without locks, so an admin sees every violation at once.
`save()` writes through the services, which check again under row locks; when the fleet
changed in between (someone took the last slot) the refusal becomes a form error as well and
`save()` returns None, so a view re-renders the form instead of failing with a 500.
"""

from __future__ import annotations

from datetime import datetime, time

from django import forms
from django.db.models import Exists, OuterRef
from django.utils import timezone

from config.parsing import TIME_MAX
from fleet import placement, services
from fleet.choices import GpuMode
from fleet.models import ApiToken, Gpu, GpuModel, Host, Vgpu, VgpuProfile, VirtualMachine
from fleet.placement import PlacementError, Violation


class RuleErrorsMixin:
    """Shared by the forms whose writes the placement rules govern."""

    def add_violations(self, violations: list[Violation]) -> None:
        """Show each violation as a non-field error, once."""
        shown = set(self.non_field_errors())
        for violation in violations:
            if violation.message not in shown:
                self.add_error(None, violation.message)
                shown.add(violation.message)

    def _fields_for_service(self) -> dict:
        """The cleaned values of the model fields this form edits, as keyword arguments."""
        return {name: self.cleaned_data[name] for name in self._meta.fields if name in self.cleaned_data}

    def _save_through(self, service, commit: bool):
        """Save by calling `service(instance, **fields)`; a refusal becomes a form error and None."""
        instance = super().save(commit=False)  # raises ValueError when the form has errors
        if not commit:
            return instance
        try:
            service(instance, **self._fields_for_service())
        except PlacementError as exc:
            self.add_violations(exc.violations)
            return None
        self._save_m2m()
        return instance

    def _has_errors_in(self, names) -> bool:
        return any(name in self._errors for name in names)


class VgpuPlacementForm(RuleErrorsMixin, forms.ModelForm):
    """Place a new vGPU of a profile on a GPU for a VM (the admin's "Add vGPU")."""

    class Meta:
        model = Vgpu
        fields = ["vm", "gpu", "profile"]

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        if "gpu" in self.fields:
            # A GPU's label names its host and model: load them with it, not once per option.
            self.fields["gpu"].queryset = Gpu.objects.select_related("host", "gpu_model")
        if "profile" in self.fields:
            self.fields["profile"].queryset = self._profile_choices()
            self.fields["profile"].help_text = (
                "Only profiles of GPU models in the fleet are listed; the rules decide whether it fits."
            )

    def _profile_choices(self):
        """Profiles of the GPU models the fleet has in vGPU mode; of one model when the GPU is preset.

        This only shortens the list: `clean()` checks the rules whatever is chosen.
        """
        in_fleet = Gpu.objects.filter(gpu_model=OuterRef("gpu_model"), mode=GpuMode.VGPU)
        profiles = VgpuProfile.objects.select_related("gpu_model").filter(Exists(in_fleet))
        if not self.is_bound:
            gpu = self.initial.get("gpu")
            gpu_id = getattr(gpu, "pk", gpu)
            if gpu_id:
                model_id = Gpu.objects.filter(pk=gpu_id).values("gpu_model_id")[:1]
                profiles = profiles.filter(gpu_model_id=model_id)
        return profiles

    def clean(self):
        cleaned = super().clean()
        vm, gpu, profile = cleaned.get("vm"), cleaned.get("gpu"), cleaned.get("profile")
        if vm is not None and gpu is not None and profile is not None:
            self.add_violations(services.check_vgpu(vm, gpu, profile).violations)
        return cleaned

    def save(self, commit: bool = True) -> Vgpu | None:
        """Place the vGPU through `services.place_vgpu`; returns it, or None when refused at save time."""
        instance = super().save(commit=False)
        if not commit:
            return instance
        try:
            vgpu = services.place_vgpu(self.cleaned_data["vm"], self.cleaned_data["gpu"], self.cleaned_data["profile"])
        except PlacementError as exc:  # FleetConflict included: the fleet changed since clean()
            self.add_violations(exc.violations)
            return None
        # The form's instance becomes the placed row (callers such as the admin hold on to it).
        for field in Vgpu._meta.concrete_fields:
            setattr(instance, field.attname, getattr(vgpu, field.attname))
        instance.vm = vgpu.vm  # carries the host the VM moved to
        instance._state.adding = False
        instance._state.db = vgpu._state.db
        return instance


class GpuForm(RuleErrorsMixin, forms.ModelForm):
    """Add or change a GPU; mode, size mode, host and model change only as the rules allow."""

    governed = ("host", "gpu_model", "mode", "size_mode")

    class Meta:
        model = Gpu
        fields = ["host", "gpu_model", "pci_bus_id", "uuid", "mode", "size_mode"]

    def clean(self):
        cleaned = super().clean()
        if self._has_errors_in(self.governed):
            return cleaned
        current = None
        if self.instance.pk is not None:
            current = Gpu.objects.select_related("gpu_model", "host").get(pk=self.instance.pk)

        def value(name):
            return cleaned[name] if name in cleaned else getattr(current or self.instance, name)

        host, model, mode, size_mode = (value(name) for name in self.governed)
        if current is not None:
            state = services.gpu_state(current)
        else:  # a new GPU holds no vGPU: only what its model supports is checked
            state = placement.GpuState(
                id=0, label=cleaned.get("pci_bus_id") or "(new)", host_id=host.pk,
                model=model.to_spec(), mode=mode, size_mode=size_mode,
            )
        self.add_violations(placement.check_gpu_change(state, mode, size_mode, model=model.to_spec(), host_id=host.pk))
        return cleaned

    def save(self, commit: bool = True) -> Gpu | None:
        """Save through `services.update_gpu`; returns None when refused at save time."""
        return self._save_through(services.update_gpu, commit)


class HostForm(RuleErrorsMixin, forms.ModelForm):
    """Add or change a host; its capacity may not shrink below what its VMs claim."""

    capacity = ("cpu_threads", "ram_gib", "vcpu_overcommit", "ram_overcommit")

    class Meta:
        model = Host
        fields = ["name", "hypervisor", "cpu_model", "cpu_threads", "ram_gib", "vcpu_overcommit", "ram_overcommit",
                  "multi_vgpu_same_gpu"]

    def clean(self):
        cleaned = super().clean()
        if self.instance.pk is None or self._has_errors_in(self.capacity):
            return cleaned
        current = Host.objects.get(pk=self.instance.pk)
        values = {name: cleaned.get(name, getattr(current, name)) for name in self.capacity}
        self.add_violations(placement.check_host_capacity(services.host_state(current), **values))
        return cleaned

    def save(self, commit: bool = True) -> Host | None:
        """Save through `services.update_host`; returns None when refused at save time."""
        return self._save_through(services.update_host, commit)


class VirtualMachineForm(RuleErrorsMixin, forms.ModelForm):
    """Add or change a VM; more vCPUs or RAM must still fit the host it runs on.

    The host is not edited here: a VM moves with its vGPUs (`services.place_vgpu`).
    """

    class Meta:
        model = VirtualMachine
        fields = ["name", "uuid", "artist", "vcpus", "ram_gib"]

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        if "artist" in self.fields:
            self.fields["artist"].queryset = self.fields["artist"].queryset.select_related("user")

    def clean(self):
        cleaned = super().clean()
        if self.instance.pk is None or self._has_errors_in(("vcpus", "ram_gib")):
            return cleaned
        current = VirtualMachine.objects.select_related("host").get(pk=self.instance.pk)
        self.add_violations(services.check_vm_resize(
            current, cleaned.get("vcpus", current.vcpus), cleaned.get("ram_gib", current.ram_gib),
        ))
        return cleaned

    def save(self, commit: bool = True) -> VirtualMachine | None:
        """Save through `services.update_vm`; returns None when refused at save time."""
        return self._save_through(services.update_vm, commit)


class GpuModelForm(forms.ModelForm):
    """Edit a catalog GPU model; the figures placement reads stay fixed while GPUs of it exist."""

    locked_in_use = ("fb_mib", "mixed_size_capable", "multi_vgpu_full_only")

    class Meta:
        model = GpuModel
        fields = ["name", "code", "fb_mib", "gpus_per_board", "mixed_size_capable", "multi_vgpu_full_only"]

    def clean(self):
        cleaned = super().clean()
        if self.instance.pk is None:
            return cleaned
        changed = [name for name in self.locked_in_use if name in self.changed_data]
        in_use = Gpu.objects.filter(gpu_model=self.instance).count()
        if changed and in_use:
            self.add_error(None, (
                f"{self.instance.name}: {', '.join(changed)} can change only while no GPU of this model "
                f"is in the inventory ({in_use} are); the placements on them were checked against it"
            ))
        return cleaned


class VgpuProfileForm(forms.ModelForm):
    """Edit a catalog profile; the figures placement reads stay fixed while vGPUs of it exist."""

    locked_in_use = ("gpu_model", "series", "fb_mib", "max_per_gpu", "max_per_gpu_mixed", "max_per_vm")

    class Meta:
        model = VgpuProfile
        fields = ["name", "gpu_model", "series", "fb_mib", "max_per_gpu", "max_per_gpu_mixed", "max_per_vm"]

    def clean(self):
        cleaned = super().clean()
        if self.instance.pk is None:
            return cleaned
        changed = [name for name in self.locked_in_use if name in self.changed_data]
        in_use = Vgpu.objects.filter(profile=self.instance).count()
        if changed and in_use:
            self.add_error(None, (
                f"{self.instance.name}: {', '.join(changed)} can change only while no vGPU of this profile "
                f"exists ({in_use} do); they were placed by these figures"
            ))
        return cleaned


class ApiTokenForm(forms.ModelForm):
    """Issue an API token (the admin's "Add API token"): whose, what for, its scope, and the day
    it stops working. A day, not a time: it expires at that day's 00:00 in the server's time zone
    (TIME_ZONE), as `manage.py api_token create --expires 2026-06-30` does."""

    expires_on = forms.DateField(
        required=False, widget=forms.DateInput(attrs={"type": "date"}),
        help_text="The token stops working at 00:00 of this day (server time zone). Empty: it never expires.",
    )

    class Meta:
        model = ApiToken
        fields = ["user", "name", "scope"]

    def clean_user(self):
        user = self.cleaned_data["user"]
        if not user.is_active:
            raise forms.ValidationError(f"{user.get_username()} is inactive: a token of theirs would be refused.")
        return user

    def clean_expires_on(self):
        day = self.cleaned_data["expires_on"]
        if day is None:
            self.instance.expires_at = None
            return day
        if day.year >= TIME_MAX.year:  # far enough from datetime's end for any time zone's shift
            raise forms.ValidationError(f"Choose a day before the year {TIME_MAX.year}.")
        expires_at = timezone.make_aware(datetime.combine(day, time.min))
        if expires_at <= timezone.now():
            raise forms.ValidationError(f"{day.isoformat()} (00:00) is in the past: a token must expire in the future.")
        self.instance.expires_at = expires_at
        return day

"""The scheduler pages (staff only): every vGPU-mode GPU with desired vs reported state and drift,
one GPU's form with the generated commands and "Apply through the agent", and the defaults of
hosts and GPU models. Thin: rules in `fleet.scheduler`, writes in `fleet.scheduler_policies`.
"""

from __future__ import annotations

from django import forms
from django.contrib import messages
from django.shortcuts import get_object_or_404, redirect, render
from django.views.decorators.http import require_POST

from dashboard.access import staff_required
from dashboard.forms import SchedulerListForm
from fleet import scheduler, scheduler_policies
from fleet.choices import GpuMode, SchedulerPolicyName, SchedulerScope
from fleet.models import Gpu, GpuModel, Host, SchedulerPolicy
from telemetry import scheduler_apply


class SchedulerPolicyForm(forms.Form):
    """Policy, ARR and the parameters; the rules' messages come from `fleet.scheduler.validate`."""

    policy = forms.ChoiceField(choices=SchedulerPolicyName.choices)
    arr = forms.BooleanField(label="Adaptive round-robin (ARR)", required=False)
    frequency_hz = forms.IntegerField(label="Scheduling frequency, Hz", required=False,
                                      help_text="63-960 Hz, with ARR; blank for the driver's default")
    avg_factor = forms.IntegerField(label="Averaging factor", required=False,
                                    help_text="1-60, with ARR; blank for the driver's default (33)")
    timeslice_ms = forms.IntegerField(label="Time slice, ms", required=False,
                                      help_text="1-30 ms, without ARR; blank for the driver's default")

    def __init__(self, *args, save=None, **kwargs):
        super().__init__(*args, **kwargs)
        self._save = save

    @classmethod
    def initial_of(cls, values: scheduler.SchedulerSettings) -> dict:
        return values.as_dict()

    def settings(self) -> scheduler.SchedulerSettings:
        data = self.cleaned_data
        return scheduler.SchedulerSettings(policy=data["policy"], arr=data["arr"], frequency_hz=data["frequency_hz"],
                                           avg_factor=data["avg_factor"], timeslice_ms=data["timeslice_ms"])

    def save(self) -> bool:
        """Write through `self._save(settings)`; a broken rule becomes a field error and False."""
        try:
            self._save(self.settings())
        except scheduler_policies.SchedulerValidationError as exc:
            for name, errors in exc.errors.items():
                for message in errors:
                    self.add_error(name if name in self.fields else None, message)
            return False
        return True


@staff_required
def scheduler_list(request):
    """Every vGPU-mode GPU: desired (and from where), reported, drift; `?drift=1` keeps drifting ones."""
    scheduler_policies.release_staged()
    rows = scheduler_policies.gpu_schedulers(scheduler_policies.vgpu_mode_gpus())
    controls = SchedulerListForm(request.GET)
    drift_only = controls.is_valid() and controls.cleaned_data["drift"] == "1"
    if drift_only:
        rows = [row for row in rows if row.has_drift]
    defaults = {row.host_id or ("m", row.gpu_model_id): row
                for row in SchedulerPolicy.objects.exclude(scope=SchedulerScope.GPU)}
    hosts = [(host, defaults.get(host.pk)) for host in Host.objects.order_by("name")]
    models_ = [(model, defaults.get(("m", model.pk)))
               for model in GpuModel.objects.filter(gpus__mode=GpuMode.VGPU).distinct().order_by("name")]
    return render(request, "fleet/scheduler_list.html", {
        "rows": rows, "drift_only": drift_only, "drift_count": sum(1 for row in rows if row.has_drift),
        "hosts": hosts, "gpu_models": models_, "controls": controls,
    }, status=200 if controls.is_valid() else 400)


@staff_required
def scheduler_gpu(request, pk: int):
    """One GPU's scheduler: the form, desired vs reported, the commands, applying through the agent."""
    gpu = get_object_or_404(Gpu.objects.select_related("host", "gpu_model"), pk=pk)
    if request.method == "POST":
        form = SchedulerPolicyForm(request.POST,
                                   save=lambda values: scheduler_policies.set_gpu_policy(gpu, values, request.user))
        if form.is_valid() and form.save():
            messages.success(request, f"Scheduler policy of GPU {gpu.pci_bus_id} saved.")
            return redirect("fleet:scheduler-gpu", pk=gpu.pk)
    else:
        scheduler_policies.release_staged()
        form = None
    view = scheduler_policies.gpu_scheduler(gpu)
    if form is None:
        form = SchedulerPolicyForm(initial=SchedulerPolicyForm.initial_of(view.desired))
    agent = scheduler_apply.agent_for(gpu)
    return render(request, "fleet/scheduler_gpu.html", {
        "gpu": gpu, "view": view, "form": form, "commands": view.commands, "agent": agent,
        "agent_can_apply": scheduler_apply.agent_can_apply(gpu, agent),
        "passthrough": gpu.mode != GpuMode.VGPU,
    }, status=400 if form.is_bound else 200)


@staff_required
@require_POST
def scheduler_gpu_apply(request, pk: int):
    gpu = get_object_or_404(Gpu.objects.select_related("host", "gpu_model"), pk=pk)
    try:
        row = scheduler_apply.apply_through_agent(gpu, request.user)
    except scheduler_apply.AgentUnavailable as exc:
        messages.error(request, str(exc))
    else:
        level = messages.success if row.apply_state == "applied" else messages.warning
        level(request, f"{row.get_apply_state_display()}: {row.apply_detail}")
    return redirect("fleet:scheduler-gpu", pk=gpu.pk)


@staff_required
@require_POST
def scheduler_gpu_clear(request, pk: int):
    gpu = get_object_or_404(Gpu, pk=pk)
    row = SchedulerPolicy.objects.filter(gpu=gpu).first()
    if row is not None:
        scheduler_policies.clear_policy(row)
        messages.success(request, "The GPU's own policy was removed; its default applies again.")
    return redirect("fleet:scheduler-gpu", pk=gpu.pk)


def _default_page(request, target, scope: str):
    row = SchedulerPolicy.objects.filter(**{scope: target}).first()
    if request.method == "POST":
        if request.POST.get("clear") and row is not None:
            scheduler_policies.clear_policy(row)
            messages.success(request, f"Default of {target} removed.")
            return redirect("fleet:scheduler")
        form = SchedulerPolicyForm(request.POST,
                                   save=lambda values: scheduler_policies.set_default(target, values, request.user))
        if form.is_valid() and form.save():
            messages.success(request, f"Scheduler default of {target} saved.")
            return redirect("fleet:scheduler")
    else:
        form = SchedulerPolicyForm(initial=SchedulerPolicyForm.initial_of(scheduler_policies.settings_of(row)))
    return render(request, "fleet/scheduler_default.html", {
        "target": target, "scope": scope, "row": row, "form": form,
        "scope_label": "host" if scope == SchedulerScope.HOST else "GPU model",
    }, status=400 if form.is_bound else 200)


@staff_required
def scheduler_host_default(request, pk: int):
    return _default_page(request, get_object_or_404(Host, pk=pk), SchedulerScope.HOST)


@staff_required
def scheduler_model_default(request, pk: int):
    return _default_page(request, get_object_or_404(GpuModel, pk=pk), SchedulerScope.GPU_MODEL)


@staff_required
def scheduler_gpu_box(request, pk: int):
    """The small "Scheduler" box of the GPU detail page, loaded there by htmx (so that page's view
    needs no scheduler code): desired vs reported, drift, and a link to the scheduler page."""
    gpu = get_object_or_404(Gpu.objects.select_related("host", "gpu_model"), pk=pk)
    view = scheduler_policies.gpu_scheduler(gpu) if gpu.mode == GpuMode.VGPU else None
    return render(request, "fleet/scheduler_box.html", {"gpu": gpu, "view": view})

"""An artist's own page (`/me/`): their VMs, what they used of their profiles, nothing of anyone else.

Only the signed-in user's Artist row and its VMs are read; a VM's host is named (not linked,
unless the user is an admin) and nothing about other VMs on the same GPU or host is loaded, so
nothing of theirs can leak into the page. The default range is the last 30 days (the closest
preset to "the last few weeks"), long enough to see a working rhythm.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from django.contrib.auth.decorators import login_required

from config.roles import is_fleet_admin
from dashboard.details import NO_USAGE, Usage, agents_by_host, gib, vm_usage, vms_with_vgpus
from dashboard.forms import FeedbackForm
from dashboard.views.details import (
    Chart,
    Notice,
    agent_notices,
    no_data_hint,
    page_range,
    render_page,
    usage_sentences,
    vm_charts,
)
from fleet import placement
from fleet import requests as resize_requests
from fleet.models import Artist, ResizeRequest, VgpuProfile, VirtualMachine
from fleet.queries import fleet_snapshot
from sizing import feedback

DEFAULT_RANGE = "30d"


@dataclass
class Workstation:
    """One of the artist's VMs as /me/ shows it."""

    vm: VirtualMachine
    profile_fb_mib: int
    usage: Usage
    summary: list[str]
    charts: list[Chart]
    notices: list[Notice]
    profile_choices: list = field(default_factory=list)  # (profile, Fit): profiles a request may ask for
    more_fit: resize_requests.Fit | None = None  # where one more vGPU would go now
    requests: list = field(default_factory=list)  # this VM's resize requests, newest first
    evidence: resize_requests.Evidence = field(default_factory=resize_requests.Evidence)

    @property
    def profile_fb_gib(self) -> float | None:
        return gib(self.profile_fb_mib)

    @property
    def profiles(self) -> str:
        return ", ".join(vgpu.profile.name for vgpu in self.vm.vgpus.all())

    @property
    def vgpu_count(self) -> int:
        return len(self.vm.vgpus.all())

    @property
    def current_profile(self):
        vgpus = self.vm.vgpus.all()
        return vgpus[0].profile if vgpus else None

    @property
    def can_add_vgpu(self) -> bool:
        """Whether "one more vGPU" is a request the rules could accept (the profile allows it)."""
        vgpus = self.vm.vgpus.all()
        if not vgpus:
            return False
        more = len(vgpus) + 1
        profile, model = vgpus[0].profile, vgpus[0].gpu.gpu_model
        return (more <= min(profile.max_per_vm, placement.MAX_VGPUS_PER_VM)
                and not resize_requests.several_vgpus_refusal(profile, model, more))

    @property
    def can_remove_vgpu(self) -> bool:
        return self.vgpu_count > 1


@login_required
def workstation(request):
    """The signed-in artist's VMs with their profiles, charts of frame buffer against the profile
    and utilization, and a plain-language summary over the range."""
    staff = is_fleet_admin(request.user)
    artist = Artist.objects.filter(user=request.user).first()
    time_range, error = page_range(request, default=DEFAULT_RANGE)
    workstations = []
    if artist is not None:
        # The right-sizing suggestion rides along in the VMs' query: the evidence next to the request form.
        vms = list(vms_with_vgpus(VirtualMachine.objects.filter(artist=artist).select_related(
            "suggestion__suggested_profile")))
        usage = vm_usage([vm.pk for vm in vms], time_range.start, time_range.end) if vms else {}
        agents = agents_by_host({vm.host_id for vm in vms}) if vms else {}
        # Two queries for every VM's request form and list (the page's query count must not grow with VMs).
        profiles = list(VgpuProfile.objects.order_by("fb_mib", "name"))
        requests_by_vm: dict[int, list[ResizeRequest]] = {}
        for resize in ResizeRequest.objects.filter(vm__in=vms).select_related("requested_profile"):
            requests_by_vm.setdefault(resize.vm_id, []).append(resize)

        def models_of(vm: VirtualMachine) -> set[int]:
            return {vgpu.profile.gpu_model_id for vgpu in vm.vgpus.all()}

        # Where each choice of the form fits now: the queue's and approval's own answer, over the
        # GPUs of the artist's models only.
        snapshot = fleet_snapshot(set().union(*map(models_of, vms))) if vms else None

        for vm in vms:
            profile_fb_mib = sum(vgpu.profile.fb_mib for vgpu in vm.vgpus.all())
            count = len(vm.vgpus.all())
            choices = [(p, count or 1) for p in profiles if p.gpu_model_id in models_of(vm)]
            more = [(vm.vgpus.all()[0].profile, count + 1)] if count else []
            fits_now = resize_requests.choice_fits(vm, choices + more, snapshot)
            vm_agents = agents.get(vm.host_id, [])
            hint = no_data_hint(vm.host, vm_agents, staff)
            used = usage.get(vm.pk, NO_USAGE)
            workstations.append(Workstation(
                vm=vm, profile_fb_mib=profile_fb_mib, usage=used,
                summary=usage_sentences(used, profile_fb_mib, time_range),
                charts=vm_charts(vm, profile_fb_mib, time_range, hint),
                notices=agent_notices(vm_agents, staff),
                profile_choices=[(p, f) for (p, _), f in zip(choices, fits_now, strict=False)],
                more_fit=fits_now[-1] if more else None,
                requests=requests_by_vm.get(vm.pk, [])[:10],
                evidence=resize_requests.evidence_of(vm),
            ))
    context = {"artist": artist, "workstations": workstations, "staff": staff}
    if artist is not None:
        # The day's feedback prompt (until rated or "Not now") and the artist's own last ratings.
        context.update(feedback_due=feedback.prompt_due(request.user), feedback_form=FeedbackForm(),
                       my_feedback=feedback.recent_own(request.user))
    return render_page(request, "fleet/workstation.html", context, time_range, error)

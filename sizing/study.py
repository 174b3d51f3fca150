"""The proof-of-concept study: for a group of VMs (those of some hosts, narrowed by name and
workflow: the pilot's artists) over some days, what each workflow used
(GPU, frame buffer, encoder, vCPUs, RAM) next to how its artists rated their days, and the
density those measurements support, reasoned as NVIDIA's sizing guide does its PoC.

Usage figures come from the hourly rollups. A p95 is the highest hourly p95 of the range (an
upper bound, as the VM page shows it); a workflow's figure is its busiest VM's, since a server
is sized for the artists who need the most. The density is the planner's "from measurements"
answer (`sizing.planning.run_plan`) for these hosts' VMs with their right-sized vCPUs and RAM,
on a server like the one the admin names (by default the first chosen host that has GPUs): its
board, GPU count, threads, RAM and overcommit.

A workflow's row holds the VMs whose artist works in it today and the ratings given on those
VMs in the range, so its figures and its feedback are of the same VMs.

Reads only, in a fixed number of queries whatever the number of hosts, VMs or days.
"""

from __future__ import annotations

import re
from collections import defaultdict
from dataclasses import dataclass, field
from datetime import date, datetime, time, timedelta

from django.db.models import Count, F, FloatField, Max, Q, Value
from django.db.models.functions import NullIf
from django.utils import timezone

from fleet.choices import Workflow
from fleet.models import Gpu, Host, VirtualMachine
from sizing import feedback_rules, planning
from sizing.models import Feedback
from telemetry.models import GuestRollup, VmRollup

HOURLY = 3600
#: The longest study: the hourly rollups are kept at least this long.
MAX_DAYS = 92
#: Tags shown per row: the most picked first.
TOP_TAGS = 3
NO_WORKFLOW = "No workflow"
#: Names and patterns one study's group may list.
MAX_NAMES = 200


@dataclass
class Figures:
    """What one VM, or the VMs of one workflow, used and how it felt. None where nothing was
    measured; percentages are 0..100."""

    label: str
    vms: int = 0
    hours: int = 0
    gpu_p95: float | None = None
    fb_p95_pct: float | None = None
    enc_max: float | None = None
    vcpu_p95: float | None = None
    busiest_vcpu_p95: float | None = None
    ram_p95_pct: float | None = None
    feedback_count: int = 0
    feedback_mean: float | None = None
    top_tags: list[str] = field(default_factory=list)

    def merge(self, other: Figures) -> None:
        """Take `other` (one VM) into this workflow's figures: counts add up, peaks keep the highest."""
        self.vms += 1
        self.hours += other.hours
        for name in ("gpu_p95", "fb_p95_pct", "enc_max", "vcpu_p95", "busiest_vcpu_p95", "ram_p95_pct"):
            values = [v for v in (getattr(self, name), getattr(other, name)) if v is not None]
            setattr(self, name, max(values) if values else None)


@dataclass(frozen=True)
class VmFigures:
    vm_id: int
    name: str
    host: str
    artist: str
    workflow: str
    figures: Figures


@dataclass(frozen=True)
class Density:
    """The planner's answer for the study's VMs on a server like `host`'s."""

    host: str
    gpu_model: str
    gpus: int
    cpu_threads: int
    ram_gib: int
    vms: int
    servers: int
    artists_per_server: float | None
    lower_bound_servers: int
    unplaced: int

    @property
    def sentence(self) -> str:
        if not self.servers:
            return f"No VM of these hosts could be planned on a server like {self.host}."
        per = self.artists_per_server
        per_text = f"{per:g}" if per is not None else "0"
        placed = self.vms - self.unplaced
        these = f"these {self.vms} VMs" if not self.unplaced else f"{placed} of these {self.vms} VMs"
        return (f"The measurements support {per_text} artists per server: {self.servers} server"
                f"{'s' if self.servers != 1 else ''} for {these}.")


@dataclass(frozen=True)
class Group:
    """Which of the chosen hosts' VMs a study covers: those named in `names` (a name, or a pattern
    where `*` stands for any text; case does not count) and whose artist works in one of
    `workflows`. Empty: every VM of the hosts."""

    names: tuple[str, ...] = ()
    workflows: tuple[str, ...] = ()

    @property
    def narrowed(self) -> bool:
        return bool(self.names or self.workflows)

    def q(self) -> Q:
        found = Q()
        if self.names:
            found &= names_q(self.names)
        if self.workflows:
            found &= Q(artist__workflow__in=self.workflows)
        return found

    @property
    def workflow_labels(self) -> list[str]:
        return [_workflow_label(w) for w in self.workflows]


def _regex(pattern: str) -> str:
    """A name pattern (`*` for any text, everything else literal) as a regular expression."""
    return "^" + ".*".join(re.escape(part) for part in pattern.split("*")) + "$"


def names_q(names) -> Q:
    """VMs whose name is one of `names` (patterns with `*` included), case aside."""
    found = Q(pk__in=[])
    for name in names:
        found |= Q(name__iregex=_regex(name)) if "*" in name else Q(name__iexact=name)
    return found


def unmatched(names, known) -> list[str]:
    """Those of `names` (patterns included) that match none of the VM names `known`, case aside."""
    compiled = [(name, re.compile(_regex(name), re.IGNORECASE)) for name in names]
    return [name for name, regex in compiled if not any(regex.match(k) for k in known)]


@dataclass(frozen=True)
class Study:
    start: date
    end: date
    hosts: list[Host]
    workflows: list[Figures]
    vms: list[VmFigures]
    density: Density | None
    density_error: str = ""
    every_host: bool = False  # no host was chosen: the whole fleet
    group: Group = field(default_factory=Group)


def window(start: date, end: date) -> tuple[datetime, datetime]:
    """The days `start` to `end`, both whole, as an aware [since, until) range."""
    zone = timezone.get_current_timezone()
    return (datetime.combine(start, time.min, tzinfo=zone),
            datetime.combine(end + timedelta(days=1), time.min, tzinfo=zone))


def default_days(today: date | None = None) -> tuple[date, date]:
    """The last 14 days, today included."""
    today = today or timezone.localdate()
    return today - timedelta(days=13), today


def _pct(column: str, of: str):
    return Max(F(column) * Value(100.0) / NullIf(F(of), Value(0.0)), output_field=FloatField())


def _workflow_label(workflow: str | None) -> str:
    return Workflow(workflow).label if workflow in Workflow.values else NO_WORKFLOW


def _feedback(rows) -> tuple[int, float | None, list[str]]:
    summary = feedback_rules.feedback_summary(rows)
    tags = [label for label, _ in feedback_rules.top_tags(summary, TOP_TAGS)]
    return summary["count"], summary["mean"], tags


def study(host_ids, start: date, end: date, server_id: int | None = None, group: Group | None = None) -> Study:
    """The study of the VMs of `group` on `host_ids` (every host when empty) over the days
    `start` to `end`: per workflow and per VM figures, and the density they support on a server
    like host `server_id` (by default the first chosen host with GPUs)."""
    group = group or Group()
    since, until = window(start, end)
    hosts = list(Host.objects.order_by("name", "id") if not host_ids
                 else Host.objects.filter(pk__in=host_ids).order_by("name", "id"))
    chosen = [host.pk for host in hosts]
    vms = list(VirtualMachine.objects.filter(Q(host_id__in=chosen) & group.q()).select_related("host", "artist")
               .order_by("name", "id"))
    vm_ids = [vm.pk for vm in vms]
    gpu = {row["vm_id"]: row for row in VmRollup.objects.filter(
        vm_id__in=vm_ids, step_s=HOURLY, bucket__gte=since, bucket__lt=until,
    ).order_by().values("vm_id").annotate(
        hours=Count("pk"), gpu_p95=Max("util_gpu_p95"), fb_p95_pct=_pct("fb_used_mib_p95", "profile_fb_mib"),
        enc_max=Max("enc_util_max"),
    )}
    guest = {row["vm_id"]: row for row in GuestRollup.objects.filter(
        vm_id__in=vm_ids, step_s=HOURLY, bucket__gte=since, bucket__lt=until,
    ).order_by().values("vm_id").annotate(
        vcpu_p95=Max("vcpu_util_p95"), busiest_vcpu_p95=Max("vcpu_max_util_p95"),
        ram_p95_pct=_pct("ram_used_mib_p95", "ram_mib"),
    )}
    ratings_by_vm: dict[int, list] = defaultdict(list)
    for vm_id, day, rating, tags in (
        Feedback.objects.filter(vm_id__in=vm_ids, session_date__gte=start, session_date__lte=end)
        .order_by().values_list("vm_id", "session_date", "rating", "tags")
    ):
        ratings_by_vm[vm_id].append((day, rating, tags))

    per_vm, per_workflow = [], {}
    ratings_by_workflow: dict[str, list] = defaultdict(list)
    for vm in vms:
        g, c = gpu.get(vm.pk, {}), guest.get(vm.pk, {})
        count, mean, tags = _feedback(ratings_by_vm[vm.pk])
        label = _workflow_label(vm.artist.workflow if vm.artist else None)
        figures = Figures(
            label=vm.name, vms=1, hours=g.get("hours", 0), gpu_p95=g.get("gpu_p95"), fb_p95_pct=g.get("fb_p95_pct"),
            enc_max=g.get("enc_max"), vcpu_p95=c.get("vcpu_p95"), busiest_vcpu_p95=c.get("busiest_vcpu_p95"),
            ram_p95_pct=c.get("ram_p95_pct"), feedback_count=count, feedback_mean=mean, top_tags=tags,
        )
        per_vm.append(VmFigures(vm.pk, vm.name, vm.host.name if vm.host else "", vm.artist.name if vm.artist else "",
                                label, figures))
        per_workflow.setdefault(label, Figures(label=label)).merge(figures)
        ratings_by_workflow[label] += ratings_by_vm[vm.pk]
    for label, figures in per_workflow.items():
        figures.feedback_count, figures.feedback_mean, figures.top_tags = _feedback(ratings_by_workflow[label])
    order = {label: index for index, label in enumerate(Workflow.labels)}
    workflows = sorted(per_workflow.values(), key=lambda f: order.get(f.label, len(order)))
    if group.narrowed and not vm_ids:
        density, error = None, "No VM of these hosts is in the group chosen: there is nothing to plan."
    else:
        density, error = _density(chosen, server_id, tuple(vm_ids) if group.narrowed else ())
    return Study(start=start, end=end, hosts=hosts, workflows=workflows, vms=per_vm, density=density,
                 density_error=error, every_host=not host_ids, group=group)


def _density(host_ids: list[int], server_id: int | None, vm_ids: tuple[int, ...]) -> tuple[Density | None, str]:
    """The planner "from measurements" on these hosts' VMs (only `vm_ids` when given), with their
    right-sized vCPUs and RAM, on a server like host `server_id`, or the first chosen host that
    has GPUs (its board, GPU count, threads, RAM and overcommit)."""
    if server_id is None:
        server_id = (Gpu.objects.filter(host_id__in=host_ids).order_by("host__name", "host_id")
                     .values_list("host_id", flat=True).first())
        if server_id is None:
            return None, "None of these hosts has a GPU: there is no server to plan on."
    gpus = list(Gpu.objects.filter(host_id=server_id).select_related("gpu_model", "host").order_by("id"))
    if not gpus:
        return None, "The server to plan on has no GPU."
    host = gpus[0].host
    request = planning.PlanRequest(
        gpu_model=gpus[0].gpu_model, gpus=len(gpus), cpu_threads=host.cpu_threads, ram_gib=host.ram_gib,
        vcpu_overcommit=host.vcpu_overcommit, ram_overcommit=host.ram_overcommit, size_mode=gpus[0].size_mode,
        from_measurements=True, host_ids=tuple(host_ids), vm_ids=vm_ids, measured_cpu_ram=True,
    )
    try:
        result = planning.run_plan(request)
    except planning.TooManyVms as exc:
        return None, str(exc)
    plan = result.plan
    return Density(
        host=host.name, gpu_model=gpus[0].gpu_model.name, gpus=len(gpus), cpu_threads=host.cpu_threads,
        ram_gib=host.ram_gib, vms=len(result.measured or ()), servers=plan.servers,
        artists_per_server=plan.artists_per_server, lower_bound_servers=plan.lower_bound_servers,
        unplaced=sum(u.count for u in plan.unplaced),
    ), ""

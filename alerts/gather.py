"""Read the stored samples and health state into the facts the rules judge (`alerts.rules`).

One query per kind of fact, aggregated in the database (windows of samples are reduced to a
handful of numbers per GPU or vGPU there), so one evaluation over 1,000 hosts stays within its
budget (bench/alert_evaluation.py). Only what an enabled rule needs is read.
"""

from __future__ import annotations

from collections import defaultdict
from datetime import UTC, datetime, timedelta

from django.db.models import Count, F, Max, Min, Q
from django.db.models.lookups import GreaterThan

from alerts.models import EDITION_OF_SERIES, LicencePool
from alerts.rules import (
    AgentFacts,
    Facts,
    GpuRef,
    GpuState,
    GpuWindow,
    HostVersions,
    Pool,
    SchedulerFacts,
    VgpuLicence,
    VgpuWindow,
    XidFacts,
)
from fleet.models import Gpu, Vgpu
from fleet.scheduler_policies import gpu_schedulers, vgpu_mode_gpus
from telemetry.models import Agent, GpuHealthState, GpuSample, HostDriverState, VgpuHealthState, VgpuSample, XidError
from telemetry.payload import POWER_THROTTLES, THERMAL_THROTTLES, THROTTLE_FLAGS

THERMAL_MASK = sum(bit for bit, name in THROTTLE_FLAGS.items() if name in THERMAL_THROTTLES)
POWER_MASK = sum(bit for bit, name in THROTTLE_FLAGS.items() if name in POWER_THROTTLES)

# Which rules read which facts.
_GPU_WINDOW_RULES = ("gpu_temperature", "throttling")
_STATE_RULES = ("ecc_uncorrectable", "row_remap")
_LICENCE_RULES = ("vgpu_unlicensed", "licence_expiring", "licence_pool")


def short_pci(pci_bus_id: str) -> str:
    """"00000000:3B:00.0" -> "3B:00.0": enough to tell a host's GPUs apart."""
    return pci_bus_id.split(":", 1)[-1] if pci_bus_id.count(":") == 2 else pci_bus_id


class _Fleet:
    """The GPUs with their labels and VMs, read once per evaluation."""

    def __init__(self):
        vms_of_gpu: dict[int, set[int]] = defaultdict(set)
        self.vms_of_host: dict[int, set[int]] = defaultdict(set)
        self.vgpus: dict[tuple[int, int], list[tuple[str, float, str]]] = defaultdict(list)
        for vm_id, gpu_id, host_id, profile, fb_mib, series in Vgpu.objects.values_list(
                "vm_id", "gpu_id", "gpu__host_id", "profile__name", "profile__fb_mib", "profile__series"):
            vms_of_gpu[gpu_id].add(vm_id)
            self.vms_of_host[host_id].add(vm_id)
            self.vgpus[(vm_id, gpu_id)].append((profile, fb_mib, series))
        self.gpus: dict[int, GpuRef] = {}
        self.models_of_host: dict[int, set[str]] = defaultdict(set)
        for pk, host_id, host, pci, model in Gpu.objects.values_list(
                "pk", "host_id", "host__name", "pci_bus_id", "gpu_model__name"):
            self.gpus[pk] = GpuRef(gpu_id=pk, host_id=host_id, label=f"{host} {short_pci(pci)} ({model})",
                                   vm_ids=tuple(sorted(vms_of_gpu.get(pk, ()))))
            self.models_of_host[host_id].add(model)


def gather(now: datetime, rules: dict[str, tuple[str, dict]]) -> Facts:
    """The facts the enabled `rules` ({slug: (severity, params)}) need, as of `now`."""
    fleet = _Fleet()
    facts = Facts(now=now)
    if "agent_unreachable" in rules:
        facts.agents.extend(_agents(fleet, rules["agent_unreachable"][1]["polls"]))
    for minutes in sorted({rules[slug][1]["minutes"] for slug in _GPU_WINDOW_RULES if slug in rules}):
        facts.gpu_windows[minutes] = _gpu_windows(fleet, now, minutes)
    if "vgpu_fb_full" in rules:
        minutes = rules["vgpu_fb_full"][1]["minutes"]
        facts.vgpu_windows[minutes] = _vgpu_windows(fleet, now, minutes)
    if any(slug in rules for slug in _STATE_RULES):
        facts.gpu_states.extend(_gpu_states(fleet))
    if "xid" in rules:
        facts.xids.extend(_xids(fleet, now, rules["xid"][1]["clear_after_minutes"]))
    if any(slug in rules for slug in _LICENCE_RULES):
        facts.licences.extend(vgpu_licences(fleet))
        facts.pools.extend(pools(facts.licences))
    if "driver_mismatch" in rules:
        facts.hosts.extend(_host_versions(fleet))
    if "scheduler_drift" in rules:
        facts.schedulers.extend(_schedulers(fleet))
    return facts


def _agents(fleet: _Fleet, polls: int) -> list[AgentFacts]:
    rows = Agent.objects.filter(enabled=True, consecutive_failures__gte=polls).values_list(
        "pk", "name", "host_id", "host__name", "consecutive_failures", "last_seen", "last_error")
    return [AgentFacts(agent_id=pk, name=name, host_id=host_id, host_name=host_name, failures=failures,
                       last_seen=last_seen, last_error=(error or "")[:300],
                       vm_ids=tuple(sorted(fleet.vms_of_host.get(host_id, ()))))
            for pk, name, host_id, host_name, failures, last_seen, error in rows]


def _gpu_windows(fleet: _Fleet, now: datetime, minutes: int) -> list[GpuWindow]:
    start = now - timedelta(minutes=minutes)
    slowdown = dict(GpuHealthState.objects.filter(temp_slowdown_c__isnull=False).values_list(
        "gpu_id", "temp_slowdown_c"))
    rows = GpuSample.objects.filter(ts__gt=start, ts__lte=now).values("gpu_id").annotate(
        n=Count("id"), first=Min("ts"), tmin=Min("temp_c"), tmax=Max("temp_c"),
        thermal=Count("id", filter=GreaterThan(F("clocks_event_reasons").bitand(THERMAL_MASK), 0)),
        power=Count("id", filter=GreaterThan(F("clocks_event_reasons").bitand(POWER_MASK), 0)),
    ).values_list("gpu_id", "n", "first", "tmin", "tmax", "thermal", "power")
    return [GpuWindow(gpu=fleet.gpus[gpu_id], samples=n, first_ts=first, temp_min=tmin, temp_max=tmax,
                      slowdown_c=slowdown.get(gpu_id), thermal_samples=thermal, power_samples=power)
            for gpu_id, n, first, tmin, tmax, thermal, power in rows if gpu_id in fleet.gpus]


def _vgpu_windows(fleet: _Fleet, now: datetime, minutes: int) -> list[VgpuWindow]:
    start = now - timedelta(minutes=minutes)
    rows = VgpuSample.objects.filter(ts__gt=start, ts__lte=now).values("vm_id", "gpu_id").annotate(
        n=Count("id"), first=Min("ts"), fbmin=Min("fb_used_mib"), fbmax=Max("fb_used_mib"),
    ).values_list("vm_id", "gpu_id", "vm__name", "n", "first", "fbmin", "fbmax")
    out = []
    for vm_id, gpu_id, vm_name, n, first, fbmin, fbmax in rows:
        vgpus = fleet.vgpus.get((vm_id, gpu_id))
        if not vgpus or gpu_id not in fleet.gpus:
            continue  # not declared on this GPU: drift reports it, sizing has no profile to judge by
        out.append(VgpuWindow(vm_id=vm_id, vm_name=vm_name, gpu=fleet.gpus[gpu_id],
                              profile=" + ".join(profile for profile, _, _ in vgpus),
                              profile_fb_mib=float(sum(fb for _, fb, _ in vgpus)), samples=n, first_ts=first,
                              fb_min=fbmin, fb_max=fbmax))
    return out


def _gpu_states(fleet: _Fleet) -> list[GpuState]:
    rows = GpuHealthState.objects.filter(
        Q(ecc_uncorrected_volatile__gt=0) | Q(remapped_rows_failure=True) | Q(remapped_rows_pending=True)
        | Q(retired_pages_pending=True))
    return [GpuState(gpu=fleet.gpus[row.gpu_id], ecc_uncorrected_volatile=row.ecc_uncorrected_volatile,
                     ecc_uncorrected_aggregate=row.ecc_uncorrected_aggregate,
                     remapped_rows_failure=row.remapped_rows_failure,
                     remapped_rows_pending=row.remapped_rows_pending, retired_pages_pending=row.retired_pages_pending,
                     remapped_rows_uncorrectable=row.remapped_rows_uncorrectable)
            for row in rows if row.gpu_id in fleet.gpus]


def _xids(fleet: _Fleet, now: datetime, clear_after_minutes: int) -> list[XidFacts]:
    since = now - timedelta(minutes=clear_after_minutes)
    rows = XidError.objects.filter(at__gt=since, at__lte=now).values("gpu_id", "code").annotate(
        n=Count("id"), first=Min("at"), last=Max("at")).values_list("gpu_id", "code", "n", "first", "last")
    return [XidFacts(gpu=fleet.gpus[gpu_id], code=code, count=n, first_at=first, last_at=last)
            for gpu_id, code, n, first, last in rows if gpu_id in fleet.gpus]


def edition_of(series: str | None, type_name: str | None) -> str | None:
    """The licence edition a vGPU needs: from its profile's series, else its type name's last letter."""
    if series is None and type_name:
        series = type_name.strip()[-1:].upper()
    edition = EDITION_OF_SERIES.get(series or "")
    return str(edition) if edition else None


def vgpu_licences(fleet: _Fleet | None = None) -> list[VgpuLicence]:
    """Every running vGPU's licence state (telemetry's VgpuHealthState rows)."""
    fleet = fleet or _Fleet()
    rows = VgpuHealthState.objects.values_list(
        "vm_id", "vm__name", "gpu_id", "type_name", "vgpu__profile__series", "license_state", "license_expiry")
    return [VgpuLicence(vm_id=vm_id, vm_name=vm_name, gpu=fleet.gpus[gpu_id], type_name=type_name,
                        edition=edition_of(series, type_name), license_state=state, license_expiry=expiry)
            for vm_id, vm_name, gpu_id, type_name, series, state, expiry in rows if gpu_id in fleet.gpus]


def pools(licences: list[VgpuLicence]) -> list[Pool]:
    """Each owned edition's pool with the vGPUs that hold or need one of its licences now."""
    in_use: dict[str, int] = defaultdict(int)
    for lic in licences:
        if lic.edition and lic.license_state == "licensed":
            in_use[lic.edition] += 1
    return [Pool(edition=pool.edition, label=pool.get_edition_display(), owned=pool.owned,
                 in_use=in_use.get(pool.edition, 0))
            for pool in LicencePool.objects.all()]


def _host_versions(fleet: _Fleet) -> list[HostVersions]:
    rows = HostDriverState.objects.values_list("host_id", "host__name", "driver_version", "vgpu_manager_version")
    return [HostVersions(host_id=host_id, host_name=name, gpu_models=tuple(sorted(fleet.models_of_host[host_id])),
                         driver_version=driver, vgpu_manager_version=manager,
                         vm_ids=tuple(sorted(fleet.vms_of_host.get(host_id, ()))))
            for host_id, name, driver, manager in rows]


def _describe(settings) -> str:
    return settings.policy.replace("_", " ")


def _schedulers(fleet: _Fleet) -> list[SchedulerFacts]:
    out = []
    for item in gpu_schedulers(vgpu_mode_gpus()):
        if not item.drift or item.gpu.pk not in fleet.gpus:
            continue
        since = max((t for t in (item.gpu.scheduler_reported_at, getattr(item.row, "updated_at", None)) if t),
                    default=None)
        reported = (item.reported or {}).get("policy") or "unknown"
        out.append(SchedulerFacts(gpu=fleet.gpus[item.gpu.pk], fields=tuple(item.drift),
                                  desired=_describe(item.desired), reported=reported.replace("_", " "), since=since))
    return out


def utc_now() -> datetime:
    return datetime.now(UTC)

"""Read the stored samples and health state into the facts the rules judge (`alerts.rules`).

An evaluation runs every 30 s over fleets of thousands of GPUs, so nothing here reads the whole
fleet row by row (bench/alert_evaluation.py holds it to its budget):
- a window rule first finds its candidates in the newest samples only (the last RECENT_S: a GPU
  or vGPU that does not meet the condition now cannot have met it for the whole window), then
  aggregates the window for those few in the database;
- state rules read only the rows that are not healthy (uncorrectable errors, failed or pending
  repairs, unlicensed or soon expiring vGPUs); licence pools are counted in the database;
- GPUs are named (`GpuRef`: label and the VMs on it) only for the GPUs a finding is about;
- the scheduler view is recomputed only when a reading or a policy changed since the last time.
"""

from __future__ import annotations

from collections import defaultdict
from datetime import UTC, datetime, timedelta

from django.conf import settings
from django.db.models import Count, F, Max, Min, Q, Value
from django.db.models.functions import Coalesce, Right, Upper
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
from fleet.models import Gpu, SchedulerPolicy, Vgpu
from fleet.scheduler_policies import gpu_schedulers, vgpu_mode_gpus
from telemetry.models import Agent, GpuHealthState, GpuSample, HostDriverState, VgpuHealthState, VgpuSample, XidError
from telemetry.payload import POWER_THROTTLES, THERMAL_THROTTLES, THROTTLE_FLAGS

THERMAL_MASK = sum(bit for bit, name in THROTTLE_FLAGS.items() if name in THERMAL_THROTTLES)
POWER_MASK = sum(bit for bit, name in THROTTLE_FLAGS.items() if name in POWER_THROTTLES)

_GPU_WINDOW_RULES = ("gpu_temperature", "throttling")
_STATE_RULES = ("ecc_uncorrectable", "row_remap")
_LICENCE_RULES = ("vgpu_unlicensed", "licence_expiring", "licence_pool")


def recent_s() -> float:
    """How far back "now" reaches when finding candidates: three polls, at least a minute."""
    return max(60.0, 3 * settings.TELEMETRY_POLL_INTERVAL_S)


def short_pci(pci_bus_id: str) -> str:
    """"00000000:3B:00.0" -> "3B:00.0": enough to tell a host's GPUs apart."""
    return pci_bus_id.split(":", 1)[-1] if pci_bus_id.count(":") == 2 else pci_bus_id


class _Names:
    """GPU references (label and VMs) and the VMs of hosts, read for the ids asked only, once."""

    def __init__(self):
        self.gpus: dict[int, GpuRef] = {}
        self._vms_of_host: dict[int, tuple[int, ...]] = {}

    def load_gpus(self, ids) -> None:
        ids = set(ids) - self.gpus.keys()
        if not ids:
            return
        vms: dict[int, set[int]] = defaultdict(set)
        for gpu_id, vm_id in Vgpu.objects.filter(gpu_id__in=ids).values_list("gpu_id", "vm_id"):
            vms[gpu_id].add(vm_id)
        for pk, host_id, host, pci, model in Gpu.objects.filter(pk__in=ids).values_list(
                "pk", "host_id", "host__name", "pci_bus_id", "gpu_model__name"):
            self.gpus[pk] = GpuRef(gpu_id=pk, host_id=host_id, label=f"{host} {short_pci(pci)} ({model})",
                                   vm_ids=tuple(sorted(vms.get(pk, ()))))

    def vms_of_hosts(self, host_ids) -> dict[int, tuple[int, ...]]:
        missing = set(host_ids) - self._vms_of_host.keys()
        if missing:
            found: dict[int, set[int]] = defaultdict(set)
            for host_id, vm_id in Vgpu.objects.filter(gpu__host_id__in=missing).values_list("gpu__host_id",
                                                                                            "vm_id"):
                found[host_id].add(vm_id)
            for host_id in missing:
                self._vms_of_host[host_id] = tuple(sorted(found.get(host_id, ())))
        return {host_id: self._vms_of_host[host_id] for host_id in host_ids}


def gather(now: datetime, rules: dict[str, tuple[str, dict]]) -> Facts:
    """The facts the enabled `rules` ({slug: (severity, params)}) need, as of `now`."""
    names = _Names()
    facts = Facts(now=now)
    if "agent_unreachable" in rules:
        facts.agents.extend(_agents(names, rules["agent_unreachable"][1]["polls"]))
    windows = {rules[slug][1]["minutes"]: rules[slug][1] for slug in _GPU_WINDOW_RULES if slug in rules}
    temperature = rules.get("gpu_temperature", (None, None))[1]
    for minutes in sorted(windows):
        facts.gpu_windows[minutes] = _gpu_windows(names, now, minutes, temperature)
    if "vgpu_fb_full" in rules:
        params = rules["vgpu_fb_full"][1]
        facts.vgpu_windows[params["minutes"]] = _vgpu_windows(names, now, params["minutes"],
                                                              params["percent"] / 100.0)
    if any(slug in rules for slug in _STATE_RULES):
        facts.gpu_states.extend(_gpu_states(names))
    if "xid" in rules:
        facts.xids.extend(_xids(names, now, rules["xid"][1]["clear_after_minutes"]))
    if any(slug in rules for slug in _LICENCE_RULES):
        days = rules.get("licence_expiring", (None, {"days": 0}))[1]["days"]
        facts.licences.extend(vgpu_licences(names, expiring_before=now + timedelta(days=days)))
        facts.licence_counts.update(licence_counts())
        facts.pools.extend(pools(facts.licence_counts))
    if "driver_mismatch" in rules:
        facts.hosts.extend(_host_versions(names))
    if "scheduler_drift" in rules:
        facts.schedulers.extend(_schedulers(names))
    return facts


def _agents(names: _Names, polls: int) -> list[AgentFacts]:
    rows = list(Agent.objects.filter(enabled=True, consecutive_failures__gte=polls).values_list(
        "pk", "name", "host_id", "host__name", "consecutive_failures", "last_seen", "last_error"))
    vms = names.vms_of_hosts({row[2] for row in rows if row[2] is not None})
    return [AgentFacts(agent_id=pk, name=name, host_id=host_id, host_name=host_name, failures=failures,
                       last_seen=last_seen, last_error=(error or "")[:300], vm_ids=vms.get(host_id, ()))
            for pk, name, host_id, host_name, failures, last_seen, error in rows]


def _throttled(mask: int):
    return GreaterThan(F("clocks_event_reasons").bitand(mask), 0)


def _gpu_windows(names: _Names, now: datetime, minutes: int, temperature: dict | None) -> list[GpuWindow]:
    """Windows of the GPUs that are hot or throttled now (the candidates), aggregated."""
    slowdown = dict(GpuHealthState.objects.filter(temp_slowdown_c__isnull=False).values_list(
        "gpu_id", "temp_slowdown_c"))
    hot = Q(clocks_event_reasons__isnull=False) & (_throttled(THERMAL_MASK | POWER_MASK))
    if temperature is not None:
        lowest = min([*slowdown.values(), temperature["fallback_slowdown_c"]]) - temperature["margin_c"]
        hot |= Q(temp_c__gte=lowest)
    candidates = set(GpuSample.objects.filter(ts__gt=now - timedelta(seconds=recent_s()), ts__lte=now)
                     .filter(hot).values_list("gpu_id", flat=True).distinct())
    if not candidates:
        return []
    rows = GpuSample.objects.filter(gpu_id__in=candidates, ts__gt=now - timedelta(minutes=minutes),
                                    ts__lte=now).values("gpu_id").annotate(
        n=Count("id"), first=Min("ts"), tmin=Min("temp_c"), tmax=Max("temp_c"),
        thermal=Count("id", filter=_throttled(THERMAL_MASK)), power=Count("id", filter=_throttled(POWER_MASK)),
    ).values_list("gpu_id", "n", "first", "tmin", "tmax", "thermal", "power")
    rows = list(rows)
    names.load_gpus(row[0] for row in rows)
    return [GpuWindow(gpu=names.gpus[gpu_id], samples=n, first_ts=first, temp_min=tmin, temp_max=tmax,
                      slowdown_c=slowdown.get(gpu_id), thermal_samples=thermal, power_samples=power)
            for gpu_id, n, first, tmin, tmax, thermal, power in rows if gpu_id in names.gpus]


def _vgpu_windows(names: _Names, now: datetime, minutes: int, share: float) -> list[VgpuWindow]:
    """Windows of the vGPUs whose frame buffer is above `share` of their profiles now, aggregated."""
    # Against the sample's own vGPU's profile: a VM with two vGPUs on one GPU may be a candidate
    # that the sum of its profiles then clears (a few more candidates, never one missed).
    candidates = set(VgpuSample.objects.filter(ts__gt=now - timedelta(seconds=recent_s()), ts__lte=now)
                     .filter(fb_used_mib__gte=F("vgpu__profile__fb_mib") * share)
                     .values_list("vm_id", "gpu_id").distinct())
    if not candidates:
        return []
    vm_ids = {vm_id for vm_id, _ in candidates}
    rows = [row for row in VgpuSample.objects.filter(vm_id__in=vm_ids, ts__gt=now - timedelta(minutes=minutes),
                                                     ts__lte=now).values("vm_id", "gpu_id").annotate(
        n=Count("id"), first=Min("ts"), fbmin=Min("fb_used_mib"), fbmax=Max("fb_used_mib"),
    ).values_list("vm_id", "gpu_id", "vm__name", "n", "first", "fbmin", "fbmax") if row[:2] in candidates]
    profiles: dict[tuple[int, int], list[tuple[str, int]]] = defaultdict(list)
    for vm_id, gpu_id, profile, fb_mib in Vgpu.objects.filter(vm_id__in=vm_ids).values_list(
            "vm_id", "gpu_id", "profile__name", "profile__fb_mib"):
        profiles[(vm_id, gpu_id)].append((profile, fb_mib))
    names.load_gpus(gpu_id for _, gpu_id, *_ in rows)
    out = []
    for vm_id, gpu_id, vm_name, n, first, fbmin, fbmax in rows:
        declared = profiles.get((vm_id, gpu_id))
        if not declared or gpu_id not in names.gpus:
            continue  # not declared on this GPU: drift reports it, and there is no profile to judge by
        out.append(VgpuWindow(vm_id=vm_id, vm_name=vm_name, gpu=names.gpus[gpu_id],
                              profile=" + ".join(profile for profile, _ in declared),
                              profile_fb_mib=float(sum(fb for _, fb in declared)), samples=n, first_ts=first,
                              fb_min=fbmin, fb_max=fbmax))
    return out


def _gpu_states(names: _Names) -> list[GpuState]:
    rows = list(GpuHealthState.objects.filter(
        Q(ecc_uncorrected_volatile__gt=0) | Q(remapped_rows_failure=True) | Q(remapped_rows_pending=True)
        | Q(retired_pages_pending=True)))
    names.load_gpus(row.gpu_id for row in rows)
    return [GpuState(gpu=names.gpus[row.gpu_id], ecc_uncorrected_volatile=row.ecc_uncorrected_volatile,
                     ecc_uncorrected_aggregate=row.ecc_uncorrected_aggregate,
                     remapped_rows_failure=row.remapped_rows_failure,
                     remapped_rows_pending=row.remapped_rows_pending, retired_pages_pending=row.retired_pages_pending,
                     remapped_rows_uncorrectable=row.remapped_rows_uncorrectable)
            for row in rows if row.gpu_id in names.gpus]


def _xids(names: _Names, now: datetime, clear_after_minutes: int) -> list[XidFacts]:
    since = now - timedelta(minutes=clear_after_minutes)
    rows = list(XidError.objects.filter(at__gt=since, at__lte=now).values("gpu_id", "code").annotate(
        n=Count("id"), first=Min("at"), last=Max("at")).values_list("gpu_id", "code", "n", "first", "last"))
    names.load_gpus(row[0] for row in rows)
    return [XidFacts(gpu=names.gpus[gpu_id], code=code, count=n, first_at=first, last_at=last)
            for gpu_id, code, n, first, last in rows if gpu_id in names.gpus]


def edition_of(series: str | None, type_name: str | None) -> str | None:
    """The licence edition a vGPU needs: from its profile's series, else its type name's last letter."""
    if series is None and type_name:
        series = type_name.strip()[-1:].upper()
    edition = EDITION_OF_SERIES.get(series or "")
    return str(edition) if edition else None


def vgpu_licences(names: _Names | None = None, *, expiring_before: datetime | None = None) -> list[VgpuLicence]:
    """The running vGPUs that hold no licence, and those whose licence ends before `expiring_before`
    (telemetry's VgpuHealthState rows); healthy ones are counted by `licence_counts`."""
    names = names or _Names()
    wanted = Q(license_state="unlicensed")
    if expiring_before is not None:
        wanted |= Q(license_state="licensed", license_expiry__lte=expiring_before)
    rows = list(VgpuHealthState.objects.filter(wanted).values_list(
        "vm_id", "vm__name", "gpu_id", "type_name", "vgpu__profile__series", "license_state", "license_expiry"))
    names.load_gpus(row[2] for row in rows)
    return [VgpuLicence(vm_id=vm_id, vm_name=vm_name, gpu=names.gpus[gpu_id], type_name=type_name,
                        edition=edition_of(series, type_name), license_state=state, license_expiry=expiry)
            for vm_id, vm_name, gpu_id, type_name, series, state, expiry in rows if gpu_id in names.gpus]


def licence_counts() -> dict[str, tuple[int, int]]:
    """{edition: (vGPUs holding a licence, vGPUs needing one and holding none)}, counted in the database."""
    series = Coalesce(F("vgpu__profile__series"), Upper(Right("type_name", 1)), Value(""))
    counts: dict[str, list[int]] = {}
    for key, state, n in (VgpuHealthState.objects.filter(license_state__isnull=False).annotate(series_key=series)
                          .values("series_key", "license_state").annotate(n=Count("vm_id"))
                          .values_list("series_key", "license_state", "n")):
        edition = EDITION_OF_SERIES.get(key)
        if edition is None:
            continue
        pair = counts.setdefault(str(edition), [0, 0])
        pair[0 if state == "licensed" else 1] += n
    return {edition: (used, lapsed) for edition, (used, lapsed) in counts.items()}


def pools(counts: dict[str, tuple[int, int]]) -> list[Pool]:
    """Each owned edition's pool with the vGPUs that hold one of its licences now."""
    return [Pool(edition=pool.edition, label=pool.get_edition_display(), owned=pool.owned,
                 in_use=counts.get(pool.edition, (0, 0))[0])
            for pool in LicencePool.objects.all()]


def _host_versions(names: _Names) -> list[HostVersions]:
    models: dict[int, set[str]] = defaultdict(set)
    for host_id, model in Gpu.objects.values_list("host_id", "gpu_model__name").distinct():
        models[host_id].add(model)
    rows = list(HostDriverState.objects.values_list("host_id", "host__name", "driver_version",
                                                    "vgpu_manager_version"))
    return [HostVersions(host_id=host_id, host_name=name, gpu_models=tuple(sorted(models[host_id])),
                         driver_version=driver, vgpu_manager_version=manager)
            for host_id, name, driver, manager in rows]


def _describe(settings_) -> str:
    return settings_.policy.replace("_", " ")


# The scheduler view of the last evaluation in this process, and what it was computed from: it
# changes only when a GPU's reading, a policy or the set of GPUs changes.
_scheduler_cache: dict = {"key": None, "drifting": []}


def _scheduler_key() -> tuple:
    gpus = Gpu.objects.aggregate(n=Count("id"), reported=Max("scheduler_reported_at"), last=Max("id"))
    policies = SchedulerPolicy.objects.aggregate(n=Count("id"), changed=Max("updated_at"))
    vgpus = Vgpu.objects.aggregate(n=Count("id"), last=Max("id"))
    return tuple(gpus.values()) + tuple(policies.values()) + tuple(vgpus.values())


def _schedulers(names: _Names) -> list[SchedulerFacts]:
    key = _scheduler_key()
    if _scheduler_cache["key"] != key:
        drifting = []
        for item in gpu_schedulers(vgpu_mode_gpus().filter(scheduler_reported__isnull=False)):
            if not item.drift:
                continue
            since = max((t for t in (item.gpu.scheduler_reported_at, getattr(item.row, "updated_at", None)) if t),
                        default=None)
            reported = ((item.reported or {}).get("policy") or "unknown").replace("_", " ")
            drifting.append((item.gpu.pk, tuple(item.drift), _describe(item.desired), reported, since))
        _scheduler_cache.update(key=key, drifting=drifting)
    drifting = _scheduler_cache["drifting"]
    names.load_gpus(row[0] for row in drifting)
    return [SchedulerFacts(gpu=names.gpus[gpu_id], fields=fields, desired=desired, reported=reported, since=since)
            for gpu_id, fields, desired, reported, since in drifting if gpu_id in names.gpus]


def utc_now() -> datetime:
    return datetime.now(UTC)

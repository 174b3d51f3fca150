"""The alert rules: what each one watches, its thresholds, and when it fires (pure, no ORM).

`alerts.gather` reads the stored samples and state into the plain facts below; each rule turns
facts into `Finding`s; `alerts.evaluate` reconciles findings with the open alerts (fire, keep,
resolve). A rule fires once per subject (its `Finding.key`): the GPU, the vGPU, the agent, the
host group. Thresholds are the rule's parameters, with defaults that make sense out of the box
and bounds an admin's change is checked against (`check_params`).

"Sustained for M minutes" means every sample of the last M minutes meets the condition and
those samples reach back to the start of the window (the first one no later than `SLACK` of the
window past its start), so a GPU that has just come back does not fire on two hot readings.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime, timedelta

from alerts.xids import describe

CRITICAL, WARNING, INFO = "critical", "warning", "info"


@dataclass(frozen=True, slots=True)
class Param:
    name: str
    default: float
    low: float
    high: float
    unit: str
    help: str
    integer: bool = True


@dataclass(frozen=True, slots=True)
class RuleKind:
    slug: str
    title: str
    severity: str
    help: str
    params: tuple[Param, ...] = ()

    def defaults(self) -> dict[str, float]:
        return {p.name: p.default for p in self.params}


_MINUTES = Param("minutes", 5, 1, 1440, "min", "How long the condition must hold before the alert fires")

RULES: dict[str, RuleKind] = {kind.slug: kind for kind in (
    RuleKind("agent_unreachable", "Agent unreachable", CRITICAL,
             "A host agent failed this many polls in a row: the host's GPUs are not watched.",
             (Param("polls", 3, 1, 1000, "polls", "Failed polls in a row"),)),
    RuleKind("gpu_temperature", "GPU near its slowdown temperature", WARNING,
             "The GPU stayed within the margin of its slowdown temperature (the point where the driver starts "
             "cutting clocks) for the whole window.",
             (Param("margin_c", 5, 0, 50, "°C", "Degrees below the GPU's slowdown temperature"), _MINUTES,
              Param("fallback_slowdown_c", 87, 40, 120, "°C",
                    "Slowdown temperature assumed for GPUs that do not report theirs"))),
    RuleKind("throttling", "Thermal or power throttling sustained", WARNING,
             "Every reading of the window had the clocks held back by heat (thermal slowdown) or by the power "
             "supply (HW power brake). Running at the power cap under full load is normal and does not count.",
             (_MINUTES,)),
    RuleKind("vgpu_fb_full", "vGPU frame buffer nearly full", WARNING,
             "A VM's vGPU used more than this share of its profile's frame buffer for the whole window: "
             "the artist's application is about to run out of GPU memory.",
             (Param("percent", 95, 50, 100, "%", "Share of the profile's frame buffer"), _MINUTES)),
    RuleKind("xid", "XID error", CRITICAL,
             "The driver raised a critical XID on a GPU. The alert names the XID and what to do; it resolves "
             "once the GPU has been quiet for the clear-after time.",
             (Param("clear_after_minutes", 60, 1, 10080, "min", "Quiet time after which the alert resolves"),)),
    RuleKind("ecc_uncorrectable", "Uncorrectable ECC errors", CRITICAL,
             "The GPU counted uncorrectable memory errors since its last reset: data on it may be corrupt."),
    RuleKind("row_remap", "Memory repair failed or pending", CRITICAL,
             "Row remapping (or page retirement on older GPUs) failed, or a repair waits for a GPU reset."),
    RuleKind("vgpu_unlicensed", "vGPU unlicensed", CRITICAL,
             "A running vGPU has no licence: NVIDIA's driver throttles it (frame rate, features) until it "
             "gets one."),
    RuleKind("licence_expiring", "vGPU licence expiring", WARNING,
             "A running vGPU's licence lease ends within this many days.",
             (Param("days", 7, 1, 365, "days", "Days before expiry"),)),
    RuleKind("licence_pool", "Licence pool nearly used up", WARNING,
             "The running vGPUs of one edition use more than this share of the licences the studio owns.",
             (Param("percent", 90, 1, 100, "%", "Share of owned licences in use"),)),
    RuleKind("driver_mismatch", "Driver versions differ between hosts", WARNING,
             "Hosts with the same GPU model run different driver or vGPU manager versions: a VM moved between "
             "them is refused by the hypervisor (live migration needs compatible vGPU managers)."),
    RuleKind("scheduler_drift", "vGPU scheduler differs from its policy", WARNING,
             "The scheduler a GPU reports is not the policy set for it, for longer than this.",
             (Param("minutes", 10, 1, 10080, "min", "How long the difference must last"),)),
)}

SLACK = 0.2  # share of a window the first sample may start late (one missed poll in five)


class ParamError(ValueError):
    """A threshold an admin typed that the rule cannot take; `param` names it."""

    def __init__(self, param: str, message: str):
        super().__init__(message)
        self.param = param


def check_params(slug: str, values: dict) -> dict[str, float]:
    """The rule's full parameter set: `values` checked against each parameter's bounds, the
    defaults for what is left out. Unknown names and bad values raise ParamError."""
    kind = RULES[slug]
    known = {p.name: p for p in kind.params}
    for name in values:
        if name not in known:
            allowed = ", ".join(known) or "none"
            raise ParamError(name, f"{kind.title} has no parameter {name!r} (parameters: {allowed}).")
    result = {}
    for name, param in known.items():
        value = values.get(name, param.default)
        if type(value) is bool or not isinstance(value, (int, float)) or value != value:
            raise ParamError(name, f"{name}: expected a number, got {value!r}.")
        if param.integer and value != int(value):
            raise ParamError(name, f"{name}: expected a whole number of {param.unit}, got {value!r}.")
        if not param.low <= value <= param.high:
            raise ParamError(name, f"{name}: must be between {param.low:g} and {param.high:g} {param.unit}, "
                                   f"got {value:g}.")
        result[name] = int(value) if param.integer else float(value)
    return result


# -- facts (what alerts.gather reads) -------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class GpuRef:
    """A GPU as an alert names it, with the VMs running on it (the people an alert hurts)."""

    gpu_id: int
    host_id: int
    label: str  # "node-01 GPU 0 (L40S)"
    vm_ids: tuple[int, ...] = ()


@dataclass(frozen=True, slots=True)
class AgentFacts:
    agent_id: int
    name: str
    host_id: int | None
    host_name: str | None
    failures: int
    last_seen: datetime | None
    last_error: str
    vm_ids: tuple[int, ...] = ()


@dataclass(frozen=True, slots=True)
class GpuWindow:
    """One GPU's samples over a rule's window, aggregated."""

    gpu: GpuRef
    samples: int
    first_ts: datetime | None
    temp_min: float | None = None
    temp_max: float | None = None
    slowdown_c: float | None = None
    thermal_samples: int = 0  # samples with a thermal throttle flag
    power_samples: int = 0  # samples with a power throttle flag


@dataclass(frozen=True, slots=True)
class VgpuWindow:
    """One vGPU's frame buffer over a rule's window against its profile."""

    vm_id: int
    vm_name: str
    gpu: GpuRef
    profile: str
    profile_fb_mib: float
    samples: int
    first_ts: datetime | None
    fb_min: float | None
    fb_max: float | None


@dataclass(frozen=True, slots=True)
class GpuState:
    """A GPU's stored health state (telemetry's GpuHealthState)."""

    gpu: GpuRef
    ecc_uncorrected_volatile: int | None = None
    ecc_uncorrected_aggregate: int | None = None
    remapped_rows_failure: bool | None = None
    remapped_rows_pending: bool | None = None
    retired_pages_pending: bool | None = None
    remapped_rows_uncorrectable: int | None = None


@dataclass(frozen=True, slots=True)
class XidFacts:
    """The XIDs of one code on one GPU within the clear-after time."""

    gpu: GpuRef
    code: int
    count: int
    first_at: datetime
    last_at: datetime


@dataclass(frozen=True, slots=True)
class VgpuLicence:
    vm_id: int
    vm_name: str
    gpu: GpuRef
    type_name: str | None
    edition: str | None
    license_state: str | None
    license_expiry: datetime | None


@dataclass(frozen=True, slots=True)
class Pool:
    edition: str
    label: str
    owned: int
    in_use: int
    vm_ids: tuple[int, ...] = ()


@dataclass(frozen=True, slots=True)
class HostVersions:
    host_id: int
    host_name: str
    gpu_models: tuple[str, ...]
    driver_version: str | None
    vgpu_manager_version: str | None
    vm_ids: tuple[int, ...] = ()


@dataclass(frozen=True, slots=True)
class SchedulerFacts:
    gpu: GpuRef
    fields: tuple[str, ...]
    desired: str
    reported: str
    since: datetime | None


@dataclass(frozen=True, slots=True)
class Facts:
    now: datetime
    agents: list[AgentFacts] = field(default_factory=list)
    gpu_windows: dict[int, list[GpuWindow]] = field(default_factory=dict)  # minutes -> windows
    vgpu_windows: dict[int, list[VgpuWindow]] = field(default_factory=dict)
    gpu_states: list[GpuState] = field(default_factory=list)
    xids: list[XidFacts] = field(default_factory=list)
    licences: list[VgpuLicence] = field(default_factory=list)  # unlicensed or expiring within the rule's days
    licence_counts: dict[str, tuple[int, int]] = field(default_factory=dict)  # edition: (licensed, unlicensed)
    pools: list[Pool] = field(default_factory=list)
    hosts: list[HostVersions] = field(default_factory=list)
    schedulers: list[SchedulerFacts] = field(default_factory=list)


@dataclass(slots=True)
class Finding:
    """One subject a rule fires on now. `key` deduplicates: one open alert per key."""

    rule: str
    key: str
    title: str
    summary: str
    severity: str | None = None  # None: the rule's severity
    host_id: int | None = None
    gpu_id: int | None = None
    vm_ids: tuple[int, ...] = ()
    details: dict = field(default_factory=dict)


# -- the rules ------------------------------------------------------------------------------------


def sustained(window_first: datetime | None, samples: int, now: datetime, minutes: float) -> bool:
    """Whether samples cover the last `minutes` (see the module's docstring)."""
    if window_first is None or samples < 2:
        return False
    start = now - timedelta(minutes=minutes)
    return window_first <= start + timedelta(minutes=minutes * SLACK)


def _gpu_finding(rule: str, gpu: GpuRef, key_suffix: str, title: str, summary: str, **details) -> Finding:
    return Finding(rule=rule, key=f"{rule}:gpu:{gpu.gpu_id}{key_suffix}", title=title, summary=summary,
                   host_id=gpu.host_id, gpu_id=gpu.gpu_id, vm_ids=gpu.vm_ids, details=details)


def agent_unreachable(facts: Facts, p: dict) -> list[Finding]:
    out = []
    for agent in facts.agents:
        if agent.failures < p["polls"]:
            continue
        where = f"host {agent.host_name}" if agent.host_name else "no host yet"
        seen = f"last answered {agent.last_seen:%Y-%m-%d %H:%M} UTC" if agent.last_seen else "never answered"
        out.append(Finding(
            rule="agent_unreachable", key=f"agent_unreachable:agent:{agent.agent_id}",
            title=f"Agent {agent.name} unreachable",
            summary=f"Agent {agent.name} ({where}) failed {agent.failures} polls in a row and {seen}; its GPUs "
                    f"are not watched. Last error: {agent.last_error or 'none recorded'}.",
            host_id=agent.host_id, vm_ids=agent.vm_ids,
            details={"agent": agent.name, "failures": agent.failures, "last_error": agent.last_error,
                     "last_seen": agent.last_seen.isoformat() if agent.last_seen else None}))
    return out


def gpu_temperature(facts: Facts, p: dict) -> list[Finding]:
    out = []
    for w in facts.gpu_windows.get(p["minutes"], []):
        if w.temp_min is None or not sustained(w.first_ts, w.samples, facts.now, p["minutes"]):
            continue
        slowdown = w.slowdown_c if w.slowdown_c is not None else p["fallback_slowdown_c"]
        limit = slowdown - p["margin_c"]
        if w.temp_min < limit:
            continue
        told = "its slowdown temperature" if w.slowdown_c is not None else "the assumed slowdown temperature"
        out.append(_gpu_finding(
            "gpu_temperature", w.gpu, "", f"{w.gpu.label} running hot",
            f"{w.gpu.label} stayed at {w.temp_min:.0f}–{w.temp_max:.0f} °C for {p['minutes']} min, within "
            f"{p['margin_c']} °C of {told} ({slowdown:.0f} °C): the driver will cut its clocks, and every VM on it "
            f"slows down. Check the host's fans, airflow and inlet temperature.",
            temp_min=w.temp_min, temp_max=w.temp_max, slowdown_c=slowdown, minutes=p["minutes"]))
    return out


def throttling(facts: Facts, p: dict) -> list[Finding]:
    out = []
    for w in facts.gpu_windows.get(p["minutes"], []):
        if not sustained(w.first_ts, w.samples, facts.now, p["minutes"]):
            continue
        causes = [name for name, count in (("heat", w.thermal_samples), ("the power brake", w.power_samples))
                  if count == w.samples]
        if not causes and w.thermal_samples + w.power_samples >= w.samples > 0:
            causes = ["heat and the power brake"]
        if not causes:
            continue
        cause = " and ".join(causes)
        out.append(_gpu_finding(
            "throttling", w.gpu, "", f"{w.gpu.label} throttled by {cause}",
            f"Every reading of {w.gpu.label} in the last {p['minutes']} min had its clocks held back by {cause}: "
            f"the VMs on it get less GPU than their profiles promise.",
            cause=cause, samples=w.samples, minutes=p["minutes"]))
    return out


def vgpu_fb_full(facts: Facts, p: dict) -> list[Finding]:
    out = []
    share = p["percent"] / 100.0
    for w in facts.vgpu_windows.get(p["minutes"], []):
        if w.fb_min is None or not w.profile_fb_mib or not sustained(w.first_ts, w.samples, facts.now,
                                                                      p["minutes"]):
            continue
        if w.fb_min < share * w.profile_fb_mib:
            continue
        low = 100.0 * w.fb_min / w.profile_fb_mib
        high = 100.0 * (w.fb_max or w.fb_min) / w.profile_fb_mib
        out.append(Finding(
            rule="vgpu_fb_full", key=f"vgpu_fb_full:vm:{w.vm_id}:gpu:{w.gpu.gpu_id}",
            title=f"{w.vm_name}: vGPU frame buffer {high:.0f}% full",
            summary=f"VM {w.vm_name} used {low:.0f}–{high:.0f}% of its {w.profile} frame buffer "
                    f"({w.profile_fb_mib / 1024:.0f} GiB) for {p['minutes']} min on {w.gpu.label}. Its applications "
                    f"will fail to allocate GPU memory; a larger profile is the fix (see its sizing suggestion).",
            host_id=w.gpu.host_id, gpu_id=w.gpu.gpu_id, vm_ids=(w.vm_id,),
            details={"vm": w.vm_name, "profile": w.profile, "fb_min_mib": w.fb_min, "fb_max_mib": w.fb_max,
                     "profile_fb_mib": w.profile_fb_mib, "minutes": p["minutes"]}))
    return out


def xid(facts: Facts, p: dict) -> list[Finding]:
    out = []
    for x in facts.xids:
        known = describe(x.code)
        times = "once" if x.count == 1 else f"{x.count} times"
        out.append(_severity(_gpu_finding(
            "xid", x.gpu, f":{x.code}", f"XID {x.code} on {x.gpu.label}: {known.name}",
            f"{x.gpu.label} raised XID {x.code} ({known.name}) {times}, last at {x.last_at:%Y-%m-%d %H:%M:%S} UTC. "
            f"Affects {known.impact}. {known.action}",
            code=x.code, meaning=known.name, impact=known.impact, action=known.action, count=x.count,
            first_at=x.first_at.isoformat(), last_at=x.last_at.isoformat()), known.severity))
    return out


def _severity(finding: Finding, severity: str) -> Finding:
    """`finding` with a severity of its own instead of its rule's."""
    finding.severity = severity
    return finding


def ecc_uncorrectable(facts: Facts, p: dict) -> list[Finding]:
    out = []
    for s in facts.gpu_states:
        count = s.ecc_uncorrected_volatile
        if not count:
            continue
        out.append(_gpu_finding(
            "ecc_uncorrectable", s.gpu, "", f"Uncorrectable ECC errors on {s.gpu.label}",
            f"{s.gpu.label} counted {count} uncorrectable ECC error{'s' if count != 1 else ''} since its last reset "
            f"(lifetime: {s.ecc_uncorrected_aggregate if s.ecc_uncorrected_aggregate is not None else 'unknown'}). "
            f"Data of the VMs on it may be corrupt: drain the GPU and reset it; replace the board if errors return.",
            volatile=count, aggregate=s.ecc_uncorrected_aggregate))
    return out


def row_remap(facts: Facts, p: dict) -> list[Finding]:
    out = []
    for s in facts.gpu_states:
        if s.remapped_rows_failure:
            out.append(_gpu_finding(
                "row_remap", s.gpu, "", f"Row remapping failed on {s.gpu.label}",
                f"{s.gpu.label} could not remap a failing memory row: it is out of spare rows. The board needs "
                f"replacing; drain its VMs.", failure=True, pending=bool(s.remapped_rows_pending)))
        elif s.remapped_rows_pending or s.retired_pages_pending:
            what = "A row remapping" if s.remapped_rows_pending else "A page retirement"
            out.append(_severity(_gpu_finding(
                "row_remap", s.gpu, "", f"Memory repair pending on {s.gpu.label}",
                f"{what} on {s.gpu.label} waits for a GPU reset. Until then the faulty memory may be used: drain "
                f"the GPU and reset it at a quiet time.", failure=False, pending=True), WARNING))
    return out


def vgpu_unlicensed(facts: Facts, p: dict) -> list[Finding]:
    out = []
    for lic in facts.licences:
        if lic.license_state != "unlicensed":
            continue
        out.append(Finding(
            rule="vgpu_unlicensed", key=f"vgpu_unlicensed:vm:{lic.vm_id}:gpu:{lic.gpu.gpu_id}",
            title=f"{lic.vm_name}: vGPU unlicensed",
            summary=f"VM {lic.vm_name}'s {lic.type_name or 'vGPU'} on {lic.gpu.label} runs without a licence: the "
                    f"driver restricts it (frame rate capped, features off) until it gets one. Check the licence "
                    f"server and the client configuration token in the VM.",
            host_id=lic.gpu.host_id, gpu_id=lic.gpu.gpu_id, vm_ids=(lic.vm_id,),
            details={"vm": lic.vm_name, "type": lic.type_name, "edition": lic.edition}))
    return out


def licence_expiring(facts: Facts, p: dict) -> list[Finding]:
    out = []
    horizon = facts.now + timedelta(days=p["days"])
    for lic in facts.licences:
        if lic.license_state != "licensed" or lic.license_expiry is None or lic.license_expiry > horizon:
            continue
        left = lic.license_expiry - facts.now
        when = "has expired" if left.total_seconds() <= 0 else f"ends in {_span(left)}"
        out.append(Finding(
            rule="licence_expiring", key=f"licence_expiring:vm:{lic.vm_id}:gpu:{lic.gpu.gpu_id}",
            title=f"{lic.vm_name}: vGPU licence {when}",
            summary=f"The licence lease of VM {lic.vm_name}'s {lic.type_name or 'vGPU'} {when} "
                    f"({lic.license_expiry:%Y-%m-%d %H:%M} UTC). A lease that is not renewed leaves the vGPU "
                    f"unlicensed and throttled; check that the VM reaches the licence server.",
            host_id=lic.gpu.host_id, gpu_id=lic.gpu.gpu_id, vm_ids=(lic.vm_id,),
            details={"vm": lic.vm_name, "expiry": lic.license_expiry.isoformat(), "edition": lic.edition}))
    return out


def _span(delta: timedelta) -> str:
    hours = delta.total_seconds() / 3600
    return f"{hours / 24:.0f} days" if hours >= 48 else f"{hours:.0f} hours" if hours >= 2 else \
        f"{max(1, round(hours * 60))} minutes"


def licence_pool(facts: Facts, p: dict) -> list[Finding]:
    out = []
    for pool in facts.pools:
        if pool.owned <= 0:
            continue
        share = 100.0 * pool.in_use / pool.owned
        if share <= p["percent"]:
            continue
        over = pool.in_use > pool.owned
        out.append(Finding(
            rule="licence_pool", key=f"licence_pool:{pool.edition}",
            title=f"{pool.label} licences {share:.0f}% used",
            summary=f"{pool.in_use} running vGPUs need a {pool.label} licence; the studio owns {pool.owned}. "
                    + ("The VMs beyond the pool run unlicensed and throttled." if over else
                       "The next VMs to start may find none left."),
            severity=CRITICAL if over else None, vm_ids=pool.vm_ids,
            details={"edition": pool.edition, "owned": pool.owned, "in_use": pool.in_use,
                     "percent": round(share, 1)}))
    return out


def driver_mismatch(facts: Facts, p: dict) -> list[Finding]:
    """One finding per GPU model whose hosts run more than one driver or vGPU manager version."""
    by_model: dict[str, list[HostVersions]] = {}
    for host in facts.hosts:
        if host.driver_version is None and host.vgpu_manager_version is None:
            continue
        for model in host.gpu_models:
            by_model.setdefault(model, []).append(host)
    out = []
    for model, hosts in sorted(by_model.items()):
        versions: dict[tuple, list[str]] = {}
        for host in hosts:
            versions.setdefault((host.vgpu_manager_version, host.driver_version), []).append(host.host_name)
        if len(versions) < 2:
            continue
        parts = [f"{', '.join(sorted(names))}: driver {drv or '?'}" + (f", vGPU manager {mgr}" if mgr else "")
                 for (mgr, drv), names in sorted(versions.items(), key=lambda kv: (str(kv[0][0]), str(kv[0][1])))]
        out.append(Finding(
            rule="driver_mismatch", key=f"driver_mismatch:model:{model}",
            title=f"{model} hosts run {len(versions)} driver versions",
            summary=f"Hosts with {model} GPUs differ: {'; '.join(parts)}. Moving a VM between hosts of different "
                    f"versions is refused by the hypervisor; upgrade them to one version.",
            vm_ids=tuple(sorted({vm for host in hosts for vm in host.vm_ids})),
            details={"gpu_model": model, "hosts": {name: {"driver": drv, "vgpu_manager": mgr}
                                                   for (mgr, drv), names in versions.items() for name in names}}))
    return out


def scheduler_drift(facts: Facts, p: dict) -> list[Finding]:
    out = []
    limit = facts.now - timedelta(minutes=p["minutes"])
    for s in facts.schedulers:
        if not s.fields or (s.since is not None and s.since > limit):
            continue
        out.append(_gpu_finding(
            "scheduler_drift", s.gpu, "", f"{s.gpu.label}: scheduler differs from its policy",
            f"{s.gpu.label} reports {s.reported} but its policy says {s.desired} (differs in "
            f"{', '.join(s.fields)}). The VMs on it are not sharing the GPU as intended; apply the policy again "
            f"or check the host's RmPVMRL registry key.", fields=list(s.fields), desired=s.desired,
            reported=s.reported))
    return out


EVALUATORS = {
    "agent_unreachable": agent_unreachable,
    "gpu_temperature": gpu_temperature,
    "throttling": throttling,
    "vgpu_fb_full": vgpu_fb_full,
    "xid": xid,
    "ecc_uncorrectable": ecc_uncorrectable,
    "row_remap": row_remap,
    "vgpu_unlicensed": vgpu_unlicensed,
    "licence_expiring": licence_expiring,
    "licence_pool": licence_pool,
    "driver_mismatch": driver_mismatch,
    "scheduler_drift": scheduler_drift,
}
assert set(EVALUATORS) == set(RULES)


def evaluate(facts: Facts, rules: dict[str, tuple[str, dict]]) -> list[Finding]:
    """Every finding of the enabled `rules` ({slug: (severity, params)}), each with its severity set."""
    findings = []
    for slug, (severity, params) in rules.items():
        for finding in EVALUATORS[slug](facts, params):
            if finding.severity is None:
                finding.severity = severity
            findings.append(finding)
    return findings

"""The alert rules as a Prometheus alerting-rules file, for studios whose on-call runs through
Alertmanager: the same conditions and the thresholds set in the dashboard, over the series of
the dashboard's /metrics (telemetry.exposition), grouped as `promtool check rules` expects.

Three rules judge what /metrics does not carry (the licences owned, the hosts a move would
cross, the scheduler policies) and stay the dashboard's own; the file says so in its comments.
"""

from __future__ import annotations

from dataclasses import dataclass

from alerts.rules import RULES

GPU_ON = "on(host, gpu_uuid, pci_bus_id, gpu_model)"
VGPU_ON = "on(host, gpu_uuid, vm, artist, profile)"
NOT_EXPORTED = {
    "licence_pool": "the licences owned are the dashboard's; /metrics does not carry them",
    "driver_mismatch": "which hosts a VM could move between is the dashboard's placement knowledge",
    "scheduler_drift": "the desired scheduler policies are the dashboard's",
}
# Throttle bits (telemetry.payload.THROTTLE_FLAGS): heat (HW slowdown 0x8, SW/HW thermal 0x20,
# 0x40) and the power supply (HW power brake 0x80); the SW power cap (0x4) is normal at full load.
THERMAL_BITS = (8, 32, 64)
POWER_BITS = (128,)


@dataclass(frozen=True)
class PromRule:
    name: str
    expr: str
    for_s: int
    severity: str
    summary: str
    description: str

    def as_dict(self, slug: str) -> dict:
        rule = {"alert": self.name, "expr": self.expr}
        if self.for_s:
            rule["for"] = f"{self.for_s}s"
        rule["labels"] = {"severity": self.severity, "vgpu_fleet_rule": slug}
        rule["annotations"] = {"summary": self.summary, "description": self.description}
        return rule


def _bit_set(series: str, bits: tuple[int, ...]) -> str:
    return " or ".join(f"floor({series} / {bit}) % 2 == 1" for bit in bits)


def prom_rules(slug: str, severity: str, p: dict, poll_interval_s: float) -> list[PromRule]:
    """The Prometheus rules of one dashboard rule ({} for those NOT_EXPORTED)."""
    title = RULES[slug].title
    minutes = p.get("minutes", 0) * 60
    if slug == "agent_unreachable":
        return [PromRule("VgpuFleetAgentUnreachable", "vgpu_fleet_agent_up == 0",
                         int(p["polls"] * poll_interval_s), severity, title,
                         "Agent {{ $labels.agent }} of host {{ $labels.host }} has not answered for "
                         f"{p['polls']} polls: its GPUs are not watched.")]
    if slug == "gpu_temperature":
        margin, fallback = p["margin_c"], p["fallback_slowdown_c"]
        expr = (f"(vgpu_fleet_gpu_temperature_celsius >= {GPU_ON} "
                f"(vgpu_fleet_gpu_slowdown_temperature_celsius - {margin})) or "
                f"(vgpu_fleet_gpu_temperature_celsius >= {fallback - margin} unless {GPU_ON} "
                f"vgpu_fleet_gpu_slowdown_temperature_celsius)")
        return [PromRule("VgpuFleetGpuNearSlowdown", expr, minutes, severity, title,
                         "GPU {{ $labels.pci_bus_id }} of {{ $labels.host }} is at {{ $value }} °C, within "
                         f"{margin} °C of its slowdown temperature: the VMs on it are about to slow down.")]
    if slug == "throttling":
        series = "DCGM_FI_DEV_CLOCK_THROTTLE_REASONS"
        return [PromRule("VgpuFleetGpuThrottled", f"({_bit_set(series, THERMAL_BITS + POWER_BITS)})", minutes,
                         severity, title, "GPU {{ $labels.pci_bus_id }} of {{ $labels.host }} has had its clocks "
                         "held back by heat or power for the whole window.")]
    if slug == "vgpu_fb_full":
        share = p["percent"] / 100
        return [PromRule("VgpuFleetVgpuFrameBufferFull",
                         f"vgpu_fleet_vgpu_fb_used_mib >= {VGPU_ON} (vgpu_fleet_vgpu_profile_fb_mib * {share:g})",
                         minutes, severity, title, "VM {{ $labels.vm }} ({{ $labels.artist }}) uses more than "
                         f"{p['percent']}% of its {{{{ $labels.profile }}}} frame buffer.")]
    if slug == "xid":
        window = f"{p['clear_after_minutes']}m"
        expr = f"DCGM_FI_DEV_XID_ERRORS > 0 and changes(DCGM_FI_DEV_XID_ERRORS[{window}]) > 0"
        return [PromRule("VgpuFleetXid", expr, 0, severity, title,
                         "GPU {{ $labels.pci_bus_id }} of {{ $labels.host }} raised XID {{ $value }}; see the "
                         "dashboard's alert for its meaning and what to do.")]
    if slug == "ecc_uncorrectable":
        return [PromRule("VgpuFleetEccUncorrectable", "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL > 0", 0, severity, title,
                         "GPU {{ $labels.pci_bus_id }} of {{ $labels.host }} counted {{ $value }} uncorrectable ECC "
                         "errors since its last reset: drain and reset it.")]
    if slug == "row_remap":
        return [PromRule("VgpuFleetRowRemapFailed", "DCGM_FI_DEV_ROW_REMAP_FAILURE == 1", 0, severity, title,
                         "GPU {{ $labels.pci_bus_id }} of {{ $labels.host }} could not remap a memory row: "
                         "replace the board."),
                PromRule("VgpuFleetMemoryRepairPending",
                         "DCGM_FI_DEV_ROW_REMAP_PENDING == 1 or DCGM_FI_DEV_RETIRED_PENDING == 1", 0, "warning",
                         "Memory repair pending", "GPU {{ $labels.pci_bus_id }} of {{ $labels.host }} waits for a "
                         "reset to apply a memory repair.")]
    if slug == "vgpu_unlicensed":
        return [PromRule("VgpuFleetVgpuUnlicensed", "DCGM_FI_DEV_VGPU_LICENSE_STATUS == 0", 0, severity, title,
                         "VM {{ $labels.vm }} ({{ $labels.artist }}) runs its {{ $labels.profile }} without a "
                         "licence: the driver throttles it.")]
    if slug == "licence_expiring":
        return [PromRule("VgpuFleetLicenceExpiring",
                         f"vgpu_fleet_vgpu_license_expiry_timestamp_seconds - time() < {p['days'] * 86400}", 0,
                         severity, title, "The licence lease of VM {{ $labels.vm }} ends within "
                         f"{p['days']} days.")]
    return []


def rules_file(rows, poll_interval_s: float) -> dict:
    """The rules file's content for `rows` ((slug, enabled, severity, params) of each dashboard rule)."""
    exported = []
    for slug, enabled, severity, params in rows:
        if enabled and slug not in NOT_EXPORTED:
            exported.extend(rule.as_dict(slug) for rule in prom_rules(slug, severity, params, poll_interval_s))
    return {"groups": [{"name": "vgpu-fleet", "rules": exported}]}

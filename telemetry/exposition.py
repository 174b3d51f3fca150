"""Prometheus exposition at /metrics: the fleet's newest readings and capacity as gauges.

So a studio's existing Prometheus and Grafana can chart and alert on the fleet without
talking to the agents. One scrape costs a fixed number of queries (eleven) whatever the fleet's
size. Values come from the newest sample of each GPU and vGPU, and the newest guest reading of
each VM (its CPU and memory read through the hypervisor link), if it is no older than
TELEMETRY_STALE_AFTER_S; a stale or missing reading, or a metric the GPU or guest does not report
(a guest without the balloon driver reports no memory use), is left out (no series) rather than
shown as 0, so `absent()` alerts and gaps work as expected.

Health (issue 19) comes from the state rows ingest keeps (`GpuHealthState`, `VgpuHealthState`,
`HostDriverState`, `XidError`), for the GPUs whose newest sample is fresh (a GPU no longer
reporting shows no health either). Where dcgm-exporter has a field for it, the series has its
name (`DCGM_FI_DEV_ECC_SBE_VOL_TOTAL`, `DCGM_FI_DEV_XID_ERRORS`, ...) and the same meaning, with
this exposition's labels, so dashboards and alert rules written for dcgm-exporter work here;
the rest is named like the other gauges (`vgpu_fleet_...`). `DCGM_FI_DEV_XID_ERRORS` is the code
of the GPU's newest stored XID (0: none within the raw retention), for GPUs that report health.
Booleans are 1 or 0; a field the GPU does not support (null) has no series.

Access: the series name artists and their VMs, so a scrape needs credentials, from loopback
too (a reverse proxy on the same machine makes every request loopback's):
`Authorization: Bearer <METRICS_TOKEN>` (a setting; may come from METRICS_TOKEN_FILE), or the
API token (`Authorization: Token <key>`) or session of a staff user. Anything else is 401 with
a WWW-Authenticate challenge; a valid token or session of a non-staff user (an artist) is 403.
METRICS_PUBLIC=true lets anyone read it. See `refusal`.
"""

from __future__ import annotations

import hmac
from collections import Counter, defaultdict
from collections.abc import Iterator
from datetime import datetime, timedelta

from django.conf import settings
from django.http import HttpRequest, HttpResponse
from django.utils import timezone
from django.views.decorators.cache import never_cache
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from config.roles import is_fleet_admin
from fleet import api_tokens, token_rules
from fleet.choices import GpuMode
from fleet.models import Gpu, Vgpu, VirtualMachine
from telemetry.models import Agent, AgentStatus, GpuHealthState, HostDriverState, VgpuHealthState
from telemetry.queries import latest_gpu_samples, latest_guest_samples, latest_vgpu_samples, latest_xid_codes

PREFIX = "vgpu_fleet"
GPU_LABELS = ["host", "gpu_uuid", "pci_bus_id", "gpu_model"]
VGPU_LABELS = ["host", "gpu_uuid", "vm", "artist", "profile"]
VM_LABELS = ["host", "vm", "artist"]

#: (sample field, metric name, help) of the per-GPU gauges.
GPU_GAUGES = (
    ("util_gpu", "gpu_utilization_percent", "3D/compute utilization of the GPU, %"),
    ("util_mem", "gpu_memory_utilization_percent", "Memory controller utilization of the GPU, %"),
    ("fb_used_mib", "gpu_fb_used_mib", "Frame buffer used on the GPU, MiB"),
    ("fb_total_mib", "gpu_fb_total_mib", "Frame buffer of the GPU, MiB"),
    ("temp_c", "gpu_temperature_celsius", "GPU temperature, degrees Celsius"),
    ("power_w", "gpu_power_watts", "GPU power draw, watts"),
    ("sm_clock_mhz", "gpu_sm_clock_mhz", "SM clock of the GPU, MHz"),
    ("enc_util", "gpu_encoder_utilization_percent", "Video encoder utilization of the GPU, %"),
    ("dec_util", "gpu_decoder_utilization_percent", "Video decoder utilization of the GPU, %"),
)
#: (sample field, metric name, help) of the per-vGPU gauges; utilization is a share of the GPU.
VGPU_GAUGES = (
    ("fb_used_mib", "vgpu_fb_used_mib", "Frame buffer used by the vGPU, MiB"),
    ("util_gpu", "vgpu_utilization_percent", "3D/compute utilization of the vGPU, % of the physical GPU"),
    ("util_mem", "vgpu_memory_utilization_percent", "Memory controller utilization of the vGPU, % of the GPU"),
    ("enc_util", "vgpu_encoder_utilization_percent", "Encoder utilization of the vGPU, % of the GPU"),
    ("dec_util", "vgpu_decoder_utilization_percent", "Decoder utilization of the vGPU, % of the GPU"),
)
#: (guest sample field, metric name, help) of the per-VM gauges of its guest, read through the
#: hypervisor link (no agent in the guest).
GUEST_GAUGES = (
    ("vcpu_util", "vm_vcpu_utilization_percent", "Share of all the VM's vCPUs the guest kept busy, %"),
    ("vcpu_max_util", "vm_vcpu_max_utilization_percent", "Share of the VM's busiest vCPU the guest kept busy, %"),
    ("cpu_steal_pct", "vm_cpu_steal_percent", "Time the VM's vCPUs waited for a host CPU (steal), %"),
    ("ram_used_mib", "vm_ram_used_mib", "Memory the guest uses (its balloon driver's figure), MiB"),
    ("ram_mib", "vm_ram_mib", "Memory allocated to the VM, MiB"),
    ("vcpus", "vm_vcpus", "vCPUs of the VM"),
)
#: (GpuHealthState field, metric name, help) of the per-GPU health gauges; a name starting with
#: DCGM_ is dcgm-exporter's, the others take PREFIX.
GPU_HEALTH_GAUGES = (
    ("ecc_corrected_volatile", "DCGM_FI_DEV_ECC_SBE_VOL_TOTAL",
     "Corrected (single-bit) ECC errors since the driver loaded"),
    ("ecc_uncorrected_volatile", "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL",
     "Uncorrected (double-bit) ECC errors since the driver loaded"),
    ("ecc_corrected_aggregate", "DCGM_FI_DEV_ECC_SBE_AGG_TOTAL", "Corrected (single-bit) ECC errors, lifetime"),
    ("ecc_uncorrected_aggregate", "DCGM_FI_DEV_ECC_DBE_AGG_TOTAL", "Uncorrected (double-bit) ECC errors, lifetime"),
    ("retired_pages_sbe", "DCGM_FI_DEV_RETIRED_SBE", "Frame buffer pages retired for single-bit errors"),
    ("retired_pages_dbe", "DCGM_FI_DEV_RETIRED_DBE", "Frame buffer pages retired for double-bit errors"),
    ("retired_pages_pending", "DCGM_FI_DEV_RETIRED_PENDING", "1 when a page retirement waits for a GPU reset"),
    ("remapped_rows_correctable", "DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS",
     "Memory rows remapped for correctable errors"),
    ("remapped_rows_uncorrectable", "DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS",
     "Memory rows remapped for uncorrectable errors"),
    ("remapped_rows_pending", "DCGM_FI_DEV_ROW_REMAP_PENDING", "1 when a row remap waits for a GPU reset"),
    ("remapped_rows_failure", "DCGM_FI_DEV_ROW_REMAP_FAILURE", "1 when a row could not be remapped: replace the GPU"),
    ("pcie_replay_counter", "DCGM_FI_DEV_PCIE_REPLAY_COUNTER", "PCIe replays (retried transfers)"),
    ("fan_speed_pct", "DCGM_FI_DEV_FAN_SPEED", "Fan speed, %"),
    ("power_limit_w", "DCGM_FI_DEV_POWER_MGMT_LIMIT", "Enforced power limit, watts"),
    ("temp_slowdown_c", "gpu_slowdown_temperature_celsius", "Temperature at which the GPU slows down, degrees Celsius"),
    ("temp_shutdown_c", "gpu_shutdown_temperature_celsius", "Temperature at which the GPU shuts down, degrees Celsius"),
    ("ecc_mode", "gpu_ecc_enabled", "1 when ECC is enabled on the GPU, 0 when disabled"),
    ("performance_state", "gpu_performance_state", "Performance state: 0 (P0, fastest) to 15"),
)
#: (VgpuHealthState field, metric name, help) of the per-vGPU health gauges.
VGPU_HEALTH_GAUGES = (
    ("license_state", "DCGM_FI_DEV_VGPU_LICENSE_STATUS", "1 when the vGPU is licensed, 0 when not"),
    ("license_expiry", "vgpu_license_expiry_timestamp_seconds", "When the vGPU's licence expires, Unix seconds"),
    ("frame_rate_limit", "vgpu_frame_rate_limit_fps", "Frame rate limit of the vGPU, frames per second"),
    ("encoder_sessions", "vgpu_encoder_sessions", "Video encoder sessions open on the vGPU"),
)


def _gauge(name: str, documentation: str, labels: list[str]) -> GaugeMetricFamily:
    return GaugeMetricFamily(name if name.startswith("DCGM_") else f"{PREFIX}_{name}", documentation, labels=labels)


def _number(field: str, value) -> float | None:
    """A health field as a gauge value: booleans and states as numbers, None where there is none."""
    if value is None:
        return None
    if field == "ecc_mode":
        return 1 if value == "enabled" else 0
    if field == "license_state":
        return 1 if value == "licensed" else 0
    if field == "performance_state":
        return int(value[1:]) if value[1:].isdigit() else None
    if field == "license_expiry":
        return value.timestamp()
    return float(value)


class FleetCollector(Collector):
    """Yields the fleet's gauges from the database at collection time (eleven queries)."""

    def __init__(self, now: datetime | None = None):
        self.now = now

    def collect(self) -> Iterator[GaugeMetricFamily]:
        now = self.now or timezone.now()
        since = now - timedelta(seconds=settings.TELEMETRY_STALE_AFTER_S)
        gpus = {gpu.pk: gpu for gpu in Gpu.objects.select_related("host", "gpu_model").order_by("pk")}
        samples = latest_gpu_samples(since=since)
        yield from self._gpu_gauges(gpus, samples, now)
        fresh = {gpu_id: gpus[gpu_id] for gpu_id in sorted(samples) if gpu_id in gpus}
        yield from self._gpu_health_gauges(fresh, samples)
        vgpus = list(Vgpu.objects.select_related("vm__artist", "profile").order_by("gpu_id", "placement_id"))
        yield from self._vgpu_gauges(gpus, vgpus, latest_vgpu_samples(since=since))
        yield from self._vgpu_health_gauges(fresh, vgpus)
        yield from self._driver_gauges(fresh)
        yield from self._capacity_gauges(gpus, vgpus)
        yield from self._guest_gauges(latest_guest_samples(since=since))
        yield from self._agent_gauges(now)

    def _gpu_gauges(self, gpus: dict[int, Gpu], samples: dict[int, dict], now: datetime):
        families = [(field, _gauge(name, doc, GPU_LABELS)) for field, name, doc in GPU_GAUGES]
        age = _gauge("gpu_sample_age_seconds", "Seconds since the GPU's newest sample was taken", GPU_LABELS)
        for gpu_id, sample in sorted(samples.items()):
            gpu = gpus.get(gpu_id)
            if gpu is None:  # removed between the two queries
                continue
            labels = [gpu.host.name, gpu.uuid, gpu.pci_bus_id, gpu.gpu_model.name]
            for field, family in families:
                if sample[field] is not None:
                    family.add_metric(labels, sample[field])
            age.add_metric(labels, max(0.0, (now - sample["ts"]).total_seconds()))
        yield from (family for _, family in families)
        yield age

    def _gpu_health_gauges(self, gpus: dict[int, Gpu], samples: dict[int, dict]):
        """Health of the GPUs with a fresh sample: the state's fields, the newest XID, the throttle mask."""
        families = [(field, _gauge(name, doc, GPU_LABELS)) for field, name, doc in GPU_HEALTH_GAUGES]
        xid = _gauge("DCGM_FI_DEV_XID_ERRORS", "Code of the GPU's newest XID error; 0 when none was stored",
                     GPU_LABELS)
        throttle = _gauge("DCGM_FI_DEV_CLOCK_THROTTLE_REASONS",
                          "Why the GPU's clocks are held back: NVML's clocks event reasons bitmask", GPU_LABELS)
        # Whole tables (one row per GPU or running vGPU), as the GPUs and vGPUs are read above.
        states = {row["gpu_id"]: row for row in GpuHealthState.objects.order_by().values()}
        codes = latest_xid_codes()
        for gpu_id, gpu in gpus.items():
            labels = [gpu.host.name, gpu.uuid, gpu.pci_bus_id, gpu.gpu_model.name]
            if samples[gpu_id].get("clocks_event_reasons") is not None:
                throttle.add_metric(labels, samples[gpu_id]["clocks_event_reasons"])
            state = states.get(gpu_id)
            if state is None and gpu_id not in codes:
                continue
            xid.add_metric(labels, codes.get(gpu_id, 0))
            for field, family in families:
                if state is not None and (value := _number(field, state[field])) is not None:
                    family.add_metric(labels, value)
        yield from (family for _, family in families)
        yield from (xid, throttle)

    def _vgpu_health_gauges(self, gpus: dict[int, Gpu], vgpus: list[Vgpu]):
        """Licence and guest of the running vGPUs (as their host's agent reports them) on fresh GPUs."""
        families = [(field, _gauge(name, doc, VGPU_LABELS)) for field, name, doc in VGPU_HEALTH_GAUGES]
        states = {(row["vm_id"], row["gpu_id"]): row
                  for row in VgpuHealthState.objects.order_by().values()}
        for vgpu in vgpus:
            gpu, state = gpus.get(vgpu.gpu_id), states.get((vgpu.vm_id, vgpu.gpu_id))
            if gpu is None or state is None:
                continue
            artist = vgpu.vm.artist.name if vgpu.vm.artist else ""
            labels = [gpu.host.name, gpu.uuid, vgpu.vm.name, artist, vgpu.profile.name]
            for field, family in families:
                if (value := _number(field, state[field])) is not None:
                    family.add_metric(labels, value)
        yield from (family for _, family in families)

    def _driver_gauges(self, gpus: dict[int, Gpu]):
        """One info series per host with fresh GPUs whose agent reports its NVIDIA software."""
        info = _gauge("host_driver_info", "The NVIDIA driver and vGPU manager versions of the host (always 1)",
                      ["host", "driver_version", "vgpu_manager_version", "cuda_driver_version"])
        hosts = {gpu.host_id: gpu.host.name for gpu in gpus.values()}
        for row in HostDriverState.objects.order_by("host_id"):
            if row.host_id not in hosts:
                continue
            info.add_metric([hosts[row.host_id], row.driver_version or "", row.vgpu_manager_version or "",
                             str(row.cuda_driver_version or "")], 1)
        yield info

    def _vgpu_gauges(self, gpus: dict[int, Gpu], vgpus: list[Vgpu], samples: dict[tuple[int, int], dict]):
        families = [(field, _gauge(name, doc, VGPU_LABELS)) for field, name, doc in VGPU_GAUGES]
        profile_fb = _gauge("vgpu_profile_fb_mib", "Frame buffer the vGPU's profile gives it, MiB", VGPU_LABELS)
        for vgpu in vgpus:
            gpu = gpus.get(vgpu.gpu_id)
            if gpu is None:
                continue
            artist = vgpu.vm.artist.name if vgpu.vm.artist else ""
            labels = [gpu.host.name, gpu.uuid, vgpu.vm.name, artist, vgpu.profile.name]
            profile_fb.add_metric(labels, vgpu.profile.fb_mib)
            sample = samples.get((vgpu.vm_id, vgpu.gpu_id))
            if sample is None:
                continue
            for field, family in families:
                if sample[field] is not None:
                    family.add_metric(labels, sample[field])
        yield from (family for _, family in families)
        yield profile_fb

    def _guest_gauges(self, samples: dict[int, dict]):
        """Each VM's newest fresh guest reading, labelled with its host (where the inventory
        places it now; empty when unplaced), name and artist."""
        families = [(field, _gauge(name, doc, VM_LABELS)) for field, name, doc in GUEST_GAUGES]
        # Every VM, as the GPUs and vGPUs are read: one query whether or not any reading is fresh.
        for vm in VirtualMachine.objects.select_related("host", "artist").order_by("name"):
            sample = samples.get(vm.pk)
            if sample is None:
                continue
            labels = [vm.host.name if vm.host else "", vm.name, vm.artist.name if vm.artist else ""]
            for field, family in families:
                if sample[field] is not None:
                    family.add_metric(labels, sample[field])
        yield from (family for _, family in families)

    def _capacity_gauges(self, gpus: dict[int, Gpu], vgpus: list[Vgpu]):
        count = _gauge("gpus", "Physical GPUs in the inventory", ["gpu_model", "mode"])
        total = _gauge("fb_total_mib", "Frame buffer of the GPUs in vGPU mode, MiB", ["gpu_model"])
        placed = _gauge("vgpus_placed", "vGPUs placed on GPUs", ["gpu_model"])
        allocated = _gauge("fb_allocated_mib", "Frame buffer given to placed vGPUs (their profiles), MiB",
                           ["gpu_model"])
        gpu_count = Counter((g.gpu_model.name, g.mode) for g in gpus.values())
        fb_total: dict[str, int] = defaultdict(int)
        for gpu in gpus.values():
            if gpu.mode == GpuMode.VGPU:
                fb_total[gpu.gpu_model.name] += gpu.gpu_model.fb_mib
        vgpu_count: Counter[str] = Counter()
        fb_allocated: dict[str, int] = defaultdict(int)
        for vgpu in vgpus:
            if (gpu := gpus.get(vgpu.gpu_id)) is not None:
                vgpu_count[gpu.gpu_model.name] += 1
                fb_allocated[gpu.gpu_model.name] += vgpu.profile.fb_mib
        for (model, mode), n in sorted(gpu_count.items()):
            count.add_metric([model, mode], n)
        for model in sorted(fb_total):
            total.add_metric([model], fb_total[model])
            placed.add_metric([model], vgpu_count[model])
            allocated.add_metric([model], fb_allocated[model])
        yield from (count, total, placed, allocated)

    def _agent_gauges(self, now: datetime):
        labels = ["agent", "kind", "host"]
        up = _gauge("agent_up", "1 when the agent's last collection succeeded recently, else 0", labels)
        age = _gauge("agent_last_seen_age_seconds", "Seconds since the agent's last successful collection", labels)
        for agent in Agent.objects.filter(enabled=True).select_related("host").order_by("name"):
            values = [agent.name, agent.kind, agent.host.name if agent.host else ""]
            up.add_metric(values, 1 if agent.status == AgentStatus.OK else 0)
            if agent.last_seen is not None:
                age.add_metric(values, max(0.0, (now - agent.last_seen).total_seconds()))
        yield from (up, age)


UNAUTHORIZED = ("/metrics needs `Authorization: Bearer <METRICS_TOKEN>`, or `Authorization: Token <key>` "
                "of a staff user's API token.\n")


def _plain(text: str, status: int) -> HttpResponse:
    return HttpResponse(text, status=status, content_type="text/plain; charset=utf-8")


def _unauthorized(reason: str = "") -> HttpResponse:
    response = _plain(f"{reason}\n{UNAUTHORIZED}" if reason else UNAUTHORIZED, 401)
    response["WWW-Authenticate"] = 'Bearer realm="metrics", Token realm="api"'
    return response


def refusal(request: HttpRequest) -> HttpResponse | None:
    """None when the request may read the exposition, else the answer that refuses it.

    A bearer token must equal METRICS_TOKEN (compared in constant time; with no METRICS_TOKEN set
    no bearer token is right, an agent's included). A `Token` key must be a live API token of
    an active user (as the API checks it; a revoked or expired one is told why) whose scope
    reads (read or write: an ingest token reads nothing). Without either header, the browser
    session counts. The user so found must be staff: the exposition is fleet-wide.
    """
    if settings.METRICS_PUBLIC:
        return None
    scheme, _, credentials = request.headers.get("Authorization", "").partition(" ")
    credentials = credentials.strip()
    if scheme.lower() == "bearer":
        expected = settings.METRICS_TOKEN
        if expected and hmac.compare_digest(credentials.encode(), expected.encode()):
            return None
        return _unauthorized()
    if scheme.lower() == "token":
        try:
            token = api_tokens.authenticate(credentials)
        except api_tokens.KeyRefused as refused:
            return _unauthorized(str(refused))
        scope_refusal = token_rules.scope_refusal(token.scope, request.method, ingest_view=False)
        if scope_refusal is not None:
            return _plain(scope_refusal + "\n", 403)
        user = token.user
    else:
        user = request.user
        if not user.is_authenticated:
            return _unauthorized()
    if not is_fleet_admin(user):
        return _plain("Only staff may read /metrics: it covers the whole fleet.\n", 403)
    return None


@never_cache
def metrics_view(request: HttpRequest) -> HttpResponse:
    """The exposition (text format 0.0.4), for the holders of `refusal`'s credentials."""
    if (refused := refusal(request)) is not None:
        return refused
    registry = CollectorRegistry(auto_describe=False)
    registry.register(FleetCollector())
    return HttpResponse(generate_latest(registry), content_type=CONTENT_TYPE_LATEST)

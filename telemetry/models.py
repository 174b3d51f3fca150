"""Telemetry: the sources we collect from, raw GPU and vGPU samples, rollups and drift.

Raw samples are unique per entity and timestamp, so a repeated poll or a re-sent document
stores nothing twice. Charts and sizing read the rollups (5-minute and 1-hour buckets with
avg, max and p95), which resumable tasks build behind a checkpoint.
"""

import hashlib
import hmac
import secrets
from urllib.parse import urlsplit

from django.conf import settings
from django.core.exceptions import ValidationError
from django.db import models
from django.db.models import Q
from django.utils import timezone

from fleet.models import Gpu, Host, Vgpu, VirtualMachine


class AgentKind(models.TextChoices):
    NVML = "nvml", "Fleet agent (NVML)"
    DCGM_EXPORTER = "dcgm-exporter", "dcgm-exporter (Prometheus text)"
    NVIDIA_SMI = "nvidia-smi", "nvidia-smi -q -x documents (pushed)"


class AgentStatus(models.TextChoices):
    NEW = "new", "Never seen"
    OK = "ok", "OK"
    STALE = "stale", "Stale"
    ERROR = "error", "Error"
    DISABLED = "disabled", "Disabled"


def validate_agent_url(value: str) -> None:
    """An http(s) URL with a host name. Unlike URLField, accepts short studio host names
    such as http://gpu-01:9410, which Django's URLValidator refuses for lack of a domain."""
    try:
        parts = urlsplit(value)
        port = parts.port
    except ValueError as exc:
        raise ValidationError(f"{value!r} is not a valid URL: {exc}") from exc
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ValidationError(f"{value!r} is not an http:// or https:// URL with a host name")
    if port == 0:
        raise ValidationError(f"{value!r} has no usable port")


class Agent(models.Model):
    """A source of samples: an agent we poll (nvml, dcgm-exporter) or one that pushes (nvidia-smi).

    Its bearer token is never stored: it is derived from AGENT_TOKEN_KEY and a per-agent
    salt (`token`), so the collector can present it to the agent while a copy of the
    database alone reveals none; `token_sha256` lets ingest verify a pushed token cheaply.

    Its scope is what its token may write (`telemetry.ingest`): bound to a host, the series
    of that host's GPUs and of the VMs placed on them; bound to a VM (in-guest pushes), that
    VM's vGPU readings only; bound to neither, nothing but a first report introducing a host
    the inventory does not have yet, which binds it to that host.
    """

    name = models.CharField(max_length=100, unique=True)
    kind = models.CharField(max_length=20, choices=AgentKind.choices, default=AgentKind.NVML)
    url = models.CharField(
        "URL", max_length=300, blank=True, validators=[validate_agent_url],
        help_text="Base URL polled: http://host:9410 (agent) or http://host:9400/metrics (dcgm-exporter); "
                  "empty for nvidia-smi pushes",
    )
    host = models.ForeignKey(
        Host, null=True, blank=True, on_delete=models.SET_NULL, related_name="agents",
        help_text="Host whose GPUs this source reports; it writes only this host's series, and discovered GPUs "
                  "attach to it. Empty: set by the agent's first report, if that names a host not in the inventory",
    )
    # CASCADE, not SET_NULL: a guest's token must die with its VM, never fall back to an unbound agent.
    vm = models.ForeignKey(
        VirtualMachine, null=True, blank=True, on_delete=models.CASCADE, related_name="agents", verbose_name="VM",
        help_text="For pushes from inside a VM (kind nvidia-smi, no host): the one VM whose vGPU readings this "
                  "agent may write, and nothing else",
    )
    enabled = models.BooleanField(default=True)
    timeout_s = models.FloatField("timeout, s", default=3.0)
    token_salt = models.CharField(max_length=64, editable=False)
    token_sha256 = models.CharField(max_length=64, editable=False, db_index=True)
    last_seen = models.DateTimeField(null=True, blank=True, help_text="Last successful collection")
    last_attempt = models.DateTimeField(null=True, blank=True)
    last_error = models.TextField(blank=True)
    last_error_at = models.DateTimeField(null=True, blank=True)
    consecutive_failures = models.PositiveIntegerField(default=0)
    clock_skew_s = models.FloatField(null=True, blank=True, help_text="Agent clock minus ours at last poll")
    scheduler_write = models.BooleanField(
        default=False, editable=False,
        help_text="The agent said in its last accepted report that it holds a write token (--write-token-file), "
                  "so the dashboard may apply scheduler policies through it",
    )
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["name"]
        constraints = [
            models.CheckConstraint(
                condition=Q(kind="nvidia-smi") | ~Q(url=""), name="agent_polled_kinds_need_url",
            ),
            models.CheckConstraint(condition=Q(timeout_s__gt=0), name="agent_timeout_positive"),
            models.CheckConstraint(
                condition=Q(host__isnull=True) | Q(vm__isnull=True), name="agent_bound_to_host_or_vm",
                violation_error_message="An agent is bound to a host or to a VM, not to both.",
            ),
            models.CheckConstraint(
                condition=Q(vm__isnull=True) | Q(kind="nvidia-smi"), name="agent_vm_bound_pushes",
                violation_error_message="An agent bound to a VM pushes that VM's in-guest nvidia-smi documents: "
                                        "its kind is nvidia-smi.",
            ),
        ]
        indexes = [models.Index(fields=["enabled", "kind"], name="agent_enabled_kind_idx")]

    def __str__(self):
        return self.name

    def save(self, *args, **kwargs):
        if not self.token_salt:
            self.rotate_token()
        super().save(*args, **kwargs)

    @property
    def token(self) -> str:
        """The bearer token the agent expects; derived, so rotating the salt revokes it."""
        key = (settings.AGENT_TOKEN_KEY or settings.SECRET_KEY).encode()
        return hmac.new(key, f"agent:{self.token_salt}".encode(), hashlib.sha256).hexdigest()

    def rotate_token(self) -> str:
        """Give the agent a new token (call save() afterwards) and return it: shown once."""
        self.token_salt = secrets.token_hex(16)
        self.token_sha256 = hashlib.sha256(self.token.encode()).hexdigest()
        return self.token

    @property
    def status(self) -> str:
        """ok / stale / error / new / disabled, judged from the last attempt and success."""
        if not self.enabled:
            return AgentStatus.DISABLED
        if self.last_error_at and (self.last_seen is None or self.last_error_at > self.last_seen):
            return AgentStatus.ERROR
        if self.last_seen is None:
            return AgentStatus.NEW
        stale_after = timezone.timedelta(seconds=settings.TELEMETRY_STALE_AFTER_S)
        if timezone.now() - self.last_seen > stale_after:
            return AgentStatus.STALE
        return AgentStatus.OK


#: The sample tables' references to the inventory are not database constraints. A foreign key
#: check costs PostgreSQL ~4 µs per referenced row at every commit (a locking lookup of the
#: parent row): three a vGPU reading, two thirds of the server's work to store one
#: (docs/benchmarks.md, issue 21 item 1). Django still deletes a GPU's or VM's samples with it
#: (`on_delete` runs in Django) and clears `vgpu` when a vGPU row goes. What the constraint
#: guarded is a poll whose report was mapped just before its GPU or VM was deleted and committed
#: just after: its few rows then name an entity that no longer exists. Every reader of samples
#: either starts from an inventory row or keeps only the entities that exist (rollups, alerts,
#: drift, the latest readings: telemetry/tests/test_orphan_samples.py), and retention drops them.
SAMPLE_REFERENCE = {"db_constraint": False}


class GpuSample(models.Model):
    """One reading of a physical GPU. A metric the GPU does not support is NULL, never 0.

    Columns hold what NVML reports without loss: utilization percentages, temperatures, frame
    buffer MiB and clocks are whole numbers (NVML answers in whole %, °C, MiB and MHz); power
    keeps its milliwatts. On PostgreSQL the table is partitioned by day (`telemetry.partitions`).
    """

    id = models.BigAutoField(primary_key=True)
    # No index of its own: the unique (gpu, ts) key serves lookups and cascades by GPU.
    gpu = models.ForeignKey(Gpu, on_delete=models.CASCADE, related_name="samples", db_index=False,
                            **SAMPLE_REFERENCE)
    ts = models.DateTimeField()
    util_gpu = models.SmallIntegerField(null=True)
    util_mem = models.SmallIntegerField(null=True)
    fb_used_mib = models.IntegerField(null=True)
    fb_total_mib = models.IntegerField(null=True)
    enc_util = models.SmallIntegerField(null=True)
    dec_util = models.SmallIntegerField(null=True)
    temp_c = models.SmallIntegerField(null=True)
    power_w = models.FloatField(null=True)
    sm_clock_mhz = models.IntegerField(null=True)
    # NVML's clocks event (throttle) reasons bitmask, so "throttled for M minutes" is read back
    # from the series (telemetry.payload.THROTTLE_FLAGS names the bits).
    clocks_event_reasons = models.BigIntegerField(null=True)

    class Meta:
        ordering = ["gpu_id", "ts"]
        constraints = [models.UniqueConstraint(fields=["gpu", "ts"], name="gpusample_unique_gpu_ts")]
        # Retention deletes by age across all GPUs.
        indexes = [models.Index(fields=["ts"], name="gpusample_ts_idx")]

    def __str__(self):
        return f"GPU {self.gpu_id} at {self.ts:%Y-%m-%d %H:%M:%S}"


class VgpuSample(models.Model):
    """One reading of one vGPU, kept per VM (the sizing subject) and GPU.

    `vgpu` points at the inventory row while it exists; a VM's history survives a resize
    that replaces its vGPU row. Utilization figures are shares of the physical GPU, in whole
    percents as NVML reports them; frame buffer in whole MiB. Partitioned by day on PostgreSQL.
    """

    id = models.BigAutoField(primary_key=True)
    # No index of its own: the unique (vm, gpu, ts) key starts with it.
    vm = models.ForeignKey(VirtualMachine, on_delete=models.CASCADE, related_name="samples", db_index=False,
                           **SAMPLE_REFERENCE)
    gpu = models.ForeignKey(Gpu, on_delete=models.CASCADE, related_name="vgpu_samples", **SAMPLE_REFERENCE)
    vgpu = models.ForeignKey(Vgpu, null=True, blank=True, on_delete=models.SET_NULL, related_name="samples",
                             **SAMPLE_REFERENCE)
    ts = models.DateTimeField()
    fb_used_mib = models.IntegerField(null=True)
    util_gpu = models.SmallIntegerField(null=True)
    util_mem = models.SmallIntegerField(null=True)
    enc_util = models.SmallIntegerField(null=True)
    dec_util = models.SmallIntegerField(null=True)

    class Meta:
        ordering = ["vm_id", "ts"]
        constraints = [models.UniqueConstraint(fields=["vm", "gpu", "ts"], name="vgpusample_unique_vm_gpu_ts")]
        indexes = [models.Index(fields=["ts"], name="vgpusample_ts_idx")]

    def __str__(self):
        return f"VM {self.vm_id} on GPU {self.gpu_id} at {self.ts:%Y-%m-%d %H:%M:%S}"


class GuestSample(models.Model):
    """One reading of a VM's guest CPU and memory, read through its hypervisor link (no agent in
    the guest; `telemetry.guest_rates` makes the figures from the hypervisor's counters).

    Shares in percent over the interval before `ts`: `vcpu_util` of all its vCPUs, `vcpu_max_util`
    of the busiest one, `cpu_steal_pct` waiting for a host CPU. `ram_used_mib` is what the guest
    uses of `ram_mib`, its allocation then. NULL where the hypervisor reports nothing (a guest
    without the balloon driver reports no memory use, which is not 0)."""

    id = models.BigAutoField(primary_key=True)
    # No index of its own: the unique (vm, ts) key starts with it.
    vm = models.ForeignKey(VirtualMachine, on_delete=models.CASCADE, related_name="guest_samples", db_index=False,
                           **SAMPLE_REFERENCE)
    ts = models.DateTimeField()
    vcpus = models.SmallIntegerField()
    ram_mib = models.IntegerField()
    vcpu_util = models.FloatField(null=True)
    vcpu_max_util = models.FloatField(null=True)
    cpu_steal_pct = models.FloatField(null=True)
    ram_used_mib = models.IntegerField(null=True)

    class Meta:
        ordering = ["vm_id", "ts"]
        constraints = [models.UniqueConstraint(fields=["vm", "ts"], name="guestsample_unique_vm_ts")]
        indexes = [models.Index(fields=["ts"], name="guestsample_ts_idx")]

    def __str__(self):
        return f"VM {self.vm_id} guest at {self.ts:%Y-%m-%d %H:%M:%S}"

    @property
    def ram_used_pct(self) -> float | None:
        if self.ram_used_mib is None or not self.ram_mib:
            return None
        return 100.0 * self.ram_used_mib / self.ram_mib


ROLLUP_STEPS_S = (300, 3600)


class RollupFields(models.Model):
    """Aggregates of one bucket: avg, max and p95 of utilization and frame buffer."""

    step_s = models.PositiveIntegerField(help_text="Bucket width: 300 or 3600 seconds")
    bucket = models.DateTimeField(help_text="Start of the bucket")
    samples = models.PositiveIntegerField()
    util_gpu_avg = models.FloatField(null=True)
    util_gpu_max = models.FloatField(null=True)
    util_gpu_p95 = models.FloatField(null=True)
    util_mem_avg = models.FloatField(null=True)
    util_mem_max = models.FloatField(null=True)
    fb_used_mib_avg = models.FloatField(null=True)
    fb_used_mib_max = models.FloatField(null=True)
    fb_used_mib_p95 = models.FloatField(null=True)
    enc_util_avg = models.FloatField(null=True)
    enc_util_max = models.FloatField(null=True)
    dec_util_avg = models.FloatField(null=True)
    dec_util_max = models.FloatField(null=True)

    class Meta:
        abstract = True


class GpuRollup(RollupFields):
    """A physical GPU over one bucket, with its temperature, power and clock."""

    id = models.BigAutoField(primary_key=True)
    gpu = models.ForeignKey(Gpu, on_delete=models.CASCADE, related_name="rollups")
    fb_total_mib = models.FloatField(null=True)
    temp_c_avg = models.FloatField(null=True)
    temp_c_max = models.FloatField(null=True)
    power_w_avg = models.FloatField(null=True)
    power_w_max = models.FloatField(null=True)
    sm_clock_mhz_avg = models.FloatField(null=True)

    class Meta:
        ordering = ["gpu_id", "step_s", "bucket"]
        constraints = [
            models.UniqueConstraint(fields=["gpu", "step_s", "bucket"], name="gpurollup_unique_gpu_step_bucket"),
        ]
        indexes = [models.Index(fields=["step_s", "bucket"], name="gpurollup_step_bucket_idx")]

    def __str__(self):
        return f"GPU {self.gpu_id} {self.step_s}s bucket {self.bucket:%Y-%m-%d %H:%M}"


class VmRollup(RollupFields):
    """A VM's vGPUs over one bucket: frame buffer summed over its vGPUs, utilization their max."""

    id = models.BigAutoField(primary_key=True)
    vm = models.ForeignKey(VirtualMachine, on_delete=models.CASCADE, related_name="rollups")
    profile_fb_mib = models.FloatField(null=True, help_text="Frame buffer the VM's profiles gave it then")
    partial = models.BooleanField(
        default=False,
        help_text="Some reading in the bucket lacked one of the VM's vGPUs: its frame buffer is understated, and "
                  "right-sizing leaves the bucket out")

    class Meta:
        ordering = ["vm_id", "step_s", "bucket"]
        constraints = [
            models.UniqueConstraint(fields=["vm", "step_s", "bucket"], name="vmrollup_unique_vm_step_bucket"),
        ]
        indexes = [models.Index(fields=["step_s", "bucket"], name="vmrollup_step_bucket_idx")]

    def __str__(self):
        return f"VM {self.vm_id} {self.step_s}s bucket {self.bucket:%Y-%m-%d %H:%M}"


class GuestRollup(models.Model):
    """A VM's guest CPU and memory over one bucket (from `GuestSample`): the share of its vCPUs and
    of its busiest vCPU (avg, p95, max), the time they waited for a host CPU, and the memory it
    used against its allocation."""

    id = models.BigAutoField(primary_key=True)
    vm = models.ForeignKey(VirtualMachine, on_delete=models.CASCADE, related_name="guest_rollups")
    step_s = models.PositiveIntegerField(help_text="Bucket width: 300 or 3600 seconds")
    bucket = models.DateTimeField(help_text="Start of the bucket")
    samples = models.PositiveIntegerField()
    vcpus = models.SmallIntegerField(help_text="The VM's vCPUs (the most in the bucket)")
    ram_mib = models.IntegerField(help_text="The VM's RAM allocation (the most in the bucket), MiB")
    vcpu_util_avg = models.FloatField(null=True)
    vcpu_util_p95 = models.FloatField(null=True)
    vcpu_util_max = models.FloatField(null=True)
    vcpu_max_util_avg = models.FloatField(null=True)
    vcpu_max_util_p95 = models.FloatField(null=True)
    vcpu_max_util_max = models.FloatField(null=True)
    cpu_steal_pct_avg = models.FloatField(null=True)
    cpu_steal_pct_max = models.FloatField(null=True)
    ram_used_mib_avg = models.FloatField(null=True)
    ram_used_mib_p95 = models.FloatField(null=True)
    ram_used_mib_max = models.FloatField(null=True)

    class Meta:
        ordering = ["vm_id", "step_s", "bucket"]
        constraints = [
            models.UniqueConstraint(fields=["vm", "step_s", "bucket"], name="guestrollup_unique_vm_step_bucket"),
        ]
        indexes = [models.Index(fields=["step_s", "bucket"], name="guestrollup_step_bucket_idx")]

    def __str__(self):
        return f"VM {self.vm_id} guest {self.step_s}s bucket {self.bucket:%Y-%m-%d %H:%M}"


class RollupCheckpoint(models.Model):
    """How far a rollup series is complete: buckets before `done_until` are final.

    A task resumes from here and redoes a half-finished bucket, as Zulip's analytics do.
    """

    name = models.CharField(max_length=40, unique=True)
    done_until = models.DateTimeField()
    updated_at = models.DateTimeField(auto_now=True)

    def __str__(self):
        return f"{self.name} until {self.done_until:%Y-%m-%d %H:%M}"


class GpuStrip(models.Model):
    """One GPU's UTC day of one heatmap series (a % metric and statistic of the 5-minute rollups,
    e.g. `util_gpu_avg`) as the typed heatmap's codes: one byte a 5-minute bucket, 288 a day,
    `telemetry.heatmap_codec.NULL_CODE` where the bucket has no reading.

    Written by `build_rollups` with the rollups it writes (`telemetry.strips`), so the GPU x
    time heatmap at 5-minute steps reads two rows a GPU for 24 h instead of 288 rollups.
    """

    id = models.BigAutoField(primary_key=True)
    gpu = models.ForeignKey(Gpu, on_delete=models.CASCADE, related_name="strips")
    series = models.CharField(max_length=24, help_text="The rollup column the codes encode, e.g. util_gpu_avg")
    day = models.DateField(help_text="UTC day of the first bucket")
    codes = models.BinaryField(help_text="One byte a 5-minute bucket of the day; 255: no reading")

    class Meta:
        ordering = ["day", "series", "gpu_id"]
        constraints = [
            # Day first: a heatmap reads one series of one or two days; retention deletes by day.
            models.UniqueConstraint(fields=["day", "series", "gpu"], name="gpustrip_unique_day_series_gpu"),
        ]

    def __str__(self):
        return f"GPU {self.gpu_id} {self.series} {self.day:%Y-%m-%d}"


class StripCoverage(models.Model):
    """From when on every 5-minute GPU rollup written has its strips (`GpuStrip`): the heatmap
    reads strips only for a range starting at or after `since`, and rollups before it otherwise.
    Created by the first `build_rollups` run that writes strips; `manage.py build_heatmap_strips`
    moves it back over older rollups, retention forward past what it deleted."""

    name = models.CharField(max_length=40, unique=True)
    since = models.DateTimeField()
    updated_at = models.DateTimeField(auto_now=True)

    def __str__(self):
        return f"{self.name} since {self.since:%Y-%m-%d %H:%M}"


class DriftKind(models.TextChoices):
    UNKNOWN_GPU = "unknown_gpu", "GPU reported but not in inventory (discovered)"
    GPU_ELSEWHERE = "gpu_elsewhere", "GPU reported by another host than the inventory says (not stored)"
    GPU_MODEL = "gpu_model", "GPU model differs from the inventory"
    UNKNOWN_VM = "unknown_vm", "vGPU of a VM the inventory does not know"
    VGPU_MISSING = "vgpu_missing", "vGPU running that the inventory does not declare"
    PROFILE = "profile", "vGPU type differs from the declared profile"
    OUT_OF_SCOPE = "out_of_scope", "Reading of a VM or GPU outside the agent's host or VM (not stored)"
    VM_UUID_MISMATCH = "vm_uuid_mismatch", "vGPU of an unknown VM UUID named like an inventory VM (not stored)"


class Drift(models.Model):
    """A difference between what a source reports and what the inventory declares.

    Shown to admins, never applied silently: the inventory stays the admin's word.
    """

    agent = models.ForeignKey(Agent, null=True, blank=True, on_delete=models.CASCADE, related_name="drifts")
    kind = models.CharField(max_length=20, choices=DriftKind.choices)
    subject = models.CharField(max_length=120, help_text="UUID or name the difference is about")
    detail = models.TextField()
    reported = models.JSONField(default=dict, blank=True)
    first_seen = models.DateTimeField(default=timezone.now)
    last_seen = models.DateTimeField(default=timezone.now)
    resolved_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-last_seen"]
        constraints = [
            models.UniqueConstraint(
                fields=["kind", "subject"], condition=Q(resolved_at__isnull=True), name="drift_unique_open",
            ),
        ]

    def __str__(self):
        return f"{self.get_kind_display()}: {self.subject}"


# -- health (issue 19) --------------------------------------------------------------------------
# State rows hold the latest reading and are written only when it changes (telemetry.ingest), so
# a healthy fleet costs the hot path one read per batch; `changed_at` is when it last changed.
# A field NULL is "not told": `unsupported` names the fields the GPU or driver does not support.


class HostDriverState(models.Model):
    """The NVIDIA software a host's agent reports: driver, vGPU manager, NVML, CUDA."""

    host = models.OneToOneField(Host, primary_key=True, on_delete=models.CASCADE, related_name="driver_state")
    driver_version = models.CharField(max_length=40, null=True)
    vgpu_manager_version = models.CharField("vGPU manager version", max_length=40, null=True)
    nvml_version = models.CharField("NVML version", max_length=40, null=True)
    cuda_driver_version = models.PositiveIntegerField("CUDA driver version", null=True)
    unsupported = models.JSONField(default=list)
    changed_at = models.DateTimeField()

    def __str__(self):
        return f"{self.host_id}: driver {self.driver_version or '?'}"


class GpuHealthState(models.Model):
    """A physical GPU's latest health reading (telemetry.payload.GpuHealth, without its events)."""

    gpu = models.OneToOneField(Gpu, primary_key=True, on_delete=models.CASCADE, related_name="health_state")
    ecc_mode = models.CharField("ECC mode", max_length=10, null=True)
    ecc_corrected_volatile = models.BigIntegerField(null=True)
    ecc_uncorrected_volatile = models.BigIntegerField(null=True)
    ecc_corrected_aggregate = models.BigIntegerField(null=True)
    ecc_uncorrected_aggregate = models.BigIntegerField(null=True)
    retired_pages_sbe = models.BigIntegerField(null=True)
    retired_pages_dbe = models.BigIntegerField(null=True)
    retired_pages_pending = models.BooleanField(null=True)
    remapped_rows_correctable = models.BigIntegerField(null=True)
    remapped_rows_uncorrectable = models.BigIntegerField(null=True)
    remapped_rows_pending = models.BooleanField(null=True)
    remapped_rows_failure = models.BooleanField(null=True)
    throttle_reasons = models.JSONField(null=True)
    pcie_replay_counter = models.BigIntegerField("PCIe replay counter", null=True)
    fan_speed_pct = models.FloatField(null=True)
    temp_slowdown_c = models.FloatField(null=True)
    temp_shutdown_c = models.FloatField(null=True)
    power_limit_w = models.FloatField(null=True)
    performance_state = models.CharField(max_length=8, null=True)
    unsupported = models.JSONField(default=list)
    changed_at = models.DateTimeField()

    def __str__(self):
        return f"GPU {self.gpu_id} health"


class VgpuHealthState(models.Model):
    """One running vGPU's licence and guest, as NVML on its host reports them.

    Keyed like the samples, per VM and GPU; a row goes when the host's agent no longer reports
    that vGPU (the VM stopped or moved), so the rows are the vGPUs running now.
    """

    vm = models.ForeignKey(VirtualMachine, on_delete=models.CASCADE, related_name="vgpu_health")
    gpu = models.ForeignKey(Gpu, on_delete=models.CASCADE, related_name="vgpu_health")
    vgpu = models.ForeignKey(Vgpu, null=True, blank=True, on_delete=models.SET_NULL, related_name="health_states")
    type_name = models.CharField(max_length=60, null=True)
    license_state = models.CharField(max_length=12, null=True)
    license_expiry = models.DateTimeField(null=True)
    guest_driver_version = models.CharField(max_length=40, null=True)
    frame_rate_limit = models.PositiveIntegerField(null=True)
    encoder_sessions = models.PositiveIntegerField(null=True)
    guest_info_state = models.CharField(max_length=16, null=True)
    unsupported = models.JSONField(default=list)
    changed_at = models.DateTimeField()

    class Meta:
        ordering = ["vm_id", "gpu_id"]
        constraints = [models.UniqueConstraint(fields=["vm", "gpu"], name="vgpuhealth_unique_vm_gpu")]
        indexes = [models.Index(fields=["license_state"], name="vgpuhealth_license_idx")]

    def __str__(self):
        return f"VM {self.vm_id} on GPU {self.gpu_id}: {self.license_state or 'licence unknown'}"


class XidError(models.Model):
    """A critical XID error a GPU's driver raised (code and time by the agent's clock)."""

    id = models.BigAutoField(primary_key=True)
    gpu = models.ForeignKey(Gpu, on_delete=models.CASCADE, related_name="xid_errors")
    code = models.PositiveIntegerField()
    at = models.DateTimeField()
    received_at = models.DateTimeField(default=timezone.now)

    class Meta:
        ordering = ["-at"]
        constraints = [models.UniqueConstraint(fields=["gpu", "code", "at"], name="xiderror_unique_gpu_code_at")]
        indexes = [models.Index(fields=["received_at"], name="xiderror_received_idx")]

    def __str__(self):
        return f"XID {self.code} on GPU {self.gpu_id} at {self.at:%Y-%m-%d %H:%M:%S}"

"""Fleet inventory: GPU models and their vGPU profiles, hosts, GPUs, artists, VMs and vGPUs;
and the API tokens scripts sign in with.

Whether a vGPU fits is not decided here but in `fleet.placement`; these models only keep
one row's invariants (database constraints) and turn rows into the placement dataclasses.
"""

import uuid

from django.conf import settings
from django.core.exceptions import ValidationError
from django.core.validators import MaxValueValidator, MinValueValidator
from django.db import models
from django.db.models import Q
from django.utils import timezone

from fleet import hypervisor_link, placement, token_rules
from fleet.choices import (
    AuditSource,
    GpuMode,
    Hypervisor,
    ResizeStatus,
    SchedulerApplyState,
    SchedulerPolicyName,
    SchedulerScope,
    Series,
    SizeMode,
    TokenScope,
    TokenState,
    UserType,
    Workflow,
)
from fleet.pci import InvalidPciBusId, canonical_pci_bus_id, normalize_pci_bus_id


class GpuModel(models.Model):
    """A physical GPU model (board) as NVIDIA's vGPU tables describe it.

    `name` is the product name nvidia-smi reports (e.g. "Quadro RTX 6000"), so discovered GPUs
    map to it; `code` is the board prefix of its profile names (e.g. "RTX6000").
    """

    name = models.CharField(max_length=100, unique=True)
    code = models.CharField(max_length=40, unique=True)
    fb_mib = models.PositiveIntegerField(help_text="Frame buffer of one GPU, MiB")
    gpus_per_board = models.PositiveSmallIntegerField(default=1)
    mixed_size_capable = models.BooleanField(default=False)
    multi_vgpu_full_only = models.BooleanField(
        default=False,
        help_text="A VM with several vGPUs may only combine full-GPU profiles (Turing boards)",
    )

    class Meta:
        ordering = ["name"]
        verbose_name = "GPU model"
        constraints = [
            models.CheckConstraint(condition=Q(fb_mib__gt=0), name="gpumodel_fb_positive"),
            models.CheckConstraint(condition=Q(gpus_per_board__gte=1), name="gpumodel_gpus_per_board_min_1"),
        ]

    def __str__(self):
        return self.name

    def to_spec(self) -> placement.GpuModelSpec:
        return placement.GpuModelSpec(
            name=self.name, fb_mib=self.fb_mib,
            mixed_size_capable=self.mixed_size_capable,
            multi_vgpu_full_only=self.multi_vgpu_full_only,
        )


class VgpuProfile(models.Model):
    """A vGPU type of one GPU model (e.g. RTX6000-12Q) and how many fit on one GPU."""

    name = models.CharField(max_length=60, unique=True)
    gpu_model = models.ForeignKey(
        GpuModel, on_delete=models.PROTECT, related_name="profiles", verbose_name="GPU model",
    )
    series = models.CharField(max_length=1, choices=Series.choices)
    fb_mib = models.PositiveIntegerField(help_text="Frame buffer of one vGPU, MiB")
    max_per_gpu = models.PositiveSmallIntegerField(help_text="Maximum per GPU in equal-size mode")
    max_per_gpu_mixed = models.PositiveSmallIntegerField(
        null=True, blank=True, help_text="Maximum per GPU in mixed-size mode; empty where not offered",
    )
    max_per_vm = models.PositiveSmallIntegerField(
        default=placement.MAX_VGPUS_PER_VM,
        validators=[MinValueValidator(1), MaxValueValidator(placement.MAX_VGPUS_PER_VM)],
        help_text="How many vGPUs of this series one VM may hold (multi-vGPU is vWS and compute only)",
    )

    class Meta:
        ordering = ["gpu_model__name", "-fb_mib", "series"]
        verbose_name = "vGPU profile"
        constraints = [
            models.CheckConstraint(condition=Q(fb_mib__gt=0), name="vgpuprofile_fb_positive"),
            models.CheckConstraint(condition=Q(max_per_gpu__gte=1), name="vgpuprofile_max_per_gpu_min_1"),
            models.CheckConstraint(
                condition=Q(max_per_vm__gte=1) & Q(max_per_vm__lte=placement.MAX_VGPUS_PER_VM),
                name="vgpuprofile_max_per_vm_range",
            ),
        ]
        indexes = [models.Index(fields=["gpu_model", "fb_mib"], name="vgpuprofile_model_fb_idx")]

    def __str__(self):
        return self.name

    @property
    def is_full_gpu(self) -> bool:
        return self.fb_mib >= self.gpu_model.fb_mib

    def to_spec(self) -> placement.ProfileSpec:
        return placement.ProfileSpec(
            id=self.pk, name=self.name, gpu_model=self.gpu_model.name, series=self.series,
            fb_mib=self.fb_mib, max_per_gpu=self.max_per_gpu,
            max_per_gpu_mixed=self.max_per_gpu_mixed, max_per_vm=self.max_per_vm,
        )


def default_vcpu_overcommit() -> float:
    return settings.FLEET_DEFAULT_VCPU_OVERCOMMIT


def default_ram_overcommit() -> float:
    return settings.FLEET_DEFAULT_RAM_OVERCOMMIT


def validate_hypervisor_uri(value: str) -> None:
    try:
        hypervisor_link.check_uri(value)
    except hypervisor_link.InvalidLink as exc:
        raise ValidationError(str(exc), code="invalid") from None


def validate_secret_ref(value: str) -> None:
    try:
        hypervisor_link.check_secret_ref(value)
    except hypervisor_link.InvalidLink as exc:
        raise ValidationError(str(exc), code="invalid") from None


class Host(models.Model):
    """A GPU server running a hypervisor; its CPU threads and RAM bound the VMs it can run."""

    name = models.CharField(max_length=100, unique=True)
    hypervisor = models.CharField(max_length=20, choices=Hypervisor.choices, default=Hypervisor.KVM)
    cpu_model = models.CharField(max_length=100, blank=True)
    cpu_threads = models.PositiveIntegerField(help_text="Hardware threads available to VMs")
    ram_gib = models.PositiveIntegerField(help_text="RAM available to VMs, GiB")
    vcpu_overcommit = models.FloatField(
        default=default_vcpu_overcommit, validators=[MinValueValidator(0.1), MaxValueValidator(16)],
        help_text="vCPUs the VMs may claim per hardware thread",
    )
    ram_overcommit = models.FloatField(
        default=default_ram_overcommit, validators=[MinValueValidator(0.1), MaxValueValidator(4)],
        help_text="RAM the VMs may claim per GiB installed",
    )
    multi_vgpu_same_gpu = models.BooleanField(
        "several vGPUs of a VM on one GPU", default=False,
        help_text="Allow a VM's vGPUs to share one physical GPU (NVIDIA allows it on recent vGPU releases and "
                  "supported hypervisors only); off, each vGPU of a VM gets a GPU of its own",
    )
    hypervisor_uri = models.CharField(
        "hypervisor URI", max_length=500, blank=True, validators=[validate_hypervisor_uri],
        help_text="The hypervisor this product acts on: libvirt/KVM (qemu+ssh://root@node-01/system, "
                  "qemu:///system), VMware vSphere (vsphere://administrator@vsphere.local@vcenter-01/"
                  "?datacenter=DC&host=esx-01), Proxmox VE (proxmox://root@pam@pve-01:8006/) or sim://node-01 "
                  "(the demo's simulator); empty: the product changes only its inventory",
    )
    hypervisor_secret_ref = models.CharField(
        "hypervisor secret", max_length=100, blank=True, validators=[validate_secret_ref],
        help_text="Name of a file in the secrets folder (HYPERVISOR_SECRETS_DIR) holding the password, API "
                  "token secret, SSH key or TLS material; the secret itself is never stored here",
    )
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["name"]
        constraints = [
            models.CheckConstraint(condition=Q(cpu_threads__gte=1), name="host_cpu_threads_min_1"),
            models.CheckConstraint(condition=Q(ram_gib__gte=1), name="host_ram_min_1"),
            models.CheckConstraint(condition=Q(vcpu_overcommit__gt=0), name="host_vcpu_overcommit_positive"),
            models.CheckConstraint(condition=Q(ram_overcommit__gt=0), name="host_ram_overcommit_positive"),
        ]

    def __str__(self):
        return self.name

    def clean(self):
        super().clean()
        try:
            hypervisor_link.check_kind(self.hypervisor_uri, self.hypervisor)
        except hypervisor_link.InvalidLink as exc:
            # Not tied to one field: the host form changes the hypervisor, the link is set elsewhere.
            raise ValidationError(str(exc), code="invalid") from None


def validate_pci_bus_id(value: str) -> None:
    """A PCI bus id in any spelling `fleet.pci` reads (the form, the admin site and the API)."""
    try:
        normalize_pci_bus_id(value)
    except InvalidPciBusId as exc:
        raise ValidationError(str(exc), code="invalid") from None


class Gpu(models.Model):
    """One physical GPU in a host (an A16 board shows up as four of these)."""

    host = models.ForeignKey(Host, on_delete=models.PROTECT, related_name="gpus")
    gpu_model = models.ForeignKey(GpuModel, on_delete=models.PROTECT, related_name="gpus", verbose_name="GPU model")
    uuid = models.CharField(
        "UUID", max_length=80, blank=True, help_text="GPU UUID as NVML reports it (GPU-...)",
    )
    # Stored in NVML's form (`fleet.pci`), whichever spelling was given, so that one GPU is one row.
    pci_bus_id = models.CharField("PCI bus id", max_length=32, validators=[validate_pci_bus_id],
                                  help_text="e.g. 00000000:3B:00.0 (0000:3b:00.0 is read as the same)")
    mode = models.CharField(max_length=12, choices=GpuMode.choices, default=GpuMode.VGPU)
    size_mode = models.CharField(max_length=8, choices=SizeMode.choices, default=SizeMode.EQUAL)
    created_at = models.DateTimeField(auto_now_add=True)
    scheduler_reported = models.JSONField(
        null=True, blank=True,
        help_text="The scheduler state the agent last read (policy, arr_mode, avg_factor, timeslice_ms, "
                  "frequency_hz); null where no agent reports it",
    )
    scheduler_reported_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["host__name", "pci_bus_id"]
        verbose_name = "GPU"
        constraints = [
            models.UniqueConstraint(fields=["host", "pci_bus_id"], name="gpu_unique_host_pci_bus_id"),
            models.UniqueConstraint(fields=["uuid"], condition=~Q(uuid=""), name="gpu_unique_uuid"),
            models.CheckConstraint(
                condition=Q(mode__in=GpuMode.values), name="gpu_mode_valid",
            ),
            models.CheckConstraint(
                condition=Q(size_mode__in=SizeMode.values), name="gpu_size_mode_valid",
            ),
        ]

    #: What __str__ reads: joined when an API answer shows a GPU by name (`?expand=`).
    display_related = ("host", "gpu_model")

    def __str__(self):
        return f"{self.host.name} {self.pci_bus_id} ({self.gpu_model.name})"

    def save(self, *args, **kwargs):
        self.pci_bus_id = canonical_pci_bus_id(self.pci_bus_id)
        super().save(*args, **kwargs)

    def clean(self):
        # Before the unique check of (host, pci_bus_id): 0000:3b:00.0 collides with 00000000:3B:00.0.
        super().clean()
        self.pci_bus_id = canonical_pci_bus_id(self.pci_bus_id)

    @property
    def label(self) -> str:
        return self.pci_bus_id


class Artist(models.Model):
    """A person who works on virtual workstations; their workflow and load class drive sizing."""

    user = models.OneToOneField(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="artist",
    )
    name = models.CharField(max_length=120)
    workflow = models.CharField(max_length=20, choices=Workflow.choices, default=Workflow.OTHER)
    user_type = models.CharField(max_length=10, choices=UserType.choices, default=UserType.MEDIUM)

    class Meta:
        ordering = ["name"]
        constraints = [
            models.CheckConstraint(condition=Q(workflow__in=Workflow.values), name="artist_workflow_valid"),
            models.CheckConstraint(condition=Q(user_type__in=UserType.values), name="artist_user_type_valid"),
        ]

    def __str__(self):
        return self.name


class VirtualMachine(models.Model):
    """A virtual workstation. It runs on the host of its vGPUs; `host` is set by placement."""

    name = models.CharField(max_length=100, unique=True)
    uuid = models.UUIDField(default=uuid.uuid4, unique=True, help_text="The hypervisor's VM UUID")
    artist = models.ForeignKey(Artist, null=True, blank=True, on_delete=models.SET_NULL, related_name="vms")
    host = models.ForeignKey(Host, null=True, blank=True, on_delete=models.PROTECT, related_name="vms")
    vcpus = models.PositiveIntegerField("vCPUs", default=8)
    ram_gib = models.PositiveIntegerField("RAM, GiB", default=32)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["name"]
        verbose_name = "virtual machine"
        constraints = [
            models.CheckConstraint(condition=Q(vcpus__gte=1), name="vm_vcpus_min_1"),
            models.CheckConstraint(condition=Q(ram_gib__gte=1), name="vm_ram_min_1"),
        ]
        indexes = [models.Index(fields=["host", "name"], name="vm_host_name_idx")]

    def __str__(self):
        return self.name


class Vgpu(models.Model):
    """One vGPU of a VM, of one profile, on one physical GPU. Created only through placement."""

    vm = models.ForeignKey(VirtualMachine, on_delete=models.CASCADE, related_name="vgpus", verbose_name="VM")
    gpu = models.ForeignKey(Gpu, on_delete=models.PROTECT, related_name="vgpus", verbose_name="GPU")
    profile = models.ForeignKey(VgpuProfile, on_delete=models.PROTECT, related_name="vgpus")
    placement_id = models.PositiveSmallIntegerField(
        help_text="Slot on the GPU: index in equal-size mode, aligned grid offset in mixed-size mode",
    )
    device_id = models.CharField(
        "device", max_length=64, blank=True,
        help_text="The vGPU instance on the host: its mdev UUID, or its SR-IOV VF's PCI address (vGPU 17+); "
                  "filled by hypervisor sync and operations",
    )
    # What the host agent reads, kept apart from `device_id` (the inventory's and hypervisor's
    # word) so drift can compare the two. State, not a time series: ingest writes it only when
    # the agent's value changes, so `reported_device_at` is when it last changed.
    reported_device_id = models.CharField(
        "device the agent reports", max_length=80, blank=True, editable=False,
        help_text="The mdev UUID the host agent last reported for this vGPU (empty: none reported, or an SR-IOV "
                  "vGPU, which has no mdev)",
    )
    reported_device_at = models.DateTimeField(
        null=True, blank=True, editable=False, help_text="When the agent's reported device last changed",
    )
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["gpu_id", "placement_id"]
        verbose_name = "vGPU"
        constraints = [
            # Backstop of the placement rules: two vGPUs never take one slot of a GPU.
            models.UniqueConstraint(fields=["gpu", "placement_id"], name="vgpu_unique_gpu_slot"),
        ]
        indexes = [models.Index(fields=["vm"], name="vgpu_vm_idx")]

    display_related = ("profile", "vm")

    def __str__(self):
        return f"{self.profile.name} for {self.vm.name}"


class ResizeRequest(models.Model):
    """A request to give a VM another vGPU profile (or another number of vGPUs).

    Filed by the VM's artist, or by an admin accepting a right-sizing suggestion; decided by
    an admin, whose approval re-checks and applies it through `fleet.placement`.
    """

    vm = models.ForeignKey(VirtualMachine, on_delete=models.CASCADE, related_name="resize_requests",
                           verbose_name="VM")
    current_profile = models.ForeignKey(
        VgpuProfile, null=True, blank=True, on_delete=models.PROTECT, related_name="+",
        help_text="The VM's profile when the request was filed",
    )
    requested_profile = models.ForeignKey(VgpuProfile, on_delete=models.PROTECT, related_name="resize_requests")
    requested_vgpus = models.PositiveSmallIntegerField(
        "vGPUs", default=1,
        validators=[MinValueValidator(1), MaxValueValidator(placement.MAX_VGPUS_PER_VM)],
    )
    reason = models.TextField(blank=True)
    status = models.CharField(max_length=12, choices=ResizeStatus.choices, default=ResizeStatus.PENDING)
    requested_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+",
    )
    decided_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+",
    )
    decided_at = models.DateTimeField(null=True, blank=True)
    decision_comment = models.TextField(blank=True)
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)
    current_vgpus = models.PositiveSmallIntegerField(
        default=1, help_text="How many vGPUs the VM held when the request was filed",
    )
    wished_from = models.DateTimeField(null=True, blank=True, help_text="Optional: when the artist would like it")
    wished_until = models.DateTimeField(null=True, blank=True)
    last_error = models.TextField(
        blank=True, help_text="Why the last approval could not be applied (the request stays pending)",
    )
    current_vcpus = models.PositiveIntegerField(
        null=True, blank=True, help_text="The VM's vCPUs when the request was filed",
    )
    current_ram_gib = models.PositiveIntegerField(
        null=True, blank=True, help_text="The VM's RAM (GiB) when the request was filed",
    )
    requested_vcpus = models.PositiveIntegerField(
        "vCPUs", null=True, blank=True,
        validators=[MinValueValidator(1), MaxValueValidator(placement.MAX_VCPUS_PER_VM)],
        help_text="The vCPUs the VM should have; empty: unchanged",
    )
    requested_ram_gib = models.PositiveIntegerField(
        "RAM, GiB", null=True, blank=True,
        validators=[MinValueValidator(1), MaxValueValidator(placement.MAX_RAM_GIB_PER_VM)],
        help_text="The RAM (GiB) the VM should have; empty: unchanged",
    )

    class Meta:
        ordering = ["-created_at", "-id"]
        constraints = [
            models.CheckConstraint(condition=Q(status__in=ResizeStatus.values), name="resizerequest_status_valid"),
            models.CheckConstraint(
                condition=Q(requested_vgpus__gte=1) & Q(requested_vgpus__lte=placement.MAX_VGPUS_PER_VM),
                name="resizerequest_vgpus_range",
            ),
            models.CheckConstraint(
                condition=Q(requested_vcpus__isnull=True) | (
                    Q(requested_vcpus__gte=1) & Q(requested_vcpus__lte=placement.MAX_VCPUS_PER_VM)),
                name="resizerequest_vcpus_range",
            ),
            models.CheckConstraint(
                condition=Q(requested_ram_gib__isnull=True) | (
                    Q(requested_ram_gib__gte=1) & Q(requested_ram_gib__lte=placement.MAX_RAM_GIB_PER_VM)),
                name="resizerequest_ram_range",
            ),
        ]
        indexes = [models.Index(fields=["status", "created_at"], name="resizerequest_status_idx")]

    display_related = ("vm", "requested_profile")

    def __str__(self):
        return f"{self.vm.name} -> {self.requested_profile.name} ({self.get_status_display()})"

    @property
    def changes_vgpus(self) -> bool:
        """Whether the request asks for another profile or number of vGPUs than the VM held when
        it was filed (False for a change of vCPUs or RAM alone)."""
        return (self.requested_profile_id, self.requested_vgpus) != (self.current_profile_id, self.current_vgpus)

    @property
    def changes_size(self) -> bool:
        """Whether the request asks for other vCPUs or RAM (the vGPUs may change besides)."""
        return self.requested_vcpus is not None or self.requested_ram_gib is not None

    @property
    def size_change(self) -> str:
        """The vCPU and RAM change in words, e.g. "8 -> 4 vCPUs, 32 -> 16 GiB" ("" when they stay)."""
        parts = []
        if self.requested_vcpus is not None:
            parts.append(f"{_or_unknown(self.current_vcpus)} -> {self.requested_vcpus} vCPUs")
        if self.requested_ram_gib is not None:
            parts.append(f"{_or_unknown(self.current_ram_gib)} -> {self.requested_ram_gib} GiB")
        return ", ".join(parts)


def _or_unknown(value) -> str:
    return "?" if value is None else str(value)


class Notification(models.Model):
    """An in-app message for one user (the same text also goes out by e-mail)."""

    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="notifications")
    created_at = models.DateTimeField(auto_now_add=True)
    message = models.CharField(max_length=500)
    url = models.CharField(max_length=300, blank=True, help_text="Where the message points (a path)")
    read_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-created_at", "-id"]
        indexes = [models.Index(fields=["user", "read_at"], name="notification_unread_idx")]

    def __str__(self):
        return f"{self.user}: {self.message[:60]}"


class ApiToken(models.Model):
    """A key that a script presents as `Authorization: Token <key>` to act as `user`.

    Only the key's SHA-256 is kept, so a database dump or read access to the table hands out
    no credentials; the key itself is shown once, when `fleet.api_tokens` issues it. Keys are
    192 random bits, so an unsalted digest cannot be reversed by guessing, and its unique
    index finds the token in one lookup. `prefix` (the key's first characters) lets people
    tell their tokens apart in lists and name one to revoke.

    `scope` bounds what the key may do below what its user may (`fleet.token_rules`). A revoked
    token keeps its row, with when, why and by whom, so a script presenting its key is told
    why it no longer works (`refusal`), as is one whose `expires_at` has passed.
    """

    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="api_tokens")
    name = models.CharField(max_length=100, blank=True, help_text="What the token is for, e.g. 'render farm sync'")
    prefix = models.CharField(max_length=8, editable=False, help_text="The key's first characters")
    token_sha256 = models.CharField(max_length=64, editable=False)
    scope = models.CharField(max_length=10, choices=TokenScope.choices, default=TokenScope.WRITE,
                             help_text="read: reads only; write: reads and writes; ingest: pushing samples only")
    created_at = models.DateTimeField(default=timezone.now, editable=False)
    expires_at = models.DateTimeField(null=True, blank=True, help_text="Refused from this moment on; empty: never")
    last_used_at = models.DateTimeField(null=True, blank=True, editable=False,
                                        help_text="Written at most once a minute")
    revoked_at = models.DateTimeField(null=True, blank=True, editable=False)
    revoked_reason = models.CharField(max_length=200, blank=True, editable=False)
    revoked_by = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL,
                                   related_name="+", editable=False)

    class Meta:
        ordering = ["-created_at", "-id"]
        verbose_name = "API token"
        constraints = [
            models.UniqueConstraint(fields=["token_sha256"], name="apitoken_token_sha256_unique"),
            models.CheckConstraint(condition=Q(scope__in=TokenScope.values), name="apitoken_scope_valid"),
        ]
        indexes = [models.Index(fields=["prefix"], name="apitoken_prefix_idx")]

    def __str__(self):
        return f"{self.prefix}… ({self.name})" if self.name else f"{self.prefix}…"

    def state(self, now=None) -> str:
        """Revoked, expired or active (`TokenState`), at `now` (default: this moment)."""
        if self.revoked_at is not None:
            return TokenState.REVOKED
        if self.expires_at is not None and self.expires_at <= (now or timezone.now()):
            return TokenState.EXPIRED
        return TokenState.ACTIVE

    def refusal(self, now=None) -> str | None:
        """Why the key signs no one in any more (the 401's text), or None while it is active."""
        state = self.state(now)
        tz = timezone.get_current_timezone()
        if state == TokenState.REVOKED:
            because = f" ({self.revoked_reason})" if self.revoked_reason else ""
            return f"Token revoked on {token_rules.when(self.revoked_at, tz)}{because}."
        if state == TokenState.EXPIRED:
            return f"Token expired on {token_rules.when(self.expires_at, tz)}."
        return None


class SchedulerPolicy(models.Model):
    """Desired vGPU scheduler state for one GPU, or the default of a host or a GPU model.

    A GPU's effective desired state is its own row, else its host's, else its model's, else the
    driver's default (best effort). Validation and the commands that apply a policy live in
    `fleet.scheduler` (pure); this row keeps what an admin asked for and how applying it went.
    """

    scope = models.CharField(max_length=10, choices=SchedulerScope.choices)
    gpu = models.OneToOneField(Gpu, null=True, blank=True, on_delete=models.CASCADE, related_name="scheduler_policy",
                               verbose_name="GPU")
    host = models.OneToOneField(Host, null=True, blank=True, on_delete=models.CASCADE,
                                related_name="scheduler_default")
    gpu_model = models.OneToOneField(GpuModel, null=True, blank=True, on_delete=models.CASCADE,
                                     related_name="scheduler_default", verbose_name="GPU model")
    policy = models.CharField(max_length=12, choices=SchedulerPolicyName.choices,
                              default=SchedulerPolicyName.BEST_EFFORT)
    arr = models.BooleanField("adaptive round-robin", default=False)
    frequency_hz = models.PositiveSmallIntegerField(null=True, blank=True, help_text="63-960 Hz, with ARR")
    avg_factor = models.PositiveSmallIntegerField(null=True, blank=True, help_text="1-60, with ARR")
    timeslice_ms = models.PositiveSmallIntegerField(null=True, blank=True, help_text="1-30 ms, without ARR")
    apply_state = models.CharField(max_length=10, choices=SchedulerApplyState.choices,
                                   default=SchedulerApplyState.DESIRED)
    apply_detail = models.TextField(blank=True, help_text="Why staged, or what applying answered")
    applied_at = models.DateTimeField(null=True, blank=True)
    updated_by = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL,
                                   related_name="+")
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        verbose_name_plural = "scheduler policies"
        constraints = [
            models.CheckConstraint(condition=Q(scope__in=SchedulerScope.values), name="schedpolicy_scope_valid"),
            models.CheckConstraint(condition=Q(policy__in=SchedulerPolicyName.values),
                                   name="schedpolicy_policy_valid"),
            models.CheckConstraint(
                condition=(Q(scope="gpu", gpu__isnull=False, host__isnull=True, gpu_model__isnull=True)
                           | Q(scope="host", gpu__isnull=True, host__isnull=False, gpu_model__isnull=True)
                           | Q(scope="gpu_model", gpu__isnull=True, host__isnull=True, gpu_model__isnull=False)),
                name="schedpolicy_one_target",
            ),
        ]

    def __str__(self):
        target = self.gpu or self.host or self.gpu_model
        return f"{self.get_policy_display()} for {target}"


class AuditEvent(models.Model):
    """One change to the fleet: who, when, what, and the object before and after.

    Written by `fleet.audit.record` in the same transaction as the change, so a change that
    rolls back leaves no event and every committed change has one. `actor_name` keeps the
    name when the user is later deleted.
    """

    at = models.DateTimeField(db_index=True)
    actor = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL,
                              related_name="+")
    actor_name = models.CharField(max_length=150, blank=True)
    source = models.CharField(max_length=8, choices=AuditSource.choices, default=AuditSource.SYSTEM)
    action = models.CharField(max_length=60, help_text="object type and verb, e.g. vgpu.place, resize_request.approve")
    object_type = models.CharField(max_length=40)
    object_id = models.CharField(max_length=40, blank=True)
    object_repr = models.CharField(max_length=200, blank=True)
    before = models.JSONField(null=True, blank=True)
    after = models.JSONField(null=True, blank=True)
    comment = models.TextField(blank=True)

    class Meta:
        ordering = ["-at", "-id"]
        indexes = [
            models.Index(fields=["object_type", "object_id", "at"], name="audit_object_idx"),
            models.Index(fields=["action", "at"], name="audit_action_idx"),
            models.Index(fields=["actor", "at"], name="audit_actor_idx"),
        ]

    def __str__(self):
        return f"{self.at:%Y-%m-%d %H:%M} {self.actor_name or 'system'} {self.action} {self.object_repr}"

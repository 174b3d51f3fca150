"""The hypervisors app's records: each linked host's connection status and sync reports (read
by pages, written by services that talk to the hypervisor: `hypervisors.services`, in Celery
tasks, management commands and POSTs, so a page never waits on a hypervisor), and the
operations that carry changes out on hypervisors, with their steps and the claims that keep
two operations off one VM or GPU."""

from __future__ import annotations

from django.conf import settings
from django.db import models
from django.db.models import Q

from fleet.models import Gpu, Host, ResizeRequest, VirtualMachine
from hypervisors.choices import OperationKind, OperationStatus, StepKind, StepStatus

ACTIVE = (OperationStatus.PENDING, OperationStatus.RUNNING)


class HypervisorStatus(models.Model):
    """The last connection check of one host's hypervisor (one row per host, replaced by each check)."""

    host = models.OneToOneField(Host, on_delete=models.CASCADE, related_name="hypervisor_status")
    uri = models.CharField("URI", max_length=500, help_text="The URI the check used")
    checked_at = models.DateTimeField()
    ok = models.BooleanField()
    message = models.TextField(help_text="What the hypervisor answered, or why it could not be reached")
    hypervisor_version = models.CharField(max_length=100, blank=True)
    hostname = models.CharField(max_length=255, blank=True, help_text="The host name the hypervisor reports")

    class Meta:
        verbose_name = "hypervisor status"
        verbose_name_plural = "hypervisor statuses"
        ordering = ["host__name"]

    def __str__(self):
        return f"{self.host.name}: {'ok' if self.ok else 'unreachable'} at {self.checked_at:%Y-%m-%d %H:%M}"


class SyncTrigger(models.TextChoices):
    PAGE = "page", "Host page"
    API = "api", "API"
    COMMAND = "command", "Management command"
    TASK = "task", "Periodic task"


class SyncReport(models.Model):
    """One reading of a host's hypervisor compared with the inventory (`hypervisors.discovery`):
    the diff as JSON, and what an admin applied of it since.

    `diff` is {"entries": [...], "summary": {...}} as `discovery.diff_host` returns it; `applied`
    lists the outcome of each entry applied from this report ({"uuid", "ok", "messages"}).
    """

    host = models.ForeignKey(Host, on_delete=models.CASCADE, related_name="sync_reports")
    created_at = models.DateTimeField(auto_now_add=True, db_index=True)
    uri = models.CharField("URI", max_length=500)
    ok = models.BooleanField(help_text="The hypervisor was read; false: `error` says why not")
    error = models.TextField(blank=True)
    diff = models.JSONField(default=dict, blank=True)
    requested_by = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL,
                                     related_name="+")
    trigger = models.CharField(max_length=10, choices=SyncTrigger.choices, default=SyncTrigger.TASK)
    applied = models.JSONField(default=list, blank=True)
    applied_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-created_at", "-id"]
        indexes = [models.Index(fields=["host", "created_at"], name="syncreport_host_created_idx")]
        constraints = [
            models.CheckConstraint(condition=models.Q(trigger__in=SyncTrigger.values), name="syncreport_trigger_valid"),
        ]

    def __str__(self):
        return f"Sync of {self.host.name} at {self.created_at:%Y-%m-%d %H:%M}"

    @property
    def entries(self) -> list[dict]:
        return (self.diff or {}).get("entries", [])

    @property
    def differences(self) -> list[dict]:
        """The entries that are not in step with the inventory."""
        return [entry for entry in self.entries if entry["kind"] != "same"]


class Operation(models.Model):
    """One change carried out on a hypervisor: an approved resize request or an optimizer move
    of one VM. The inventory already shows the change (approval reserved it); the steps make the
    hypervisor match, and a failure puts both back as they were.

    `before` holds what rollback needs: the VM's vCPUs, RAM and vGPUs as they were (GPU, PCI
    address, profile, device id) and, once the shutdown step read it, the domain's saved
    definition. `after` holds the vGPUs the inventory placed for it.
    """

    kind = models.CharField(max_length=12, choices=OperationKind.choices)
    status = models.CharField(max_length=12, choices=OperationStatus.choices, default=OperationStatus.PENDING,
                              db_index=True)
    vm = models.ForeignKey(VirtualMachine, on_delete=models.PROTECT, related_name="operations", verbose_name="VM")
    host = models.ForeignKey(Host, on_delete=models.PROTECT, related_name="operations",
                             help_text="The host the VM is on when the operation starts")
    target_host = models.ForeignKey(Host, on_delete=models.PROTECT, related_name="incoming_operations",
                                    help_text="The host the VM is on when it ends (the same host unless it moves)")
    request = models.ForeignKey(ResizeRequest, null=True, blank=True, on_delete=models.SET_NULL,
                                related_name="operations")
    origin = models.CharField(max_length=120, blank=True, help_text="What asked for it, e.g. resize request #12")
    before = models.JSONField(default=dict)
    after = models.JSONField(default=dict)
    not_before = models.DateTimeField(null=True, blank=True,
                                      help_text="Runs from then on (the request's wished window), unless run now")
    not_after = models.DateTimeField(null=True, blank=True)
    run_now = models.BooleanField(default=False, help_text="An admin asked to run it now, whatever the window")
    created_by = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL,
                                   related_name="+")
    created_at = models.DateTimeField(auto_now_add=True)
    started_at = models.DateTimeField(null=True, blank=True)
    finished_at = models.DateTimeField(null=True, blank=True)
    heartbeat_at = models.DateTimeField(null=True, blank=True,
                                        help_text="Last sign of the worker running it; a stale one is resumed")
    error = models.TextField(blank=True)

    class Meta:
        ordering = ["-created_at", "-pk"]
        indexes = [models.Index(fields=["status", "not_before"], name="operation_status_window")]

    def __str__(self):
        return f"operation #{self.pk} ({self.get_kind_display().lower()} {self.vm.name})"

    @property
    def is_active(self) -> bool:
        return self.status in ACTIVE


class OperationStep(models.Model):
    """One step of an operation, done at most once: `result` keeps what it made (a created
    device's id, the definition it replaced), so a resumed run skips what is done and a rollback
    knows what to undo."""

    operation = models.ForeignKey(Operation, on_delete=models.CASCADE, related_name="steps")
    index = models.PositiveSmallIntegerField()
    kind = models.CharField(max_length=12, choices=StepKind.choices)
    args = models.JSONField(default=dict, blank=True)
    status = models.CharField(max_length=8, choices=StepStatus.choices, default=StepStatus.PENDING)
    result = models.JSONField(default=dict, blank=True)
    started_at = models.DateTimeField(null=True, blank=True)
    finished_at = models.DateTimeField(null=True, blank=True)
    error = models.TextField(blank=True)

    class Meta:
        ordering = ["operation", "index"]
        constraints = [models.UniqueConstraint(fields=["operation", "index"], name="operation_step_index_unique")]

    def __str__(self):
        return f"{self.index + 1}. {self.get_kind_display()}"


class OperationClaim(models.Model):
    """A VM or GPU an active operation works on. The partial unique constraints are what keeps a
    second operation off it: the database refuses the claim, whichever worker or page asks."""

    operation = models.ForeignKey(Operation, on_delete=models.CASCADE, related_name="claims")
    vm = models.ForeignKey(VirtualMachine, null=True, blank=True, on_delete=models.CASCADE, related_name="+")
    gpu = models.ForeignKey(Gpu, null=True, blank=True, on_delete=models.CASCADE, related_name="+")
    active = models.BooleanField(default=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["vm"], condition=Q(active=True, vm__isnull=False),
                                    name="operation_claim_one_per_vm"),
            models.UniqueConstraint(fields=["gpu"], condition=Q(active=True, gpu__isnull=False),
                                    name="operation_claim_one_per_gpu"),
            models.CheckConstraint(condition=Q(vm__isnull=False) | Q(gpu__isnull=False),
                                   name="operation_claim_names_vm_or_gpu"),
        ]

    def __str__(self):
        return f"{self.operation} holds {'VM ' + str(self.vm_id) if self.vm_id else 'GPU ' + str(self.gpu_id)}"


class GuestCounter(models.Model):
    """The hypervisor's counters of a VM's guest as last read (`hypervisors.guest_stats`): the
    next reading's CPU shares are taken against them. One row per VM, replaced at each reading."""

    vm = models.OneToOneField(VirtualMachine, on_delete=models.CASCADE, primary_key=True, related_name="+")
    host = models.ForeignKey(Host, on_delete=models.CASCADE, related_name="+",
                             help_text="The host whose hypervisor counted them (counters restart on another)")
    read_at = models.DateTimeField()
    counters = models.JSONField(help_text="hypervisors.backends.base.GuestCounters as read")

    def __str__(self):
        return f"guest counters of VM {self.vm_id} at {self.read_at:%Y-%m-%d %H:%M:%S}"

"""What the product learned from each host's hypervisor: whether it answers (`HypervisorStatus`)
and how its domains compare with the inventory (`SyncReport`).

Both are written by services that talk to the hypervisor (`hypervisors.services`), which run in
Celery tasks, management commands and POSTs; pages only read these rows, so a page never waits
on the network.
"""

from django.conf import settings
from django.db import models

from fleet.models import Host


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

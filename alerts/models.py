"""Alerts: the rules an admin tunes, the alerts they raise, silences, the licences the studio owns,
and the evaluation's own bookkeeping.

An alert is one subject a rule fires on (its `key`: the GPU, the vGPU, the agent, the licence
edition), open while the condition holds: firing, then acknowledged if someone took it; it is
resolved when the condition ends, and a later recurrence opens a new alert. At most one open
alert per key (a partial unique constraint), so a repeated or racing evaluation never doubles one.
"""

from __future__ import annotations

from django.conf import settings
from django.core.exceptions import ValidationError
from django.db import models
from django.db.models import Q
from django.utils import timezone

from alerts.rules import RULES, ParamError, check_params
from fleet.models import Gpu, Host, VirtualMachine
from notify.choices import Severity  # one vocabulary for alerts and the channels that carry them


class AlertState(models.TextChoices):
    FIRING = "firing", "Firing"
    ACKNOWLEDGED = "acknowledged", "Acknowledged"
    RESOLVED = "resolved", "Resolved"


OPEN_STATES = (AlertState.FIRING, AlertState.ACKNOWLEDGED)
RULE_CHOICES = [(slug, kind.title) for slug, kind in RULES.items()]


class AlertRule(models.Model):
    """One rule of `alerts.rules.RULES` as this studio runs it: on or off, severity, thresholds."""

    kind = models.CharField(max_length=40, unique=True, choices=RULE_CHOICES)
    enabled = models.BooleanField(default=True)
    severity = models.CharField(max_length=10, choices=Severity.choices)
    params = models.JSONField(default=dict, blank=True, help_text="Thresholds; those left out take their default")
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["kind"]

    def __str__(self):
        return self.title

    @property
    def title(self) -> str:
        return RULES[self.kind].title

    @property
    def effective_params(self) -> dict:
        """The thresholds in force: the stored ones, defaults for the rest (or for a stored set that
        no longer checks, after an upgrade changed a bound)."""
        try:
            return check_params(self.kind, self.params or {})
        except ParamError:
            return RULES[self.kind].defaults()

    def clean(self):
        if self.kind not in RULES:
            raise ValidationError({"kind": f"Unknown rule {self.kind!r}."})
        if not isinstance(self.params, dict):
            raise ValidationError({"params": "Expected an object of parameter names and numbers."})
        try:
            self.params = check_params(self.kind, self.params)
        except ParamError as exc:
            raise ValidationError({"params": str(exc)}) from None


class Alert(models.Model):
    rule = models.ForeignKey(AlertRule, on_delete=models.CASCADE, related_name="alerts")
    key = models.CharField(max_length=200, help_text="The subject the rule fired on; one open alert per key")
    state = models.CharField(max_length=12, choices=AlertState.choices, default=AlertState.FIRING)
    severity = models.CharField(max_length=10, choices=Severity.choices)
    title = models.CharField(max_length=200)
    summary = models.TextField()
    details = models.JSONField(default=dict, blank=True)
    host = models.ForeignKey(Host, null=True, blank=True, on_delete=models.SET_NULL, related_name="alerts")
    gpu = models.ForeignKey(Gpu, null=True, blank=True, on_delete=models.SET_NULL, related_name="alerts",
                            verbose_name="GPU")
    vms = models.ManyToManyField(VirtualMachine, blank=True, related_name="alerts", verbose_name="VMs")
    first_seen = models.DateTimeField(default=timezone.now)
    last_seen = models.DateTimeField(default=timezone.now)
    resolved_at = models.DateTimeField(null=True, blank=True)
    acknowledged_at = models.DateTimeField(null=True, blank=True)
    acknowledged_by = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL,
                                        related_name="+")
    note = models.TextField(blank=True, help_text="What the admin who took it said")
    silenced = models.BooleanField(default=False, help_text="A silence matched it when it was last evaluated")

    class Meta:
        ordering = ["-last_seen", "-id"]
        constraints = [
            models.UniqueConstraint(fields=["key"], condition=Q(state__in=["firing", "acknowledged"]),
                                    name="alert_one_open_per_key"),
        ]
        indexes = [
            models.Index(fields=["state", "severity"], name="alert_state_severity_idx"),
            models.Index(fields=["gpu", "state"], name="alert_gpu_state_idx"),
        ]

    def __str__(self):
        return f"{self.title} ({self.state})"

    @property
    def is_open(self) -> bool:
        return self.state in OPEN_STATES


class Silence(models.Model):
    """Keeps matching alerts quiet (no notification) until `ends_at`. An empty matcher field
    matches anything, so a silence with only a host silences every rule on that host."""

    rule = models.ForeignKey(AlertRule, null=True, blank=True, on_delete=models.CASCADE, related_name="silences")
    host = models.ForeignKey(Host, null=True, blank=True, on_delete=models.CASCADE, related_name="silences")
    gpu = models.ForeignKey(Gpu, null=True, blank=True, on_delete=models.CASCADE, related_name="silences",
                            verbose_name="GPU")
    alert = models.ForeignKey(Alert, null=True, blank=True, on_delete=models.CASCADE, related_name="silences",
                              help_text="One alert only (its key)")
    reason = models.CharField(max_length=300)
    starts_at = models.DateTimeField(default=timezone.now)
    ends_at = models.DateTimeField()
    created_by = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL,
                                   related_name="+")
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["-ends_at", "-id"]
        constraints = [
            models.CheckConstraint(condition=Q(ends_at__gt=models.F("starts_at")), name="silence_ends_after_start",
                                   violation_error_message="A silence must end after it starts."),
        ]

    def __str__(self):
        return f"Silence until {self.ends_at:%Y-%m-%d %H:%M}: {self.reason[:40]}"

    def clean(self):
        if not (self.rule_id or self.host_id or self.gpu_id or self.alert_id):
            raise ValidationError("A silence needs something to match: a rule, a host, a GPU or an alert.")
        if self.ends_at and self.ends_at <= (self.starts_at or timezone.now()):
            raise ValidationError({"ends_at": "A silence must end after it starts."})
        if not (self.reason or "").strip():
            raise ValidationError({"reason": "Say why: the next admin on call reads it."})

    def matches(self, rule_id: int, key: str, host_id: int | None, gpu_id: int | None) -> bool:
        """Whether this silence covers an alert (or a finding) of `rule_id` with `key` on that host and GPU."""
        return ((self.rule_id is None or self.rule_id == rule_id) and (self.host_id is None or self.host_id == host_id)
                and (self.gpu_id is None or self.gpu_id == gpu_id) and (self.alert is None or self.alert.key == key))

    def is_active(self, now=None) -> bool:
        now = now or timezone.now()
        return self.starts_at <= now < self.ends_at


class Edition(models.TextChoices):
    """NVIDIA vGPU software editions; the profile's series says which one a vGPU needs."""

    VWS = "vws", "RTX Virtual Workstation (vWS)"
    VPC = "vpc", "Virtual PC (vPC)"
    VAPPS = "vapps", "Virtual Applications (vApps)"
    VCS = "vcs", "AI Enterprise / vCS (compute)"


EDITION_OF_SERIES = {"Q": Edition.VWS, "B": Edition.VPC, "A": Edition.VAPPS, "C": Edition.VCS}


class LicencePool(models.Model):
    """How many concurrent licences of one edition the studio owns."""

    edition = models.CharField(max_length=8, choices=Edition.choices, unique=True)
    owned = models.PositiveIntegerField(help_text="Concurrent licences owned")
    note = models.CharField(max_length=200, blank=True, help_text="Contract, renewal date, licence server")
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["edition"]

    def __str__(self):
        return f"{self.get_edition_display()}: {self.owned}"


class LicenceUsage(models.Model):
    """Concurrent use of one edition at one evaluation: the series the licence page charts."""

    id = models.BigAutoField(primary_key=True)
    ts = models.DateTimeField()
    edition = models.CharField(max_length=8, choices=Edition.choices)
    in_use = models.PositiveIntegerField(help_text="Running vGPUs that hold a licence")
    unlicensed = models.PositiveIntegerField(help_text="Running vGPUs that need one and hold none")

    class Meta:
        ordering = ["ts", "edition"]
        constraints = [models.UniqueConstraint(fields=["ts", "edition"], name="licenceusage_unique_ts_edition")]
        indexes = [models.Index(fields=["edition", "ts"], name="licenceusage_edition_ts_idx")]

    def __str__(self):
        return f"{self.edition} at {self.ts:%Y-%m-%d %H:%M}: {self.in_use}"


class Evaluation(models.Model):
    """One run of the rules over the stored samples: when, how long, what it did."""

    started_at = models.DateTimeField()
    finished_at = models.DateTimeField(null=True, blank=True)
    duration_s = models.FloatField(null=True, blank=True)
    findings = models.PositiveIntegerField(default=0)
    fired = models.PositiveIntegerField(default=0)
    resolved = models.PositiveIntegerField(default=0)
    error = models.TextField(blank=True)

    class Meta:
        ordering = ["-started_at"]

    def __str__(self):
        return f"Evaluation at {self.started_at:%Y-%m-%d %H:%M:%S}"


class EvaluationLease(models.Model):
    """The one row that lets one evaluation run at a time: taken by an atomic UPDATE while free
    or expired, so a worker killed mid-run holds it no longer than `until`."""

    holder = models.CharField(max_length=64, blank=True)
    until = models.DateTimeField(null=True, blank=True)

    def __str__(self):
        return f"held by {self.holder or 'nobody'} until {self.until}"

"""What sizing keeps: workflow presets for the density planner, right-sizing suggestions per VM,
runs of the fleet placement optimizer, and artists' feedback on how their workstation felt.

The decisions themselves are pure functions (`sizing.engine`, `sizing.planner`,
`sizing.optimizer`); these rows only store their inputs and results.
"""

from django.conf import settings
from django.core.validators import MaxValueValidator, MinValueValidator
from django.db import models
from django.db.models import Q
from django.utils import timezone

from fleet import placement
from fleet.choices import Series, Workflow
from fleet.models import Artist, Host, ResizeRequest, VgpuProfile, VirtualMachine
from sizing import feedback_rules


class WorkflowPreset(models.Model):
    """What an artist of one workflow gets by default: frame buffer per vGPU, vGPUs, vCPUs, RAM.

    Sized in frame buffer rather than as one board's profile, so the planner can size the same
    workflow on any GPU model (it takes the smallest profile of `series` with at least
    `fb_mib`, up to a whole GPU). The seed values follow NVIDIA's Maya/Arnold sizing guide
    (12Q on a 24 GB Quadro RTX 6000 for modeling, texturing and shading; 24Q for animation,
    lighting and rendering); admins edit them.
    """

    workflow = models.CharField(max_length=20, choices=Workflow.choices, unique=True)
    fb_mib = models.PositiveIntegerField("frame buffer per vGPU, MiB")
    series = models.CharField(max_length=1, choices=Series.choices, default=Series.Q)
    vgpus = models.PositiveSmallIntegerField(
        "vGPUs", default=1,
        validators=[MinValueValidator(1), MaxValueValidator(placement.MAX_VGPUS_PER_VM)],
        help_text="vGPUs per VM (multi-vGPU, up to four, for lighting and rendering)",
    )
    vcpus = models.PositiveIntegerField("vCPUs", default=8)
    ram_gib = models.PositiveIntegerField("RAM, GiB", default=32)
    note = models.CharField(max_length=200, blank=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["workflow"]
        constraints = [
            models.CheckConstraint(condition=Q(workflow__in=Workflow.values), name="workflowpreset_workflow_valid"),
            models.CheckConstraint(condition=Q(fb_mib__gt=0), name="workflowpreset_fb_positive"),
            models.CheckConstraint(
                condition=Q(vgpus__gte=1) & Q(vgpus__lte=placement.MAX_VGPUS_PER_VM),
                name="workflowpreset_vgpus_range",
            ),
            models.CheckConstraint(condition=Q(vcpus__gte=1), name="workflowpreset_vcpus_min_1"),
            models.CheckConstraint(condition=Q(ram_gib__gte=1), name="workflowpreset_ram_min_1"),
        ]

    def __str__(self):
        return f"{self.get_workflow_display()}: {self.vgpus} x {self.fb_mib // 1024} GB"


class SuggestionAction(models.TextChoices):
    UPSIZE = "upsize", "Upsize"
    DOWNSIZE = "downsize", "Downsize"
    KEEP = "keep", "Keep"
    INSUFFICIENT_DATA = "insufficient_data", "Not enough data"


#: A suggestion's vCPU or RAM advice, empty before its first refresh (the API's one enum for both).
GUEST_ADVICE_CHOICES = [("", "Not computed yet"), *SuggestionAction.choices]


class CombinedKind(models.TextChoices):
    CPU_BOUND = "cpu_bound", "CPU-bound: one vCPU saturated while the GPU idles"
    GPU_BOUND = "gpu_bound", "GPU-bound: the GPU is busy, the vCPUs are not"
    MEMORY_BOUND = "memory_bound", "Short of RAM, not of frame buffer"
    HOST_CONTENDED = "host_contended", "The vCPUs wait for the host's CPUs"


class Suggestion(models.Model):
    """The right-sizing advice for one VM, refreshed from its rollups by a beat task.

    One row per VM, updated in place. `evidence` holds the figures (and the daily series for
    the chart) the advice rests on; `evidence_key` is a digest of what would change the
    advice, so a dismissal hides the suggestion only until the evidence changes.
    """

    vm = models.OneToOneField(VirtualMachine, on_delete=models.CASCADE, related_name="suggestion", verbose_name="VM")
    current_profile = models.ForeignKey(VgpuProfile, null=True, on_delete=models.SET_NULL, related_name="+")
    suggested_profile = models.ForeignKey(
        VgpuProfile, null=True, blank=True, on_delete=models.SET_NULL, related_name="+",
    )
    suggested_vgpus = models.PositiveSmallIntegerField(
        "suggested vGPUs", null=True, blank=True,
        help_text="vGPUs the VM should hold (multi-vGPU); empty when the count stays",
    )
    action = models.CharField(max_length=20, choices=SuggestionAction.choices)
    reason = models.CharField(max_length=300, blank=True)
    evidence = models.JSONField(default=dict)
    evidence_key = models.CharField(max_length=64, help_text="Digest of the advice and its evidence")
    fits = models.CharField(
        max_length=20, blank=True,
        help_text="Where the suggested profile fits now: same_gpu, move, nowhere (blank when kept)",
    )
    gpus_delta = models.SmallIntegerField(
        default=0, help_text="GPUs in use after the change minus before (negative frees GPUs)",
    )
    window_start = models.DateTimeField()
    window_end = models.DateTimeField()
    computed_at = models.DateTimeField()
    dismissed_key = models.CharField(max_length=64, blank=True)
    dismissed_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+",
    )
    dismissed_at = models.DateTimeField(null=True, blank=True)
    resize_request = models.ForeignKey(
        ResizeRequest, null=True, blank=True, on_delete=models.SET_NULL, related_name="+",
        help_text="The request filed when an admin accepted this suggestion",
    )
    # The rest of the workstation, from the guest's CPU and memory read through the hypervisor
    # (sizing.guest_engine); the figures are in evidence["guest"], the combined reading in
    # evidence["combined"].
    cpu_action = models.CharField("vCPU advice", max_length=20, choices=SuggestionAction.choices, blank=True)
    suggested_vcpus = models.PositiveSmallIntegerField("suggested vCPUs", null=True, blank=True)
    ram_action = models.CharField("RAM advice", max_length=20, choices=SuggestionAction.choices, blank=True)
    suggested_ram_gib = models.PositiveIntegerField("suggested RAM, GiB", null=True, blank=True)
    combined = models.CharField(
        max_length=20, choices=CombinedKind.choices, blank=True,
        help_text="What the GPU's and the CPU's figures say together when they disagree",
    )

    class Meta:
        ordering = ["vm__name"]
        constraints = [
            models.CheckConstraint(condition=Q(action__in=SuggestionAction.values), name="suggestion_action_valid"),
        ]
        indexes = [models.Index(fields=["action", "computed_at"], name="suggestion_action_idx")]

    def __str__(self):
        return f"{self.vm.name}: {self.get_action_display()}"

    @property
    def is_dismissed(self) -> bool:
        """Dismissed, and the evidence has not changed since."""
        return bool(self.dismissed_key) and self.dismissed_key == self.evidence_key

    def advised_size(self) -> tuple[int | None, int | None]:
        """The vCPUs and RAM (GiB) the suggestion advises changing to, each None where its advice is
        not a resize with a figure (keep, not enough data, no figure)."""
        resize = (SuggestionAction.UPSIZE, SuggestionAction.DOWNSIZE)
        vcpus = self.suggested_vcpus if self.cpu_action in resize else None
        ram_gib = self.suggested_ram_gib if self.ram_action in resize else None
        return vcpus or None, ram_gib or None

    @property
    def advises_size(self) -> bool:
        """Whether the vCPU or RAM advice is a resize with a figure: accepting files it."""
        return self.advised_size() != (None, None)


class OptimizerStatus(models.TextChoices):
    PENDING = "pending", "Queued"
    RUNNING = "running", "Running"
    DONE = "done", "Done"
    FAILED = "failed", "Failed"
    APPLIED = "applied", "Applied"


class OptimizerRun(models.Model):
    """One run of the fleet placement optimizer: what it was asked, how far it got, its plan.

    Runs as a Celery task that writes `progress` as it goes (the page's progress bar reads it);
    the plan in `result` is only a proposal until an admin applies it.
    """

    status = models.CharField(max_length=10, choices=OptimizerStatus.choices, default=OptimizerStatus.PENDING)
    progress = models.FloatField(default=0.0, help_text="0 to 1")
    stage = models.CharField(max_length=120, blank=True)
    params = models.JSONField(default=dict, help_text="Pending changes and options the plan was asked for")
    result = models.JSONField(null=True, blank=True)
    fleet_fingerprint = models.CharField(
        max_length=64, blank=True, help_text="Digest of the placements the plan started from",
    )
    error = models.TextField(blank=True)
    created_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+",
    )
    created_at = models.DateTimeField(auto_now_add=True)
    started_at = models.DateTimeField(null=True, blank=True)
    finished_at = models.DateTimeField(null=True, blank=True)
    applied_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+",
    )
    applied_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-created_at", "-id"]
        constraints = [
            models.CheckConstraint(condition=Q(status__in=OptimizerStatus.values), name="optimizerrun_status_valid"),
            models.CheckConstraint(
                condition=Q(progress__gte=0) & Q(progress__lte=1), name="optimizerrun_progress_range",
            ),
        ]

    def __str__(self):
        return f"Optimizer run {self.pk} ({self.get_status_display()})"


class Feedback(models.Model):
    """How one working day on one VM felt to its artist: a rating of 1 to 5, quick tags and a note.

    Filed by the VM's own artist (`sizing.feedback.file_feedback`), at most one a VM and day: a
    second the same day updates the first. `artist` and `host` are kept as they were when the
    day was rated, so a VM given to someone else later does not show them the previous artist's
    ratings, and the per-host trends follow where the VM ran that day. Right-sizing reads it
    beside the metrics (`sizing.feedback.ratings_by_vm`, `sizing.feedback_rules.feedback_summary`).
    """

    artist = models.ForeignKey(Artist, on_delete=models.CASCADE, related_name="feedback")
    vm = models.ForeignKey(VirtualMachine, on_delete=models.CASCADE, related_name="feedback", verbose_name="VM")
    host = models.ForeignKey(
        Host, null=True, blank=True, on_delete=models.SET_NULL, related_name="+",
        help_text="The VM's host on the day rated",
    )
    rating = models.PositiveSmallIntegerField(
        validators=[MinValueValidator(feedback_rules.RATING_MIN), MaxValueValidator(feedback_rules.RATING_MAX)],
        help_text="1 (could not work) to 5 (smooth)",
    )
    tags = models.JSONField(default=list, blank=True, help_text="Quick tags: " + ", ".join(feedback_rules.TAGS))
    note = models.TextField(blank=True, max_length=feedback_rules.NOTE_MAX_CHARS)
    session_date = models.DateField("day rated", default=timezone.localdate)
    created_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+",
    )
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["-session_date", "-id"]
        verbose_name_plural = "feedback"
        constraints = [
            models.UniqueConstraint(fields=["vm", "session_date"], name="feedback_one_per_vm_day"),
            models.CheckConstraint(
                condition=Q(rating__gte=feedback_rules.RATING_MIN) & Q(rating__lte=feedback_rules.RATING_MAX),
                name="feedback_rating_1_to_5",
            ),
        ]
        indexes = [
            models.Index(fields=["session_date"], name="feedback_day_idx"),
            models.Index(fields=["artist", "session_date"], name="feedback_artist_day_idx"),
        ]

    def __str__(self):
        return f"{self.vm.name} on {self.session_date}: {self.rating}/5"

    def tag_labels(self) -> list[str]:
        return [feedback_rules.TAG_LABELS.get(tag, tag) for tag in self.tags]


class FeedbackPrompt(models.Model):
    """An artist's "Not now" to the day's feedback prompt, so it is not shown again that day.

    One row a user and day; the prompt is due again the next day.
    """

    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="+")
    day = models.DateField()
    dismissed_at = models.DateTimeField(default=timezone.now)

    class Meta:
        ordering = ["-day", "-id"]
        constraints = [models.UniqueConstraint(fields=["user", "day"], name="feedbackprompt_one_per_user_day")]

    def __str__(self):
        return f"Feedback prompt dismissed on {self.day}"

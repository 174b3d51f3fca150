"""Enumerations of the fleet inventory, shared by models, API and forms."""

from django.db import models
from django.db.models import TextChoices


class Series(models.TextChoices):
    """vGPU profile series; the licence a VM needs follows from it."""

    Q = "Q", "Q: virtual workstation (vWS)"
    B = "B", "B: virtual PC (vPC)"
    A = "A", "A: app streaming (vApps)"
    C = "C", "C: compute (AI Enterprise)"


class GpuMode(models.TextChoices):
    VGPU = "vgpu", "vGPU (shared)"
    PASSTHROUGH = "passthrough", "Passthrough (whole GPU to one VM)"


class SizeMode(models.TextChoices):
    EQUAL = "equal", "Equal-size"
    MIXED = "mixed", "Mixed-size"


class Hypervisor(models.TextChoices):
    KVM = "kvm", "Linux KVM"
    ESXI = "esxi", "VMware vSphere ESXi"
    PROXMOX = "proxmox", "Proxmox VE"
    XENSERVER = "xenserver", "Citrix XenServer"
    NUTANIX = "nutanix", "Nutanix AHV"
    HYPERV = "hyperv", "Microsoft Hyper-V"
    OTHER = "other", "Other"


class Workflow(models.TextChoices):
    MODELING = "modeling", "Modeling"
    TEXTURING = "texturing", "Texturing"
    SHADING = "shading", "Shading"
    ANIMATION = "animation", "Animation"
    LIGHTING = "lighting", "Lighting"
    RENDERING = "rendering", "Rendering"
    LAYOUT = "layout", "Layout"
    FX = "fx", "FX"
    COMPOSITING = "compositing", "Compositing"
    OTHER = "other", "Other"


class UserType(models.TextChoices):
    LIGHT = "light", "Light"
    MEDIUM = "medium", "Medium"
    HEAVY = "heavy", "Heavy"


class ResizeStatus(TextChoices):
    PENDING = "pending", "Pending"
    APPROVED = "approved", "Approved and applied"
    REJECTED = "rejected", "Rejected"
    CANCELLED = "cancelled", "Cancelled"
    # On a host linked to its hypervisor, approval reserves the change in the inventory and an
    # operation carries it out; it ends approved, or failed (rolled back, with the reason).
    APPLYING = "applying", "Approved, being applied"
    FAILED = "failed", "Approved, but applying failed"


class SchedulerPolicyName(TextChoices):
    """The vGPU time-sliced scheduler's policies (vgpu-facts.md section 3)."""

    BEST_EFFORT = "best_effort", "Best effort"
    EQUAL_SHARE = "equal_share", "Equal share"
    FIXED_SHARE = "fixed_share", "Fixed share"


class SchedulerScope(TextChoices):
    """What a scheduler policy row applies to: one GPU, or the default for a host or a model."""

    GPU = "gpu", "GPU"
    HOST = "host", "Host default"
    GPU_MODEL = "gpu_model", "GPU model default"


class SchedulerApplyState(TextChoices):
    """Where a GPU's desired scheduler state stands against the driver."""

    DESIRED = "desired", "Desired, not applied yet"
    STAGED = "staged", "Staged until the GPU is empty or the driver reloads"
    APPLYING = "applying", "Being applied through the agent"
    APPLIED = "applied", "Applied"
    FAILED = "failed", "Applying failed"


class AuditSource(TextChoices):
    """Where an audited change came from."""

    WEB = "web", "Web page"
    API = "api", "REST API"
    ADMIN = "admin", "Admin site"
    SYSTEM = "system", "System (worker, command)"
    AGENT = "agent", "Agent"


class TokenScope(TextChoices):
    """What an API token may do (`fleet.token_rules`): read, read and write, or push samples only.

    Tokens issued before scopes existed are `write`: they kept what they could do."""

    READ = "read", "Read only"
    WRITE = "write", "Read and write"
    INGEST = "ingest", "Ingest (push samples only)"


class TokenState(TextChoices):
    """Whether an API token signs in now; a revoked or expired one is refused with the reason."""

    ACTIVE = "active", "Active"
    EXPIRED = "expired", "Expired"
    REVOKED = "revoked", "Revoked"

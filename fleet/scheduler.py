"""vGPU scheduler rules: validation, defaults, the commands that apply a policy, and drift.

Pure (no ORM), so every rule is tested without a database. The source of truth is
/work/shared/reference/vgpu-facts.md section 3:

- policies: best effort (the driver's default), equal share, fixed share; fixed share gives
  each vGPU 1/(its type's max count), so it is impossible in mixed-size mode;
- adaptive round-robin (ARR, default for equal/fixed share): frequency 63-960 Hz, averaging
  factor 1-60 (default 33); without ARR a time slice of 1-30 ms; defaults 2 ms / 480 Hz when
  the type's max count is <= 8, else 1 ms / 960 Hz;
- `nvidia-smi vgpu -i <gpu> set-scheduler-state -p 1|2|3 -a 0|1 [-asf <Hz>] [-aavg <n>] [-ts <ns>]`
  applies it to the running driver (not persistent); the registry key RmPVMRL makes it
  persistent (driver reload or reboot).

A blank optional value (frequency, averaging factor, time slice) means "the driver's default":
the commands leave its flag out, and `defaults` says what that default is for the page.
"""

from __future__ import annotations

from dataclasses import dataclass, field

BEST_EFFORT = "best_effort"
EQUAL_SHARE = "equal_share"
FIXED_SHARE = "fixed_share"
POLICIES = (BEST_EFFORT, EQUAL_SHARE, FIXED_SHARE)
POLICY_LABELS = {BEST_EFFORT: "best effort", EQUAL_SHARE: "equal share", FIXED_SHARE: "fixed share"}
#: `nvidia-smi ... set-scheduler-state -p` numbers, the same as NVML's NVML_VGPU_SCHEDULER_POLICY_*.
POLICY_NUMBERS = {BEST_EFFORT: 1, EQUAL_SHARE: 2, FIXED_SHARE: 3}

FREQUENCY_HZ_MIN, FREQUENCY_HZ_MAX = 63, 960
AVG_FACTOR_MIN, AVG_FACTOR_MAX = 1, 60
TIMESLICE_MS_MIN, TIMESLICE_MS_MAX = 1, 30
DEFAULT_AVG_FACTOR = 33
#: A type whose max count per GPU is at most this gets the longer default slice (2 ms / 480 Hz).
SMALL_MAX_COUNT = 8
NS_PER_MS = 1_000_000

# RmPVMRL low byte, exactly the values vgpu-facts.md lists.
RMPVMRL_BEST_EFFORT = 0x00
RMPVMRL_EQUAL_ARR = 0x01
RMPVMRL_EQUAL_NO_ARR = 0x03
RMPVMRL_FIXED_ARR = 0x11
RMPVMRL_FIXED_NO_ARR = 0x13

HYPERVISORS_WITH_MODPROBE = ("kvm", "proxmox", "xenserver", "nutanix")  # Proxmox VE: Debian's modprobe.d
MODPROBE_FILE = "/etc/modprobe.d/nvidia.conf"

NOT_PERSISTENT_ARR = (
    "The ARR frequency and averaging factor have no RmPVMRL encoding in the reference, so they are not "
    "persistent: after a driver reload the driver uses its defaults until the nvidia-smi line is run again."
)


@dataclass(frozen=True)
class SchedulerSettings:
    """What an admin asks of one GPU's scheduler; None in an optional field means the driver's default."""

    policy: str = BEST_EFFORT
    arr: bool = False
    frequency_hz: int | None = None
    avg_factor: int | None = None
    timeslice_ms: int | None = None

    def as_dict(self) -> dict:
        return {"policy": self.policy, "arr": self.arr, "frequency_hz": self.frequency_hz,
                "avg_factor": self.avg_factor, "timeslice_ms": self.timeslice_ms}


@dataclass(frozen=True)
class FieldError:
    """One broken rule, with the field it belongs to (the form or API field name)."""

    field: str
    message: str


@dataclass
class Commands:
    """How an admin applies settings by hand: the runtime line, the persistent lines, and caveats."""

    runtime: str
    rmpvmrl: str
    persistent: list[tuple[str, str]] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)


def default_timeslice_ms(max_count: int | None) -> int:
    """The driver's time slice without ARR: 2 ms for types of at most 8 per GPU, else 1 ms."""
    return 2 if max_count is None or max_count <= SMALL_MAX_COUNT else 1


def default_frequency_hz(max_count: int | None) -> int:
    """The driver's ARR scheduling frequency: 480 Hz for types of at most 8 per GPU, else 960 Hz."""
    return 480 if max_count is None or max_count <= SMALL_MAX_COUNT else 960


def defaults(policy: str, max_count: int | None) -> SchedulerSettings:
    """The settings the driver uses for `policy` when nothing else is given: ARR on for equal and
    fixed share with averaging factor 33 and the type's frequency; best effort has no parameters."""
    if policy == BEST_EFFORT:
        return SchedulerSettings(policy=BEST_EFFORT)
    return SchedulerSettings(policy=policy, arr=True, frequency_hz=default_frequency_hz(max_count),
                             avg_factor=DEFAULT_AVG_FACTOR)


def with_defaults(settings: SchedulerSettings, max_count: int | None) -> SchedulerSettings:
    """`settings` with each blank parameter that applies replaced by the driver's default (for display)."""
    if settings.policy == BEST_EFFORT:
        return settings
    if settings.arr:
        return SchedulerSettings(
            policy=settings.policy, arr=True,
            frequency_hz=settings.frequency_hz or default_frequency_hz(max_count),
            avg_factor=settings.avg_factor or DEFAULT_AVG_FACTOR,
        )
    return SchedulerSettings(policy=settings.policy, arr=False,
                             timeslice_ms=settings.timeslice_ms or default_timeslice_ms(max_count))


def _out_of_range(value: int | None, low: int, high: int) -> bool:
    return value is not None and not low <= value <= high


def validate(settings: SchedulerSettings, size_mode: str = "equal") -> list[FieldError]:
    """Every rule `settings` breaks on a GPU in `size_mode` ("equal" or "mixed"); empty when valid.

    Whether the GPU holds vGPUs is not a validation rule: such a change is staged (`staging_reason`).
    """
    errors: list[FieldError] = []
    if settings.policy not in POLICIES:
        errors.append(FieldError("policy", f"Unknown policy {settings.policy!r}; choose best_effort, "
                                           "equal_share or fixed_share."))
        return errors
    if settings.policy == FIXED_SHARE and size_mode == "mixed":
        errors.append(FieldError("policy", "Fixed share is impossible in mixed-size mode: it gives each vGPU "
                                           "1/(its type's max count), which needs vGPUs of one size. "
                                           "Use equal share, or switch the GPU to equal-size mode."))
    if settings.policy == BEST_EFFORT:
        if settings.arr:
            errors.append(FieldError("arr", "Adaptive round-robin applies only to equal share and fixed share, "
                                            "not to best effort."))
        if settings.timeslice_ms is not None:
            errors.append(FieldError("timeslice_ms", "A time slice applies only to equal share and fixed share, "
                                                     "not to best effort."))
    if not settings.arr:
        if settings.frequency_hz is not None:
            errors.append(FieldError("frequency_hz", "The scheduling frequency applies only with adaptive "
                                                     "round-robin on."))
        if settings.avg_factor is not None:
            errors.append(FieldError("avg_factor", "The averaging factor applies only with adaptive "
                                                   "round-robin on."))
    elif settings.timeslice_ms is not None:
        errors.append(FieldError("timeslice_ms", "A time slice applies only with adaptive round-robin off; "
                                                 "with ARR the scheduling frequency sets the slice."))
    if _out_of_range(settings.frequency_hz, FREQUENCY_HZ_MIN, FREQUENCY_HZ_MAX):
        errors.append(FieldError("frequency_hz", f"The scheduling frequency must be {FREQUENCY_HZ_MIN}-"
                                                 f"{FREQUENCY_HZ_MAX} Hz, not {settings.frequency_hz}."))
    if _out_of_range(settings.avg_factor, AVG_FACTOR_MIN, AVG_FACTOR_MAX):
        errors.append(FieldError("avg_factor", f"The averaging factor must be {AVG_FACTOR_MIN}-{AVG_FACTOR_MAX}, "
                                               f"not {settings.avg_factor}."))
    if _out_of_range(settings.timeslice_ms, TIMESLICE_MS_MIN, TIMESLICE_MS_MAX):
        errors.append(FieldError("timeslice_ms", f"The time slice must be {TIMESLICE_MS_MIN}-{TIMESLICE_MS_MAX} ms, "
                                                 f"not {settings.timeslice_ms}."))
    return errors


def staging_reason(vgpu_count: int) -> str:
    """Why a change cannot be applied now ("" when it can): the scheduler only changes on an empty GPU."""
    if vgpu_count <= 0:
        return ""
    noun = "vGPU" if vgpu_count == 1 else "vGPUs"
    return f"the GPU holds {vgpu_count} {noun}; staged until it is empty or the driver reloads"


def rmpvmrl_value(settings: SchedulerSettings) -> int:
    """The RmPVMRL registry value of `settings`, as vgpu-facts.md gives it.

    0x00 best effort; 0x01 / 0x11 equal / fixed share with ARR; 0x03 / 0x13 without ARR at the
    driver's time slice. An explicit time slice (ms) goes in the upper 16 bits over the low byte
    0x01 / 0x11, exactly as the reference's examples 0x00030001 (equal share, 3 ms) and 0x00180011
    (fixed share, 24 ms). The ARR frequency and averaging factor have no encoding (NOT_PERSISTENT_ARR).
    """
    if settings.policy == BEST_EFFORT:
        return RMPVMRL_BEST_EFFORT
    fixed = settings.policy == FIXED_SHARE
    if settings.arr:
        return RMPVMRL_FIXED_ARR if fixed else RMPVMRL_EQUAL_ARR
    if settings.timeslice_ms is None:
        return RMPVMRL_FIXED_NO_ARR if fixed else RMPVMRL_EQUAL_NO_ARR
    return (settings.timeslice_ms << 16) | (RMPVMRL_FIXED_ARR if fixed else RMPVMRL_EQUAL_ARR)


def format_rmpvmrl(value: int) -> str:
    """0x00 / 0x13 for the low-byte values, 0x00030001 (eight digits) once a time slice is in."""
    return f"0x{value:08X}" if value > 0xFF else f"0x{value:02X}"


def nvidia_smi_line(settings: SchedulerSettings, gpu: str | int) -> str:
    """The `nvidia-smi vgpu set-scheduler-state` line; -ts takes nanoseconds (vgpu-facts.md)."""
    parts = ["nvidia-smi", "vgpu", "-i", str(gpu), "set-scheduler-state",
             "-p", str(POLICY_NUMBERS[settings.policy]), "-a", "1" if settings.arr else "0"]
    if settings.arr:
        if settings.frequency_hz is not None:
            parts += ["-asf", str(settings.frequency_hz)]
        if settings.avg_factor is not None:
            parts += ["-aavg", str(settings.avg_factor)]
    elif settings.timeslice_ms is not None:
        parts += ["-ts", str(settings.timeslice_ms * NS_PER_MS)]
    return " ".join(parts)


def linux_pci_address(pci_bus_id: str) -> str:
    """NVML's "00000000:86:00.0" as the kernel writes it ("0000:86:00.0"), the form of `pci=` in
    NVreg_RegistryDwordsPerDevice."""
    domain, _, rest = pci_bus_id.strip().partition(":")
    if not rest:
        return pci_bus_id.strip().lower()
    return f"{domain[-4:].zfill(4)}:{rest}".lower()


def commands(settings: SchedulerSettings, gpu: str | int, hypervisor: str, pci_bus_id: str = "") -> Commands:
    """The exact lines an admin runs to apply `settings` to GPU `gpu` (PCI bus id or index) on a host
    running `hypervisor`: the runtime nvidia-smi line and the persistent RmPVMRL lines."""
    value = format_rmpvmrl(rmpvmrl_value(settings))
    result = Commands(runtime=nvidia_smi_line(settings, gpu), rmpvmrl=value)
    if hypervisor == "esxi":
        result.persistent.append(
            ("ESXi (all GPUs of the host)",
             f'esxcli system module parameters set -m nvidia -p "NVreg_RegistryDwords=RmPVMRL={value}"'))
    elif hypervisor in HYPERVISORS_WITH_MODPROBE:
        result.persistent.append(
            (f"{MODPROBE_FILE} (all GPUs of the host)", f'options nvidia NVreg_RegistryDwords="RmPVMRL={value}"'))
        if pci_bus_id:
            result.persistent.append(
                (f"{MODPROBE_FILE} (this GPU only)",
                 f'options nvidia NVreg_RegistryDwordsPerDevice="pci={linux_pci_address(pci_bus_id)};'
                 f'RmPVMRL={value}"'))
    else:
        result.notes.append(f"The reference gives no persistent registry line for the {hypervisor} hypervisor; "
                            "use the nvidia-smi line after each driver load.")
    result.notes.append("The nvidia-smi line needs no vGPU on the GPU and lasts until the driver reloads; "
                        "the RmPVMRL line takes effect at the next driver reload or reboot.")
    if settings.arr and (settings.frequency_hz is not None or settings.avg_factor is not None):
        result.notes.append(NOT_PERSISTENT_ARR)
    return result


def _reported_arr(reported: dict, policy: str) -> bool | None:
    mode = reported.get("arr_mode")
    if mode == "enabled":
        return True
    if mode == "disabled":
        return False
    if mode == "default":
        # ARR is the default for equal and fixed share (vGPU 15+); best effort has none.
        return policy != BEST_EFFORT
    return None


def drift(desired: SchedulerSettings, reported: dict | None) -> list[str]:
    """Fields where the agent's reading (`reported`, Gpu.scheduler_reported) differs from `desired`.

    Parameters left blank in `desired` (the driver's default) are not compared; no reading gives [].
    """
    if not reported:
        return []
    fields = []
    if reported.get("policy") != desired.policy:
        fields.append("policy")
    reported_policy = reported.get("policy") or BEST_EFFORT
    if desired.policy != BEST_EFFORT and _reported_arr(reported, reported_policy) != desired.arr:
        fields.append("arr")
    if desired.arr:
        if desired.frequency_hz is not None and reported.get("frequency_hz") != desired.frequency_hz:
            fields.append("frequency_hz")
        if desired.avg_factor is not None and reported.get("avg_factor") != desired.avg_factor:
            fields.append("avg_factor")
    elif desired.timeslice_ms is not None:
        timeslice = reported.get("timeslice_ms")
        if timeslice is None or abs(float(timeslice) - desired.timeslice_ms) > 0.01:
            fields.append("timeslice_ms")
    return fields

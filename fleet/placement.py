"""The rules that decide whether a vGPU fits: the one authority for API, admin and forms.

Pure functions over plain dataclasses, no ORM: `fleet.services` loads the state of the
rows involved (under row locks), calls these functions and writes the result. Every rule
mirrors what NVIDIA vGPU software refuses (../shared/reference/vgpu-facts.md, sections 1
and 2), and every refusal names its rule and the numbers behind it, so an admin can see
at a glance what would have to change for the placement to succeed.

Mixed-size placement. In mixed-size mode NVIDIA places vGPUs at aligned *placement IDs*.
We model a GPU's frame buffer as a grid of `PLACEMENT_GRID` equal units; a profile whose
mixed-size maximum is n occupies a span of `PLACEMENT_GRID / 2**ceil(log2 n)` units,
starts only at multiples of its span, and only the first n such starts exist. This
reproduces every mixed-size maximum in NVIDIA's tables (e.g. L40S-8Q: 6 equal / 4 mixed,
because each 8Q sits in a 12 GB aligned span; A40-1Q: 30 of 32 one-unit slots) and the
behaviour the user guide warns of: free memory that is not an aligned free span is unusable.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from config.errors import Refusal

PLACEMENT_GRID = 32
MAX_VGPUS_PER_VM = 4
#: The largest VM a resize request may ask for: vSphere 8's per-VM maximums (768 vCPUs, 24 TiB),
#: the highest of the hypervisors the product drives; the host's capacity is the real bound.
MAX_VCPUS_PER_VM = 768
MAX_RAM_GIB_PER_VM = 24 * 1024


class Rule:
    """Stable codes of the placement rules; the API returns them, scripts may match on them."""

    PROFILE_MODEL = "profile_model"
    PASSTHROUGH = "passthrough"
    EQUAL_SIZE = "equal_size"
    MIXED_SIZE_PROFILE = "mixed_size_profile"
    MAX_PER_GPU = "max_per_gpu"
    FRAME_BUFFER = "frame_buffer"
    PLACEMENT_SLOT = "placement_slot"
    VM_MAX_VGPUS = "vm_max_vgpus"
    VM_HOST = "vm_host"
    VM_BOARD_SERIES = "vm_board_series"
    MULTI_VGPU_FULL_ONLY = "multi_vgpu_full_only"
    VM_SAME_GPU = "vm_same_gpu"
    HOST_VCPU = "host_vcpu"
    HOST_RAM = "host_ram"
    SIZE_MODE_UNSUPPORTED = "size_mode_unsupported"
    GPU_BUSY = "gpu_busy"
    # Not a rule of NVIDIA's: a row the change rests on changed or went away while it waited for its lock.
    FLEET_CHANGED = "fleet_changed"


@dataclass(frozen=True)
class Violation:
    """One broken rule: `rule` is a `Rule` code, `message` the sentence shown to people."""

    rule: str
    message: str

    def __str__(self) -> str:
        return self.message


class PlacementError(Refusal):
    """Raised by services when the rules refuse a change; carries every violation found and,
    for a placement on a GPU, the name of the host asked about: the text then starts
    "On host <name>: " and each violation's dict carries `host`, so a refusal read among several
    (a script placing many vGPUs, an approval that tried every host) says where. The violations'
    own messages stay as they are (a form beside the chosen GPU shows them)."""

    def __init__(self, violations: list[Violation], host: str = ""):
        self.violations = list(violations)
        self.host = host
        text = "; ".join(v.message for v in self.violations)
        super().__init__(f"On host {host}: {text}" if host else text)

    def violation_dicts(self) -> list[dict]:
        where = {"host": self.host} if self.host else {}
        return [{"rule": v.rule, "message": v.message, **where} for v in self.violations]

    @property
    def rules(self) -> list[str]:
        return [v.rule for v in self.violations]


@dataclass(frozen=True)
class GpuModelSpec:
    """What a board model allows: its frame buffer and its vGPU capabilities."""

    name: str
    fb_mib: int
    mixed_size_capable: bool = False
    # Quadro RTX 6000/8000 and T4: a VM with several vGPUs may only combine full-GPU profiles.
    multi_vgpu_full_only: bool = False


@dataclass(frozen=True)
class ProfileSpec:
    """A vGPU type. `max_per_gpu_mixed` is None where the type is not offered in mixed-size mode."""

    id: int
    name: str
    gpu_model: str
    series: str
    fb_mib: int
    max_per_gpu: int
    max_per_gpu_mixed: int | None = None
    max_per_vm: int = MAX_VGPUS_PER_VM


@dataclass(frozen=True)
class PlacedVgpu:
    """A vGPU already on a GPU: its profile, its VM and its placement ID."""

    profile: ProfileSpec
    vm_id: int
    placement_id: int | None = None


@dataclass(frozen=True)
class GpuState:
    """A physical GPU and the vGPUs it holds now."""

    id: int
    label: str
    host_id: int
    model: GpuModelSpec
    mode: str = "vgpu"
    size_mode: str = "equal"
    vgpus: tuple[PlacedVgpu, ...] = ()

    @property
    def used_fb_mib(self) -> int:
        return sum(v.profile.fb_mib for v in self.vgpus)

    @property
    def free_fb_mib(self) -> int:
        return self.model.fb_mib - self.used_fb_mib


@dataclass(frozen=True)
class VmVgpu:
    """One vGPU a VM already holds, with where it sits."""

    profile: ProfileSpec
    gpu_id: int
    host_id: int


@dataclass(frozen=True)
class VmState:
    """A VM: its size and the vGPUs it holds now (which pin it to one host)."""

    id: int
    name: str
    vcpus: int
    ram_gib: int
    host_id: int | None = None
    vgpus: tuple[VmVgpu, ...] = ()


@dataclass(frozen=True)
class HostState:
    """A host's capacity and what the VMs already on it claim (the VM being placed excluded)."""

    id: int
    name: str
    cpu_threads: int
    ram_gib: int
    vcpu_overcommit: float = 1.0
    ram_overcommit: float = 1.0
    allocated_vcpus: int = 0
    allocated_ram_gib: int = 0
    # Whether one VM's vGPUs may share a physical GPU here (Host.multi_vgpu_same_gpu): only
    # recent vGPU releases on supported hypervisors allow it, and a VM asks for several vGPUs
    # to get more GPUs, so by default they go to distinct GPUs.
    multi_vgpu_same_gpu: bool = False

    @property
    def vcpu_capacity(self) -> int:
        return _whole(self.cpu_threads * self.vcpu_overcommit)

    @property
    def ram_capacity_gib(self) -> int:
        return _whole(self.ram_gib * self.ram_overcommit)


def _whole(amount: float) -> int:
    """Whole units in `amount`, a product with a decimal overcommit: 45 x 1.4 is 63, although
    binary floating point computes 62.99999999999999 (plain int() would make it 62)."""
    return int(round(amount, 6))


@dataclass
class Decision:
    """The answer to "does it fit?": violations (empty when it fits) and the placement ID to use."""

    violations: list[Violation] = field(default_factory=list)
    placement_id: int | None = None
    #: The host asked about (named by the refusal), where the question was about one.
    host_name: str = ""

    @property
    def ok(self) -> bool:
        return not self.violations

    def raise_if_refused(self) -> Decision:
        if self.violations:
            raise PlacementError(self.violations, host=self.host_name)
        return self


def mixed_span_units(profile: ProfileSpec) -> int:
    """Grid units one vGPU of `profile` occupies in mixed-size mode (see module docstring)."""
    count = profile.max_per_gpu_mixed or 1
    slots = 1
    while slots < count:
        slots *= 2
    return max(PLACEMENT_GRID // slots, 1)


def mixed_placement_ids(profile: ProfileSpec) -> list[int]:
    """Every placement ID at which `profile` may start in mixed-size mode."""
    span = mixed_span_units(profile)
    return [k * span for k in range(profile.max_per_gpu_mixed or 0)]


def _first_free_mixed_slot(gpu: GpuState, profile: ProfileSpec) -> int | None:
    taken = [
        (v.placement_id, v.placement_id + mixed_span_units(v.profile))
        for v in gpu.vgpus
        if v.placement_id is not None
    ]
    span = mixed_span_units(profile)
    for start in mixed_placement_ids(profile):
        if all(start + span <= lo or start >= hi for lo, hi in taken):
            return start
    return None


def _first_free_equal_slot(gpu: GpuState, profile: ProfileSpec) -> int | None:
    taken = {v.placement_id for v in gpu.vgpus}
    for index in range(profile.max_per_gpu):
        if index not in taken:
            return index
    return None


def _gpu_rules(gpu: GpuState, profile: ProfileSpec) -> Decision:
    decision = Decision()
    refuse = decision.violations.append
    if profile.gpu_model != gpu.model.name:
        refuse(Violation(
            Rule.PROFILE_MODEL,
            f"{profile.name} is a {profile.gpu_model} profile; GPU {gpu.label} is a {gpu.model.name}",
        ))
        return decision
    if gpu.mode == "passthrough":
        refuse(Violation(
            Rule.PASSTHROUGH,
            f"GPU {gpu.label} is in passthrough mode and hosts no vGPU",
        ))
        return decision

    if profile.fb_mib > gpu.free_fb_mib:
        refuse(Violation(
            Rule.FRAME_BUFFER,
            f"{profile.name} needs {profile.fb_mib} MiB; GPU {gpu.label} has {gpu.free_fb_mib} MiB free "
            f"of {gpu.model.fb_mib} MiB",
        ))

    same_profile = sum(1 for v in gpu.vgpus if v.profile.id == profile.id)
    if gpu.size_mode == "mixed":
        if not profile.max_per_gpu_mixed:
            refuse(Violation(
                Rule.MIXED_SIZE_PROFILE,
                f"{profile.name} is not offered in mixed-size mode; GPU {gpu.label} is in mixed-size mode",
            ))
            return decision
        if same_profile + 1 > profile.max_per_gpu_mixed:
            refuse(Violation(
                Rule.MAX_PER_GPU,
                f"{profile.name} allows {profile.max_per_gpu_mixed} per GPU in mixed-size mode; "
                f"GPU {gpu.label} already has {same_profile}",
            ))
        elif not decision.violations:
            decision.placement_id = _first_free_mixed_slot(gpu, profile)
            if decision.placement_id is None:
                refuse(Violation(
                    Rule.PLACEMENT_SLOT,
                    f"{profile.name} needs an aligned span of {_span_mib(gpu, profile)} MiB; "
                    f"GPU {gpu.label} has {gpu.free_fb_mib} MiB free but no aligned span of that size",
                ))
        return decision

    other_sizes = sorted({v.profile.fb_mib for v in gpu.vgpus if v.profile.fb_mib != profile.fb_mib})
    if other_sizes:
        refuse(Violation(
            Rule.EQUAL_SIZE,
            f"GPU {gpu.label} is in equal-size mode and holds {other_sizes[0]} MiB vGPUs; "
            f"{profile.name} has {profile.fb_mib} MiB",
        ))
        return decision
    if len(gpu.vgpus) + 1 > profile.max_per_gpu:
        refuse(Violation(
            Rule.MAX_PER_GPU,
            f"{profile.name} allows {profile.max_per_gpu} per GPU; GPU {gpu.label} already has {len(gpu.vgpus)}",
        ))
    if not decision.violations:
        decision.placement_id = _first_free_equal_slot(gpu, profile)
    return decision


def _span_mib(gpu: GpuState, profile: ProfileSpec) -> int:
    return gpu.model.fb_mib * mixed_span_units(profile) // PLACEMENT_GRID


def _vm_rules(gpu: GpuState, profile: ProfileSpec, vm: VmState) -> list[Violation]:
    violations: list[Violation] = []
    if not vm.vgpus:
        return violations
    refuse = violations.append
    limit = min([profile.max_per_vm, MAX_VGPUS_PER_VM] + [v.profile.max_per_vm for v in vm.vgpus])
    if len(vm.vgpus) + 1 > limit:
        refuse(Violation(
            Rule.VM_MAX_VGPUS,
            f"VM {vm.name} has {len(vm.vgpus)} vGPU(s); at most {limit} per VM with "
            f"{', '.join(sorted({v.profile.name for v in vm.vgpus} | {profile.name}))}",
        ))
    hosts = {v.host_id for v in vm.vgpus}
    if hosts != {gpu.host_id}:
        refuse(Violation(
            Rule.VM_HOST,
            f"VM {vm.name} runs on another host; all vGPUs of a VM must be on GPUs of one host",
        ))
    mismatched = [
        v.profile.name for v in vm.vgpus
        if v.profile.gpu_model != profile.gpu_model or v.profile.series != profile.series
    ]
    if mismatched:
        refuse(Violation(
            Rule.VM_BOARD_SERIES,
            f"VM {vm.name} holds {mismatched[0]}; the vGPUs of one VM must share board and series "
            f"({profile.name} is {profile.gpu_model}, series {profile.series})",
        ))
    if gpu.model.multi_vgpu_full_only:
        partial = [p.name for p in [profile, *(v.profile for v in vm.vgpus)] if p.fb_mib < gpu.model.fb_mib]
        if partial:
            refuse(Violation(
                Rule.MULTI_VGPU_FULL_ONLY,
                f"On {gpu.model.name} a VM with several vGPUs may only use full-GPU profiles "
                f"({gpu.model.fb_mib} MiB); {partial[0]} is smaller",
            ))
    return violations


def check_vm_fits_host(vm_name: str, vcpus: int, ram_gib: int, host: HostState) -> list[Violation]:
    """Whether a VM of this size fits the host's vCPU and RAM capacity beside the VMs already on it."""
    violations = []
    if host.allocated_vcpus + vcpus > host.vcpu_capacity:
        violations.append(Violation(
            Rule.HOST_VCPU,
            f"VM {vm_name} needs {vcpus} vCPUs; host {host.name} has "
            f"{max(host.vcpu_capacity - host.allocated_vcpus, 0)} of {host.vcpu_capacity} vCPUs free "
            f"({host.cpu_threads} threads x {host.vcpu_overcommit:g} overcommit)",
        ))
    if host.allocated_ram_gib + ram_gib > host.ram_capacity_gib:
        violations.append(Violation(
            Rule.HOST_RAM,
            f"VM {vm_name} needs {ram_gib} GiB RAM; host {host.name} has "
            f"{max(host.ram_capacity_gib - host.allocated_ram_gib, 0)} of {host.ram_capacity_gib} GiB free "
            f"({host.ram_gib} GiB x {host.ram_overcommit:g} overcommit)",
        ))
    return violations


def same_gpu_refusal(gpu: GpuState, vm: VmState, host: HostState) -> Violation | None:
    """Why `vm` may not take another vGPU on `gpu` because it holds one there already (None
    when it may): a VM's vGPUs go to distinct physical GPUs unless the host allows several
    on one GPU (`HostState.multi_vgpu_same_gpu`)."""
    if host.multi_vgpu_same_gpu or not any(v.gpu_id == gpu.id for v in vm.vgpus):
        return None
    return Violation(
        Rule.VM_SAME_GPU,
        f"VM {vm.name} already holds a vGPU on GPU {gpu.label}; host {host.name} puts each vGPU of a VM on a "
        f"GPU of its own (allow several on one GPU in the host's settings where its vGPU release and "
        f"hypervisor support it)",
    )


def check_placement(gpu: GpuState, profile: ProfileSpec, vm: VmState, host: HostState) -> Decision:
    """Whether a new vGPU of `profile` for `vm` fits on `gpu` of `host`.

    Returns a Decision with every violation found (so the admin fixes them all at once)
    and, when it fits, the placement ID the new vGPU takes.
    """
    decision = _gpu_rules(gpu, profile)
    decision.violations.extend(_vm_rules(gpu, profile, vm))
    if refusal := same_gpu_refusal(gpu, vm, host):
        decision.violations.append(refusal)
    # A VM not yet counted on this host moves there with this vGPU. Its recorded host, not
    # whether it holds vGPUs, says so: a VM left recorded on another host must fit this one.
    if vm.host_id != host.id:
        decision.violations.extend(check_vm_fits_host(vm.name, vm.vcpus, vm.ram_gib, host))
    if decision.violations:
        decision.placement_id = None
    decision.host_name = host.name
    return decision


def check_gpu_fit(gpu: GpuState, profile: ProfileSpec) -> Decision:
    """Whether one more vGPU of `profile` fits on `gpu` by the GPU's own rules alone (model,
    passthrough, equal or mixed size, maximum per GPU, frame buffer, placement slot).

    For questions asked before a VM is chosen ("where could a new 12Q go?", fleet.capacity);
    `check_placement` applies these same rules and adds those of the VM and its host.
    """
    return _gpu_rules(gpu, profile)


def check_gpu_change(gpu: GpuState, mode: str, size_mode: str,
                     model: GpuModelSpec | None = None, host_id: int | None = None) -> list[Violation]:
    """Whether a GPU may take this mode, size mode, model and host now.

    NVIDIA allows a switch of passthrough or of size mode only while the GPU holds no
    vGPU, and mixed-size mode only on models that support it. A GPU that holds vGPUs
    cannot move to another host or model either: its vGPUs would be left behind.
    """
    model = model or gpu.model
    host_id = gpu.host_id if host_id is None else host_id
    violations = []
    if size_mode == "mixed" and not model.mixed_size_capable:
        violations.append(Violation(
            Rule.SIZE_MODE_UNSUPPORTED,
            f"{model.name} does not support mixed-size mode",
        ))
    changed = [name for name, old, new in (
        ("mode", gpu.mode, mode), ("size mode", gpu.size_mode, size_mode),
        ("model", gpu.model.name, model.name), ("host", gpu.host_id, host_id),
    ) if old != new]
    if changed and gpu.vgpus:
        violations.append(Violation(
            Rule.GPU_BUSY,
            f"GPU {gpu.label} holds {len(gpu.vgpus)} vGPU(s); its {' and '.join(changed)} can change "
            f"only while it holds none",
        ))
    return violations


def check_host_capacity(host: HostState, cpu_threads: int, ram_gib: int,
                        vcpu_overcommit: float, ram_overcommit: float) -> list[Violation]:
    """Whether a host's capacity may shrink to these figures with the VMs it runs now."""
    resized = HostState(
        id=host.id, name=host.name, cpu_threads=cpu_threads, ram_gib=ram_gib,
        vcpu_overcommit=vcpu_overcommit, ram_overcommit=ram_overcommit,
    )
    violations = []
    if host.allocated_vcpus > resized.vcpu_capacity:
        violations.append(Violation(
            Rule.HOST_VCPU,
            f"Host {host.name} runs VMs with {host.allocated_vcpus} vCPUs; {resized.vcpu_capacity} "
            f"vCPUs ({cpu_threads} threads x {vcpu_overcommit:g} overcommit) would not hold them",
        ))
    if host.allocated_ram_gib > resized.ram_capacity_gib:
        violations.append(Violation(
            Rule.HOST_RAM,
            f"Host {host.name} runs VMs with {host.allocated_ram_gib} GiB RAM; {resized.ram_capacity_gib} "
            f"GiB ({ram_gib} GiB x {ram_overcommit:g} overcommit) would not hold them",
        ))
    return violations


def check_sharing_off(host_name: str, stacked: list[tuple[str, str]]) -> list[Violation]:
    """Whether a host may stop letting a VM's vGPUs share a GPU, given `stacked`, the (VM, GPU)
    pairs where a VM holds several vGPUs on one GPU now: not while there is one, or the fleet
    would hold what its own rules refuse."""
    if not stacked:
        return []
    vm_name, gpu_label = stacked[0]
    return [Violation(
        Rule.VM_SAME_GPU,
        f"VM {vm_name} holds several vGPUs on GPU {gpu_label} of host {host_name}; move them to GPUs of their own "
        f"before the host stops allowing it ({len(stacked)} VM(s) and GPU(s) like it)",
    )]

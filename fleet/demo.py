"""Demo data: the sizing guide's proof of concept and a synthetic studio, placed by the rules.

`seed_demo()` is what `manage.py seed_demo` runs. It first builds a plan (pure: hosts, GPUs and
artists' seats from a random seed, so the same options give the same studio), then applies
it through `fleet.services`: every vGPU goes through `place_vgpu`, and a seat the rules
refuse on one GPU tries the host's next GPU, or is left out. Rows are found by name, so a
second run adds nothing; what an earlier run (or an admin since) placed is kept as it is.

The proof of concept is the one of NVIDIA's "RTX Server Sizing Guide to run Maya with
Arnold" (../shared/reference/vgpu-facts.md, section 5): one 2U server, 2 x Xeon Gold 6154,
three Quadro RTX 6000; modeling and texturing share the first GPU at 12Q each, animation
and lighting take the second and third at 24Q: four artists from three parts of the
pipeline on one server.
"""

from __future__ import annotations

import random
import secrets
import unicodedata
import uuid
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from itertools import cycle

from django.contrib.auth import get_user_model
from django.contrib.auth.hashers import make_password
from django.db import transaction
from django.db.models import Q, Sum

from fleet import audit, services
from fleet.choices import GpuMode, Hypervisor, SizeMode, UserType, Workflow
from fleet.hypervisor_link import SIM_SCHEME
from fleet.models import Artist, Gpu, GpuModel, Host, Vgpu, VgpuProfile, VirtualMachine
from fleet.placement import PlacementError

GIB = 1024
POC_HOST = "poc-rtx6000"
POC_GPU_MODEL = "Quadro RTX 6000"
DEFAULT_GPU_MODELS = ("Quadro RTX 6000", "Quadro RTX 8000", "NVIDIA L40S", "NVIDIA A16")
DEFAULT_HOSTS = 8
DEFAULT_SEED = 1
#: The workflows whose first VM (by name, in this order) is the demo's guest without the balloon driver.
NO_BALLOON_WORKFLOWS = (Workflow.OTHER, Workflow.LAYOUT, Workflow.COMPOSITING)

# Fixed, so GPU and VM UUIDs come out the same on every machine that seeds the demo.
DEMO_NAMESPACE = uuid.UUID("5b0f6c8e-3d1a-4c1e-9a55-0d3c2e7f1a90")

# Slots of a dual-socket 2U server; boards of several GPUs (A16) sit behind a PCIe switch,
# their GPUs on consecutive buses.
PCI_SLOTS = ("00000000:3B:00.0", "00000000:5E:00.0", "00000000:86:00.0", "00000000:AF:00.0", "00000000:D8:00.0")
BOARD_BUSES = (0x41, 0xC1)

# (cpu_model, hardware threads, RAM GiB) of the servers each board comes in.
SERVERS = {
    "RTX6000": ("2 x Intel Xeon Gold 6154 (18 cores, 3.0 GHz)", 72, 768),
    "RTX8000": ("2 x Intel Xeon Gold 6248R (24 cores, 3.0 GHz)", 96, 768),
    "A16": ("2 x Intel Xeon Gold 6338 (32 cores, 2.0 GHz)", 128, 1024),
}
DEFAULT_SERVER = ("2 x AMD EPYC 9354 (32 cores, 3.25 GHz)", 128, 1024)

# vCPUs and RAM (GiB) by user type ([SIZE]: light 4 vCPU 8-16 GB, medium 8 vCPU 16-32 GB,
# heavy 12+ vCPU 32-64 GB); lighting and rendering get more, Arnold renders on the CPU too.
VM_SIZE = {UserType.LIGHT: (4, 16), UserType.MEDIUM: (8, 32), UserType.HEAVY: (12, 64)}
RENDER_VM_SIZE = (16, 96)

FIRST_NAMES = (
    "Aiko", "Amara", "Anders", "Beatriz", "Chen", "Dario", "Elif", "Emeka", "Farah", "Gabriel", "Hana", "Ines",
    "Ivan", "Jae", "Kofi", "Lena", "Luis", "Maren", "Mateo", "Nadia", "Noor", "Oskar", "Priya", "Rafael",
    "Sana", "Soren", "Tariq", "Uma", "Vera", "Wei", "Yara", "Zoe",
)
LAST_NAMES = (
    "Abara", "Bianchi", "Costa", "Dubois", "Eriksen", "Fischer", "Garcia", "Haddad", "Ito", "Jensen", "Kowalski",
    "Laurent", "Mensah", "Nakamura", "Okafor", "Petrov", "Quinn", "Rossi", "Sato", "Silva", "Tanaka", "Ueda",
    "Varga", "Weber", "Xu", "Yilmaz", "Zhang",
)


class DemoError(Exception):
    """Options the demo cannot follow (an unknown GPU model, one without workstation profiles)."""


@dataclass(frozen=True)
class Board:
    """What the planner needs of a GPU model: its frame buffer and its Q (workstation) profiles."""

    name: str
    code: str
    fb_mib: int
    gpus_per_board: int
    mixed_size_capable: bool
    q_profiles: tuple[tuple[int, str], ...]  # (fb_mib, name), any order

    @property
    def fb_gib(self) -> int:
        return self.fb_mib // GIB

    def q_profile(self, gib: int) -> str:
        """The largest Q profile of at most `gib` GiB (the smallest one if none is that small)."""
        fitting = [p for p in self.q_profiles if p[0] <= gib * GIB]
        return max(fitting)[1] if fitting else min(self.q_profiles)[1]


@dataclass(frozen=True)
class SeatPlan:
    """One artist's VM and its vGPUs: `gpus` are the preferred GPU indexes, one per vGPU."""

    vm_name: str
    artist_name: str
    username: str
    workflow: str
    user_type: str
    profile: str
    gpus: tuple[int, ...]
    vcpus: int
    ram_gib: int


@dataclass(frozen=True)
class GpuPlan:
    pci_bus_id: str
    size_mode: str = SizeMode.EQUAL


@dataclass(frozen=True)
class HostPlan:
    """A server to create, its GPUs and its seats. `strict`: seats go on their GPU or nowhere."""

    name: str
    cpu_model: str
    cpu_threads: int
    ram_gib: int
    board: Board
    gpus: tuple[GpuPlan, ...]
    seats: tuple[SeatPlan, ...]
    strict: bool = False
    hypervisor: str = Hypervisor.KVM


def _vm_size(workflow: str, user_type: str) -> tuple[int, int]:
    if user_type == UserType.HEAVY and workflow in (Workflow.LIGHTING, Workflow.RENDERING):
        return RENDER_VM_SIZE
    return VM_SIZE[user_type]


def _username(artist_name: str) -> str:
    ascii_name = unicodedata.normalize("NFKD", artist_name).encode("ascii", "ignore").decode()
    return ".".join(ascii_name.lower().split())


def _seat(vm_name, artist_name, workflow, user_type, profile, gpus) -> SeatPlan:
    vcpus, ram_gib = _vm_size(workflow, user_type)
    return SeatPlan(vm_name, artist_name, _username(artist_name), workflow, user_type, profile, tuple(gpus),
                    vcpus, ram_gib)


def plan_poc(board: Board) -> HostPlan:
    """The sizing guide's server: four artists from three parts of the pipeline on three GPUs."""
    cpu_model, threads, ram_gib = SERVERS["RTX6000"]
    q12, q24 = f"{board.code}-12Q", f"{board.code}-24Q"
    return HostPlan(
        name=POC_HOST, cpu_model=cpu_model, cpu_threads=threads, ram_gib=ram_gib, board=board, strict=True,
        gpus=tuple(GpuPlan(bus) for bus in PCI_SLOTS[:3]),
        seats=(
            _seat("poc-modeling", "Mei Tanaka", Workflow.MODELING, UserType.MEDIUM, q12, [0]),
            _seat("poc-texturing", "Luca Rossi", Workflow.TEXTURING, UserType.MEDIUM, q12, [0]),
            _seat("poc-animation", "Amara Okafor", Workflow.ANIMATION, UserType.HEAVY, q24, [1]),
            _seat("poc-lighting", "Jonas Berg", Workflow.LIGHTING, UserType.HEAVY, q24, [2]),
        ),
    )


def _gpu_layouts(board: Board) -> list[tuple[int, str, list[tuple[str, str, int]]]]:
    """How one GPU of `board` may be shared: (weight, size mode, [(workflow, user type, GiB)]).

    After the sizing guide: modeling, texturing and shading at half a 24 GB GPU (12Q);
    animation at a 24 GB class profile; lighting at the whole GPU; light users (compositing,
    layout) at small Q profiles on 16 GB GPUs (A16); mixed-size mode where the board has it.
    """
    fb = board.fb_gib
    half, animation = max(min(12, fb // 2), 1), min(24, fb)
    pod = cycle((Workflow.MODELING, Workflow.TEXTURING, Workflow.SHADING, Workflow.LAYOUT))
    layouts = [
        (4 if fb <= 24 else 3, SizeMode.EQUAL, [(next(pod), UserType.MEDIUM, half) for _ in range(fb // half)]),
        (1 if fb <= 16 else 3, SizeMode.EQUAL, [(Workflow.ANIMATION, UserType.HEAVY, animation)] * (fb // animation)),
    ]
    if fb > 16:
        layouts.append((3 if fb <= 24 else 2, SizeMode.EQUAL, [(Workflow.LIGHTING, UserType.HEAVY, fb)]))
    else:
        light = cycle((Workflow.COMPOSITING, Workflow.LAYOUT, Workflow.OTHER))
        layouts.append((6, SizeMode.EQUAL, [(next(light), UserType.LIGHT, 4) for _ in range(max(fb // 4, 1))]))
    mixed = {
        16: [(Workflow.MODELING, UserType.MEDIUM, 8), (Workflow.COMPOSITING, UserType.LIGHT, 4),
             (Workflow.LAYOUT, UserType.LIGHT, 2), (Workflow.OTHER, UserType.LIGHT, 2)],
        24: [(Workflow.MODELING, UserType.MEDIUM, 12), (Workflow.LAYOUT, UserType.LIGHT, 8)],
        48: [(Workflow.LIGHTING, UserType.HEAVY, 24), (Workflow.MODELING, UserType.MEDIUM, 12),
             (Workflow.LAYOUT, UserType.MEDIUM, 8)],
    }.get(fb)
    if board.mixed_size_capable and mixed:
        # Largest first: in mixed-size mode each size starts at its own aligned placement IDs.
        layouts.append((3 if fb >= 48 else 2, SizeMode.MIXED, mixed))
    return layouts


def plan_host(name: str, board: Board, rng: random.Random) -> HostPlan:
    """A synthetic server of `board` GPUs and the artists it serves, drawn from `rng`."""
    if board.gpus_per_board > 1:
        boards = rng.randint(1, 2)
        buses = [f"00000000:{BOARD_BUSES[b] + k:02X}:00.0" for b in range(boards) for k in range(board.gpus_per_board)]
    else:
        buses = list(PCI_SLOTS[:rng.randint(2, 4)])
    layouts = _gpu_layouts(board)
    # Lighting and rendering may take several whole GPUs (multi-vGPU, up to four per VM).
    render_pair = len(buses) >= 3 and board.fb_gib >= 24 and rng.random() < 0.35
    single = len(buses) - 2 if render_pair else len(buses)

    gpus, specs = [], []
    for index in range(single):
        _, size_mode, seats = rng.choices(layouts, weights=[weight for weight, _, _ in layouts])[0]
        gpus.append(GpuPlan(buses[index], size_mode))
        specs += [(workflow, user_type, gib, (index,)) for workflow, user_type, gib in seats]
    if render_pair:
        gpus += [GpuPlan(buses[-2]), GpuPlan(buses[-1])]
        specs.append((Workflow.RENDERING, UserType.HEAVY, board.fb_gib, (len(buses) - 2, len(buses) - 1)))

    # Leave free capacity: the last single-GPU seat stays empty, and about one seat in ten.
    last_single = max((i for i, spec in enumerate(specs) if len(spec[3]) == 1), default=None)
    specs = [spec for i, spec in enumerate(specs) if i != last_single and rng.random() >= 0.1]

    cpu_model, threads, ram_gib = SERVERS.get(board.code, DEFAULT_SERVER)
    names: set[str] = set()
    seats = []
    for number, (workflow, user_type, gib, gpu_indexes) in enumerate(specs, start=1):
        artist_name = f"{rng.choice(FIRST_NAMES)} {rng.choice(LAST_NAMES)}"
        while artist_name in names:
            artist_name = f"{rng.choice(FIRST_NAMES)} {rng.choice(LAST_NAMES)}"
        names.add(artist_name)
        seats.append(_seat(f"ws-{name}-{number:02d}", artist_name, workflow, user_type, board.q_profile(gib),
                           gpu_indexes))
    return HostPlan(name=name, cpu_model=cpu_model, cpu_threads=threads, ram_gib=ram_gib, board=board,
                    gpus=tuple(gpus), seats=tuple(seats))


def plan_studio(boards: Sequence[Board], hosts: int, seed: int) -> list[HostPlan]:
    """`hosts` servers, boards taken in turn; each host's contents depend only on the seed and its name."""
    numbers: Counter[str] = Counter()
    plans = []
    for index in range(hosts):
        board = boards[index % len(boards)]
        numbers[board.code] += 1
        name = f"{board.code.lower()}-{numbers[board.code]:02d}"
        plans.append(plan_host(name, board, random.Random(f"{seed}:{name}")))
    return plans


def board(gpu_model: GpuModel) -> Board:
    """The planner's view of a catalog GPU model."""
    profiles = VgpuProfile.objects.filter(gpu_model=gpu_model, series="Q").values_list("fb_mib", "name")
    return Board(
        name=gpu_model.name, code=gpu_model.code, fb_mib=gpu_model.fb_mib, gpus_per_board=gpu_model.gpus_per_board,
        mixed_size_capable=gpu_model.mixed_size_capable, q_profiles=tuple(profiles),
    )


def resolve_boards(names: Sequence[str]) -> list[Board]:
    """GPU models by product name or profile code, case-insensitive ("NVIDIA L40S" or "l40s")."""
    boards = []
    for item in names:
        gpu_model = GpuModel.objects.filter(Q(name__iexact=item) | Q(code__iexact=item)).first()
        if gpu_model is None:
            known = ", ".join(GpuModel.objects.order_by("code").values_list("code", flat=True))
            raise DemoError(f"Unknown GPU model {item!r}; use a name or one of the codes {known}")
        found = board(gpu_model)
        if not found.q_profiles:
            raise DemoError(f"{gpu_model.name} offers no Q (virtual workstation) profiles for artists' VMs")
        boards.append(found)
    if not boards:
        raise DemoError("No GPU model given")
    return boards


@dataclass
class SeedReport:
    """What a run did, and the lines `manage.py seed_demo` prints."""

    plans: list[HostPlan] = field(default_factory=list)
    seed: int | None = None
    hosts_created: int = 0
    gpus_created: int = 0
    vms_created: int = 0
    vgpus_created: int = 0
    artists_created: int = 0
    new_usernames: list[str] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    admin_username: str = "admin"
    admin_password: str | None = None  # None: an existing admin kept their password
    artist_password: str | None = None  # set on the accounts created (or reset) by this run

    def lines(self) -> list[str]:
        poc = next((plan for plan in self.plans if plan.name == POC_HOST), None)
        synthetic = [plan.name for plan in self.plans if plan.name != POC_HOST]
        out = []
        if poc is not None:
            out.append(f"Proof of concept (NVIDIA RTX Server sizing guide): host {poc.name}, "
                       f"{len(poc.gpus)} x {poc.board.name}, {len(poc.seats)} artists "
                       f"({', '.join(seat.workflow for seat in poc.seats)})")
            out += gpu_lines(poc.name)
        if synthetic:
            out.append(f"Synthetic studio: {len(synthetic)} hosts (seed {self.seed}): {', '.join(synthetic)}")
        out.append(f"Created: {self.hosts_created} hosts, {self.gpus_created} GPUs, {self.vms_created} VMs, "
                   f"{self.vgpus_created} vGPUs, {self.artists_created} artists")
        if self.skipped:
            out.append(f"Left out {len(self.skipped)} VM(s) the placement rules refused:")
            out += [f"  {line}" for line in self.skipped]
        out += [f"Warning: {line}" for line in self.warnings]
        out.append("Hosts:")
        out += host_lines([plan.name for plan in self.plans])
        if self.admin_password:
            out.append(f"Admin login: {self.admin_username} / {self.admin_password}")
        else:
            out.append(f"Admin login: {self.admin_username} / (password unchanged; set DEMO_ADMIN_PASSWORD "
                       f"to reset it)")
        if self.new_usernames and self.artist_password:
            out.append(f"Artist logins: {len(self.new_usernames)} new account(s), e.g. {self.new_usernames[0]}, "
                       f"password: {self.artist_password}")
        elif self.artist_password:
            out.append(f"Artist logins: passwords of the demo artists set to {self.artist_password}")
        else:
            out.append("Artist logins: no new accounts; passwords unchanged (set DEMO_ARTIST_PASSWORD to reset them)")
        return out


def host_lines(names: Sequence[str]) -> list[str]:
    """One line per host: GPUs, VMs, frame buffer and vCPUs used of what it has."""
    hosts = Host.objects.filter(name__in=names).order_by("name")
    lines = []
    for host in hosts:
        gpus = list(Gpu.objects.filter(host=host).select_related("gpu_model"))
        fb_total = sum(gpu.gpu_model.fb_mib for gpu in gpus if gpu.mode == GpuMode.VGPU)
        fb_used = Vgpu.objects.filter(gpu__host=host).aggregate(fb=Sum("profile__fb_mib"))["fb"] or 0
        claims = VirtualMachine.objects.filter(host=host).aggregate(vcpus=Sum("vcpus"), ram=Sum("ram_gib"))
        models = Counter(gpu.gpu_model.name for gpu in gpus)
        lines.append(
            f"  {host.name:<16} {', '.join(f'{n} x {m}' for m, n in models.items()):<24} "
            f"{VirtualMachine.objects.filter(host=host).count():>3} VMs  "
            f"frame buffer {fb_used // GIB}/{fb_total // GIB} GiB  "
            f"vCPUs {claims['vcpus'] or 0}/{host.cpu_threads}  RAM {claims['ram'] or 0}/{host.ram_gib} GiB"
        )
    return lines


def gpu_lines(host_name: str) -> list[str]:
    """One line per GPU of a host: its vGPUs with their VMs and artists' workflows."""
    lines = []
    gpus = Gpu.objects.filter(host__name=host_name).order_by("pci_bus_id")
    vgpus = Vgpu.objects.filter(gpu__in=gpus).select_related("profile", "vm__artist").order_by("placement_id")
    for gpu in gpus:
        placed = [f"{v.profile.name} {v.vm.name} ({v.vm.artist.workflow if v.vm.artist else '-'})"
                  for v in vgpus if v.gpu_id == gpu.pk]
        lines.append(f"  GPU {gpu.pci_bus_id}: {', '.join(placed) or 'free'}")
    return lines


class _Unplaced(Exception):
    """No GPU of the host would take a seat; rolls back its VM, artist and any vGPU placed."""


def _uuid(*parts: str) -> uuid.UUID:
    return uuid.uuid5(DEMO_NAMESPACE, "/".join(parts))


def _apply_host(plan: HostPlan, report: SeedReport, password_hash: str, reset_passwords: bool) -> None:
    specs = {"hypervisor": plan.hypervisor, "cpu_model": plan.cpu_model, "cpu_threads": plan.cpu_threads,
             "ram_gib": plan.ram_gib}
    host = Host.objects.filter(name=plan.name).first()
    if host is None:
        # Linked to the demo's simulated hypervisor (`manage.py demo_hypervisors` writes its state).
        host = services.update_host(Host(name=plan.name, hypervisor_uri=f"{SIM_SCHEME}://{plan.name}"), **specs)
        report.hosts_created += 1
    else:
        try:
            services.update_host(host, **specs)
        except PlacementError as exc:
            report.warnings.append(f"host {host.name} kept its capacity: {exc}")

    gpu_model = GpuModel.objects.get(name=plan.board.name)
    gpus = []
    for gpu_plan in plan.gpus:
        wanted = {"gpu_model": gpu_model, "mode": GpuMode.VGPU, "size_mode": gpu_plan.size_mode}
        gpu = Gpu.objects.select_related("gpu_model", "host").filter(host=host, pci_bus_id=gpu_plan.pci_bus_id).first()
        if gpu is None:
            gpu = Gpu(host=host, pci_bus_id=gpu_plan.pci_bus_id, uuid=f"GPU-{_uuid(plan.name, gpu_plan.pci_bus_id)}")
            services.update_gpu(gpu, **wanted)
            report.gpus_created += 1
        else:
            try:
                services.update_gpu(gpu, **wanted)
            except PlacementError as exc:
                report.warnings.append(f"GPU {gpu.pci_bus_id} of {host.name} kept its settings: {exc}")
        gpus.append(gpu)

    profiles = {p.name: p for p in VgpuProfile.objects.select_related("gpu_model").filter(gpu_model=gpu_model)}
    for seat in plan.seats:
        vm = VirtualMachine.objects.select_related("artist__user").filter(name=seat.vm_name).first()
        if vm is not None and vm.vgpus.exists():
            # Placed by an earlier run, or changed by an admin since: theirs to keep.
            if reset_passwords and vm.artist is not None and vm.artist.user is not None:
                _set_password(vm.artist.user, password_hash)
            continue
        try:
            with transaction.atomic():
                artist, new_username = _artist_for(seat, vm, plan.strict, password_hash, reset_passwords)
                vm_created = vm is None
                if vm_created:
                    vm = VirtualMachine(name=seat.vm_name, uuid=_uuid("vm", seat.vm_name))
                vm = services.update_vm(vm, artist=artist, vcpus=seat.vcpus, ram_gib=seat.ram_gib)
                placed = _place(vm, seat, gpus, profiles[seat.profile], plan.strict)
        except _Unplaced as exc:
            report.skipped.append(f"{seat.vm_name} ({seat.workflow}, {seat.profile}): {exc}")
            continue
        # Counted only now: a seat left out rolled back everything it had created.
        report.vms_created += vm_created
        report.vgpus_created += placed
        if new_username:
            report.artists_created += 1
            report.new_usernames.append(new_username)


def _place(vm: VirtualMachine, seat: SeatPlan, gpus: list[Gpu], profile: VgpuProfile, strict: bool) -> int:
    """Place the seat's vGPUs, each on its preferred GPU or (unless strict) the host's next one that fits."""
    used: list[int] = []
    for preferred in seat.gpus:
        order = [preferred] if strict else [preferred, *(i for i in range(len(gpus)) if i != preferred)]
        refusal = None
        for index in (i for i in order if i not in used):
            try:
                vm = services.place_vgpu(vm, gpus[index], profile).vm
            except PlacementError as exc:
                refusal = refusal or exc
                continue
            used.append(index)
            break
        else:
            raise _Unplaced(str(refusal) if refusal else "no GPU left on the host")
    return len(used)


def _artist_for(seat: SeatPlan, vm: VirtualMachine | None, fixed_username: bool, password_hash: str,
                reset_password: bool) -> tuple[Artist, str | None]:
    """The seat's artist (the VM's, or the proof of concept's fixed account, or a new account)
    and the username of the account created for it, if one was.

    `password_hash` is hashed once per run: hashing it for each of a hundred artists would
    take most of the run's time (the hasher is slow on purpose).
    """
    User = get_user_model()
    artist = vm.artist if vm is not None else None
    if artist is None and fixed_username:
        artist = Artist.objects.select_related("user").filter(user__username=seat.username).first()
    new_username = None
    if artist is None:
        user = User.objects.filter(username=seat.username).first() if fixed_username else None
        if user is None:
            new_username, suffix = seat.username, 1
            while User.objects.filter(username=new_username).exists():
                suffix += 1
                new_username = f"{seat.username}{suffix}"
            first_name, _, last_name = seat.artist_name.partition(" ")
            user = User(username=new_username, first_name=first_name, last_name=last_name, password=password_hash)
            user.save()
        artist = Artist(user=user)
    artist.name, artist.workflow, artist.user_type = seat.artist_name, seat.workflow, seat.user_type
    artist.save()
    if reset_password and artist.user is not None and not new_username:
        _set_password(artist.user, password_hash)
    return artist, new_username


def _set_password(user, password_hash: str) -> None:
    user.password = password_hash
    user.save(update_fields=["password"])


def _ensure_admin(username: str, password: str | None) -> str | None:
    """Create the superuser (with `password`, or a random one) and return the password it now has.

    An existing account keeps its password unless one is given; it is returned as None then.
    """
    User = get_user_model()
    user = User.objects.filter(username=username).first()
    if user is None:
        password = password or secrets.token_urlsafe(12)
        User.objects.create_superuser(username, email="", password=password)
        return password
    user.is_staff = user.is_superuser = user.is_active = True
    if password:
        user.set_password(password)
    user.save()
    return password or None


def seed_demo(*, hosts: int = DEFAULT_HOSTS, gpu_models: Sequence[str] = DEFAULT_GPU_MODELS,
              seed: int = DEFAULT_SEED, synthetic: bool = True, admin_username: str = "admin",
              admin_password: str | None = None, artist_password: str | None = None) -> SeedReport:
    """Create or complete the demo fleet and its logins; returns what was done. Safe to run again.

    `admin_password` / `artist_password` None: new accounts get a random password (reported),
    existing ones keep theirs; given: every demo account gets it.
    """
    if hosts < 0:
        raise DemoError("--hosts cannot be negative")
    poc_model = GpuModel.objects.filter(name=POC_GPU_MODEL).first()
    if poc_model is None:
        raise DemoError(f"{POC_GPU_MODEL} is missing from the catalog; run manage.py migrate first")
    plans = [plan_poc(board(poc_model))]
    if synthetic:
        plans += plan_studio(resolve_boards(gpu_models), hosts, seed)

    report = SeedReport(plans=plans, seed=seed if synthetic else None, admin_username=admin_username)
    new_password = artist_password or secrets.token_urlsafe(12)
    password_hash = make_password(new_password)
    with transaction.atomic():
        # One summary event, not one per host, GPU, VM and vGPU (thousands for a studio).
        with audit.suppressed():
            for plan in plans:
                _apply_host(plan, report, password_hash, reset_passwords=bool(artist_password))
            report.admin_password = _ensure_admin(admin_username, admin_password)
        audit.record("fleet.seed_demo", object_type="fleet", object_repr="demo fleet",
                     after={"hosts": len(plans), "seed": report.seed})
    if artist_password or report.new_usernames:
        report.artist_password = new_password
    return report


def cpu_bound_vm_id() -> int | None:
    """The VM of the inventory whose animator's rig evaluates on one CPU core: its viewport waits
    on that vCPU while its GPU idles, the case right-sizing calls CPU-bound (neither a bigger vGPU
    nor more vCPUs would help). The simulated agents (`telemetry.demo.host_scenario`) keep its GPU
    light; its guest saturates one vCPU as every animator's does. The first animation VM by name
    off the proof-of-concept host (whose seats follow the sizing guide), or None."""
    return (VirtualMachine.objects.filter(artist__workflow=Workflow.ANIMATION).exclude(host__name=POC_HOST)
            .order_by("name").values_list("pk", flat=True).first())


def no_balloon_vm_id() -> int | None:
    """The VM of the inventory whose simulated guest has no balloon driver, so the product shows
    a VM whose memory use is not reported, as a studio's odd Windows VM without the VirtIO
    drivers would be: the first by name of the lightest workflow present (NO_BALLOON_WORKFLOWS),
    or None when no artist works in one of them. The simulated hypervisors (`hypervisors.sim_seed`)
    and the demo's back-filled history (`telemetry.history`) both ask here, so they agree."""
    for workflow in NO_BALLOON_WORKFLOWS:
        found = (VirtualMachine.objects.filter(artist__workflow=workflow).order_by("name")
                 .values_list("pk", flat=True).first())
        if found is not None:
            return found
    return None

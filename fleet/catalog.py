"""NVIDIA's vGPU catalog: GPU models and the profiles each offers, with their maximum counts.

Source: ../shared/reference/vgpu-facts.md section 1 (NVIDIA vGPU 17 user guide, appendix A;
vGPU 8 user guide for the Turing boards). Frame buffers are nominal: a "12Q" is 12 GiB, a
"24 GB" board 24 GiB, which is how NVIDIA sizes profiles against boards. Loaded by a data
migration (`load_catalog`), which upserts by name, so a later migration can add models.

Board limits (`power_limit_w`, `max_sm_clock_mhz`) are per GPU, as NVML and nvidia-smi report
them for one device: the default power limit, and the highest SM clock. A board of several
GPUs shares its power among them: the A16's 250 W is 62.5 W for each of its four GPUs. Where a
real `nvidia-smi -q` capture is at hand (../shared/fixtures/nvidia-smi/: T4, A100) its figures
are used; otherwise NVIDIA's product brief (power of the passive data-centre board, boost
clock), which never exceeds what the board reports as its maximum. The simulated agents of
the demo report within them (telemetry/demo.py), so no page shows an A16 drawing 250 W.
"""

from __future__ import annotations

from dataclasses import KW_ONLY, dataclass

GIB = 1024


@dataclass(frozen=True)
class CatalogModel:
    name: str  # product name as nvidia-smi reports it
    code: str  # board prefix in profile names
    fb_gib: int
    profiles: dict[str, tuple[int, int | None]]  # "12Q" -> (max equal-size, max mixed-size)
    gpus_per_board: int = 1
    mixed_size_capable: bool = False
    multi_vgpu_full_only: bool = False
    _: KW_ONLY
    power_limit_w: float  # default power limit of one GPU, W
    max_sm_clock_mhz: int  # highest SM clock of one GPU, MHz


def _counts(equal: dict[str, int], mixed: dict[str, int] | None = None) -> dict[str, tuple[int, int | None]]:
    return {suffix: (count, (mixed or {}).get(suffix)) for suffix, count in equal.items()}


_TURING_24 = {"24Q": 1, "12Q": 2, "8Q": 3, "6Q": 4, "4Q": 6, "3Q": 8, "2Q": 12, "1Q": 24}
_TURING_48 = {"48Q": 1, "24Q": 2, "16Q": 3, "12Q": 4, "8Q": 6, "6Q": 8, "4Q": 12, "3Q": 16, "2Q": 24,
              "1Q": 32}

_Q48_EQUAL = {"48Q": 1, "24Q": 2, "16Q": 3, "12Q": 4, "8Q": 6, "6Q": 8, "4Q": 12, "3Q": 16, "2Q": 24,
              "1Q": 32, "2B": 24, "1B": 32}
_Q48_MIXED = {"48Q": 1, "24Q": 2, "16Q": 2, "12Q": 4, "8Q": 4, "6Q": 8, "4Q": 8, "3Q": 16, "2Q": 16,
              "1Q": 16, "2B": 16, "1B": 16}
_Q48_MIXED_AMPERE = {**_Q48_MIXED, "1Q": 30}

_Q24_EQUAL = {"24Q": 1, "12Q": 2, "8Q": 3, "6Q": 4, "4Q": 6, "3Q": 8, "2Q": 12, "1Q": 24}
_Q24_MIXED = {"24Q": 1, "12Q": 2, "8Q": 2, "6Q": 4, "4Q": 4, "3Q": 8, "2Q": 8, "1Q": 16}

_A16 = {"16Q": 1, "8Q": 2, "4Q": 4, "2Q": 8, "1Q": 16, "2B": 8, "1B": 16}
_T4 = {"16Q": 1, "8Q": 2, "4Q": 4, "2Q": 8, "1Q": 16}

_C80 = {"80C": 1, "40C": 2, "20C": 4, "16C": 5, "10C": 8, "8C": 10, "4C": 20}

CATALOG: tuple[CatalogModel, ...] = (
    CatalogModel("Quadro RTX 6000", "RTX6000", 24, _counts(_TURING_24), multi_vgpu_full_only=True,
                 power_limit_w=250, max_sm_clock_mhz=1770),
    CatalogModel("Quadro RTX 8000", "RTX8000", 48, _counts(_TURING_48), multi_vgpu_full_only=True,
                 power_limit_w=250, max_sm_clock_mhz=1770),
    CatalogModel("NVIDIA L40", "L40", 48, _counts(_Q48_EQUAL, _Q48_MIXED), mixed_size_capable=True,
                 power_limit_w=300, max_sm_clock_mhz=2490),
    CatalogModel("NVIDIA L40S", "L40S", 48, _counts(_Q48_EQUAL, _Q48_MIXED), mixed_size_capable=True,
                 power_limit_w=350, max_sm_clock_mhz=2520),
    CatalogModel("NVIDIA RTX 6000 Ada Generation", "RTX6000-Ada", 48, _counts(_Q48_EQUAL, _Q48_MIXED),
                 mixed_size_capable=True, power_limit_w=300, max_sm_clock_mhz=2505),
    CatalogModel("NVIDIA RTX A6000", "RTXA6000", 48, _counts(_Q48_EQUAL, _Q48_MIXED_AMPERE),
                 mixed_size_capable=True, power_limit_w=300, max_sm_clock_mhz=1800),
    CatalogModel("NVIDIA A40", "A40", 48, _counts(_Q48_EQUAL, _Q48_MIXED_AMPERE), mixed_size_capable=True,
                 power_limit_w=300, max_sm_clock_mhz=1740),
    CatalogModel("NVIDIA A10", "A10", 24, _counts(_Q24_EQUAL, _Q24_MIXED), mixed_size_capable=True,
                 power_limit_w=150, max_sm_clock_mhz=1695),
    CatalogModel("NVIDIA L4", "L4", 24, _counts(_Q24_EQUAL, _Q24_MIXED), mixed_size_capable=True,
                 power_limit_w=72, max_sm_clock_mhz=2040),
    CatalogModel("NVIDIA RTX A5000", "RTXA5000", 24, _counts(_Q24_EQUAL, _Q24_MIXED), mixed_size_capable=True,
                 power_limit_w=230, max_sm_clock_mhz=1695),
    CatalogModel("NVIDIA RTX A5500", "RTXA5500", 24, _counts(_Q24_EQUAL, _Q24_MIXED), mixed_size_capable=True,
                 power_limit_w=230, max_sm_clock_mhz=1665),
    # One 250 W board of four GPUs: 62.5 W each.
    CatalogModel("NVIDIA A16", "A16", 16, _counts(_A16, _A16), gpus_per_board=4, mixed_size_capable=True,
                 power_limit_w=62.5, max_sm_clock_mhz=1695),
    CatalogModel("Tesla T4", "T4", 16, _counts(_T4), multi_vgpu_full_only=True,
                 power_limit_w=70, max_sm_clock_mhz=1590),
    CatalogModel("NVIDIA A100 80GB PCIe", "A100D", 80, _counts(_C80), power_limit_w=300, max_sm_clock_mhz=1410),
    CatalogModel("NVIDIA H100 PCIe", "H100", 80, _counts({**_C80, "5C": 16}), power_limit_w=350,
                 max_sm_clock_mhz=1755),
)

# Multi-vGPU is a vWS (Q) and compute (C) feature; vPC and vApps VMs hold one vGPU.
MAX_PER_VM_BY_SERIES = {"Q": 4, "C": 4, "B": 1, "A": 1}


@dataclass(frozen=True)
class CatalogProfile:
    name: str
    series: str
    fb_mib: int
    max_per_gpu: int
    max_per_gpu_mixed: int | None
    max_per_vm: int


def catalog_model(name: str) -> CatalogModel | None:
    """The catalog entry of the GPU model nvidia-smi calls `name`; None for a model it lacks."""
    return next((model for model in CATALOG if model.name == name), None)


def profiles_of(model: CatalogModel) -> list[CatalogProfile]:
    """The profiles of one catalog model, largest first, with full names (e.g. "L40S-24Q")."""
    result = []
    for suffix, (equal, mixed) in model.profiles.items():
        series = suffix[-1]
        result.append(CatalogProfile(
            name=f"{model.code}-{suffix}", series=series, fb_mib=int(suffix[:-1]) * GIB,
            max_per_gpu=equal, max_per_gpu_mixed=mixed if model.mixed_size_capable else None,
            max_per_vm=MAX_PER_VM_BY_SERIES[series],
        ))
    return sorted(result, key=lambda p: (-p.fb_mib, p.series))


def load_catalog(gpu_model_cls, profile_cls) -> None:
    """Upsert every catalog model and profile into the given model classes (historical or live)."""
    for model in CATALOG:
        gpu_model, _ = gpu_model_cls.objects.update_or_create(
            name=model.name,
            defaults=dict(
                code=model.code, fb_mib=model.fb_gib * GIB, gpus_per_board=model.gpus_per_board,
                mixed_size_capable=model.mixed_size_capable, multi_vgpu_full_only=model.multi_vgpu_full_only,
            ),
        )
        for profile in profiles_of(model):
            profile_cls.objects.update_or_create(
                name=profile.name,
                defaults=dict(
                    gpu_model=gpu_model, series=profile.series, fb_mib=profile.fb_mib,
                    max_per_gpu=profile.max_per_gpu, max_per_gpu_mixed=profile.max_per_gpu_mixed,
                    max_per_vm=profile.max_per_vm,
                ),
            )

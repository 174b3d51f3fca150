"""The NVIDIA catalog the migrations load: every model and profile of vgpu-facts.md section 1.

The expected figures below are copied from the reference document, row by row, not
derived from fleet.catalog, so a typo in the catalog shows up as a wrong maximum here
(and as a wrong "does it fit?" answer in the product).
"""

from __future__ import annotations

import pytest

from fleet.catalog import load_catalog
from fleet.models import GpuModel, VgpuProfile
from fleet.placement import MAX_VGPUS_PER_VM
from fleet.tests.factories import profile

pytestmark = pytest.mark.django_db

GIB = 1024

# vgpu-facts.md section 1, the table rows as written there ("equal / mixed" where they differ).
_Q48 = "48Q 1/1 · 24Q 2/2 · 16Q 3/2 · 12Q 4/4 · 8Q 6/4 · 6Q 8/8 · 4Q 12/8 · 3Q 16/16 · 2Q 24/16 · 1Q 32/16"
_Q48_AMPERE = _Q48.replace("1Q 32/16", "1Q 32/30")  # "(A40, RTX A6000: 1Q 32/30)"
_B48 = "2B 24/16 · 1B 32/16"
_Q24 = "24Q 1/1 · 12Q 2/2 · 8Q 3/2 · 6Q 4/4 · 4Q 6/4 · 3Q 8/8 · 2Q 12/8 · 1Q 24/16"
_A16 = "16Q 1/1 · 8Q 2/2 · 4Q 4/4 · 2Q 8/8 · 1Q 16/16 · 2B 8/8 · 1B 16/16"  # "same in both modes"
_C80 = "4C 20 · 8C 10 · 10C 8 · 16C 5 · 20C 4 · 40C 2 · 80C 1"

# name: (board code, frame buffer GB per GPU, GPUs per board, mixed-size capable, profiles)
EXPECTED = {
    "Quadro RTX 6000": ("RTX6000", 24, 1, False, "24Q 1 · 12Q 2 · 8Q 3 · 6Q 4 · 4Q 6 · 3Q 8 · 2Q 12 · 1Q 24"),
    "Quadro RTX 8000": (
        "RTX8000", 48, 1, False, "48Q 1 · 24Q 2 · 16Q 3 · 12Q 4 · 8Q 6 · 6Q 8 · 4Q 12 · 3Q 16 · 2Q 24 · 1Q 32",
    ),
    "NVIDIA L40": ("L40", 48, 1, True, f"{_Q48} · {_B48}"),
    "NVIDIA L40S": ("L40S", 48, 1, True, f"{_Q48} · {_B48}"),
    "NVIDIA RTX 6000 Ada Generation": ("RTX6000-Ada", 48, 1, True, f"{_Q48} · {_B48}"),
    "NVIDIA RTX A6000": ("RTXA6000", 48, 1, True, f"{_Q48_AMPERE} · {_B48}"),
    "NVIDIA A40": ("A40", 48, 1, True, f"{_Q48_AMPERE} · {_B48}"),
    "NVIDIA A10": ("A10", 24, 1, True, _Q24),
    "NVIDIA L4": ("L4", 24, 1, True, _Q24),
    "NVIDIA RTX A5000": ("RTXA5000", 24, 1, True, _Q24),
    "NVIDIA RTX A5500": ("RTXA5500", 24, 1, True, _Q24),
    "NVIDIA A16": ("A16", 16, 4, True, _A16),
    "Tesla T4": ("T4", 16, 1, False, "16Q 1 · 8Q 2 · 4Q 4 · 2Q 8 · 1Q 16"),
    "NVIDIA A100 80GB PCIe": ("A100D", 80, 1, False, _C80),
    "NVIDIA H100 PCIe": ("H100", 80, 1, False, f"{_C80} · 5C 16"),
}


def _parse(row: str) -> dict[str, tuple[int, int | None]]:
    """ "8Q 6/4 · 1Q 32" -> {"8Q": (6, 4), "1Q": (32, None)}."""
    counts = {}
    for item in row.split(" · "):
        suffix, figures = item.split()
        equal, _, mixed = figures.partition("/")
        counts[suffix] = (int(equal), int(mixed) if mixed else None)
    return counts


def _row(name: str) -> tuple[int, int | None]:
    p = profile(name)
    return p.max_per_gpu, p.max_per_gpu_mixed


@pytest.mark.parametrize("model_name", sorted(EXPECTED))
def test_gpu_model_matches_reference(model_name):
    code, fb_gb, per_board, mixed_capable, _ = EXPECTED[model_name]
    model = GpuModel.objects.get(name=model_name)
    assert (model.code, model.fb_mib, model.gpus_per_board, model.mixed_size_capable) == (
        code, fb_gb * GIB, per_board, mixed_capable,
    )


@pytest.mark.parametrize("model_name", sorted(EXPECTED))
def test_profiles_match_reference_table(model_name):
    """Exactly the profiles of the table row, each with its equal-size and mixed-size maximum."""
    code, _, _, mixed_capable, row = EXPECTED[model_name]
    expected = {
        f"{code}-{suffix}": (equal, mixed if mixed_capable else None) for suffix, (equal, mixed) in _parse(row).items()
    }
    loaded = {
        p.name: (p.max_per_gpu, p.max_per_gpu_mixed)
        for p in VgpuProfile.objects.filter(gpu_model__name=model_name)
    }
    assert loaded == expected


def test_every_catalog_model_is_in_the_reference():
    assert set(GpuModel.objects.values_list("name", flat=True)) == set(EXPECTED)


@pytest.mark.parametrize(("name", "counts"), [
    ("RTX6000-8Q", (3, None)),
    ("RTX6000-24Q", (1, None)),
    ("RTX8000-1Q", (32, None)),
    ("L40S-16Q", (3, 2)),
    ("L40S-1Q", (32, 16)),
    ("L40S-2B", (24, 16)),
    ("A40-1Q", (32, 30)),
    ("RTXA6000-1Q", (32, 30)),
    ("A10-1Q", (24, 16)),
    ("A10-8Q", (3, 2)),
    ("A16-2B", (8, 8)),
    ("T4-4Q", (4, None)),
    ("A100D-4C", (20, None)),
    ("H100-5C", (16, None)),
    ("H100-80C", (1, None)),
])
def test_spot_checks(name, counts):
    assert _row(name) == counts


def test_a16_board_carries_four_gpus_of_16_gib():
    a16 = GpuModel.objects.get(name="NVIDIA A16")
    assert (a16.gpus_per_board, a16.fb_mib) == (4, 16 * GIB)
    assert profile("A16-2B").max_per_gpu == 8


@pytest.mark.parametrize("model_name", ["Tesla T4", "Quadro RTX 6000", "Quadro RTX 8000"])
def test_models_without_mixed_size_mode(model_name):
    model = GpuModel.objects.get(name=model_name)
    assert model.mixed_size_capable is False
    assert model.multi_vgpu_full_only is True  # the Turing multi-vGPU limit rides on the same boards
    assert not model.profiles.filter(max_per_gpu_mixed__isnull=False).exists()


def test_only_turing_boards_limit_multi_vgpu_to_full_profiles():
    assert set(GpuModel.objects.filter(multi_vgpu_full_only=True).values_list("name", flat=True)) == {
        "Tesla T4", "Quadro RTX 6000", "Quadro RTX 8000",
    }


def test_compute_boards_offer_c_series_only():
    for model_name in ("NVIDIA A100 80GB PCIe", "NVIDIA H100 PCIe"):
        assert set(VgpuProfile.objects.filter(gpu_model__name=model_name).values_list("series", flat=True)) == {"C"}
    assert VgpuProfile.objects.filter(series="C").exclude(
        gpu_model__name__in=["NVIDIA A100 80GB PCIe", "NVIDIA H100 PCIe"],
    ).count() == 0


def test_profile_frame_buffer_and_series_follow_the_name():
    """`<board>-<GB><series>`: RTX6000-12Q is 12 GiB of the Q series on a Quadro RTX 6000."""
    for p in VgpuProfile.objects.select_related("gpu_model"):
        gb, series = p.name.removeprefix(f"{p.gpu_model.code}-")[:-1], p.name[-1]
        assert p.fb_mib == int(gb) * GIB, p.name
        assert p.series == series, p.name
        assert p.fb_mib <= p.gpu_model.fb_mib, p.name
        assert p.max_per_gpu * p.fb_mib <= p.gpu_model.fb_mib, p.name


def test_b_series_vms_hold_one_vgpu_q_and_c_up_to_four():
    """Multi-vGPU is a vWS and compute feature; vPC (B) VMs hold one vGPU."""
    assert set(VgpuProfile.objects.filter(series="B").values_list("max_per_vm", flat=True)) == {1}
    assert set(VgpuProfile.objects.filter(series__in=["Q", "C"]).values_list("max_per_vm", flat=True)) == {
        MAX_VGPUS_PER_VM,
    }
    assert MAX_VGPUS_PER_VM == 4  # [SEED] "up to four shared GPUs to a single VM"


def test_load_catalog_upserts_without_duplicates():
    """A later migration re-runs the loader: it restores NVIDIA's figures and adds no second row."""
    models, profiles = GpuModel.objects.count(), VgpuProfile.objects.count()
    VgpuProfile.objects.filter(name="L40S-8Q").update(max_per_gpu=99, max_per_gpu_mixed=None)
    load_catalog(GpuModel, VgpuProfile)
    assert (GpuModel.objects.count(), VgpuProfile.objects.count()) == (models, profiles)
    assert _row("L40S-8Q") == (6, 4)

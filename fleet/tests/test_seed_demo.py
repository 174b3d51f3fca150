"""`manage.py seed_demo`: the sizing guide's proof of concept exactly, a synthetic studio that
obeys every placement rule, the same rows on a second run, and logins that work."""

import re
from collections import Counter
from io import StringIO

import pytest
from django.contrib.auth import authenticate, get_user_model
from django.core.management import CommandError, call_command

from fleet import demo, fit, placement, services
from fleet.models import Artist, Gpu, Host, Vgpu, VirtualMachine
from fleet.queries import fleet_snapshot
from fleet.tests.factories import VirtualMachineFactory, profile

pytestmark = pytest.mark.django_db


@pytest.fixture(autouse=True)
def demo_env(monkeypatch):
    """No DEMO_* variables unless a test sets them; a fast hasher (the real one is slow on purpose)."""
    for name in ("DEMO_ADMIN_USER", "DEMO_ADMIN_PASSWORD", "DEMO_ARTIST_PASSWORD"):
        monkeypatch.delenv(name, raising=False)


def seed(*args) -> str:
    out = StringIO()
    call_command("seed_demo", *args, stdout=out)
    return out.getvalue()


def layout(host_name):
    """Per GPU of the host, by PCI bus: the profiles of its vGPUs and their artists' workflows."""
    return [
        [(v.profile.name, v.vm.artist.workflow) for v in gpu.vgpus.select_related("profile", "vm__artist")
         .order_by("placement_id")]
        for gpu in Gpu.objects.filter(host__name=host_name).order_by("pci_bus_id")
    ]


def snapshot():
    """Every row the demo writes, as comparable tuples."""
    return {
        "hosts": sorted(Host.objects.values_list("name", "cpu_model", "cpu_threads", "ram_gib")),
        "gpus": sorted(Gpu.objects.values_list("host__name", "pci_bus_id", "uuid", "gpu_model__name", "mode",
                                               "size_mode")),
        "vms": sorted(VirtualMachine.objects.values_list("name", "uuid", "host__name", "artist__name", "vcpus",
                                                         "ram_gib")),
        "vgpus": sorted(Vgpu.objects.values_list("vm__name", "gpu__host__name", "gpu__pci_bus_id", "profile__name",
                                                 "placement_id")),
        "artists": sorted(Artist.objects.values_list("name", "user__username", "workflow", "user_type")),
        "users": sorted(get_user_model().objects.values_list("username", "is_staff", "is_superuser")),
    }


def assert_rules_hold():
    """Re-check the whole fleet against the rules of ../shared/reference/vgpu-facts.md section 2."""
    for gpu in Gpu.objects.select_related("gpu_model", "host"):
        vgpus = list(gpu.vgpus.select_related("profile__gpu_model"))
        where = f"{gpu.host.name} {gpu.pci_bus_id}"
        assert sum(v.profile.fb_mib for v in vgpus) <= gpu.gpu_model.fb_mib, where
        assert {v.profile.gpu_model_id for v in vgpus} <= {gpu.gpu_model_id}, where
        assert len({v.placement_id for v in vgpus}) == len(vgpus), where
        if gpu.mode == "passthrough":
            assert not vgpus, where
        elif gpu.size_mode == "equal":
            assert len({v.profile.fb_mib for v in vgpus}) <= 1, where
            assert all(len(vgpus) <= v.profile.max_per_gpu for v in vgpus), where
            assert all(v.placement_id < v.profile.max_per_gpu for v in vgpus), where
        else:
            assert gpu.gpu_model.mixed_size_capable, where
            counts = Counter(v.profile.name for v in vgpus)
            spans = []
            for v in vgpus:
                spec = v.profile.to_spec()
                assert counts[v.profile.name] <= v.profile.max_per_gpu_mixed, where
                assert v.placement_id in placement.mixed_placement_ids(spec), where
                spans.append((v.placement_id, v.placement_id + placement.mixed_span_units(spec)))
            spans.sort()
            assert all(end <= start for (_, end), (start, _) in zip(spans, spans[1:], strict=False)), where
    for vm in VirtualMachine.objects.prefetch_related("vgpus__gpu", "vgpus__profile"):
        vgpus = list(vm.vgpus.all())
        assert {v.gpu.host_id for v in vgpus} == ({vm.host_id} if vgpus else set()), vm.name
        assert len(vgpus) <= placement.MAX_VGPUS_PER_VM, vm.name
        assert len({(v.profile.gpu_model_id, v.profile.series) for v in vgpus}) <= 1, vm.name
        assert len({v.gpu_id for v in vgpus}) == len(vgpus), vm.name
    for host in Host.objects.all():
        state = services.host_state(host)
        assert state.allocated_vcpus <= state.vcpu_capacity, host.name
        assert state.allocated_ram_gib <= state.ram_capacity_gib, host.name


def test_the_proof_of_concept_is_the_sizing_guides_server():
    demo.seed_demo(synthetic=False, artist_password="artist-pass-123")

    host = Host.objects.get(name="poc-rtx6000")
    assert (host.hypervisor, host.cpu_model, host.cpu_threads) == (
        "kvm", "2 x Intel Xeon Gold 6154 (18 cores, 3.0 GHz)", 72,
    )
    assert list(host.gpus.values_list("gpu_model__name", flat=True)) == ["Quadro RTX 6000"] * 3
    assert layout("poc-rtx6000") == [
        [("RTX6000-12Q", "modeling"), ("RTX6000-12Q", "texturing")],
        [("RTX6000-24Q", "animation")],
        [("RTX6000-24Q", "lighting")],
    ]
    artists = Artist.objects.filter(vms__host=host).distinct()
    parts = {"modeling/texturing" if a.workflow in ("modeling", "texturing") else a.workflow for a in artists}
    assert artists.count() == 4
    assert parts == {"modeling/texturing", "animation", "lighting"}  # four artists, three parts, one server
    assert not any(a.user.is_staff for a in artists)
    assert all(authenticate(username=a.user.username, password="artist-pass-123") for a in artists)
    assert Host.objects.count() == 1  # --no-synthetic: nothing else
    assert_rules_hold()


def test_running_twice_creates_no_duplicates():
    first = demo.seed_demo(hosts=3, seed=5)
    rows = snapshot()
    second = demo.seed_demo(hosts=3, seed=5)

    assert snapshot() == rows
    assert (second.hosts_created, second.gpus_created, second.vms_created, second.vgpus_created,
            second.artists_created) == (0, 0, 0, 0, 0)
    assert first.vgpus_created == len(rows["vgpus"]) > 4


def test_hosts_option_adds_that_many_synthetic_hosts_beside_the_poc():
    output = seed("--hosts", "3")

    assert sorted(Host.objects.values_list("name", flat=True)) == [
        "l40s-01", "poc-rtx6000", "rtx6000-01", "rtx8000-01",
    ]
    assert "Created: 4 hosts" in output
    assert "Synthetic studio: 3 hosts (seed 1): rtx6000-01, rtx8000-01, l40s-01" in output


def test_every_placed_vgpu_satisfies_the_rules_and_capacity_is_left():
    report = demo.seed_demo()

    assert_rules_hold()
    assert Host.objects.count() == 9
    assert report.vgpus_created == Vgpu.objects.count() > 40
    for host in Host.objects.exclude(name="poc-rtx6000"):
        total = sum(g.gpu_model.fb_mib for g in host.gpus.select_related("gpu_model"))
        used = sum(v.profile.fb_mib for v in Vgpu.objects.filter(gpu__host=host).select_related("profile"))
        assert used < total, f"{host.name} has no free frame buffer left"


def test_the_default_studio_shows_what_the_sizing_guide_describes():
    demo.seed_demo()

    mixed = [g for g in Gpu.objects.filter(size_mode="mixed", vgpus__isnull=False).distinct()]
    a16_light = Vgpu.objects.filter(gpu__gpu_model__name="NVIDIA A16", vm__artist__user_type="light")
    multi = [vm for vm in VirtualMachine.objects.all() if vm.vgpus.count() > 1]

    assert any(g.gpu_model.name == "NVIDIA L40S" for g in mixed)
    assert any(len({v.profile.fb_mib for v in g.vgpus.select_related("profile")}) > 1 for g in mixed)
    assert a16_light.exists()
    assert all(v.profile.fb_mib <= 4096 for v in a16_light.select_related("profile"))
    assert multi  # a lighting/rendering VM on several whole GPUs (multi-vGPU)
    assert all(v.profile.is_full_gpu for vm in multi for v in vm.vgpus.select_related("profile__gpu_model"))
    # Each vGPU of a VM on a GPU of its own, where the answer to "where does it fit" keeps them.
    snapshot = fleet_snapshot()
    for vm in multi:
        held = list(vm.vgpus.all())
        assert len({v.gpu_id for v in held}) == len(held), vm.name
        answer = fit.resize_impact(snapshot, vm.pk, snapshot.profiles[held[0].profile_id], len(held))
        assert (answer.fits, set(answer.gpu_ids)) == (fit.SAME_GPU, {v.gpu_id for v in held}), vm.name
    assert set(Gpu.objects.values_list("gpu_model__name", flat=True)) == {
        "Quadro RTX 6000", "Quadro RTX 8000", "NVIDIA L40S", "NVIDIA A16",
    }


def test_the_same_seed_gives_the_same_studio():
    boards = demo.resolve_boards(demo.DEFAULT_GPU_MODELS)

    assert demo.plan_studio(boards, 4, seed=3) == demo.plan_studio(boards, 4, seed=3)
    assert demo.plan_studio(boards, 4, seed=3) != demo.plan_studio(boards, 4, seed=4)


def test_gpu_models_are_chosen_by_name_or_code():
    seed("--hosts", "2", "--gpu-models", "l40s,NVIDIA A16")

    assert set(Gpu.objects.exclude(host__name="poc-rtx6000").values_list("host__name", "gpu_model__name")) == {
        ("l40s-01", "NVIDIA L40S"), ("a16-01", "NVIDIA A16"),
    }


def test_an_unknown_gpu_model_is_an_error_naming_the_known_codes():
    with pytest.raises(CommandError, match=r"Unknown GPU model 'RTX9999'; use a name or one of the codes .*L40S"):
        seed("--gpu-models", "RTX9999")

    assert not Host.objects.exists()


def test_the_admin_login_is_printed_and_works():
    output = seed("--no-synthetic")

    password = re.search(r"^Admin login: admin / (\S+)$", output, re.MULTILINE).group(1)
    admin = authenticate(username="admin", password=password)
    assert admin is not None
    assert admin.is_superuser
    assert admin.is_staff
    artist_password = re.search(r"^Artist logins: 4 new account\(s\), e\.g\. \S+, password: (\S+)$", output,
                                re.MULTILINE).group(1)
    assert authenticate(username="mei.tanaka", password=artist_password) is not None


def test_a_second_run_keeps_the_admins_password_unless_one_is_given(monkeypatch):
    first = seed("--no-synthetic")
    password = re.search(r"^Admin login: admin / (\S+)$", first, re.MULTILINE).group(1)

    second = seed("--no-synthetic")
    assert "Admin login: admin / (password unchanged; set DEMO_ADMIN_PASSWORD to reset it)" in second
    assert authenticate(username="admin", password=password) is not None

    monkeypatch.setenv("DEMO_ADMIN_PASSWORD", "a-new-admin-secret")
    third = seed("--no-synthetic")
    assert "Admin login: admin / a-new-admin-secret" in third
    assert authenticate(username="admin", password="a-new-admin-secret") is not None


def test_admin_user_and_passwords_come_from_the_environment(monkeypatch):
    monkeypatch.setenv("DEMO_ADMIN_USER", "studio-it")
    monkeypatch.setenv("DEMO_ADMIN_PASSWORD", "it-secret-123")
    monkeypatch.setenv("DEMO_ARTIST_PASSWORD", "artist-secret-123")

    output = seed("--no-synthetic")

    assert "Admin login: studio-it / it-secret-123" in output
    assert authenticate(username="studio-it", password="it-secret-123").is_superuser
    assert authenticate(username="jonas.berg", password="artist-secret-123") is not None
    assert not get_user_model().objects.filter(username="admin").exists()


def test_a_rerun_with_an_artist_password_resets_every_demo_artists(monkeypatch):
    seed("--hosts", "1")
    usernames = list(Artist.objects.values_list("user__username", flat=True))

    monkeypatch.setenv("DEMO_ARTIST_PASSWORD", "shared-artist-pass")
    output = seed("--hosts", "1")

    assert "Artist logins: passwords of the demo artists set to shared-artist-pass" in output
    assert len(usernames) > 4
    assert all(authenticate(username=name, password="shared-artist-pass") for name in usernames)


def test_a_poc_gpu_taken_meanwhile_is_reported_not_a_crash():
    demo.seed_demo(synthetic=False)
    modeling = Vgpu.objects.get(vm__name="poc-modeling")
    services.remove_vgpu(modeling)
    services.place_vgpu(VirtualMachineFactory(name="ws-intruder"), modeling.gpu, profile("RTX6000-12Q"))

    output = seed("--no-synthetic")

    assert "Left out 1 VM(s) the placement rules refused:\n  poc-modeling (modeling, RTX6000-12Q): " \
        "On host poc-rtx6000: RTX6000-12Q needs 12288 MiB; GPU 00000000:3B:00.0 has 0 MiB free of 24576 MiB; " \
        "RTX6000-12Q allows 2 per GPU; GPU 00000000:3B:00.0 already has 2" in output
    assert not Vgpu.objects.filter(vm__name="poc-modeling").exists()
    assert_rules_hold()

"""The simulated hypervisor behaves as a host does where operations depend on it, and keeps its
state in one file that several processes change without losing an update."""

import json
import multiprocessing
import time

import pytest

from hypervisors import sim_seed
from hypervisors.backends import open_backend, sim
from hypervisors.backends.base import (
    DeviceBusy,
    DomainNotFound,
    DomainSpec,
    HypervisorError,
    NoInstanceAvailable,
    PowerState,
    ShutdownTimeout,
    Unreachable,
)
from hypervisors.tests.fixtures import BUS_A, BUS_B
from telemetry.guest_rates import reading


def test_open_backend_opens_the_file_named_after_the_uri(node, sim_dir):
    backend = open_backend("sim://node-01")
    assert isinstance(backend, sim.SimBackend)
    assert backend.path == sim_dir / "node-01.json"
    check = backend.check()
    assert check.ok
    assert check.hostname == "node-01"
    assert check.hypervisor_version == sim.SIM_VERSION
    assert "node-01" in check.message


def test_a_missing_state_file_is_an_unreachable_host(sim_dir):
    backend = open_backend("sim://nowhere")
    check = backend.check()
    assert not check.ok
    assert "nowhere.json" in check.message
    with pytest.raises(Unreachable, match="not there"):
        backend.list_domains()


def test_a_uri_that_cannot_be_a_file_name_is_refused(sim_dir):
    with pytest.raises(HypervisorError, match="sim://NAME"):
        sim.SimBackend.open("sim://../etc")


def test_types_follow_the_equal_size_rule(node):
    available = {(t.gpu_bus_id, t.name): t.available for t in node.vgpu_types()}
    assert available[(BUS_A, "NVIDIA L40S-12Q")] == 4
    assert available[(BUS_A, "NVIDIA L40S-48Q")] == 1
    assert all(t.type_id.startswith("nvidia-") for t in node.vgpu_types())

    device = node.create_vgpu(BUS_A.lower()[4:], "NVIDIA L40S-12Q")
    assert device.gpu_bus_id == BUS_A
    assert device.type_name == "NVIDIA L40S-12Q"
    assert device.kind == "mdev"
    available = {(t.gpu_bus_id, t.name): t.available for t in node.vgpu_types()}
    assert available[(BUS_A, "NVIDIA L40S-12Q")] == 3
    assert available[(BUS_A, "NVIDIA L40S-24Q")] == 0
    assert available[(BUS_A, "NVIDIA L40S-48Q")] == 0
    assert available[(BUS_B, "NVIDIA L40S-24Q")] == 2
    with pytest.raises(NoInstanceAvailable, match="one size at a time"):
        node.create_vgpu(BUS_A, "NVIDIA L40S-24Q")
    for _ in range(3):
        node.create_vgpu(BUS_A, "NVIDIA L40S-12Q")
    with pytest.raises(NoInstanceAvailable, match="all 4 instances are in use"):
        node.create_vgpu(BUS_A, "NVIDIA L40S-12Q")
    assert len(node.vgpu_devices()) == 4


def test_a_device_a_running_domain_holds_cannot_be_removed(node):
    device = node.create_vgpu(BUS_A, "NVIDIA L40S-24Q")
    vm = node.define_domain("ws-01", vcpus=8, ram_mib=32768, vgpus=(device,), running=True)
    assert vm.vgpus == (device,)
    with pytest.raises(DeviceBusy, match="ws-01"):
        node.remove_vgpu(device)
    node.power_off(vm.uuid)
    node.remove_vgpu(device)
    node.remove_vgpu(device)  # already gone: not an error
    assert node.vgpu_devices() == []
    with pytest.raises(HypervisorError, match="does not exist"):
        node.start(vm.uuid)


def test_redefine_of_a_running_domain_applies_at_the_next_start(node):
    old = node.create_vgpu(BUS_A, "NVIDIA L40S-12Q")
    new = node.create_vgpu(BUS_B, "NVIDIA L40S-24Q")
    vm = node.define_domain("ws-01", vcpus=8, ram_mib=32768, vgpus=(old,), running=True)
    saved = node.definition(vm.uuid)

    node.redefine(vm.uuid, DomainSpec(vcpus=12, ram_mib=65536, vgpus=(new,)))
    running = node.domain(vm.uuid)
    assert (running.vcpus, running.ram_mib, running.vgpus) == (8, 32768, (old,))

    node.shutdown(vm.uuid, timeout_s=5)
    node.start(vm.uuid)
    started = node.domain(vm.uuid)
    assert (started.state, started.vcpus, started.ram_mib, started.vgpus) == (PowerState.RUNNING, 12, 65536, (new,))
    node.remove_vgpu(old)  # no longer held

    node.shutdown(vm.uuid, timeout_s=5)
    new_device = node.create_vgpu(BUS_A, "NVIDIA L40S-12Q")
    node.restore(vm.uuid, saved)
    restored = node.domain(vm.uuid)
    assert (restored.vcpus, restored.ram_mib) == (8, 32768)
    assert restored.vgpus[0].id == old.id
    assert restored.vgpus[0].gpu_bus_id == ""
    assert new_device in node.vgpu_devices()


def test_redefine_refuses_a_device_that_does_not_exist(node):
    vm = node.define_domain("ws-01", vcpus=8, ram_mib=32768)
    ghost = sim.VgpuDevice(kind="mdev", id="6a8a0c3c-59b5-4d6b-8f6e-000000000000", gpu_bus_id=BUS_A)
    with pytest.raises(HypervisorError, match="create it before"):
        node.redefine(vm.uuid, DomainSpec(vcpus=8, ram_mib=32768, vgpus=(ghost,)))


def test_shutdown_takes_the_configured_time_and_other_processes_see_it(node):
    vm = node.define_domain("ws-01", vcpus=8, ram_mib=32768, running=True)
    started = time.monotonic()
    node.shutdown(vm.uuid, timeout_s=5)
    assert time.monotonic() - started >= 0.1
    assert sim.SimBackend.open("sim://node-01").domain(vm.uuid).state == PowerState.SHUT_OFF
    node.shutdown(vm.uuid, timeout_s=0)  # already off: nothing to do


def test_a_guest_that_ignores_acpi_times_out_and_keeps_running(node):
    vm = node.define_domain("ws-01", vcpus=8, ram_mib=32768, running=True)
    node.set_ignore_acpi(vm.uuid)
    with pytest.raises(ShutdownTimeout, match="ws-01 did not power off within 0.3 s"):
        node.shutdown(vm.uuid, timeout_s=0.3)
    assert node.domain(vm.uuid).state == PowerState.RUNNING


def test_move_to_another_simulated_host(node, sim_dir):
    other = sim.SimBackend.open("sim://node-02")
    other.seed(sim.empty_state("node-02"))
    vm = node.define_domain("ws-01", vcpus=8, ram_mib=32768, running=True)
    with pytest.raises(HypervisorError, match="cold move"):
        node.move_to(vm.uuid, other)
    node.shutdown(vm.uuid, timeout_s=5)
    node.move_to(vm.uuid, other)
    assert [d.name for d in other.list_domains()] == ["ws-01"]
    with pytest.raises(DomainNotFound):
        node.domain(vm.uuid)


def test_definition_is_a_json_string(node):
    vm = node.define_domain("ws-01", vcpus=4, ram_mib=16384)
    assert json.loads(node.definition(vm.uuid)) == {"uuid": vm.uuid, "name": "ws-01", "vcpus": 4,
                                                     "ram_mib": 16384, "vgpus": []}
    with pytest.raises(HypervisorError, match="not a definition"):
        node.restore(vm.uuid, "<domain/>")


def _define_many(prefix: str, count: int) -> None:
    backend = sim.SimBackend.open("sim://node-01")
    for number in range(count):
        backend.define_domain(f"{prefix}-{number:02d}", vcpus=1, ram_mib=1024)
        backend.create_vgpu(BUS_B if prefix == "b" else BUS_A, "NVIDIA L40S-12Q") if number < 2 else None


def test_concurrent_processes_lose_no_update(node):
    context = multiprocessing.get_context("fork")
    workers = [context.Process(target=_define_many, args=(prefix, 15)) for prefix in "ab"]
    for worker in workers:
        worker.start()
    _define_many("c", 15)
    for worker in workers:
        worker.join(30)
        assert worker.exitcode == 0
    assert len(node.list_domains()) == 45
    assert len(node.vgpu_devices()) == 6
    assert not list(node.path.parent.glob(".node-01.json.*"))  # no temporary file left behind


# Guest CPU and memory ----------------------------------------------------------------------

S = 1_000_000_000
#: A Wednesday, 15:00 UTC: every simulated artist is at work.
WEDNESDAY_AFTERNOON = 1_764_169_200 * S


def read_twice(backend: sim.SimBackend, at_ns: int, apart_s: int = 60) -> dict:
    """Each running domain's figures over `apart_s` seconds from `at_ns`, by UUID."""
    backend.clock = lambda: at_ns
    before = {c.uuid: c for c in backend.guest_counters()}
    backend.clock = lambda: at_ns + apart_s * S
    return {c.uuid: reading(c, before.get(c.uuid)) for c in backend.guest_counters()}


def test_guest_figures_follow_each_vms_workflow(node, settings):
    settings.TIME_ZONE = "UTC"
    animation = node.define_domain("anim-01", vcpus=8, ram_mib=32768, running=True, workflow="animation")
    modeling = node.define_domain("model-01", vcpus=8, ram_mib=32768, running=True, workflow="modeling")
    lighting = node.define_domain("light-01", vcpus=16, ram_mib=65536, running=True, workflow="lighting")
    legacy = node.define_domain("coord-01", vcpus=4, ram_mib=8192, running=True, balloon=False)
    parked = node.define_domain("anim-02", vcpus=8, ram_mib=32768, workflow="animation")

    got = read_twice(node, WEDNESDAY_AFTERNOON)

    assert set(got) == {animation.uuid, modeling.uuid, lighting.uuid, legacy.uuid}  # anim-02 is off
    anim = got[animation.uuid]
    assert anim.vcpu_max_util >= 85  # the playback thread saturates one vCPU...
    assert anim.vcpu_util <= 30  # ...while the VM as a whole is mostly idle
    model = got[modeling.uuid]
    assert model.vcpu_util <= 20
    assert 3072 <= model.ram_used_mib <= 8192  # about 6 GiB of its 32
    assert model.ram_used_pct <= 25
    assert got[lighting.uuid].ram_used_pct > model.ram_used_pct
    assert (got[legacy.uuid].ram_used_mib, got[legacy.uuid].ram_used_pct) == (None, None)  # not reported, not 0
    assert got[legacy.uuid].vcpu_util is not None
    for figures in got.values():
        assert 0 < figures.cpu_steal_pct <= 2
        assert figures.vcpu_util <= figures.vcpu_max_util <= 100
    assert parked.uuid not in got


def test_nights_are_idle_and_renders_keep_every_vcpu_busy_in_bursts(node, settings):
    settings.TIME_ZONE = "UTC"
    animation = node.define_domain("anim-01", vcpus=8, ram_mib=32768, running=True, workflow="animation",
                                   uuid="0a0a0a0a-0000-4000-8000-000000000001")
    night = read_twice(node, WEDNESDAY_AFTERNOON - 12 * 3600 * S)  # 03:00
    assert night[animation.uuid].vcpu_max_util < 10

    renders = [node.define_domain(f"light-{n:02d}", vcpus=16, ram_mib=65536, running=True, workflow="lighting",
                                  uuid=f"0b0b0b0b-0000-4000-8000-00000000000{n}") for n in range(3)]
    shares = {r.uuid: [] for r in renders}
    for step in range(0, 9 * 3600, 300):  # 10:00 to 19:00, every 5 minutes
        got = read_twice(node, WEDNESDAY_AFTERNOON - 5 * 3600 * S + step * S, apart_s=300)
        for render in renders:
            shares[render.uuid].append(got[render.uuid].vcpu_util)
    for day in shares.values():
        assert max(day) > 80  # a render: all 16 vCPUs busy
        assert min(day) < 30  # between renders, interactive work


def test_counters_agree_between_processes_and_never_go_back(node, settings):
    settings.TIME_ZONE = "Europe/Paris"
    vm = node.define_domain("comp-01", vcpus=4, ram_mib=16384, running=True, workflow="compositing")
    other_process = sim.SimBackend.open("sim://node-01")
    node.clock = other_process.clock = lambda: WEDNESDAY_AFTERNOON
    assert node.guest_counters() == other_process.guest_counters()

    previous = None
    for step in range(0, 9 * 24 * 3600, 1200):  # nine days every 20 minutes, across a week's end
        node.clock = lambda step=step: WEDNESDAY_AFTERNOON + step * S
        (current,) = node.guest_counters()
        if previous is not None:
            figures = reading(current, previous)
            assert figures.vcpu_util is not None, f"a counter went back {step} s on"
            assert 0 <= figures.vcpu_util <= 100
            assert current.steal_ns >= previous.steal_ns
        previous = current
    assert current.uuid == vm.uuid


def test_a_state_file_from_before_workflows_still_reads(node):
    vm = node.define_domain("ws-01", vcpus=4, ram_mib=16384, running=True)
    state = json.loads(node.path.read_text())
    for key in ("workflow", "balloon"):
        del state["domains"][vm.uuid][key]
    node.seed(state)

    got = read_twice(node, WEDNESDAY_AFTERNOON)[vm.uuid]

    assert got.vcpu_util <= 20  # light work
    assert got.ram_used_mib is not None


def test_the_seeded_demo_gives_guests_their_artists_workflow_and_one_no_balloon_driver(linked):
    linked.vm_b.artist.workflow = "other"
    linked.vm_b.artist.save()
    linked.vm_a.artist.workflow = "animation"
    linked.vm_a.artist.save()
    sim_seed.seed_host(linked.host)

    state = json.loads(linked.sim.path.read_text())
    records = {r["name"]: r for r in state["domains"].values()}
    assert (records["ws-a"]["workflow"], records["ws-a"]["balloon"]) == ("animation", True)
    assert (records["ws-b"]["workflow"], records["ws-b"]["balloon"]) == ("other", False)
    assert 0 < state["cpu_contention"] <= 0.02
    got = read_twice(linked.sim, WEDNESDAY_AFTERNOON)
    assert got[str(linked.vm_b.uuid)].ram_used_mib is None
    assert got[str(linked.vm_a.uuid)].ram_used_mib > 0

"""The Proxmox VE backend against a Proxmox VE API over real HTTPS: the fake in
hypervisors.testing.pvefake (its docstring says what its cluster holds and what it does not do).
"""

from __future__ import annotations

import socket

import pytest

from hypervisors import matching
from hypervisors.backends import open_backend, proxmox
from hypervisors.backends.base import (
    DeviceBusy,
    DeviceKind,
    DomainNotFound,
    DomainSpec,
    HypervisorError,
    NoInstanceAvailable,
    PowerState,
    ShutdownTimeout,
    Unreachable,
    VgpuDevice,
)
from hypervisors.backends.proxmox import ProxmoxBackend, mdev_uuid, pve_pci
from hypervisors.testing import pvefake
from hypervisors.testing.pvefake import (
    TYPE_4Q,
    TYPE_8Q,
    VM_ANIM,
    VM_BUILD,
    VM_COMP,
    VM_LIGHT,
    VM_MODEL,
)
from telemetry import guest_rates

GPU_A, GPU_B = "00000000:3B:00.0", "00000000:5E:00.0"
T4_PROFILES = ["T4-1Q", "T4-2Q", "T4-4Q", "T4-8Q", "T4-16Q"]


@pytest.fixture
def node(pve):
    """Node pve1 through the fake's API, signed in as root@pam."""
    backend = open_backend(pve.uri(), secret_ref=pve.secret_ref)
    yield backend
    backend.close()


def by_name(backend) -> dict:
    return {domain.name: domain for domain in backend.list_domains()}


def hostpci(pve, vmid: int) -> dict[str, str]:
    return {key: value for key, value in pve.server.vm(vmid)["config"].items() if key.startswith("hostpci")}


# Names and addresses ------------------------------------------------------------------------------


def test_proxmox_names_a_vgpu_after_its_slot_and_vm_and_writes_pci_addresses_its_way():
    assert mdev_uuid(101, 0) == "00000000-0000-0000-0000-000000000101"
    assert mdev_uuid(4711, 3) == "00000003-0000-0000-0000-000000004711"
    assert pve_pci("00000000:3B:00.0") == "0000:3b:00.0"
    assert pve_pci("3b:00.4") == "0000:3b:00.4"
    with pytest.raises(HypervisorError, match="not a PCI address"):
        pve_pci("GPU-1")


# Connecting --------------------------------------------------------------------------------------


def test_the_check_says_which_node_it_reached_and_its_gpus(node):
    assert isinstance(node, ProxmoxBackend)  # chosen by the URI's scheme
    answer = node.check()
    assert answer.ok, answer.message
    assert answer.hostname == "pve1"
    assert answer.hypervisor_version == "8.2.4"
    assert "Connected to Proxmox VE 8.2.4 as root@pam: node pve1 of 2 node(s), 2 NVIDIA GPU(s)" in answer.message


def test_an_api_token_signs_in_without_a_password(pve):
    backend = open_backend(pve.uri(token=True), secret_ref=pve.token_ref)
    answer = backend.check()
    assert answer.ok, answer.message
    assert "as root@pam!dash" in answer.message
    assert "only root@pam itself (not an API token) set raw PCI devices" in answer.message
    assert {d.name for d in backend.list_domains()} == {"ws-anim-01", "ws-light-01", "ws-model-01", "build-agent"}


def test_a_user_without_power_rights_is_told_which_privileges_it_lacks_and_that_only_root_sets_pci(pve, settings):
    (settings.HYPERVISOR_SECRETS_DIR / "ops").write_text(pvefake.LIMITED_PASSWORD)
    backend = open_backend(pve.uri(user=pvefake.LIMITED_USER), secret_ref="ops")
    answer = backend.check()
    assert not answer.ok
    assert "as ops@pve, but it lacks the privilege VM.PowerMgmt on the node's VMs" in answer.message
    ana = backend.domain(by_name(backend)["build-agent"].uuid)
    spec = DomainSpec(vcpus=2, ram_mib=4096, vgpus=(VgpuDevice(DeviceKind.MDEV, "x", GPU_A, "GRID T4-4Q"),))
    with pytest.raises(HypervisorError, match="could not reconfigure build-agent: only root can set 'hostpci0'"):
        backend.redefine(ana.uuid, spec)
    assert hostpci(pve, VM_BUILD) == {}


def test_a_wrong_password_is_said_to_be_the_credentials(pve, settings):
    (settings.HYPERVISOR_SECRETS_DIR / "wrong").write_text("not-the-password\n")
    with pytest.raises(Unreachable, match="refused the credentials of root@pam"):
        open_backend(pve.uri(), secret_ref="wrong")
    with pytest.raises(Unreachable, match="refused the API token root@pam!dash"):
        open_backend(pve.uri(token=True), secret_ref="wrong")


def test_a_port_where_nothing_listens_is_said_to_refuse_the_connection(pve):
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        free = sock.getsockname()[1]
    uri = pve.uri().replace(f":{pve.server.port}/", f":{free}/")
    with pytest.raises(Unreachable, match=f"127.0.0.1:{free} refused the connection.*8006 by default"):
        open_backend(uri, secret_ref=pve.secret_ref)


def test_a_name_that_does_not_resolve_is_said_to_be_dns(pve):
    uri = pve.uri().replace("127.0.0.1", "pve-99.invalid")
    with pytest.raises(Unreachable, match="Could not find pve-99.invalid: the name does not resolve \\(DNS\\)"):
        open_backend(uri, secret_ref=pve.secret_ref)


def test_an_untrusted_certificate_is_refused_unless_its_ca_is_given_or_the_check_is_waived(pve):
    with pytest.raises(Unreachable, match="TLS certificate of 127.0.0.1:.* is not trusted.*cafile=.*insecure=1"):
        open_backend(pve.uri(cafile=False), secret_ref=pve.secret_ref)
    wrong_ca = pve.uri(cafile=False) + f"&cafile={pve.server.untrusted_ca_pem}"
    with pytest.raises(Unreachable, match="is not trusted"):
        open_backend(wrong_ca, secret_ref=pve.secret_ref)
    assert open_backend(pve.uri(insecure=True), secret_ref=pve.secret_ref).check().ok


def test_a_node_the_cluster_lacks_is_named_with_those_it_has(pve):
    with pytest.raises(Unreachable, match="has no node 'pve9' \\(it has: pve1, pve2\\); fix node="):
        open_backend(pve.uri("pve9"), secret_ref=pve.secret_ref)
    with pytest.raises(Unreachable, match="has 2 nodes \\(pve1, pve2\\): name one with node="):
        open_backend(pve.uri().replace("node=pve1&", ""), secret_ref=pve.secret_ref)


def test_a_missing_secret_is_named_by_its_reference(pve):
    with pytest.raises(Unreachable, match="needs a password"):
        open_backend(pve.uri(), secret_ref="")
    with pytest.raises(Unreachable, match="no file or folder named 'pve-nope'"):
        open_backend(pve.uri(), secret_ref="pve-nope")


def test_an_expired_ticket_is_renewed_by_signing_in_again(node, pve):
    before = len(by_name(node))
    pve.server.expire_tickets()
    assert len(by_name(node)) == before
    assert node.check().ok


# Reading -----------------------------------------------------------------------------------------


def test_the_nodes_vms_are_read_with_their_vgpus_as_proxmox_names_them(node, pve):
    vms = by_name(node)
    assert set(vms) == {"ws-anim-01", "ws-light-01", "ws-model-01", "build-agent"}  # pve2's VM is not pve1's
    anim = vms["ws-anim-01"]
    assert anim.uuid == pve.server.vm(VM_ANIM)["config"]["smbios1"].partition("uuid=")[2].lower()
    assert (anim.vcpus, anim.ram_mib, anim.state) == (4, 16384, PowerState.RUNNING)
    assert anim.vgpus == (VgpuDevice(DeviceKind.MDEV, mdev_uuid(VM_ANIM, 0), GPU_A, "GRID T4-4Q"),)
    # The device's id is the mdev Proxmox VE made at start, the one the host agent reads.
    assert [i["uuid"] for i in pve.server.vm(VM_ANIM)["instances"]] == [anim.vgpus[0].id]
    assert [d.gpu_bus_id for d in vms["ws-light-01"].vgpus] == [GPU_B]
    assert (vms["build-agent"].state, vms["build-agent"].vgpus) == (PowerState.SHUT_OFF, ())
    assert matching.match_profile(anim.vgpus[0].type_name, T4_PROFILES) == "T4-4Q"
    with pytest.raises(DomainNotFound, match="no VM"):
        node.domain("00000000-1111-2222-3333-444444444444")


def test_the_vgpu_types_say_how_many_more_each_gpu_takes(node):
    types = {(t.gpu_bus_id, t.name): t for t in node.vgpu_types()}
    assert types[(GPU_A, "GRID T4-4Q")].available == 3  # one 4Q of 16 GiB runs there
    assert types[(GPU_A, "GRID T4-4Q")].type_id == TYPE_4Q
    assert types[(GPU_A, "GRID T4-8Q")].available == 0  # one size per GPU
    assert types[(GPU_B, "GRID T4-8Q")].available == 0  # two 8Q: full
    assert {t.name for t in node.vgpu_types() if t.gpu_bus_id == GPU_A} == {
        "GRID T4-1Q", "GRID T4-2Q", "GRID T4-4Q", "GRID T4-8Q", "GRID T4-16Q"}


# Changing ----------------------------------------------------------------------------------------


def test_a_resize_is_a_shutdown_a_new_hostpci_entry_and_a_start(node, pve):
    anim = by_name(node)["ws-anim-01"]
    node.shutdown(anim.uuid, timeout_s=10)
    assert pve.server.vm(VM_ANIM)["status"] == "stopped"
    assert pve.server.instances("pve1", GPU_A) == []  # Proxmox VE removes the mdev at stop

    device = node.create_vgpu(GPU_A, "GRID T4-8Q", device_id="5b4a9d0e-8c1f-4a34-9e53-2b6f51a0c7d2")
    node.redefine(anim.uuid, DomainSpec(vcpus=8, ram_mib=32768, vgpus=(device,)))
    node.start(anim.uuid)

    state = pve.server.vm(VM_ANIM)
    assert state["status"] == "running"
    assert (str(state["config"]["cores"]), str(state["config"]["memory"])) == ("8", "32768")
    assert "q35" in state["config"]["machine"]  # a PCI Express machine gets the vGPU as a PCIe device
    assert hostpci(pve, VM_ANIM) == {"hostpci0": f"0000:3b:00.0,mdev={TYPE_8Q},pcie=1"}
    assert [(i["uuid"], i["type"]) for i in state["instances"]] == [(mdev_uuid(VM_ANIM, 0), TYPE_8Q)]
    assert node.domain(anim.uuid).vgpus == (VgpuDevice(DeviceKind.MDEV, mdev_uuid(VM_ANIM, 0), GPU_A,
                                                       "GRID T4-8Q"),)


def test_a_guest_that_ignores_the_shutdown_is_left_running(node, pve):
    model = by_name(node)["ws-model-01"]
    with pytest.raises(ShutdownTimeout, match="ws-model-01 on pve1 did not power off within 0.5 s"):
        node.shutdown(model.uuid, timeout_s=0.5)
    assert pve.server.vm(VM_MODEL)["status"] == "running"


def test_a_failed_task_is_said_with_its_exit_status(node, pve):
    build = by_name(node)["build-agent"]
    pve.server.fail_next("qmstart", "start failed: QEMU exited with code 1")
    with pytest.raises(HypervisorError, match="could not start build-agent: the task failed: start failed: QEMU "
                                              "exited with code 1"):
        node.start(build.uuid)
    assert pve.server.vm(VM_BUILD)["status"] == "stopped"


def test_a_task_that_never_ends_is_given_up_after_the_timeout(node, pve, monkeypatch):
    monkeypatch.setattr(proxmox, "TASK_TIMEOUT_S", 0.5)
    build = by_name(node)["build-agent"]
    pve.server.hang_next("qmconfig")
    with pytest.raises(HypervisorError, match="did not reconfigure build-agent within 0.5 s \\(task UPID:pve1:"):
        node.redefine(build.uuid, DomainSpec(vcpus=4, ram_mib=4096, vgpus=()))


def test_a_start_the_gpu_has_no_room_for_fails_saying_so_and_the_vm_stays_off(node, pve):
    build = by_name(node)["build-agent"]
    device = VgpuDevice(DeviceKind.MDEV, "5b4a9d0e-8c1f-4a34-9e53-2b6f51a0c7d2", GPU_B, "GRID T4-8Q")
    node.redefine(build.uuid, DomainSpec(vcpus=2, ram_mib=4096, vgpus=(device,)))
    with pytest.raises(NoInstanceAvailable, match="has no available instances of 'nvidia-225'"):
        node.start(build.uuid)
    assert pve.server.vm(VM_BUILD)["status"] == "stopped"


def test_a_full_gpu_or_a_type_it_lacks_is_refused_before_anything_changes(node):
    with pytest.raises(NoInstanceAvailable, match="cannot take another GRID T4-8Q vGPU now"):
        node.create_vgpu(GPU_B, "GRID T4-8Q")
    with pytest.raises(NoInstanceAvailable, match="offers no vGPU type named 'NVIDIA L40S-12Q'"):
        node.create_vgpu(GPU_A, "NVIDIA L40S-12Q")
    with pytest.raises(NoInstanceAvailable, match="no NVIDIA GPU with vGPU types at 00000000:AF:00.0"):
        node.create_vgpu("00000000:AF:00.0", "GRID T4-4Q")


def test_vgpus_of_a_running_vm_are_not_changed_under_it(node, pve):
    light = by_name(node)["ws-light-01"]
    with pytest.raises(DeviceBusy, match="in use by ws-light-01, which is running on pve1"):
        node.remove_vgpu(light.vgpus[0])
    with pytest.raises(HypervisorError, match="changes its vGPU devices only while it is stopped"):
        node.redefine(light.uuid, DomainSpec(vcpus=8, ram_mib=32768, vgpus=()))
    assert hostpci(pve, VM_LIGHT) == {"hostpci0": f"0000:5e:00.0,mdev={TYPE_8Q}"}


def test_a_saved_definition_puts_the_vm_back_as_it_was(node, pve):
    anim = by_name(node)["ws-anim-01"]
    saved = node.definition(anim.uuid)
    node.shutdown(anim.uuid, timeout_s=10)
    node.redefine(anim.uuid, DomainSpec(vcpus=2, ram_mib=2048, vgpus=()))
    assert hostpci(pve, VM_ANIM) == {}
    node.restore(anim.uuid, saved)
    restored = node.domain(anim.uuid)
    assert (restored.vcpus, restored.ram_mib, restored.vgpus) == (anim.vcpus, anim.ram_mib, anim.vgpus)
    with pytest.raises(HypervisorError, match="belongs to VM"):
        node.restore(by_name(node)["build-agent"].uuid, saved)


def test_a_stopped_vm_moves_to_another_node_of_the_cluster(node, pve):
    other = open_backend(pve.uri("pve2"), secret_ref=pve.secret_ref)
    build = by_name(node)["build-agent"]
    node.move_to(build.uuid, other)
    assert pve.server.vm(VM_BUILD)["node"] == "pve2"
    assert other.domain(build.uuid).name == "build-agent"
    with pytest.raises(DomainNotFound):
        node.domain(build.uuid)
    # A running VM is refused by the product; one holding raw PCI devices by Proxmox VE, in its words.
    with pytest.raises(HypervisorError, match="ws-anim-01 is running on pve1: shut it down before moving it"):
        node.move_to(by_name(node)["ws-anim-01"].uuid, other)
    comp = by_name(other)["ws-comp-01"]
    with pytest.raises(HypervisorError, match="could not move ws-comp-01 to pve1: .*local devices: hostpci0"):
        other.move_to(comp.uuid, node)
    assert pve.server.vm(VM_COMP)["node"] == "pve2"


# Guest figures -------------------------------------------------------------------------------


def test_guest_figures_of_the_running_vms_come_from_the_nodes_listing(node, pve):
    counters = {c.uuid: c for c in node.guest_counters()}
    uuid = {vmid: pvefake.vm_uuid(vmid) for vmid in (VM_ANIM, VM_LIGHT, VM_MODEL, VM_BUILD)}
    assert sorted(counters) == sorted([uuid[VM_ANIM], uuid[VM_LIGHT], uuid[VM_MODEL]])  # build-agent is off

    # ws-anim-01: a quarter of its 4 vCPUs, 6144 MiB of 16384 in use as its balloon driver says.
    anim = counters[uuid[VM_ANIM]]
    assert (anim.vcpus, anim.ram_mib, anim.vcpu_pct, anim.ram_used_mib) == (4, 16384, 25.0, 6144)
    assert (anim.vcpu_max_pct, anim.steal_pct) == (None, None)  # Proxmox VE reports neither
    got = guest_rates.reading(anim, None)
    assert (got.vcpu_util, got.ram_used_mib, got.ram_used_pct) == (25.0, 6144, 37.5)
    light = guest_rates.reading(counters[uuid[VM_LIGHT]], None)
    assert (light.vcpus, light.vcpu_util, light.ram_used_mib, light.ram_used_pct) == (8, 50.0, 24576, 75.0)

    # ws-model-01 runs no balloon driver: QEMU's resident memory is not taken for the guest's use.
    model = guest_rates.reading(counters[uuid[VM_MODEL]], None)
    assert (model.vcpu_util, model.ram_mib, model.ram_used_mib, model.ram_used_pct) == (90.0, 8192, None, None)


def test_a_guest_read_again_costs_one_request_until_it_restarts(node, pve):
    node.guest_counters()
    before = len(pve.server.requests)
    pve.server.set_guest(VM_MODEL, cpu_load=0.125, used_mib=2048, balloon_driver=True)  # the driver installed
    model = next(c for c in node.guest_counters() if c.uuid == pvefake.vm_uuid(VM_MODEL))
    assert (model.vcpu_pct, model.ram_used_mib) == (12.5, 2048)
    assert [(method, path) for method, path, *_ in pve.server.requests[before:]] == [
        ("GET", "/api2/json/nodes/pve1/qemu")]
    node.start(pvefake.vm_uuid(VM_BUILD))
    seen = len(pve.server.requests)
    assert pvefake.vm_uuid(VM_BUILD) in {c.uuid for c in node.guest_counters()}
    assert ("GET", f"/api2/json/nodes/pve1/qemu/{VM_BUILD}/config") in [
        (method, path) for method, path, *_ in pve.server.requests[seen:]]


def test_a_listing_without_balloon_figures_is_completed_from_the_vms_status(node, pve, monkeypatch):
    listing = pve.server._get_qemu_list

    def without_balloon(caller, params, node_name):
        return [{k: v for k, v in row.items() if k != "ballooninfo"} for row in listing(caller, params, node_name)]

    monkeypatch.setattr(pve.server, "_get_qemu_list", without_balloon)
    anim = next(c for c in node.guest_counters() if c.uuid == pvefake.vm_uuid(VM_ANIM))
    assert anim.ram_used_mib == 6144

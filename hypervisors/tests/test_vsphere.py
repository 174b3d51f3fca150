"""The vSphere backend against a real vCenter simulator: govmomi's vcsim, built from Debian's
source with NVIDIA vGPU hosts (hypervisors.testing.vcsim says what its inventory holds).

What the simulator does not do is said where it matters: it lists a GPU's running VMs as the
launcher set them (graphicsInfo is not updated at power on), and it does not enforce vGPU capacity.
"""

from __future__ import annotations

import socket
import uuid as uuidlib
from contextlib import contextmanager

import pytest
from pyVmomi import vim

from hypervisors import matching
from hypervisors.backends import open_backend, vsphere
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
from hypervisors.backends.vsphere import VsphereBackend, framebuffer_gib, type_name, vsphere_type
from hypervisors.testing import vcsim as vcsim_harness
from hypervisors.testing.vcsim import Vcsim
from telemetry import guest_rates

GPU_A, GPU_B = "00000000:3B:00.0", "00000000:5E:00.0"
T4_PROFILES = ["T4-1Q", "T4-2Q", "T4-4Q", "T4-8Q", "T4-16Q"]


@pytest.fixture
def host(vcsim):
    """The standalone host DC0_H0 through the simulated vCenter."""
    backend = open_backend(vcsim.uri(), secret_ref=vcsim.secret_ref)
    yield backend
    backend.close()


def vm_named(si, name: str):
    view = si.content.viewManager.CreateContainerView(si.content.rootFolder, [vim.VirtualMachine], True)
    try:
        return next(vm for vm in view.view if vm.name == name)
    finally:
        view.Destroy()


def vgpu_backings(vm) -> list[str]:
    return [d.backing.vgpu for d in vm.config.hardware.device
            if isinstance(d.backing, vim.vm.device.VirtualPCIPassthrough.VmiopBackingInfo)]


def by_name(backend) -> dict:
    return {domain.name: domain for domain in backend.list_domains()}


@contextmanager
def admin_session(server: Vcsim):
    """A simulator started by the test itself as its admin sees it (a pyvmomi session of its
    own), as the `vcenter_admin` fixture gives the fixture's simulator."""
    from pyVim.connect import Disconnect, SmartConnect

    si = SmartConnect(host=server.host, port=server.port, user=server.username, pwd=server.password,
                      disableSslCertValidation=True)
    try:
        yield si
    finally:
        Disconnect(si)


# The simulator ---------------------------------------------------------------------------------


def test_a_machine_without_go_or_govmomi_is_told_what_to_install(monkeypatch, tmp_path):
    monkeypatch.setattr(vcsim_harness, "find_go", lambda: None)
    with pytest.raises(vcsim_harness.VcsimUnavailable, match="Go toolchain is not installed.*apt-get install -y "
                       "golang-go golang-github-vmware-govmomi-dev"):
        vcsim_harness.build()
    monkeypatch.setattr(vcsim_harness, "find_go", lambda: "/usr/bin/go")
    monkeypatch.setattr(vcsim_harness, "GOVMOMI_SIMULATOR", tmp_path / "nowhere")
    with pytest.raises(vcsim_harness.VcsimUnavailable, match="govmomi's Go source is not in /usr/share/gocode"):
        vcsim_harness.build()


# Names ---------------------------------------------------------------------------------------


def test_vsphere_type_names_read_as_the_driver_names_them_and_match_catalog_profiles():
    assert type_name("grid_t4-4q") == "GRID T4-4Q"
    assert type_name("nvidia_l40s-12q") == "NVIDIA L40S-12Q"
    assert vsphere_type("GRID T4-4Q") == "grid_t4-4q"
    assert framebuffer_gib("grid_a100-4-20c") == 20
    assert matching.match_profile(type_name("grid_t4-8q"), T4_PROFILES) == "T4-8Q"
    assert matching.match_profile(type_name("nvidia_l40s-12q"), ["L40S-12Q", "L40S-24Q"]) == "L40S-12Q"


# Connecting ----------------------------------------------------------------------------------


def test_the_check_says_which_host_it_reached_and_its_gpus(host):
    assert isinstance(host, VsphereBackend)  # chosen by the URI's scheme
    answer = host.check()
    assert answer.ok, answer.message
    assert answer.hostname == "DC0_H0"
    assert "as administrator@vsphere.local" in answer.message
    assert "2 NVIDIA GPU(s)" in answer.message
    assert answer.details["datacenter"] == "DC0"


def test_missing_privileges_are_named_by_the_check(vcsim_binary, vcenter_secret):
    with Vcsim(binary=vcsim_binary, deny=("VirtualMachine.Config.AddRemoveDevice", "Resource.ColdMigrate")) as server:
        backend = open_backend(server.uri(), secret_ref=vcenter_secret)
        answer = backend.check()
        backend.close()
    assert not answer.ok
    assert ("lacks the privileges VirtualMachine.Config.AddRemoveDevice, Resource.ColdMigrate on DC0_H0"
            in answer.message)


def test_a_wrong_password_is_said_to_be_the_credentials(vcsim, settings):
    (settings.HYPERVISOR_SECRETS_DIR / "wrong").write_text("not-the-password\n")
    with pytest.raises(Unreachable, match="refused the credentials of administrator@vsphere.local"):
        open_backend(vcsim.uri(), secret_ref="wrong")


def test_a_port_where_nothing_listens_is_said_to_refuse_the_connection(vcsim):
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        free = sock.getsockname()[1]
    uri = vcsim.uri().replace(f":{vcsim.server.port}/", f":{free}/")
    with pytest.raises(Unreachable, match=f"127.0.0.1:{free} refused the connection"):
        open_backend(uri, secret_ref=vcsim.secret_ref)


def test_an_untrusted_certificate_is_refused_unless_its_ca_is_given_or_the_check_is_waived(vcsim):
    with pytest.raises(Unreachable, match="TLS certificate of 127.0.0.1:.* is not trusted.*cafile=.*insecure=1"):
        open_backend(vcsim.uri(insecure=False), secret_ref=vcsim.secret_ref)
    trusted = open_backend(vcsim.uri(insecure=False, cafile=str(vcsim.server.ca_file)), secret_ref=vcsim.secret_ref)
    assert trusted.check().ok
    trusted.close()


def test_a_name_that_does_not_resolve_is_said_to_be_dns(vcsim):
    uri = vcsim.uri().replace("127.0.0.1", "vcenter.does-not-exist.invalid")
    with pytest.raises(Unreachable, match="does not resolve \\(DNS\\)"):
        open_backend(uri, secret_ref=vcsim.secret_ref)


def test_a_host_or_datacenter_it_lacks_is_named_with_those_it_has(vcsim):
    with pytest.raises(Unreachable, match="no host 'esx-99'.*DC0_C0_H0, DC0_C0_H1, DC0_C0_H2, DC0_H0"):
        open_backend(vcsim.uri(host="esx-99"), secret_ref=vcsim.secret_ref)
    with pytest.raises(Unreachable, match="has 4 hosts.*name one with host="):
        open_backend(vcsim.uri(host=""), secret_ref=vcsim.secret_ref)
    with pytest.raises(Unreachable, match="no datacenter 'DC9' \\(it has: DC0\\)"):
        open_backend(vcsim.uri(datacenter="DC9"), secret_ref=vcsim.secret_ref)


def test_an_expired_session_is_replaced_without_the_caller_noticing(host, vcenter_admin):
    key = host._si.content.sessionManager.currentSession.key
    vcenter_admin.content.sessionManager.TerminateSession(sessionId=[key])
    assert "DC0_H0_VM0" in by_name(host)
    assert host._si.content.sessionManager.currentSession.key != key


# Discovery -----------------------------------------------------------------------------------


def test_discovery_lists_the_hosts_vms_with_their_vgpus(host, vcenter_admin):
    domains = by_name(host)
    assert sorted(domains) == ["DC0_H0_VM0", "DC0_H0_VM1", "DC0_H0_VM2"]
    vm0 = domains["DC0_H0_VM0"]
    real = vm_named(vcenter_admin, "DC0_H0_VM0")
    assert (vm0.uuid, vm0.vcpus, vm0.ram_mib, vm0.state) == (
        real.config.uuid.lower(), real.config.hardware.numCPU, real.config.hardware.memoryMB, PowerState.RUNNING)
    [vgpu] = vm0.vgpus
    assert (vgpu.kind, vgpu.gpu_bus_id, vgpu.type_name) == (DeviceKind.VMIOP, GPU_A, "GRID T4-4Q")
    assert [(d.gpu_bus_id, d.type_name) for d in domains["DC0_H0_VM1"].vgpus] == [(GPU_B, "GRID T4-8Q")]
    assert [(d.gpu_bus_id, d.type_name) for d in domains["DC0_H0_VM2"].vgpus] == [(GPU_B, "GRID T4-8Q")]
    assert domains["DC0_H0_VM1"].vgpus[0].id != domains["DC0_H0_VM2"].vgpus[0].id
    assert host.domain(vm0.uuid) == vm0
    assert host.list_domains() == sorted(domains.values(), key=lambda d: d.name)  # ids stay the same across reads


def test_each_cluster_host_lists_only_its_own_vms(vcsim):
    seen = {}
    for name in ("DC0_C0_H0", "DC0_C0_H1", "DC0_C0_H2"):
        backend = open_backend(vcsim.uri(host=name), secret_ref=vcsim.secret_ref)
        seen[name] = {d.name: [v.type_name for v in d.vgpus] for d in backend.list_domains()}
        backend.close()
    all_vms = [vm for vms in seen.values() for vm in vms]
    assert sorted(all_vms) == ["DC0_C0_RP0_VM0", "DC0_C0_RP0_VM1", "DC0_C0_RP0_VM2"]
    assert [vms["DC0_C0_RP0_VM0"] for vms in seen.values() if "DC0_C0_RP0_VM0" in vms] == [["GRID T4-2Q"]]


def test_a_vm_of_another_host_is_not_found_here(vcsim, host):
    other = open_backend(vcsim.uri(host="DC0_C0_H0"), secret_ref=vcsim.secret_ref)
    elsewhere = {d.uuid for d in other.list_domains()} - {d.uuid for d in host.list_domains()}
    other.close()
    for uuid in elsewhere:
        with pytest.raises(DomainNotFound, match="no VM"):
            host.domain(uuid)
    with pytest.raises(DomainNotFound):
        host.domain(str(uuidlib.uuid4()))


def test_vgpu_types_are_the_hosts_shared_passthrough_types_with_the_room_left_on_each_gpu(host):
    types = host.vgpu_types()
    assert {t.gpu_bus_id for t in types} == {GPU_A, GPU_B}
    room = {(t.gpu_bus_id, t.name): t.available for t in types}
    # GPU A runs a 4Q (16 GB T4: three more 4Q, no other size); GPU B two 8Q (full).
    assert room[(GPU_A, "GRID T4-4Q")] == 3
    assert room[(GPU_A, "GRID T4-8Q")] == 0
    assert room[(GPU_B, "GRID T4-8Q")] == 0
    assert room[(GPU_B, "GRID T4-1Q")] == 0
    assert sorted(t.type_id for t in types if t.gpu_bus_id == GPU_A) == sorted(
        ["grid_t4-1q", "grid_t4-2q", "grid_t4-4q", "grid_t4-8q", "grid_t4-16q"])
    assert all(matching.match_profile(t.name, T4_PROFILES) for t in types)


# Power ---------------------------------------------------------------------------------------


def test_a_guest_is_shut_down_and_started_again(host, vcenter_admin):
    uuid = by_name(host)["DC0_H0_VM0"].uuid
    host.shutdown(uuid, timeout_s=10)
    assert host.domain(uuid).state == PowerState.SHUT_OFF
    assert vm_named(vcenter_admin, "DC0_H0_VM0").runtime.powerState == "poweredOff"
    host.shutdown(uuid, timeout_s=10)  # already off: nothing to do
    host.start(uuid)
    assert host.domain(uuid).state == PowerState.RUNNING
    host.start(uuid)  # already running: nothing to do
    assert vm_named(vcenter_admin, "DC0_H0_VM0").runtime.powerState == "poweredOn"


def test_a_guest_that_ignores_the_shutdown_request_is_left_running(host):
    uuid = by_name(host)["DC0_H0_VM2"].uuid
    with pytest.raises(ShutdownTimeout, match="DC0_H0_VM2 on DC0_H0 did not power off within 0.5 s"):
        host.shutdown(uuid, timeout_s=0.5)
    assert host.domain(uuid).state == PowerState.RUNNING


def test_a_failed_task_is_said_with_its_fault(host, vcenter_admin):
    vm = vm_named(vcenter_admin, "DC0_H0_VM1")
    task = vm.PowerOnVM_Task()  # it runs already: vSphere fails the task
    with pytest.raises(HypervisorError, match="could not start DC0_H0_VM1: the task failed with InvalidPowerState"):
        host._wait(task, "start DC0_H0_VM1")


def test_a_task_that_never_finishes_is_given_up_on_and_the_vm_is_left_as_it_was(
        monkeypatch, vcsim_binary, vcenter_secret):
    monkeypatch.setattr(vsphere, "TASK_TIMEOUT_S", 0.5)
    with Vcsim(binary=vcsim_binary, hang=("ReconfigVM_Task", "PowerOnVM_Task")) as server:
        backend = open_backend(server.uri(), secret_ref=vcenter_secret)
        vm0 = by_name(backend)["DC0_H0_VM0"]
        with pytest.raises(HypervisorError, match=rf"vSphere \(127\.0\.0\.1:{server.port}\) did not reconfigure "
                           r"DC0_H0_VM0 within 0\.5 s \(task task-\d+ is still running\)\.$"):
            backend.redefine(vm0.uuid, DomainSpec(vcpus=vm0.vcpus * 2, ram_mib=vm0.ram_mib * 2, vgpus=vm0.vgpus))
        backend.shutdown(vm0.uuid, timeout_s=10)
        with pytest.raises(HypervisorError, match=r"did not start DC0_H0_VM0 within 0\.5 s \(task task-\d+ is "
                           r"still running\)"):
            backend.start(vm0.uuid)
        backend.close()
        with admin_session(server) as admin:
            real = vm_named(admin, "DC0_H0_VM0")
            seen = (real.runtime.powerState, real.config.hardware.numCPU, real.config.hardware.memoryMB,
                    vgpu_backings(real))
    assert seen == ("poweredOff", vm0.vcpus, vm0.ram_mib, ["grid_t4-4q"])


# The vGPU profile change ---------------------------------------------------------------------


def test_a_profile_change_reconfigures_the_vgpu_and_a_restore_puts_the_old_one_back(host, vcenter_admin):
    vm0 = by_name(host)["DC0_H0_VM0"]
    host.shutdown(vm0.uuid, timeout_s=10)
    saved = host.definition(vm0.uuid)
    # Off, VM0 leaves GPU A: the 8Q fits there now.
    assert {(t.gpu_bus_id, t.name): t.available for t in host.vgpu_types()}[(GPU_A, "GRID T4-8Q")] == 2
    new_id = str(uuidlib.uuid4())
    device = host.create_vgpu(GPU_A, "GRID T4-8Q", device_id=new_id)
    assert device == VgpuDevice(kind=DeviceKind.VMIOP, id=new_id, gpu_bus_id=GPU_A, type_name="GRID T4-8Q")
    host.redefine(vm0.uuid, DomainSpec(vcpus=4, ram_mib=8192, vgpus=(device,)))

    real = vm_named(vcenter_admin, "DC0_H0_VM0")
    assert vgpu_backings(real) == ["grid_t4-8q"]
    assert (real.config.hardware.numCPU, real.config.hardware.memoryMB) == (4, 8192)
    assert host.domain(vm0.uuid).vgpus == (device,)
    host.start(vm0.uuid)
    changed = host.domain(vm0.uuid)
    assert (changed.state, changed.vgpus) == (PowerState.RUNNING, (device,))

    host.shutdown(vm0.uuid, timeout_s=10)
    host.restore(vm0.uuid, saved)
    restored = host.domain(vm0.uuid)
    assert (restored.vcpus, restored.ram_mib, [d.id for d in restored.vgpus]) == (
        vm0.vcpus, vm0.ram_mib, [d.id for d in vm0.vgpus])
    assert vgpu_backings(vm_named(vcenter_admin, "DC0_H0_VM0")) == ["grid_t4-4q"]


def test_a_vgpu_is_only_taken_out_of_a_vm_that_is_off(host):
    vm1 = by_name(host)["DC0_H0_VM1"]
    [device] = vm1.vgpus
    with pytest.raises(DeviceBusy, match="in use by DC0_H0_VM1, which is running"):
        host.remove_vgpu(device)
    with pytest.raises(HypervisorError, match="changes its vGPU devices only while it is powered off"):
        host.redefine(vm1.uuid, DomainSpec(vcpus=vm1.vcpus, ram_mib=vm1.ram_mib, vgpus=()))
    host.shutdown(vm1.uuid, timeout_s=10)
    host.remove_vgpu(device)
    assert host.domain(vm1.uuid).vgpus == ()
    host.remove_vgpu(device)  # gone already: nothing to do


def test_a_type_the_gpu_cannot_take_is_refused_before_the_vm_is_touched(host):
    with pytest.raises(NoInstanceAvailable, match="cannot take another GRID T4-8Q vGPU now"):
        host.create_vgpu(GPU_B, "GRID T4-8Q")
    with pytest.raises(NoInstanceAvailable, match="offers no vGPU type named 'NVIDIA L40S-12Q'"):
        host.create_vgpu(GPU_A, "NVIDIA L40S-12Q")
    with pytest.raises(NoInstanceAvailable, match="no vGPU-capable GPU at 00000000:AF:00.0"):
        host.create_vgpu("0000:af:00.0", "GRID T4-4Q")


# Moving ----------------------------------------------------------------------------------------


def test_a_vm_that_is_off_moves_to_another_host_of_the_same_vcenter(vcsim, host, vcenter_admin):
    vm1 = by_name(host)["DC0_H0_VM1"]
    target = open_backend(vcsim.uri(host="DC0_C0_H0"), secret_ref=vcsim.secret_ref)
    with pytest.raises(HypervisorError, match="DC0_H0_VM1 is running on DC0_H0: shut it down before moving it"):
        host.move_to(vm1.uuid, target)
    host.shutdown(vm1.uuid, timeout_s=10)
    host.move_to(vm1.uuid, target)
    assert vm_named(vcenter_admin, "DC0_H0_VM1").runtime.host.name == "DC0_C0_H0"
    moved = target.domain(vm1.uuid)
    assert [d.id for d in moved.vgpus] == [d.id for d in vm1.vgpus]  # its vGPU device goes with it
    with pytest.raises(DomainNotFound):
        host.domain(vm1.uuid)
    target.close()


# Guest figures -------------------------------------------------------------------------------


def test_guest_figures_of_the_running_vms_come_from_quick_stats_and_real_time_counters(host, vcenter_admin):
    from pyVim.task import WaitForTask

    WaitForTask(vm_named(vcenter_admin, "DC0_H0_VM2").PowerOffVM_Task())  # a VM that is off has no figures
    domains = by_name(host)
    counters = {c.uuid: c for c in host.guest_counters()}
    assert sorted(counters) == sorted([domains["DC0_H0_VM0"].uuid, domains["DC0_H0_VM1"].uuid])

    # DC0_H0_VM0: 4 vCPUs at 2294 MHz, 2294 MHz used, one vCPU at 1835 MHz, 400 ms ready of 4 x 20 s;
    # VMware Tools run and say 2048 MB of its 8192 MB are active.
    vm0 = counters[domains["DC0_H0_VM0"].uuid]
    assert (vm0.vcpus, vm0.ram_mib) == (4, 8192)
    assert (vm0.vcpu_pct, vm0.vcpu_max_pct, vm0.steal_pct, vm0.ram_used_mib) == (25.0, 79.99, 0.5, 2048)
    got = guest_rates.reading(vm0, None)
    assert (got.vcpu_util, got.vcpu_max_util, got.cpu_steal_pct) == (25.0, 79.99, 0.5)
    assert (got.ram_used_mib, got.ram_used_pct) == (2048, 25.0)

    # DC0_H0_VM1 runs no VMware Tools: its CPU is measured, its memory use is unknown, not 0.
    vm1 = guest_rates.reading(counters[domains["DC0_H0_VM1"].uuid], None)
    assert (vm1.vcpu_util, vm1.vcpu_max_util, vm1.cpu_steal_pct) == (50.0, 50.0, 1.0)
    assert (vm1.ram_used_mib, vm1.ram_used_pct) == (None, None)


def test_guest_figures_of_all_vms_are_one_property_read_and_one_performance_query(host, monkeypatch):
    host.guest_counters()  # the host's clock and the counters' keys are read once per link
    calls = []
    stub = host._si._stub
    invoke, access = stub.InvokeMethod, stub.InvokeAccessor

    def method(mo, info, args):
        calls.append(info.wsdlName)
        return invoke(mo, info, args)

    def accessor(mo, info):
        calls.append(f"read {info.name}")
        return access(mo, info)

    monkeypatch.setattr(stub, "InvokeMethod", method)
    monkeypatch.setattr(stub, "InvokeAccessor", accessor)
    assert len(host.guest_counters()) == 3
    # The VMs' properties through a container view of the datacenter's VM folder, then their samples.
    assert calls == ["read vmFolder", "Fetch", "CreateContainerView", "RetrieveProperties", "DestroyView", "QueryPerf"]


def test_without_real_time_samples_the_quick_stats_are_still_given(host, monkeypatch):
    stub = host._si._stub
    invoke = stub.InvokeMethod

    def refuse_samples(mo, info, args):
        if info.wsdlName == "QueryPerf":
            raise vim.fault.NoPermission(privilegeId="System.Read")
        return invoke(mo, info, args)

    monkeypatch.setattr(stub, "InvokeMethod", refuse_samples)
    vm0 = next(c for c in host.guest_counters() if c.uuid == by_name(host)["DC0_H0_VM0"].uuid)
    assert (vm0.vcpu_pct, vm0.ram_used_mib, vm0.vcpu_max_pct, vm0.steal_pct) == (25.0, 2048, None, None)

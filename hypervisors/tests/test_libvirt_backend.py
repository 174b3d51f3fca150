"""The libvirt backend against a real libvirtd serving libvirt's test driver (hypervisors.testing).

What the test driver cannot do is said where it matters: it creates no mdevs through the
node-device API (so creation goes to a DeviceManager, here a small in-memory one that keeps
NVIDIA's equal-size rule), and it shuts a guest down at once, unless the domain restarts on
power-off (`<on_poweroff>restart</on_poweroff>`), which is how a guest that ignores the request
looks from the host.
"""

from __future__ import annotations

import time
import uuid as uuidlib
from dataclasses import replace
from xml.etree import ElementTree as ET

import pytest

from faults.services import require_module
from hypervisors.tests.conftest import GPU_HOST_XML

libvirt = require_module("libvirt", purpose="the libvirt backend tests need libvirt-python "
                         "(pip install -r requirements-libvirt.txt)")

# After the check that libvirt-python is there:
from hypervisors.backends import base, open_backend  # noqa: E402
from hypervisors.backends.base import DeviceKind, DomainSpec, PowerState, VgpuDevice, VgpuType  # noqa: E402
from hypervisors.backends.libvirt import (  # noqa: E402
    LibvirtBackend,
    bulk_steal_ns,
    bulk_vcpu_times,
    connection_uri,
    guest_memory,
)
from telemetry.guest_rates import reading  # noqa: E402

T4 = "00000000:3B:00.0"
L40S = "00000000:86:00.0"
T4_VGPU = "aaaaaaaa-bbbb-4ccc-8ddd-eeeeeeeeeeee"
L40S_VGPU = "c0ffee00-1111-4222-8333-444455556666"
RENDER_01 = "5a0c4f1e-8d2b-4c3a-9e61-1f2a3b4c5d6e"


def workstation_xml(name: str, uuid: str, *, vgpus: str = "", on_poweroff: str = "destroy",
                    balloon: bool = True) -> str:
    """An artist's workstation as an admin would define it: disk, network, a console with a
    password, metadata of another tool, a USB dongle and the given vGPU host devices; without
    `balloon`, no memory balloon device (the guest then reports nothing of its memory)."""
    return f"""<domain type='test'>
  <name>{name}</name>
  <uuid>{uuid}</uuid>
  <metadata><pipe:seat xmlns:pipe='http://studio.example/pipeline/1'>lighting-07</pipe:seat></metadata>
  <memory unit='GiB'>16</memory>
  <currentMemory unit='GiB'>16</currentMemory>
  <vcpu placement='static'>8</vcpu>
  <os><type arch='x86_64'>hvm</type></os>
  <cpu><topology sockets='1' dies='1' cores='4' threads='2'/></cpu>
  <on_poweroff>{on_poweroff}</on_poweroff>
  <devices>
    <disk type='file' device='disk'>
      <source file='/var/lib/libvirt/images/{name}.qcow2'/><target dev='vda' bus='virtio'/>
    </disk>
    <interface type='network'><source network='default'/><mac address='52:54:00:12:34:56'/></interface>
    <graphics type='vnc' port='-1' autoport='yes' passwd='console-pass'/>
    <hostdev mode='subsystem' type='usb' managed='yes'>
      <source><vendor id='0x0529'/><product id='0x0001'/></source>
    </hostdev>
    {vgpus}
    {"" if balloon else "<memballoon model='none'/>"}
  </devices>
</domain>"""


def mdev_xml(uuid: str, guest_slot: str = "") -> str:
    address = (f"<address type='pci' domain='0x0000' bus='0x00' slot='{guest_slot}' function='0x0'/>"
               if guest_slot else "")
    return (f"<hostdev mode='subsystem' type='mdev' model='vfio-pci' display='off'>"
            f"<source><address uuid='{uuid}'/></source>{address}</hostdev>")


def new_uuid() -> str:
    return str(uuidlib.uuid4())


def define(uri: str, xml: str) -> None:
    """Define a domain through a connection of its own, as an admin's virsh would."""
    conn = libvirt.open(uri)
    try:
        conn.defineXML(xml)
    finally:
        conn.close()


def inactive_xml(uri: str, uuid: str) -> ET.Element:
    """The stored definition, read through a fresh connection (not the backend's)."""
    conn = libvirt.open(uri)
    try:
        return ET.fromstring(conn.lookupByUUIDString(uuid).XMLDesc(libvirt.VIR_DOMAIN_XML_INACTIVE
                                                                    | libvirt.VIR_DOMAIN_XML_SECURE))
    finally:
        conn.close()


@pytest.fixture
def backend(libvirtd):
    opened = LibvirtBackend.open(libvirtd.uri())
    yield opened
    opened.close()


@pytest.fixture
def gpu_host(libvirtd):
    """The vGPU host of data/gpu-host.xml through the daemon (its state lasts one connection)."""
    opened = LibvirtBackend.open(libvirtd.uri(GPU_HOST_XML))
    yield opened
    opened.close()


class InMemoryDevices:
    """A DeviceManager over a host held in memory, with NVIDIA's equal-size rule: once a GPU holds
    a vGPU, only that type is creatable on it, up to the type's maximum. (What the host agent's
    device action does on the host's sysfs.)"""

    def __init__(self, gpus: dict[str, dict[str, int]]):
        self.gpus = gpus  # GPU bus id -> {type name: max instances}
        self.devices: list[VgpuDevice] = []

    def _held(self, bus_id: str) -> list[VgpuDevice]:
        return [d for d in self.devices if d.gpu_bus_id == bus_id]

    def vgpu_types(self) -> list[VgpuType]:
        types = []
        for bus_id, offered in self.gpus.items():
            held = self._held(bus_id)
            for index, (name, maximum) in enumerate(offered.items()):
                available = 0 if held and held[0].type_name != name else maximum - len(held)
                types.append(VgpuType(gpu_bus_id=bus_id, type_id=f"{1400 + index}", name=name, available=available))
        return types

    def vgpu_devices(self) -> list[VgpuDevice]:
        return list(self.devices)

    def create_vgpu(self, gpu_bus_id: str, type_name: str, *, device_id: str = "") -> VgpuDevice:
        free = {t.name: t.available for t in self.vgpu_types() if t.gpu_bus_id == gpu_bus_id}
        if free.get(type_name, 0) < 1:
            raise base.NoInstanceAvailable(f"{gpu_bus_id} cannot take another {type_name}")
        device = VgpuDevice(kind=DeviceKind.VF, id=f"00000000:86:01.{len(self.devices)}", gpu_bus_id=gpu_bus_id,
                            type_name=type_name)
        self.devices.append(device)
        return device

    def remove_vgpu(self, device: VgpuDevice) -> None:
        self.devices = [d for d in self.devices if d.id != device.id]


# Reading domains ---------------------------------------------------------------------------


def test_lists_the_hosts_domains_with_their_size_state_and_vgpu(libvirtd, backend):
    uuid = new_uuid()
    define(libvirtd.uri(), workstation_xml("anim-03", uuid, vgpus=mdev_xml(T4_VGPU.upper())))

    domains = {d.name: d for d in backend.list_domains()}

    assert list(domains) == sorted(domains)
    assert domains["test"].state == PowerState.RUNNING  # the test driver's own domain
    anim = domains["anim-03"]
    assert (anim.uuid, anim.vcpus, anim.ram_mib, anim.state) == (uuid, 8, 16 * 1024, PowerState.SHUT_OFF)
    # The default test host has no node devices: the GPU is not known, the UUID is.
    assert anim.vgpus == (VgpuDevice(kind=DeviceKind.MDEV, id=T4_VGPU, gpu_bus_id=""),)
    assert backend.domain(uuid) == anim


def test_a_domains_vgpu_names_its_gpu_and_type_and_a_passthrough_nic_is_not_a_vgpu(gpu_host):
    render = gpu_host.domain(RENDER_01)

    assert render.name == "render-01"
    assert render.vgpus == (VgpuDevice(kind=DeviceKind.MDEV, id=T4_VGPU, gpu_bus_id=T4, type_name="GRID T4-1B"),)


def test_an_unknown_domain_is_domain_not_found(backend):
    missing = new_uuid()
    with pytest.raises(base.DomainNotFound, match=missing):
        backend.domain(missing)
    with pytest.raises(base.DomainNotFound):
        backend.start(missing)


# Changing a domain -------------------------------------------------------------------------


def test_redefine_sets_size_and_vgpus_and_keeps_everything_else(libvirtd, backend):
    uuid, kept, dropped, added = new_uuid(), new_uuid(), new_uuid(), new_uuid()
    define(libvirtd.uri(), workstation_xml("light-01", uuid, vgpus=mdev_xml(kept, "0x07") + mdev_xml(dropped)))
    before = inactive_xml(libvirtd.uri(), uuid)

    backend.redefine(uuid, DomainSpec(vcpus=12, ram_mib=24 * 1024, vgpus=(
        VgpuDevice(kind=DeviceKind.MDEV, id=kept, gpu_bus_id=T4),
        VgpuDevice(kind=DeviceKind.MDEV, id=added, gpu_bus_id=T4),
        VgpuDevice(kind=DeviceKind.VF, id="0000:86:00.5", gpu_bus_id=L40S),
    )))

    after = inactive_xml(libvirtd.uri(), uuid)
    assert after.findtext("vcpu") == "12"
    assert after.find("cpu/topology").attrib == {"sockets": "1", "dies": "1", "cores": "6", "threads": "2"}
    assert (after.find("memory").text, after.find("currentMemory").text) == (str(24 * 1024 * 1024),) * 2
    mdevs = {h.find("source/address").get("uuid"): h for h in after.findall("devices/hostdev[@type='mdev']")}
    assert set(mdevs) == {kept, added}
    assert mdevs[kept].find("address").get("slot") == "0x07"  # the kept vGPU stays where the guest saw it
    assert mdevs[kept].get("display") == "off"
    vf = after.find("devices/hostdev[@type='pci']/source/address").attrib
    assert vf == {"domain": "0x0000", "bus": "0x86", "slot": "0x00", "function": "0x5"}
    for path in ("devices/disk", "devices/interface", "devices/graphics", "devices/hostdev[@type='usb']",
                 "metadata", "os", "on_poweroff"):
        assert ET.tostring(after.find(path)) == ET.tostring(before.find(path)), path
    assert after.find("devices/graphics").get("passwd") == "console-pass"
    assert backend.domain(uuid).vcpus == 12


def test_redefine_of_a_running_domain_takes_effect_at_the_next_start(libvirtd, backend):
    uuid = new_uuid()
    define(libvirtd.uri(), workstation_xml("comp-02", uuid))
    backend.start(uuid)

    backend.redefine(uuid, DomainSpec(vcpus=4, ram_mib=8192, vgpus=()))

    assert backend.domain(uuid).vcpus == 8  # still running with what it booted with
    backend.shutdown(uuid, timeout_s=5)
    backend.start(uuid)
    assert (backend.domain(uuid).vcpus, backend.domain(uuid).ram_mib) == (4, 8192)


def test_restore_puts_back_a_saved_definition(libvirtd, backend):
    uuid = new_uuid()
    define(libvirtd.uri(), workstation_xml("model-05", uuid, vgpus=mdev_xml(new_uuid())))
    saved = backend.definition(uuid)

    backend.redefine(uuid, DomainSpec(vcpus=2, ram_mib=2048, vgpus=()))
    assert backend.domain(uuid).vgpus == ()
    backend.restore(uuid, saved)

    assert backend.definition(uuid) == saved
    assert (backend.domain(uuid).vcpus, len(backend.domain(uuid).vgpus)) == (8, 1)
    with pytest.raises(base.HypervisorError, match="belongs to domain"):
        backend.restore(new_uuid(), saved)


# Power -------------------------------------------------------------------------------------


def test_shutdown_and_start(libvirtd, backend):
    uuid = new_uuid()
    define(libvirtd.uri(), workstation_xml("tex-04", uuid))

    backend.start(uuid)
    backend.start(uuid)  # already running: left as it is
    assert backend.domain(uuid).state == PowerState.RUNNING
    backend.shutdown(uuid, timeout_s=5)
    assert backend.domain(uuid).state == PowerState.SHUT_OFF
    backend.shutdown(uuid, timeout_s=5)  # already off: left as it is


def test_a_guest_that_does_not_power_off_times_out_and_is_left_running(libvirtd, backend):
    """The guest restarts instead of powering off: from the host, a guest that ignores the request."""
    uuid = new_uuid()
    define(libvirtd.uri(), workstation_xml("stuck-01", uuid, on_poweroff="restart"))
    backend.start(uuid)

    started = time.monotonic()
    with pytest.raises(base.ShutdownTimeout, match=r"stuck-01 .* did not power off within 0\.6 s.*left running"):
        backend.shutdown(uuid, timeout_s=0.6)

    assert 0.6 <= time.monotonic() - started < 5
    assert backend.domain(uuid).state == PowerState.RUNNING


# Moving ------------------------------------------------------------------------------------


def test_cold_move_defines_the_domain_on_the_target_and_removes_it_here(libvirtd, other_libvirtd, backend):
    uuid = new_uuid()
    define(libvirtd.uri(), workstation_xml("light-09", uuid, vgpus=mdev_xml(T4_VGPU)))
    before = backend.definition(uuid)
    target = open_backend(other_libvirtd.uri())

    backend.move_to(uuid, target)

    assert target.definition(uuid) == before
    assert target.domain(uuid).vgpus[0].id == T4_VGPU
    with pytest.raises(base.DomainNotFound):
        backend.domain(uuid)
    target.close()


def test_a_running_domain_is_not_moved(libvirtd, other_libvirtd, backend):
    uuid = new_uuid()
    define(libvirtd.uri(), workstation_xml("light-10", uuid))
    backend.start(uuid)
    target = LibvirtBackend.open(other_libvirtd.uri())

    with pytest.raises(base.HypervisorError, match="light-10 is running .* shut it down before moving"):
        backend.move_to(uuid, target)

    assert backend.domain(uuid).state == PowerState.RUNNING
    with pytest.raises(base.DomainNotFound):
        target.domain(uuid)


# The link ----------------------------------------------------------------------------------


def test_check_reports_version_type_and_host(backend):
    check = backend.check()

    version = libvirt.getVersion()
    shown = f"{version // 1_000_000}.{version // 1000 % 1000}.{version % 1000}"
    assert check.ok
    assert check.message == f"Connected to libvirt {shown} (TEST) on {check.hostname}"
    assert check.hypervisor_version == shown
    assert check.hostname
    assert check.details["hypervisor_type"] == "TEST"


def test_a_dead_socket_is_unreachable(libvirtd, tmp_path):
    uri = f"test+unix:///default?socket={tmp_path}/nothing-here"

    with pytest.raises(base.Unreachable, match="Could not connect to test\\+unix:///default: .*nothing-here"):
        open_backend(uri)


def test_a_daemon_that_stops_makes_the_link_unreachable_until_it_is_back(libvirtd, backend):
    libvirtd.stop()

    check = backend.check()
    assert not check.ok
    assert check.message.startswith("Lost the connection to test+unix:///default")
    with pytest.raises(base.Unreachable):
        backend.list_domains()
    with pytest.raises(base.Unreachable, match="statistics"):
        backend.guest_counters()

    libvirtd.start()
    assert LibvirtBackend.open(libvirtd.uri()).check().ok


# Guest CPU and memory ----------------------------------------------------------------------


def test_guest_counters_give_each_running_domains_cpu_and_memory_and_skip_shut_off_ones(libvirtd, backend):
    no_balloon, shut_off = new_uuid(), new_uuid()
    define(libvirtd.uri(), workstation_xml("comp-02", no_balloon, balloon=False))
    define(libvirtd.uri(), workstation_xml("anim-09", shut_off))
    backend.start(no_balloon)
    conn = libvirt.open(libvirtd.uri())
    test_domain = conn.lookupByName("test")
    stats = test_domain.memoryStats()  # the test driver's fixed figures, in KiB
    conn.close()

    before = {c.uuid: c for c in backend.guest_counters()}
    time.sleep(1.1)
    after = {c.uuid: c for c in backend.guest_counters()}

    test_uuid = test_domain.UUIDString().lower()
    assert set(after) == {test_uuid, no_balloon}  # anim-09 is off: nothing to read
    test = reading(after[test_uuid], before[test_uuid])
    assert test.vcpus == 2
    assert test.vcpu_util is not None
    assert test.vcpu_max_util is not None
    assert 0 <= test.vcpu_util <= test.vcpu_max_util <= 100
    assert test.cpu_steal_pct is None  # the test driver counts no wait
    assert test.ram_mib == stats["actual"] // 1024
    assert test.ram_used_mib == (stats["available"] - stats["usable"]) // 1024
    assert after[test_uuid].ram_available_mib == stats["available"] // 1024
    assert test.ram_used_pct == round(100 * test.ram_used_mib / test.ram_mib, 2)

    comp = reading(after[no_balloon], before[no_balloon])
    assert (comp.vcpus, comp.ram_mib, len(after[no_balloon].vcpu_ns)) == (8, 16 * 1024, 8)
    assert comp.vcpu_util is not None
    assert (comp.ram_used_mib, comp.ram_used_pct) == (None, None)  # no balloon driver: not reported, not 0


def test_a_qemu_hosts_bulk_statistics_are_read_in_one_round_trip(backend):
    """What a QEMU host answers for a guest with the balloon driver and schedstats on: every figure
    comes from the record, none from a per-domain call."""
    record = {"state.state": 1, "vcpu.current": 4, "vcpu.maximum": 4,
              "balloon.current": 33554432, "balloon.maximum": 33554432, "balloon.available": 32880000,
              "balloon.usable": 26588544, "balloon.unused": 20000000, "balloon.rss": 33600000}
    for index, (run_s, delay_ms) in enumerate([(900, 40), (120, 12), (110, 9), (95, 8)]):
        record[f"vcpu.{index}.state"] = 1
        record[f"vcpu.{index}.time"] = run_s * 10**9
        record[f"vcpu.{index}.wait"] = delay_ms * 10**6
        record[f"vcpu.{index}.delay"] = delay_ms * 10**6
    dom = backend._conn.lookupByName("test")

    got = LibvirtBackend._guest_counters(dom, record, read_at_ns=123)

    assert got.vcpu_ns == (900 * 10**9, 120 * 10**9, 110 * 10**9, 95 * 10**9)
    assert got.steal_ns == 69 * 10**6  # wait and delay are one wait read twice: counted once
    assert (got.vcpus, got.ram_mib, got.ram_used_mib, got.ram_available_mib) == (4, 32768, 6144, 32109)


def test_guest_memory_is_unknown_without_the_balloon_driver_and_falls_back_to_free_pages():
    assert guest_memory({"actual": 16777216, "rss": 16900000}) == (None, None)  # only the host's figures
    assert guest_memory({}) == (None, None)
    assert guest_memory({"actual": 16777216, "available": 16000000, "unused": 4000000}) == (11718, 15625)
    assert guest_memory({"available": 16000000}) == (None, 15625)


def test_bulk_records_without_vcpu_figures_say_so():
    assert bulk_vcpu_times({"state.state": 1}) is None
    assert bulk_steal_ns({"vcpu.0.time": 5, "vcpu.current": 1}) is None
    assert bulk_steal_ns({"vcpu.0.wait": 7, "vcpu.1.delay": 3, "vcpu.1.wait": 9}) == 10


# Credentials -------------------------------------------------------------------------------


def test_a_missing_secret_names_its_reference(libvirtd, settings, tmp_path):
    settings.HYPERVISOR_SECRETS_DIR = tmp_path

    with pytest.raises(base.Unreachable, match="credentials 'node-01-ssh-key' .* are missing"):
        open_backend(libvirtd.uri(), secret_ref="node-01-ssh-key")


def test_a_password_file_answers_the_authentication(settings, tmp_path):
    """The test driver asks for a user name and password when its host file has <auth> (in
    process only: through a daemon, driver-level prompts never reach the client)."""
    host = tmp_path / "host.xml"
    host.write_text("<node><auth><user password='Zebra-42'>admin</user></auth></node>")
    settings.HYPERVISOR_SECRETS_DIR = tmp_path / "secrets"
    settings.HYPERVISOR_SECRETS_DIR.mkdir()
    (settings.HYPERVISOR_SECRETS_DIR / "node-01-password").write_text("Zebra-42\n")
    (settings.HYPERVISOR_SECRETS_DIR / "stale-password").write_text("Zebra-41\n")

    assert open_backend(f"test://admin@{host}", secret_ref="node-01-password").check().ok
    with pytest.raises(base.Unreachable, match="authentication failed") as refused:
        open_backend(f"test://admin@{host}", secret_ref="stale-password")
    assert "Zebra" not in str(refused.value)
    with pytest.raises(base.Unreachable, match="authentication failed"):  # no secret: never a prompt
        open_backend(f"test://admin@{host}")


def test_ssh_and_tls_secrets_become_libvirt_uri_options(tmp_path):
    key = tmp_path / "node-01-ssh-key"

    assert connection_uri("qemu+ssh://root@node-01/system", key) == (
        f"qemu+ssh://root@node-01/system?keyfile={key}&no_tty=1")
    assert connection_uri("qemu+ssh://root@node-01/system?keyfile=/etc/keys/k", key) == (
        "qemu+ssh://root@node-01/system?keyfile=/etc/keys/k&no_tty=1")
    assert connection_uri("qemu+tls://node-01/system", tmp_path) == f"qemu+tls://node-01/system?pkipath={tmp_path}"
    assert connection_uri("qemu:///system", None) == "qemu:///system"


# vGPU devices ------------------------------------------------------------------------------


def test_vgpu_types_per_physical_gpu_from_node_devices(gpu_host):
    assert gpu_host.vgpu_types() == [
        VgpuType(gpu_bus_id=T4, type_id="nvidia-222", name="GRID T4-1B", available=15),
        VgpuType(gpu_bus_id=T4, type_id="nvidia-230", name="GRID T4-8Q", available=0),
        # Ada in the mdev layout: the types hang on the VFs; one of the two is taken.
        VgpuType(gpu_bus_id=L40S, type_id="nvidia-1156", name="NVIDIA L40S-12Q", available=1),
    ]  # and the Intel iGPU's GVT-g type is not a vGPU


def test_vgpu_devices_from_node_devices(gpu_host):
    assert gpu_host.vgpu_devices() == [
        VgpuDevice(kind=DeviceKind.MDEV, id=T4_VGPU, gpu_bus_id=T4, type_name="GRID T4-1B"),
        VgpuDevice(kind=DeviceKind.MDEV, id=L40S_VGPU, gpu_bus_id=L40S, type_name="NVIDIA L40S-12Q"),
    ]


def test_without_a_device_manager_the_test_driver_says_to_configure_the_device_action(gpu_host):
    with pytest.raises(base.HypervisorError, match="cannot create or remove vGPU devices .* agent's device action"):
        gpu_host.create_vgpu(T4, "GRID T4-1B")
    with pytest.raises(base.HypervisorError, match="host agent's device action"):
        gpu_host.remove_vgpu(VgpuDevice(kind=DeviceKind.MDEV, id=L40S_VGPU, gpu_bus_id=L40S))
    with pytest.raises(base.DeviceBusy, match="in use by render-01"):  # whoever would remove it
        gpu_host.remove_vgpu(VgpuDevice(kind=DeviceKind.MDEV, id=T4_VGPU, gpu_bus_id=T4))


def test_a_device_manager_creates_and_removes_vgpus_and_its_view_wins(libvirtd):
    devices = InMemoryDevices({L40S: {"NVIDIA L40S-12Q": 4, "NVIDIA L40S-24Q": 2}})
    backend = open_backend(libvirtd.uri(GPU_HOST_XML), devices=devices)
    uuid = new_uuid()

    assert {t.name: t.available for t in backend.vgpu_types()} == {"NVIDIA L40S-12Q": 4, "NVIDIA L40S-24Q": 2}
    vgpu = backend.create_vgpu("86:00.0", "NVIDIA L40S-12Q")
    assert vgpu == VgpuDevice(kind=DeviceKind.VF, id="00000000:86:01.0", gpu_bus_id=L40S, type_name="NVIDIA L40S-12Q")
    assert {t.name: t.available for t in backend.vgpu_types()} == {"NVIDIA L40S-12Q": 3, "NVIDIA L40S-24Q": 0}
    with pytest.raises(base.NoInstanceAvailable):
        backend.create_vgpu(L40S, "NVIDIA L40S-24Q")

    # A workstation given that VF reads back with the GPU and type the manager knows.
    conn = backend._conn  # the node file's state lasts one connection: define through the backend's
    conn.defineXML(workstation_xml("light-11", uuid))
    backend.redefine(uuid, DomainSpec(vcpus=8, ram_mib=16384, vgpus=(replace(vgpu, type_name=""),)))
    assert backend.domain(uuid).vgpus == (vgpu,)

    backend.start(uuid)
    with pytest.raises(base.DeviceBusy, match="in use by light-11"):
        backend.remove_vgpu(vgpu)
    backend.shutdown(uuid, timeout_s=5)
    backend.remove_vgpu(vgpu)
    backend.remove_vgpu(vgpu)  # already gone: not an error
    assert backend.vgpu_devices() == []

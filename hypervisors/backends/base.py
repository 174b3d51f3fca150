"""What the product asks of a hypervisor, whichever one it is.

One interface (`Backend`) and the plain values it speaks in, so discovery, operations and the
drift report never see libvirt's XML or a simulator's file. Implementations: `libvirt.py`
(libvirt/KVM, any URI libvirt accepts), `vsphere.py` (VMware vSphere through vCenter, on
pyvmomi) and `sim.py` (the demo's hypervisor, no libvirt needed). Every method raises a
`HypervisorError` subclass, whose message says what happened in words an admin can act on;
nothing else escapes a backend.

Units: RAM in MiB (libvirt's KiB and the inventory's GiB are converted at the edges); PCI
addresses in the form of `fleet.pci.normalize_pci_bus_id` (`00000000:3B:00.0`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol

# Defined with the rate computation that reads it; every backend imports it from here.
from telemetry.guest_rates import GuestCounters


class PowerState:
    """A domain's power state, as the inventory and the pages name it."""

    RUNNING = "running"
    SHUT_OFF = "shut_off"
    PAUSED = "paused"
    OTHER = "other"  # crashed, suspended, being shut down: not a state an operation starts from


class DeviceKind:
    MDEV = "mdev"  # a mediated device (vGPU up to 16, and older GPUs): its id is the mdev UUID
    VF = "vf"  # an SR-IOV virtual function (vGPU 17+ on Ada, Hopper and newer): its id is the VF's PCI address
    # A vSphere VM's shared passthrough vGPU (a VirtualPCIPassthrough with VmiopBackingInfo): it lives in
    # the VM's configuration and ESXi makes it at power on; its id is a UUID the backend keeps with the VM.
    VMIOP = "vmiop"


@dataclass(frozen=True)
class VgpuDevice:
    """One vGPU instance on the host: a mediated device or an SR-IOV VF."""

    kind: str  # DeviceKind
    id: str  # mdev UUID (lower case) or VF PCI address (fleet.pci form)
    gpu_bus_id: str  # the physical GPU it lives on (fleet.pci form); "" when the host does not say
    type_name: str = ""  # the host's name of its type, e.g. "NVIDIA L40S-12Q" or "GRID T4-8Q"; "" when unknown


@dataclass(frozen=True)
class Domain:
    """A VM as the hypervisor knows it."""

    uuid: str  # lower case, with dashes
    name: str
    vcpus: int
    ram_mib: int
    state: str  # PowerState
    vgpus: tuple[VgpuDevice, ...] = ()


@dataclass(frozen=True)
class DomainSpec:
    """What `redefine` gives a domain's inactive definition: its vCPUs, RAM and vGPU devices
    (the devices must exist already: `create_vgpu` makes them)."""

    vcpus: int
    ram_mib: int
    vgpus: tuple[VgpuDevice, ...]


@dataclass(frozen=True)
class VgpuType:
    """A vGPU type one physical GPU offers now, with how many more instances it can take."""

    gpu_bus_id: str
    type_id: str  # the host's id: "nvidia-222" (mdev layout) or "1414" (SR-IOV layout); never hard-coded
    name: str  # as the host names it; matched to catalog profiles by name (`hypervisors.matching`)
    available: int


@dataclass(frozen=True)
class ConnectionCheck:
    """The answer of `Backend.check`: reachable or not, and what the admin sees about it."""

    ok: bool
    message: str  # "Connected to libvirt 9.0.0 (QEMU) on node-01" or why not
    hypervisor_version: str = ""
    hostname: str = ""
    details: dict = field(default_factory=dict)


# Errors --------------------------------------------------------------------------------------


class HypervisorError(Exception):
    """Something the hypervisor refused or could not do; the message is shown to the admin."""


class MissingDependency(HypervisorError):
    """The backend the URI asks for needs a package that is not installed (e.g. libvirt-python)."""


class Unreachable(HypervisorError):
    """The hypervisor could not be reached or refused the credentials."""


class DomainNotFound(HypervisorError):
    """No domain with that UUID on this hypervisor."""


class ShutdownTimeout(HypervisorError):
    """The guest did not power off within the timeout (it is left running, untouched)."""


class NoInstanceAvailable(HypervisorError):
    """The GPU cannot take another vGPU of that type now (available_instances is 0, or the
    type is not creatable on it)."""


class DeviceBusy(HypervisorError):
    """The vGPU device is still in use by a running domain and cannot be removed."""


# The interface -------------------------------------------------------------------------------


class Backend(Protocol):
    """One open link to one host's hypervisor. Methods are synchronous and may block on the
    network; callers run them in Celery tasks or management commands, never in a page's GET."""

    def check(self) -> ConnectionCheck:
        """Reachability, version and host name; never raises."""

    def list_domains(self) -> list[Domain]:
        """Every domain defined on the host, running or not, ordered by name."""

    def domain(self, uuid: str) -> Domain:
        """One domain, or DomainNotFound."""

    def shutdown(self, uuid: str, timeout_s: float) -> None:
        """Ask the guest to power off and wait until it has; ShutdownTimeout when it has not
        within `timeout_s`. A domain already off is left as it is."""

    def start(self, uuid: str) -> None:
        """Power the domain on; a running domain is left as it is."""

    def redefine(self, uuid: str, spec: DomainSpec) -> None:
        """Replace the inactive definition's vCPUs, RAM and vGPU host devices; everything else
        in the definition is kept. Takes effect at the next start."""

    def vgpu_types(self) -> list[VgpuType]:
        """Every vGPU type each physical GPU of the host offers, with available instances."""

    def vgpu_devices(self) -> list[VgpuDevice]:
        """Every vGPU instance that exists on the host, whether a domain uses it or not."""

    def create_vgpu(self, gpu_bus_id: str, type_name: str, *, device_id: str = "") -> VgpuDevice:
        """Create one vGPU of the type named `type_name` on that GPU; NoInstanceAvailable when
        the GPU cannot take it. `device_id`, when given, is the id to create it with: an mdev
        UUID (so a retried step finds the device it made, and a rollback recreates the one a
        definition names), or the VF to use; a layout that cannot honour it picks its own."""

    def remove_vgpu(self, device: VgpuDevice) -> None:
        """Remove a vGPU instance; a device already gone is not an error. DeviceBusy when a
        running domain holds it."""

    def move_to(self, uuid: str, target: Backend) -> None:
        """Cold move: define the (shut off) domain on `target` with the same definition, then
        undefine it here."""

    def definition(self, uuid: str) -> str:
        """The domain's inactive definition as the hypervisor stores it (kept by an operation
        to roll back to)."""

    def restore(self, uuid: str, saved: str) -> None:
        """Put back a definition that `definition` returned (rollback)."""

    def guest_counters(self) -> list[GuestCounters]:
        """CPU and memory counters of every running domain of the host (`GuestCounters`)."""

    def close(self) -> None:
        """Release the link."""


class DeviceManager(Protocol):
    """Who creates and removes vGPU instances on a host, for a backend that cannot itself:
    libvirt's node-device API where the host's libvirt supports it, otherwise the host agent's
    token-scoped device action (`hypervisors.agent_devices`), which writes the host's sysfs in
    either NVIDIA layout (mdev, or SR-IOV on vGPU 17+)."""

    def vgpu_types(self) -> list[VgpuType]: ...

    def vgpu_devices(self) -> list[VgpuDevice]: ...

    def create_vgpu(self, gpu_bus_id: str, type_name: str, *, device_id: str = "") -> VgpuDevice: ...

    def remove_vgpu(self, device: VgpuDevice) -> None: ...

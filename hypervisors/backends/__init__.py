"""Open the backend a host's `hypervisor_uri` names: `sim://` the demo's simulator, `vsphere://`
VMware vSphere (pyvmomi), `proxmox://` Proxmox VE (proxmoxer), any other URI libvirt (an
optional dependency: without libvirt-python, MissingDependency says what to install)."""

from __future__ import annotations

from fleet.hypervisor_link import is_proxmox, is_simulated, is_vsphere
from hypervisors.backends.base import Backend, DeviceManager, MissingDependency

__all__ = ["open_backend"]


def open_backend(uri: str, *, secret_ref: str = "", devices: DeviceManager | None = None) -> Backend:
    """A link to the hypervisor at `uri`; `secret_ref` names its credentials in
    HYPERVISOR_SECRETS_DIR; `devices` creates vGPUs where the hypervisor cannot."""
    if is_simulated(uri):
        from hypervisors.backends.sim import SimBackend

        return SimBackend.open(uri)
    if is_vsphere(uri):
        from hypervisors.backends.vsphere import VsphereBackend

        return VsphereBackend.open(uri, secret_ref=secret_ref, devices=devices)
    if is_proxmox(uri):
        from hypervisors.backends.proxmox import ProxmoxBackend

        return ProxmoxBackend.open(uri, secret_ref=secret_ref, devices=devices)
    try:
        from hypervisors.backends.libvirt import LibvirtBackend
    except ImportError as exc:  # libvirt-python absent: the module imports it at the top
        raise MissingDependency(
            f"{uri} is a libvirt URI, but libvirt-python is not installed: install libvirt's development "
            "files (apt-get install libvirt-dev pkg-config) and then `pip install -r requirements-libvirt.txt`."
        ) from exc
    return LibvirtBackend.open(uri, secret_ref=secret_ref, devices=devices)

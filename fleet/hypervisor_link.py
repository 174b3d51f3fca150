"""How a host names its hypervisor link: the URI and the reference to its credentials.

Checked here, below the hypervisors app, so the admin site, the API and the forms refuse a
malformed link when it is typed, not when an operation first uses it. Pure: no Django.

- `hypervisor_uri`: a libvirt URI (`qemu+ssh://root@node-01/system`, `qemu+tls://node-01/system`,
  `qemu:///system` for a worker on the host itself, `test+unix:///default?socket=...` for
  libvirt's test driver), `vsphere://USER@VCENTER/?datacenter=DC&host=ESXI` for an ESXi host
  through its vCenter (`insecure=1` for a lab without certificate checking),
  `proxmox://USER@REALM@NODE:8006/` for a Proxmox VE node (`?node=NAME` where the server is
  another node of its cluster; `USER@REALM!TOKEN@...` signs in with an API token), or `sim://NAME` for
  the simulated hypervisor of the demo. Empty: the host is not linked, and the product changes
  only its own inventory for it.
- `hypervisor_secret_ref`: the name of a file in HYPERVISOR_SECRETS_DIR holding a password, an
  SSH private key or a folder of TLS material; a name, never a path, and never the secret.
"""

from __future__ import annotations

import re
from urllib.parse import urlsplit

#: The drivers libvirt is asked for (with or without a transport), and the demo's simulator.
LIBVIRT_DRIVERS = ("qemu", "test", "lxc", "xen", "ch")
LIBVIRT_TRANSPORTS = ("", "ssh", "tls", "tcp", "unix", "libssh", "libssh2", "ext")
SIM_SCHEME = "sim"
VSPHERE_SCHEME = "vsphere"
PROXMOX_SCHEME = "proxmox"
EXAMPLES = ("qemu+ssh://root@node-01/system, qemu:///system, "
            "vsphere://administrator@vsphere.local@vcenter-01/?datacenter=DC&host=esx-01, "
            "proxmox://root@pam@pve-01:8006/ or sim://node-01")

_SECRET_REF = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,99}")


class InvalidLink(ValueError):
    """A URI or secret reference the product cannot use; the message says what one looks like."""


def check_uri(text: str) -> str:
    """`text` stripped, or InvalidLink naming what is wrong. "" (not linked) is allowed."""
    value = text.strip()
    if not value:
        return ""
    if len(value) > 500 or not value.isascii() or any(ch.isspace() or ord(ch) < 32 for ch in value):
        raise InvalidLink(f"A hypervisor URI is one line of plain characters, e.g. {EXAMPLES}.")
    parts = urlsplit(value)
    scheme = parts.scheme.lower()
    if scheme == SIM_SCHEME:
        if not parts.netloc:
            raise InvalidLink("A simulated hypervisor is named after the host: sim://node-01.")
        return value
    if scheme == VSPHERE_SCHEME:
        if not parts.hostname or not parts.username:
            raise InvalidLink("A vSphere URI names the user and vCenter (or the ESXi host): "
                              "vsphere://administrator@vsphere.local@vcenter-01/?datacenter=DC&host=esx-01.")
        return value
    if scheme == PROXMOX_SCHEME:
        user = (parts.username or "").partition("!")[0]
        if not parts.hostname or "@" not in user:
            raise InvalidLink("A Proxmox VE URI names the user with its realm and the node: "
                              "proxmox://root@pam@pve-01:8006/ (or root@pam!TOKEN@... for an API token).")
        return value
    driver, _, transport = scheme.partition("+")
    if driver not in LIBVIRT_DRIVERS or transport not in LIBVIRT_TRANSPORTS or "://" not in value:
        raise InvalidLink(f"Unknown hypervisor URI scheme {parts.scheme or value!r}: use a libvirt URI "
                          f"({', '.join(d + '://' for d in LIBVIRT_DRIVERS[:2])}, with +ssh, +tls, … for a "
                          f"remote host), vsphere://, proxmox:// or sim://, e.g. {EXAMPLES}.")
    if transport in ("ssh", "tls", "tcp", "libssh", "libssh2") and not parts.hostname:
        raise InvalidLink(f"A remote hypervisor URI names its host: {driver}+{transport}://node-01/system.")
    return value


#: The host's hypervisor (fleet.choices.Hypervisor's value and name) each non-libvirt scheme is for.
SCHEME_HYPERVISORS = {VSPHERE_SCHEME: ("esxi", "VMware vSphere ESXi"), PROXMOX_SCHEME: ("proxmox", "Proxmox VE")}


def check_kind(uri: str, hypervisor: str) -> None:
    """InvalidLink when a host's link names another kind of hypervisor than the host runs: a
    vsphere:// link on a KVM host, a libvirt URI on a Proxmox VE node. A simulated link goes with any."""
    scheme = urlsplit(uri.strip()).scheme.lower()
    if not uri.strip() or scheme == SIM_SCHEME:
        return
    if scheme in SCHEME_HYPERVISORS:
        value, label = SCHEME_HYPERVISORS[scheme]
        if hypervisor != value:
            raise InvalidLink(f"A {scheme}:// link is for a {label} host: set the host's hypervisor to {label}, "
                              "or give the link of the hypervisor it runs.")
        return
    for other, (value, label) in SCHEME_HYPERVISORS.items():
        if hypervisor == value:
            raise InvalidLink(f"This host runs {label}, which is linked through {other}://, not libvirt.")


def is_simulated(uri: str) -> bool:
    return urlsplit(uri).scheme.lower() == SIM_SCHEME


def is_vsphere(uri: str) -> bool:
    return urlsplit(uri).scheme.lower() == VSPHERE_SCHEME


def is_proxmox(uri: str) -> bool:
    return urlsplit(uri).scheme.lower() == PROXMOX_SCHEME


def check_secret_ref(text: str) -> str:
    """`text` stripped, or InvalidLink: a file name in HYPERVISOR_SECRETS_DIR, not a path."""
    value = text.strip()
    if value and (not _SECRET_REF.fullmatch(value) or value in (".", "..")):
        raise InvalidLink("A secret reference is the name of a file in the secrets folder (letters, digits, "
                          "dots, dashes and underscores; no slashes), e.g. node-01-ssh-key.")
    return value

"""A fake Proxmox VE 8 cluster: the part of its HTTP API (`/api2/json`) the Proxmox backend uses,
served over real HTTPS on loopback, for the backend's tests and local trials.

Pure standard library (http.server's ThreadingHTTPServer in a background thread, ssl) plus
`trustme` for a test certificate authority: the server's certificate names 127.0.0.1 and
localhost and is signed by a CA of its own, whose PEM is written to a temporary folder
(`PveFake.ca_pem`). A client that is not given that CA refuses the certificate, as it would a
real node's self-signed one; `untrusted_ca_pem` is another CA, for a "wrong CA file" test.

What it reproduces of Proxmox VE 8 (pve-manager 8.2, qemu-server 8.2, pve-http-server 5):
- Answers as pveproxy writes them: `{"data": ...}` on success; on an error the status line's
  reason is the error message's first line (clients such as proxmoxer show that text) and the
  body is `{"data": null, "message": "...\\n"}`, with `"errors": {param: text}` for a refused
  parameter (400 "Parameter verification failed."). A failed sign-in check (401 from the
  authentication step: "No ticket", "permission denied - invalid PVE ticket",
  "Permission denied - invalid csrf token", "invalid token value!") has an empty body, as
  there. Errors close the connection (pveproxy drops keep-alive on any status >= 400).
- Authentication: POST /access/ticket with form fields username and password (or a still valid
  ticket as the password, which is how proxmoxer renews one) gives a ticket, sent back as the
  cookie PVEAuthCookie, and a CSRFPreventionToken, required as a header on POST/PUT/DELETE.
  API tokens: header `Authorization: PVEAPIToken=USER@REALM!TOKENID=SECRET` (no CSRF token).
- Reads: /version, /nodes, /cluster/status, /access/permissions, /nodes/{node}/qemu,
  .../qemu/{vmid}/config (pending changes applied unless current=1, as in PVE),
  .../qemu/{vmid}/pending, .../qemu/{vmid}/status/current, /nodes/{node}/hardware/pci,
  .../hardware/pci/{pciid}/mdev, /nodes/{node}/tasks/{upid}/status and .../log.
- Writes: POST (a "qmconfig" task) and PUT (synchronous) .../qemu/{vmid}/config, POST
  .../status/start, /shutdown, /stop and .../migrate, each a task named by a UPID that the
  client polls.
- vGPUs (NVIDIA's time-sliced rule, both layouts): a GPU holds vGPUs of one type at a time; a type's
  `available` is the GPU's frame buffer divided by the type's, less the instances present, and
  0 while another type is present. Instances exist only for running VMs: qemu-server creates
  the mdev (UUID `%08d-0000-0000-0000-%012d` of the hostpci index and the vmid) at start and
  removes it at stop. A start that finds no room ends its task with "pci device '...' has no
  available instances of '...'" and the VM stays stopped.
- Pending changes: changing hardware (cores, sockets, memory, hostpciN, ...) of a running VM
  stores the change as pending, applied at its next start; name, description, tags and onboot
  apply at once (they need no hotplug).
- Permissions: root@pam may do anything; other users hold a set of privileges (checked on the
  paths Proxmox checks, message "Permission check failed (/vms/101, VM.PowerMgmt)", 403).
  Only the user root@pam may set or remove a raw `hostpciN` (a PCI address rather than a
  resource mapping): other users and every API token, root@pam's included, get HTTP 500
  "only root can set 'hostpci0' config for non-mapped devices" (qemu-server checks the
  authenticated id against 'root@pam'); `root_tokens_may_set_raw_pci=True` relaxes that.
- Guest figures, as pvestatd and QEMU report them (configurable per VM: VmSpec's cpu_load,
  guest_used_mib and balloon_driver, or `set_guest`): a running VM's `cpu` is the fraction of its
  vCPUs it used, and its `mem` the QEMU process's resident memory (all the guest's RAM touched,
  plus QEMU's own). With `full=1` the listing, and status/current always, add `ballooninfo`
  (bytes) from the VM's balloon device (absent with `balloon: 0`): `actual` and `max_mem`, plus
  the guest's `total_mem`, `free_mem`, swap and page-fault counters and `last_update` when the
  guest runs the VirtIO balloon driver, in which case `mem` is total_mem - free_mem and
  `freemem` and `balloon` are given too, as qemu-server's vmstatus does.
- Guests: a VM powers off `shutdown_delay_s` after an ACPI shutdown; a stubborn one (a guest
  without the agent that ignores ACPI) never does, and the shutdown task fails after its
  timeout with "VM quit/powerdown failed - got timeout" (or stops it with forceStop=1).

The inventory (`default_inventory()`; the constructor takes another): cluster "studio" with
nodes pve1 and pve2, each with two Tesla T4 (16 GiB) at 0000:3b:00.0 and 0000:5e:00.0 plus an
Intel X710 NIC and a Samsung NVMe drive (no mdev). On pve1: VM 101 "ws-anim-01" (4 cores,
16384 MiB, running, T4-4Q on 0000:3b:00.0), VM 102 "ws-light-01" (8 cores, 32768 MiB, running,
T4-8Q on 0000:5e:00.0), VM 103 "ws-model-01" (4 cores, 8192 MiB, running, T4-8Q on
0000:5e:00.0, stubborn, no balloon driver), VM 104 "build-agent" (2 cores, 4096 MiB, stopped, no GPU). On pve2:
VM 201 "ws-comp-01" (4 cores, 16384 MiB, stopped, T4-2Q on 0000:3b:00.0). So pve1's first GPU
has room for three more 4Q, its second is full (two 8Q), and pve2's GPUs are empty. A resource
mapping "t4" names both GPUs of both nodes (`hostpciN: mapping=t4,mdev=...`).
The running VMs' guests: 101 uses a quarter of its vCPUs and 6144 MiB, 102 half of its vCPUs and
24576 MiB, both through the balloon driver; 103 uses 90 % of its vCPUs and runs no balloon
driver, so its memory use is not known.

The SR-IOV inventory (`sriov_inventory()`, NVIDIA vGPU 17+ on Ada as Proxmox VE 8.3+ shows it):
cluster "studio" with one node, pve3, holding an NVIDIA L40S (48 GiB) whose physical function
0000:41:00.0 offers no mdev types and whose eight virtual functions 0000:41:00.4 ... 0000:41:01.3
are listed with `"mdev": 1`. A VF's `.../mdev` lists what its nvidia/creatable_vgpu_types does
(pve-common's get_mdev_types): each type the VF can take now, `available` 1, no description;
nothing while the VF holds a vGPU, and only the size the GPU holds (while it has room) once it
holds one. A VM names the VF (`hostpci0: 0000:41:00.4,mdev=nvidia-1155,pcie=1`); its start
reserves the VF ("PCI device '...' already in use by VMID '...'" when a running VM has it) and
writes the type to the VF's current_vgpu_type ("vgpu type '1155' not available for '...'" when
the VF does not list it), its stop sets it back to 0. VM 301 "ws-render-01" (8 cores, 32768 MiB,
running, L40S-12Q on 0000:41:00.4), VM 302 "ws-spare-01" (4 cores, 16384 MiB, stopped, L40S-12Q
named on 0000:41:00.5), VM 303 "ws-edit-01" (4 cores, 16384 MiB, stopped, no GPU).

Users: root@pam (password PASSWORD, token TOKEN_ID with TOKEN_SECRET) and ops@pve (password
LIMITED_PASSWORD), who may read and change configurations and migrate but not power VMs
(no VM.PowerMgmt) nor set raw PCI devices.

Control methods for tests (thread-safe): `fail_next(task_type, message)`, `hang_next(task_type)`,
`set_stubborn(vmid)`, `set_shutdown_delay(vmid, seconds)`, `set_guest(vmid, ...)`, `expire_tickets()`,
`deny(user, privilege)`; `vm(vmid)` and `instances(node, pci)` show the state; `requests` lists
the requests served (method, path, status, user).

Not faked: one server answers for every node (a real cluster proxies a request to the node
named in the path); no locks between tasks on one VM (a stop during a shutdown does not wait);
privileges are the same on every path (no ACL tree); tickets do not age (expire_tickets() ends
them all at once); the 3 s pause pveproxy puts on every 401 is off unless
`unauthorized_delay_s` is given.
"""

from __future__ import annotations

import contextlib
import copy
import hashlib
import http.server
import itertools
import json
import re
import secrets
import shutil
import ssl
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from urllib.parse import parse_qsl, quote, unquote, urlsplit

API_PREFIX = "/api2/json"

#: The simulated inventory, as the tests name it.
CLUSTER = "studio"
NODES = ("pve1", "pve2")
NODE, OTHER_NODE = NODES
GPU_BUS_IDS = ("0000:3b:00.0", "0000:5e:00.0")
NIC_BUS_ID = "0000:01:00.0"
NVME_BUS_ID = "0000:02:00.0"
MAPPING = "t4"  # a resource mapping naming both GPUs of both nodes
T4_FB_MIB = 16384
#: NVIDIA's T4 vGPU types as Proxmox lists them: type id -> (name, frame buffer in MiB).
T4_TYPES: dict[str, tuple[str, int]] = {
    "nvidia-222": ("GRID T4-1Q", 1024),
    "nvidia-223": ("GRID T4-2Q", 2048),
    "nvidia-224": ("GRID T4-4Q", 4096),
    "nvidia-225": ("GRID T4-8Q", 8192),
    "nvidia-226": ("GRID T4-16Q", 16384),
}
TYPE_1Q, TYPE_2Q, TYPE_4Q, TYPE_8Q, TYPE_16Q = T4_TYPES
#: The SR-IOV inventory (`sriov_inventory()`): one node with one NVIDIA L40S and eight of its VFs.
SRIOV_NODE = "pve3"
L40S_PF = "0000:41:00.0"
L40S_VFS = ("0000:41:00.4", "0000:41:00.5", "0000:41:00.6", "0000:41:00.7",
            "0000:41:01.0", "0000:41:01.1", "0000:41:01.2", "0000:41:01.3")
L40S_FB_MIB = 49152
#: NVIDIA's L40S vGPU types (vGPU 17) as a VF's creatable_vgpu_types names them: id -> (name, MiB).
L40S_TYPES: dict[str, tuple[str, int]] = {
    "nvidia-1152": ("NVIDIA L40S-4Q", 4096),
    "nvidia-1153": ("NVIDIA L40S-6Q", 6144),
    "nvidia-1154": ("NVIDIA L40S-8Q", 8192),
    "nvidia-1155": ("NVIDIA L40S-12Q", 12288),
    "nvidia-1156": ("NVIDIA L40S-24Q", 24576),
    "nvidia-1157": ("NVIDIA L40S-48Q", 49152),
}
L40S_4Q, L40S_6Q, L40S_8Q, L40S_12Q, L40S_24Q, L40S_48Q = L40S_TYPES
VM_RENDER, VM_SPARE, VM_EDIT = 301, 302, 303
VM_ANIM, VM_LIGHT, VM_MODEL, VM_BUILD, VM_COMP = 101, 102, 103, 104, 201
STUBBORN_VM = VM_MODEL  # its guest ignores ACPI shutdown requests
USERNAME = "root@pam"
PASSWORD = "pve-root-secret"
TOKEN_ID = "root@pam!dash"
TOKEN_SECRET = "5f3c8a52-1d9e-4b7a-9c41-0e6f2b8d7a13"
LIMITED_USER = "ops@pve"
LIMITED_PASSWORD = "pve-ops-secret"
VERSION = {"version": "8.2.4", "release": "8.2", "repoid": "faa83925"}
DEFAULT_SHUTDOWN_DELAY_S = 0.2
MIB = 1024 * 1024
DEFAULT_CPU_LOAD = 0.043  # an idle guest's share of its vCPUs
GUEST_RESERVED_MIB = 196  # what firmware and the guest's kernel keep back of its RAM (MemTotal is less)
QEMU_OVERHEAD_MIB = 256  # QEMU's own memory, on top of the guest's RAM in its resident set
DEFAULT_SHUTDOWN_TIMEOUT_S = 60.0  # qemu-server's when the request gives none
STOP_TIMEOUT_S = 5.0

#: Proxmox VE 8's privileges (those a root user holds on "/").
ALL_PRIVILEGES = (
    "Datastore.Allocate", "Datastore.AllocateSpace", "Datastore.AllocateTemplate", "Datastore.Audit",
    "Group.Allocate", "Mapping.Audit", "Mapping.Modify", "Mapping.Use", "Permissions.Modify",
    "Pool.Allocate", "Pool.Audit", "Realm.Allocate", "Realm.AllocateUser", "SDN.Allocate", "SDN.Audit",
    "SDN.Use", "Sys.Audit", "Sys.Console", "Sys.Incoming", "Sys.Modify", "Sys.PowerMgmt", "Sys.Syslog",
    "User.Modify", "VM.Allocate", "VM.Audit", "VM.Backup", "VM.Clone", "VM.Config.CDROM", "VM.Config.CPU",
    "VM.Config.Cloudinit", "VM.Config.Disk", "VM.Config.HWType", "VM.Config.Memory", "VM.Config.Network",
    "VM.Config.Options", "VM.Console", "VM.Migrate", "VM.Monitor", "VM.PowerMgmt", "VM.Snapshot",
    "VM.Snapshot.Rollback",
)
#: What ops@pve holds: reads, configuration and migration, not power nor raw PCI devices.
LIMITED_PRIVILEGES = ("Sys.Audit", "VM.Audit", "VM.Config.CPU", "VM.Config.Memory", "VM.Config.HWType",
                      "VM.Config.Options", "VM.Migrate", "Mapping.Use", "Mapping.Audit")

#: The configuration keys this fake knows (others are refused as PVE's schema refuses them).
INT_KEYS = frozenset({"cores", "sockets", "vcpus", "balloon", "numa", "onboot", "protection", "template"})
PLAIN_KEYS = frozenset({"name", "description", "tags", "memory", "cpu", "ostype", "boot", "bios", "machine",
                        "scsihw", "agent", "smbios1", "vmgenid", "vga", "efidisk0", "tpmstate0", "meta"})
INDEXED_KEYS = re.compile(r"^(hostpci([0-9]|1[0-5])|net([0-9]|[12][0-9]|3[01])|scsi([0-9]|[12][0-9]|30)"
                          r"|virtio([0-9]|1[0-5])|sata[0-5]|ide[0-3]|usb[0-4]|serial[0-3])$")
#: Options qemu-server applies at once to a running VM (no hotplug needed).
FAST_PLUG_KEYS = frozenset({"name", "description", "tags", "onboot", "protection", "meta"})
#: The privilege PVE asks for to change an option (check_vm_modify_config_perm).
CPU_KEYS = frozenset({"cores", "sockets", "vcpus", "cpu", "numa"})
MEMORY_KEYS = frozenset({"memory", "balloon"})
HOSTPCI_OPTIONS = frozenset({"host", "mapping", "mdev", "pcie", "x-vga", "rombar", "romfile", "device-id",
                             "vendor-id", "sub-device-id", "sub-vendor-id", "legacy-igd"})
PCI_ID = re.compile(r"^(?:([0-9a-fA-F]{4}):)?([0-9a-fA-F]{2}:[0-9a-fA-F]{2}(?:\.[0-7])?)$")
VERIFICATION_FAILED = "Parameter verification failed."
NOT_IN_SCHEMA = "property is not defined in schema and the schema does not allow additional properties"
MODIFIED = "detected modified configuration - file changed by other user? Try again."


def vm_uuid(vmid: int) -> str:
    """The fixed SMBIOS UUID of a VM of the inventory (`smbios1: uuid=...`)."""
    return f"5e1f0a00-7c3d-4b2e-9a61-{vmid:012d}"


def mdev_uuid(index: int, vmid: int) -> str:
    """The UUID qemu-server gives the mdev of `hostpci<index>` of VM `vmid`."""
    return f"{index:08d}-0000-0000-0000-{vmid:012d}"


def type_capacity(mdev_type: str) -> int:
    """How many vGPUs of a type one T4 holds (its frame buffer divided by the type's)."""
    return T4_FB_MIB // T4_TYPES[mdev_type][1]


@dataclass
class VmSpec:
    """One VM of an inventory."""

    vmid: int
    node: str
    name: str
    cores: int
    memory_mib: int
    running: bool
    hostpci: tuple[str, ...] = ()  # hostpci0, hostpci1, ... values
    stubborn: bool = False
    sockets: int = 1
    shutdown_delay_s: float = DEFAULT_SHUTDOWN_DELAY_S
    cpu_load: float = DEFAULT_CPU_LOAD  # while running: the fraction of its vCPUs it uses (pvestatd's cpu)
    guest_used_mib: int | None = None  # while running: memory the guest uses (None: half of its RAM)
    balloon_driver: bool = True  # the guest runs the VirtIO balloon driver (reports its memory)


@dataclass(frozen=True)
class SriovGpu:
    """A GPU in NVIDIA's SR-IOV layout (vGPU 17+ on Ada and newer): the physical function, which
    offers no mdev types, and its virtual functions, each of which takes one vGPU."""

    pf: str
    vfs: tuple[str, ...]
    device_name: str = "AD102GL [L40S]"
    device: str = "0x26b9"
    fb_mib: int = L40S_FB_MIB
    types: dict[str, tuple[str, int]] = field(default_factory=lambda: dict(L40S_TYPES))


@dataclass
class Inventory:
    """A cluster: its name, each node's GPUs (PCI addresses of Tesla T4s), the VMs, the
    resource mappings (name -> node -> PCI addresses), and each node's SR-IOV GPUs."""

    cluster: str
    gpus: dict[str, tuple[str, ...]]
    vms: list[VmSpec]
    mappings: dict[str, dict[str, tuple[str, ...]]] = field(default_factory=dict)
    sriov: dict[str, tuple[SriovGpu, ...]] = field(default_factory=dict)


def default_inventory() -> Inventory:
    """The inventory the module docstring describes."""
    return Inventory(
        cluster=CLUSTER,
        gpus={node: GPU_BUS_IDS for node in NODES},
        vms=[
            VmSpec(VM_ANIM, NODE, "ws-anim-01", 4, 16384, True, (f"{GPU_BUS_IDS[0]},mdev={TYPE_4Q}",),
                   cpu_load=0.25, guest_used_mib=6144),
            VmSpec(VM_LIGHT, NODE, "ws-light-01", 8, 32768, True, (f"{GPU_BUS_IDS[1]},mdev={TYPE_8Q}",),
                   cpu_load=0.5, guest_used_mib=24576),
            VmSpec(VM_MODEL, NODE, "ws-model-01", 4, 8192, True, (f"{GPU_BUS_IDS[1]},mdev={TYPE_8Q}",),
                   stubborn=True, cpu_load=0.9, balloon_driver=False),
            VmSpec(VM_BUILD, NODE, "build-agent", 2, 4096, False),
            VmSpec(VM_COMP, OTHER_NODE, "ws-comp-01", 4, 16384, False, (f"{GPU_BUS_IDS[0]},mdev={TYPE_2Q}",)),
        ],
        mappings={MAPPING: {node: GPU_BUS_IDS for node in NODES}},
    )


def sriov_inventory() -> Inventory:
    """A cluster of one node, pve3, with an NVIDIA L40S in the SR-IOV layout (the module docstring
    says what it holds): VM 301 "ws-render-01" runs an L40S-12Q on the first VF, VM 302
    "ws-spare-01" is stopped with an L40S-12Q named on the second VF, VM 303 "ws-edit-01" is
    stopped with no GPU. The GPU has room for three more 12Q."""
    return Inventory(
        cluster=CLUSTER,
        gpus={SRIOV_NODE: ()},
        vms=[
            VmSpec(VM_RENDER, SRIOV_NODE, "ws-render-01", 8, 32768, True, (f"{L40S_VFS[0]},mdev={L40S_12Q},pcie=1",)),
            VmSpec(VM_SPARE, SRIOV_NODE, "ws-spare-01", 4, 16384, False, (f"{L40S_VFS[1]},mdev={L40S_12Q},pcie=1",)),
            VmSpec(VM_EDIT, SRIOV_NODE, "ws-edit-01", 4, 16384, False),
        ],
        sriov={SRIOV_NODE: (SriovGpu(L40S_PF, L40S_VFS),)},
    )


class ApiError(Exception):
    """An error answer: HTTP status, the message (its first line becomes the status line's
    reason), parameter errors, and whether the body is empty (an authentication failure)."""

    def __init__(self, status: int, message: str, errors: dict[str, str] | None = None, *, bare: bool = False):
        super().__init__(message)
        self.status, self.message, self.errors, self.bare = status, message, errors, bare


class TaskFailed(Exception):
    """A task's error: its text becomes the task's exitstatus."""


@dataclass
class _Vm:
    vmid: int
    node: str
    config: dict[str, str]
    running: bool
    stubborn: bool
    shutdown_delay_s: float
    pending: dict[str, str] = field(default_factory=dict)
    pending_delete: list[str] = field(default_factory=list)
    started_at: float = 0.0
    pid: int = 0
    cpu_load: float = DEFAULT_CPU_LOAD
    guest_used_mib: int | None = None
    balloon_driver: bool = True


@dataclass
class _Instance:
    uuid: str
    node: str
    pci: str
    type: str
    vmid: int


@dataclass
class _Task:
    upid: str
    node: str
    type: str
    id: str
    user: str
    starttime: int
    pid: int
    pstart: int
    status: str = "running"
    exitstatus: str | None = None
    endtime: int | None = None
    log: list[str] = field(default_factory=list)


@dataclass
class _Caller:
    """Who a request comes from: the user, the token id when it came with an API token."""

    user: str
    token: str | None = None

    @property
    def authid(self) -> str:
        return f"{self.user}!{self.token}" if self.token else self.user


def _parse_property_string(value: str, default_key: str) -> dict[str, str]:
    out: dict[str, str] = {}
    for part in value.split(","):
        if not part:
            continue
        key, sep, val = part.partition("=")
        if sep:
            out[key.strip()] = val.strip()
        else:
            out.setdefault(default_key, key.strip())
    return out


def _normal_pci(pci_id: str) -> str | None:
    match = PCI_ID.match(pci_id)
    if not match:
        return None
    return f"{(match.group(1) or '0000').lower()}:{match.group(2).lower()}"


def _hostpci(value: str) -> dict[str, str]:
    """A hostpciN value's options, its host address normalised (domain added)."""
    opts = _parse_property_string(value, "host")
    if "host" in opts:
        opts["host"] = _normal_pci(opts["host"]) or opts["host"]
    return opts


class PveFake:
    """A fake Proxmox VE cluster behind one HTTPS endpoint: `start()`/`stop()` (or `with`);
    `host`, `port`, `base_url`, `ca_pem`; `uri(...)` what a host's `hypervisor_uri` would hold
    for one of its nodes."""

    def __init__(self, *, inventory: Inventory | None = None, users: dict[str, str] | None = None,
                 tokens: dict[str, str] | None = None, privileges: dict[str, tuple[str, ...]] | None = None,
                 task_duration_s: float = 0.0, unauthorized_delay_s: float = 0.0,
                 root_tokens_may_set_raw_pci: bool = False):
        """`users` (userid -> password), `tokens` (USER@REALM!TOKENID -> secret) and
        `privileges` (userid -> privileges; root@pam holds all) default to root@pam with its
        token and ops@pve. `task_duration_s`: how long a power or configuration task stays
        "running" before it does its work (0: done before the request answers; a client
        polls either way). `unauthorized_delay_s`: pveproxy's pause before each 401 (3 s).
        `root_tokens_may_set_raw_pci`: let root@pam's API tokens set a raw hostpciN, which
        Proxmox refuses (its check is on the user root@pam itself, not its tokens)."""
        inventory = inventory or default_inventory()
        self.cluster = inventory.cluster
        self.gpus = {node: tuple(_normal_pci(p) or p for p in pcis) for node, pcis in inventory.gpus.items()}
        self.mappings = {name: {node: tuple(pcis) for node, pcis in nodes.items()}
                         for name, nodes in inventory.mappings.items()}
        self.sriov = {node: {gpu.pf: gpu for gpu in gpus} for node, gpus in inventory.sriov.items()}
        self.users = dict(users) if users is not None else {USERNAME: PASSWORD, LIMITED_USER: LIMITED_PASSWORD}
        self.tokens = dict(tokens) if tokens is not None else {TOKEN_ID: TOKEN_SECRET}
        self.privileges = dict(privileges) if privileges is not None else {LIMITED_USER: LIMITED_PRIVILEGES}
        self.task_duration_s = task_duration_s
        self.unauthorized_delay_s = unauthorized_delay_s
        self.root_tokens_may_set_raw_pci = root_tokens_may_set_raw_pci
        self.requests: list[tuple[str, str, int, str]] = []
        self._lock = threading.RLock()
        self._closing = threading.Event()
        self._vms: dict[int, _Vm] = {}
        self._instances: list[_Instance] = []
        self._tasks: dict[str, _Task] = {}
        self._tickets: dict[str, str] = {}  # ticket -> userid
        self._csrf: dict[str, str] = {}  # CSRF token -> userid
        self._fail: dict[str, list[str]] = {}
        self._hang: dict[str, int] = {}
        self._denied: dict[str, set[str]] = {}
        self._pids = itertools.count(0x2F1A0)
        self._boot = int(time.time()) - 86400
        for spec in inventory.vms:
            self._add_vm(spec)
        self.folder = Path(tempfile.mkdtemp(prefix="pvefake-"))
        self._ca_pem = self.folder / "ca.pem"
        self._untrusted_ca_pem = self.folder / "untrusted-ca.pem"
        self._server: http.server.ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None

    # The inventory --------------------------------------------------------------------------

    def _add_vm(self, spec: VmSpec) -> None:
        config = {
            "name": spec.name, "cores": str(spec.cores), "sockets": str(spec.sockets),
            "memory": str(spec.memory_mib), "ostype": "win11", "machine": "pc-q35-8.1", "bios": "ovmf",
            "cpu": "host", "scsihw": "virtio-scsi-single", "boot": "order=scsi0;net0",
            "scsi0": f"local-lvm:vm-{spec.vmid}-disk-0,iothread=1,size=128G",
            "net0": f"virtio=BC:24:11:00:{spec.vmid // 100:02X}:{spec.vmid % 100:02X},bridge=vmbr0",
            "smbios1": f"uuid={vm_uuid(spec.vmid)}",
            "vmgenid": f"a0c4e1d2-0000-4000-8000-{spec.vmid:012d}",
        }
        for index, value in enumerate(spec.hostpci):
            config[f"hostpci{index}"] = value
        vm = _Vm(spec.vmid, spec.node, config, False, spec.stubborn, spec.shutdown_delay_s, cpu_load=spec.cpu_load,
                 guest_used_mib=spec.guest_used_mib, balloon_driver=spec.balloon_driver)
        self._vms[spec.vmid] = vm
        if spec.running:
            plan = self._plan_instances(vm)
            if isinstance(plan, str):
                raise ValueError(f"The inventory cannot run VM {spec.vmid}: {plan}")
            self._power_on(vm, plan)

    def _available(self, node: str, pci: str, mdev_type: str, extra: list[_Instance] = ()) -> int:
        present = [i for i in [*self._instances, *extra] if i.node == node and i.pci == pci]
        if any(i.type != mdev_type for i in present):
            return 0
        return max(type_capacity(mdev_type) - len(present), 0)

    def _sriov_gpu_of(self, node: str, pci: str) -> SriovGpu | None:
        """The SR-IOV GPU of `node` whose PF or one of whose VFs `pci` is."""
        return next((gpu for gpu in self.sriov.get(node, {}).values() if pci == gpu.pf or pci in gpu.vfs), None)

    def _creatable(self, node: str, vf: str, extra: list[_Instance] = ()) -> list[str]:
        """What the VF's nvidia/creatable_vgpu_types lists now: nothing while it holds a vGPU;
        otherwise the types the GPU has room for (one size per GPU, up to its frame buffer)."""
        gpu = self._sriov_gpu_of(node, vf)
        present = [i for i in [*self._instances, *extra] if i.node == node and gpu is not None and i.pci in gpu.vfs]
        if gpu is None or any(i.pci == vf for i in present):
            return []
        return [type_id for type_id, (_, fb) in gpu.types.items()
                if all(i.type == type_id for i in present) and len(present) < gpu.fb_mib // fb]

    def _plan_vf(self, vm: _Vm, vf: str, mdev_type: str, plan: list[_Instance]) -> _Instance | str:
        """qemu-server at start for a VF: the VF is reserved for this VM (reserve_pci_usage), then
        create_nvidia_device writes the type to nvidia/current_vgpu_type if the VF lists it."""
        holder = next((i.vmid for i in [*self._instances, *plan] if i.node == vm.node and i.pci == vf), None)
        if holder is not None and holder != vm.vmid:
            return f"PCI device '{vf}' already in use by VMID '{holder}'"
        model = mdev_type.removeprefix("nvidia-")
        if mdev_type not in self._creatable(vm.node, vf, plan):
            return f"vgpu type '{model}' not available for '{vf}'"
        return _Instance("", vm.node, vf, mdev_type, vm.vmid)

    def _plan_instances(self, vm: _Vm) -> list[_Instance] | str:
        """The mdev instances (and VFs set to a vGPU type) starting `vm` would create, or the task
        error that stops it."""
        plan: list[_Instance] = []
        for key in sorted((k for k in vm.config if k.startswith("hostpci")), key=lambda k: int(k[7:])):
            opts = _hostpci(vm.config[key])
            index = int(key[7:])
            if "mapping" in opts:
                candidates = self.mappings.get(opts["mapping"], {}).get(vm.node)
                if not candidates:
                    return f"mapping '{opts['mapping']}' not found on node '{vm.node}'"
            else:
                candidates = (opts.get("host", ""),)
            for pci in candidates:
                if pci not in self.gpus.get(vm.node, ()) and pci not in (NIC_BUS_ID, NVME_BUS_ID) \
                        and self._sriov_gpu_of(vm.node, pci) is None:
                    return f"no PCI device found for '{pci}'"
            mdev_type = opts.get("mdev")
            if not mdev_type:
                continue  # a whole device passed through: nothing to create
            sriov = self._sriov_gpu_of(vm.node, candidates[0])
            if sriov is not None:
                if candidates[0] == sriov.pf:
                    return f"no nvidia sysfs api for '{candidates[0]}'"  # the PF takes no vGPU itself
                planned = self._plan_vf(vm, candidates[0], mdev_type, plan)
                if isinstance(planned, str):
                    return planned
                plan.append(planned)
                continue
            chosen = None
            for pci in candidates:
                if pci in self.gpus.get(vm.node, ()) and mdev_type in T4_TYPES \
                        and self._available(vm.node, pci, mdev_type, plan) >= 1:
                    chosen = pci
                    break
            if chosen is None:
                return f"pci device '{candidates[-1]}' has no available instances of '{mdev_type}'"
            plan.append(_Instance(mdev_uuid(index, vm.vmid), vm.node, chosen, mdev_type, vm.vmid))
        return plan

    def _power_on(self, vm: _Vm, plan: list[_Instance]) -> None:
        self._instances.extend(plan)
        vm.running, vm.started_at, vm.pid = True, time.time(), next(self._pids)

    def _power_off(self, vm: _Vm) -> None:
        self._instances = [i for i in self._instances if i.vmid != vm.vmid]
        vm.running, vm.started_at, vm.pid = False, 0.0, 0

    # Control and inspection for tests -------------------------------------------------------

    def fail_next(self, task_type: str, message: str) -> None:
        """The next task of `task_type` ("qmstart", "qmshutdown", "qmstop", "qmigrate",
        "qmconfig") ends at once with `message` as its exitstatus and changes nothing."""
        with self._lock:
            self._fail.setdefault(task_type, []).append(message)

    def hang_next(self, task_type: str) -> None:
        """The next task of `task_type` stays "running" for ever and changes nothing."""
        with self._lock:
            self._hang[task_type] = self._hang.get(task_type, 0) + 1

    def set_stubborn(self, vmid: int, stubborn: bool = True) -> None:
        """Make a VM's guest ignore (or heed again) ACPI shutdown requests."""
        with self._lock:
            self._vms[vmid].stubborn = stubborn

    def set_shutdown_delay(self, vmid: int, seconds: float) -> None:
        """How long a VM's guest takes to power off after an ACPI shutdown request."""
        with self._lock:
            self._vms[vmid].shutdown_delay_s = seconds

    def set_guest(self, vmid: int, *, cpu_load: float | None = None, used_mib: int | None = None,
                  balloon_driver: bool | None = None) -> None:
        """What a VM's guest does while it runs: the fraction of its vCPUs it uses, the memory it
        uses (MiB), and whether it runs the balloon driver that reports that memory."""
        with self._lock:
            vm = self._vms[vmid]
            if cpu_load is not None:
                vm.cpu_load = cpu_load
            if used_mib is not None:
                vm.guest_used_mib = used_mib
            if balloon_driver is not None:
                vm.balloon_driver = balloon_driver

    def expire_tickets(self) -> None:
        """End every ticket and CSRF token issued so far, as a ticket's two hours passing would:
        the next request with one is refused (401) and a new sign-in gets a fresh one."""
        with self._lock:
            self._tickets.clear()
            self._csrf.clear()

    def deny(self, user: str, privilege: str) -> None:
        """Take a privilege away from a user (root@pam included) or one token (USER@REALM!TOKEN);
        taking it from a user takes it from the user's tokens too."""
        with self._lock:
            self._denied.setdefault(user, set()).add(privilege)

    def vm(self, vmid: int) -> dict:
        """A copy of a VM's state: node, status, config (as running), pending changes, pending
        deletions, its mdev instances, stubborn, shutdown_delay_s."""
        with self._lock:
            vm = self._vms[vmid]
            return {
                "vmid": vm.vmid, "node": vm.node, "status": "running" if vm.running else "stopped",
                "config": copy.deepcopy(vm.config), "pending": dict(vm.pending),
                "pending_delete": list(vm.pending_delete), "stubborn": vm.stubborn,
                "shutdown_delay_s": vm.shutdown_delay_s,
                "instances": [{"uuid": i.uuid, "pci": i.pci, "type": i.type} for i in self._instances
                              if i.vmid == vmid],
            }

    def instances(self, node: str, pci: str) -> list[dict]:
        """The mdev instances present on one GPU: uuid, type, vmid."""
        pci = _normal_pci(pci) or pci
        with self._lock:
            return [{"uuid": i.uuid, "type": i.type, "vmid": i.vmid} for i in self._instances
                    if i.node == node and i.pci == pci]

    def available(self, node: str, pci: str, mdev_type: str) -> int:
        """What /hardware/pci/{pci}/mdev says of a type's available instances."""
        with self._lock:
            return self._available(node, _normal_pci(pci) or pci, mdev_type)

    def task(self, upid: str) -> dict:
        """A copy of a task: status, exitstatus, type, id, user, log lines."""
        with self._lock:
            task = self._tasks[upid]
            return {"upid": task.upid, "node": task.node, "status": task.status, "exitstatus": task.exitstatus,
                    "type": task.type, "id": task.id, "user": task.user, "log": list(task.log)}

    # Server --------------------------------------------------------------------------------

    @property
    def host(self) -> str:
        return "127.0.0.1"

    @property
    def port(self) -> int:
        if self._server is None:
            raise RuntimeError("The Proxmox fake is not started.")
        return self._server.server_address[1]

    @property
    def base_url(self) -> str:
        return f"https://{self.host}:{self.port}{API_PREFIX}"

    @property
    def ca_pem(self) -> Path:
        """The PEM of the CA that signed the server's certificate (pass it as a CA file)."""
        return self._ca_pem

    @property
    def untrusted_ca_pem(self) -> Path:
        """The PEM of another CA, which did not sign the server's certificate."""
        return self._untrusted_ca_pem

    def uri(self, node: str = NODE, *, token: bool = False, insecure: bool = False, cafile: bool = True,
            user: str | None = None, **query: str) -> str:
        """A host's hypervisor URI for one node: `proxmox://root@pam@127.0.0.1:PORT/?node=pve1&cafile=...`
        (the token id as the user with `token=True`; `insecure=1` instead of the CA file with
        `insecure=True`). The secret (password or token secret) goes in the host's secret file."""
        who = user or (TOKEN_ID if token else USERNAME)
        params = {"node": node}
        if insecure:
            params["insecure"] = "1"
        elif cafile:
            params["cafile"] = str(self.ca_pem)
        params.update(query)
        text = "&".join(f"{name}={quote(str(value), safe='/:')}" for name, value in params.items())
        return f"proxmox://{who}@{self.host}:{self.port}/?{text}"

    def secret(self, *, token: bool = False) -> str:
        """What the host's secret file holds for `uri(token=...)`: the password or token secret."""
        return self.tokens[TOKEN_ID] if token else self.users[USERNAME]

    def start(self) -> None:
        """Serve HTTPS on a free loopback port in a background thread."""
        if self._server is not None:
            return
        import trustme  # test-only dependency (requirements-dev.txt)

        ca = trustme.CA(organization_name="Proxmox fake CA")
        ca.cert_pem.write_to_path(str(self._ca_pem))
        trustme.CA(organization_name="Another CA").cert_pem.write_to_path(str(self._untrusted_ca_pem))
        context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        ca.issue_cert("127.0.0.1", "localhost").configure_cert(context)
        server = _Server((self.host, 0), _Handler)
        server.fake = self
        # The handshake happens in the request's thread, so a client that never completes one
        # cannot hold up the accepting thread.
        server.socket = context.wrap_socket(server.socket, server_side=True, do_handshake_on_connect=False)
        self._closing.clear()
        self._server = server
        self._thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05},
                                        name="pvefake", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """Stop serving; tasks still waiting end with the server (hung ones stay as they are)."""
        self._closing.set()
        server, self._server = self._server, None
        if server is not None:
            server.shutdown()
            server.server_close()
        if self._thread is not None:
            self._thread.join(STOP_TIMEOUT_S)
            self._thread = None
        shutil.rmtree(self.folder, ignore_errors=True)

    def __enter__(self) -> PveFake:
        self.start()
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.stop()

    # Authentication ------------------------------------------------------------------------

    def _issue_ticket(self, user: str) -> dict:
        stamp = f"{int(time.time()):08X}"
        ticket = f"PVE:{user}:{stamp}::{secrets.token_urlsafe(48)}"
        csrf = f"{stamp}:{secrets.token_urlsafe(27)}"
        self._tickets[ticket] = user
        self._csrf[csrf] = user
        return {"ticket": ticket, "CSRFPreventionToken": csrf, "username": user,
                "cap": {"vms": {p: 1 for p in self._privileges(_Caller(user)) if p.startswith("VM.")}}}

    def login(self, params: dict[str, str]) -> dict:
        username, password = params.get("username", ""), params.get("password", "")
        if not username or "password" not in params:
            missing = {k: "property is missing and it is not optional" for k in ("username", "password")
                       if k not in params}
            raise ApiError(400, VERIFICATION_FAILED, missing)
        with self._lock:
            renewing = self._tickets.get(password) == username
            if not renewing and (username not in self.users or not secrets.compare_digest(
                    self.users[username].encode(), password.encode())):
                raise ApiError(401, "authentication failure")
            return self._issue_ticket(username)

    def authenticate(self, method: str, headers: dict[str, str]) -> _Caller:
        """Who sent the request (the ticket cookie, else the API token), or the 401 pveproxy gives."""
        cookie = headers.get("cookie", "")
        ticket = None
        for part in cookie.split(";"):
            name, _, value = part.strip().partition("=")
            if name == "PVEAuthCookie":
                ticket = unquote(value)
        authorization = headers.get("authorization", "")
        if ticket is None and authorization.startswith("PVEAuthCookie="):
            ticket = unquote(authorization.partition("=")[2])
        with self._lock:
            if ticket is None and authorization.startswith("PVEAPIToken="):
                tokenid, _, secret = authorization[len("PVEAPIToken="):].partition("=")
                user, _, token_name = tokenid.partition("!")
                if not token_name or "@" not in user:
                    raise ApiError(401, "invalid token value!", bare=True)
                if tokenid not in self.tokens:
                    raise ApiError(401, f"no such token '{token_name}' for user '{user}'", bare=True)
                if not secrets.compare_digest(self.tokens[tokenid].encode(), secret.strip().encode()):
                    raise ApiError(401, "invalid token value!", bare=True)
                return _Caller(user, token_name)
            if not ticket:
                raise ApiError(401, "No ticket", bare=True)
            user = self._tickets.get(ticket)
            if user is None:
                raise ApiError(401, "permission denied - invalid PVE ticket", bare=True)
            if method != "GET":
                csrf = headers.get("csrfpreventiontoken", "")
                if self._csrf.get(csrf) != user:
                    raise ApiError(401, "Permission denied - invalid csrf token", bare=True)
            return _Caller(user)

    def _privileges(self, caller: _Caller) -> set[str]:
        base = set(ALL_PRIVILEGES) if caller.user == USERNAME else set(self.privileges.get(caller.user, ()))
        base -= self._denied.get(caller.user, set())
        if caller.token:
            base -= self._denied.get(caller.authid, set())
        return base

    def _check(self, caller: _Caller, path: str, *privileges: str, any_of: bool = False) -> None:
        held = self._privileges(caller)
        missing = [p for p in privileges if p not in held]
        if missing and (not any_of or len(missing) == len(privileges)):
            raise ApiError(403, f"Permission check failed ({path}, {', '.join(missing) if any_of else missing[0]})")

    def _may(self, caller: _Caller, privilege: str) -> bool:
        return privilege in self._privileges(caller)

    # Tasks ---------------------------------------------------------------------------------

    def _spawn(self, node: str, task_type: str, task_id: str, caller: _Caller,
               work: Callable[[_Task], None], *, background: bool = False) -> str:
        """Start a task and return its UPID. `work` does it (raising TaskFailed for a task error);
        it runs in a thread of its own when it waits (`background`) or tasks are slowed."""
        now = int(time.time())
        pid, pstart = next(self._pids), (now - self._boot) * 100
        upid = f"UPID:{node}:{pid:08X}:{pstart:08X}:{now:08X}:{task_type}:{task_id}:{caller.authid}:"
        task = _Task(upid, node, task_type, task_id, caller.authid, now, pid, pstart)
        with self._lock:
            self._tasks[upid] = task
            if self._hang.get(task_type):
                self._hang[task_type] -= 1
                return upid
            failures = self._fail.get(task_type)
            if failures:
                self._finish(task, failures.pop(0))
                return upid

        def run() -> None:
            if self.task_duration_s and self._closing.wait(self.task_duration_s):
                return
            try:
                work(task)
            except TaskFailed as exc:
                with self._lock:
                    self._finish(task, str(exc))
            else:
                with self._lock:
                    self._finish(task, None)

        if background or self.task_duration_s:
            threading.Thread(target=run, name=f"pvefake-{task_type}", daemon=True).start()
        else:
            run()
        return upid

    def _finish(self, task: _Task, error: str | None) -> None:
        if error:
            task.log.append(f"TASK ERROR: {error}")
        else:
            task.log.append("TASK OK")
        task.status, task.exitstatus, task.endtime = "stopped", error or "OK", int(time.time())

    # The API -------------------------------------------------------------------------------

    def _node(self, node: str) -> str:
        if node not in self.gpus:
            raise ApiError(500, f"hostname lookup '{node}' failed - failed to get address info for: {node}: "
                                "Name or service not known")
        return node

    def _vm_on(self, node: str, vmid: str) -> _Vm:
        self._node(node)
        if not re.fullmatch(r"[1-9][0-9]{2,8}", vmid):
            raise ApiError(400, VERIFICATION_FAILED, {"vmid": f"type check ('integer') failed - got '{vmid}'"})
        vm = self._vms.get(int(vmid))
        if vm is None or vm.node != node:
            raise ApiError(500, f"Configuration file 'nodes/{node}/qemu-server/{vmid}.conf' does not exist")
        return vm

    @staticmethod
    def _typed(key: str, value: str) -> str | int:
        return int(value) if key in INT_KEYS and re.fullmatch(r"-?[0-9]+", value) else value

    @staticmethod
    def _config_text(vm: _Vm) -> str:
        lines = [f"{k}: {vm.config[k]}" for k in sorted(vm.config)]
        if vm.pending or vm.pending_delete:
            lines.append("\n[PENDING]")
            if vm.pending_delete:
                lines.append(f"delete: {','.join(vm.pending_delete)}")
            lines += [f"{k}: {vm.pending[k]}" for k in sorted(vm.pending)]
        return "\n".join(lines) + "\n"

    def _digest(self, vm: _Vm) -> str:
        return hashlib.sha1(self._config_text(vm).encode()).hexdigest()

    def dispatch(self, method: str, path: str, params: dict[str, str], caller: _Caller) -> object:
        """The answer's data for one API call (the path below /api2/json), or ApiError."""
        parts = [unquote(p) for p in path.strip("/").split("/")] if path.strip("/") else []
        for route_method, pattern, handler in self._routes():
            if route_method != method or len(pattern) != len(parts):
                continue
            args = []
            for want, got in zip(pattern, parts, strict=True):
                if want == "*":
                    args.append(got)
                elif want != got:
                    break
            else:
                with self._lock:
                    return handler(caller, params, *args)
        raise ApiError(501, f"Method '{method} /{'/'.join(parts)}' not implemented")

    def _routes(self) -> list[tuple[str, tuple[str, ...], Callable]]:
        return [
            ("GET", ("version",), self._get_version),
            ("GET", ("nodes",), self._get_nodes),
            ("GET", ("cluster", "status"), self._get_cluster_status),
            ("GET", ("access", "permissions"), self._get_permissions),
            ("GET", ("nodes", "*", "qemu"), self._get_qemu_list),
            ("GET", ("nodes", "*", "qemu", "*", "config"), self._get_config),
            ("POST", ("nodes", "*", "qemu", "*", "config"), self._post_config),
            ("PUT", ("nodes", "*", "qemu", "*", "config"), self._put_config),
            ("GET", ("nodes", "*", "qemu", "*", "pending"), self._get_pending),
            ("GET", ("nodes", "*", "qemu", "*", "status", "current"), self._get_status),
            ("POST", ("nodes", "*", "qemu", "*", "status", "start"), self._post_start),
            ("POST", ("nodes", "*", "qemu", "*", "status", "shutdown"), self._post_shutdown),
            ("POST", ("nodes", "*", "qemu", "*", "status", "stop"), self._post_stop),
            ("POST", ("nodes", "*", "qemu", "*", "migrate"), self._post_migrate),
            ("GET", ("nodes", "*", "hardware", "pci"), self._get_pci),
            ("GET", ("nodes", "*", "hardware", "pci", "*", "mdev"), self._get_mdev),
            ("GET", ("nodes", "*", "tasks", "*", "status"), self._get_task_status),
            ("GET", ("nodes", "*", "tasks", "*", "log"), self._get_task_log),
        ]

    def _get_version(self, caller: _Caller, params: dict) -> dict:
        return dict(VERSION)

    def _get_nodes(self, caller: _Caller, params: dict) -> list[dict]:
        uptime = int(time.time()) - self._boot
        return [{"node": node, "id": f"node/{node}", "type": "node", "status": "online", "level": "",
                 "maxcpu": 64, "cpu": 0.031, "maxmem": 540_950_446_080, "mem": 98_765_432_832,
                 "maxdisk": 100_861_726_720, "disk": 12_345_678_848, "uptime": uptime,
                 "ssl_fingerprint": ":".join(f"{b:02X}" for b in hashlib.sha256(node.encode()).digest())}
                for node in self.gpus]

    def _get_cluster_status(self, caller: _Caller, params: dict) -> list[dict]:
        self._check(caller, "/", "Sys.Audit")
        out: list[dict] = [{"type": "cluster", "id": "cluster", "name": self.cluster, "nodes": len(self.gpus),
                            "quorate": 1, "version": len(self.gpus) + 1}]
        for number, node in enumerate(self.gpus, start=1):
            out.append({"type": "node", "id": f"node/{node}", "name": node, "online": 1, "level": "",
                        "ip": f"127.0.0.{number}", "local": int(number == 1), "nodeid": number})
        return out

    def _get_permissions(self, caller: _Caller, params: dict) -> dict:
        userid = params.get("userid")
        if userid and userid != caller.authid:
            self._check(caller, "/access", "Sys.Audit")
            user, _, token = userid.partition("!")
            caller = _Caller(user, token or None)
        held = {p: 1 for p in sorted(self._privileges(caller))}
        if params.get("path"):
            return {params["path"]: held}
        return {path: dict(held) for path in ("/", "/access", "/nodes", "/storage", "/vms")}

    def _get_qemu_list(self, caller: _Caller, params: dict, node: str) -> list[dict]:
        self._node(node)
        full = params.get("full") in ("1", "true")
        return [self._vm_summary(vm, full=full) for vm in sorted(self._vms.values(), key=lambda v: v.vmid)
                if vm.node == node and self._may(caller, "VM.Audit")]

    @staticmethod
    def _balloon_info(vm: _Vm, maxmem: int) -> dict | None:
        """What QEMU's query-balloon answers qemu-server (bytes), None without a balloon device."""
        if str(vm.config.get("balloon", "")).strip() == "0":
            return None
        # The balloon stays deflated (actual = all its RAM): pvestatd inflates it only under host memory pressure.
        info = {"actual": maxmem, "max_mem": maxmem}
        if vm.balloon_driver:
            total = max(0, info["actual"] - GUEST_RESERVED_MIB * MIB)
            used = (vm.guest_used_mib if vm.guest_used_mib is not None else maxmem // MIB // 2) * MIB
            info.update(total_mem=total, free_mem=max(0, total - used), mem_swapped_in=0, mem_swapped_out=0,
                        major_page_faults=1873, minor_page_faults=48_213_344, last_update=int(time.time()) - 3)
        return info

    def _vm_summary(self, vm: _Vm, *, full: bool = False) -> dict:
        maxmem = int(vm.config.get("memory", "512")) * 1024 * 1024
        cpus = int(vm.config.get("cores", "1")) * int(vm.config.get("sockets", "1"))
        out = {"vmid": vm.vmid, "name": vm.config.get("name", f"VM {vm.vmid}"),
               "status": "running" if vm.running else "stopped", "cpus": cpus, "maxmem": maxmem,
               "maxdisk": 137_438_953_472, "disk": 0, "netin": 0, "netout": 0, "diskread": 0, "diskwrite": 0,
               "cpu": 0.0, "mem": 0, "uptime": 0}
        if vm.running:
            out.update(uptime=int(time.time() - vm.started_at), pid=vm.pid, cpu=vm.cpu_load,
                       mem=maxmem + QEMU_OVERHEAD_MIB * MIB, netin=1_234_567, netout=7_654_321)
            info = self._balloon_info(vm, maxmem) if full else None
            if info is not None:
                out.update(ballooninfo=info, balloon=info["actual"], maxmem=info["max_mem"])
                if "total_mem" in info:
                    out.update(mem=info["total_mem"] - info["free_mem"], freemem=info["free_mem"])
        if "tags" in vm.config:
            out["tags"] = vm.config["tags"]
        return out

    def _get_config(self, caller: _Caller, params: dict, node: str, vmid: str) -> dict:
        vm = self._vm_on(node, vmid)
        self._check(caller, f"/vms/{vm.vmid}", "VM.Audit")
        config = dict(vm.config)
        if params.get("current") not in ("1", "true"):
            config.update(vm.pending)
            for key in vm.pending_delete:
                config.pop(key, None)
        out: dict = {key: self._typed(key, value) for key, value in config.items()}
        out["digest"] = self._digest(vm)
        return out

    def _get_pending(self, caller: _Caller, params: dict, node: str, vmid: str) -> list[dict]:
        vm = self._vm_on(node, vmid)
        self._check(caller, f"/vms/{vm.vmid}", "VM.Audit")
        out = []
        for key in sorted({*vm.config, *vm.pending, *vm.pending_delete}):
            entry: dict = {"key": key}
            if key in vm.config:
                entry["value"] = self._typed(key, vm.config[key])
            if key in vm.pending:
                entry["pending"] = self._typed(key, vm.pending[key])
            if key in vm.pending_delete:
                entry["delete"] = 1
            out.append(entry)
        return out

    def _validate(self, params: dict[str, str]) -> tuple[dict[str, str], list[str]]:
        """The values to set and the keys to delete, or the 400 PVE's schema check gives."""
        errors: dict[str, str] = {}
        values: dict[str, str] = {}
        for key, value in params.items():
            if key in ("digest", "delete", "skiplock", "background_delay", "revert", "node", "vmid", "current"):
                continue
            if key not in INT_KEYS and key not in PLAIN_KEYS and not INDEXED_KEYS.match(key):
                errors[key] = NOT_IN_SCHEMA
                continue
            if key in ("cores", "sockets", "vcpus"):
                if not re.fullmatch(r"-?[0-9]+", value):
                    errors[key] = f"type check ('integer') failed - got '{value}'"
                elif int(value) < 1:
                    errors[key] = "value must have a minimum value of 1"
            elif key == "memory":
                current = _parse_property_string(value, "current").get("current", "")
                if not re.fullmatch(r"-?[0-9]+", current):
                    errors[key] = f"invalid format - type check ('integer') failed - got '{current}'"
                elif int(current) < 16:
                    errors[key] = "invalid format - value must have a minimum value of 16"
            elif key.startswith("hostpci"):
                problem = self._hostpci_problem(value)
                if problem:
                    errors[key] = f"invalid format - {problem}"
            values[key] = value
        deletes = [k.strip() for k in params.get("delete", "").replace(";", ",").split(",") if k.strip()]
        for key in deletes:
            if key in values:
                errors["delete"] = f"you can't use '-{key}' and '-delete {key}' at the same time"
            elif key not in INT_KEYS and key not in PLAIN_KEYS and not INDEXED_KEYS.match(key):
                errors["delete"] = f"invalid configuration option '{key}'"
        if errors:
            raise ApiError(400, VERIFICATION_FAILED, errors)
        return values, deletes

    @staticmethod
    def _hostpci_problem(value: str) -> str | None:
        opts = _parse_property_string(value, "host")
        unknown = sorted(set(opts) - HOSTPCI_OPTIONS)
        if unknown:
            return f"format error\n{unknown[0]}: {NOT_IN_SCHEMA}"
        if ("host" in opts) == ("mapping" in opts):
            return "format error\nhost: either 'host' or 'mapping' must be set."
        if "host" in opts and not all(_normal_pci(p) for p in opts["host"].split(";")):
            return f"format error\nhost: value does not match the regex pattern ('{opts['host']}')"
        if "mdev" in opts and not re.fullmatch(r"[^/.:]+", opts["mdev"]):
            return f"format error\nmdev: value does not match the regex pattern ('{opts['mdev']}')"
        return None

    def _check_modify(self, caller: _Caller, vm: _Vm, values: dict[str, str], deletes: list[str]) -> None:
        path = f"/vms/{vm.vmid}"
        for key in [*values, *deletes]:
            if key in CPU_KEYS:
                self._check(caller, path, "VM.Config.CPU")
            elif key in MEMORY_KEYS:
                self._check(caller, path, "VM.Config.Memory")
            elif key.startswith("hostpci") or key in ("machine", "bios", "vga", "scsihw", "usb0"):
                self._check(caller, path, "VM.Config.HWType")
            elif key.startswith(("net",)):
                self._check(caller, path, "VM.Config.Network")
            elif key.startswith(("scsi", "virtio", "sata", "ide", "efidisk", "tpmstate")):
                self._check(caller, path, "VM.Config.Disk")
            else:
                self._check(caller, path, "VM.Config.Options")
            is_root = caller.user == USERNAME and (caller.token is None or self.root_tokens_may_set_raw_pci)
            if key.startswith("hostpci") and not is_root:
                # qemu-server's check_hostpci_perm: only the user root@pam (not its tokens) may name a
                # raw PCI address, set or removed.
                value = values.get(key) or vm.pending.get(key) or vm.config.get(key, "")
                opts = _parse_property_string(value, "host")
                if "host" in opts and "mapping" not in opts:
                    raise ApiError(500, f"only root can set '{key}' config for non-mapped devices")
                if "mapping" in opts:
                    self._check(caller, f"/mapping/pci/{opts['mapping']}", "Mapping.Use")

    def _update_config(self, caller: _Caller, params: dict, node: str, vmid: str) -> _Vm:
        vm = self._vm_on(node, vmid)
        values, deletes = self._validate(params)
        self._check_modify(caller, vm, values, deletes)
        digest = params.get("digest")
        if digest and digest != self._digest(vm):
            raise ApiError(500, MODIFIED)
        for key, value in values.items():
            if vm.running and key not in FAST_PLUG_KEYS:
                vm.pending[key] = value
                if key in vm.pending_delete:
                    vm.pending_delete.remove(key)
            else:
                vm.config[key] = value
                vm.pending.pop(key, None)
        for key in deletes:
            if vm.running and key not in FAST_PLUG_KEYS:
                vm.pending.pop(key, None)
                if key in vm.config and key not in vm.pending_delete:
                    vm.pending_delete.append(key)
            else:
                vm.config.pop(key, None)
                vm.pending.pop(key, None)
        return vm

    def _post_config(self, caller: _Caller, params: dict, node: str, vmid: str) -> str:
        vm = self._update_config(caller, params, node, vmid)

        def work(task: _Task) -> None:
            with self._lock:
                task.log.append(f"update VM {vm.vmid}: " + " ".join(f"-{k} {v}" for k, v in sorted(params.items())
                                                                  if k != "digest"))

        return self._spawn(node, "qmconfig", str(vm.vmid), caller, work)

    def _put_config(self, caller: _Caller, params: dict, node: str, vmid: str) -> None:
        self._update_config(caller, params, node, vmid)
        return None

    def _get_status(self, caller: _Caller, params: dict, node: str, vmid: str) -> dict:
        vm = self._vm_on(node, vmid)
        self._check(caller, f"/vms/{vm.vmid}", "VM.Audit")
        out = self._vm_summary(vm, full=True)
        out.update(qmpstatus="running" if vm.running else "stopped", ha={"managed": 0},
                   agent=0 if vm.stubborn else 1)
        if vm.running:
            out["running-machine"] = vm.config.get("machine", "pc-q35-8.1")
            out["running-qemu"] = "8.1.5"
        return out

    def _vm_to_power(self, caller: _Caller, node: str, vmid: str) -> _Vm:
        vm = self._vm_on(node, vmid)
        self._check(caller, f"/vms/{vm.vmid}", "VM.PowerMgmt")
        return vm

    def _post_start(self, caller: _Caller, params: dict, node: str, vmid: str) -> str:
        vm = self._vm_to_power(caller, node, vmid)

        def work(task: _Task) -> None:
            with self._lock:
                if vm.running:
                    raise TaskFailed(f"VM {vm.vmid} already running")
                if vm.pending or vm.pending_delete:
                    vm.config.update(vm.pending)
                    for key in vm.pending_delete:
                        vm.config.pop(key, None)
                    vm.pending, vm.pending_delete = {}, []
                plan = self._plan_instances(vm)
                if isinstance(plan, str):
                    raise TaskFailed(plan)
                for instance in plan:
                    task.log.append(f"creating mdev {instance.uuid} of type {instance.type} on {instance.pci}")
                self._power_on(vm, plan)

        return self._spawn(node, "qmstart", str(vm.vmid), caller, work)

    def _post_stop(self, caller: _Caller, params: dict, node: str, vmid: str) -> str:
        vm = self._vm_to_power(caller, node, vmid)

        def work(task: _Task) -> None:
            with self._lock:
                if vm.running:
                    self._power_off(vm)

        return self._spawn(node, "qmstop", str(vm.vmid), caller, work)

    def _post_shutdown(self, caller: _Caller, params: dict, node: str, vmid: str) -> str:
        vm = self._vm_to_power(caller, node, vmid)
        timeout_text = params.get("timeout", "")
        if timeout_text and not re.fullmatch(r"[0-9]+", timeout_text):
            raise ApiError(400, VERIFICATION_FAILED,
                           {"timeout": f"type check ('integer') failed - got '{timeout_text}'"})
        timeout_s = float(timeout_text) if timeout_text else DEFAULT_SHUTDOWN_TIMEOUT_S
        force = params.get("forceStop") in ("1", "true")

        def work(task: _Task) -> None:
            with self._lock:
                if not vm.running:
                    return
                delay_s = None if vm.stubborn else vm.shutdown_delay_s
            deadline = time.monotonic() + timeout_s
            if delay_s is not None and delay_s <= timeout_s:
                if self._closing.wait(delay_s):
                    raise TaskFailed("interrupted by signal")
                with self._lock:
                    if vm.running:
                        self._power_off(vm)
                return
            if self._closing.wait(max(deadline - time.monotonic(), 0.0)):
                raise TaskFailed("interrupted by signal")
            with self._lock:
                if not vm.running:
                    return
                if not force:
                    raise TaskFailed("VM quit/powerdown failed - got timeout")
                task.log.append("VM still running - terminating now with SIGTERM")
                self._power_off(vm)

        return self._spawn(node, "qmshutdown", str(vm.vmid), caller, work, background=True)

    def _post_migrate(self, caller: _Caller, params: dict, node: str, vmid: str) -> str:
        vm = self._vm_on(node, vmid)
        target = params.get("target", "")
        if not target:
            raise ApiError(400, VERIFICATION_FAILED, {"target": "property is missing and it is not optional"})
        self._check(caller, f"/vms/{vm.vmid}", "VM.Migrate")
        if target not in self.gpus:
            raise ApiError(500, f"no such cluster node '{target}'")
        if target == node:
            raise ApiError(500, "target is local node.")
        online = params.get("online") in ("1", "true")
        if vm.running and not online:
            raise ApiError(500, "can't migrate running VM without --online")

        def work(task: _Task) -> None:
            with self._lock:
                local = [k for k in sorted(vm.config) if k.startswith("hostpci")
                         and "mapping" not in _parse_property_string(vm.config[k], "host")]
                if local:
                    raise TaskFailed(f"can't migrate VM which uses local devices: {', '.join(local)}")
                mapped = [k for k in sorted(vm.config) if k.startswith("hostpci")]
                if vm.running and mapped:
                    raise TaskFailed(f"can't migrate running VM which uses mapped devices: {', '.join(mapped)}")
                task.log.append(f"starting migration of VM {vm.vmid} to node '{target}' (127.0.0.1)")
                vm.node = target
                for instance in self._instances:
                    if instance.vmid == vm.vmid:
                        instance.node = target
                task.log.append("migration finished successfully")

        return self._spawn(node, "qmigrate", str(vm.vmid), caller, work)

    def _get_pci(self, caller: _Caller, params: dict, node: str) -> list[dict]:
        self._node(node)
        self._check(caller, "/", "Sys.Audit", "Sys.Modify", any_of=True)
        devices = [{"id": NIC_BUS_ID, "class": "0x020000", "vendor": "0x8086", "vendor_name": "Intel Corporation",
                    "device": "0x1572", "device_name": "Ethernet Controller X710 for 10GbE SFP+",
                    "subsystem_vendor": "0x8086", "subsystem_device": "0x0000", "iommugroup": 4},
                   {"id": NVME_BUS_ID, "class": "0x010802", "vendor": "0x144d",
                    "vendor_name": "Samsung Electronics Co Ltd", "device": "0xa808",
                    "device_name": "NVMe SSD Controller SM981/PM981/PM983", "subsystem_vendor": "0x144d",
                    "subsystem_device": "0xa801", "iommugroup": 5}]
        for group, pci in enumerate(self.gpus[node], start=12):
            devices.append({"id": pci, "class": "0x030200", "vendor": "0x10de", "vendor_name": "NVIDIA Corporation",
                            "device": "0x1eb8", "device_name": "TU104GL [Tesla T4]", "subsystem_vendor": "0x10de",
                            "subsystem_vendor_name": "NVIDIA Corporation", "subsystem_device": "0x12a2",
                            "subsystem_device_name": "", "iommugroup": group, "mdev": 1})
        for group, gpu in enumerate(self.sriov.get(node, {}).values(), start=40):
            common = {"class": "0x030200", "vendor": "0x10de", "vendor_name": "NVIDIA Corporation",
                      "device": gpu.device, "device_name": gpu.device_name, "subsystem_vendor": "0x10de",
                      "subsystem_vendor_name": "NVIDIA Corporation", "subsystem_device": "0x1851",
                      "subsystem_device_name": ""}
            # The PF offers no mdev types in this layout: PVE lists it without "mdev".
            devices.append({"id": gpu.pf, **common, "iommugroup": group * 100})
            devices += [{"id": vf, **common, "iommugroup": group * 100 + n, "mdev": 1}
                        for n, vf in enumerate(gpu.vfs, start=1)]
        return sorted(devices, key=lambda d: d["id"])

    def _get_mdev(self, caller: _Caller, params: dict, node: str, pciid: str) -> list[dict]:
        self._node(node)
        self._check(caller, "/", "Sys.Audit", "Sys.Modify", any_of=True)
        pci = _normal_pci(pciid)
        if pci is None:
            raise ApiError(400, VERIFICATION_FAILED, {"pci-id-or-mapping": "value does not match the regex pattern"})
        if pci in (NIC_BUS_ID, NVME_BUS_ID):
            raise ApiError(500, f"Device '{pci}' does not support mediated devices")
        sriov = self._sriov_gpu_of(node, pci)
        if sriov is not None and pci == sriov.pf:
            return []
        if sriov is not None:
            # get_mdev_types on a VF: one entry per line of nvidia/creatable_vgpu_types, each with
            # available 1 and no description; a PF has neither file and lists nothing.
            return [{"type": type_id, "name": sriov.types[type_id][0], "description": "", "available": 1}
                    for type_id in self._creatable(node, pci)]
        if pci not in self.gpus[node]:
            raise ApiError(500, f"no PCI device found for '{pci}'")
        return [{"type": type_id, "name": name, "available": self._available(node, pci, type_id),
                 "description": f"num_heads=4, frl_config=60, framebuffer={fb // 1024 * 1024}M, "
                                f"max_resolution=5120x2880, max_instance={T4_FB_MIB // fb}"}
                for type_id, (name, fb) in T4_TYPES.items()]

    def _task_on(self, caller: _Caller, node: str, upid: str) -> _Task:
        self._node(node)
        if not re.fullmatch(r"UPID:[^:]+:[0-9A-F]{8}:[0-9A-F]{8,9}:[0-9A-F]{8}:[^:]*:[^:]*:[^:]+:", upid):
            raise ApiError(400, VERIFICATION_FAILED, {"upid": "unable to parse worker upid"})
        task = self._tasks.get(upid)
        if task is None or task.node != node:
            raise ApiError(500, "no such task")
        if task.user != caller.authid and task.user.partition("!")[0] != caller.user:
            self._check(caller, f"/nodes/{node}", "Sys.Audit")
        return task

    def _get_task_status(self, caller: _Caller, params: dict, node: str, upid: str) -> dict:
        task = self._task_on(caller, node, upid)
        user, _, token = task.user.partition("!")
        out = {"upid": task.upid, "node": task.node, "pid": task.pid, "pstart": task.pstart,
               "starttime": task.starttime, "type": task.type, "id": task.id, "user": user,
               "status": task.status}
        if token:
            out["tokenid"] = token
        if task.status == "stopped":
            out["exitstatus"] = task.exitstatus
        return out

    def _get_task_log(self, caller: _Caller, params: dict, node: str, upid: str) -> list[dict]:
        task = self._task_on(caller, node, upid)
        lines = list(task.log) or ["no content"]
        return [{"n": n, "t": line} for n, line in enumerate(lines, start=1)]


class _Server(http.server.ThreadingHTTPServer):
    daemon_threads = True
    fake: PveFake

    def handle_error(self, request, client_address) -> None:  # noqa: ANN001 (socketserver's signature)
        """Say nothing of a client that drops the connection or refuses the certificate (the
        "certificate not trusted" tests do that on purpose)."""


class _Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server_version = "pve-api-daemon/3.0"
    sys_version = ""
    server: _Server

    def log_message(self, format: str, *args: object) -> None:  # noqa: A002 (the base class's name)
        """Requests are recorded in PveFake.requests instead of printed."""

    def do_GET(self) -> None:  # noqa: N802 (http.server's naming)
        self._serve("GET")

    def do_POST(self) -> None:  # noqa: N802
        self._serve("POST")

    def do_PUT(self) -> None:  # noqa: N802
        self._serve("PUT")

    def do_DELETE(self) -> None:  # noqa: N802
        self._serve("DELETE")

    def _params(self, method: str, query: str) -> dict[str, str]:
        params: dict[str, str] = {}
        length = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(length) if length else b""
        if body and method in ("POST", "PUT"):
            if (self.headers.get("Content-Type") or "").startswith("application/json"):
                params.update({k: v if isinstance(v, str) else json.dumps(v) if isinstance(v, (dict, list))
                               else str(int(v)) if isinstance(v, bool) else str(v)
                               for k, v in json.loads(body).items()})
            else:
                params.update(parse_qsl(body.decode(), keep_blank_values=True))
        params.update(parse_qsl(query, keep_blank_values=True))
        params.pop("_dc", None)
        return params

    def _serve(self, method: str) -> None:
        fake = self.server.fake
        url = urlsplit(self.path)
        path = url.path
        user = "-"
        try:
            params = self._params(method, url.query)
            if not path.startswith(API_PREFIX + "/") and path != API_PREFIX:
                raise ApiError(501, "no such uri", bare=True)
            rel = path[len(API_PREFIX):] or "/"
            if rel.rstrip("/") == "/access/ticket" and method == "POST":
                data = fake.login(params)
                user = data["username"]
            else:
                headers = {k.lower(): v for k, v in self.headers.items()}
                caller = fake.authenticate(method, headers)
                user = caller.authid
                data = fake.dispatch(method, rel, params, caller)
            self._answer(200, "OK", json.dumps({"data": data}).encode())
            status = 200
        except ApiError as exc:
            status = exc.status
            if exc.status == 401 and fake.unauthorized_delay_s:
                time.sleep(fake.unauthorized_delay_s)
            if exc.bare:
                body = b""
            else:
                payload: dict = {"data": None, "message": exc.message + "\n"}
                if exc.errors:
                    payload["errors"] = exc.errors
                body = json.dumps(payload).encode()
            self._answer(exc.status, exc.message.splitlines()[0], body)
        with contextlib.suppress(Exception):
            fake.requests.append((method, path, status, user))

    def _answer(self, status: int, reason: str, body: bytes) -> None:
        self.send_response(status, reason)
        if body:
            self.send_header("Content-Type", "application/json;charset=UTF-8")
        self.send_header("Content-Length", str(len(body)))
        self.send_header("Cache-Control", "max-age=0")
        self.send_header("Pragma", "no-cache")
        if status >= 400:
            self.send_header("Connection", "close")
            self.close_connection = True
        else:
            self.send_header("Connection", "Keep-Alive")
        self.end_headers()
        self.wfile.write(body)

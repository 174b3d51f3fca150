"""vGPU instances on this host, read and written through the kernel's sysfs, in both NVIDIA layouts.

Why the agent does this at all: libvirt's node-device API creates mediated devices only where the
host's libvirt supports it, and it has no word for the SR-IOV layout of vGPU 17+. The dashboard
then asks the agent (POST/DELETE /v1/vgpu-devices, with the separate device token), and the agent
writes the same sysfs files an admin would.

The two layouts (docs/operations.md, "Creating and removing vGPUs through the agent"):

- mdev (vGPU up to 16, and older GPUs): each GPU is `/sys/class/mdev_bus/<BDF>`; its types are
  `mdev_supported_types/nvidia-<N>/` with `name`, `description`, `available_instances`,
  `device_api` and a write-only `create`. Writing a new UUID to `create` makes
  `/sys/bus/mdev/devices/<uuid>` (its `mdev_type` link names the type); writing 1 to its
  `remove` deletes it, and the kernel answers EBUSY while a VM uses it.
- SR-IOV (vGPU 17+ on Ada, Hopper and newer): the GPU (physical function) has virtual functions
  (`virtfnN` links; each VF a `physfn` link back); each VF has `nvidia/creatable_vgpu_types`
  (lines `1414 : NVIDIA H200X-1-18C` under a header, shrinking as the card fills) and
  `nvidia/current_vgpu_type` (0 = none). Writing a type id to a free VF makes it that vGPU;
  writing 0 deletes it.

Type ids differ between GPU models and driver releases, so a type is always asked for by its
NAME and its id is read from the host at that moment; nothing here knows a type number.

What the kernel does not say, and so what this module cannot say either: in the SR-IOV layout
no file holds a count of instances left, only which types each free VF can still take. The
`available` of an SR-IOV type is therefore the number of free VFs offering it: an upper bound
(a card with room for one more 24Q still lists it on every free VF). A create the card cannot
take is refused by the kernel and answered as "no available instance" all the same.

After a write the result is confirmed by reading the state back (the device appeared or went,
the VF holds the type or 0), waiting up to `settle_s` for it: a kernel applies these writes
before the write returns, but a driver (or the emulated tree of the tests and the demo) that
applies them a moment later must not be reported as having done what it did not. A device still
there after its removal was asked for is in use (the kernel's EBUSY, seen late). An SR-IOV VF
reads back the id just written whether or not the driver took it, so it is read once more after
`confirm_s` (50 ms, once per create): a driver that undid it by then refused it.

Stdlib only: the agent runs on hypervisor hosts without Django.
"""

from __future__ import annotations

import errno
import os
import re
import threading
import time
import uuid as uuid_module
from dataclasses import asdict, dataclass
from pathlib import Path

MDEV = "mdev"  # the same words as hypervisors.backends.base.DeviceKind
VF = "vf"
NVIDIA_VENDOR = "0x10de"
MAX_TYPE_NAME = 100

_BUS_ID = re.compile(r"(?:([0-9a-fA-F]{1,8}):)?([0-9a-fA-F]{2}):([0-1][0-9a-fA-F])\.([0-7])")
_UUID = re.compile(r"[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}")
_CREATABLE_LINE = re.compile(r"\s*(\d+)\s*:\s*(\S.*?)\s*")
# Errors a kernel gives a create it has no room for: mdev core's EUSERS (available_instances is
# 0), and what vendor drivers answer for the same (no space, over quota).
_FULL_ERRNOS = {errno.EUSERS, errno.ENOSPC, errno.EDQUOT}


class DeviceRefused(Exception):
    """Nothing was changed; `status` is the agent's HTTP answer and `reason` the word the
    dashboard maps to its errors (no_gpu, no_type, no_instance, busy, no_device, bad_request,
    kernel)."""

    def __init__(self, status: int, reason: str, message: str):
        super().__init__(message)
        self.status = status
        self.reason = reason
        self.message = message

    def as_document(self) -> dict[str, str]:
        return {"error": self.message, "reason": self.reason}


def bus_id(text: str) -> str | None:
    """`text` as NVML and the dashboard spell a PCI address (`00000000:3B:00.0`), whichever way
    it came (sysfs' `0000:3b:00.0`, `3b:00.0`); None when it is not one."""
    match = _BUS_ID.fullmatch(text.strip()) if isinstance(text, str) and text.isascii() else None
    if match is None:
        return None
    domain, bus, device, function = match.groups()
    return f"{int(domain or '0', 16):08X}:{bus.upper()}:{device.upper()}.{function}"


@dataclass(frozen=True)
class VgpuTypeOffer:
    """A vGPU type a GPU offers now (`available` more instances; an upper bound for SR-IOV)."""

    gpu: str
    layout: str  # MDEV or VF
    id: str  # "nvidia-233" (mdev) or "1414" (SR-IOV), as the host names it now
    name: str
    available: int

    def as_document(self) -> dict:
        return asdict(self)


@dataclass(frozen=True)
class VgpuInstance:
    """A vGPU that exists: an mdev (id: its UUID) or a VF holding a type (id: the VF's address)."""

    kind: str  # MDEV or VF
    id: str
    gpu: str
    type: str  # the type's name; "" when the host no longer says it (see HostSysfs._vf_names)
    type_id: str

    def as_document(self) -> dict:
        return asdict(self)


@dataclass
class _Vf:
    path: Path
    address: str  # NVML spelling
    gpu: str
    current: int
    creatable: list[tuple[str, str]]  # (id, name), in the order the driver lists them


class HostSysfs:
    """The host's vGPU devices under `root` (the real `/`, or a test's tree).

    Writes are serialized: two creates at once could pick the same free VF, or both pass the
    available_instances check for the last slot.
    """

    def __init__(self, root: str | os.PathLike = "/", *, settle_s: float = 2.0, confirm_s: float = 0.05,
                 poll_s: float = 0.005):
        self.root = Path(root)
        self.settle_s = settle_s
        self.confirm_s = confirm_s
        self.poll_s = poll_s
        self._lock = threading.Lock()
        # SR-IOV names by type id, remembered from the lists seen: a VF holding a type lists
        # nothing, and neither does any VF of a full card, yet its vGPU should keep its name.
        self._vf_names: dict[str, str] = {}

    # -- reading --------------------------------------------------------------------------------

    def offers(self) -> list[VgpuTypeOffer]:
        """Every vGPU type of every GPU: all supported types of an mdev GPU (available 0
        included), the types a free VF still lists for an SR-IOV GPU. Ordered by GPU, then as
        the host lists them."""
        result = []
        for gpu, types in self._mdev_gpus():
            for type_dir in types:
                available = _read_int(type_dir / "available_instances")
                result.append(VgpuTypeOffer(gpu, MDEV, type_dir.name, _read(type_dir / "name"), available))
        for gpu, vfs in self._sriov_gpus():
            counts: dict[tuple[str, str], int] = {}
            for vf in vfs:
                if vf.current == 0:
                    for offer in vf.creatable:
                        counts[offer] = counts.get(offer, 0) + 1
            result.extend(VgpuTypeOffer(gpu, VF, type_id, name, count) for (type_id, name), count in counts.items())
        return result

    def gpu_addresses(self) -> list[str]:
        """Every GPU that can hold vGPUs, in either layout."""
        return [gpu for gpu, _ in self._mdev_gpus()] + [gpu for gpu, _ in self._sriov_gpus()]

    def instances(self) -> list[VgpuInstance]:
        """Every vGPU that exists now: mdevs by UUID, then VFs holding a type, by address."""
        result = [self._mdev_instance(path) for path in self._mdev_paths()]
        for _, vfs in self._sriov_gpus():
            result.extend(self._vf_instance(vf) for vf in vfs if vf.current != 0)
        return [item for item in result if item is not None]

    # -- writing --------------------------------------------------------------------------------

    def create(self, gpu: str, type_name: str, device_id: str = "") -> VgpuInstance:
        """One new vGPU of the type named `type_name` on `gpu` (any PCI spelling), or DeviceRefused:
        404 no_gpu / no_type, 409 no_instance (or an mdev `device_id` that exists), 500 kernel.
        `device_id`: the UUID of the new mdev (a fresh one when empty; the SR-IOV layout picks
        its own VF)."""
        address = bus_id(gpu)
        if address is None:
            raise DeviceRefused(400, "bad_request", f"gpu {gpu!r} is not a PCI address (e.g. 00000000:3B:00.0)")
        with self._lock:
            for found, types in self._mdev_gpus():
                if found == address:
                    return self._create_mdev(address, types, type_name, device_id)
            for found, vfs in self._sriov_gpus():
                if found == address:
                    return self._create_vf(address, vfs, type_name)
        known = ", ".join(self.gpu_addresses()) or "none"
        raise DeviceRefused(404, "no_gpu", f"no GPU {address} offers vGPUs on this host (GPUs that do: {known})")

    def remove(self, device_id: str) -> None:
        """Remove the vGPU `device_id` (mdev UUID or VF address), or DeviceRefused: 404 no_device,
        409 busy (a VM uses it), 500 kernel."""
        with self._lock:
            if _UUID.fullmatch(device_id.strip()):
                path = self.root / "sys/bus/mdev/devices" / device_id.strip().lower()
                if path.exists():
                    self._remove_mdev(path)
                    return
            else:
                address = bus_id(device_id)
                for _, vfs in self._sriov_gpus():
                    for vf in vfs:
                        if vf.address == address and vf.current != 0:
                            self._remove_vf(vf)
                            return
        raise DeviceRefused(404, "no_device", f"no vGPU {device_id} on this host")

    # -- mdev -----------------------------------------------------------------------------------

    def _mdev_gpus(self) -> list[tuple[str, list[Path]]]:
        bus = self.root / "sys/class/mdev_bus"
        gpus = []
        for entry in _listdir(bus):
            address = bus_id(entry.name)
            vendor = entry / "vendor"
            if address is None or (vendor.exists() and _read(vendor).lower() != NVIDIA_VENDOR):
                continue  # another vendor's mediated devices (Intel GVT-g, s390 AP...)
            types = [t for t in _listdir(entry / "mdev_supported_types") if (t / "name").exists()]
            gpus.append((address, types))
        return gpus

    def _mdev_paths(self) -> list[Path]:
        return [path for path in _listdir(self.root / "sys/bus/mdev/devices") if _UUID.fullmatch(path.name)]

    def _mdev_instance(self, path: Path) -> VgpuInstance | None:
        try:
            type_dir = (path / "mdev_type").resolve(strict=True)
        except OSError:
            return None  # removed while listing
        gpu = bus_id(type_dir.parent.parent.name) or ""
        return VgpuInstance(MDEV, path.name.lower(), gpu, _read(type_dir / "name"), type_dir.name)

    def _create_mdev(self, gpu: str, types: list[Path], type_name: str, device_id: str = "") -> VgpuInstance:
        type_dir = next((t for t in types if _read(t / "name") == type_name), None)
        if type_dir is None:
            offered = ", ".join(_read(t / "name") for t in types) or "none"
            raise DeviceRefused(404, "no_type", f"GPU {gpu} offers no vGPU type named {type_name!r} "
                                                f"(it offers: {offered})")
        if _read_int(type_dir / "available_instances") <= 0:
            raise DeviceRefused(409, "no_instance", _full_message(gpu, type_name, self._mdev_held(gpu)))
        new = device_id or str(uuid_module.uuid4())
        if (self.root / "sys/bus/mdev/devices" / new).exists():
            raise DeviceRefused(409, "exists", f"a vGPU {new} exists already")
        try:
            _write(type_dir / "create", new)
        except OSError as exc:
            if exc.errno in _FULL_ERRNOS:
                raise DeviceRefused(409, "no_instance", _full_message(gpu, type_name, self._mdev_held(gpu))) from None
            raise DeviceRefused(500, "kernel", f"the kernel refused to create a {type_name} on {gpu}: "
                                               f"{exc.strerror or exc}") from None
        path = self.root / "sys/bus/mdev/devices" / new
        if not self._settle(path.exists):
            raise DeviceRefused(500, "kernel", f"the kernel took the request for a {type_name} on {gpu}, but no "
                                               f"device {new} appeared within {self.settle_s:g} s")
        return VgpuInstance(MDEV, new, gpu, type_name, type_dir.name)

    def _mdev_held(self, gpu: str) -> list[str]:
        return [item.type for item in map(self._mdev_instance, self._mdev_paths()) if item and item.gpu == gpu]

    def _remove_mdev(self, path: Path) -> None:
        try:
            _write(path / "remove", "1")
        except FileNotFoundError:
            return  # gone meanwhile: what was asked
        except OSError as exc:
            if exc.errno == errno.EBUSY:
                raise DeviceRefused(409, "busy", _busy_message(path.name)) from None
            raise DeviceRefused(500, "kernel", f"the kernel refused to remove vGPU {path.name}: "
                                               f"{exc.strerror or exc}") from None
        if not self._settle(lambda: not path.exists()):
            raise DeviceRefused(409, "busy", _busy_message(path.name))

    # -- SR-IOV ---------------------------------------------------------------------------------

    def _sriov_gpus(self) -> list[tuple[str, list[_Vf]]]:
        """Each SR-IOV GPU (physical function) with its VFs that have the NVIDIA vGPU files."""
        gpus: dict[str, list[_Vf]] = {}
        for path in _listdir(self.root / "sys/bus/pci/devices"):
            current = path / "nvidia/current_vgpu_type"
            address = bus_id(path.name)
            if address is None or not current.exists():
                continue
            try:
                parent = bus_id((path / "physfn").resolve(strict=True).name)
            except OSError:
                continue
            if parent is None:
                continue
            creatable = _parse_creatable(_read(path / "nvidia/creatable_vgpu_types"))
            self._vf_names.update(creatable)
            gpus.setdefault(parent, []).append(_Vf(path, address, parent, _read_int(current), creatable))
        for vfs in gpus.values():
            vfs.sort(key=lambda vf: vf.address)
        return sorted(gpus.items())

    def _vf_instance(self, vf: _Vf) -> VgpuInstance:
        type_id = str(vf.current)
        return VgpuInstance(VF, vf.address, vf.gpu, self._vf_names.get(type_id, ""), type_id)

    def _create_vf(self, gpu: str, vfs: list[_Vf], type_name: str) -> VgpuInstance:
        free = [vf for vf in vfs if vf.current == 0]
        chosen = next((vf for vf in free for _, name in vf.creatable if name == type_name), None)
        held = [self._vf_names.get(str(vf.current), str(vf.current)) for vf in vfs if vf.current != 0]
        if chosen is None:
            if not held:
                offered = sorted({name for vf in free for _, name in vf.creatable})
                raise DeviceRefused(404, "no_type", f"GPU {gpu} offers no vGPU type named {type_name!r} "
                                                    f"(it offers: {', '.join(offered) or 'none'})")
            # A GPU holding vGPUs lists only what still fits: the name may be a real type that
            # no longer fits (another size lives there, or the card is full).
            raise DeviceRefused(409, "no_instance", _full_message(gpu, type_name, held))
        type_id = next(type_id for type_id, name in chosen.creatable if name == type_name)
        current = chosen.path / "nvidia/current_vgpu_type"
        try:
            _write(current, type_id)
        except OSError as exc:
            if exc.errno in _FULL_ERRNOS | {errno.EINVAL, errno.EBUSY}:
                raise DeviceRefused(409, "no_instance", _full_message(gpu, type_name, held)) from None
            raise DeviceRefused(500, "kernel", f"the kernel refused to make VF {chosen.address} a {type_name}: "
                                               f"{exc.strerror or exc}") from None
        taken = self._settle(lambda: _read(current) == type_id)
        if taken:
            time.sleep(self.confirm_s)
        if not taken or _read(current) != type_id:
            raise DeviceRefused(409, "no_instance", f"VF {chosen.address} of GPU {gpu} did not take type "
                                                    f"{type_name}: GPU {gpu} has no room for it now")
        return VgpuInstance(VF, chosen.address, gpu, type_name, type_id)

    def _remove_vf(self, vf: _Vf) -> None:
        current = vf.path / "nvidia/current_vgpu_type"
        try:
            _write(current, "0")
        except OSError as exc:
            if exc.errno == errno.EBUSY:
                raise DeviceRefused(409, "busy", _busy_message(vf.address)) from None
            raise DeviceRefused(500, "kernel", f"the kernel refused to remove vGPU {vf.address}: "
                                               f"{exc.strerror or exc}") from None

        def answered() -> bool:
            # Freed, the VF lists again at least the type it held; a driver that kept the vGPU
            # (in use) reads its type again.
            value = _read(current)
            return value not in ("", "0") or (
                value == "0" and bool(_parse_creatable(_read(vf.path / "nvidia/creatable_vgpu_types"))))

        self._settle(answered)
        if _read(current) != "0":
            raise DeviceRefused(409, "busy", _busy_message(vf.address))

    # -- helpers --------------------------------------------------------------------------------

    def _settle(self, done) -> bool:
        """Whether `done()` holds now or becomes true within settle_s."""
        deadline = time.monotonic() + self.settle_s
        while not done():
            if time.monotonic() >= deadline:
                return False
            time.sleep(self.poll_s)
        return True


def _full_message(gpu: str, type_name: str, held: list[str]) -> str:
    if not held:
        return f"GPU {gpu} has no room for another {type_name}"
    counted = ", ".join(f"{held.count(name)} x {name or 'unknown type'}" for name in sorted(set(held)))
    return f"GPU {gpu} has no room for another {type_name}: it holds {counted}"


def _busy_message(device_id: str) -> str:
    return f"vGPU {device_id} is in use (a running VM holds it): shut the VM down first"


def _parse_creatable(text: str) -> list[tuple[str, str]]:
    """(id, name) of each line `1414 : NVIDIA H200X-1-18C`; the header (`ID : vGPU Name`) and
    blank lines are skipped."""
    result = []
    for line in text.splitlines():
        match = _CREATABLE_LINE.fullmatch(line)
        if match:
            result.append((str(int(match[1])), match[2]))
    return result


def _listdir(path: Path) -> list[Path]:
    try:
        return sorted(path.iterdir())
    except OSError:
        return []


def _read(path: Path) -> str:
    """A sysfs attribute's value, stripped; "" when it is gone or unreadable."""
    try:
        return path.read_text(encoding="utf-8", errors="replace").strip()
    except OSError:
        return ""


def _read_int(path: Path) -> int:
    text = _read(path)
    return int(text) if text.isdigit() else 0


def _write(path: Path, value: str) -> None:
    """One write of `value` to a sysfs attribute: the kernel acts on each write() call, so the
    value goes out whole, unbuffered, and its error (EBUSY...) comes back from here."""
    fd = os.open(path, os.O_WRONLY | os.O_TRUNC)
    try:
        os.write(fd, value.encode())
    finally:
        os.close(fd)

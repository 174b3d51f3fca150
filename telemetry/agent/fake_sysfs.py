"""A host's NVIDIA vGPU sysfs, built under a folder, and a small kernel that makes it behave.

For tests and the demo only: the agent's own code (`vgpu_devices.py`) never imports this; it is
pointed at the folder with --sysfs-root as it would be at `/`.

`build_mdev_host(root, gpus)` and `build_sriov_host(root, gpus)` lay out the files of
/work/shared/reference/test-harness.md ("NVIDIA vGPU on the host's sysfs"): the mdev layout
(vGPU up to 16) and the SR-IOV layout of vGPU 17+ (virtual functions with
`nvidia/creatable_vgpu_types` and `nvidia/current_vgpu_type`), with real-looking type ids and
names (`T4`, `L40S`, `RTX6000`, `H200` below).

Writing a plain file does nothing by itself, so `KernelEmulator` plays the kernel: a thread
that looks at every `create`, `remove` and `current_vgpu_type` every few milliseconds and makes
instances appear and go, and keeps `available_instances` and `creatable_vgpu_types` as a driver
in equal-size mode does (once a GPU holds one frame-buffer size, other sizes are 0 / unlisted;
a full GPU lists nothing). `hold(device_id)` stands for a running VM using a vGPU: a removal of
it is undone (the device stays, as the kernel's EBUSY leaves it). It applies a write a moment
after it lands, unlike a kernel, so a test calls `settle()` before reading what followed from it.

    python -m telemetry.agent.fake_sysfs DIR --layout sriov --gpu L40S:0000:41:00.0

builds DIR and runs the emulator until interrupted (for trying the agent by hand).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import re
import threading
import time
from dataclasses import dataclass
from pathlib import Path

UUID_TEXT = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")
CREATABLE_HEADER = "ID    : vGPU Name"


@dataclass(frozen=True)
class FakeType:
    """One vGPU type of a GPU model: the host's id for it, its name and frame buffer."""

    type_id: str  # "nvidia-233" (mdev) or "1155" (SR-IOV)
    name: str
    fb_mib: int
    max_instances: int
    heads: int = 4


@dataclass(frozen=True)
class FakeGpu:
    """A physical GPU: its sysfs address (`0000:3b:00.0`) and the types it offers."""

    address: str
    types: tuple[FakeType, ...]


def _q_types(board: str, prefix: str, fb_total_gib: int, sizes_gib: tuple[int, ...], first_id: int,
             mdev: bool) -> tuple[FakeType, ...]:
    """Q types of a board, one id after another from `first_id` (as drivers number them)."""
    return tuple(
        FakeType(f"nvidia-{first_id + n}" if mdev else str(first_id + n), f"{prefix}{board}-{size}Q", size * 1024,
                 fb_total_gib // size)
        for n, size in enumerate(sizes_gib))


# Models as the vGPU 16 (mdev) and 17+ (SR-IOV) drivers show them. The ids are examples of what
# a host answers; the code under test reads them and must work whatever they are.
T4_MDEV = _q_types("T4", "GRID ", 16, (1, 2, 4, 8, 16), 230, mdev=True)
RTX6000_MDEV = _q_types("RTX6000", "GRID ", 24, (1, 2, 3, 4, 6, 8, 12, 24), 256, mdev=True)
L40S_MDEV = _q_types("L40S", "NVIDIA ", 48, (1, 2, 3, 4, 6, 8, 12, 16, 24, 48), 1176, mdev=True)
L40S_SRIOV = _q_types("L40S", "NVIDIA ", 48, (1, 2, 3, 4, 6, 8, 12, 16, 24, 48), 1155, mdev=False)
H200_SRIOV = (
    FakeType("1414", "NVIDIA H200X-1-18C", 18 * 1024, 7, heads=0),
    FakeType("1415", "NVIDIA H200X-2-35C", 35 * 1024, 3, heads=0),
    FakeType("1423", "NVIDIA H200X-141C", 141 * 1024, 1, heads=0),
)
MODELS = {"T4": T4_MDEV, "RTX6000": RTX6000_MDEV, "L40S": L40S_SRIOV, "L40S-mdev": L40S_MDEV, "H200": H200_SRIOV}


# -- building the trees ---------------------------------------------------------------------------

def _put(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text + "\n" if text else "", encoding="utf-8")


def _link(link: Path, target: Path) -> None:
    """A relative symlink, as sysfs has them."""
    link.parent.mkdir(parents=True, exist_ok=True)
    link.symlink_to(os.path.relpath(target, link.parent))


def _pci_device(root: Path, address: str) -> Path:
    """The device's folder under /sys/devices, linked from /sys/bus/pci/devices."""
    folder = root / "sys/devices/pci0000:00" / address
    folder.mkdir(parents=True, exist_ok=True)
    _put(folder / "vendor", "0x10de")
    _link(root / "sys/bus/pci/devices" / address, folder)
    return folder


def build_mdev_host(root: str | os.PathLike, gpus: list[FakeGpu]) -> Path:
    """The mdev layout for `gpus` under `root`; returns `root`."""
    root = Path(root)
    (root / "sys/bus/mdev/devices").mkdir(parents=True, exist_ok=True)
    for gpu in gpus:
        folder = _pci_device(root, gpu.address)
        for kind in gpu.types:
            type_dir = folder / "mdev_supported_types" / kind.type_id
            _put(type_dir / "name", kind.name)
            _put(type_dir / "description", f"num_heads={kind.heads}, frl_config=60, framebuffer={kind.fb_mib}M, "
                                            f"max_resolution=7680x4320, max_instance={kind.max_instances}")
            _put(type_dir / "available_instances", str(kind.max_instances))
            _put(type_dir / "device_api", "vfio-pci")
            _put(type_dir / "create", "")
            (type_dir / "devices").mkdir()
        _link(root / "sys/class/mdev_bus" / gpu.address, folder)
    return root


def vf_address(pf_address: str, n: int) -> str:
    """The address of a GPU's VF number `n` (0-based): functions from .4 on, as on an L40S."""
    domain, bus, rest = pf_address.split(":")
    devfn = int(rest.split(".")[0], 16) * 8 + 4 + n
    return f"{domain}:{bus}:{devfn // 8:02x}.{devfn % 8}"


def build_sriov_host(root: str | os.PathLike, gpus: list[FakeGpu], vfs_per_gpu: int = 16) -> Path:
    """The SR-IOV layout (VFs already enabled, as `sriov-manage -e` leaves them); returns `root`."""
    root = Path(root)
    for gpu in gpus:
        pf = _pci_device(root, gpu.address)
        _put(pf / "sriov_totalvfs", str(vfs_per_gpu))
        _put(pf / "sriov_numvfs", str(vfs_per_gpu))
        for n in range(vfs_per_gpu):
            vf = _pci_device(root, vf_address(gpu.address, n))
            _link(vf / "physfn", pf)
            _link(pf / f"virtfn{n}", vf)
            _put(vf / "nvidia/current_vgpu_type", "0")
            _put(vf / "nvidia/creatable_vgpu_types", _creatable_text(gpu.types))
    return root


def _creatable_text(types) -> str:
    return "\n".join([CREATABLE_HEADER, *(f"{kind.type_id:<6}: {kind.name}" for kind in types)])


# -- the emulated kernel --------------------------------------------------------------------------

class KernelEmulator:
    """Makes a built tree behave (see the module doc). Use as a context manager, or start()/stop()."""

    def __init__(self, root: str | os.PathLike, gpus: list[FakeGpu], *, poll_s: float = 0.002):
        self.root = Path(root)
        self.gpus = {gpu.address: gpu for gpu in gpus}
        self.poll_s = poll_s
        self.held: set[str] = set()
        self.refused: list[str] = []  # what it did not do, in words, for a test to look at
        self._vf_types: dict[str, dict[str, FakeType | None]] = {}  # GPU -> VF -> the type it holds
        self._scans = 0
        self._scanned = threading.Condition()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._refresh()

    def __enter__(self) -> KernelEmulator:
        self.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop()

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="fake-sysfs-kernel", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)

    def hold(self, device_id: str) -> None:
        """A running VM uses this vGPU (mdev UUID, or VF address in any spelling)."""
        self.held.add(_key(device_id))

    def release(self, device_id: str) -> None:
        self.held.discard(_key(device_id))

    def settle(self, timeout_s: float = 5.0) -> None:
        """Wait until every write made before this call has been acted on (two full scans)."""
        with self._scanned:
            target = self._scans + 2
            if not self._scanned.wait_for(lambda: self._scans >= target, timeout=timeout_s):
                raise TimeoutError("the emulated kernel did not scan the tree in time")

    def _run(self) -> None:
        while not self._stop.is_set():
            with contextlib.suppress(OSError):  # a file replaced between listing and reading it: next round
                self.scan()
            with self._scanned:
                self._scans += 1
                self._scanned.notify_all()
            self._stop.wait(self.poll_s)

    def scan(self) -> None:
        """Act on whatever was written since the last scan."""
        changed = False
        for gpu in self.gpus.values():
            folder = self.root / "sys/devices/pci0000:00" / gpu.address
            if (folder / "mdev_supported_types").is_dir():
                changed |= self._scan_mdev(gpu, folder)
            else:
                changed |= self._scan_vfs(gpu, folder)
        if changed:
            self._refresh()

    # mdev --------------------------------------------------------------------------------------

    def _mdev_instances(self, folder: Path) -> list[tuple[Path, FakeType]]:
        found = []
        for path in folder.iterdir():
            if UUID_TEXT.fullmatch(path.name) and (path / "mdev_type").is_symlink():
                type_id = os.readlink(path / "mdev_type").rsplit("/", 1)[-1]
                found.append((path, self._type(folder.name, type_id)))
        return found

    def _scan_mdev(self, gpu: FakeGpu, folder: Path) -> bool:
        changed = False
        for path, _ in self._mdev_instances(folder):
            if (path / "remove").read_text().strip() != "1":
                continue
            _put(path / "remove", "")
            if path.name in self.held:
                self.refused.append(f"remove {path.name}: busy")
                continue
            type_id = os.readlink(path / "mdev_type").rsplit("/", 1)[-1]
            # available_instances before the device goes, as the kernel has it when remove returns
            self._refresh_mdev(gpu, folder, [kind for other, kind in self._mdev_instances(folder) if other != path])
            (self.root / "sys/bus/mdev/devices" / path.name).unlink()
            (folder / "mdev_supported_types" / type_id / "devices" / path.name).unlink()
            for item in path.iterdir():
                item.unlink()
            path.rmdir()
            changed = True
        for kind in gpu.types:
            type_dir = folder / "mdev_supported_types" / kind.type_id
            written = (type_dir / "create").read_text().strip().lower()
            if not written:
                continue
            _put(type_dir / "create", "")
            if not UUID_TEXT.fullmatch(written) or (folder / written).exists():
                self.refused.append(f"create {written!r}: not a new UUID")
                continue
            if self._available(gpu, kind, [k for _, k in self._mdev_instances(folder)]) <= 0:
                self.refused.append(f"create {kind.name} on {gpu.address}: no available instance")
                continue
            instance = folder / written
            instance.mkdir()
            _link(instance / "mdev_type", type_dir)
            _put(instance / "remove", "")
            _link(type_dir / "devices" / written, instance)
            # available_instances before the device shows, as the kernel has it when create returns
            self._refresh_mdev(gpu, folder, [k for _, k in self._mdev_instances(folder)])
            _link(self.root / "sys/bus/mdev/devices" / written, instance)
            changed = True
        return changed

    # SR-IOV ------------------------------------------------------------------------------------

    def _vfs(self, folder: Path) -> list[Path]:
        links = sorted((p for p in folder.iterdir() if p.name.startswith("virtfn")), key=lambda p: int(p.name[6:]))
        return [link.resolve() for link in links]

    def _scan_vfs(self, gpu: FakeGpu, folder: Path) -> bool:
        changed = False
        state = self._vf_state(gpu, folder)
        for vf in self._vfs(folder):
            written = (vf / "nvidia/current_vgpu_type").read_text().strip()
            before = state[vf.name]
            if not written or written == (before.type_id if before else "0"):
                continue  # unchanged, or caught between a writer's truncate and its write
            changed = True
            if written == "0":
                if vf.name in self.held:
                    self.refused.append(f"remove {vf.name}: busy")
                    _put(vf / "nvidia/current_vgpu_type", before.type_id)
                    continue
                state[vf.name] = None
                continue
            kind = next((k for k in gpu.types if k.type_id == written), None)
            others = [k for name, k in state.items() if k is not None and name != vf.name]
            if before is not None or kind is None or self._available(gpu, kind, others) <= 0:
                self.refused.append(f"VF {vf.name} type {written}: not creatable")
                _put(vf / "nvidia/current_vgpu_type", before.type_id if before else "0")
                continue
            state[vf.name] = kind
        return changed

    def _vf_state(self, gpu: FakeGpu, folder: Path) -> dict[str, FakeType | None]:
        """What each VF of `gpu` holds, as of the last scan."""
        return self._vf_types.setdefault(gpu.address, {vf.name: None for vf in self._vfs(folder)})

    # shared ------------------------------------------------------------------------------------

    def _type(self, address: str, type_id: str) -> FakeType:
        return next(kind for kind in self.gpus[address].types if kind.type_id == type_id)

    @staticmethod
    def _available(gpu: FakeGpu, kind: FakeType, held: list[FakeType]) -> int:
        """Equal-size mode: one frame-buffer size per GPU, at most its max count."""
        if any(other.fb_mib != kind.fb_mib for other in held):
            return 0
        return max(0, kind.max_instances - len(held))

    def _refresh_mdev(self, gpu: FakeGpu, folder: Path, held: list[FakeType]) -> None:
        for kind in gpu.types:
            _put(folder / "mdev_supported_types" / kind.type_id / "available_instances",
                 str(self._available(gpu, kind, held)))

    def _refresh(self) -> None:
        """Rewrite every GPU's available_instances / creatable_vgpu_types from what it holds."""
        for gpu in self.gpus.values():
            folder = self.root / "sys/devices/pci0000:00" / gpu.address
            if (folder / "mdev_supported_types").is_dir():
                self._refresh_mdev(gpu, folder, [kind for _, kind in self._mdev_instances(folder)])
            elif folder.is_dir():
                state = self._vf_state(gpu, folder)
                held = [kind for kind in state.values() if kind is not None]
                creatable = [kind for kind in gpu.types if self._available(gpu, kind, held) > 0]
                for vf in self._vfs(folder):
                    text = _creatable_text(creatable if state[vf.name] is None else ())
                    _put(vf / "nvidia/creatable_vgpu_types", text)


def _key(device_id: str) -> str:
    """A device id as sysfs spells it: UUIDs lower case, PCI addresses with a 4-digit domain."""
    text = device_id.strip().lower()
    if UUID_TEXT.fullmatch(text) or text.count(":") != 2:
        return text
    domain, rest = text.split(":", 1)
    return f"{int(domain, 16):04x}:{rest}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m telemetry.agent.fake_sysfs",
                                     description="Build a fake NVIDIA vGPU sysfs and emulate its kernel.")
    parser.add_argument("root", help="folder to build the tree in (point the agent's --sysfs-root at it)")
    parser.add_argument("--layout", choices=("mdev", "sriov"), default="mdev")
    parser.add_argument("--gpu", action="append", metavar="MODEL:ADDRESS",
                        help=f"a GPU, e.g. T4:0000:3b:00.0; models: {', '.join(MODELS)} (repeatable)")
    args = parser.parse_args(argv)
    specs = args.gpu or (["T4:0000:3b:00.0"] if args.layout == "mdev" else ["L40S:0000:41:00.0"])
    gpus = []
    for spec in specs:
        model, _, address = spec.partition(":")
        if model not in MODELS or not address:
            parser.error(f"--gpu {spec!r}: expected MODEL:ADDRESS with MODEL one of {', '.join(MODELS)}")
        gpus.append(FakeGpu(address.lower(), MODELS[model]))
    build = build_mdev_host if args.layout == "mdev" else build_sriov_host
    build(args.root, gpus)
    print(f"fake sysfs ({args.layout}) in {args.root}; emulating its kernel until interrupted", flush=True)
    with KernelEmulator(args.root, gpus, poll_s=0.005):
        try:
            while True:
                time.sleep(3600)
        except KeyboardInterrupt:
            pass
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""A vCenter simulator (govmomi's vcsim) with NVIDIA vGPU hosts, for tests and local trials of
the vSphere backend.

No vcsim binary is packaged for Debian or PyPI, but Debian ships govmomi's Go source: a small
launcher (`vcsim_launcher/main.go`, next to this file) is built from it with Debian's Go
toolchain, offline (`GO111MODULE=off GOPATH=/usr/share/gocode go build`), once: the binary is
kept in a cache folder outside the repository (VCSIM_CACHE_DIR, else ~/.cache/vgpu-dashboard/vcsim),
under the hash of the launcher's source and the Go version, so an edited launcher is rebuilt
and an unchanged one never is. The build takes about half a minute; a build in progress is
shared between processes through a lock file.

The launcher's inventory (see its source): datacenter DC0 with standalone host DC0_H0 and cluster
DC0_C0 (hosts DC0_C0_H0..2); every host has two Tesla T4 GPUs offering grid_t4-1q..16q;
DC0_H0_VM0 holds a grid_t4-4q vGPU on the first GPU, DC0_H0_VM1 and DC0_H0_VM2 a grid_t4-8q each
on the second, DC0_C0_RP0_VM0 a grid_t4-2q; DC0_H0_VM2's guest ignores shutdown requests;
DC0_H0_VM0 (4 vCPUs, 8192 MB, VMware Tools running) and DC0_H0_VM1 (1 vCPU, no Tools) have known
quick stats and real-time CPU samples (the launcher's `guests` says which); the
privileges given as `deny` are refused to the user; the task methods given as `hang`
("ReconfigVM_Task", "PowerOnVM_Task", "RelocateVM_Task", ...) never finish: each such call gets a
new task that stays "running" for good and leaves the VM as it was (the launcher answers these
calls itself, since the simulator runs every task to completion before it answers). Each `Vcsim`
is a process of its own with its own state, listening on a free loopback port.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import os
import shutil
import signal
import subprocess
import tempfile
import threading
from pathlib import Path
from types import TracebackType
from urllib.parse import urlsplit

LAUNCHER_DIR = Path(__file__).resolve().parent / "vcsim_launcher"
GOPATH = Path("/usr/share/gocode")
GOVMOMI_SIMULATOR = GOPATH / "src" / "github.com" / "vmware" / "govmomi" / "simulator"
INSTALL_HINT = "apt-get install -y golang-go golang-github-vmware-govmomi-dev"
BUILD_TIMEOUT_S = 600.0
START_TIMEOUT_S = 30.0
STOP_TIMEOUT_S = 10.0

#: The simulated inventory, as the tests name it.
DATACENTER = "DC0"
STANDALONE_HOST = "DC0_H0"
CLUSTER_HOSTS = ("DC0_C0_H0", "DC0_C0_H1", "DC0_C0_H2")
GPU_BUS_IDS = ("0000:3b:00.0", "0000:5e:00.0")
GPU_TYPES = ("grid_t4-1q", "grid_t4-2q", "grid_t4-4q", "grid_t4-8q", "grid_t4-16q")
VGPU_VMS = {"DC0_H0_VM0": ("grid_t4-4q", 0), "DC0_H0_VM1": ("grid_t4-8q", 1), "DC0_H0_VM2": ("grid_t4-8q", 1),
            "DC0_C0_RP0_VM0": ("grid_t4-2q", 0)}
STUBBORN_VM = "DC0_H0_VM2"  # its guest never powers off when asked
USERNAME = "administrator@vsphere.local"
PASSWORD = "vcsim-secret"


class VcsimUnavailable(RuntimeError):
    """The launcher cannot be built (Go or govmomi's source missing) or did not start."""


def cache_root() -> Path:
    configured = os.environ.get("VCSIM_CACHE_DIR")
    if configured:
        return Path(configured)
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "vgpu-dashboard" / "vcsim"


def find_go() -> str | None:
    return shutil.which("go") or next((c for c in ("/usr/lib/go/bin/go", "/usr/local/go/bin/go")
                                       if os.access(c, os.X_OK)), None)


def missing_toolchain() -> str | None:
    """What is missing to build the launcher, in words (with the command that installs it), or None."""
    if find_go() is None:
        return f"the Go toolchain is not installed ({INSTALL_HINT})"
    if not GOVMOMI_SIMULATOR.is_dir():
        return f"govmomi's Go source is not in {GOPATH} ({INSTALL_HINT})"
    return None


def _go_version(go: str) -> str:
    try:
        return subprocess.run([go, "version"], capture_output=True, text=True, timeout=30, check=False).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return ""


def source_hash(go: str) -> str:
    digest = hashlib.sha256()
    for path in sorted(LAUNCHER_DIR.glob("*.go")):
        digest.update(path.name.encode() + b"\0" + path.read_bytes() + b"\0")
    digest.update(_go_version(go).encode())
    return digest.hexdigest()[:16]


def build() -> Path:
    """The launcher binary: the cached one for this source, else built now (about 36 s)."""
    missing = missing_toolchain()
    if missing:
        raise VcsimUnavailable(f"Cannot build the vCenter simulator: {missing}.")
    go = find_go()
    folder = cache_root() / source_hash(go)
    binary = folder / "vcsim-launcher"
    if os.access(binary, os.X_OK):
        return binary
    folder.mkdir(parents=True, exist_ok=True)
    with open(folder / "build.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # another process may be building it: wait for its result
        if os.access(binary, os.X_OK):
            return binary
        partial = folder / "vcsim-launcher.partial"
        env = {**os.environ, "GO111MODULE": "off", "GOPATH": str(GOPATH), "GOCACHE": str(cache_root() / "gocache"),
               "CGO_ENABLED": "0"}
        try:
            result = subprocess.run([go, "build", "-o", str(partial), "."], cwd=LAUNCHER_DIR, env=env,
                                    capture_output=True, text=True, timeout=BUILD_TIMEOUT_S, check=False)
        except subprocess.TimeoutExpired:
            raise VcsimUnavailable(f"Building the vCenter simulator took over {BUILD_TIMEOUT_S:.0f} s.") from None
        if result.returncode != 0:
            raise VcsimUnavailable(f"Building the vCenter simulator failed ({INSTALL_HINT} provides what it "
                                   f"needs):\n{(result.stderr or result.stdout)[-4000:]}")
        partial.rename(binary)
    for old in cache_root().iterdir():  # builds of earlier launcher sources
        if old.is_dir() and old != folder and old.name != "gocache":
            shutil.rmtree(old, ignore_errors=True)
    return binary


class Vcsim:
    """One simulator process: `start()`/`stop()` (or `with`). `url` is its SDK URL once started;
    `uri(...)` what a host's `hypervisor_uri` would hold for it; `ca_file` its certificate."""

    def __init__(self, *, username: str = USERNAME, password: str = PASSWORD, deny: tuple[str, ...] = (),
                 hang: tuple[str, ...] = (), binary: Path | None = None):
        """`deny`: privileges the simulator says the user lacks (it grants every other). `hang`:
        vSphere task methods (by their SOAP name, "ReconfigVM_Task") whose tasks never finish."""
        self.binary = binary or build()
        self.username, self.password, self.deny, self.hang = username, password, deny, hang
        self.folder = Path(tempfile.mkdtemp(prefix="vcsim-"))
        self.ca_file = self.folder / "ca.pem"
        self.log_path = self.folder / "vcsim.log"
        self.url = ""
        self.process: subprocess.Popen | None = None

    @property
    def host(self) -> str:
        return urlsplit(self.url).hostname or ""

    @property
    def port(self) -> int:
        return urlsplit(self.url).port or 0

    def uri(self, host: str = STANDALONE_HOST, *, insecure: bool = True, datacenter: str = DATACENTER,
            user: str | None = None, **query: str) -> str:
        """The backend URI of one of its hosts: `vsphere://user@127.0.0.1:port/?datacenter=DC0&host=...`."""
        params = {"datacenter": datacenter, "host": host, **({"insecure": "1"} if insecure else {}), **query}
        text = "&".join(f"{name}={value}" for name, value in params.items() if value)
        return f"vsphere://{user or self.username}@{self.host}:{self.port}/?{text}"

    @property
    def running(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def log_tail(self, lines: int = 30) -> str:
        if not self.log_path.exists():
            return ""
        return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])

    def start(self) -> None:
        """Start the simulator and return once it has printed its URL."""
        if self.running:
            return
        args = [str(self.binary), "-listen", "127.0.0.1:0", "-username", self.username, "-password", self.password,
                "-cafile", str(self.ca_file), "-deny", ",".join(self.deny), "-hang", ",".join(self.hang)]
        with open(self.log_path, "ab") as log:
            self.process = subprocess.Popen(args, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=log,
                                            start_new_session=True)
        found: list[str] = []

        def read_url() -> None:
            for raw in self.process.stdout:
                line = raw.decode(errors="replace").strip()
                if line.startswith("VCSIM_URL="):
                    found.append(line.partition("=")[2])
                    return

        reader = threading.Thread(target=read_url, daemon=True)
        reader.start()
        reader.join(START_TIMEOUT_S)
        if not found:
            self.stop()
            raise VcsimUnavailable(f"The vCenter simulator did not start within {START_TIMEOUT_S:.0f} s:\n"
                                   f"{self.log_tail()}")
        self.url = found[0]

    def stop(self) -> None:
        """Stop the simulator (SIGTERM, then SIGKILL); its state goes with it."""
        if self.process is None:
            return
        process, self.process = self.process, None
        if process.poll() is None:
            process.send_signal(signal.SIGTERM)
            try:
                process.wait(timeout=STOP_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait(timeout=STOP_TIMEOUT_S)
        for stream in (process.stdin, process.stdout):
            with contextlib.suppress(OSError):
                stream.close()

    def remove(self) -> None:
        self.stop()
        shutil.rmtree(self.folder, ignore_errors=True)

    def __enter__(self) -> Vcsim:
        self.start()
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.remove()

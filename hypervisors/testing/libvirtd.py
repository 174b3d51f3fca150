"""A private libvirtd serving libvirt's test driver on a Unix socket of its own, for tests and
local trials of the libvirt backend.

The test driver keeps its state in the daemon, so every process that opens
`test+unix:///default?socket=...` (the test, a Celery worker, the web server) sees the same
domains, as processes on a real host would. A node file (`test+unix:///abs/node.xml?socket=...`)
describes GPUs with vGPU types; the daemon reads it afresh for each connection, so its state
lasts one connection.

Only the test driver is loaded: libvirtd's QEMU driver would refuse to start without the
`libvirt-qemu` account and a root /etc/libvirt/qemu.conf, and nothing here needs it.
`LIBVIRT_DRIVER_DIR` pointed at an empty folder keeps the loadable drivers out (the test
driver is built into libvirt itself), so starting one changes nothing on the machine.

libvirtd runs in the foreground as our child (not `-d`): stop() then waits for it and reaps it,
where a daemonised libvirtd would be left to a PID 1 that, in a container, may never reap it.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from pathlib import Path
from types import TracebackType

START_TIMEOUT_S = 30.0
STOP_TIMEOUT_S = 20.0
CANDIDATES = ("/usr/sbin/libvirtd", "/usr/local/sbin/libvirtd")


class LibvirtdUnavailable(RuntimeError):
    """libvirtd is not installed, or it did not start (the message holds its log)."""


def find_libvirtd() -> str | None:
    """The libvirtd binary: on PATH, else where Debian and a source build put it (/usr/sbin is
    not on an ordinary user's PATH)."""
    return shutil.which("libvirtd") or next((c for c in CANDIDATES if os.access(c, os.X_OK)), None)


class Libvirtd:
    """One private libvirtd in a temporary folder. `start()`/`stop()` (or `with`), `restart()`
    for tests of a daemon that goes away mid-operation; `uri()` is what a host's
    `hypervisor_uri` would hold."""

    def __init__(self, folder: Path | None = None, binary: str | None = None):
        self.binary = binary or find_libvirtd()
        if not self.binary:
            raise LibvirtdUnavailable("libvirtd is not installed (apt-get install libvirt-daemon libvirt-clients)")
        # A Unix socket path holds at most 107 bytes: a short folder under /tmp, not pytest's tmp_path.
        self.folder = Path(folder) if folder else Path(tempfile.mkdtemp(prefix="libvirtd-", dir="/tmp"))
        self._owns_folder = folder is None
        self.run_dir = self.folder / "run"
        self.socket_path = self.run_dir / "libvirt-sock"
        self.log_path = self.run_dir / "libvirtd.log"
        self.config_path = self.folder / "libvirtd.conf"
        self.pid_path = self.folder / "libvirtd.pid"
        self.process: subprocess.Popen | None = None

    def uri(self, node_xml: Path | str | None = None) -> str:
        """The test driver's URI through this daemon: its shared default host, or the host a
        node file describes (an absolute path)."""
        path = str(Path(node_xml).resolve()) if node_xml else "/default"
        return f"test+unix://{path}?socket={self.socket_path}"

    def _write_config(self) -> None:
        self.run_dir.mkdir(parents=True, exist_ok=True)
        (self.folder / "drivers").mkdir(exist_ok=True)
        self.config_path.write_text(
            f'unix_sock_dir = "{self.run_dir}"\n'
            'auth_unix_rw = "none"\n'
            'auth_unix_ro = "none"\n'
            f'log_outputs = "3:file:{self.log_path}"\n'
        )

    @property
    def running(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def _socket_answers(self) -> bool:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
            try:
                sock.connect(str(self.socket_path))
            except OSError:
                return False
            return True

    def log_tail(self, lines: int = 30) -> str:
        texts = []
        for path in (self.log_path, self.folder / "output.log"):
            if path.exists():
                texts.extend(path.read_text(errors="replace").splitlines()[-lines:])
        return "\n".join(texts)

    def start(self) -> None:
        """Start the daemon and return once its socket accepts connections."""
        if self.running:
            return
        self._write_config()
        self.socket_path.unlink(missing_ok=True)
        env = {**os.environ, "LIBVIRT_DRIVER_DIR": str(self.folder / "drivers")}
        with open(self.folder / "output.log", "ab") as output:
            self.process = subprocess.Popen(
                [self.binary, "-f", str(self.config_path), "-p", str(self.pid_path)],
                env=env, stdin=subprocess.DEVNULL, stdout=output, stderr=subprocess.STDOUT, start_new_session=True,
            )
        deadline = time.monotonic() + START_TIMEOUT_S
        while time.monotonic() < deadline:
            if self._socket_answers():
                return
            if self.process.poll() is not None:
                break
            time.sleep(0.05)
        self.stop()
        raise LibvirtdUnavailable(f"libvirtd did not open {self.socket_path} within {START_TIMEOUT_S:.0f} s:\n"
                                  f"{self.log_tail()}")

    def stop(self) -> None:
        """Stop the daemon (SIGTERM, then SIGKILL): its clients see the connection drop. The
        test driver's state goes with it."""
        if self.process is None:
            return
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout=STOP_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(timeout=STOP_TIMEOUT_S)
        self.process = None

    def restart(self) -> None:
        self.stop()
        self.start()

    def remove(self) -> None:
        """Stop, and delete the folder this object made."""
        self.stop()
        if self._owns_folder:
            shutil.rmtree(self.folder, ignore_errors=True)

    def __enter__(self) -> Libvirtd:
        self.start()
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.remove()

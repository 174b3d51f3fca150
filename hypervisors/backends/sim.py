"""The demo's hypervisor: a `Backend` whose host is one JSON file, so the product can be shown
(and tested) acting on hypervisors without libvirt or a GPU.

One file per simulated hypervisor in settings.HYPERVISOR_SIM_DIR, named after the URI's host
part (`sim://node-01` -> `node-01.json`). The web process, Celery workers and tests open the
same file: every change takes an exclusive `fcntl` lock on a side file (`node-01.json.lock`;
the data file itself is replaced, so a lock on it would be a lock on an old inode), reads the
file, changes it and writes it back through a temporary file and `os.replace`, so a reader
never sees half a file and two writers never lose each other's update.

It behaves as a real host does where an operation depends on it:

- a domain has an inactive definition and, while it runs, a live one: `redefine` changes the
  inactive one, which the next `start` copies (a running VM keeps what it booted with);
- `shutdown` asks the guest (ACPI) and waits: the guest powers off `shutdown_s` seconds after
  it was asked (state `shutdown_s`, default `DEFAULT_SHUTDOWN_S`), or never when the domain
  `ignores_acpi` (what `set_ignore_acpi` arranges, for the timeout path). The time a guest
  powers off is kept in the file, so another process sees it off at the same moment;
- vGPU types follow NVIDIA's equal-size rule: a GPU that holds vGPUs of one type offers only
  that type, up to its maximum instances; an empty GPU offers every type. `create_vgpu`
  refuses a full GPU (NoInstanceAvailable), `remove_vgpu` a device a running domain holds
  (DeviceBusy), `start` a domain whose devices are gone or held by another running domain;
- `move_to` defines the shut-off domain on another simulated host and undefines it here;
- `guest_counters` gives each running domain's vCPU and memory counters as its artist's
  workflow would make them (`telemetry.guest_sim`, the demo's one model of its guests, which
  the demo's back-filled history reads too): a domain's `workflow` (default "other", light
  work) and `balloon` (default true; false for a guest without the balloon driver, whose memory
  use is then not reported) are kept in its record, the host's `cpu_contention` (steal) in the
  state, and local time is settings.TIME_ZONE in standard time (`guest_sim.standard_offset_s`).

Mixed-size mode is not simulated. The sim-only methods below the Backend ones (`define_domain`,
`change_domain`, `undefine`, `power_off`, `set_ignore_acpi`, `seed`) stand for what happens on
a host outside the product: an admin defining a VM in virt-manager, a guest crashing.
"""

from __future__ import annotations

import contextlib
import copy
import fcntl
import json
import os
import re
import tempfile
import time
import uuid as uuidlib
from collections.abc import Callable, Iterator
from pathlib import Path
from urllib.parse import urlsplit

from django.conf import settings

from fleet.pci import InvalidPciBusId, normalize_pci_bus_id
from hypervisors.backends.base import (
    Backend,
    ConnectionCheck,
    DeviceBusy,
    DeviceKind,
    Domain,
    DomainNotFound,
    DomainSpec,
    GuestCounters,
    HypervisorError,
    NoInstanceAvailable,
    PowerState,
    ShutdownTimeout,
    Unreachable,
    VgpuDevice,
    VgpuType,
)
from telemetry import guest_sim

SIM_VERSION = "sim 1.0"
#: Seconds a simulated guest takes to power off once asked (a real one: seconds to minutes).
DEFAULT_SHUTDOWN_S = 0.2
#: How often `shutdown` looks again whether the guest is off.
POLL_S = 0.05
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,99}")


def sim_name(uri: str) -> str:
    """The simulated host's name in `uri` (`sim://node-01` -> `node-01`), or HypervisorError
    for one that could not be a file name."""
    name = urlsplit(uri).netloc
    if not _NAME.fullmatch(name) or name in (".", ".."):
        raise HypervisorError(f"{uri!r} does not name a simulated hypervisor: use sim://NAME, e.g. sim://node-01.")
    return name


def state_path(name: str) -> Path:
    """Where the state of the simulated hypervisor `name` lives."""
    return Path(settings.HYPERVISOR_SIM_DIR) / f"{name}.json"


def empty_state(hostname: str) -> dict:
    return {"hostname": hostname, "version": SIM_VERSION, "shutdown_s": DEFAULT_SHUTDOWN_S,
            "next_type_id": 200, "gpus": [], "devices": [], "domains": {}}


def _norm_bus(bus_id: str) -> str:
    try:
        return normalize_pci_bus_id(bus_id)
    except InvalidPciBusId as exc:
        raise HypervisorError(str(exc)) from None


def _norm_uuid(value: str) -> str:
    try:
        return str(uuidlib.UUID(str(value)))
    except ValueError:
        raise DomainNotFound(f"{value!r} is not a domain UUID.") from None


class SimBackend:
    """A link to one simulated hypervisor (see the module's docstring)."""

    def __init__(self, name: str, uri: str = "", *, clock: Callable[[], int] | None = None):
        self.name = name
        self.uri = uri or f"sim://{name}"
        self.path = state_path(name)
        # ns since the epoch: the time guest counters are read at (time.time_ns, looked up at each reading)
        self.clock = clock or (lambda: time.time_ns())

    @classmethod
    def open(cls, uri: str) -> SimBackend:
        """Never fails for a well-formed URI: a missing state file is what `check` reports and
        every other method raises (Unreachable), as a host that is down would."""
        return cls(sim_name(uri), uri)

    # State file ------------------------------------------------------------------------------

    def exists(self) -> bool:
        return self.path.is_file()

    def _load(self) -> dict:
        try:
            text = self.path.read_text(encoding="utf-8")
        except FileNotFoundError:
            raise Unreachable(f"The simulated hypervisor {self.uri} is not there: no state file {self.path.name} in "
                              f"{self.path.parent} (seed it with `manage.py demo_hypervisors`).") from None
        except OSError as exc:
            raise Unreachable(f"The simulated hypervisor {self.uri} cannot be read: {exc.strerror}.") from None
        try:
            state = json.loads(text)
        except ValueError:
            raise Unreachable(f"The state file of the simulated hypervisor {self.uri} is not valid JSON.") from None
        _settle(state, time.time())
        return state

    @contextlib.contextmanager
    def _lock(self) -> Iterator[None]:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.path.with_name(self.path.name + ".lock"), "a") as lock_file:
            fcntl.flock(lock_file, fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(lock_file, fcntl.LOCK_UN)

    def _write(self, state: dict) -> None:
        fd, tmp = tempfile.mkstemp(prefix=f".{self.path.name}.", dir=self.path.parent)
        try:
            with os.fdopen(fd, "w", encoding="utf-8") as out:
                json.dump(state, out, indent=1, sort_keys=True)
                out.flush()
                os.fsync(out.fileno())
            os.replace(tmp, self.path)
        except BaseException:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(tmp)
            raise

    @contextlib.contextmanager
    def _change(self) -> Iterator[dict]:
        """The state, locked, written back when the block ends without an exception."""
        with self._lock():
            state = self._load()
            yield state
            self._write(state)

    def _read(self) -> dict:
        # No lock: os.replace makes every read see one whole version of the file.
        return self._load()

    # Backend ---------------------------------------------------------------------------------

    def check(self) -> ConnectionCheck:
        try:
            state = self._read()
        except HypervisorError as exc:
            return ConnectionCheck(ok=False, message=str(exc))
        hostname = state.get("hostname", self.name)
        return ConnectionCheck(
            ok=True, message=f"Connected to the simulated hypervisor {hostname} ({state.get('version', SIM_VERSION)})",
            hypervisor_version=state.get("version", SIM_VERSION), hostname=hostname,
            details={"domains": len(state["domains"]), "gpus": len(state["gpus"]), "devices": len(state["devices"])},
        )

    def list_domains(self) -> list[Domain]:
        state = self._read()
        domains = [_domain(state, key) for key in state["domains"]]
        return sorted(domains, key=lambda d: (d.name, d.uuid))

    def domain(self, uuid: str) -> Domain:
        state = self._read()
        return _domain(state, _find(state, uuid))

    def shutdown(self, uuid: str, timeout_s: float) -> None:
        with self._change() as state:
            key = _find(state, uuid)
            record = state["domains"][key]
            if record["state"] != PowerState.RUNNING:
                return
            if not record.get("shutdown_at"):
                record["shutdown_at"] = None if record.get("ignores_acpi") else (
                    time.time() + float(state.get("shutdown_s", DEFAULT_SHUTDOWN_S)))
        deadline = time.monotonic() + timeout_s
        while True:
            if self._read()["domains"].get(key, {}).get("state") != PowerState.RUNNING:
                return
            left = deadline - time.monotonic()
            if left <= 0:
                break
            time.sleep(min(POLL_S, left))
        name = state["domains"][key]["name"]
        raise ShutdownTimeout(f"{name} did not power off within {timeout_s:g} s of being asked to; it is left "
                              "running, untouched.")

    def start(self, uuid: str) -> None:
        with self._change() as state:
            key = _find(state, uuid)
            record = state["domains"][key]
            if record["state"] == PowerState.RUNNING:
                return
            devices = {d["id"]: d for d in state["devices"]}
            held = _held_devices(state, exclude=key)
            for device_id in record["inactive"]["vgpus"]:
                if device_id not in devices:
                    raise HypervisorError(f"{record['name']} cannot start: its vGPU device {device_id} does not exist "
                                          "on the host.")
                if device_id in held:
                    raise HypervisorError(f"{record['name']} cannot start: its vGPU device {device_id} is in use by "
                                          f"{held[device_id]}.")
            record.update(state=PowerState.RUNNING, live=copy.deepcopy(record["inactive"]), shutdown_at=None)

    def redefine(self, uuid: str, spec: DomainSpec) -> None:
        if spec.vcpus < 1 or spec.ram_mib < 1:
            raise HypervisorError("A domain needs at least one vCPU and some RAM.")
        with self._change() as state:
            key = _find(state, uuid)
            known = {d["id"] for d in state["devices"]}
            ids = [_device_key(device) for device in spec.vgpus]
            missing = [i for i in ids if i not in known]
            if missing:
                raise HypervisorError(f"No vGPU device {missing[0]} on the host: create it before redefining.")
            state["domains"][key]["inactive"].update(vcpus=spec.vcpus, ram_mib=spec.ram_mib, vgpus=ids)

    def vgpu_types(self) -> list[VgpuType]:
        state = self._read()
        return [VgpuType(gpu["bus_id"], t["type_id"], t["name"], _available(state, gpu, t))
                for gpu in state["gpus"] for t in gpu["types"]]

    def vgpu_devices(self) -> list[VgpuDevice]:
        state = self._read()
        return [_device(state, d["id"]) for d in sorted(state["devices"], key=lambda d: (d["gpu_bus_id"], d["id"]))]

    def create_vgpu(self, gpu_bus_id: str, type_name: str, *, device_id: str = "") -> VgpuDevice:
        bus = _norm_bus(gpu_bus_id)
        wanted = _norm_uuid(device_id) if device_id else str(uuidlib.uuid4())
        with self._change() as state:
            if any(d["id"] == wanted for d in state["devices"]):
                raise HypervisorError(f"A vGPU device {wanted} exists already on {state['hostname']}.")
            gpu = next((g for g in state["gpus"] if g["bus_id"] == bus), None)
            if gpu is None:
                raise HypervisorError(f"No GPU at {bus} on {state['hostname']}.")
            vtype = next((t for t in gpu["types"] if t["name"] == type_name), None)
            if vtype is None:
                raise NoInstanceAvailable(f"GPU {bus} does not offer the vGPU type {type_name!r}.")
            if _available(state, gpu, vtype) < 1:
                holds = _types_held(state, bus)
                why = (f"it holds {', '.join(sorted(holds))} and takes only one size at a time"
                       if holds and vtype["type_id"] not in holds else
                       f"all {vtype['max_instances']} instances are in use")
                raise NoInstanceAvailable(f"GPU {bus} cannot take another {type_name}: {why}.")
            record = {"id": wanted, "kind": DeviceKind.MDEV, "gpu_bus_id": bus,
                      "type_id": vtype["type_id"]}
            state["devices"].append(record)
            return _device(state, record["id"])

    def remove_vgpu(self, device: VgpuDevice) -> None:
        device_id = _device_key(device)
        with self._change() as state:
            if not any(d["id"] == device_id for d in state["devices"]):
                return
            held = _held_devices(state)
            if device_id in held:
                raise DeviceBusy(f"vGPU device {device_id} is in use by the running domain {held[device_id]}; "
                                 "shut it down first.")
            state["devices"] = [d for d in state["devices"] if d["id"] != device_id]

    def move_to(self, uuid: str, target: Backend) -> None:
        if not isinstance(target, SimBackend):
            raise HypervisorError("A simulated domain can only move to another simulated hypervisor.")
        if target.path == self.path:
            raise HypervisorError("The domain is already on that hypervisor.")
        # Both files locked in one order (by path), so two moves the opposite way never deadlock.
        first, second = sorted((self, target), key=lambda backend: str(backend.path))
        with first._lock(), second._lock():
            state, target_state = self._load(), target._load()
            key = _find(state, uuid)
            record = state["domains"][key]
            if record["state"] != PowerState.SHUT_OFF:
                raise HypervisorError(f"{record['name']} is {record['state'].replace('_', ' ')}: only a shut-off "
                                      "domain moves (a cold move).")
            if key in target_state["domains"]:
                raise HypervisorError(f"{target.uri} already has a domain with the UUID {key}.")
            if any(r["name"] == record["name"] for r in target_state["domains"].values()):
                raise HypervisorError(f"{target.uri} already has a domain named {record['name']}.")
            moved = copy.deepcopy(record)
            moved.update(live=None, shutdown_at=None)
            target_state["domains"][key] = moved
            target._write(target_state)
            del state["domains"][key]
            self._write(state)

    def definition(self, uuid: str) -> str:
        state = self._read()
        key = _find(state, uuid)
        record = state["domains"][key]
        return json.dumps({"uuid": key, "name": record["name"], **record["inactive"]}, sort_keys=True)

    def restore(self, uuid: str, saved: str) -> None:
        try:
            data = json.loads(saved)
            key = _norm_uuid(uuid)
            definition = {"vcpus": int(data["vcpus"]), "ram_mib": int(data["ram_mib"]),
                          "vgpus": [str(i) for i in data["vgpus"]]}
            name = str(data["name"])
        except (ValueError, KeyError, TypeError):
            raise HypervisorError("That is not a definition this simulated hypervisor wrote.") from None
        if data.get("uuid") != key:
            raise HypervisorError(f"That definition is of the domain {data.get('uuid')}, not {key}.")
        with self._change() as state:
            record = state["domains"].get(key)
            if record is None:
                state["domains"][key] = _new_record(name, definition)
            else:
                record["name"] = name
                record["inactive"] = definition

    def guest_counters(self) -> list[GuestCounters]:
        state = self._read()
        now_ns = self.clock()
        offset_s = guest_sim.standard_offset_s(settings.TIME_ZONE)
        contention = float(state.get("cpu_contention", guest_sim.DEFAULT_CONTENTION))
        found = []
        for key, record in sorted(state["domains"].items()):
            if record["state"] != PowerState.RUNNING:
                continue
            definition = record.get("live") or record["inactive"]
            found.append(guest_sim.counters(key, record.get("workflow", "other"), vcpus=definition["vcpus"],
                                            ram_mib=definition["ram_mib"], now_ns=now_ns, utc_offset_s=offset_s,
                                            contention=contention, balloon=record.get("balloon", True)))
        return found

    def close(self) -> None:
        """Nothing is held between calls."""

    # What happens on a host outside the product ----------------------------------------------

    def seed(self, state: dict) -> None:
        """Replace the whole state (the seeding of the demo and of tests)."""
        with self._lock():
            self._write(state)

    def define_domain(self, name: str, *, vcpus: int, ram_mib: int, vgpus: tuple[VgpuDevice, ...] = (),
                      uuid: str | None = None, running: bool = False, workflow: str = "other",
                      balloon: bool = True) -> Domain:
        """Define a domain as an admin would on the host itself (virt-install, virt-manager),
        whose guest works as `workflow` says and has the balloon driver or not."""
        key = _norm_uuid(uuid) if uuid else str(uuidlib.uuid4())
        with self._change() as state:
            if key in state["domains"]:
                raise HypervisorError(f"A domain with the UUID {key} exists already.")
            record = _new_record(name, {"vcpus": vcpus, "ram_mib": ram_mib,
                                        "vgpus": [_device_key(d) for d in vgpus]}, workflow=workflow, balloon=balloon)
            if running:
                record.update(state=PowerState.RUNNING, live=copy.deepcopy(record["inactive"]))
            state["domains"][key] = record
        return self.domain(key)

    def change_domain(self, uuid: str, **fields) -> None:
        """Change a domain's vCPUs, RAM or vGPU device ids in both its definitions (as done on
        the host outside the product), or its name."""
        with self._change() as state:
            record = state["domains"][_find(state, uuid)]
            if "name" in fields:
                record["name"] = fields.pop("name")
            if "vgpus" in fields:
                fields["vgpus"] = [_device_key(d) for d in fields["vgpus"]]
            for definition in (record["inactive"], record.get("live")):
                if definition is not None:
                    definition.update(fields)

    def undefine(self, uuid: str) -> None:
        with self._change() as state:
            state["domains"].pop(_find(state, uuid))

    def power_off(self, uuid: str) -> None:
        """Pull the plug (virsh destroy): off at once, whatever the guest does."""
        with self._change() as state:
            _power_off(state["domains"][_find(state, uuid)])

    def set_ignore_acpi(self, uuid: str, ignore: bool = True) -> None:
        """Make the guest ignore (or again obey) shutdown requests."""
        with self._change() as state:
            state["domains"][_find(state, uuid)]["ignores_acpi"] = ignore

    def set_shutdown_s(self, seconds: float) -> None:
        with self._change() as state:
            state["shutdown_s"] = float(seconds)


# State helpers (the file's shape) -----------------------------------------------------------


def _new_record(name: str, inactive: dict, *, workflow: str = "other", balloon: bool = True) -> dict:
    return {"name": name, "state": PowerState.SHUT_OFF, "inactive": inactive, "live": None,
            "ignores_acpi": False, "shutdown_at": None, "workflow": workflow, "balloon": balloon}


def _power_off(record: dict) -> None:
    record.update(state=PowerState.SHUT_OFF, live=None, shutdown_at=None)


def _settle(state: dict, now: float) -> None:
    """Guests that were asked to power off and whose time has come are off."""
    for record in state["domains"].values():
        due = record.get("shutdown_at")
        if record["state"] == PowerState.RUNNING and due is not None and due <= now:
            _power_off(record)


def _find(state: dict, uuid: str) -> str:
    key = _norm_uuid(uuid)
    if key not in state["domains"]:
        raise DomainNotFound(f"No domain {key} on {state.get('hostname', 'the simulated hypervisor')}.")
    return key


def _device_key(device: VgpuDevice | str) -> str:
    return (device.id if isinstance(device, VgpuDevice) else str(device)).lower()


def _device(state: dict, device_id: str) -> VgpuDevice:
    record = next((d for d in state["devices"] if d["id"] == device_id), None)
    if record is None:  # the definition names a device the host no longer has
        return VgpuDevice(kind=DeviceKind.MDEV, id=device_id, gpu_bus_id="", type_name="")
    names = {t["type_id"]: t["name"] for g in state["gpus"] if g["bus_id"] == record["gpu_bus_id"] for t in g["types"]}
    return VgpuDevice(kind=record["kind"], id=record["id"], gpu_bus_id=record["gpu_bus_id"],
                      type_name=names.get(record["type_id"], ""))


def _domain(state: dict, key: str) -> Domain:
    record = state["domains"][key]
    definition = record["live"] if record["state"] == PowerState.RUNNING and record.get("live") else record["inactive"]
    return Domain(uuid=key, name=record["name"], vcpus=definition["vcpus"], ram_mib=definition["ram_mib"],
                  state=record["state"], vgpus=tuple(_device(state, i) for i in definition["vgpus"]))


def _held_devices(state: dict, exclude: str | None = None) -> dict[str, str]:
    """Device id -> name of the running domain that holds it."""
    return {device_id: record["name"] for key, record in state["domains"].items()
            if key != exclude and record["state"] == PowerState.RUNNING and record.get("live")
            for device_id in record["live"]["vgpus"]}


def _types_held(state: dict, bus: str) -> set[str]:
    return {d["type_id"] for d in state["devices"] if d["gpu_bus_id"] == bus}


def _available(state: dict, gpu: dict, vtype: dict) -> int:
    """Equal-size mode: an empty GPU offers every type; one holding a type offers only it."""
    held = _types_held(state, gpu["bus_id"])
    if held and held != {vtype["type_id"]}:
        return 0
    used = sum(1 for d in state["devices"] if d["gpu_bus_id"] == gpu["bus_id"])
    return max(vtype["max_instances"] - used, 0)


def add_gpu(state: dict, bus_id: str, model: str, types: list[tuple[str, int]]) -> dict:
    """Add a GPU offering `types` ((name, max instances), e.g. ("NVIDIA L40S-12Q", 4)) to a
    state being built; type ids are numbered as a host numbers them, one id per type name."""
    ids = state.setdefault("type_ids", {})
    gpu = {"bus_id": _norm_bus(bus_id), "model": model, "types": []}
    for name, max_instances in types:
        if name not in ids:
            ids[name] = f"nvidia-{state['next_type_id']}"
            state["next_type_id"] += 1
        gpu["types"].append({"type_id": ids[name], "name": name, "max_instances": int(max_instances)})
    state["gpus"].append(gpu)
    return gpu


def add_device(state: dict, bus_id: str, type_name: str, device_id: str | None = None) -> str:
    """Add an existing vGPU device to a state being built; returns its id."""
    bus = _norm_bus(bus_id)
    gpu = next(g for g in state["gpus"] if g["bus_id"] == bus)
    vtype = next((t for t in gpu["types"] if t["name"] == type_name), None)
    if vtype is None:
        raise HypervisorError(f"GPU {bus} does not offer the vGPU type {type_name!r}.")
    device_id = (device_id or str(uuidlib.uuid4())).lower()
    state["devices"].append({"id": device_id, "kind": DeviceKind.MDEV, "gpu_bus_id": bus,
                             "type_id": vtype["type_id"]})
    return device_id


def add_domain(state: dict, uuid: str, name: str, vcpus: int, ram_mib: int, device_ids: list[str],
               running: bool = True, *, workflow: str = "other", balloon: bool = True) -> None:
    """Add a domain to a state being built; its guest works as `workflow` (fleet.choices.Workflow)
    says, with the balloon driver or (`balloon` false) without."""
    record = _new_record(name, {"vcpus": vcpus, "ram_mib": ram_mib, "vgpus": [i.lower() for i in device_ids]},
                         workflow=workflow, balloon=balloon)
    if running:
        record.update(state=PowerState.RUNNING, live=copy.deepcopy(record["inactive"]))
    state["domains"][_norm_uuid(uuid)] = record

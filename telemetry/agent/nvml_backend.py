"""NVML backend: per-GPU and per-vGPU metrics read through pynvml (package nvidia-ml-py).

Rules it follows, and why (vgpu-facts.md section 4):
- Every NVML call is wrapped on its own: a metric the GPU does not support becomes null, an
  error in one metric never loses the others, and nothing here raises into the server.
- NOT_SUPPORTED (and FUNCTION_NOT_FOUND, an older driver) is permanent for a (GPU, metric):
  the reader is dropped so later polls do not pay for the call. Other errors (GPU lost,
  timeout, ...) are transient: null this poll, retried next poll, reported in `errors`.
- Identity (UUID, name, PCI bus id, total frame buffer) and vGPU instance identity are read
  once and cached; they do not change while the GPU or the vGPU instance exists.
- A vGPU's mdev UUID is the device id the hypervisor knows the instance by (libvirt's
  `<hostdev>` address, `/sys/bus/mdev/devices/<uuid>`), so the dashboard can join what the
  agent sees to the hypervisor's devices by id. The SR-IOV layout of vGPU 17+ has no mdev:
  there NVML answers NOT_SUPPORTED and `mdev_uuid` stays null.
- vGPU utilization is read incrementally: NVML returns samples newer than the timestamp we
  pass, and NOT_FOUND when there is none; we keep the last value per instance then.
- pynvml declares `nvmlVgpuInstanceGetFbUsage` with a 32-bit buffer although the C API
  writes an unsigned long long: values above 4 GiB would wrap (and 4 bytes past the buffer
  get overwritten). We call the C function ourselves with a 64-bit buffer.
- nvmlDeviceGetPcieThroughput (~20 ms) and nvmlDeviceGetSamples (~2.6 ms) block; they are
  never called here.
- Health (issue 19, `health.py` names the fields): each GPU's "health" object lists in
  `unsupported` the fields its GPU cannot report (null, never 0); `throttle_reasons` names the
  bits of the clocks event reasons already read, so it costs no call of its own.
- Critical XIDs arrive as NVML events. One daemon thread waits on one event set holding every
  GPU (nvmlEventSetWait, 200 ms timeout, which answers Timeout in the normal case) and appends
  each XID with the time it arrived to its GPU's buffer; `collect` only drains the buffers, so a
  poll never waits on the driver, each event is reported once, in the first poll after it, and
  its `at` is within 200 ms of when the driver raised it. Waiting at poll time (wait(0) in a
  loop) would need no thread, but nvmlEventData_t carries no timestamp, so every event would
  be dated to the poll, up to a polling interval late.

The `nvml` module is injectable (`NvmlBackend(nvml=fake)`) so the logic is tested without a
GPU; pynvml itself is imported only when no module is given.
"""

from __future__ import annotations

import collections
import ctypes
import logging
import threading
import time
from collections.abc import Callable
from typing import Any

from .health import (
    DRIVER_FIELDS,
    GPU_HEALTH_FIELDS,
    VGPU_HEALTH_FIELDS,
    license_expiry_seconds,
    throttle_flags,
)
from .scheduler_write import SchedulerRefused, holds_vgpus_message

logger = logging.getLogger(__name__)

MIB = 1 << 20

VIRTUALIZATION_MODES = {0: "none", 1: "passthrough", 2: "vgpu_guest", 3: "vgpu_host", 4: "vsga_host"}
VGPU_HOST_MODE = 3
SCHEDULER_POLICIES = {0: "unknown", 1: "best_effort", 2: "equal_share", 3: "fixed_share"}
ARR_MODES = {0: "default", 1: "disabled", 2: "enabled"}
ARR_ENABLED = 2
SCHEDULER_POLICY_NUMBERS = {"best_effort": 1, "equal_share": 2, "fixed_share": 3}
NS_PER_MS = 1_000_000
VM_ID_TYPES = {0: "domain", 1: "uuid"}

# Protocol-v1 GPU fields filled per poll (null until a reader sets them).
GPU_METRICS = (
    "virtualization_mode",
    "util_gpu",
    "util_mem",
    "fb_used_mib",
    "fb_reserved_mib",
    "enc_util",
    "dec_util",
    "temp_c",
    "power_w",
    "sm_clock_mhz",
    "clocks_event_reasons",
)
IDENTITY_FIELDS = ("uuid", "name", "pci_bus_id", "fb_total_mib")

# Health readers that fill several fields from one call: reader name -> fields it fills.
HEALTH_READER_FIELDS = {
    "remapped_rows": (
        "remapped_rows_correctable",
        "remapped_rows_uncorrectable",
        "remapped_rows_pending",
        "remapped_rows_failure",
    ),
}
# Read once: the current ECC mode changes only with a reboot (a new mode is "pending" until then)
# and the thresholds come from the board's VBIOS. Each of these calls costs ~170 µs on an H200,
# ten times a whole poll of the other metrics (docs/agent-health.md).
HEALTH_STATIC = ("ecc_mode", "temp_slowdown_c", "temp_shutdown_c")
ECC_MODES = {0: "disabled", 1: "enabled"}
PSTATE_UNKNOWN = 32
XID_WAIT_MS = 200
# Events kept per GPU between polls; a GPU raising more than this between two polls is broken
# whatever the exact count, and an agent nobody polls must not grow without bound.
XID_BUFFER = 256
# The guest driver version NVML reports while the guest has not loaded its driver.
NOT_AVAILABLE = {"", "not available", "n/a"}
GUEST_INFO_STATES = {0: "uninitialized", 1: "initialized"}
# nvml.h nvmlGridLicenseState_t: the guest has not reported its licence yet.
LICENSE_STATE_UNINITIALIZED = 1

_FAILED = object()


def _text(value: Any) -> str:
    return value.decode(errors="replace") if isinstance(value, bytes) else str(value)


# Appliers turn one NVML return value into protocol fields; one call may fill several.
def _apply_utilization(out: dict, value: Any) -> None:
    out["util_gpu"] = value.gpu
    out["util_mem"] = value.memory


def _apply_memory(out: dict, value: Any) -> None:
    out["fb_used_mib"] = value.used // MIB
    reserved = getattr(value, "reserved", None)
    if reserved is not None:
        out["fb_reserved_mib"] = reserved // MIB


def _apply_encoder(out: dict, value: Any) -> None:
    out["enc_util"] = value[0]


def _apply_decoder(out: dict, value: Any) -> None:
    out["dec_util"] = value[0]


def _apply_temperature(out: dict, value: Any) -> None:
    out["temp_c"] = value


def _apply_power(out: dict, value: Any) -> None:
    out["power_w"] = value / 1000.0


def _apply_sm_clock(out: dict, value: Any) -> None:
    out["sm_clock_mhz"] = value


def _apply_clock_reasons(out: dict, value: Any) -> None:
    out["clocks_event_reasons"] = value


def _apply_virtualization_mode(out: dict, value: Any) -> None:
    out["virtualization_mode"] = VIRTUALIZATION_MODES.get(value, f"unknown_{value}")


def _apply_remapped_rows(out: dict, value: Any) -> None:
    correctable, uncorrectable, pending, failure = value
    out["remapped_rows_correctable"] = correctable
    out["remapped_rows_uncorrectable"] = uncorrectable
    out["remapped_rows_pending"] = bool(pending)
    out["remapped_rows_failure"] = bool(failure)


def _pstate(value: Any) -> str | None:
    return f"P{value}" if 0 <= value < PSTATE_UNKNOWN else None


def _handle_key(handle: Any) -> Any:
    """A hashable key for a device handle: the C pointer's address, which an event's
    `device` shares with the handle nvmlDeviceGetHandleByIndex gave (objects: their identity)."""
    try:
        return ctypes.cast(handle, ctypes.c_void_p).value
    except (TypeError, ctypes.ArgumentError):
        return id(handle)


def _setter(field: str, convert: Callable[[Any], Any]) -> Callable[[dict, Any], None]:
    def apply(out: dict, value: Any) -> None:
        out[field] = convert(value)

    return apply


class _Gpu:
    """Per-GPU state kept between polls: handle, cached identity, live readers, vGPU caches."""

    __slots__ = (
        "index",
        "handle",
        "identity",
        "identity_readers",
        "readers",
        "health_readers",
        "health_static",
        "health_static_readers",
        "unsupported",
        "vgpu_last_ts",
        "vgpu_util",
        "vgpu_identity",
        "vgpu_unsupported",
        "xid_events",
        "xid_state",
    )

    def __init__(self, index: int, handle: Any):
        self.index = index
        self.handle = handle
        self.identity: dict[str, Any] = {
            "uuid": None,
            "index": index,
            "name": None,
            "pci_bus_id": None,
            "fb_total_mib": None,
        }
        self.identity_readers: list[list[Any]] = []
        # Each reader: [metric, function, args, applier]; lists so a fallback can swap the function.
        self.readers: list[list[Any]] = []
        self.health_readers: list[list[Any]] = []
        # Health fields fixed while the driver is loaded, read until read once (like identity).
        self.health_static: dict[str, Any] = {}
        self.health_static_readers: list[list[Any]] = []
        self.unsupported: set[str] = set()
        self.vgpu_last_ts = 0
        self.vgpu_util: dict[int, tuple[int, int, int, int]] = {}
        self.vgpu_identity: dict[int, dict[str, Any]] = {}
        # Per vGPU instance: health fields its driver cannot report (forgotten with the instance).
        self.vgpu_unsupported: dict[int, set[str]] = {}
        # XIDs appended by the event thread, drained by collect (guarded by the backend's lock).
        self.xid_events: collections.deque[dict[str, Any]] = collections.deque(maxlen=XID_BUFFER)
        # "watching", "unsupported", or the error that kept the GPU out of the event set.
        self.xid_state = "unsupported"


class NvmlBackend:
    """Reads protocol-v1 GPU dicts from NVML; one instance per agent process (nvmlInit once)."""

    name = "nvml"

    def __init__(self, nvml: Any = None):
        if nvml is None:
            import pynvml as nvml
        self.nvml = nvml
        self._error = nvml.NVMLError
        self._permanent_codes = {nvml.NVML_ERROR_NOT_SUPPORTED, nvml.NVML_ERROR_FUNCTION_NOT_FOUND}
        self._not_found = nvml.NVML_ERROR_NOT_FOUND
        self._write_statuses = {
            nvml.NVML_ERROR_NOT_SUPPORTED: 501,
            nvml.NVML_ERROR_FUNCTION_NOT_FOUND: 501,
            nvml.NVML_ERROR_INVALID_ARGUMENT: 400,
            nvml.NVML_ERROR_NO_PERMISSION: 403,
            nvml.NVML_ERROR_IN_USE: 409,
        }
        self._lock = threading.Lock()
        self._type_names: dict[int, str] = {}
        self._driver: dict[str, Any] = {}
        self._driver_unsupported: set[str] = set()
        self._xid_lock = threading.Lock()
        self._xid_stop = threading.Event()
        self._xid_thread: threading.Thread | None = None
        self._event_set: Any = None
        nvml.nvmlInit()
        self._gpus: list[_Gpu] = []
        for index in range(nvml.nvmlDeviceGetCount()):
            try:
                handle = nvml.nvmlDeviceGetHandleByIndex(index)
            except self._error as exc:
                # One lost or forbidden GPU must not keep the agent from reporting the others.
                logger.warning("GPU %s: cannot open (%s); not reported", index, exc)
                continue
            gpu = _Gpu(index, handle)
            self._prepare(gpu)
            self._gpus.append(gpu)
        self._watch_xids()

    @property
    def gpu_count(self) -> int:
        return len(self._gpus)

    def _memory_info(self, handle: Any) -> Any:
        """Frame buffer use as nvidia-smi shows it.

        The v1 call counts the driver's reserved memory as used (measured on an H200: 615 MiB
        "used" on an idle GPU where nvidia-smi says 0), so we ask for v2, which reports
        reserved memory apart, and fall back to v1 on drivers or bindings without it.
        """
        version = getattr(self.nvml, "nvmlMemory_v2", None)
        if version is not None:
            try:
                return self.nvml.nvmlDeviceGetMemoryInfo(handle, version=version)
            except TypeError:
                pass
            except self._error as exc:
                if exc.value not in self._permanent_codes:
                    raise
        return self.nvml.nvmlDeviceGetMemoryInfo(handle)

    def _prepare(self, gpu: _Gpu) -> None:
        nvml, h = self.nvml, gpu.handle
        gpu.identity_readers = [
            ["uuid", nvml.nvmlDeviceGetUUID, (h,), _setter("uuid", _text)],
            ["name", nvml.nvmlDeviceGetName, (h,), _setter("name", _text)],
            ["pci_bus_id", nvml.nvmlDeviceGetPciInfo, (h,), _setter("pci_bus_id", lambda v: _text(v.busId))],
            ["fb_total_mib", nvml.nvmlDeviceGetMemoryInfo, (h,), _setter("fb_total_mib", lambda v: v.total // MIB)],
        ]
        reasons_fn = getattr(nvml, "nvmlDeviceGetCurrentClocksEventReasons", None) or getattr(
            nvml, "nvmlDeviceGetCurrentClocksThrottleReasons", None
        )
        readers = [
            ["virtualization_mode", nvml.nvmlDeviceGetVirtualizationMode, (h,), _apply_virtualization_mode],
            ["utilization", nvml.nvmlDeviceGetUtilizationRates, (h,), _apply_utilization],
            ["fb_used_mib", self._memory_info, (h,), _apply_memory],
            ["enc_util", nvml.nvmlDeviceGetEncoderUtilization, (h,), _apply_encoder],
            ["dec_util", nvml.nvmlDeviceGetDecoderUtilization, (h,), _apply_decoder],
            ["temp_c", nvml.nvmlDeviceGetTemperature, (h, nvml.NVML_TEMPERATURE_GPU), _apply_temperature],
            ["power_w", nvml.nvmlDeviceGetPowerUsage, (h,), _apply_power],
            ["sm_clock_mhz", nvml.nvmlDeviceGetClockInfo, (h, nvml.NVML_CLOCK_SM), _apply_sm_clock],
        ]
        if reasons_fn is not None:
            readers.append(["clocks_event_reasons", reasons_fn, (h,), _apply_clock_reasons])
        gpu.readers = readers

        def fn(name: str) -> Callable | None:
            # Bindings older than a call lack its wrapper: the same as a driver without it.
            return getattr(nvml, name, None)

        ecc = fn("nvmlDeviceGetTotalEccErrors")
        corrected, uncorrected = nvml.NVML_MEMORY_ERROR_TYPE_CORRECTED, nvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED
        volatile, aggregate = nvml.NVML_VOLATILE_ECC, nvml.NVML_AGGREGATE_ECC
        health_readers = [
            ["ecc_mode", fn("nvmlDeviceGetEccMode"), (h,), _setter("ecc_mode", lambda v: ECC_MODES.get(v[0]))],
            ["ecc_corrected_volatile", ecc, (h, corrected, volatile), _setter("ecc_corrected_volatile", int)],
            ["ecc_uncorrected_volatile", ecc, (h, uncorrected, volatile), _setter("ecc_uncorrected_volatile", int)],
            ["ecc_corrected_aggregate", ecc, (h, corrected, aggregate), _setter("ecc_corrected_aggregate", int)],
            ["ecc_uncorrected_aggregate", ecc, (h, uncorrected, aggregate),
             _setter("ecc_uncorrected_aggregate", int)],
            ["retired_pages_sbe", fn("nvmlDeviceGetRetiredPages"),
             (h, nvml.NVML_PAGE_RETIREMENT_CAUSE_MULTIPLE_SINGLE_BIT_ECC_ERRORS), _setter("retired_pages_sbe", len)],
            ["retired_pages_dbe", fn("nvmlDeviceGetRetiredPages"),
             (h, nvml.NVML_PAGE_RETIREMENT_CAUSE_DOUBLE_BIT_ECC_ERROR), _setter("retired_pages_dbe", len)],
            ["retired_pages_pending", fn("nvmlDeviceGetRetiredPagesPendingStatus"), (h,),
             _setter("retired_pages_pending", bool)],
            ["remapped_rows", fn("nvmlDeviceGetRemappedRows"), (h,), _apply_remapped_rows],
            ["pcie_replay_counter", fn("nvmlDeviceGetPcieReplayCounter"), (h,), _setter("pcie_replay_counter", int)],
            ["fan_speed_pct", fn("nvmlDeviceGetFanSpeed"), (h,), _setter("fan_speed_pct", float)],
            ["temp_slowdown_c", fn("nvmlDeviceGetTemperatureThreshold"),
             (h, nvml.NVML_TEMPERATURE_THRESHOLD_SLOWDOWN), _setter("temp_slowdown_c", float)],
            ["temp_shutdown_c", fn("nvmlDeviceGetTemperatureThreshold"),
             (h, nvml.NVML_TEMPERATURE_THRESHOLD_SHUTDOWN), _setter("temp_shutdown_c", float)],
            ["power_limit_w", fn("nvmlDeviceGetEnforcedPowerLimit"), (h,),
             _setter("power_limit_w", lambda v: v / 1000.0)],
            ["performance_state", fn("nvmlDeviceGetPerformanceState"), (h,), _setter("performance_state", _pstate)],
        ]
        for reader in health_readers:
            if reader[1] is None:
                gpu.unsupported.add(reader[0])
        available = [reader for reader in health_readers if reader[1] is not None]
        gpu.health_static_readers = [reader for reader in available if reader[0] in HEALTH_STATIC]
        gpu.health_readers = [reader for reader in available if reader[0] not in HEALTH_STATIC]

    # -- error handling -------------------------------------------------------------------

    def _failed(self, gpu: _Gpu, metric: str, exc: Exception, errors: dict[str, str]) -> bool:
        """Record an NVML error; return True if the metric is permanently unavailable on this GPU."""
        code = getattr(exc, "value", None)
        if code in self._permanent_codes:
            if metric not in gpu.unsupported:
                gpu.unsupported.add(metric)
                logger.info("GPU %s: %s not supported (%s); no longer polled", gpu.index, metric, exc)
            return True
        errors[metric] = str(exc)
        return False

    def _call(self, gpu: _Gpu, metric: str, errors: dict[str, str], fn: Callable, *args: Any) -> Any:
        """fn(*args), or _FAILED on an NVML error (recorded); skipped if the metric is unsupported."""
        if metric in gpu.unsupported:
            return _FAILED
        try:
            return fn(*args)
        except self._error as exc:
            self._failed(gpu, metric, exc, errors)
            return _FAILED

    def _run_readers(self, gpu: _Gpu, readers: list[list[Any]], out: dict, errors: dict, drop_ok: bool) -> None:
        """Run readers into `out`; drop those that are unsupported (and, for identity, those that succeeded)."""
        dropped = None
        for reader in readers:
            metric, fn, args, apply = reader
            try:
                apply(out, fn(*args))
                ok = True
            except self._error as first_exc:
                exc = self._retry_with_fallback(reader, first_exc, out)
                ok = exc is None
                if not ok and self._failed(gpu, metric, exc, errors):
                    dropped = dropped or []
                    dropped.append(reader)
            if ok and drop_ok:
                dropped = dropped or []
                dropped.append(reader)
        if dropped:
            readers[:] = [r for r in readers if all(r is not d for d in dropped)]

    def _retry_with_fallback(self, reader: list[Any], exc: Exception, out: dict) -> Exception | None:
        """If the failed call has an older equivalent, switch the reader to it and read now.

        Returns None once a value is read, else the error to record.
        """
        if not self._fallback(reader, exc):
            return exc
        try:
            reader[3](out, reader[1](*reader[2]))
        except self._error as fallback_exc:
            return fallback_exc
        return None

    def _fallback(self, reader: list[Any], exc: Exception) -> bool:
        """Swap in the older ThrottleReasons call when the driver lacks ClocksEventReasons (True if swapped)."""
        throttle = getattr(self.nvml, "nvmlDeviceGetCurrentClocksThrottleReasons", None)
        if (
            reader[0] == "clocks_event_reasons"
            and getattr(exc, "value", None) == self.nvml.NVML_ERROR_FUNCTION_NOT_FOUND
            and throttle is not None
            and reader[1] is not throttle
        ):
            reader[1] = throttle
            return True
        return False

    # -- polling --------------------------------------------------------------------------

    def collect(self, now: float | None = None) -> list[dict[str, Any]]:
        """One poll of every GPU: protocol-v1 GPU dicts (`now` is unused: NVML reads the present).

        Serialized by a lock because the incremental vGPU timestamps and caches are shared
        between the server's request threads.
        """
        with self._lock:
            return [self._collect_gpu(gpu) for gpu in self._gpus]

    def _collect_gpu(self, gpu: _Gpu) -> dict[str, Any]:
        errors: dict[str, str] = {}
        if gpu.identity_readers:
            self._run_readers(gpu, gpu.identity_readers, gpu.identity, errors, drop_ok=True)
        out = dict(gpu.identity)
        for metric in GPU_METRICS:
            out[metric] = None
        self._run_readers(gpu, gpu.readers, out, errors, drop_ok=False)
        out["health"] = self._health(gpu, out, errors)
        if out["virtualization_mode"] == "vgpu_host":
            out["scheduler"] = self._scheduler(gpu, errors)
            out["vgpus"] = self._vgpus(gpu, errors)
        else:
            out["scheduler"] = None
            out["vgpus"] = []
        out["errors"] = errors
        return out

    def _health(self, gpu: _Gpu, out: dict[str, Any], errors: dict[str, str]) -> dict[str, Any]:
        """The GPU's "health" object (contract: HEALTH-CONTRACT, fields in `health.GPU_HEALTH_FIELDS`).

        Transient errors are named by field in the GPU's `errors`, as the other metrics' are."""
        health: dict[str, Any] = dict.fromkeys(GPU_HEALTH_FIELDS)
        local: dict[str, str] = {}
        if gpu.health_static_readers:
            self._run_readers(gpu, gpu.health_static_readers, gpu.health_static, local, drop_ok=True)
        health.update(gpu.health_static)
        self._run_readers(gpu, gpu.health_readers, health, local, drop_ok=False)
        for reader, message in local.items():
            for field in HEALTH_READER_FIELDS.get(reader, (reader,)):
                errors[field] = message
        unsupported = [f for r in gpu.unsupported for f in HEALTH_READER_FIELDS.get(r, (r,)) if f in health]
        health["throttle_reasons"] = throttle_flags(out["clocks_event_reasons"])
        has_reasons = any(reader[0] == "clocks_event_reasons" for reader in gpu.readers)
        if not has_reasons or "clocks_event_reasons" in gpu.unsupported:
            unsupported.append("throttle_reasons")
        elif "clocks_event_reasons" in errors:
            errors["throttle_reasons"] = errors["clocks_event_reasons"]
        if gpu.xid_state == "watching":
            with self._xid_lock:
                health["xid_events"] = list(gpu.xid_events)
                gpu.xid_events.clear()
        elif gpu.xid_state == "unsupported":
            unsupported.append("xid_events")
        else:
            errors["xid_events"] = gpu.xid_state
        health["unsupported"] = sorted(unsupported, key=GPU_HEALTH_FIELDS.index)
        return health

    # -- XID events -----------------------------------------------------------------------

    def _watch_xids(self) -> None:
        """Register every GPU for critical XID events and start the thread that collects them.

        A GPU (or driver) that cannot raise them answers NOT_SUPPORTED: its `xid_events` is null
        and listed as unsupported. Any other failure is reported in `errors` on every poll, since
        an agent that silently watched nothing would pass for a healthy GPU."""
        nvml = self.nvml
        create = getattr(nvml, "nvmlEventSetCreate", None)
        if create is None or not self._gpus:
            return
        try:
            self._event_set = create()
        except self._error as exc:
            state = "unsupported" if exc.value in self._permanent_codes else f"cannot watch XID events: {exc}"
            for gpu in self._gpus:
                gpu.xid_state = state
            return
        watching = False
        for gpu in self._gpus:
            try:
                nvml.nvmlDeviceRegisterEvents(gpu.handle, nvml.nvmlEventTypeXidCriticalError, self._event_set)
            except self._error as exc:
                if exc.value in self._permanent_codes:
                    gpu.xid_state = "unsupported"
                    logger.info("GPU %s: XID events not supported (%s)", gpu.index, exc)
                else:
                    gpu.xid_state = f"cannot watch XID events: {exc}"
                    logger.warning("GPU %s: %s", gpu.index, gpu.xid_state)
                continue
            gpu.xid_state = "watching"
            watching = True
        if watching:
            self._xid_thread = threading.Thread(target=self._xid_loop, name="nvml-xid-events", daemon=True)
            self._xid_thread.start()

    def _xid_loop(self) -> None:
        """Wait for events until close(); each critical XID goes to its GPU's buffer, stamped now."""
        nvml = self.nvml
        by_handle = {_handle_key(gpu.handle): gpu for gpu in self._gpus if gpu.xid_state == "watching"}
        timeout = nvml.NVML_ERROR_TIMEOUT
        while not self._xid_stop.is_set():
            try:
                data = nvml.nvmlEventSetWait(self._event_set, XID_WAIT_MS)
            except self._error as exc:
                if exc.value != timeout:
                    # GPU lost, driver unloading...: retry, without spinning on a broken set.
                    logger.warning("waiting for XID events failed: %s", exc)
                    self._xid_stop.wait(1.0)
                continue
            at = time.time()
            if not data.eventType & nvml.nvmlEventTypeXidCriticalError:
                continue
            gpu = by_handle.get(_handle_key(data.device))
            if gpu is None:
                continue
            with self._xid_lock:
                gpu.xid_events.append({"code": int(data.eventData), "at": at})

    # -- host-wide ------------------------------------------------------------------------

    def driver(self) -> dict[str, Any]:
        """The top-level "driver" block: versions of the driver, NVML and CUDA.

        They cannot change while NVML is initialized (a new driver means unloading the old one),
        so each is read until it has been read once. `vgpu_manager_version` is always null and
        unsupported: NVML has no call for the vGPU software release ("19.2"). nvmlGetVgpuVersion
        answers the range of vGPU versions the manager can negotiate with guests, not its
        release, and answers on hosts without a vGPU manager too (docs/agent-health.md: 18.1 to
        26.1 on a bare-metal H200 with driver 580.159.04, whose vGPU release would be 19.x)."""
        nvml = self.nvml
        errors: dict[str, str] = {}
        calls = (
            ("driver_version", "nvmlSystemGetDriverVersion", _text),
            ("nvml_version", "nvmlSystemGetNVMLVersion", _text),
            ("cuda_driver_version", "nvmlSystemGetCudaDriverVersion", int),
        )
        with self._lock:
            for field, name, convert in calls:
                if field in self._driver or field in self._driver_unsupported:
                    continue
                fn = getattr(nvml, name, None)
                if fn is None:
                    self._driver_unsupported.add(field)
                    continue
                try:
                    self._driver[field] = convert(fn())
                except self._error as exc:
                    if exc.value in self._permanent_codes:
                        self._driver_unsupported.add(field)
                    else:
                        errors[field] = str(exc)
            unsupported = self._driver_unsupported | {"vgpu_manager_version"}
            block = {field: self._driver.get(field) for field in DRIVER_FIELDS}
        block["unsupported"] = [f for f in DRIVER_FIELDS if f in unsupported]
        block["errors"] = errors
        return block

    def _scheduler(self, gpu: _Gpu, errors: dict[str, str]) -> dict[str, Any] | None:
        """The GPU's vGPU scheduler state, or None where the driver cannot report it (pre-R530).

        The parameters are a C union: with ARR on they are (avgFactor, timeslice), else
        (timeslice); the timeslice is in ns, and under ARR it is the inverse of the
        scheduling frequency that `nvidia-smi vgpu set-scheduler-state -asf` sets.
        """
        state = self._call(gpu, "scheduler", errors, self.nvml.nvmlDeviceGetVgpuSchedulerState, gpu.handle)
        if state is _FAILED:
            return None
        arr_mode = state.arrMode
        avg_factor = None
        if arr_mode == ARR_ENABLED:
            params = state.schedulerParams.vgpuSchedDataWithARR
            avg_factor = params.avgFactor
            timeslice_ns = params.timeslice
        else:
            timeslice_ns = state.schedulerParams.vgpuSchedData.timeslice
        return {
            "policy": SCHEDULER_POLICIES.get(state.schedulerPolicy, "unknown"),
            "arr_mode": ARR_MODES.get(arr_mode, "unknown"),
            "avg_factor": avg_factor,
            "timeslice_ms": timeslice_ns / 1e6 if timeslice_ns else None,
            "frequency_hz": round(1e9 / timeslice_ns) if arr_mode == ARR_ENABLED and timeslice_ns else None,
        }

    def _vgpus(self, gpu: _Gpu, errors: dict[str, str]) -> list[dict[str, Any]]:
        nvml = self.nvml
        instances = self._call(gpu, "vgpus", errors, nvml.nvmlDeviceGetActiveVgpus, gpu.handle)
        if instances is _FAILED:
            return []
        instances = [int(i) for i in instances]
        live = set(instances)
        # Instance ids are reused after a VM stops: forget what belonged to vanished instances.
        for cache in (gpu.vgpu_identity, gpu.vgpu_util, gpu.vgpu_unsupported):
            for gone in [i for i in cache if i not in live]:
                del cache[gone]
        self._update_vgpu_utilization(gpu, errors)
        result = []
        for instance in instances:
            row = dict(gpu.vgpu_identity.get(instance) or self._vgpu_identity(gpu, instance, errors))
            fb = self._call(gpu, "vgpu_fb_used_mib", errors, self._vgpu_fb_usage_bytes, instance)
            row["fb_used_mib"] = None if fb is _FAILED else fb // MIB
            util = gpu.vgpu_util.get(instance)
            if util is None:
                row["util_gpu"] = row["util_mem"] = row["enc_util"] = row["dec_util"] = None
            else:
                row["util_gpu"], row["util_mem"], row["enc_util"], row["dec_util"] = util
            stats = self._call(gpu, "vgpu_encoder_stats", errors, nvml.nvmlVgpuInstanceGetEncoderStats, instance)
            if stats is _FAILED:
                row["enc_sessions"] = row["enc_fps"] = row["enc_latency_us"] = None
            else:
                row["enc_sessions"], row["enc_fps"], row["enc_latency_us"] = stats
            self._vgpu_health(gpu, instance, row, errors,
                              encoder_stats_unsupported="vgpu_encoder_stats" in gpu.unsupported)
            result.append(row)
        return result

    def _vgpu_call(self, gpu: _Gpu, instance: int, field: str, errors: dict[str, str], fn: Callable | None,
                   *args: Any) -> Any:
        """fn(*args) for one vGPU health field, or _FAILED: NOT_SUPPORTED (or a binding without the
        function) marks the field unsupported for this instance; other errors go to `errors` as
        vgpu_<field>. Per instance, not per GPU: whether NVML can answer depends on the guest."""
        unsupported = gpu.vgpu_unsupported.setdefault(instance, set())
        if field in unsupported:
            return _FAILED
        if fn is None:
            unsupported.add(field)
            return _FAILED
        try:
            return fn(*args)
        except self._error as exc:
            if getattr(exc, "value", None) in self._permanent_codes:
                unsupported.add(field)
            else:
                errors[f"vgpu_{field}"] = str(exc)
            return _FAILED

    def _vgpu_health(self, gpu: _Gpu, instance: int, row: dict[str, Any], errors: dict[str, str], *,
                     encoder_stats_unsupported: bool) -> None:
        """Licence, guest driver, frame rate limit, encoder sessions and guest state of one vGPU.

        Licence: nvmlVgpuInstanceGetLicenseInfo_v2 (R510+); on older drivers the boolean
        nvmlVgpuInstanceGetLicenseStatus, which has no expiry. While the guest has not reported
        its licence state yet (currentState UNINITIALIZED, e.g. the VM is booting) the state is
        null rather than "unlicensed". An expiry is null unless NVML calls it valid (permanent
        licences and those without an expiry have none)."""
        nvml = self.nvml
        row["license_state"] = row["license_expiry"] = None
        info = self._vgpu_call(gpu, instance, "license_info", errors,
                               getattr(nvml, "nvmlVgpuInstanceGetLicenseInfo_v2", None), instance)
        unsupported = gpu.vgpu_unsupported[instance]
        if info is not _FAILED:
            if getattr(info, "currentState", None) != LICENSE_STATE_UNINITIALIZED:
                row["license_state"] = "licensed" if info.isLicensed else "unlicensed"
            row["license_expiry"] = license_expiry_seconds(info.licenseExpiry)
        elif "license_info" in unsupported:
            status = self._vgpu_call(gpu, instance, "license_state", errors,
                                     getattr(nvml, "nvmlVgpuInstanceGetLicenseStatus", None), instance)
            if status is not _FAILED:
                row["license_state"] = "licensed" if status else "unlicensed"
        if "vgpu_license_info" in errors:
            errors["vgpu_license_state"] = errors["vgpu_license_expiry"] = errors.pop("vgpu_license_info")
        driver = self._vgpu_call(gpu, instance, "guest_driver_version", errors,
                                 getattr(nvml, "nvmlVgpuInstanceGetVmDriverVersion", None), instance)
        text = None if driver is _FAILED else _text(driver).strip()
        row["guest_driver_version"] = None if text is None or text.lower() in NOT_AVAILABLE else text
        limit = self._vgpu_call(gpu, instance, "frame_rate_limit", errors,
                                getattr(nvml, "nvmlVgpuInstanceGetFrameRateLimit", None), instance)
        row["frame_rate_limit"] = None if limit is _FAILED else int(limit)
        row["encoder_sessions"] = row["enc_sessions"]
        if row["encoder_sessions"] is None and not encoder_stats_unsupported:
            errors["vgpu_encoder_sessions"] = errors.get("vgpu_encoder_stats", "not read")
        metadata = self._vgpu_call(gpu, instance, "guest_info_state", errors,
                                   getattr(nvml, "nvmlVgpuInstanceGetMetadata", None), instance)
        row["guest_info_state"] = None if metadata is _FAILED else GUEST_INFO_STATES.get(metadata.guestInfoState)
        named = set(unsupported)
        if "license_info" in named:  # the older call, if any, has no expiry
            named.add("license_expiry")
        if encoder_stats_unsupported:
            named.add("encoder_sessions")
        row["unsupported"] = [f for f in VGPU_HEALTH_FIELDS if f in named]

    def _vgpu_identity(self, gpu: _Gpu, instance: int, errors: dict[str, str]) -> dict[str, Any]:
        """VM id, vGPU UUID, mdev UUID and type name of an instance; cached only once fully read
    (NOT_SUPPORTED counts as read: the field stays null and the call is not made again)."""
        nvml = self.nvml
        local: dict[str, str] = {}
        row: dict[str, Any] = {
            "instance_id": instance,
            "vgpu_uuid": None,
            "mdev_uuid": None,
            "vm_uuid": None,
            "vm_id": None,
            "vm_id_type": None,
            # NVML knows no VM names; the collector takes them from the inventory.
            "vm_name": None,
            "type_name": None,
        }
        vm = self._call(gpu, "vgpu_vm_id", local, nvml.nvmlVgpuInstanceGetVmID, instance)
        if vm is not _FAILED:
            vm_id, id_type = _text(vm[0]), vm[1]
            row["vm_id"] = vm_id
            row["vm_id_type"] = VM_ID_TYPES.get(id_type, str(id_type))
            # KVM reports the VM's UUID; ESXi/Xen a domain id, which is no UUID to match on.
            row["vm_uuid"] = vm_id if id_type == nvml.NVML_VGPU_VM_ID_UUID else None
        uuid = self._call(gpu, "vgpu_uuid", local, nvml.nvmlVgpuInstanceGetUUID, instance)
        if uuid is not _FAILED:
            row["vgpu_uuid"] = _text(uuid)
        # Bindings older than the call have no wrapper for it: the same as a driver without it.
        get_mdev = getattr(nvml, "nvmlVgpuInstanceGetMdevUUID", None)
        mdev = _FAILED if get_mdev is None else self._call(gpu, "vgpu_mdev_uuid", local, get_mdev, instance)
        if mdev is not _FAILED and mdev:
            row["mdev_uuid"] = _text(mdev)
        type_id = self._call(gpu, "vgpu_type", local, nvml.nvmlVgpuInstanceGetType, instance)
        if type_id is not _FAILED:
            name = self._type_names.get(type_id)
            if name is None:
                name = self._call(gpu, "vgpu_type_name", local, nvml.nvmlVgpuTypeGetName, type_id)
                if name is not _FAILED:
                    name = self._type_names[type_id] = _text(name)
            row["type_name"] = None if name is _FAILED else name
        if local:
            errors.update(local)
        else:
            gpu.vgpu_identity[instance] = row
        return row

    def _update_vgpu_utilization(self, gpu: _Gpu, errors: dict[str, str]) -> None:
        """Fold samples newer than the last seen timestamp into the per-instance values."""
        if "vgpu_utilization" in gpu.unsupported:
            return
        try:
            samples = self.nvml.nvmlDeviceGetVgpuUtilization(gpu.handle, gpu.vgpu_last_ts)
        except self._error as exc:
            if getattr(exc, "value", None) != self._not_found:  # NOT_FOUND: no new sample, keep values
                self._failed(gpu, "vgpu_utilization", exc, errors)
            return
        newest = gpu.vgpu_last_ts
        seen: dict[int, int] = {}
        for sample in samples:
            ts = sample.timeStamp
            instance = int(sample.vgpuInstance)
            if ts <= gpu.vgpu_last_ts or ts < seen.get(instance, 0):
                continue
            seen[instance] = ts
            gpu.vgpu_util[instance] = (
                sample.smUtil.uiVal,
                sample.memUtil.uiVal,
                sample.encUtil.uiVal,
                sample.decUtil.uiVal,
            )
            newest = max(newest, ts)
        gpu.vgpu_last_ts = newest

    def _vgpu_fb_usage_bytes(self, instance: int) -> int:
        """Frame buffer used by a vGPU instance, in bytes, read through a 64-bit buffer.

        pynvml's own wrapper passes a c_uint, so readings above 4 GiB wrap; the C signature
        is `nvmlVgpuInstanceGetFbUsage(nvmlVgpuInstance_t, unsigned long long *)`.
        """
        nvml = self.nvml
        get_pointer = getattr(nvml, "_nvmlGetFunctionPointer", None)
        if get_pointer is None:  # a module without ctypes access: trust its own wrapper
            return nvml.nvmlVgpuInstanceGetFbUsage(instance)
        fn = get_pointer("nvmlVgpuInstanceGetFbUsage")
        usage = ctypes.c_ulonglong(0)
        ret = fn(ctypes.c_uint(instance), ctypes.byref(usage))
        if ret != nvml.NVML_SUCCESS:
            raise nvml.NVMLError(ret)
        return usage.value

    def set_scheduler(self, uuid: str, settings: dict[str, Any]) -> dict[str, Any]:
        """Apply scheduler `settings` (checked by `scheduler_write.parse_settings`) to GPU `uuid`
        through nvmlDeviceSetVgpuSchedulerState (R535+); returns the state read back.

        Refused with 409 while the GPU has active vGPUs: the driver only changes the scheduler of
        an empty GPU. NVML errors map to HTTP: NOT_SUPPORTED / FUNCTION_NOT_FOUND 501 (no vGPU
        manager, or a driver before R535), INVALID_ARGUMENT 400, NO_PERMISSION 403 (the agent
        needs root), IN_USE 409, anything else 500. The time slice travels in ns.
        """
        nvml = self.nvml
        gpu = next((g for g in self._gpus if self._uuid_of(g) == uuid), None)
        if gpu is None:
            raise SchedulerRefused(404, f"no GPU with UUID {uuid} on this host")
        with self._lock:
            try:
                active = nvml.nvmlDeviceGetActiveVgpus(gpu.handle)
                if active:
                    raise SchedulerRefused(409, holds_vgpus_message(len(active)))
                state = nvml.c_nvmlVgpuSchedulerSetState_t()
                state.schedulerPolicy = SCHEDULER_POLICY_NUMBERS[settings["policy"]]
                state.enableARRMode = 1 if settings["arr"] else 0
                if settings["arr"]:
                    # 0 leaves a parameter at the driver's default.
                    state.schedulerParams.vgpuSchedDataWithARR.avgFactor = settings.get("avg_factor") or 0
                    state.schedulerParams.vgpuSchedDataWithARR.frequency = settings.get("frequency_hz") or 0
                else:
                    state.schedulerParams.vgpuSchedData.timeslice = (settings.get("timeslice_ms") or 0) * NS_PER_MS
                nvml.nvmlDeviceSetVgpuSchedulerState(gpu.handle, state)
            except self._error as exc:
                status = self._write_statuses.get(getattr(exc, "value", None), 500)
                raise SchedulerRefused(status, f"NVML refused the scheduler change: {exc}") from exc
            errors: dict[str, str] = {}
            reading = self._scheduler(gpu, errors)
        return reading or {"policy": settings["policy"], "errors": errors}

    def _uuid_of(self, gpu: _Gpu) -> str | None:
        """The GPU's UUID, read now if no collection has cached it yet."""
        if gpu.identity.get("uuid") is None:
            try:
                gpu.identity["uuid"] = _text(self.nvml.nvmlDeviceGetUUID(gpu.handle))
            except self._error:
                return None
        return gpu.identity["uuid"]

    def close(self) -> None:
        """Stop watching XIDs, then nvmlShutdown, so a restarted agent in the same process (tests)
        initializes cleanly."""
        self._xid_stop.set()
        if self._xid_thread is not None:
            self._xid_thread.join(timeout=2 * XID_WAIT_MS / 1000 + 1)
        if self._event_set is not None:
            try:
                self.nvml.nvmlEventSetFree(self._event_set)
            except self._error as exc:
                logger.warning("nvmlEventSetFree failed: %s", exc)
        try:
            self.nvml.nvmlShutdown()
        except self._error as exc:
            logger.warning("nvmlShutdown failed: %s", exc)

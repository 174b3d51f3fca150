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

The `nvml` module is injectable (`NvmlBackend(nvml=fake)`) so the logic is tested without a
GPU; pynvml itself is imported only when no module is given.
"""

from __future__ import annotations

import ctypes
import logging
import threading
from collections.abc import Callable
from typing import Any

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
        "unsupported",
        "vgpu_last_ts",
        "vgpu_util",
        "vgpu_identity",
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
        self.unsupported: set[str] = set()
        self.vgpu_last_ts = 0
        self.vgpu_util: dict[int, tuple[int, int, int, int]] = {}
        self.vgpu_identity: dict[int, dict[str, Any]] = {}


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
        if out["virtualization_mode"] == "vgpu_host":
            out["scheduler"] = self._scheduler(gpu, errors)
            out["vgpus"] = self._vgpus(gpu, errors)
        else:
            out["scheduler"] = None
            out["vgpus"] = []
        out["errors"] = errors
        return out

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
        for cache in (gpu.vgpu_identity, gpu.vgpu_util):
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
            result.append(row)
        return result

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
        """nvmlShutdown, so a restarted agent in the same process (tests) initializes cleanly."""
        try:
            self.nvml.nvmlShutdown()
        except self._error as exc:
            logger.warning("nvmlShutdown failed: %s", exc)

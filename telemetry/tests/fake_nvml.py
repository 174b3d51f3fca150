"""A stand-in for the `pynvml` module, so the NVML backend is tested without a GPU.

It returns the same types pynvml returns (its ctypes structures, lists, tuples, ints),
raises pynvml's own NVMLError classes, counts every call, and can be told to fail any
function with any NVML error code, for every GPU or for one. `nvmlVgpuInstanceGetFbUsage`
mimics pynvml's 32-bit declaration (values wrap above 4 GiB) while the C entry point
returned by `_nvmlGetFunctionPointer` is a real ctypes function that writes 64 bits, as
the driver does. The blocking calls the poll must avoid fail the test if called.

Health answers (issue 19) default to what NVML answered on a real H100 80GB HBM3, driver
580.159.04 (reference/vgpu-facts.md, "Health calls measured on a real GPU", and
docs/agent-health.md): ECC enabled with every counter 0, retired pages NOT_SUPPORTED (Ampere and
later remap rows instead), remapped rows (0, 0, 0, 0), PCIe replay counter 0, fan NOT_SUPPORTED
(passively cooled), slowdown 89 °C and shutdown 95 °C, performance state P0; the enforced power
limit is the fake board's own (250 W for the Quadro RTX 6000 it is named after). XID events come
from `xid()`, which the fake event set hands to nvmlEventSetWait as the driver would.

vGPU health answers take the shapes pynvml returns for them (c_nvmlVgpuLicenseInfo_t with its
c_nvmlVgpuLicenseExpiry_t, c_nvmlVgpuMetadata_t, a str driver version, an int frame rate limit),
which no recording of a vGPU host fills for us: the mock library answers NOT_SUPPORTED there.
Their values follow NVIDIA's vGPU documentation: a licensed Q-series vGPU with an expiry date in
UTC calendar fields and status VALID (2), a guest driver of the same branch as the host, the
60 fps frame rate limit that Q-series types default to, guest info state INITIALIZED (1).
"""

from __future__ import annotations

import ctypes
import queue
from collections import Counter
from dataclasses import dataclass, field

import pynvml

GIB = 1 << 30
MIB = 1 << 20
MDEV_MODELING = "2f1c3e4a-6b7d-4e8f-9a0b-1c2d3e4f5a6b"
MDEV_TEXTURING = "8a9b0c1d-2e3f-4a5b-8c7d-9e0f1a2b3c4d"


@dataclass
class FakeVgpu:
    instance: int
    uuid: str
    vm_id: str
    vm_id_type: int = pynvml.NVML_VGPU_VM_ID_UUID
    type_id: int = 401
    type_name: str = "GRID RTX6000-12Q"
    fb_usage_bytes: int = 2 * GIB
    encoder_stats: tuple[int, int, int] = (1, 60, 2800)
    # The instance's mdev UUID; None: an SR-IOV vGPU (vGPU 17+), for which NVML says NOT_SUPPORTED.
    mdev_uuid: str | None = None
    is_licensed: bool = True
    # licExpiry: (year, month, day, hour, min, sec, status); status 2 = VALID, 4 = PERMANENT.
    license_expiry: tuple[int, int, int, int, int, int, int] = (2026, 12, 31, 23, 59, 59, 2)
    # nvmlGridLicenseState_t: 5 = LICENSED, 4 = UNLICENSED, 1 = UNINITIALIZED (guest not reported yet).
    license_state: int = 5
    guest_driver: str = "580.95.05"
    frame_rate_limit: int | None = 60  # None: the frame rate limiter is off (NVML: NOT_SUPPORTED)
    guest_info_state: int = 1


@dataclass
class FakeGpu:
    uuid: str = "GPU-11111111-2222-3333-4444-555555555555"
    name: str = "Quadro RTX 6000"
    bus_id: str = "00000000:3B:00.0"
    fb_total_mib: int = 24576
    fb_used_mib: int = 3072
    fb_reserved_mib: int = 0  # driver-reserved; NVML's v1 memory call counts it as used
    util: tuple[int, int] = (37, 12)
    enc_util: int = 5
    dec_util: int = 2
    temp_c: int = 48
    power_mw: int = 87_500
    sm_clock_mhz: int = 1770
    clock_reasons: int = 0x4
    mode: int = pynvml.NVML_GPU_VIRTUALIZATION_MODE_NONE
    vgpus: list[FakeVgpu] = field(default_factory=list)
    # (instance, timestamp µs, sm %, mem %, enc %, dec %)
    vgpu_samples: list[tuple[int, int, int, int, int, int]] = field(default_factory=list)
    # (policy, arr mode, avg factor, timeslice ns) or None when the driver cannot report it
    scheduler: tuple[int, int, int, int] | None = None
    # Health; None where NVML answers NOT_SUPPORTED.
    ecc_mode: tuple[int, int] | None = (1, 1)
    # (error type, counter type) -> count; missing pairs are 0.
    ecc_errors: dict[tuple[int, int], int] = field(default_factory=dict)
    retired_pages: dict[int, list[int]] | None = None
    retired_pages_pending: int | None = None
    remapped_rows: tuple[int, int, int, int] | None = (0, 0, 0, 0)
    pcie_replay: int | None = 0
    fan_pct: int | None = None
    temp_thresholds: dict[int, int] = field(default_factory=lambda: {
        pynvml.NVML_TEMPERATURE_THRESHOLD_SHUTDOWN: 95, pynvml.NVML_TEMPERATURE_THRESHOLD_SLOWDOWN: 89})
    power_limit_mw: int = 250_000
    pstate: int = 0
    xid_supported: bool = True


@dataclass
class _Event:
    """nvmlEventSetWait's answer (c_nvmlEventData_t's fields) with the fake's own handle."""

    device: FakeGpu
    eventType: int  # noqa: N815 (pynvml's field names)
    eventData: int  # noqa: N815


_FB_USAGE_PROTOTYPE = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_uint, ctypes.POINTER(ctypes.c_ulonglong))


class FakeNvml:
    """Implements the pynvml functions the agent uses over a list of FakeGpu."""

    NVMLError = pynvml.NVMLError

    def __init__(self, gpus: list[FakeGpu]):
        for name in dir(pynvml):
            if name.startswith("NVML_"):
                setattr(self, name, getattr(pynvml, name))
        self.gpus = gpus
        # function name, or (function name, GPU index) -> NVML error code to raise
        self.errors: dict[object, int] = {}
        self.calls: Counter[str] = Counter()
        self.vgpu_utilization_since: list[int] = []
        self.initialized = False
        self._c_fb_usage = _FB_USAGE_PROTOTYPE(self._c_vgpu_fb_usage)
        self.nvmlEventTypeXidCriticalError = pynvml.nvmlEventTypeXidCriticalError
        self.registered: list[FakeGpu] = []
        self.pending_events: queue.Queue = queue.Queue()
        self.event_set_freed = False

    # -- plumbing ---------------------------------------------------------------------------

    def _enter(self, name: str, gpu: FakeGpu | None = None) -> None:
        self.calls[name] += 1
        code = self.errors.get(name)
        if code is None and gpu is not None:
            code = self.errors.get((name, self.gpus.index(gpu)))
        if code is not None:
            raise pynvml.NVMLError(code)

    def _vgpu(self, instance: int) -> tuple[FakeGpu, FakeVgpu]:
        for gpu in self.gpus:
            for vgpu in gpu.vgpus:
                if vgpu.instance == int(instance):
                    return gpu, vgpu
        raise pynvml.NVMLError(pynvml.NVML_ERROR_INVALID_ARGUMENT)

    # -- library ----------------------------------------------------------------------------

    def nvmlInit(self):
        self._enter("nvmlInit")
        self.initialized = True

    def nvmlShutdown(self):
        self._enter("nvmlShutdown")
        self.initialized = False

    def nvmlDeviceGetCount(self):
        self._enter("nvmlDeviceGetCount")
        return len(self.gpus)

    def nvmlDeviceGetHandleByIndex(self, index):
        self._enter("nvmlDeviceGetHandleByIndex")
        return self.gpus[index]

    # -- identity ---------------------------------------------------------------------------

    def nvmlDeviceGetUUID(self, h):
        self._enter("nvmlDeviceGetUUID", h)
        return h.uuid

    def nvmlDeviceGetName(self, h):
        self._enter("nvmlDeviceGetName", h)
        return h.name

    def nvmlDeviceGetPciInfo(self, h):
        self._enter("nvmlDeviceGetPciInfo", h)
        info = pynvml.nvmlPciInfo_t()
        info.busId = h.bus_id.encode()
        return info

    # -- per-GPU metrics --------------------------------------------------------------------

    nvmlMemory_v2 = pynvml.nvmlMemory_v2

    def nvmlDeviceGetMemoryInfo(self, h, version=None):
        total, used, reserved = h.fb_total_mib * MIB, h.fb_used_mib * MIB, h.fb_reserved_mib * MIB
        self._enter("nvmlDeviceGetMemoryInfo", h)  # one pynvml function serves both versions
        if version is None:
            return pynvml.c_nvmlMemory_t(total, total - used - reserved, used + reserved)
        self._enter("nvmlDeviceGetMemoryInfo_v2", h)
        info = pynvml.c_nvmlMemory_v2_t()
        info.version, info.total, info.reserved = version, total, reserved
        info.used, info.free = used, total - used - reserved
        return info

    def nvmlDeviceGetUtilizationRates(self, h):
        self._enter("nvmlDeviceGetUtilizationRates", h)
        return pynvml.c_nvmlUtilization_t(*h.util)

    def nvmlDeviceGetEncoderUtilization(self, h):
        self._enter("nvmlDeviceGetEncoderUtilization", h)
        return [h.enc_util, 167_000]

    def nvmlDeviceGetDecoderUtilization(self, h):
        self._enter("nvmlDeviceGetDecoderUtilization", h)
        return [h.dec_util, 167_000]

    def nvmlDeviceGetTemperature(self, h, sensor):
        self._enter("nvmlDeviceGetTemperature", h)
        assert sensor == pynvml.NVML_TEMPERATURE_GPU
        return h.temp_c

    def nvmlDeviceGetPowerUsage(self, h):
        self._enter("nvmlDeviceGetPowerUsage", h)
        return h.power_mw

    def nvmlDeviceGetClockInfo(self, h, clock_type):
        self._enter("nvmlDeviceGetClockInfo", h)
        assert clock_type == pynvml.NVML_CLOCK_SM
        return h.sm_clock_mhz

    def nvmlDeviceGetCurrentClocksEventReasons(self, h):
        self._enter("nvmlDeviceGetCurrentClocksEventReasons", h)
        return h.clock_reasons

    def nvmlDeviceGetCurrentClocksThrottleReasons(self, h):
        self._enter("nvmlDeviceGetCurrentClocksThrottleReasons", h)
        return h.clock_reasons

    def nvmlDeviceGetVirtualizationMode(self, h):
        self._enter("nvmlDeviceGetVirtualizationMode", h)
        return h.mode

    # -- health -----------------------------------------------------------------------------

    def _supported(self, name: str, h: FakeGpu, value):
        self._enter(name, h)
        if value is None:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED)
        return value

    def nvmlDeviceGetEccMode(self, h):
        return list(self._supported("nvmlDeviceGetEccMode", h, h.ecc_mode))

    def nvmlDeviceGetTotalEccErrors(self, h, error_type, counter_type):
        self._supported("nvmlDeviceGetTotalEccErrors", h, h.ecc_mode)
        return h.ecc_errors.get((error_type, counter_type), 0)

    def nvmlDeviceGetRetiredPages(self, h, cause):
        return list(self._supported("nvmlDeviceGetRetiredPages", h, h.retired_pages).get(cause, []))

    def nvmlDeviceGetRetiredPagesPendingStatus(self, h):
        return self._supported("nvmlDeviceGetRetiredPagesPendingStatus", h, h.retired_pages_pending)

    def nvmlDeviceGetRemappedRows(self, h):
        return self._supported("nvmlDeviceGetRemappedRows", h, h.remapped_rows)

    def nvmlDeviceGetPcieReplayCounter(self, h):
        return self._supported("nvmlDeviceGetPcieReplayCounter", h, h.pcie_replay)

    def nvmlDeviceGetFanSpeed(self, h):
        return self._supported("nvmlDeviceGetFanSpeed", h, h.fan_pct)

    def nvmlDeviceGetTemperatureThreshold(self, h, threshold):
        return self._supported("nvmlDeviceGetTemperatureThreshold", h, h.temp_thresholds.get(threshold))

    def nvmlDeviceGetEnforcedPowerLimit(self, h):
        return self._supported("nvmlDeviceGetEnforcedPowerLimit", h, h.power_limit_mw)

    def nvmlDeviceGetPerformanceState(self, h):
        return self._supported("nvmlDeviceGetPerformanceState", h, h.pstate)

    # -- host-wide ----------------------------------------------------------------------------

    driver_version = "580.159.04"
    nvml_version = "12.580.159.04"
    cuda_driver_version = 13000
    # nvmlGetVgpuVersion: ((supported min, max), (current min, max)), major in bits 31:16.
    vgpu_versions: tuple | None = None

    def nvmlSystemGetDriverVersion(self):
        self._enter("nvmlSystemGetDriverVersion")
        return self.driver_version

    def nvmlSystemGetNVMLVersion(self):
        self._enter("nvmlSystemGetNVMLVersion")
        return self.nvml_version

    def nvmlSystemGetCudaDriverVersion(self):
        self._enter("nvmlSystemGetCudaDriverVersion")
        return self.cuda_driver_version

    def nvmlGetVgpuVersion(self):
        self._enter("nvmlGetVgpuVersion")
        if self.vgpu_versions is None:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED)
        return [tuple(r) for r in self.vgpu_versions]

    # -- XID events ---------------------------------------------------------------------------

    def xid(self, index: int, code: int) -> None:
        """The driver raising critical XID `code` on GPU `index`."""
        self.pending_events.put((self.gpus[index], code))

    def nvmlEventSetCreate(self):
        self._enter("nvmlEventSetCreate")
        return "event-set"

    def nvmlDeviceRegisterEvents(self, h, event_types, event_set):
        self._enter("nvmlDeviceRegisterEvents", h)
        assert event_types == pynvml.nvmlEventTypeXidCriticalError
        assert event_set == "event-set"
        if not h.xid_supported:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED)
        self.registered.append(h)

    def nvmlEventSetWait(self, event_set, timeout_ms):
        self.calls["nvmlEventSetWait"] += 1
        try:
            gpu, code = self.pending_events.get(timeout=timeout_ms / 1000)
        except queue.Empty:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_TIMEOUT) from None
        return _Event(gpu, pynvml.nvmlEventTypeXidCriticalError, code)

    def nvmlEventSetFree(self, event_set):
        self._enter("nvmlEventSetFree")
        self.event_set_freed = True

    # -- vGPU host --------------------------------------------------------------------------

    def _host_only(self, name: str, h: FakeGpu) -> None:
        self._enter(name, h)
        if h.mode != pynvml.NVML_GPU_VIRTUALIZATION_MODE_HOST_VGPU:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED)

    def nvmlDeviceGetActiveVgpus(self, h):
        self._host_only("nvmlDeviceGetActiveVgpus", h)
        return [v.instance for v in h.vgpus]

    def nvmlDeviceGetVgpuSchedulerState(self, h):
        self._host_only("nvmlDeviceGetVgpuSchedulerState", h)
        if h.scheduler is None:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED)
        policy, arr_mode, avg_factor, timeslice_ns = h.scheduler
        state = pynvml.c_nvmlVgpuSchedulerGetState_t()
        state.schedulerPolicy = policy
        state.arrMode = arr_mode
        if arr_mode == pynvml.NVML_VGPU_SCHEDULER_ARR_ENABLE:
            state.schedulerParams.vgpuSchedDataWithARR.avgFactor = avg_factor
            state.schedulerParams.vgpuSchedDataWithARR.timeslice = timeslice_ns
        else:
            state.schedulerParams.vgpuSchedData.timeslice = timeslice_ns
        return state

    def nvmlDeviceGetVgpuUtilization(self, h, last_seen_ts):
        self._host_only("nvmlDeviceGetVgpuUtilization", h)
        self.vgpu_utilization_since.append(last_seen_ts)
        newer = [s for s in h.vgpu_samples if s[1] > last_seen_ts]
        if not newer:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_FOUND)
        samples = []
        for instance, ts, sm, mem, enc, dec in newer:
            sample = pynvml.c_nvmlVgpuInstanceUtilizationSample_t()
            sample.vgpuInstance = instance
            sample.timeStamp = ts
            sample.smUtil.uiVal, sample.memUtil.uiVal = sm, mem
            sample.encUtil.uiVal, sample.decUtil.uiVal = enc, dec
            samples.append(sample)
        return samples

    def nvmlVgpuInstanceGetVmID(self, instance):
        gpu, vgpu = self._vgpu(instance)
        self._enter("nvmlVgpuInstanceGetVmID", gpu)
        return (vgpu.vm_id, vgpu.vm_id_type)

    def nvmlVgpuInstanceGetUUID(self, instance):
        gpu, vgpu = self._vgpu(instance)
        self._enter("nvmlVgpuInstanceGetUUID", gpu)
        return vgpu.uuid

    def nvmlVgpuInstanceGetMdevUUID(self, instance):
        gpu, vgpu = self._vgpu(instance)
        self._enter("nvmlVgpuInstanceGetMdevUUID", gpu)
        if vgpu.mdev_uuid is None:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED)
        return vgpu.mdev_uuid

    def nvmlVgpuInstanceGetType(self, instance):
        gpu, vgpu = self._vgpu(instance)
        self._enter("nvmlVgpuInstanceGetType", gpu)
        return vgpu.type_id

    def nvmlVgpuTypeGetName(self, type_id):
        self._enter("nvmlVgpuTypeGetName")
        for gpu in self.gpus:
            for vgpu in gpu.vgpus:
                if vgpu.type_id == type_id:
                    return vgpu.type_name
        raise pynvml.NVMLError(pynvml.NVML_ERROR_INVALID_ARGUMENT)

    def nvmlVgpuInstanceGetEncoderStats(self, instance):
        gpu, vgpu = self._vgpu(instance)
        self._enter("nvmlVgpuInstanceGetEncoderStats", gpu)
        return vgpu.encoder_stats

    def nvmlVgpuInstanceGetLicenseInfo_v2(self, instance):
        gpu, vgpu = self._vgpu(instance)
        self._enter("nvmlVgpuInstanceGetLicenseInfo_v2", gpu)
        info = pynvml.c_nvmlVgpuLicenseInfo_t()
        info.isLicensed = 1 if vgpu.is_licensed else 0
        expiry = info.licenseExpiry
        (expiry.year, expiry.month, expiry.day, expiry.hour, expiry.min, expiry.sec,
         expiry.status) = vgpu.license_expiry
        info.currentState = vgpu.license_state
        return info

    def nvmlVgpuInstanceGetLicenseStatus(self, instance):
        gpu, vgpu = self._vgpu(instance)
        self._enter("nvmlVgpuInstanceGetLicenseStatus", gpu)
        return 1 if vgpu.is_licensed else 0

    def nvmlVgpuInstanceGetVmDriverVersion(self, instance):
        gpu, vgpu = self._vgpu(instance)
        self._enter("nvmlVgpuInstanceGetVmDriverVersion", gpu)
        return vgpu.guest_driver

    def nvmlVgpuInstanceGetFrameRateLimit(self, instance):
        gpu, vgpu = self._vgpu(instance)
        self._enter("nvmlVgpuInstanceGetFrameRateLimit", gpu)
        if vgpu.frame_rate_limit is None:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED)
        return vgpu.frame_rate_limit

    def nvmlVgpuInstanceGetMetadata(self, instance):
        gpu, vgpu = self._vgpu(instance)
        self._enter("nvmlVgpuInstanceGetMetadata", gpu)
        metadata = pynvml.c_nvmlVgpuMetadata_t()
        metadata.guestInfoState = vgpu.guest_info_state
        metadata.guestDriverVersion = vgpu.guest_driver.encode()
        return metadata

    def nvmlVgpuInstanceGetFbUsage(self, instance):
        """pynvml's wrapper: a c_uint buffer, so the reading wraps at 4 GiB."""
        gpu, vgpu = self._vgpu(instance)
        self._enter("nvmlVgpuInstanceGetFbUsage", gpu)
        return vgpu.fb_usage_bytes & 0xFFFFFFFF

    def _nvmlGetFunctionPointer(self, name):
        self.calls[f"_nvmlGetFunctionPointer:{name}"] += 1
        if name != "nvmlVgpuInstanceGetFbUsage":
            raise pynvml.NVMLError(pynvml.NVML_ERROR_FUNCTION_NOT_FOUND)
        return self._c_fb_usage

    def _c_vgpu_fb_usage(self, instance, usage_pointer):
        """The C entry point: writes an unsigned long long, as the driver does."""
        gpu, vgpu = self._vgpu(instance)
        self.calls["C nvmlVgpuInstanceGetFbUsage"] += 1
        code = self.errors.get("nvmlVgpuInstanceGetFbUsage") or self.errors.get(
            ("nvmlVgpuInstanceGetFbUsage", self.gpus.index(gpu))
        )
        if code:
            return code
        usage_pointer[0] = vgpu.fb_usage_bytes
        return pynvml.NVML_SUCCESS

    # -- calls the poll must never make ------------------------------------------------------

    def nvmlDeviceGetPcieThroughput(self, h, counter):
        raise AssertionError("nvmlDeviceGetPcieThroughput blocks ~20 ms; it must stay out of the poll")

    def nvmlDeviceGetSamples(self, h, sample_type, last_seen_ts):
        raise AssertionError("nvmlDeviceGetSamples blocks ~2.6 ms; it must stay out of the poll")


def vgpu_host(**overrides) -> FakeGpu:
    """A Quadro RTX 6000 in vGPU host mode with two RTX6000-12Q instances (7 and 9)."""
    gpu = FakeGpu(
        mode=pynvml.NVML_GPU_VIRTUALIZATION_MODE_HOST_VGPU,
        vgpus=[
            FakeVgpu(instance=7, uuid="vgpu-aaaa", vm_id="vm-uuid-modeling", fb_usage_bytes=5 * GIB + 512 * MIB,
                     mdev_uuid=MDEV_MODELING),
            FakeVgpu(instance=9, uuid="vgpu-bbbb", vm_id="vm-uuid-texturing", fb_usage_bytes=3 * GIB,
                     mdev_uuid=MDEV_TEXTURING),
        ],
        vgpu_samples=[(7, 1_000, 30, 10, 4, 0), (9, 1_000, 60, 20, 8, 1)],
        scheduler=(pynvml.NVML_VGPU_SCHEDULER_POLICY_BEST_EFFORT, pynvml.NVML_VGPU_SCHEDULER_ARR_DISABLE, 0, 2_000_000),
    )
    for name, value in overrides.items():
        setattr(gpu, name, value)
    return gpu

"""NVIDIA GPU sensors through `pynvml` (the `nvidia-ml-py` package), injected so tests can pass a fake.

Per GPU i (NVML's order):
  nvml{i}.energy         nvmlDeviceGetTotalEnergyConsumption: mJ since the driver loaded (Volta and
                         newer), the primary meter, stored in J. Support is checked: the architecture
                         (nvmlDeviceGetArchitecture >= NVML_DEVICE_ARCH_VOLTA) and a first read.
  nvml{i}.power          nvmlDeviceGetPowerUsage (mW -> W): a 1 s average on Ampere and newer except GA100
  nvml{i}.power_instant  nvmlDeviceGetFieldValues(h, [NVML_FI_DEV_POWER_INSTANT]) (mW -> W); each value's
                         own nvmlReturn is checked and its union member chosen by its valueType
  nvml{i}.util_gpu / util_mem   nvmlDeviceGetUtilizationRates (.gpu / .memory, %)
  nvml{i}.clock_sm / clock_mem  nvmlDeviceGetClockInfo (MHz)
  nvml{i}.temperature    nvmlDeviceGetTemperature(h, NVML_TEMPERATURE_GPU) (°C)
  nvml{i}.pstate         nvmlDeviceGetPerformanceState (0 = P0, the highest)

A call that raises NVMLError_NotSupported at the first read is marked unsupported and not called again.
When NVML cannot start (no package, no library, no driver, no GPU) every one of these ids for GPU 0
reads `Unavailable` with that reason, so the trace and the report say why there is no GPU meter.

This path has NOT run on a GPU yet: it is written against the documented API and tested with a fake.
"""

from __future__ import annotations

from typing import Any, Callable

from telemetry.sensors import Evidence, Kind, Reading, Reason, Sample, Unavailable

# (suffix, quantity, unit, kind, note)
SPECS: tuple[tuple[str, str, str, Kind, str], ...] = (
    ("energy", "gpu_energy", "J", "counter", "nvmlDeviceGetTotalEnergyConsumption (mJ since driver load)"),
    ("power", "gpu_power", "W", "gauge", "nvmlDeviceGetPowerUsage: a 1 s average on Ampere+ (except GA100)"),
    ("power_instant", "gpu_power_instant", "W", "gauge", "nvmlDeviceGetFieldValues NVML_FI_DEV_POWER_INSTANT"),
    ("util_gpu", "gpu_util", "%", "gauge", "nvmlDeviceGetUtilizationRates().gpu"),
    ("util_mem", "gpu_mem_util", "%", "gauge", "nvmlDeviceGetUtilizationRates().memory"),
    ("clock_sm", "gpu_clock_sm", "MHz", "gauge", "nvmlDeviceGetClockInfo NVML_CLOCK_SM"),
    ("clock_mem", "gpu_clock_mem", "MHz", "gauge", "nvmlDeviceGetClockInfo NVML_CLOCK_MEM"),
    ("temperature", "gpu_temperature", "C", "gauge", "nvmlDeviceGetTemperature NVML_TEMPERATURE_GPU"),
    ("pstate", "gpu_pstate", "", "state", "nvmlDeviceGetPerformanceState"),
)

# c_nvmlValue_t member per NVML_VALUE_TYPE_* (0 double, 1 uint, 2 ulong, 3 ulonglong, 4 slonglong, 5 sint, 6 ushort)
VALUE_MEMBERS = ("dVal", "uiVal", "ulVal", "ullVal", "sllVal", "siVal", "usVal")


class FixedUnavailable:
    """A sensor that cannot be read at all on this machine; its every read says why."""

    evidence: Evidence = "measured"

    def __init__(self, sensor_id: str, quantity: str, unit: str, kind: Kind, why: Unavailable,
                 note: str | None = None) -> None:
        self.sensor_id, self.quantity, self.unit, self.kind = sensor_id, quantity, unit, kind
        self.why = Unavailable(sensor_id, why.reason, why.detail)
        self.note = note

    def read(self) -> Reading:
        return self.why


def classify(pynvml: Any, e: BaseException) -> Reason:
    """The typed reason for an NVMLError (by its subclass; pynvml makes one per NVML_ERROR_* code)."""
    for cls_name, reason in (("NVMLError_NotSupported", Reason.NOT_SUPPORTED),
                             ("NVMLError_NoPermission", Reason.PERMISSION_DENIED),
                             ("NVMLError_GpuIsLost", Reason.DISAPPEARED),
                             ("NVMLError_LibraryNotFound", Reason.NO_LIBRARY),
                             ("NVMLError_DriverNotLoaded", Reason.NO_LIBRARY),
                             ("NVMLError_FunctionNotFound", Reason.NOT_SUPPORTED)):
        cls = getattr(pynvml, cls_name, None)
        if isinstance(cls, type) and isinstance(e, cls):
            return reason
    return Reason.ERROR


class NvmlSensor:
    """One NVML query for one GPU; `get()` returns the value in the sensor's unit."""

    evidence: Evidence = "measured"

    def __init__(self, pynvml: Any, index: int, suffix: str, quantity: str, unit: str, kind: Kind, note: str,
                 get: Callable[[], float]) -> None:
        self.nv = pynvml
        self.sensor_id = f"nvml{index}.{suffix}"
        self.quantity, self.unit, self.kind, self.note = quantity, unit, kind, note
        self.get = get
        self.unsupported: Unavailable | None = None
        self.ever_read = False

    def read(self) -> Reading:
        if self.unsupported is not None:
            return self.unsupported
        try:
            v = float(self.get())
        except self.nv.NVMLError as e:
            reason = classify(self.nv, e)
            why = Unavailable(self.sensor_id, reason, f"{'read before, now ' if self.ever_read else ''}"
                                                      f"{type(e).__name__}: {e}")
            if reason == Reason.NOT_SUPPORTED and not self.ever_read:
                self.unsupported = why  # a support answer, not a transient failure: stop asking
            return why
        except _FieldError as e:
            if not self.ever_read and e.reason == Reason.NOT_SUPPORTED:
                self.unsupported = Unavailable(self.sensor_id, e.reason, str(e))
            return Unavailable(self.sensor_id, e.reason, str(e))
        self.ever_read = True
        return Sample(self.sensor_id, v)


class _FieldError(Exception):
    def __init__(self, reason: Reason, text: str) -> None:
        super().__init__(text)
        self.reason = reason


def field_value(pynvml: Any, handle: Any, field_id: int) -> float:
    """One field's value from nvmlDeviceGetFieldValues: its own nvmlReturn checked, the union member
    chosen by its valueType (which varies by driver)."""
    vals = pynvml.nvmlDeviceGetFieldValues(handle, [field_id])
    v = vals[0]
    if v.nvmlReturn != getattr(pynvml, "NVML_SUCCESS", 0):
        reason = Reason.NOT_SUPPORTED if v.nvmlReturn == getattr(pynvml, "NVML_ERROR_NOT_SUPPORTED", 3) else Reason.ERROR
        raise _FieldError(reason, f"field {field_id}: nvmlReturn {v.nvmlReturn}")
    vt = int(v.valueType)
    if not 0 <= vt < len(VALUE_MEMBERS):
        raise _FieldError(Reason.ERROR, f"field {field_id}: unknown valueType {vt}")
    return float(getattr(v.value, VALUE_MEMBERS[vt]))


def _getters(nv: Any, h: Any) -> dict[str, Callable[[], float]]:
    return {
        "energy": lambda: nv.nvmlDeviceGetTotalEnergyConsumption(h) / 1000.0,
        "power": lambda: nv.nvmlDeviceGetPowerUsage(h) / 1000.0,
        "power_instant": lambda: field_value(nv, h, nv.NVML_FI_DEV_POWER_INSTANT) / 1000.0,
        "util_gpu": lambda: nv.nvmlDeviceGetUtilizationRates(h).gpu,
        "util_mem": lambda: nv.nvmlDeviceGetUtilizationRates(h).memory,
        "clock_sm": lambda: nv.nvmlDeviceGetClockInfo(h, nv.NVML_CLOCK_SM),
        "clock_mem": lambda: nv.nvmlDeviceGetClockInfo(h, nv.NVML_CLOCK_MEM),
        "temperature": lambda: nv.nvmlDeviceGetTemperature(h, nv.NVML_TEMPERATURE_GPU),
        "pstate": lambda: nv.nvmlDeviceGetPerformanceState(h),
    }


def unavailable_gpu_sensors(why: Unavailable) -> list[FixedUnavailable]:
    return [FixedUnavailable(f"nvml0.{suffix}", q, unit, kind, why, note) for suffix, q, unit, kind, note in SPECS]


def import_pynvml() -> Any:
    import pynvml  # nvidia-ml-py

    return pynvml


def open_gpu_sensors(pynvml: Any = None, importer: Callable[[], Any] = import_pynvml) -> tuple[list[Any], Any]:
    """(sensors for every GPU NVML sees, the module to shut down at the end or None).

    Never raises: when NVML cannot start, GPU 0's sensor ids read `Unavailable` with the reason.
    """
    nv = pynvml
    if nv is None:
        try:
            nv = importer()
        except ImportError as e:
            return unavailable_gpu_sensors(Unavailable("nvml", Reason.NO_LIBRARY,
                                                       f"the nvidia-ml-py package (pynvml) is not installed: {e}")), None
    try:
        nv.nvmlInit()
    except nv.NVMLError as e:
        reason = classify(nv, e)
        if reason == Reason.ERROR:
            reason = Reason.NO_DEVICE
        return unavailable_gpu_sensors(Unavailable("nvml", reason, f"nvmlInit failed: {type(e).__name__}: {e} "
                                                   "(no NVIDIA driver or GPU on this machine)")), None
    try:
        n = int(nv.nvmlDeviceGetCount())
    except nv.NVMLError as e:
        return unavailable_gpu_sensors(Unavailable("nvml", Reason.ERROR, f"nvmlDeviceGetCount: {e}")), nv
    if n == 0:
        return unavailable_gpu_sensors(Unavailable("nvml", Reason.NO_DEVICE, "NVML sees no GPU")), nv
    sensors: list[Any] = []
    for i in range(n):
        h = nv.nvmlDeviceGetHandleByIndex(i)
        get = _getters(nv, h)
        arch_note = _volta_or_newer(nv, h)
        for suffix, q, unit, kind, note in SPECS:
            if suffix == "energy" and arch_note is not None:
                sensors.append(FixedUnavailable(f"nvml{i}.{suffix}", q, unit, kind,
                                                Unavailable("", Reason.NOT_SUPPORTED, arch_note), note))
                continue
            sensors.append(NvmlSensor(nv, i, suffix, q, unit, kind, note, get[suffix]))
    return sensors, nv


def _volta_or_newer(nv: Any, h: Any) -> str | None:
    """None when the energy counter's architecture check passes (or cannot be asked); else why not."""
    volta = getattr(nv, "NVML_DEVICE_ARCH_VOLTA", None)
    fn = getattr(nv, "nvmlDeviceGetArchitecture", None)
    if volta is None or fn is None:
        return None
    try:
        arch = int(fn(h))
    except nv.NVMLError:
        return None  # unknown architecture: let the first read decide
    unknown = getattr(nv, "NVML_DEVICE_ARCH_UNKNOWN", 0xFFFFFFFF)
    if arch != unknown and arch < volta:
        return f"architecture {arch} is older than Volta ({volta}): no total-energy counter"
    return None

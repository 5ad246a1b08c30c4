"""The sampler and its validity rules against synthetic sensors on a fake clock (pure logic: no process,
no meter), RAPL against a fake powercap tree, and the NVML path against a fake `pynvml` module."""

from __future__ import annotations

import types
from pathlib import Path

import pytest

from analysis.energy import Counter
from telemetry.nvml import open_gpu_sensors
from telemetry.sampler import Sampler
from telemetry.sensors import FakeClock, RaplSensor, Reason, Sample, Unavailable
from telemetry.trace import TraceWriter, read_trace
from telemetry.validity import claim_status, effective_update, energy_gate, evaluate, poll_calibration, updates_in
from ground.config import ConfigError, EnergyInvalidators, TelemetryConfig, load_config

MS = 1_000_000


class Synthetic:
    """A sensor whose value steps every `update_ms` of the fake clock (a gauge: a new level each step;
    a counter: `watts` x elapsed time, published only at each step), optionally lost after `lost_after_ms`."""

    evidence = "measured"

    def __init__(self, clock: FakeClock, sensor_id: str, quantity: str, kind: str, unit: str, update_ms: float,
                 watts: float = 50.0, lost_after_ms: float | None = None) -> None:
        self.clock, self.sensor_id, self.quantity, self.kind, self.unit = clock, sensor_id, quantity, kind, unit
        self.update_ns = int(update_ms * MS)
        self.t0 = clock.mono_ns()
        self.watts = watts
        self.lost_after_ns = None if lost_after_ms is None else int(lost_after_ms * MS)

    def read(self):
        dt = self.clock.mono_ns() - self.t0
        if self.lost_after_ns is not None and dt >= self.lost_after_ns:
            return Unavailable(self.sensor_id, Reason.DISAPPEARED, "GPU is lost")
        step = dt // self.update_ns
        if self.kind == "counter":
            return Sample(self.sensor_id, self.watts * step * self.update_ns / 1e9)
        return Sample(self.sensor_id, self.watts + (step % 7) * 1.5)  # a new level at every step


def sample(tmp_path: Path, sensors_fn, seconds: float, period_ms: float = 20):
    clock = FakeClock()
    sensors = sensors_fn(clock)
    s = Sampler(sensors, clock, TraceWriter(tmp_path / "trace.jsonl"), period_ms, run_id="t")
    s.start()
    s.run_stage("run", int(seconds * 1e9))
    sha, _n = s.close("stopped")
    tr = read_trace(tmp_path / "trace.jsonl")
    assert tr is not None and tr.sha256 == sha and not tr.truncated
    return tr


def validity(tr, phases: dict[str, list[tuple[int, int]]], primary: str | None, period_ms: float = 20):
    sensors = tr.sensors()
    series = {sid: tr.series(sid, "run") for sid in sensors}
    eff = {sid: effective_update(s) for sid, s in series.items()}
    cal = poll_calibration([p["mono_ns"] for p in tr.points], period_ms)
    changes = Counter(series[primary]).changes if primary else []
    upd = {p: updates_in(changes, sp) for p, sp in phases.items()}
    return eff, evaluate(cal, sensors, eff, upd, EnergyInvalidators(), period_ms, primary), upd


def test_power_changing_every_495ms_polled_every_20ms_fires_the_effective_update_invalidator(tmp_path):
    tr = sample(tmp_path, lambda c: [Synthetic(c, "nvml0.power", "gpu_power", "gauge", "W", 495)], 6.0)
    eff, results, _ = validity(tr, {}, None)
    e = eff["nvml0.power"]
    assert e["polls"] == 300 and 480 <= e["effective_update_period_ms"] <= 510  # about 495 ms, seen at 20 ms grain
    assert e["polls_per_update"] > 20  # asked ~25 times per actual change
    fired = {r.id: r for r in results if r.fired}
    assert "gauge_effective_update:nvml0.power" in fired and "logger_calibration" not in fired
    assert fired["gauge_effective_update:nvml0.power"].threshold == 80.0  # 4 x 20 ms, from the frozen config
    claim = claim_status("power_integrated_energy", results, None)
    assert claim["status"] == "withdrawn" and "gauge_effective_update:nvml0.power" in claim["fired"]
    assert claim_status("run_energy", results, None)["status"] == "stands"  # it guards power integration only


def test_a_counter_updating_every_100ms_passes_and_integrates(tmp_path):
    tr = sample(tmp_path, lambda c: [Synthetic(c, "nvml0.energy", "gpu_energy", "counter", "J", 100, watts=50.0)], 4.0)
    t0 = tr.points[0]["wall_ns"]
    phases = {"compute": [(t0 + 200 * MS, t0 + 1700 * MS)], "checkpoint": [(t0 + 2000 * MS, t0 + 3000 * MS)]}
    eff, results, upd = validity(tr, phases, "nvml0.energy")
    assert 95 <= eff["nvml0.energy"]["effective_update_period_ms"] <= 105
    assert not [r.id for r in results if r.fired], [r for r in results if r.fired]
    assert upd == {"compute": 15, "checkpoint": 10}
    for c in ("run_energy", "phase_energy:compute", "phase_energy:checkpoint"):
        assert claim_status(c, results, None)["status"] == "stands"
    # 50 W for 1.5 s and for 1 s, within one counter step (5 J) of the truth.
    ctr = Counter(tr.series("nvml0.energy", "run"))
    assert abs(ctr.integrate(phases["compute"])[0] - 75.0) <= 5.0
    assert abs(ctr.integrate(phases["checkpoint"])[0] - 50.0) <= 5.0


def test_too_few_counter_updates_in_a_short_phase_withdraws_that_phase_only(tmp_path):
    tr = sample(tmp_path, lambda c: [Synthetic(c, "nvml0.energy", "gpu_energy", "counter", "J", 100)], 3.0)
    t0 = tr.points[0]["wall_ns"]
    phases = {"compute": [(t0 + 100 * MS, t0 + 2100 * MS)], "recovery": [(t0 + 2150 * MS, t0 + 2290 * MS)]}
    _eff, results, upd = validity(tr, phases, "nvml0.energy")
    assert upd["recovery"] < 3 <= upd["compute"]
    assert claim_status("phase_energy:recovery", results, None)["status"] == "withdrawn"
    assert claim_status("phase_energy:compute", results, None)["status"] == "stands"


def test_a_late_logger_fires_the_calibration_invalidator():
    mono = [0]
    for k in range(1, 200):
        mono.append(mono[-1] + (60 if k % 4 == 0 else 20) * MS)  # every 4th poll 40 ms late
    cal = poll_calibration(mono, 20)
    res = evaluate(cal, {}, {}, {}, EnergyInvalidators(), 20, None)
    assert res[0].id == "logger_calibration" and res[0].fired and cal["late_polls"] == 49


def _rapl_tree(root: Path) -> None:
    for zone, name, mx in (("intel-rapl:0", "package-0", 1_000_000), ("intel-rapl:0:0", "core", 1_000_000),
                           ("intel-rapl:1", "package-1", 2_000_000), ("intel-rapl:2", "psys", 9_000_000)):
        d = root / zone
        d.mkdir(parents=True)
        (d / "name").write_text(name + "\n")
        (d / "max_energy_range_uj").write_text(f"{mx}\n")
        (d / "energy_uj").write_text("0\n")


def test_a_rapl_counter_that_wraps_is_integrated_correctly_and_nested_zones_are_not_added(tmp_path):
    root = tmp_path / "powercap"
    _rapl_tree(root)
    (root / "intel-rapl:0" / "energy_uj").write_text("900000\n")
    s = RaplSensor(root)
    assert [z.name for z in s.zones] == ["intel-rapl:0", "intel-rapl:1"]  # core nests in package; psys holds both
    assert set(s.skipped) == {"intel-rapl:0:0", "intel-rapl:2"}
    # package-0 wraps at 1,000,000 µJ between the 2nd and 3rd reads; the others move too but are not counted.
    seq = [(900_000, 0), (950_000, 10_000), (50_000, 20_000), (150_000, 30_000)]
    values = []
    for k, (p0, p1) in enumerate(seq):
        (root / "intel-rapl:0" / "energy_uj").write_text(f"{p0}\n")
        (root / "intel-rapl:1" / "energy_uj").write_text(f"{p1}\n")
        (root / "intel-rapl:0:0" / "energy_uj").write_text(f"{123_456 * (k + 1)}\n")
        (root / "intel-rapl:2" / "energy_uj").write_text(f"{7_000_000 + k}\n")
        r = s.read()
        assert isinstance(r, Sample)
        values.append(r.value)
    # package-0: +50,000, +100,000 (wrap), +100,000; package-1: +10,000 each; in J.
    assert values == pytest.approx([0.0, 0.06, 0.17, 0.28]) and s.wraps == 1
    series = [(k * 100 * MS, k * 100 * MS, v, "ok") for k, v in enumerate(values)]
    assert Counter(series).integrate([(0, 300 * MS)])[0] == pytest.approx(0.28)
    assert Counter(series).integrate([(50 * MS, 150 * MS)])[0] == pytest.approx(0.11 / 2 + 0.06 / 2)


def test_a_permission_error_gives_unavailable_with_the_reason(tmp_path):
    root = tmp_path / "powercap"
    _rapl_tree(root)

    def forbidden(p: Path) -> str:
        if p.name == "energy_uj":
            raise PermissionError(13, "Permission denied", str(p))
        return p.read_text()

    r = RaplSensor(root, read_text=forbidden).read()
    assert isinstance(r, Unavailable) and r.reason == Reason.PERMISSION_DENIED
    assert "energy_uj" in r.detail and "CVE-2020-8694" in r.detail
    absent = RaplSensor(tmp_path / "nowhere").read()
    assert isinstance(absent, Unavailable) and absent.reason == Reason.NO_DEVICE and "nowhere" in absent.detail


def test_a_sensor_that_disappears_mid_run_leaves_its_loss_in_the_trace(tmp_path):
    tr = sample(tmp_path, lambda c: [Synthetic(c, "nvml0.energy", "gpu_energy", "counter", "J", 100, lost_after_ms=1500)],
                3.0)
    e = effective_update(tr.series("nvml0.energy", "run"))
    assert e["lost_after_wall_ns"] is not None and e["lost_status"] == "unavailable:disappeared"
    assert 70 <= e["readable_polls"] <= 80  # 1.5 s of 3 s
    t0 = tr.points[0]["wall_ns"]
    energy, coverage = Counter(tr.series("nvml0.energy", "run")).integrate([(t0, t0 + 3000 * MS)])
    assert coverage == pytest.approx(0.5, abs=0.02) and energy == pytest.approx(72.5, abs=5)
    assert Counter(tr.series("nvml0.energy", "run")).integrate([(t0 + 2000 * MS, t0 + 2500 * MS)]) == (None, 0.0)


def test_a_modeled_number_never_passes_an_energy_gate():
    stands = {"status": "stands"}
    assert energy_gate({"value": 12.0, "unit": "J", "evidence": "modeled"}, stands) == "unknown"
    assert energy_gate({"value": None, "unit": "J", "evidence": "unavailable"}, stands) == "unknown"
    assert energy_gate({"value": 12.0, "unit": "J", "evidence": "measured"}, {"status": "withdrawn"}) == "unknown"
    assert energy_gate({"value": 12.0, "unit": "J", "evidence": "measured"}, stands) == "evaluable"


def test_telemetry_config_is_typed_and_names_a_bad_field():
    cfg = load_config({"telemetry": {"poll_period_ms": 50, "invalidators": {"counter_min_updates_per_phase": 5}}})
    assert cfg.telemetry.poll_period_ms == 50 and cfg.telemetry.invalidators.counter_min_updates_per_phase == 5
    assert cfg.telemetry.invalidators.gauge_max_update_factor == 4.0 and isinstance(cfg.telemetry, TelemetryConfig)
    with pytest.raises(ConfigError, match="telemetry.poll_period_ms"):
        load_config({"telemetry": {"poll_period_ms": "fast"}})


# ------------------------------------------------------------------------------------- fake pynvml
def fake_pynvml(*, init_error: str | None = None, arch: int = 8, lost_after: int | None = None):
    """A stand-in for nvidia-ml-py's module: its error classes, constants and the calls the sensors use."""
    nv = types.SimpleNamespace()

    class NVMLError(Exception):
        pass

    for name in ("NotSupported", "NoPermission", "GpuIsLost", "LibraryNotFound", "DriverNotLoaded",
                 "FunctionNotFound", "Unknown"):
        setattr(nv, f"NVMLError_{name}", type(f"NVMLError_{name}", (NVMLError,), {}))
    nv.NVMLError = NVMLError
    nv.NVML_SUCCESS, nv.NVML_ERROR_NOT_SUPPORTED = 0, 3
    nv.NVML_FI_DEV_POWER_INSTANT, nv.NVML_CLOCK_SM, nv.NVML_CLOCK_MEM, nv.NVML_TEMPERATURE_GPU = 186, 1, 2, 0
    nv.NVML_DEVICE_ARCH_VOLTA = 5
    nv.calls = {"clock_mem": 0, "energy": 0}

    def init():
        if init_error:
            raise getattr(nv, init_error)()

    def energy(h):
        nv.calls["energy"] += 1
        if lost_after is not None and nv.calls["energy"] > lost_after:
            raise nv.NVMLError_GpuIsLost()
        return 1_000_000 + 250 * nv.calls["energy"]  # mJ

    def clock(h, which):
        if which == nv.NVML_CLOCK_MEM:
            nv.calls["clock_mem"] += 1
            raise nv.NVMLError_NotSupported()
        return 1410

    def fields(h, ids):
        assert ids == [186]
        value = types.SimpleNamespace(dVal=0.0, uiVal=71_500, ulVal=0, ullVal=0, sllVal=0, siVal=0, usVal=0)
        return [types.SimpleNamespace(fieldId=186, nvmlReturn=0, valueType=1, value=value, timestamp=0)]

    nv.nvmlInit = init
    nv.nvmlShutdown = lambda: None
    nv.nvmlDeviceGetCount = lambda: 1
    nv.nvmlDeviceGetHandleByIndex = lambda i: ("gpu", i)
    nv.nvmlDeviceGetArchitecture = lambda h: arch
    nv.nvmlDeviceGetTotalEnergyConsumption = energy
    nv.nvmlDeviceGetPowerUsage = lambda h: 68_250  # mW
    nv.nvmlDeviceGetFieldValues = fields
    nv.nvmlDeviceGetUtilizationRates = lambda h: types.SimpleNamespace(gpu=97, memory=41)
    nv.nvmlDeviceGetClockInfo = clock
    nv.nvmlDeviceGetTemperature = lambda h, s: 64
    nv.nvmlDeviceGetPerformanceState = lambda h: 0
    return nv


def test_nvml_sensors_read_in_si_units_and_record_support():
    nv = fake_pynvml()
    sensors, handle = open_gpu_sensors(nv)
    assert handle is nv
    by = {s.sensor_id: s for s in sensors}
    got = {sid: s.read() for sid, s in by.items()}
    assert got["nvml0.energy"] == Sample("nvml0.energy", 1000.25)  # mJ -> J
    assert got["nvml0.power"].value == 68.25 and got["nvml0.power_instant"].value == 71.5  # mW -> W
    assert got["nvml0.util_gpu"].value == 97 and got["nvml0.util_mem"].value == 41
    assert got["nvml0.clock_sm"].value == 1410 and got["nvml0.temperature"].value == 64 and got["nvml0.pstate"].value == 0
    assert isinstance(got["nvml0.clock_mem"], Unavailable) and got["nvml0.clock_mem"].reason == Reason.NOT_SUPPORTED
    by["nvml0.clock_mem"].read()
    assert nv.calls["clock_mem"] == 1  # unsupported at the first read: not asked again


def test_nvml_absent_gpu_lost_and_pre_volta_are_typed_reasons():
    sensors, handle = open_gpu_sensors(fake_pynvml(init_error="NVMLError_LibraryNotFound"))
    assert handle is None and len(sensors) == 9
    assert all(isinstance(s.read(), Unavailable) and s.read().reason == Reason.NO_LIBRARY for s in sensors)
    sensors, _ = open_gpu_sensors(fake_pynvml(arch=4))
    e = next(s for s in sensors if s.sensor_id == "nvml0.energy").read()
    assert isinstance(e, Unavailable) and e.reason == Reason.NOT_SUPPORTED and "Volta" in e.detail
    sensors, _ = open_gpu_sensors(fake_pynvml(lost_after=2))
    s = next(s for s in sensors if s.sensor_id == "nvml0.energy")
    assert isinstance(s.read(), Sample) and isinstance(s.read(), Sample)
    lost = s.read()
    assert isinstance(lost, Unavailable) and lost.reason == Reason.DISAPPEARED


def test_missing_pynvml_package_is_no_library():
    def importer():
        raise ImportError("No module named 'pynvml'")

    sensors, handle = open_gpu_sensors(importer=importer)
    r = sensors[0].read()
    assert handle is None and r.reason == Reason.NO_LIBRARY and "nvidia-ml-py" in r.detail


def test_cpu_meter_keeps_an_exited_process_and_does_not_read_a_reused_pid():
    from telemetry.sensors import ModeledCpuEnergy, ProcessCpuMeter

    clock = FakeClock()
    scans = iter([{11: "a", 12: "coord"}, {11: "a", 13: "a"}])  # coord exits; a restarts as pid 13
    cpu = {11: 2.0, 12: 1.0, 13: 0.5}
    meter = ProcessCpuMeter(clock, lambda: next(scans), cpu_s=lambda pid: cpu.get(pid), scan_period_ns=10**9)
    model = ModeledCpuEnergy(meter, watts_per_core=15.0)
    assert meter.read().value == 3.0 and model.read().value == 45.0
    cpu[12] = 99.0  # pid 12 reused by an unrelated process before the next scan is not read after it
    clock.advance_ns(10**9)
    assert meter.read().value == pytest.approx(2.0 + 1.0 + 0.5)
    assert meter.by_process() == {"a": 2.5, "coord": 1.0} and model.evidence == "modeled"

"""Energy analysis: phase attribution on one machine timeline and a truncated trace (synthetic
histories), a lost meter, the run table and the schema. One real small run with the sampler:
tests/live/test_energy.py."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from analysis.energy import energy_section, machine_timeline
from analysis.load import RunHistory
from telemetry.sampler import Sampler
from telemetry.sensors import FakeClock, Reason, Sample, Unavailable
from telemetry.trace import TRACE_NAME, TraceWriter, read_trace

MS = 1_000_000


class Meter:
    """A 50 W device-energy counter that publishes every 100 ms of the fake clock."""

    sensor_id, quantity, unit, kind, evidence = "nvml0.energy", "gpu_energy", "J", "counter", "measured"

    def __init__(self, clock: FakeClock, lost_after_ms: int | None = None) -> None:
        self.clock, self.t0, self.lost_after_ms = clock, clock.mono_ns(), lost_after_ms

    def read(self) -> Sample | Unavailable:
        if self.lost_after_ms is not None and self.clock.mono_ns() - self.t0 >= self.lost_after_ms * MS:
            return Unavailable(self.sensor_id, Reason.DISAPPEARED, "NVMLError_GpuIsLost: GPU is lost")
        return Sample(self.sensor_id, 50.0 * ((self.clock.mono_ns() - self.t0) // (100 * MS)) / 10)


def synthetic_run(tmp_path: Path, lost_after_ms: int | None = None) -> tuple[RunHistory, dict]:
    """0.5 s baseline, 3 s run (site a: compute 0-1.5 s, checkpoint 1.5-2.5 s; site b: collective 1.0-2.0 s),
    0.5 s baseline, on a fake clock; returns the history and the sampler's closing event."""
    clock = FakeClock()
    run_dir = tmp_path / "run"
    s = Sampler([Meter(clock, lost_after_ms)], clock, TraceWriter(run_dir / "logs" / TRACE_NAME), 20, run_id="r")
    s.start()
    s.run_stage("baseline_before", 500 * MS)
    s.run_stage("run", 3000 * MS)
    s.run_stage("baseline_after", 500 * MS)
    sha, n = s.close("stopped")
    t0 = next(p["wall_ns"] for p in read_trace(run_dir / "logs" / TRACE_NAME).points if p["stage"] == "run")

    def span(i: int, site: str, name: str, a_ms: int, b_ms: int) -> dict:
        return {"id": f"{site}:{i}", "event": name, "wall_ns": t0 + b_ms * MS, "mono_ns": b_ms * MS, "pid": 1,
                "epoch": 1, "round": 0, "start_wall_ns": t0 + a_ms * MS, "end_wall_ns": t0 + b_ms * MS}

    closed = {"id": "telemetry:9", "event": "trace_closed", "sha256": sha, "bytes": n, "points": s.i, "wall_ns": 0,
              "mono_ns": 0, "missed_polls": 0, "sampler_cpu_s": 0.1}
    logs = {"a": [span(0, "a", "compute", 0, 1500), span(1, "a", "checkpoint_write", 1500, 2500)],
            "b": [span(0, "b", "collective", 1000, 2000)],
            "telemetry": [{"id": "telemetry:0", "event": "sampler_ready", "wall_ns": 0, "mono_ns": 0}, closed]}
    cfg = {"run_id": "r", "cluster": {"sites": ["a", "b"]}, "telemetry": {"poll_period_ms": 20}}
    return RunHistory(run_dir, cfg, {}, None, logs), closed


def test_one_phase_per_timestamp_by_priority_and_idle_between():
    phases = [{"site": "a", "phase": "compute", "start_ns": 0, "end_ns": 150}, {"site": "a", "phase": "checkpoint",
              "start_ns": 150, "end_ns": 250}, {"site": "b", "phase": "collective", "start_ns": 100, "end_ns": 200},
              {"site": "b", "phase": "replay", "start_ns": 260, "end_ns": 280}]
    assert machine_timeline(phases, 0, 300) == [(0, 100, "compute"), (100, 150, "collective"), (150, 250, "checkpoint"),
                                                (250, 260, "idle"), (260, 280, "replay"), (280, 300, "idle")]


def test_phase_energy_from_the_counter_with_updates_per_phase(tmp_path):
    h, closed = synthetic_run(tmp_path)
    sec = energy_section(h, useful_tokens=1000)
    assert sec["evidence"] == "measured" and sec["gate"]["status"] == "evaluable"
    assert sec["trace"]["sha256"] == closed["sha256"] and sec["trace"]["hash_matches"] and not sec["trace"]["truncated"]
    rows = {p["phase"]: p for p in sec["phases"]}
    assert set(rows) == {"compute", "collective", "checkpoint", "idle"}
    # compute 0-1.0 s (collective outranks it from 1.0 s), collective 1.0-1.5, checkpoint 1.5-2.5, idle to the end.
    assert rows["compute"]["duration"]["value"] == pytest.approx(1.0, abs=0.001)
    assert rows["compute"]["energy"]["value"] == pytest.approx(50.0, abs=5.0)
    assert rows["checkpoint"]["energy"]["value"] == pytest.approx(50.0, abs=5.0)
    assert rows["checkpoint"]["energy_per_token"]["value"] == pytest.approx(0.05, abs=0.005)
    assert rows["checkpoint"]["counter_updates"] == 10 and rows["checkpoint"]["claim"] == "stands"
    assert rows["collective"]["effective_update_equivalents"] == pytest.approx(5.0, abs=0.1)
    assert sec["idle_baseline"]["measured"]["baseline_before"]["value"] == pytest.approx(50.0, abs=10.0)
    assert sum(p["energy"]["value"] for p in sec["phases"]) == pytest.approx(sec["run_energy"]["measured"]["value"])


def test_a_truncated_trace_is_reported_not_a_crash(tmp_path):
    h, closed = synthetic_run(tmp_path)
    path = h.run_dir / "logs" / TRACE_NAME
    data = path.read_bytes()
    path.write_bytes(data[: int(len(data) * 0.6)])  # the sampler was killed mid-write: no end line, a torn point
    tr = read_trace(path)
    assert tr is not None and tr.truncated and any("torn last line" in p for p in tr.problems)
    sec = energy_section(h, useful_tokens=1000)
    assert sec["trace"]["truncated"] and not sec["trace"]["hash_matches"]
    assert any("differs from the one the sampler logged" in p for p in sec["trace"]["problems"])
    assert any("no end line" in p for p in sec["trace"]["problems"])
    cover = {p["phase"]: p["energy"].get("coverage") for p in sec["phases"]}
    assert cover["compute"] == pytest.approx(1.0) and 0 < min(cover.values()) < 1  # the run's end is not in the trace


def test_a_meter_lost_mid_run_is_reported_and_leaves_later_phases_uncovered(tmp_path):
    h, _closed = synthetic_run(tmp_path, lost_after_ms=1800)  # 0.5 s baseline + 1.3 s of the run
    sec = energy_section(h, useful_tokens=1000)
    assert sec["trace"]["sensors_lost"] and "nvml0.energy stopped reading 1.30 s into the run" in \
        sec["trace"]["sensors_lost"][0]
    rows = {p["phase"]: p for p in sec["phases"]}
    assert rows["compute"]["energy"]["coverage"] == pytest.approx(1.0)
    assert rows["checkpoint"]["energy"]["value"] is None and rows["checkpoint"]["energy"]["evidence"] == "unavailable"
    meter = next(m for m in sec["meters"] if m["sensor"] == "nvml0.energy")
    assert meter["disappeared"] and meter["last_status"] == "unavailable:disappeared"


def test_no_sampler_means_unavailable_with_the_reason(tmp_path):
    (tmp_path / "logs").mkdir()
    h = RunHistory(tmp_path, {"cluster": {"sites": ["a"]}, "telemetry": {"enabled": False}}, {}, None, {"a": []})
    sec = energy_section(h, useful_tokens=0)
    assert sec["evidence"] == "unavailable" and "telemetry.enabled is false" in sec["reason"]
    assert sec["gate"]["status"] == "unknown"


def test_the_schema_refuses_a_modeled_number_passed_off_as_measured(tmp_path):
    import jsonschema

    from analysis.artifact import SCHEMA_PATH

    defs = json.loads(SCHEMA_PATH.read_text())["$defs"]
    validator = jsonschema.Draft202012Validator({"$ref": "#/$defs/energy", "$defs": defs})
    h, _closed = synthetic_run(tmp_path)
    sec = json.loads(json.dumps(energy_section(h, useful_tokens=1000)))
    validator.validate(sec)
    bad = json.loads(json.dumps(sec))
    bad["run_energy"]["modeled"] = {"value": 3.0, "unit": "J", "evidence": "measured"}
    with pytest.raises(jsonschema.ValidationError):
        validator.validate(bad)
    bad = json.loads(json.dumps(sec))
    bad["phases"][0]["energy"] = {"value": 3.0, "unit": "J", "evidence": "unavailable"}  # a number with no meter
    with pytest.raises(jsonschema.ValidationError):
        validator.validate(bad)


def test_the_run_table_shows_measured_joules_only_while_their_claim_stands(tmp_path):
    """The learning section's run-level energy cell (a measured H200 run once showed a dash here)."""
    from analysis.energy import energy_metric
    from analysis.report_cells import energy_cell

    h, _ = synthetic_run(tmp_path)
    metric = energy_metric(energy_section(h, useful_tokens=1000))
    assert metric["evidence"] == "measured" and metric["claim"] == "stands"
    cell = energy_cell(metric)
    assert f"{metric['value']:,.0f} J" in cell and "ev-measured" in cell and "—" not in cell
    withdrawn = energy_cell({**metric, "claim": "withdrawn"})
    assert "—" in withdrawn and "invalidator" in withdrawn and "ev-unavailable" in withdrawn
    none = energy_cell({"value": None, "unit": "J", "evidence": "unavailable", "reason": "no_device: no NVML"})
    assert "—" in none and "no_device: no NVML" in none and "ev-unavailable" in none

"""The telemetry sampler: polls every sensor at a fixed period and writes the raw trace.

`Sampler` is the loop (clock and sensors injected, so it is tested on a fake clock). The process
(`python -m telemetry.sampler --run-dir RUN`, or `xdc sampler --run-dir RUN` beside a hand-started
cluster) reads the run's `telemetry` config, samples an idle baseline of `idle_baseline_s` before
the run (then logs `sampler_ready`; the launcher starts the other processes only after it), samples
the run until SIGTERM/SIGINT, samples the idle baseline after (the launcher stops it last, after
every other process), closes the trace and logs its SHA-256 (`trace_closed`). A second signal
skips the after-baseline. Typed events go to `logs/telemetry.jsonl`; the trace to
`logs/telemetry/trace.jsonl`.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
from pathlib import Path
from typing import Any, Callable, Sequence

from telemetry.nvml import open_gpu_sensors
from telemetry.sensors import (Clock, ModeledCpuEnergy, ProcessCpuMeter, RaplSensor, Sample, SystemClock, Unavailable,
                               describe, run_processes)
from telemetry.trace import TRACE_NAME, TraceWriter
from ground.config import TelemetryConfig, config_from_json, to_dict
from ground.stop_request import watch_stop_request

PROCESS_NAME = "telemetry"
STAGES = ("baseline_before", "run", "baseline_after")


def status_of(r: Sample | Unavailable) -> str:
    return "ok" if isinstance(r, Sample) else f"unavailable:{r.reason.value}"


class Sampler:
    """Poll `sensors` every `period_ms` on `clock`, one trace point per poll, on an absolute schedule
    (a late poll does not shift the later ones; polls that could not happen are counted as missed)."""

    def __init__(self, sensors: Sequence[Any], clock: Clock, writer: TraceWriter, period_ms: float, *,
                 log: Any = None, run_id: str = "", flush_every: int = 50) -> None:
        self.sensors = list(sensors)
        self.clock = clock
        self.writer = writer
        self.period_ns = int(period_ms * 1e6)
        self.period_ms = period_ms
        self.log = log
        self.run_id = run_id
        self.i = 0
        self.missed = 0
        self.flush_every = flush_every
        self.status: dict[str, str] = {}
        self.next_ns: int | None = None

    def start(self) -> list[dict[str, Any]]:
        """Ask every sensor once (its support), write the header, log each sensor's support."""
        rows = []
        for s in self.sensors:
            r = s.read()
            row = {**describe(s), "support": status_of(r), "reason": r.text() if isinstance(r, Unavailable) else None}
            rows.append(row)
            self.status[s.sensor_id] = row["support"]
            self._emit("sensor_support", **row)
        self.writer.header(run_id=self.run_id, poll_period_ms=self.period_ms, sensors=rows,
                           clock="wall_ns: CLOCK_REALTIME, mono_ns: CLOCK_MONOTONIC (the event logs' clocks)")
        return rows

    def poll(self, stage: str) -> None:
        wall, mono = self.clock.wall_ns(), self.clock.mono_ns()
        values: dict[str, list[Any]] = {}
        for s in self.sensors:
            r = s.read()
            st = status_of(r)
            values[s.sensor_id] = [r.value if isinstance(r, Sample) else None, st]
            if st != self.status.get(s.sensor_id):  # a sensor that appears, disappears or changes its reason
                self._emit("sensor_status", sensor=s.sensor_id, status=st, previous=self.status.get(s.sensor_id),
                           point=self.i, detail=r.text() if isinstance(r, Unavailable) else None)
                self.status[s.sensor_id] = st
        self.writer.point(self.i, wall, mono, stage, values)
        self.i += 1
        if self.i % self.flush_every == 0:
            self.writer.flush()

    def run_stage(self, stage: str, duration_ns: int | None, stop: Callable[[], bool] = lambda: False) -> dict[str, int]:
        """Poll until `duration_ns` has passed (None: until `stop()`); returns the stage's bounds and polls."""
        t0_wall, t0 = self.clock.wall_ns(), self.clock.mono_ns()
        first = self.i
        if self.next_ns is None or self.next_ns < t0 - self.period_ns:
            self.next_ns = t0
        while not stop():
            now = self.clock.mono_ns()
            if now > self.next_ns + self.period_ns:  # fell behind: skip the polls that cannot happen any more
                skipped = (now - self.next_ns) // self.period_ns
                self.missed += int(skipped)
                self.next_ns += skipped * self.period_ns
            if duration_ns is not None and self.next_ns - t0 >= duration_ns:
                break  # the stage is [t0, t0 + duration): the poll at its end belongs to the next stage
            self.clock.sleep_until(self.next_ns)
            if stop():
                break
            self.poll(stage)
            self.next_ns += self.period_ns
        return {"start_wall_ns": t0_wall, "end_wall_ns": self.clock.wall_ns(), "start_mono_ns": t0,
                "end_mono_ns": self.clock.mono_ns(), "polls": self.i - first}

    def close(self, reason: str) -> tuple[str, int]:
        return self.writer.close(reason)

    def _emit(self, event: str, **fields: Any) -> None:
        if self.log is not None:
            self.log.emit(event, **fields)


def build_sensors(cfg: TelemetryConfig, run_id: str, clock: Clock) -> tuple[list[Any], ProcessCpuMeter, Any]:
    """Every sensor of this machine, in poll order (the CPU meter before the model that reads it)."""
    gpu, nv = open_gpu_sensors()
    me = os.getpid()
    cpu = ProcessCpuMeter(clock, lambda: run_processes(run_id, exclude={me}),
                          scan_period_ns=cfg.process_scan_period_ms * 1_000_000)
    return [*gpu, RaplSensor(cfg.rapl_root), cpu, ModeledCpuEnergy(cpu, cfg.modeled_cpu_watts_per_core)], cpu, nv


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m telemetry.sampler", description=__doc__)
    ap.add_argument("--run-dir", required=True, type=Path)
    args = ap.parse_args(argv)
    from ground.eventlog import EventLog

    run_dir: Path = args.run_dir
    cfg_all = config_from_json(run_dir / "config.json")
    cfg = cfg_all.telemetry
    run_id = cfg_all.run_id or run_dir.name
    log = EventLog(run_dir / "logs" / f"{PROCESS_NAME}.jsonl", run_id, PROCESS_NAME)
    signals = {"n": 0}

    def on_signal(signum: int, _frame: Any) -> None:
        signals["n"] += 1
        log.emit("signal", signal=signal.Signals(signum).name, count=signals["n"])

    for s in (signal.SIGTERM, signal.SIGINT):
        signal.signal(s, on_signal)
    watch_stop_request(run_dir, PROCESS_NAME)  # the end of a compose run asks through the run directory
    clock = SystemClock()
    sensors, cpu, nv = build_sensors(cfg, run_id, clock)
    trace_path = run_dir / "logs" / TRACE_NAME
    sampler = Sampler(sensors, clock, TraceWriter(trace_path), cfg.poll_period_ms, log=log, run_id=run_id)
    log.emit("sampler_started", poll_period_ms=cfg.poll_period_ms, idle_baseline_s=cfg.idle_baseline_s,
             trace=str(Path("logs") / TRACE_NAME), config=to_dict(cfg))
    sampler.start()
    baseline_ns = int(cfg.idle_baseline_s * 1e9)
    reason = "stopped"
    try:
        b = sampler.run_stage("baseline_before", baseline_ns, stop=lambda: signals["n"] > 0)
        log.emit("idle_baseline", which="before", **b)
        log.emit("sampler_ready")
        r = sampler.run_stage("run", None, stop=lambda: signals["n"] > 0)
        log.emit("run_sampled", **r, missed_polls=sampler.missed)
        if signals["n"] < 2:
            b = sampler.run_stage("baseline_after", baseline_ns, stop=lambda: signals["n"] > 1)
            log.emit("idle_baseline", which="after", **b)
        else:
            reason = "stopped twice: no idle baseline after the run"
    except Exception as e:  # a broken sensor must not lose the trace so far
        reason = f"error: {type(e).__name__}: {e}"
        log.emit("sampler_error", error=reason)
    sha, n_bytes = sampler.close(reason)
    t = os.times()
    log.emit("cpu_by_process", cpu_s=cpu.by_process(), evidence="measured",
             source="utime+stime of /proc/<pid>/stat, last reading of each process")
    log.emit("trace_closed", path=str(Path("logs") / TRACE_NAME), sha256=sha, bytes=n_bytes, points=sampler.i,
             missed_polls=sampler.missed, reason=reason, sampler_cpu_s=t.user + t.system)
    if nv is not None:
        try:
            nv.nvmlShutdown()
        except Exception:
            pass
    log.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Diagnostic (not a benchmark, not a claim): are the simulator's lost tokens exact once the race is given?

A progress-triggered fault lands when the chaos driver, polling the coordinator's log every 0.1 s,
sees the triggering commit, and then acts (a site_crash: SIGKILL and the wait for the exit); how many
inner steps each site had taken of the round in flight then sets the lost tokens. The validation
(bench/sim_validate.py) simulates every held-out run with one fitted delay, so its lost-token claim
mixes that race with the rest of the model. Here each held-out run with progress-triggered faults is
simulated again with the fitted model but the delay set to the one that run's own faults had
(their mean where it had several), measured either to the action's start (`--to start`: the SIGKILL)
or to the logged `fault_injected` (`--to logged`: after the action). It uses the held-out runs' own
measurements, so it is no blind test; it separates "the mechanics are off" from "the race is unknown".
In runs with fault gates (ground/gates.py: every run `xdc compare` records since they were built) the
sites wait at the triggering round's end until the fault has landed, so the delay moves the time and
no longer the work: this diagnostic is for the older recordings.

    python -m bench.sim_lost_given_race [--runs-root runs/sim-validation/root] [--to start|logged]
        [--only SUBSTRING] [--out runs/sim-validation/lost-given-race]
"""

from __future__ import annotations

import argparse
import json
from dataclasses import replace
from pathlib import Path
from typing import Any

from bench.common import ROOT
from bench.sim_validate import SIMVAL_FIT, SIMVAL_ROOT, extra_runs, heldout_comparisons
from ground.eventlog import process_events
from sim import validate
from sim.calibrate import calibrate, triggering_commit
from sim.model import SimModel


def fault_delays_s(run_dir: Path, to: str) -> list[float]:
    """Per progress-triggered fault of the run: seconds from its triggering commit to the action's
    start (`to` = "start") or to the logged fault_injected (`to` = "logged")."""
    coord, chaos = process_events(run_dir, "coord"), process_events(run_dir, "chaos")
    out = []
    for e in chaos:
        c = triggering_commit(coord, e) if e["event"] == "fault_injected" else None
        if c is not None:
            t = e.get("start_mono_ns", e["mono_ns"]) if to == "start" else e["mono_ns"]
            out.append((t - c["mono_ns"]) / 1e9)
    return out


def run(runs_root: Path, fits: list[Path], out: Path, to: str, only: str = "") -> list[dict[str, Any]]:
    cal_runs = sorted(p for p in (runs_root / "noise-floor").glob("noise-seed*") if (p / "config.json").exists())
    cal_runs += extra_runs([f for f in fits if f.is_dir()])
    model = SimModel.from_calibration(calibrate(cal_runs))
    rows = []
    for comp in heldout_comparisons(runs_root):
        if only and only not in comp.name:
            continue
        for r in json.loads((comp / "index.json").read_text())["runs"]:
            emu_dir = Path(r["run_dir"])
            emu_dir = emu_dir if emu_dir.exists() else comp / emu_dir.name
            delays = fault_delays_s(emu_dir, to)
            if not delays:
                continue
            m = replace(model, fault_poll_s=sum(delays) / len(delays))
            sim_dir = validate.simulate_like(emu_dir, m, out / to / comp.name / emu_dir.name)
            emu, sim = validate.measure(emu_dir), validate.measure(sim_dir)
            rows.append({"comparison": comp.name, "policy": emu["policy"],
                         "delays_ms": [round(d * 1e3) for d in delays],
                         "fitted_delay_ms": round(model.fault_poll_s * 1e3), "emulator_lost": emu["lost_tokens"],
                         "simulator_lost": sim["lost_tokens"],
                         "diff": (sim["lost_tokens"] - emu["lost_tokens"]
                                  if sim["lost_tokens"] is not None and emu["lost_tokens"] is not None else None)})
    return rows


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--runs-root", type=Path, default=SIMVAL_ROOT)
    ap.add_argument("--fit", type=Path, action="append", default=[],
                    help="a faulted calibration comparison (repeatable; default: make sim-validate's fit/compare-*)")
    ap.add_argument("--to", choices=("start", "logged"), default="start")
    ap.add_argument("--only", default="", help="only comparisons whose name contains this")
    ap.add_argument("--out", type=Path, default=ROOT / "runs" / "sim-validation" / "lost-given-race")
    args = ap.parse_args(argv)
    fits = args.fit or sorted(p for p in SIMVAL_FIT.glob("compare-*") if p.is_dir())
    rows = run(args.runs_root, fits, args.out, args.to, args.only)
    for r in rows:
        d = r["diff"]
        print(f"{r['comparison']} {r['policy']}: delay {r['delays_ms']} ms (fitted {r['fitted_delay_ms']}), lost "
              f"{r['emulator_lost']:,} emulated / {r['simulator_lost']:,} simulated: "
              + ("exact" if d == 0 else f"{d:+,}"))
    exact = sum(1 for r in rows if r["diff"] == 0)
    print(f"{exact} of {len(rows)} exact with the delay to the {args.to}")
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / f"{args.to}.json").write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

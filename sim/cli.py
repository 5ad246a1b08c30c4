"""`xdc sim` (wired by the roof's CLI to `main`): simulate a scenario, or calibrate from emulator runs.

    run SCENARIO --sites N --policy P|all --out DIR [--config FILE] [--set K=V ...]
        [--calibration FILE] [--max-sim-s S] [--no-logs] [--allow-unfired]
    calibrate RUNS... --out FILE [--allow-simulated]   (emulator run directories, or comparison directories)
    report EMULATOR_DIR --out DIR [--calibration FILE]
    sweep --sites 3,10 --gpus-per-site 0,1024,8192 | --rates 0,0.5 --bandwidths 0,1000
        --policies stall,restart,elastic --modes local,sync --sim-s 600 [--repair-s 60] [--seed 0] [--seeds 3]
        [--workers N | --scheduler tcp://HOST:PORT] [--figure-js inline|cdn] --out DIR

`run` writes one run directory (or, with --policy all, one per policy under DIR) in the
emulator's layout, for `xdc analyze`. Sites are named a..z, then s0026, s0027, ... A scenario with a
progress trigger past the run's target is refused, as `xdc run` refuses it (--allow-unfired: simulate
it anyway); a fault that never fired is reported after the run.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time
from pathlib import Path
from typing import Any

from analysis.load import AnalysisInputError
from chaos.policy_config import config_for_policy
from chaos.reach import ScenarioBeyondRun, check_scenario_fits
from chaos.scenario import ScenarioError, load_scenario
from ground.config import (POLICIES, ConfigError, load_config, merge, parse_override, partial_link_notes,
                           read_config_file)
from sim.calibrate import CalibrationError, read_calibration, write_calibration
from sim.faults import UnsupportedFault
from sim.model import SimModel
from sim.runs import NotEmulated, index_entry, simulate_run, write_index



def site_names(n: int) -> list[str]:
    letters = [chr(ord("a") + i) for i in range(min(n, 26))]
    return letters + [f"s{i:04d}" for i in range(26, n)]


LOG_NOTE_BYTES_PER_ROUND = 50_000_000  # above this, `run` says what its logs will cost


def counter_log_bytes_per_round(n_sites: int) -> int:
    """About how many bytes of `wan_counters` one simulated round of n sites logs (an estimate): every
    site's cumulative snapshot has a tx and an rx row per direction of each of its n-1 site links
    (4 (n-1) rows), of about the size of a representative row. At 1,000 sites: ~0.4 GB a round."""
    row = json.dumps({"side": "rx", "link": "s0000_to_s0001", "direction": "up", "cls": "collective",
                      "bytes": 123456, "messages": 12})
    return n_sites * 4 * max(0, n_sites - 1) * (len(row) + 2)


def _config(args: argparse.Namespace) -> dict[str, Any]:
    data: dict[str, Any] = read_config_file(args.config) if args.config else {}
    if args.sites:
        data = merge(data, {"cluster": {"sites": site_names(args.sites)}})
    for s in args.set or []:
        data = merge(data, parse_override(s))
    for note in partial_link_notes(data):
        print(f"config note: {note}", file=sys.stderr)
    return data


def cmd_run(args: argparse.Namespace) -> int:
    if args.sites < 0:
        print(f"xdc sim: --sites must be at least 1 (0: the config's sites), not {args.sites}", file=sys.stderr)
        return 2
    data = _config(args)
    sites = (data.get("cluster") or {}).get("sites") or load_config({}).cluster.sites
    scenario = load_scenario(args.scenario, sites=sites) if args.scenario != "none" else None
    model = SimModel()
    if args.calibration:
        model = SimModel.from_calibration(read_calibration(args.calibration))
    policies = POLICIES if args.policy == "all" else (args.policy,)
    if scenario is not None:  # a progress trigger past the run's end: refused, as `xdc run` and `xdc compare` do
        try:
            for line in check_scenario_fits(load_config(data), scenario, allow_unfired=args.allow_unfired):
                print(f"warning: {line}", file=sys.stderr)
        except ScenarioBeyondRun as e:
            print(f"xdc sim: scenario error: {e}", file=sys.stderr)
            return 2
    if not args.no_logs:
        per_round = counter_log_bytes_per_round(len(sites))
        if per_round >= LOG_NOTE_BYTES_PER_ROUND:
            print(f"note: with logs, every simulated round writes about {per_round / 1e6:,.0f} MB of byte counters "
                  "(each site logs its cumulative counters over all its site links every round, as the emulator "
                  "does: 4 rows per site pair); use --no-logs for a scale run", file=sys.stderr)
    out = Path(args.out)
    runs: list[dict[str, Any]] = []
    for pol in policies:
        run_dir = out / pol if args.policy == "all" else out
        run_id = f"sim-{pol}-{time.strftime('%Y%m%d-%H%M%S')}"
        cfg = config_for_policy(load_config(merge(data, {"run_id": run_id, "runs_dir": str(out)})), pol, scenario)
        t0 = time.perf_counter()
        res = simulate_run(cfg, scenario, model, None if args.no_logs else run_dir, max_sim_s=args.max_sim_s)
        wall = time.perf_counter() - t0
        runs.append(index_entry(pol, run_dir, res))
        print(f"{pol}: {len(cfg.cluster.sites)} sites, {res.sim_s:,.1f} simulated s in {wall:.2f} wall s; "
              f"{res.commits} commits, {res.epochs} epochs, {res.useful_tokens:,} useful tokens"
              f"{'' if res.complete else ' (not complete)'}" + ("" if args.no_logs else f" -> {run_dir}"))
        for line in res.never_fired:  # loudly, as `xdc run` does: the run says nothing about that fault
            print(f"  NEVER FIRED: {line}")
            print(f"warning: {pol}: NEVER FIRED: {line}", file=sys.stderr)
    if args.policy == "all" and not args.no_logs:  # a comparison directory, as `xdc compare` writes: `xdc analyze DIR`
        write_index(out, runs, scenario)
    return 0


class SweepArgumentError(ValueError):
    """A sweep axis or setting out of its range, or not a number."""


def _csv(text: str, kind: type, name: str = "value", least: float | None = None) -> list[Any]:
    """A comma-separated axis (`name` for the error), each value at least `least` when given."""
    out = []
    for x in (x.strip() for x in text.split(",")):
        if not x:
            continue
        try:
            v = kind(x)
        except ValueError:
            raise SweepArgumentError(f"--{name}: {x!r} is not a{'n integer' if kind is int else ' number'}") from None
        if kind is float and not math.isfinite(v):
            raise SweepArgumentError(f"--{name}: {x!r} is not a finite number")
        if least is not None and v < least:
            raise SweepArgumentError(f"--{name}: {x} is below {least:g}")
        out.append(v)
    if not out:
        raise SweepArgumentError(f"--{name}: no values")
    return out


def cmd_sweep(args: argparse.Namespace) -> int:
    from sim import sweep  # the sweep's plotting and cluster client only when sweeping

    if args.seeds < 1:
        raise SweepArgumentError(f"--seeds must be at least 1, not {args.seeds}")
    if args.workers < 0:
        raise SweepArgumentError(f"--workers must be at least 0 (0: one per core), not {args.workers}")
    if not (math.isfinite(args.sim_s) and math.isfinite(args.repair_s)) or args.sim_s <= 0 or args.repair_s < 0:
        raise SweepArgumentError(f"--sim-s must be above 0 and --repair-s at least 0 (got {args.sim_s:g}, {args.repair_s:g})")
    rates = (_csv(args.rates, float, "rates", 0) if args.rates
             else [sweep.prior_rate(g) for g in _csv(args.gpus_per_site, int, "gpus-per-site", 0)])
    todo = sweep.cells(_csv(args.sites, int, "sites", 1), rates, _csv(args.bandwidths, int, "bandwidths", 0),
                       _csv(args.policies, str, "policies"), _csv(args.modes, str, "modes"), args.sim_s,
                       args.repair_s, args.seed, args.seeds, "given" if args.rates else "prior")
    bad = sorted({c.policy for c in todo} - set(POLICIES)) + sorted({c.mode for c in todo} - {"sync", "local"})
    if bad:
        print(f"xdc sim sweep: unknown policy or mode {bad}", file=sys.stderr)
        return 2
    t0 = time.perf_counter()
    where = f"Dask cluster at {args.scheduler}" if args.scheduler else f"{args.workers or os.cpu_count()} local processes"
    print(f"{len(todo)} cells on {where}", flush=True)
    def told(done: int, total: int, r: dict[str, Any]) -> None:
        print(sweep.progress_line(done, total, r), file=sys.stderr, flush=True)

    try:
        results = (sweep.run_dask(todo, args.scheduler, told) if args.scheduler
                   else sweep.run_local(todo, args.workers, told))
    except sweep.SchedulerUnreachable as e:
        print(f"xdc sim sweep: {e}", file=sys.stderr)
        return 2
    doc = sweep.summarize(results)
    doc["wall_s"], doc["where"] = time.perf_counter() - t0, where
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "sweep.json").write_text(json.dumps(doc, indent=2))
    (out / "table.md").write_text(doc["table_md"] + "\n")
    # inline: the page works offline (~4.7 MB); cdn: a small page that loads plotly.js when opened.
    sweep.figure(doc["results"]).write_html(out / "goodput.html", include_plotlyjs=True if args.figure_js == "inline" else "cdn")
    print(doc["table_md"])
    for f in doc["flips"]:
        print(f"ranking flips along {f['along']}: {f['best_before']} at {f['from']:g} -> {f['best_after']} at "
              f"{f['to']:g} ({', '.join(f'{k}={f[k]}' for k in ('sites', 'rate_per_site_h', 'bandwidth_kbps', 'mode') if k in f)})")
    if args.seeds == 1:
        print("one fault schedule per failure rate (--seeds 1): a ranking from a single draw, no spread to judge it by")
    print(f"{len(todo)} cells in {doc['wall_s']:.1f} s -> {out / 'sweep.json'}, {out / 'goodput.html'}")
    return 0


def cmd_calibrate(args: argparse.Namespace) -> int:
    doc = write_calibration(args.runs, args.out, args.allow_simulated)
    for k, p in sorted(doc["parameters"].items()):
        u = p["uncertainty"]["value"]
        spread = f" ± {u:.2g}" if u is not None else f" ({p['uncertainty']['kind']})"
        print(f"{k} = {p['value']:.6g}{spread} (n={p['n']}, {', '.join(p['source_runs'])})")
    print(f"not fitted (prior): {', '.join(doc['not_fitted'])}\ncalibration: {args.out}")
    return 0


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="xdc sim", description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("run", help="simulate a scenario (a scenario file, or 'none')")
    r.add_argument("scenario")
    r.add_argument("--sites", type=int, default=0, help="number of sites (default: the config's)")
    r.add_argument("--policy", default="restart", choices=(*POLICIES, "all"))
    r.add_argument("--out", required=True)
    r.add_argument("--config")
    r.add_argument("--set", action="append", metavar="K=V")
    r.add_argument("--calibration", help="a calibration file from `xdc sim calibrate`")
    r.add_argument("--max-sim-s", type=float, default=36_000.0, help="stop the virtual clock here")
    r.add_argument("--no-logs", action="store_true", help="write no run directory (scale runs)")
    r.add_argument("--allow-unfired", action="store_true",
                   help="simulate a scenario even if a fault's at_step / at_useful_tokens trigger lies past the "
                        "run's target (that fault cannot fire; it is reported as never fired)")
    c = sub.add_parser("calibrate", help="fit the timing model from emulator run directories")
    c.add_argument("runs", nargs="+", help="emulator run directories, or comparison directories (their policy runs)")
    c.add_argument("--allow-simulated", action="store_true",
                   help="accept simulated runs (a round trip of the fit itself, not a calibration from the emulator)")
    c.add_argument("--out", required=True)
    p = sub.add_parser("report", help="simulate what an emulator comparison ran; the page 'How the simulator works'")
    p.add_argument("emulator_dir", help="a comparison directory from `xdc compare` (or one run directory)")
    p.add_argument("--out", required=True, help="writes DIR/index.html, DIR/artifact.json and DIR/sim/")
    p.add_argument("--calibration", help="a calibration file from `xdc sim calibrate`")
    w = sub.add_parser("sweep", help="sites x failure rate x bandwidth x policy x mode, in parallel")
    w.add_argument("--sites", default="3,10", help="site counts, comma-separated")
    w.add_argument("--gpus-per-site", default="0,1024,8192,65536",
                   help="failure rates from the fleet prior (Llama 3: 419 interruptions / 54 days / 16,384 GPUs)")
    w.add_argument("--rates", default="", help="failures per site-hour instead (overrides --gpus-per-site)")
    w.add_argument("--bandwidths", default="0", help="site-link KB/s, comma-separated (0: unshaped)")
    w.add_argument("--policies", default="stall,restart,elastic")
    w.add_argument("--modes", default="local")
    w.add_argument("--sim-s", type=float, default=600.0, help="simulated seconds per cell")
    w.add_argument("--repair-s", type=float, default=60.0, help="a crashed site is back after this (prior)")
    w.add_argument("--seed", type=int, default=0, help="the first seed of the fault schedules")
    w.add_argument("--seeds", type=int, default=3,
                   help="fault schedules drawn per failure rate (seeds --seed, --seed+1, ...; default 3)")
    w.add_argument("--workers", type=int, default=0, help="local processes (default: one per core)")
    w.add_argument("--scheduler", default="", help="a Dask distributed scheduler's address (tcp://HOST:PORT)")
    w.add_argument("--figure-js", choices=("inline", "cdn"), default="inline",
                   help="goodput.html with plotly.js inside (works offline) or loaded from its CDN (a small file to keep)")
    w.add_argument("--out", required=True)
    return ap


def cmd_report(args: argparse.Namespace) -> int:
    from sim.side_by_side import build  # the analysis and the page only when reporting

    doc = build(Path(args.emulator_dir), Path(args.out), Path(args.calibration) if args.calibration else None)
    n = {k: sum(c["status"] == k for c in doc["claims"]) for k in ("survived", "falsified", "not run")}
    for c in doc["claims"]:
        print(f"{c['status']:>9}  {c['claim']}: {c['detail']}")
    print(f"{n['survived']} survived, {n['falsified']} falsified, {n['not run']} not run -> {Path(args.out) / 'index.html'}")
    if args.calibration:
        print(f"timing model: calibrated ({args.calibration})")
    else:  # the claims then test the prior's guesses, not a fit: say so where the verdicts are read
        print("timing model: the prior (no --calibration): these verdicts judge the uncalibrated guesses; fit one "
              "with `xdc sim calibrate RUNS... --out FILE` (runs not in this comparison) and pass --calibration FILE")
    return 0


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    try:
        return {"run": cmd_run, "calibrate": cmd_calibrate, "report": cmd_report, "sweep": cmd_sweep}[args.cmd](args)
    except (ConfigError, ScenarioError, UnsupportedFault, CalibrationError, AnalysisInputError, NotEmulated,
            SweepArgumentError) as e:
        print(f"xdc sim: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())

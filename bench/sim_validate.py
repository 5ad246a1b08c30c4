"""Benchmark: the simulator against held-out emulator runs (issue 15's validation table).

Calibration: the fault-free noise-floor runs (`runs/noise-floor/noise-seed*`, `make noise-floor`),
fitted by sim/calibrate.py; what they cannot show (restart time, the chaos driver's poll) stays
`prior`. Held out: every four-policy comparison under `runs/compare-*` (`xdc compare`, `make demo`)
whose scenario the simulator models; none of their scenarios is in the calibration set. Each of
their runs is simulated from its own config.json and scenario.json and measured as the emulator's
(sim/validate.py). Nothing is run on the emulator here (minutes per run): the run directories
are reused, named in the result with their scenario, and the result says "not run" without them.
When two comparisons share a scenario, their emulator-to-emulator difference is reported beside
the errors (run-to-run variance: the noise an error cannot be smaller than).

Faulted calibration runs: the fault-free runs show no restart, so `restart_s` stays `prior` with
them alone. `--calibration-extra DIR` (repeatable) adds emulator runs whose scenarios are not held
out, e.g. a study's runs (`runs/studies/<name>-v<version>`: every run directory under its runs/),
and the fit takes restart times (and every other parameter's events) from them too. A held-out
comparison whose scenario name is among the calibration runs' is refused.

Held-out link profiles: a comparison whose site links differ from every calibration run's is its
own held-out condition ("one-outage over site links 60±2 ms 1,000 KB/s (held out)"), judged apart
from the same scenario over the fitted links: the model's collective and transfer times must carry
over to links it was not fitted on. Held-out site counts, the same way: a comparison at a number of
sites no calibration run had ("one-outage at 4 sites (held out)") is its own condition.

Repeats: two comparisons of one scenario (over the same links) are the emulator's repeats; the time and ranking claims are
then judged against the emulator's mean, and are "undecided" where the emulator's own repeats
disagree by more than the simulator does (sim/validate.claims).

Timing bounds: every held-out run is simulated twice more, with the restart time, the chaos
driver's poll delay and a killed process's exit (the crash teardown) at their fitted fewest and at
their most (sim/validate.timing_bounds, into
OUT/timing-bounds); a byte or lost-token miss that this range reaches is "undecided", not falsified.

Result: ratio = the largest time-to-target error against the emulator's mean time of a (scenario,
policy) over its repeats / 10 % (goal <= 1; with one run each, the largest error of a run); passed =
every claim survived (the goal names both: a ratio under 1 with an undecided claim is not a pass).

    make sim-validate     # the emulator runs (about 30 min), then this bench on them
    python -m bench.sim_validate [--runs-root DIR] [--out runs/sim-validate] [--calibration-extra DIR ...]

Without --runs-root it reads `make sim-validate`'s runs (runs/sim-validation/root, with its fit
comparison as the calibration extra) where they exist, else runs/.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from bench.common import ROOT, env_info, write_result
from sim import validate
from sim.calibrate import calibrate, run_dirs
from sim.faults import MODELED_KINDS
from sim.model import SimModel


SIMVAL_ROOT = ROOT / "runs" / "sim-validation" / "root"  # the Makefile's sim-validate target writes these
SIMVAL_FIT = ROOT / "runs" / "sim-validation" / "fit"  # its faulted calibration comparisons: compare-*


def heldout_comparisons(root: Path) -> list[Path]:
    out = []
    for idx in sorted(root.glob("compare-*/index.json")):
        doc = json.loads(idx.read_text())
        kinds = {f["kind"] for f in (doc.get("scenario") or {}).get("faults", [])}
        if doc.get("runs") and not doc.get("interrupted") and not doc.get("simulated") and kinds <= set(MODELED_KINDS):
            out.append(idx.parent)
    return out


def links_of(run_dir: Path) -> str:
    """The run's WAN as a short label: the site links' latency, jitter and bandwidth per direction
    (and the number of per-link overrides). Held-out runs are grouped by scenario *and* this label:
    the same scenario over other links is another held-out condition, not a repeat."""
    wan = json.loads((run_dir / "config.json").read_text()).get("wan", {})
    shown = {}
    for d in ("up", "down"):
        p = (wan.get("site_link") or {}).get(d, {})
        bw = p.get("bandwidth_kbps", 0)
        shown[d] = f"{p.get('latency_ms', 0)}±{p.get('jitter_ms', 0)} ms " + (f"{bw:,} KB/s" if bw else "unshaped")
    label = "site links " + (shown["up"] if shown["up"] == shown["down"] else f"up {shown['up']}, down {shown['down']}")
    n = len(wan.get("link_overrides") or ())
    return label + (f", {n} link override(s)" if n else "")


def sites_of(run_dir: Path) -> int:
    """How many sites the run had (its config's cluster.sites; the default three where it names none).
    A scenario run at a site count the fit never saw is its own held-out condition, as other links
    are: whether the model carries over to more members (a wider collective, more reports a round)."""
    cluster = json.loads((run_dir / "config.json").read_text()).get("cluster") or {}
    return len(cluster.get("sites") or ("a", "b", "c"))


def extra_runs(dirs: list[Path]) -> list[Path]:
    """Run directories named, or a comparison's policy runs (its index.json; the reference run, one
    process, is no calibration input), or those under a study directory's runs/ (each with its
    config.json). A run reached twice (e.g. through a comparison's `latest` link) counts
    once."""
    found: list[Path] = []
    for d in dirs:
        if (d / "config.json").exists():
            found.append(d)
        elif (d / "index.json").exists():  # a comparison: its policy runs (not its one-process reference run)
            found += run_dirs([d])
        else:
            found += sorted(p for p in (*d.glob("*"), *(d / "runs").glob("*"))
                            if (p / "config.json").exists() and not p.is_symlink())
    out: list[Path] = []
    seen: set[Path] = set()
    for p in found:
        if p.resolve() not in seen:
            seen.add(p.resolve())
            out.append(p)
    return out


def run(runs_root: Path, out: Path, extra: list[Path] | None = None, allow_simulated: bool = False) -> dict[str, Any]:
    """The validation over the emulator runs under `runs_root` (`allow_simulated`: simulated stand-ins,
    for the tests of this pipeline; a calibration from them says nothing about the emulator)."""
    cal_runs = sorted(p for p in (runs_root / "noise-floor").glob("noise-seed*") if (p / "config.json").exists())
    cal_runs += extra_runs(extra or [])
    comps = heldout_comparisons(runs_root)
    raw: dict[str, Any] = {"runs_root": str(runs_root), "calibration_runs": [p.name for p in cal_runs],
                           "heldout": [p.name for p in comps]}
    if not cal_runs or not comps:
        raw["claims"] = validate.claims({})
        raw["why_not_run"] = ("no calibration runs (make noise-floor)" if not cal_runs else
                              "no held-out four-policy comparison (make demo / xdc compare)")
        return raw
    cal = calibrate(cal_runs, allow_simulated)
    cal_scenarios = {json.loads((p / "scenario.json").read_text()).get("name") for p in cal_runs
                     if (p / "scenario.json").exists()}
    cal_links = {links_of(p) for p in cal_runs}
    cal_sites = {sites_of(p) for p in cal_runs}
    raw["calibration_links"] = sorted(cal_links)
    raw["calibration_sites"] = sorted(cal_sites)
    model = SimModel.from_calibration(cal)
    bounds = validate.timing_bounds(model, cal)  # restart, poll delay, teardown at their fitted fewest and most
    raw["timing_spread"] = validate.timing_spread(cal)
    raw["calibration"] = {k: {"value": v["value"], "n": v["n"], "half_iqr": v["uncertainty"]["value"]}
                          for k, v in cal["parameters"].items()}
    raw["not_fitted"] = cal["not_fitted"]
    comparisons: dict[str, list[dict[str, Any]]] = {}
    for comp in comps:
        index = json.loads((comp / "index.json").read_text())
        scen = (index.get("scenario") or {}).get("name", "none")
        assert scen not in cal_scenarios, f"{comp.name}: scenario {scen} was used in the calibration"
        rows = []
        for r in index["runs"]:
            emu_dir = Path(r["run_dir"])
            emu_dir = emu_dir if emu_dir.exists() else comp / emu_dir.name
            links, n_sites = links_of(emu_dir), sites_of(emu_dir)
            # The held-out condition: the scenario, and the links and the site count where the fit
            # never saw them.
            held = ([f"over {links}"] if links not in cal_links else []) + \
                ([f"at {n_sites} sites"] if n_sites not in cal_sites else [])
            cond = " ".join([scen, *held, "(held out)"]) if held else scen
            sim_dir = validate.simulate_like(emu_dir, model, out / comp.name / emu_dir.name)
            emu, sim = validate.measure(emu_dir), validate.measure(sim_dir)
            around = [validate.measure(validate.simulate_like(emu_dir, m, out / "timing-bounds" / comp.name /
                                                              f"{emu_dir.name}-{side}"))
                      for side, m in bounds.items()]
            rows.append({"scenario": cond, "links": links, "links_held_out": links not in cal_links,
                         "sites": n_sites, "sites_held_out": n_sites not in cal_sites,
                         "comparison": comp.name, "policy": emu["policy"], "emulator": emu,
                         "simulator": sim, "error": validate.compare(emu, sim),
                         "simulator_bounds": validate.bounds_of([sim, *around]) if around else None,
                         "progress_triggered": validate.progress_triggered(emu_dir)})
        comparisons[f"{comp.name} ({rows[0]['scenario'] if rows else scen})"] = rows
    raw["comparisons"] = comparisons
    raw["claims"] = validate.claims(comparisons)
    raw["table_md"] = validate.table_md(comparisons)
    raw["emulator_run_to_run"] = run_to_run(comparisons)
    return raw


def run_to_run(comparisons: dict[str, list[dict[str, Any]]]) -> list[dict[str, Any]]:
    """Two emulator comparisons of one scenario: their time-to-target difference per policy."""
    by: dict[tuple[str, str], list[float]] = {}
    for rs in comparisons.values():
        for r in rs:
            if r["emulator"]["time_to_target_s"]:
                by.setdefault((r["scenario"], r["policy"]), []).append(r["emulator"]["time_to_target_s"])
    return [{"scenario": s, "policy": p, "time_to_target_s": ts, "spread": (max(ts) - min(ts)) / min(ts)}
            for (s, p), ts in sorted(by.items()) if len(ts) > 1]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--runs-root", default=None,
                    help=f"default: {SIMVAL_ROOT.relative_to(ROOT)} (`make sim-validate`) where it exists, else runs/")
    ap.add_argument("--out", default=str(ROOT / "runs" / "sim-validate"))
    ap.add_argument("--calibration-extra", action="append", default=[], type=Path, metavar="DIR",
                    help="emulator run directories (or a study directory) added to the calibration")
    args = ap.parse_args(argv)
    if args.runs_root is None:  # `make sim-validate`'s runs, with its fit comparison, where they exist
        args.runs_root = SIMVAL_ROOT if SIMVAL_ROOT.is_dir() else ROOT / "runs"
        if SIMVAL_ROOT.is_dir() and not args.calibration_extra:
            args.calibration_extra = sorted(p for p in SIMVAL_FIT.glob("compare-*") if p.is_dir())
    raw = run(Path(args.runs_root), Path(args.out), args.calibration_extra)
    groups = validate.time_groups([r for rs in raw.get("comparisons", {}).values() for r in rs])
    errs = [g["error_vs_mean"] for g in groups if "error_vs_mean" in g]
    ratio = max(errs) / validate.GOALS["time_to_target_s"] if errs else float("nan")
    statuses = {c["claim"]: c["status"] for c in raw["claims"]}
    passed = bool(errs) and all(s == "survived" for s in statuses.values())
    if raw.get("table_md"):
        print(raw["table_md"])
    if any(g.get("emulator_spread") is not None for g in groups):
        raw["time_md"] = validate.time_md(groups)
        print(raw["time_md"])
    for c in raw["claims"]:
        print(f"- {c['claim']}: {c['status']} ({c['runs']} run(s))"
              f"{'; against: ' + '; '.join(c['against']) if c['against'] else ''}"
              f"{'; undecided: ' + '; '.join(c['undecided']) if c.get('undecided') else ''}")
    notes = (f"calibrated on {len(raw['calibration_runs'])} run(s) (fault-free noise-floor runs"
             f"{' and ' + ', '.join(map(str, args.calibration_extra)) if args.calibration_extra else ''}); held out: "
             f"{', '.join(raw['heldout']) or 'none'}; claims: "
             + "; ".join(f"{k}: {v}" for k, v in statuses.items())
             + (f". Not run: {raw['why_not_run']}" if raw.get("why_not_run") else ""))
    write_result("sim_validate", ratio=ratio, goal="<= 1 (time to target within 10 % on every held-out run), and every claim survived",
                 passed=passed, raw=raw, env=env_info("not used (reads run directories)"), notes=notes,
                 reference="fixed_goal", measures=["sim", "site_core", "coordinator", "analysis", "ground", "control"])
    return 0 if passed else 1


if __name__ == "__main__":
    raise SystemExit(main())

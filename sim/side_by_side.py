"""`xdc sim report`: simulate what an emulator comparison ran, and put the two side by side.

    xdc sim report EMULATOR_DIR --out DIR [--calibration FILE]

EMULATOR_DIR is a comparison directory `xdc compare` wrote (or one run directory). For each of its
runs this reads the run's own `config.json` and `scenario.json`, simulates the same configuration,
policy and scenario (sim/world.py) into DIR/sim/<policy>, analyses both sides with the same code
(`analysis.analyze`: emulator numbers stay `measured`, simulated ones are `modeled`), compares them
claim by claim (`claims`, with sim/validate's measurements and tolerances: one definition of each
number for this page and for `bench/sim_validate.py`), and writes DIR/artifact.json (both artifacts' hashes, the claims, the
manifest) and DIR/index.html (sim/page.py: the seed page's "How the simulator works").

Claims, each with its falsifier (the emulator observation that would refute it) and a status:
`survived`, `falsified`, or `not run` (the emulator has no such run, or the simulator does not
model the quantity):
  time to target within 10 %         analysis' active time (anchors: SimAI 98.1 % alignment, Echo ~8 %,
                                     vTrain 8.4 % MAPE)
  lost tokens exact                   for faults triggered by progress
  application bytes within 2 %        the sites' logged payloads: collective, state transfer, checkpoint
  WAN bytes per class within 2 %      the WAN endpoints' counters per class, as the byte ledger reads them
                                     (modeled in the simulator: sim/wan_bytes.py)
  the ranking of the policies by time to target preserved
"""

from __future__ import annotations

import hashlib
import json
import time
from pathlib import Path
from typing import Any

from analysis.analyze import analyze
from analysis.load import expand_inputs
from chaos.scenario import Scenario
from ground.config import load_config, merge
from ground.provenance import code_revision
from sim import validate
from sim.calibrate import read_calibration
from sim.model import SimModel
from sim.runs import NotEmulated, index_entry, simulate_run, write_index
from sim.world import MANIFEST

def _artifact(path: Path, out: Path) -> tuple[dict[str, Any], Path]:
    """The analysis of a comparison or run directory: its own artifact.json, or (when it has none) one
    made now into `out` (the input directory is left as it was). Returns (artifact, its path)."""
    p = path / "artifact.json"
    if not p.is_file():
        p = analyze([path], out, report=False).artifact_path
    return json.loads(p.read_text()), p


def simulate_like(emu_dir: Path, out: Path, model: SimModel) -> tuple[Path, dict[str, tuple[Path, Path]]]:
    """Simulate every run of the emulator directory with its own config and scenario into a comparison
    directory at out/sim. Returns it and, per policy, (emulator run dir, simulated run dir)."""
    runs, _index, _cmp = expand_inputs([emu_dir])
    sim_root = out / "sim"
    entries: list[dict[str, Any]] = []
    pairs: dict[str, tuple[Path, Path]] = {}
    scenario: Scenario | None = None
    for run in runs:
        data = json.loads((run / "config.json").read_text())
        sc_path = run / "scenario.json"
        sc = Scenario.from_dict(json.loads(sc_path.read_text()), source=str(sc_path)) if sc_path.is_file() else None
        scenario = scenario or sc
        policy = data["recovery"]["policy"]
        run_dir = sim_root / policy
        cfg = load_config(merge(data, {"run_id": f"sim-{policy}-{time.strftime('%Y%m%d-%H%M%S')}",
                                       "runs_dir": str(sim_root)}))
        res = simulate_run(cfg, sc, model, run_dir, extra={"emulator_run": str(run)})
        entries.append(index_entry(policy, run_dir, res))
        pairs[policy] = (run, run_dir)
    write_index(sim_root, entries, scenario, emulator_dir=str(emu_dir))
    return sim_root, pairs


def _claim(name: str, falsifier: str, status: str, detail: str, emu: Any = None, sim: Any = None) -> dict[str, Any]:
    return {"claim": name, "falsifier": falsifier, "status": status, "detail": detail, "emulator": emu,
            "simulator": sim}


def compare_pairs(pairs: dict[str, tuple[Path, Path]]) -> list[dict[str, Any]]:
    """Per policy, both run directories measured by sim/validate's functions and their errors."""
    rows = []
    for pol, (emu_dir, sim_dir) in sorted(pairs.items()):
        emu, sim = validate.measure(emu_dir), validate.measure(sim_dir)
        rows.append({"policy": pol, "emulator": emu, "simulator": sim, "error": validate.compare(emu, sim),
                     "progress_triggered": validate.progress_triggered(emu_dir)})
    return rows


def claims(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Every claim the simulator makes about the emulator's runs, per policy, with its status (module
    doc). The numbers and tolerances are sim/validate's, the same as `bench/sim_validate.py`'s."""
    t_tol, b_tol = validate.GOALS["time_to_target_s"], validate.GOALS["bytes"]
    out: list[dict[str, Any]] = []
    for r in rows:
        pol, e, s, x = r["policy"], r["emulator"], r["simulator"], r["error"]
        te, ts = e["time_to_target_s"], s["time_to_target_s"]
        name = f"{pol}: time to target within {t_tol:.0%}"
        if x["time_to_target"] is None:
            out.append(_claim(name, "the emulator's time to target", "not run",
                              "the emulator run has no time to target" if te is None else "the simulated run has none"))
        else:
            out.append(_claim(name, f"a measured time to target more than {t_tol:.0%} away from the simulated one",
                              "survived" if x["time_to_target"] <= t_tol else "falsified",
                              f"simulated {ts:.1f} s vs measured {te:.1f} s ({ts / te - 1:+.1%})", te, ts))
        le, ls = e["lost_tokens"], s["lost_tokens"]
        if x["lost_tokens_diff"] is None or not r["progress_triggered"]:
            why = "a fault not triggered by progress" if x["lost_tokens_diff"] is not None else "a count is missing"
            out.append(_claim(f"{pol}: lost tokens exact", "the emulator's lost tokens", "not run", f"not claimed: {why}"))
        else:
            out.append(_claim(f"{pol}: lost tokens exact", "any difference in lost tokens",
                              "survived" if x["lost_tokens_diff"] == 0 else "falsified",
                              f"simulated {ls:,.0f} vs measured {le:,.0f}", le, ls))
        errs = {c: err for c, err in x["bytes"].items() if err is not None}
        bad = {c: err for c, err in errs.items() if err > b_tol}
        out.append(_claim(f"{pol}: application bytes per class within {b_tol:.0%}",
                          f"a class ({', '.join(validate.BYTE_CLASSES)}) of the sites' logged payload bytes more than "
                          f"{b_tol:.0%} away", "not run" if not errs else ("falsified" if bad else "survived"),
                          "; ".join(f"{c}: simulated {s['bytes'][c]:,} B vs measured {e['bytes'][c]:,} B "
                                    f"({errs[c]:.1%})" for c in errs) or "no class to compare",
                          e["bytes"], s["bytes"]))
        werrs = {c: err for c, err in (x.get("wan_bytes") or {}).items() if err is not None}
        wbad = {c: err for c, err in werrs.items() if err > b_tol}
        out.append(_claim(f"{pol}: inter-site bytes per class through the WAN within {b_tol:.0%}",
                          f"a class ({', '.join(validate.WAN_CLASSES)}) of the WAN endpoints' byte counters more than "
                          f"{b_tol:.0%} away", "not run" if not werrs else ("falsified" if wbad else "survived"),
                          "; ".join(f"{c}: simulated {s['wan_bytes'][c]:,} B vs measured {e['wan_bytes'][c]:,} B "
                                    f"({werrs[c]:.1%})" for c in werrs)
                          or "a side has no byte counters (a run that predates them)",
                          e.get("wan_bytes"), s.get("wan_bytes")))
    if len(rows) >= 2:
        rank_e, rank_s = validate.ranking(rows, "emulator"), validate.ranking(rows, "simulator")
        out.append(_claim("the policies' ranking by time to target is preserved", "a different order in the emulator",
                          "survived" if rank_e == rank_s else "falsified",
                          f"emulator {' < '.join(rank_e)}; simulator {' < '.join(rank_s)}", rank_e, rank_s))
    return out


def build(emu_dir: Path, out: Path, calibration: Path | None = None) -> dict[str, Any]:
    """Simulate, analyse, compare and render; returns the side-by-side artifact (also written to out)."""
    from sim.page import render

    runs, _index, _cmp = expand_inputs([emu_dir])  # AnalysisInputError: not a run or comparison directory
    simulated = [r.name for r in runs if (r / MANIFEST).is_file()]
    if simulated:  # its "measured" column would be the simulator's own output
        raise NotEmulated(f"{emu_dir}: simulated runs ({', '.join(simulated)}: {MANIFEST}); `xdc sim report` "
                          f"compares the simulator with emulator runs (`xdc run` / `xdc compare`)")
    model = SimModel.from_calibration(read_calibration(calibration)) if calibration else SimModel()
    out.mkdir(parents=True, exist_ok=True)
    emu_art, emu_path = _artifact(emu_dir, out / "emulator-analysis")
    sim_root, pairs = simulate_like(emu_dir, out, model)
    sim_art, sim_path = _artifact(sim_root, sim_root)
    manifest = json.loads((sim_root / sim_art["runs"][0]["policy"] / MANIFEST).read_text())
    doc = {"kind": "xdc-sim-side-by-side/1", "emulator_dir": str(emu_dir), "simulated_dir": str(sim_root),
           "calibration": str(calibration) if calibration else None,
           "calibration_sha256": hashlib.sha256(calibration.read_bytes()).hexdigest() if calibration else None,
           "code_revision": code_revision(),
           "artifacts_sha256": {"emulator": hashlib.sha256(emu_path.read_bytes()).hexdigest(),
                                "simulator": hashlib.sha256(sim_path.read_bytes()).hexdigest()},
           "claims": claims(compare_pairs(pairs)), "manifest": manifest}
    (out / "artifact.json").write_text(json.dumps(doc, indent=2, default=str))
    (out / "index.html").write_text(render(emu_art, sim_art, doc), encoding="utf-8")
    return doc

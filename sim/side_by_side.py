"""`xdc sim report`: simulate what an emulator comparison ran, and put the two side by side.

    xdc sim report EMULATOR_DIR --out DIR [--calibration FILE]

EMULATOR_DIR is a comparison directory `xdc compare` wrote (or one run directory). For each of its
runs this reads the run's own `config.json` and `scenario.json`, simulates the same configuration,
policy and scenario (sim/world.py) into DIR/sim/<policy>, analyses both sides with the same code
(`analysis.analyze`: emulator numbers stay `measured`, simulated ones are `modeled`), compares them
claim by claim (`claims`), and writes DIR/artifact.json (both artifacts' hashes, the claims, the
manifest) and DIR/index.html (sim/page.py: the seed page's "How the simulator works").

Claims, each with its falsifier (the emulator observation that would refute it) and a status:
`survived`, `falsified`, or `not run` (the emulator has no such run, or the simulator does not
model the quantity):
  time to target within 10 %        (anchors: SimAI 98.1 % alignment, Echo ~8 %, vTrain 8.4 % MAPE)
  lost tokens exact                  (for faults triggered by progress)
  inter-site bytes within 2 %        (not run: the simulator writes no WAN byte counters yet)
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
from sim.model import SimModel
from sim.world import MANIFEST, simulate

TIME_TOLERANCE = 0.10
BYTES_TOLERANCE = 0.02


def _artifact(path: Path, out: Path) -> tuple[dict[str, Any], Path]:
    """The analysis of a comparison or run directory: its own artifact.json, or (when it has none) one
    made now into `out` (the input directory is left as it was). Returns (artifact, its path)."""
    p = path / "artifact.json"
    if not p.is_file():
        p = analyze([path], out, report=False).artifact_path
    return json.loads(p.read_text()), p


def simulate_like(emu_dir: Path, out: Path, model: SimModel) -> Path:
    """Simulate every run of the emulator directory with its own config and scenario; a comparison
    directory of simulated runs (with index.json) at out/sim."""
    runs, _index, _cmp = expand_inputs([emu_dir])
    sim_root = out / "sim"
    index: dict[str, Any] = {"interrupted": False, "simulated": True, "runs": [], "emulator_dir": str(emu_dir)}
    for run in runs:
        data = json.loads((run / "config.json").read_text())
        sc_path = run / "scenario.json"
        scenario = Scenario.from_dict(json.loads(sc_path.read_text()), source=str(sc_path)) if sc_path.is_file() else None
        policy = data["recovery"]["policy"]
        run_dir = sim_root / policy
        cfg = load_config(merge(data, {"run_id": f"sim-{policy}-{time.strftime('%Y%m%d-%H%M%S')}",
                                       "runs_dir": str(sim_root)}))
        res = simulate(cfg, scenario, model, run_dir)
        doc = json.loads((run_dir / MANIFEST).read_text())
        (run_dir / MANIFEST).write_text(json.dumps({**doc, "policy": policy, "emulator_run": str(run), "result": {
            "complete": res.complete, "sim_s": res.sim_s, "commits": res.commits, "epochs": res.epochs,
            "useful_tokens": res.useful_tokens}}, indent=2))
        index["runs"].append({"policy": policy, "run_dir": str(run_dir.resolve()), "useful_tokens": res.useful_tokens,
                              "complete": res.complete})
        index.setdefault("scenario", scenario.to_dict() if scenario is not None else None)
    sim_root.mkdir(parents=True, exist_ok=True)
    (sim_root / "index.json").write_text(json.dumps(index, indent=2))
    return sim_root


def _value(run: dict[str, Any] | None, key: str) -> float | None:
    if run is None:
        return None
    if key == "duration":
        return (run.get("duration") or {}).get("value")
    return (run["metrics"].get(key) or {}).get("value")


def _claim(name: str, falsifier: str, status: str, detail: str, emu: Any = None, sim: Any = None) -> dict[str, Any]:
    return {"claim": name, "falsifier": falsifier, "status": status, "detail": detail, "emulator": emu,
            "simulator": sim}


def _progress_triggered(emu_art: dict[str, Any]) -> bool:
    faults = (emu_art.get("scenario") or {}).get("faults") or []
    return all("at_useful_tokens" in f for f in faults)


def claims(emu_art: dict[str, Any], sim_art: dict[str, Any]) -> list[dict[str, Any]]:
    """Every claim the simulator makes about the emulator's runs, with its status (see the module doc)."""
    emu = {r["policy"]: r for r in emu_art["runs"]}
    sim = {r["policy"]: r for r in sim_art["runs"]}
    out: list[dict[str, Any]] = []
    for pol in sorted(set(emu) | set(sim)):
        e, s = emu.get(pol), sim.get(pol)
        te, ts = _value(e, "duration"), _value(s, "duration")
        if te is None or ts is None:
            out.append(_claim(f"{pol}: time to target within {TIME_TOLERANCE:.0%}", "the emulator's time to target",
                              "not run", "no emulator run of this policy" if te is None else "no simulated run"))
        else:
            err = ts / te - 1
            out.append(_claim(f"{pol}: time to target within {TIME_TOLERANCE:.0%}",
                              f"a measured time to target more than {TIME_TOLERANCE:.0%} away from the simulated one",
                              "survived" if abs(err) <= TIME_TOLERANCE else "falsified",
                              f"simulated {ts:.1f} s vs measured {te:.1f} s ({err:+.1%})", te, ts))
        le, ls = _value(e, "lost_tokens"), _value(s, "lost_tokens")
        if le is None or ls is None or not _progress_triggered(emu_art):
            why = "a fault triggered by wall time" if le is not None and ls is not None else "a run is missing"
            out.append(_claim(f"{pol}: lost tokens exact", "the emulator's lost tokens", "not run",
                              f"not claimed: {why}"))
        else:
            out.append(_claim(f"{pol}: lost tokens exact", "any difference in lost tokens",
                              "survived" if le == ls else "falsified", f"simulated {ls:,.0f} vs measured {le:,.0f}",
                              le, ls))
        out.append(_claim(f"{pol}: inter-site bytes per class within {BYTES_TOLERANCE:.0%}",
                          "the emulator's bytes per class", "not run",
                          "the simulator writes no WAN byte counters yet (sim.json `not_modeled`)"))
    both = sorted(set(emu) & set(sim))
    if len(both) >= 2:
        rank_e = sorted(both, key=lambda p: _value(emu[p], "duration") or 0)
        rank_s = sorted(both, key=lambda p: _value(sim[p], "duration") or 0)
        out.append(_claim("the policies' ranking by time to target is preserved", "a different order in the emulator",
                          "survived" if rank_e == rank_s else "falsified",
                          f"emulator {' < '.join(rank_e)}; simulator {' < '.join(rank_s)}", rank_e, rank_s))
    return out


def build(emu_dir: Path, out: Path, calibration: Path | None = None) -> dict[str, Any]:
    """Simulate, analyse, compare and render; returns the side-by-side artifact (also written to out)."""
    from sim.page import render

    out.mkdir(parents=True, exist_ok=True)
    model = SimModel.from_calibration(json.loads(calibration.read_text())) if calibration else SimModel()
    emu_art, emu_path = _artifact(emu_dir, out / "emulator-analysis")
    sim_root = simulate_like(emu_dir, out, model)
    sim_art, sim_path = _artifact(sim_root, sim_root)
    manifest = json.loads((sim_root / sim_art["runs"][0]["policy"] / MANIFEST).read_text())
    doc = {"kind": "xdc-sim-side-by-side/1", "emulator_dir": str(emu_dir), "simulated_dir": str(sim_root),
           "calibration": str(calibration) if calibration else None,
           "artifacts_sha256": {"emulator": hashlib.sha256(emu_path.read_bytes()).hexdigest(),
                                "simulator": hashlib.sha256(sim_path.read_bytes()).hexdigest()},
           "claims": claims(emu_art, sim_art), "manifest": manifest}
    (out / "artifact.json").write_text(json.dumps(doc, indent=2, default=str))
    (out / "index.html").write_text(render(emu_art, sim_art, doc), encoding="utf-8")
    return doc

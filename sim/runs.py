"""Simulated run directories and comparison directories, as `xdc sim run`, `xdc sim report` and the
validation write them (one implementation for all three).

A simulated run directory has the emulator's layout (logs/, config.json, ...) plus `sim.json`
(sim/world.py's MANIFEST), which this completes with the run's policy and its result. A comparison
directory holds one run directory per policy and an `index.json` like the one `xdc compare` writes,
so `xdc analyze DIR` reads simulated and emulated comparisons the same way.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

from chaos.scenario import Scenario
from ground.config import RunConfig
from sim.model import SimModel
from sim.world import MANIFEST, SimResult, simulate


class NotEmulated(ValueError):
    """`xdc sim report` was given simulated runs: the page compares the simulator with the emulator."""


def fresh_run_dir(run_dir: Path) -> None:
    """Make `run_dir` ready for a new simulated run. An earlier simulated run there (its sim.json) is
    replaced: the logs are appended to, so a second simulation into the same directory would mix two
    histories (the validation bench, run twice, counted every lost token twice). Anything else that
    is not empty (an emulated run, someone's files) is refused, never deleted."""
    if not run_dir.exists():
        return
    if not run_dir.is_dir():
        raise FileExistsError(f"{run_dir} exists and is not a directory: a simulated run needs its own directory")
    if (run_dir / MANIFEST).is_file():
        shutil.rmtree(run_dir)
    elif any(run_dir.iterdir()):
        raise FileExistsError(f"{run_dir} is not empty and holds no simulated run ({MANIFEST} missing): "
                              f"refusing to write a simulation into it (choose another directory)")


def simulate_run(cfg: RunConfig, scenario: Scenario | None, model: SimModel, run_dir: Path | None, *,
                 max_sim_s: float = 36_000.0, extra: dict[str, Any] | None = None) -> SimResult:
    """Simulate one run into `run_dir` (None: no logs; an earlier simulated run there is replaced, see
    `fresh_run_dir`) and record its policy, `extra` and result in sim.json."""
    if run_dir is not None:
        fresh_run_dir(run_dir)
    res = simulate(cfg, scenario, model, run_dir, max_sim_s=max_sim_s)
    if run_dir is not None:
        doc = json.loads((run_dir / MANIFEST).read_text())
        doc.update({"policy": cfg.recovery.policy, **(extra or {}), "result": {
            "complete": res.complete, "sim_s": res.sim_s, "commits": res.commits, "epochs": res.epochs,
            "useful_tokens": res.useful_tokens}})
        (run_dir / MANIFEST).write_text(json.dumps(doc, indent=2))
    return res


def index_entry(policy: str, run_dir: Path, res: SimResult) -> dict[str, Any]:
    """One run's line in a comparison directory's index.json."""
    return {"policy": policy, "run_dir": str(run_dir.resolve()), "useful_tokens": res.useful_tokens,
            "complete": res.complete}


def write_index(out: Path, runs: list[dict[str, Any]], scenario: Scenario | None, **extra: Any) -> Path:
    """Write out/index.json for the simulated runs `runs` (index_entry's), as `xdc compare` does."""
    out.mkdir(parents=True, exist_ok=True)
    index = {"interrupted": False, "simulated": True, **extra, "runs": runs,
             "scenario": scenario.to_dict() if scenario is not None else None}
    path = out / "index.json"
    path.write_text(json.dumps(index, indent=2))
    return path

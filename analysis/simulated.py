"""Runs the simulator wrote (sim/): told apart by their manifest, every number in them `modeled`.

A simulated run directory has the emulator's layout plus `sim.json` (the simulator's manifest:
its timing model with each parameter's evidence class). Nothing in such a run was measured, so
`as_modeled` relabels every `measured` quantity of its analysis section as `modeled`, and the
section names the manifest; the held-out NLL takes its learning curve's class (`prior` when the
curve was not fitted). Checkers that need Toxiproxy's byte counters come out `unknown` on
their own: a simulated run has none.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

MANIFEST = "sim.json"


def sim_manifest(run_dir: Path) -> dict[str, Any] | None:
    """The simulator's manifest (with its sha256 as `_sha256`), or None for an emulated run."""
    p = Path(run_dir) / MANIFEST
    if not p.is_file():
        return None
    data = p.read_bytes()
    doc = json.loads(data)
    if not (isinstance(doc, dict) and doc.get("simulated") is True):
        return None
    return {**doc, "_sha256": hashlib.sha256(data).hexdigest()}


def _relabel(x: Any) -> Any:
    if isinstance(x, dict):
        return {k: ("modeled" if k == "evidence" and v == "measured" else _relabel(v)) for k, v in x.items()}
    if isinstance(x, list):
        return [_relabel(v) for v in x]
    return x


def as_modeled(section: dict[str, Any], manifest: dict[str, Any]) -> dict[str, Any]:
    """The run's section with every `measured` evidence label replaced by `modeled`."""
    out = _relabel(section)
    # The held-out NLL comes from the simulator's learning curve: fitted to emulator runs (`modeled`)
    # or the prior's guesses (`prior`, not fitted); the run's numbers say which, with the curve's source.
    curve = manifest.get("learning") if isinstance(manifest.get("learning"), dict) else {}
    if curve.get("evidence") in ("prior", "modeled"):
        learn = {"evidence": curve["evidence"], "source": curve.get("source"),
                 **({"source_runs": list(curve["source_runs"])} if curve.get("source_runs") else {})}
        if isinstance(out.get("learning"), dict):
            out["learning"] = {**out["learning"], **learn}
        nll = (out.get("metrics") or {}).get("final_heldout_nll")
        if isinstance(nll, dict) and nll.get("value") is not None:
            out["metrics"] = {**out["metrics"], "final_heldout_nll": {**nll, **learn}}
    prov = dict(out.get("provenance", {}))
    prov["input_hashes"] = {**prov.get("input_hashes", {}), MANIFEST: manifest["_sha256"]}
    prov["simulated"] = {"manifest": MANIFEST, "evidence": "modeled", "simulator": manifest.get("simulator"),
                         "model": manifest.get("model")}
    out["provenance"] = prov
    return out

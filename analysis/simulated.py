"""Runs the simulator wrote (sim/): told apart by their manifest, every number in them `modeled`.

A simulated run directory has the emulator's layout plus `sim.json` (the simulator's manifest:
its timing model with each parameter's evidence class). Nothing in such a run was measured, so
`as_modeled` relabels every `measured` quantity of its analysis section as `modeled`, and the
section names the manifest. Checkers that need Toxiproxy's byte counters come out `unknown` on
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
    prov = dict(out.get("provenance", {}))
    prov["input_hashes"] = {**prov.get("input_hashes", {}), MANIFEST: manifest["_sha256"]}
    prov["simulated"] = {"manifest": MANIFEST, "evidence": "modeled", "simulator": manifest.get("simulator"),
                         "model": manifest.get("model")}
    out["provenance"] = prov
    return out

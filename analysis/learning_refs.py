"""What the policies' learning is measured against: the single-process reference and the noise floor.

`learning_refs(histories, sections, index)` is the artifact's `learning_refs` section:
- `reference`: the curve of one process trained on the same samples with no WAN
  (xdc/reference.py; `<comparison>/reference/logs/reference.jsonl`, named by index.json), and
  each policy's final NLL minus the reference's (what the policy gives up against one machine).
- `noise_floor`: the seed-to-seed spread of the final NLL (bench/results/noise_floor.json,
  xdc/noise_floor.py), used only when its dataset id and learning-config hash are this
  comparison's; otherwise `unavailable` with the reason (never reused silently).
- `differences`: every pair of policies' final NLL difference with its verdict against the
  floor: "no measurable difference", "measurable" or "noise floor not measured for this config".
"""

from __future__ import annotations

import json
from itertools import combinations
from pathlib import Path
from typing import Any

from analysis.noise_floor_record import learning_config_hash, match
from ground.eventlog import read_events

ROOT = Path(__file__).resolve().parent.parent
NOISE_FLOOR_RECORD = ROOT / "bench" / "results" / "noise_floor.json"


def noise_floor_records(results_dir: Path = NOISE_FLOOR_RECORD.parent) -> list[Path]:
    """Every noise-floor record: the demo's (noise_floor.json) first, then the studies' arms'
    (noise_floor_<study>-v<version>.json, `xdc noise-floor --study`), by name."""
    main = results_dir / NOISE_FLOOR_RECORD.name
    return ([main] if main.is_file() else []) + sorted(p for p in results_dir.glob("noise_floor_*.json") if p.is_file())


def match_records(paths: list[Path], dataset_id: str | None, cfg: dict[str, Any] | None,
                  eval_set: Any = None) -> dict[str, Any]:
    """The first record of `paths` measured for this dataset id, learning config and evaluation set,
    with the file it came from; else the first record's reason (or "no record") for why none applies."""
    first: dict[str, Any] | None = None
    for path in paths:
        try:
            record = json.loads(path.read_text())
        except (OSError, ValueError) as e:
            got: dict[str, Any] = {"evidence": "unavailable", "reason": f"{path.name} cannot be read: {e}"}
        else:
            got = match(record, dataset_id, cfg, eval_set)
        if got["evidence"] == "measured":
            return {**got, "record_file": path.name}
        first = first or got
    return first or match(None, dataset_id, cfg, eval_set)


def _reference(index: dict[str, Any] | None, cmp_dir: Path | None) -> dict[str, Any] | None:
    ref = (index or {}).get("reference")
    if not ref:
        return None
    if "error" in ref:
        return {"evidence": "unavailable", "reason": f"the reference run failed: {ref['error']}"}
    d = Path(ref["dir"])
    if not d.exists() and cmp_dir is not None:
        d = cmp_dir / "reference"  # the comparison was moved
    path = d / "logs" / "reference.jsonl"
    if not path.is_file():
        return {"evidence": "unavailable", "reason": f"{path} is missing"}
    events = read_events(path)
    evals = [e for e in events if e.get("event") == "eval"]
    if not evals:
        return {"evidence": "unavailable", "reason": f"{path} has no eval events"}
    t0 = int(events[0]["wall_ns"])
    curve = [{"t_s": (int(e["wall_ns"]) - t0) / 1e9, "useful_tokens_trained": e["useful_tokens_trained"],
              "heldout_nll": e["heldout_nll"], "event_id": e.get("id"),
              **({"eval_set": e["eval_set"]} if "eval_set" in e else {})} for e in evals]
    return {"evidence": "measured", "unit": "nats/token", "curve": curve, "final_heldout_nll": curve[-1]["heldout_nll"],
            "what": "one process, global batch = sites x per_site_batch, same samples and lr schedule, no WAN"}


def _eval_set(h: Any) -> Any:
    """The evaluation set a run's sites name in their eval events (None where they name none)."""
    events = getattr(h, "events", None)
    if events is None:
        return None
    return next((e.get("eval_set") for s in h.sites for e in events(s, "eval")), None)


def learning_refs(histories: list[Any], sections: list[dict[str, Any]], index: dict[str, Any] | None,
                  cmp_dir: Path | None = None, record_path: Path = NOISE_FLOOR_RECORD) -> dict[str, Any]:
    finals = {s["policy"]: s["learning"]["final_heldout_nll"] for s in sections}
    ref = _reference(index, cmp_dir)
    if ref and ref["evidence"] == "measured":
        ref["gap_by_policy"] = {p: (None if v is None else v - ref["final_heldout_nll"]) for p, v in finals.items()}
    record = json.loads(record_path.read_text()) if record_path.is_file() else None
    dataset_ids = {s["provenance"]["dataset_id"] for s in sections}
    cfgs = [h.config for h in histories]
    eval_sets = [_eval_set(h) for h in histories]
    floor = match(record, next(iter(dataset_ids)) if len(dataset_ids) == 1 else None, cfgs[0] if cfgs else None,
                  eval_sets[0] if eval_sets else None)
    if floor["evidence"] == "measured" and len(cfgs) > 1:
        if len({learning_config_hash(c) for c in cfgs}) != 1:
            floor = {"evidence": "unavailable", "reason": "the runs differ in their learning config"}
    diffs = []
    for (pa, a), (pb, b) in combinations(finals.items(), 2):
        if a is None or b is None:
            continue
        d = b - a
        if floor["evidence"] != "measured":
            verdict = "noise floor not measured for this config"
        elif abs(d) <= floor["threshold_nats"]:
            verdict = "no measurable difference"
        else:
            verdict = "measurable"
        diffs.append({"a": pa, "b": pb, "difference_nats": d, "verdict": verdict})
    return {"reference": ref, "noise_floor": floor, "differences": diffs}

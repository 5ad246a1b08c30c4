"""Whether a noise-floor record applies to a comparison: same dataset, learning config and eval set.

The record is measured by `xdc noise-floor` (xdc/noise_floor.py); the report (analysis/learning_refs.py)
uses it only for the recipe it was measured on.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

# Fields of `train` that cannot change what the model learns from its data (or are the seed the
# floor varies); everything else in model, data and train is learning-relevant.
NOT_LEARNING = frozenset({"seed", "threads_per_site", "device", "checkpoint_every_rounds", "eval_every_rounds",
                          "workers_per_site"})


def learning_config(cfg: dict[str, Any]) -> dict[str, Any]:
    """The learning-relevant part of a resolved config dict (config.json): model, data, train
    minus NOT_LEARNING and minus the settings of a mode the run does not train in, and the number of
    sites (the global batch)."""
    return _normal({"model": cfg["model"], "data": cfg["data"],
                    "train": {k: v for k, v in sorted(cfg["train"].items()) if k not in NOT_LEARNING},
                    "n_sites": len(cfg["cluster"]["sites"])})


def _normal(lc: dict[str, Any]) -> dict[str, Any]:
    """The controller's thresholds (`train.adaptive`) shape only an adaptive run and the schedule only a
    scripted one: dropped otherwise, so a new controller field leaves a fixed recipe's hash as it was."""
    train = dict(lc.get("train") or {})
    if train.get("mode") != "adaptive":
        train.pop("adaptive", None)
    if train.get("mode") != "scripted":
        train.pop("settings_schedule", None)
    return {**lc, "train": train}


def learning_config_hash(cfg: dict[str, Any]) -> str:
    return _hash(learning_config(cfg))


def _hash(lc: dict[str, Any]) -> str:
    return hashlib.sha256(json.dumps(lc, sort_keys=True).encode()).hexdigest()


def record_config_hash(record: dict[str, Any]) -> str | None:
    """A record's learning-config hash under today's rule: recomputed from the learning config it keeps
    (records written before a rule change hash as they would now), else the hash it was written with."""
    lc = record.get("learning_config")
    return _hash(_normal(lc)) if isinstance(lc, dict) else record.get("config_hash")


def missing_sections(cfg: dict[str, Any]) -> list[str]:
    """The learning-relevant sections a config dict lacks (a hand-made or truncated config.json):
    its learning config, and so its hash, is not defined."""
    missing = [k for k in ("model", "data", "train") if not isinstance(cfg.get(k), dict)]
    cluster = cfg.get("cluster")
    if not isinstance(cluster, dict) or not isinstance(cluster.get("sites"), list):
        missing.append("cluster.sites")
    return missing


def match(record: dict[str, Any] | None, dataset_id: str | None, cfg: dict[str, Any] | None,
          eval_set: Any = None) -> dict[str, Any]:
    """The record if it was measured for this dataset id, learning config and evaluation set
    (the sites' `eval_set` field; None on both sides where the sites name none), else why not."""
    if record is None:
        return {"evidence": "unavailable", "reason": "no noise-floor record (make noise-floor)"}
    if cfg is None or dataset_id is None:
        return {"evidence": "unavailable", "reason": "the runs do not name their dataset id or config"}
    missing = missing_sections(cfg)
    if missing:
        return {"evidence": "unavailable",
                "reason": f"the runs' config.json has no {', '.join(repr(m) for m in missing)}: its learning config "
                          f"is unknown, so no noise-floor record can be matched to it"}
    h = learning_config_hash(cfg)
    same = (("dataset id", record.get("dataset_id") == dataset_id), ("learning config", record_config_hash(record) == h),
            ("evaluation set", record.get("eval_set") == eval_set))
    if not all(ok for _, ok in same):
        what = [w for w, ok in same if not ok]
        return {"evidence": "unavailable",
                "reason": f"the noise floor is not measured for this config: the record's {', '.join(what)} "
                          f"differ{'s' if len(what) == 1 else ''} from this comparison's",
                "record_config_hash": record_config_hash(record), "config_hash": h}
    return {"evidence": "measured", **{k: record[k] for k in ("dataset_id", "config_hash", "n_seeds", "mean_nll",
                                                              "std_nll", "spread_nll", "threshold_nats", "runs")}}

"""The noise floor: how much the final held-out NLL moves from one model-init seed to the next.

`xdc noise-floor --demo --seeds 5 --out bench/results/noise_floor.json` (or `make noise-floor`)
runs the cluster (real `xdc run`s: three site processes, the coordinator, the store, Toxiproxy)
once per seed of `train.seed`, with the same data and no faults, and records every run's final
held-out NLL, their mean, sample standard deviation and spread, with the dataset id and a hash of
the learning-relevant config. The report (analysis/learning_refs.py) puts this floor next to
every between-policy difference, and uses it only when the comparison's dataset id and config
hash are the record's: a floor measured for another recipe is never reused silently.

Threshold: two runs that differ only in seed differ by sqrt(2) x sigma on average; a difference
is called measurable when it exceeds `threshold_nats` = 2 sqrt(2) sigma (about the 95% two-sided
band of a difference of two independent normal draws), or the seeds' full spread if larger.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import statistics
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

from xdc.config import RunConfig, to_dict

RECORD_KIND = "xdc-noise-floor/1"
# Fields of `train` that cannot change what the model learns from its data (or are the seed the
# floor varies); everything else in model, data and train is learning-relevant.
NOT_LEARNING = frozenset({"seed", "threads_per_site", "device", "checkpoint_every_rounds", "eval_every_rounds",
                          "workers_per_site"})


def learning_config(cfg: dict[str, Any]) -> dict[str, Any]:
    """The learning-relevant part of a resolved config dict (config.json): model, data, train
    minus NOT_LEARNING, and the number of sites (the global batch)."""
    return {"model": cfg["model"], "data": cfg["data"],
            "train": {k: v for k, v in sorted(cfg["train"].items()) if k not in NOT_LEARNING},
            "n_sites": len(cfg["cluster"]["sites"])}


def learning_config_hash(cfg: dict[str, Any]) -> str:
    return hashlib.sha256(json.dumps(learning_config(cfg), sort_keys=True).encode()).hexdigest()


def eval_set_of_run(run_dir: Path) -> Any:
    """The `eval_set` the sites name in their eval events (None where they name none): the record
    is only valid for the evaluation set it was measured on."""
    for path in sorted((run_dir / "logs").glob("*.jsonl")):
        for line in path.read_text().splitlines():
            if '"eval"' in line:
                e = json.loads(line)
                if e.get("event") == "eval":
                    return e.get("eval_set")
    return None


def summarise(finals: list[float]) -> dict[str, float]:
    """mean, sample std (ddof 1), spread (max - min) and the measurable-difference threshold."""
    std = statistics.stdev(finals) if len(finals) > 1 else float("nan")
    spread = max(finals) - min(finals)
    return {"mean_nll": statistics.fmean(finals), "std_nll": std, "spread_nll": spread,
            "threshold_nats": max(2 * math.sqrt(2) * std, spread)}


def measure(cfg: RunConfig, seeds: list[int], out: Path, *, quiet: bool = True) -> dict[str, Any]:
    """One fault-free cluster run per seed; writes and returns the record."""
    from xdc.launcher import launch, new_run_id

    runs: list[dict[str, Any]] = []
    dataset_ids: set[str] = set()
    eval_sets: list[Any] = []
    for seed in seeds:
        scfg = replace(cfg, run_id=f"noise-seed{seed}-{new_run_id()}", train=replace(cfg.train, seed=seed))
        t0 = time.monotonic()
        run_dir, summary = launch(scfg, quiet=quiet)
        if not summary or not summary.get("clean_exit") or summary.get("final_heldout_nll") is None:
            raise RuntimeError(f"seed {seed}: the run did not finish cleanly; see {run_dir}/logs")
        dataset_ids.add(summary.get("dataset_id"))
        eval_sets.append(eval_set_of_run(Path(run_dir)))
        runs.append({"seed": seed, "run_id": scfg.run_id, "final_heldout_nll": summary["final_heldout_nll"],
                     "useful_tokens": summary.get("useful_tokens"), "wall_s": round(time.monotonic() - t0, 1)})
        print(f"noise floor: seed {seed}: final held-out NLL {summary['final_heldout_nll']:.4f} "
              f"({runs[-1]['wall_s']} s)", flush=True)
    if len(dataset_ids) != 1:
        raise RuntimeError(f"the runs disagree on the dataset id: {sorted(map(str, dataset_ids))}")
    if any(e != eval_sets[0] for e in eval_sets):
        raise RuntimeError(f"the runs disagree on the evaluation set: {eval_sets}")
    cfg_dict = to_dict(cfg)
    record = {"kind": RECORD_KIND, "evidence": "measured", "dataset_id": dataset_ids.pop(),
              "config_hash": learning_config_hash(cfg_dict), "learning_config": learning_config(cfg_dict),
              "eval_set": eval_sets[0],
              "n_seeds": len(runs), "runs": runs, **summarise([r["final_heldout_nll"] for r in runs]),
              "method": "real cluster runs (xdc run), one per train.seed, same data, no faults; threshold = "
                        "max(2 sqrt(2) x std, spread)",
              "produced_wall_ns": time.time_ns()}
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(record, indent=1, sort_keys=True) + "\n")
    return record


def match(record: dict[str, Any] | None, dataset_id: str | None, cfg: dict[str, Any] | None,
          eval_set: Any = None) -> dict[str, Any]:
    """The record if it was measured for this dataset id, learning config and evaluation set
    (the sites' `eval_set` field; None on both sides where the sites name none), else why not."""
    if record is None:
        return {"evidence": "unavailable", "reason": "no noise-floor record (make noise-floor)"}
    if cfg is None or dataset_id is None:
        return {"evidence": "unavailable", "reason": "the runs do not name their dataset id or config"}
    h = learning_config_hash(cfg)
    same = (("dataset id", record.get("dataset_id") == dataset_id), ("learning config", record.get("config_hash") == h),
            ("evaluation set", record.get("eval_set") == eval_set))
    if not all(ok for _, ok in same):
        what = [w for w, ok in same if not ok]
        return {"evidence": "unavailable",
                "reason": f"the noise floor is not measured for this config: the record's {', '.join(what)} "
                          f"differ{'s' if len(what) == 1 else ''} from this comparison's",
                "record_config_hash": record.get("config_hash"), "config_hash": h}
    return {"evidence": "measured", **{k: record[k] for k in ("dataset_id", "config_hash", "n_seeds", "mean_nll",
                                                              "std_nll", "spread_nll", "threshold_nats", "runs")}}


def main(argv: list[str] | None = None, base: dict | None = None) -> int:
    from xdc.config import load_config, merge, parse_override, read_config_file

    ap = argparse.ArgumentParser(prog="xdc noise-floor", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--demo", action="store_true", help="the demo's config (xdc/cli.py DEMO)")
    ap.add_argument("--config")
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE")
    ap.add_argument("--seeds", type=int, default=5)
    ap.add_argument("--first-seed", type=int, default=0)
    ap.add_argument("--runs-dir", default="runs/noise-floor")
    ap.add_argument("--out", type=Path, default=Path("bench/results/noise_floor.json"))
    args = ap.parse_args(argv)
    data: dict = dict(base or {}) if args.demo else {}
    if args.config:
        data = merge(data, read_config_file(args.config))
    for o in args.set:
        data = merge(data, parse_override(o))
    data = merge(data, {"runs_dir": args.runs_dir})
    cfg = load_config(data)
    rec = measure(cfg, list(range(args.first_seed, args.first_seed + args.seeds)), args.out)
    print(f"noise floor over {rec['n_seeds']} seeds: mean {rec['mean_nll']:.4f}, std {rec['std_nll']:.4f}, "
          f"spread {rec['spread_nll']:.4f} nats; differences under {rec['threshold_nats']:.4f} nats are not "
          f"measurable. Written to {args.out}")
    return 0

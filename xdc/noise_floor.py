"""The noise floor: how much the final held-out NLL moves from one model-init seed to the next.

`xdc noise-floor --demo --seeds 5 --out bench/results/noise_floor.json` (or `make noise-floor`)
runs the cluster (real `xdc run`s: three site processes, the coordinator, the store, Toxiproxy)
once per seed of `train.seed`, with the same data and no faults, and records every run's final
held-out NLL, their mean, sample standard deviation and spread, with the dataset id and a hash of
the learning-relevant config. The report (analysis/learning_refs.py) puts this floor next to
every between-policy difference, and uses it only when the comparison's dataset id and config
hash are the record's: a floor measured for another recipe is never reused silently.

`xdc noise-floor --study studies/protocols/controller-heldout.yaml --arm fixed-h8` measures the
floor of one study arm's learning config instead (the run config of that arm in a stratum of the
study's evaluation split, the first unless `--stratum` names one; faults left out), and writes
bench/results/noise_floor_<study>-v<version>.json; the study's artifact uses the record whose config
is its control arm's (studies/artifact.py). The strata of a study differ in data order, and the floor
is measured at one of them: it is the init-seed spread at that data order.

Threshold: two runs that differ only in seed differ by sqrt(2) x sigma on average; a difference
is called measurable when it exceeds `threshold_nats` = 2 sqrt(2) sigma (about the 95% two-sided
band of a difference of two independent normal draws), or the seeds' full spread if larger.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

from analysis.noise_floor_record import learning_config, learning_config_hash
from ground.config import RunConfig, to_dict
from ground.eventlog import read_events
from ground.provenance import code_revision, runtime

RECORD_KIND = "xdc-noise-floor/1"
def eval_set_of_run(run_dir: Path) -> Any:
    """The `eval_set` the sites name in their eval events (None where they name none): the record
    is only valid for the evaluation set it was measured on."""
    for path in sorted((run_dir / "logs").glob("*.jsonl")):
        for e in read_events(path):
            if e.get("event") == "eval":
                return e.get("eval_set")
    return None


def summarise(finals: list[float]) -> dict[str, float]:
    """mean, sample std (ddof 1), spread (max - min) and the measurable-difference threshold."""
    std = statistics.stdev(finals) if len(finals) > 1 else float("nan")
    spread = max(finals) - min(finals)
    return {"mean_nll": statistics.fmean(finals), "std_nll": std, "spread_nll": spread,
            "threshold_nats": max(2 * math.sqrt(2) * std, spread)}


def measure(cfg: RunConfig, seeds: list[int], out: Path, *, quiet: bool = True,
            provenance: dict[str, Any] | None = None) -> dict[str, Any]:
    """One fault-free cluster run per seed; writes and returns the record."""
    from cluster.launcher import launch, new_run_id

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
              "code_revision": code_revision(), "runtime": runtime(),
              "produced_wall_ns": time.time_ns(), **({"source": provenance} if provenance else {})}
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(record, indent=1, sort_keys=True) + "\n")
    return record


def study_config(protocol_file: str, arm: str | None, stratum: str | None) -> tuple[dict[str, Any], dict[str, Any]]:
    """The run-config dict of one arm of a study in one stratum, without the stratum's faults, and
    where it came from. Raises SystemExit with the reason for an unknown arm or stratum."""
    from studies.protocol import ProtocolError, load_protocol, run_config_dict

    try:
        p = load_protocol(protocol_file)
    except ProtocolError as e:
        raise SystemExit(f"xdc noise-floor: {e}") from None
    if arm is None:
        if p.comparator is not None:
            raise SystemExit(f"xdc noise-floor: study {p.name!r} chooses its control from the runs "
                             f"({', '.join(p.comparator.choose_from)}); name one with --arm")
        arm = p.control
    arms = [a.name for a in p.arms]
    if arm not in arms:
        raise SystemExit(f"xdc noise-floor: study {p.name!r} has no arm {arm!r} (arms: {', '.join(arms)})")
    names = [s.name for s in p.strata]
    if stratum is None:
        stratum = next((s.name for s in p.strata if s.split == p.evaluation_split), names[0])
    if stratum not in names:
        raise SystemExit(f"xdc noise-floor: study {p.name!r} has no stratum {stratum!r}")
    s = next(x for x in p.strata if x.name == stratum)
    a = p.arm(arm)
    return run_config_dict(p, s, a), {"study": p.name, "version": p.version, "arm": arm, "stratum": stratum,
                                      "policy": a.policy, "protocol_file": str(protocol_file)}


def main(argv: list[str] | None = None, base: dict | None = None) -> int:
    from ground.config import load_config, merge, parse_override, read_config_file

    ap = argparse.ArgumentParser(prog="xdc noise-floor", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--demo", action="store_true", help="the demo's config (xdc/cli.py DEMO)")
    ap.add_argument("--config")
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE")
    ap.add_argument("--seeds", type=int, default=5)
    ap.add_argument("--first-seed", type=int, default=0)
    ap.add_argument("--runs-dir", default="runs/noise-floor")
    ap.add_argument("--study", help="a study protocol: measure the floor of one of its arms' learning config")
    ap.add_argument("--arm", help="with --study: the arm (default: the contrast's control where it is named)")
    ap.add_argument("--stratum", help="with --study: the stratum (default: the first of the evaluation split)")
    ap.add_argument("--out", type=Path, default=None,
                    help="default bench/results/noise_floor.json, or noise_floor_<study>-v<version>.json with --study")
    args = ap.parse_args(argv)
    data: dict = dict(base or {}) if args.demo else {}
    provenance: dict[str, Any] | None = None
    if args.study:
        if args.demo or args.config:
            ap.error("--study builds the config from the protocol; it does not combine with --demo or --config")
        data, provenance = study_config(args.study, args.arm, args.stratum)
        if args.out is None:
            args.out = Path("bench/results") / f"noise_floor_{provenance['study']}-v{provenance['version']}.json"
    if args.out is None:
        args.out = Path("bench/results/noise_floor.json")
    if args.config:
        data = merge(data, read_config_file(args.config))
    for o in args.set:
        data = merge(data, parse_override(o))
    data = merge(data, {"runs_dir": args.runs_dir})
    cfg = load_config(data)
    if provenance is not None:
        from chaos.policy_config import config_for_policy

        cfg = config_for_policy(cfg, provenance["policy"], None)
    rec = measure(cfg, list(range(args.first_seed, args.first_seed + args.seeds)), args.out, provenance=provenance)
    print(f"noise floor over {rec['n_seeds']} seeds: mean {rec['mean_nll']:.4f}, std {rec['std_nll']:.4f}, "
          f"spread {rec['spread_nll']:.4f} nats; differences under {rec['threshold_nats']:.4f} nats are not "
          f"measurable. Written to {args.out}")
    return 0

"""One-process DiLoCo simulation, for tuning the learning recipe (not a cluster measurement).

`python -m bench.diloco_sim --H 8 --inner-lr 3e-3 --outer-lr 1.0 --outer-momentum 0 ...`

Simulates the cluster's arithmetic in one process: `workers` SiteTrainers (the sites' class,
same init from train.seed), each taking its per-site batch of the canonical sample order at the
positions the cluster would (ground/schedule.py), every inner step at the lr of its frontier
(site_agent/lr_schedule.py); after H steps the pseudo-gradients are averaged in site order
(reduce_in_order, as the collective does) and every worker takes the same outer step.
`--H 0` is the single-process reference (xdc/reference.py): one model on the global batch.

Evaluation: `--eval-windows` held-out windows evenly spaced over the whole held-out split (not
the sites' heldout_batch, which was the first 32 windows when this was written), at every
`--eval-every-tokens` and at the end. Prints one JSON line per evaluation and a final JSON
result (with process CPU seconds); `--out` appends the result to a JSON list.
"""

from __future__ import annotations

import argparse
import json
import time
from dataclasses import replace
from pathlib import Path

import numpy as np
import torch

from ground.config import RunConfig, load_config, merge, parse_override, to_dict


def spread_heldout(cfg: RunConfig, n_windows: int) -> tuple[torch.Tensor, torch.Tensor, str]:
    """x, y [n_windows, seq_len]: windows at evenly spaced starts over the whole held-out split
    (stride seq_len grid); plus a short description of the set."""
    from site_agent.data import _windows, load_corpus

    corpus = load_corpus(cfg.data)
    t = cfg.model.seq_len
    available = (len(corpus.heldout) - 1) // t
    starts = (np.arange(n_windows, dtype=np.int64) * available // n_windows) * t
    x, y = _windows(corpus.heldout, starts, t)
    return x, y, f"{n_windows} windows of {t} evenly spaced over {available} held-out windows"


def simulate_diloco(cfg: RunConfig, n_workers: int, evaluate, eval_every_tokens: int, emit) -> list[tuple[int, float]]:
    from site_agent.collective import reduce_in_order, roundtrip
    from site_agent.data import batch_for, load_corpus, sample_order
    from site_agent.lr_schedule import step_frontier_tokens
    from ground.schedule import ids_at, round_span, site_positions, steps_per_round, target_samples
    from site_agent.init_state import start_trainer

    corpus = load_corpus(cfg.data)
    order = sample_order(corpus, cfg.model.seq_len, cfg.data.shuffle_seed)
    workers = [start_trainer(cfg, torch.device("cpu")) for _ in range(n_workers)]
    target = target_samples(cfg)
    seq = cfg.model.seq_len
    curve = [(0, evaluate(workers[0].model))]
    emit(*curve[0])
    next_eval = eval_every_tokens
    rnd = 0
    while True:
        cs, ce = round_span(cfg, n_workers, 0, 0, rnd, target)
        if cs >= target:
            break
        pseudo = []
        for i, w in enumerate(workers):
            for h in range(steps_per_round(cfg)):
                ids = ids_at(order, site_positions(cfg, n_workers, cs, h, i, ce))
                if ids:
                    w.inner_step(*batch_for(corpus, ids, seq),
                                 frontier_tokens=step_frontier_tokens(cfg, n_workers, cs, h, ce))
            pseudo.append(w.pseudo_gradient())
        # train.compression: what the collective's reduce-scatter and all-gather do to the values (each
        # contribution, then the mean, through compress/decompress in chunk-sized parts; the cluster's
        # parts start at shard boundaries, here at the vector's start: the same rounding per part size).
        comp, part = cfg.train.compression, max(1, cfg.wan.chunk_bytes // 4)
        avg = roundtrip(reduce_in_order([roundtrip(p, comp, part) for p in pseudo]), comp, part)
        for w in workers:
            w.apply_outer(avg, frontier_tokens=cs * seq)
        if ce * seq >= next_eval or ce >= target:
            curve.append((ce * seq, evaluate(workers[0].model)))
            emit(*curve[-1])
            while next_eval <= ce * seq:
                next_eval += eval_every_tokens
        rnd += 1
    return curve


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.diloco_sim", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--H", type=int, default=8, help="inner steps per round; 0 = single-process reference")
    ap.add_argument("--workers", type=int, default=3)
    ap.add_argument("--tokens", type=int, default=1_179_648, help="train.target_useful_tokens")
    ap.add_argument("--batch", type=int, default=8, help="per_site_batch")
    ap.add_argument("--inner-lr", type=float, default=3e-3)
    ap.add_argument("--warmup-tokens", type=int, default=65_536)
    ap.add_argument("--floor", type=float, default=0.1, help="lr_floor_fraction")
    ap.add_argument("--outer-lr", type=float, default=1.0)
    ap.add_argument("--outer-momentum", type=float, default=0.0)
    ap.add_argument("--outer-scheduled", action="store_true")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--set", action="append", default=[], help="extra KEY=VALUE config overrides")
    ap.add_argument("--eval-windows", type=int, default=0,
                    help="0 (default): the sites' own evaluation set (DataConfig.eval_windows, site_agent/data.py"
                         " eval_set), the one the baselines and the report use; N > 0: N windows of this script's"
                         " older spread grid")
    ap.add_argument("--eval-every-tokens", type=int, default=196_608)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--label", default="")
    ap.add_argument("--out", type=Path, help="append the result to this JSON list")
    args = ap.parse_args(argv)

    torch.set_num_threads(args.threads)
    data = {"train": {"mode": "local" if args.H > 0 else "sync", "inner_steps_h": max(1, args.H),
                      "per_site_batch": args.batch, "target_useful_tokens": args.tokens, "inner_lr": args.inner_lr,
                      "lr_warmup_tokens": args.warmup_tokens, "lr_floor_fraction": args.floor,
                      "outer_lr": args.outer_lr, "outer_momentum": args.outer_momentum,
                      "outer_lr_scheduled": args.outer_scheduled, "seed": args.seed, "device": "cpu"}}
    for o in args.set:
        data = merge(data, parse_override(o))
    cfg = load_config(data)
    from site_agent.data import eval_set, evaluate_nll, load_corpus

    if args.eval_windows > 0:
        hx, hy, eval_desc = spread_heldout(cfg, args.eval_windows)
    else:
        es = eval_set(load_corpus(cfg.data), cfg.data, cfg.model.seq_len)
        hx, hy = es.tensors()
        eval_desc = f"sites' eval set {es.eval_set_id[:16]} ({es.n_windows} windows of {es.seq_len})"

    def evaluate(model: torch.nn.Module) -> float:
        return evaluate_nll(model, hx, hy, torch.device("cpu"), batch=64)

    t0, w0 = time.process_time(), time.monotonic()

    def emit(tokens: int, nll: float) -> None:
        print(json.dumps({"tokens": tokens, "nll": round(nll, 4), "cpu_s": round(time.process_time() - t0, 1)}),
              flush=True)

    if args.H > 0:
        curve = simulate_diloco(cfg, args.workers, evaluate, args.eval_every_tokens, emit)
    else:
        from xdc.reference import train_reference

        step = args.workers * args.batch * cfg.model.seq_len
        points = list(range(0, args.tokens + step, max(step, args.eval_every_tokens // step * step)))
        curve = train_reference(replace(cfg, cluster=replace(cfg.cluster, sites=tuple("abcdefgh"[:args.workers]))),
                                args.workers, points, evaluate, lambda t, n, c: emit(t, n))
    result = {"label": args.label, "H": args.H, "workers": args.workers, "per_site_batch": args.batch,
              "inner_lr": args.inner_lr, "lr_warmup_tokens": args.warmup_tokens, "lr_floor_fraction": args.floor,
              "outer_lr": args.outer_lr, "outer_momentum": args.outer_momentum,
              "outer_lr_scheduled": args.outer_scheduled, "seed": args.seed, "overrides": args.set,
              "target_useful_tokens": args.tokens, "final_tokens": curve[-1][0], "final_nll": round(curve[-1][1], 4),
              "curve": [[t, round(n, 4)] for t, n in curve], "eval_set": eval_desc,
              "dataset_id": load_corpus(cfg.data).dataset_id, "model": to_dict(cfg.model),
              "cpu_s": round(time.process_time() - t0, 1), "wall_s": round(time.monotonic() - w0, 1),
              "threads": args.threads}
    print(json.dumps({k: v for k, v in result.items() if k != "curve"}), flush=True)
    if args.out:
        rows = json.loads(args.out.read_text()) if args.out.exists() else []
        rows.append(result)
        args.out.write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

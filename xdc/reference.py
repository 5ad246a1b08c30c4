"""The single-process reference: what one machine with no WAN learns from the same samples.

One process trains the cluster's global batch (n_sites x per_site_batch samples per step) over
the same canonical sample order, with the same lr schedule at the same frontier (useful tokens),
and evaluates the held-out NLL at the same useful-token points as the policy runs. It uses the
sites' own `SiteTrainer` (AdamW, same model init from train.seed) and the sites' held-out set
(`eval_set`), so its curve can be drawn beside theirs: the gap is what a policy gives up
against one machine. `xdc compare` / `xdc demo` write it as `<compare_dir>/reference/logs/
reference.jsonl`, `eval` events with the sites' fields (`useful_tokens_trained`, `heldout_nll`).

The reference steps once per global batch with the mean gradient of all its samples; the
cluster's sync mode averages three per-site means instead, which is the same number up to
float32 rounding (bitwise equality is the sync-equivalence test's business, not this one's).
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any, Callable

import numpy as np
import torch

from ground.config import RunConfig, to_dict

REFERENCE_PROCESS = "reference"


def eval_points_tokens(cfg: RunConfig, n_sites: int) -> list[int]:
    """The useful-token points at which a fault-free cluster run evaluates: after every
    eval_every_rounds-th round and after the last (cut) round, plus 0 (the initial weights)."""
    from ground.schedule import samples_per_round, target_samples

    per_round = samples_per_round(cfg, n_sites)
    target = target_samples(cfg)
    points, rnd = [0], 0
    while True:
        end = min((rnd + 1) * per_round, target)
        if (rnd + 1) % cfg.train.eval_every_rounds == 0 or end >= target:
            points.append(end * cfg.model.seq_len)
        if end >= target:
            return points
        rnd += 1


def train_reference(cfg: RunConfig, n_sites: int, eval_at_tokens: list[int],
                    evaluate: Callable[[torch.nn.Module], float],
                    on_eval: Callable[[int, float, float], None] | None = None) -> list[tuple[int, float]]:
    """Train one model on the global batch until target_samples(cfg); evaluate at every
    frontier in eval_at_tokens (reached exactly at step boundaries of the global batch, else at
    the first boundary past it). Returns [(useful_tokens_trained, heldout_nll)]."""
    from site_agent.data import batch_for, load_corpus, sample_order
    from ground.schedule import ids_at, target_samples
    from site_agent.init_state import start_trainer

    corpus = load_corpus(cfg.data)
    order = sample_order(corpus, cfg.model.seq_len, cfg.data.shuffle_seed)
    trainer = start_trainer(cfg, torch.device("cpu"))
    global_batch = n_sites * cfg.train.per_site_batch  # samples per step
    target = target_samples(cfg)
    seq = cfg.model.seq_len
    pending = sorted(set(eval_at_tokens))
    out: list[tuple[int, float]] = []
    t0 = time.process_time()
    pos = 0
    while True:
        due = [p for p in pending if p <= pos * seq]
        if due or pos >= target:  # one evaluation per boundary; the end is always evaluated
            pending = [p for p in pending if p > pos * seq]
            nll = evaluate(trainer.model)
            out.append((pos * seq, nll))
            if on_eval is not None:
                on_eval(pos * seq, nll, time.process_time() - t0)
        if pos >= target:
            return out
        end = min(pos + global_batch, target)
        x, y = batch_for(corpus, ids_at(order, range(pos, end)), seq)
        _, grads = trainer.compute_grads(x, y)
        trainer.apply_grads(np.ascontiguousarray(grads), frontier_tokens=pos * seq)
        pos = end


def run_reference(cfg: RunConfig, out_dir: Path, threads: int = 0) -> list[tuple[int, float]]:
    """Train the reference for `cfg` and write out_dir/logs/reference.jsonl (eval events) and
    out_dir/config.json. Uses the sites' held-out set; threads 0 = torch's default."""
    from site_agent.data import eval_set, evaluate_nll, load_corpus
    from ground.eventlog import EventLog

    if threads:
        torch.set_num_threads(threads)
    n_sites = len(cfg.cluster.sites)
    corpus = load_corpus(cfg.data)
    es = eval_set(corpus, cfg.data, cfg.model.seq_len)  # the sites' evaluation set, same windows
    hx, hy = es.tensors()
    (out_dir / "logs").mkdir(parents=True, exist_ok=True)
    (out_dir / "config.json").write_text(json.dumps(to_dict(cfg), indent=2, sort_keys=True))
    log = EventLog(out_dir / "logs" / f"{REFERENCE_PROCESS}.jsonl", cfg.run_id or "reference", REFERENCE_PROCESS)
    extra: dict[str, Any] = {"eval_set": es.eval_set_id, "eval_tokens": es.tokens}
    try:
        log.emit("reference_started", n_sites=n_sites, global_batch_samples=n_sites * cfg.train.per_site_batch,
                 dataset_id=corpus.dataset_id, seed=cfg.train.seed)

        def on_eval(tokens: int, nll: float, cpu_s: float) -> None:
            log.emit("eval", useful_tokens_trained=tokens, heldout_nll=nll, cpu_s=round(cpu_s, 3), **extra)

        points = eval_points_tokens(cfg, n_sites)
        curve = train_reference(cfg, n_sites, points, lambda m: evaluate_nll(m, hx, hy, torch.device("cpu")),
                                on_eval)
        log.emit("reference_done", final_heldout_nll=curve[-1][1], useful_tokens=curve[-1][0])
    finally:
        log.close()
    return curve


def main(argv: list[str] | None = None) -> int:
    """`python -m xdc.reference --config RUN_OR_CMP/config.json --out DIR`: what `xdc compare` runs
    (as a child process, so the comparison's own process never loads torch)."""
    import argparse

    from ground.config import config_from_json

    ap = argparse.ArgumentParser(prog="python -m xdc.reference", description=__doc__)
    ap.add_argument("--config", required=True, type=Path, help="a resolved config.json")
    ap.add_argument("--out", required=True, type=Path)
    ap.add_argument("--threads", type=int, default=0)
    args = ap.parse_args(argv)
    curve = run_reference(config_from_json(args.config), args.out, threads=args.threads)
    print(f"reference (one process, no WAN): final held-out NLL {curve[-1][1]:.4f} after {curve[-1][0]:,} "
          f"useful tokens; {args.out / 'logs' / (REFERENCE_PROCESS + '.jsonl')}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

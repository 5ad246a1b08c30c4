"""emulator_overhead: how much training throughput does the WAN path cost a site when the WAN is free?

Two arms, interleaved step by step in one process, both training on the same sample ids:

  A (bare):  SiteTrainer.inner_step (local mode, default model, per_site_batch 8) on trainer A.
  B (WAN):   the same inner step on trainer B, plus everything the site agent does per step and per
             round besides training (`site_agent/rounds.py` `_train`/`compute`): a `work_attempted` event
             per step into a real EventLog, the round-start snapshot (`take_snapshot`), the compute and
             collective spans, pseudo_gradient(), the site's own collective (`agent._reducer`: parts
             validated, sample ids attested) as a real allreduce_mean over three CURVE WanNodes through
             Toxiproxy proxies with NO toxics, apply_outer(), the retained-id merge and its hash, the
             params hash, `round_done`, and the per-round counters snapshot.

One "round" = 8 x (A step, B step) with the order inside each pair alternating, then B's outer sync.
Sites b and c are threads that only take part in the all-reduce (fixed random vectors, no torch), so
the measured site's compute is the only torch work; torch.set_num_threads(1).
Per round: ratio = (B tokens/s) / (A tokens/s) = A_time / B_time (same tokens). `ratio` = median
over rounds; goal >= 0.90.

Why steps and not blocks: on the shared 2-core box a single inner step's time shifts between regimes
(~0.12 s vs ~0.20 s) lasting a few seconds when other jobs run; alternating whole 8-step blocks left
+-15% noise per pair, alternating single steps puts both arms in the same regime.
"""

from __future__ import annotations

import os
import queue
import sys
import threading
import time

import numpy as np
import torch

import tempfile
from pathlib import Path

from bench.common import BenchCluster, BenchError, env_info, median, write_result
from site_agent.agent import _reducer
from site_agent.state import merge_retained, samples_sha256, take_snapshot
from site_agent.data import batch_for, load_corpus, sample_order
from site_agent.model import count_params
from site_agent.trainer import SiteTrainer
from ground.config import LinkSpec, RunConfig, WanConfig, merge, load_config, to_dict
from ground.eventlog import EventLog

NAME = "emulator_overhead"
SITES = ["a", "b", "c"]
ME = "a"
H = 8
ROUNDS = int(os.environ.get("BENCH_ROUNDS", "16"))
GOAL = 0.95  # issue 9: the real agent path (snapshots, hashes, logging) costs at most 5 %


def run() -> dict:
    torch.set_num_threads(1)
    cfg = RunConfig()
    assert cfg.train.mode == "local" and cfg.train.inner_steps_h == H
    batch = cfg.train.per_site_batch
    seq = cfg.model.seq_len
    corpus = load_corpus(cfg.data)
    order = sample_order(corpus, seq, cfg.data.shuffle_seed)
    device = torch.device("cpu")
    tr_a = SiteTrainer(cfg, device)
    tr_b = SiteTrainer(cfg, device)
    n_params = count_params(tr_a.model)
    tokens_per_step = batch * seq

    def batch_at(rnd: int, h: int) -> tuple[torch.Tensor, torch.Tensor]:
        start = ((rnd * H + h) * batch) % (len(order) - batch)
        return batch_for(corpus, order[start:start + batch], seq)

    def timed_step(tr: SiteTrainer, xy: tuple[torch.Tensor, torch.Tensor]) -> float:
        t = time.perf_counter()
        tr.inner_step(*xy, frontier_tokens=0)  # a timing probe: the lr value does not matter
        return time.perf_counter() - t

    # Informational only: 8 bare steps before any WAN node exists (not interleaved).
    timed_step(tr_a, batch_at(0, 0))
    before_cluster = [timed_step(tr_a, batch_at(0, h)) for h in range(H)]

    wan = WanConfig(curve=True)
    links = {f"{x}_to_{y}": LinkSpec() for x in SITES for y in SITES if x != y}  # LinkSpec() = no toxics
    rounds: list[dict] = []
    t_start = time.monotonic()
    # The site's collective exactly as the agent builds it (validation and sample-id attestation on).
    site_cfg = load_config(merge(to_dict(cfg), {"wan": {"curve": True}}))
    n_samples = len(order)
    logdir = tempfile.TemporaryDirectory(prefix="xdc-bench-overhead-")
    log = EventLog(Path(logdir.name) / "a.jsonl", "bench", ME)
    retained = np.zeros(0, dtype=np.int64)
    # The hash of B's weights as the previous round left them: the agent hands the snapshot the hash it
    # logged in `round_done` (site_agent/rounds.py), so the snapshot does not hash them again.
    last_hash: str | None = None
    with BenchCluster(SITES, links, wan) as cl:
        qs = {s: cl.nodes[s].inbox("coll") for s in SITES}
        cl.start()
        ars = {s: _reducer(site_cfg, cl.nodes[s], qs[s], s, n_params, n_samples) for s in SITES}
        helper_vec = {s: np.random.default_rng(i).standard_normal(n_params).astype(np.float32) * 1e-3
                      for i, s in enumerate(SITES)}
        go = {s: queue.Queue() for s in SITES if s != ME}
        errors: list[BaseException] = []

        def helper(s: str) -> None:
            while True:
                rnd = go[s].get()
                if rnd is None:
                    return
                try:
                    ids = [n_samples - 1 - (rnd * H * batch * 3 + SITES.index(s) * H * batch + k) % (n_samples // 2)
                           for k in range(H * batch)]
                    ars[s].allreduce_mean(helper_vec[s], rnd, SITES, timeout_s=60, samples=ids)
                except BaseException as e:
                    errors.append(e)
                    return

        helpers = [threading.Thread(target=helper, args=(s,), daemon=True, name=f"helper-{s}") for s in go]
        for t in helpers:
            t.start()

        def agent_step(rnd: int, h: int, xy: tuple[torch.Tensor, torch.Tensor]) -> float:
            """Arm B's inner step as the agent runs it: the step, then its work_attempted event."""
            t = time.perf_counter()
            tr_b.inner_step(*xy, frontier_tokens=0)
            start = ((rnd * H + h) * batch) % (len(order) - batch)
            log.emit("work_attempted", round=rnd, inner_step=h, samples=[int(i) for i in order[start:start + batch]],
                     tokens=batch * seq, flops=batch * seq * tr_b.flops_per_token)
            return time.perf_counter() - t

        def one_round(rnd: int) -> dict:
            nonlocal retained, last_hash
            a_steps, b_steps = [], []
            t_pre = time.perf_counter()
            snapshot = take_snapshot(tr_b, rnd, retained, last_hash)  # the agent's round-start snapshot
            pre_s = time.perf_counter() - t_pre
            del snapshot
            for h in range(H):
                xy = batch_at(rnd + 1, h)
                if h % 2 == 0:
                    a_steps.append(timed_step(tr_a, xy))
                    b_steps.append(agent_step(rnd + 1, h, xy))
                else:
                    b_steps.append(agent_step(rnd + 1, h, xy))
                    a_steps.append(timed_step(tr_a, xy))
            t0 = time.perf_counter()
            log.emit("compute", round=rnd, samples=H * batch)
            payload = tr_b.pseudo_gradient()
            ids_round = [int(i) for h in range(H)
                         for i in order[((rnd + 1) * H + h) * batch % (len(order) - batch):][:batch]]
            for s in go:
                go[s].put(rnd)
            with log.span("collective", round=rnd, payload_values=int(payload.size)):
                avg, stats = ars[ME].allreduce_mean(payload, rnd, SITES, 60, ids_round)
            t1 = time.perf_counter()
            tr_b.apply_outer(avg, frontier_tokens=0)
            round_ids = np.concatenate([np.asarray(stats.samples[m], dtype=np.int64) for m in SITES])
            retained = merge_retained(retained, round_ids)
            phash = last_hash = tr_b.params_hash()
            log.emit("round_done", round=rnd, param_hash=phash, retained_samples=int(retained.size),
                     samples_sha256=samples_sha256(retained))
            log.emit("wan_counters", counters=cl.nodes[ME].counters.snapshot())
            t2 = time.perf_counter()
            if errors:
                raise BenchError(f"helper site failed: {errors[0]!r}")
            a_s = sum(a_steps)
            b_s = sum(b_steps) + pre_s + (t2 - t0)
            return {"round": rnd, "a_s": a_s, "b_s": b_s, "ratio": a_s / b_s, "a_step_s": a_steps,
                    "b_step_s": b_steps, "snapshot_s": pre_s, "pseudo_grad_and_allreduce_s": t1 - t0,
                    "apply_outer_and_bookkeeping_s": t2 - t1}

        try:
            warm = one_round(0)  # first all-reduce pays first-touch/allocator costs: not counted
            for r in range(1, ROUNDS + 1):
                x = one_round(r)
                rounds.append(x)
                print(f"  round {r}: bare {x['a_s']:.3f} s, wan {x['b_s']:.3f} s (steps {sum(x['b_step_s']):.3f} "
                      f"+ all-reduce {x['pseudo_grad_and_allreduce_s']:.3f} + outer/bookkeeping "
                      f"{x['apply_outer_and_bookkeeping_s']:.3f} + snapshot {x['snapshot_s']:.3f}) "
                      f"-> ratio {x['ratio']:.4f}", flush=True)
        finally:
            for s in go:
                go[s].put(None)
            for t in helpers:
                t.join(5)
        stats = cl.stats()
        version = cl.toxiproxy_version
    a_total = sum(x["a_s"] for x in rounds)
    b_total = sum(x["b_s"] for x in rounds)
    b_steps_total = sum(sum(x["b_step_s"]) for x in rounds)
    tokens = len(rounds) * H * tokens_per_step
    ratio = median([x["ratio"] for x in rounds])
    raw = {
        "H": H, "per_site_batch": batch, "seq_len": seq, "tokens_per_step": tokens_per_step, "n_params": n_params,
        "rounds_counted": len(rounds), "round_ratios": [x["ratio"] for x in rounds],
        "bare_tokens_per_s": tokens / a_total, "wan_tokens_per_s": tokens / b_total,
        "aggregate_ratio": a_total / b_total,
        # decomposition: direct cost (outer sync) vs indirect (inner steps slower with the WAN arm's state)
        "inner_steps_only_ratio": a_total / b_steps_total,
        "median_allreduce_s": median([x["pseudo_grad_and_allreduce_s"] for x in rounds]),
        "median_apply_outer_and_bookkeeping_s": median([x["apply_outer_and_bookkeeping_s"] for x in rounds]),
        "median_snapshot_s": median([x["snapshot_s"] for x in rounds]),
        "median_step_s_bare": median([s for x in rounds for s in x["a_step_s"]]),
        "median_step_s_wan": median([s for x in rounds for s in x["b_step_s"]]),
        "bare_steps_before_cluster_s": before_cluster,
        "warmup_round": warm, "rounds": rounds,
        "torch_threads": torch.get_num_threads(), "node_stats": stats, "wall_s": time.monotonic() - t_start,
    }
    notes = (
        f"Site a's local-mode training throughput (tokens/s) with the WAN path on vs a bare torch loop, same "
        f"process, torch.set_num_threads(1), default ModelConfig ({n_params} params), batch {batch}x{seq}. Bare arm: "
        f"SiteTrainer.inner_step on trainer A. WAN arm: the same inner_step on trainer B plus the agent's per-step "
        f"work_attempted event and, every H={H} steps, the agent's round path: round-start snapshot, compute and "
        f"collective spans, pseudo_gradient, a real allreduce_mean through the agent's own reducer (validation, "
        f"sample-id attestation) with sites b and c over CURVE WanNodes through Toxiproxy proxies with no toxics, "
        f"apply_outer, retained-id merge and hash, params hash, round_done and counters events into a real "
        f"EventLog. b and c are threads doing only the all-reduce "
        f"(no torch). Interleaved step by step (A B, B A, ...) on the same sample ids; one warm-up round, then "
        f"{len(rounds)} rounds; ratio = median over rounds of bare_time / wan_time (= WAN tokens/s over bare "
        f"tokens/s); aggregate_ratio and inner_steps_only_ratio in raw. The idle background of the three I/O "
        f"threads (poll wake-ups every <= 50 ms, ZMTP heartbeats) runs during both arms and so is NOT in the ratio; "
        f"bare_steps_before_cluster_s are 8 bare steps timed before any WAN node existed (not interleaved, "
        f"informational only).")
    return write_result(NAME, ratio=ratio, goal=f">= {GOAL:.2f}", passed=ratio >= GOAL, raw=raw,
                        reference="side_by_side", measures=["wan/", "site_agent/", "site_core/", "bench/emulator_overhead.py"],
                        env=env_info(version), notes=notes)


if __name__ == "__main__":
    r = run()
    sys.exit(0 if r["passed"] else 1)

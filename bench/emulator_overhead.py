"""emulator_overhead: how much training throughput does the WAN path cost a site when the WAN is free?

Two arms, measured interleaved in one process (A B B A A B B A ...: each B is paired with its
adjacent A, and the order alternates so that slow drift of the shared machine hits both arms alike):

  A (bare):  H = 8 SiteTrainer inner steps (local mode, default model, per_site_batch 8).
  B (WAN):   the same H inner steps on a second SiteTrainer, then the site's outer sync exactly as
             the site agent does it: pseudo_gradient(), a real AllReduce.allreduce_mean over three
             CURVE WanNodes through Toxiproxy proxies with NO toxics, and apply_outer().

Sites b and c are threads that only take part in the all-reduce (fixed random vectors, no torch), so
the measured site's compute is the only torch work; torch.set_num_threads(1). Both arms train on the
same sample ids, so their compute is identical. `ratio` = median over pairs of
(B tokens/s) / (A tokens/s); goal >= 0.90.
"""

from __future__ import annotations

import queue
import sys
import threading
import time

import numpy as np
import torch

from bench.common import BenchCluster, BenchError, env_info, median, write_result
from site_agent.collective import AllReduce
from site_agent.data import batch_for, load_corpus, sample_order
from site_agent.model import count_params
from site_agent.trainer import SiteTrainer
from xdc.config import LinkSpec, RunConfig, WanConfig

NAME = "emulator_overhead"
SITES = ["a", "b", "c"]
ME = "a"
H = 8
PAIRS = 8
GOAL = 0.90


def run() -> dict:
    torch.set_num_threads(1)
    cfg = RunConfig()
    assert cfg.train.mode == "local"
    batch = cfg.train.per_site_batch
    seq = cfg.model.seq_len
    corpus = load_corpus(cfg.data)
    order = sample_order(corpus, seq, cfg.data.shuffle_seed)
    device = torch.device("cpu")
    bare = SiteTrainer(cfg, device)
    wan_tr = SiteTrainer(cfg, device)
    n_params = count_params(bare.model)
    tokens_per_block = H * batch * seq

    def batches(block: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
        out = []
        for h in range(H):
            start = ((block * H + h) * batch) % (len(order) - batch)
            out.append(batch_for(corpus, order[start:start + batch], seq))
        return out

    def bare_block(block: int) -> dict:
        bs = batches(block)
        t0 = time.perf_counter()
        for x, y in bs:
            bare.inner_step(x, y)
        return {"arm": "A", "block": block, "seconds": time.perf_counter() - t0}

    # Informational only (not interleaved): one bare block before any WAN node exists.
    bare_block(-2)
    before_cluster = bare_block(-1)

    wan = WanConfig(curve=True)
    links = {f"{x}_to_{y}": LinkSpec() for x in SITES for y in SITES if x != y}  # LinkSpec() = no toxics
    blocks: list[dict] = []
    t_start = time.monotonic()
    with BenchCluster(SITES, links, wan) as cl:
        qs = {s: cl.nodes[s].inbox("coll") for s in SITES}
        cl.start()
        ars = {s: AllReduce(cl.nodes[s], qs[s], s, wan.chunk_bytes, cfg.train.compression) for s in SITES}
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
                    ars[s].allreduce_mean(helper_vec[s], rnd, SITES, timeout_s=60)
                except BaseException as e:
                    errors.append(e)
                    return

        helpers = [threading.Thread(target=helper, args=(s,), daemon=True, name=f"helper-{s}") for s in go]
        for t in helpers:
            t.start()
        rnd_counter = [0]

        def wan_block(block: int) -> dict:
            bs = batches(block)
            rnd = rnd_counter[0]
            rnd_counter[0] += 1
            t0 = time.perf_counter()
            for x, y in bs:
                wan_tr.inner_step(x, y)
            t1 = time.perf_counter()
            payload = wan_tr.pseudo_gradient()
            for s in go:
                go[s].put(rnd)
            avg, _stats = ars[ME].allreduce_mean(payload, rnd, SITES, timeout_s=60)
            t2 = time.perf_counter()
            wan_tr.apply_outer(avg)
            t3 = time.perf_counter()
            if errors:
                raise BenchError(f"helper site failed: {errors[0]!r}")
            return {"arm": "B", "block": block, "seconds": t3 - t0, "inner_s": t1 - t0,
                    "pseudo_grad_and_allreduce_s": t2 - t1, "apply_outer_s": t3 - t2}

        try:
            bare_block(0)  # warm-up pair (first all-reduce pays allocator/first-touch costs), not counted
            wan_block(0)
            pairs = []
            for i in range(PAIRS):
                blk = i + 1
                first, second = (bare_block, wan_block) if i % 2 == 0 else (wan_block, bare_block)
                r1 = first(blk)
                r2 = second(blk)
                a = r1 if r1["arm"] == "A" else r2
                b = r2 if r1["arm"] == "A" else r1
                blocks += [r1, r2]
                pr = a["seconds"] / b["seconds"]  # (tokens/b_s) / (tokens/a_s)
                pairs.append(pr)
                print(f"  pair {i}: bare {a['seconds']:.3f} s, wan {b['seconds']:.3f} s "
                      f"(all-reduce {b['pseudo_grad_and_allreduce_s']:.3f} s) -> ratio {pr:.4f}", flush=True)
        finally:
            for s in go:
                go[s].put(None)
            for t in helpers:
                t.join(5)
        stats = cl.stats()
        version = cl.toxiproxy_version
    a_s = sum(b["seconds"] for b in blocks if b["arm"] == "A")
    b_s = sum(b["seconds"] for b in blocks if b["arm"] == "B")
    n_a = sum(1 for b in blocks if b["arm"] == "A")
    n_b = sum(1 for b in blocks if b["arm"] == "B")
    ratio = median(pairs)
    raw = {
        "H": H, "per_site_batch": batch, "seq_len": seq, "tokens_per_block": tokens_per_block, "n_params": n_params,
        "pairs": PAIRS, "pair_ratios": pairs, "blocks": blocks,
        "bare_tokens_per_s": n_a * tokens_per_block / a_s, "wan_tokens_per_s": n_b * tokens_per_block / b_s,
        "aggregate_ratio": (n_b * tokens_per_block / b_s) / (n_a * tokens_per_block / a_s),
        "median_allreduce_s": median([b["pseudo_grad_and_allreduce_s"] for b in blocks if b["arm"] == "B"]),
        "median_bare_block_s": median([b["seconds"] for b in blocks if b["arm"] == "A"]),
        "bare_block_before_cluster_s": before_cluster["seconds"],
        "torch_threads": torch.get_num_threads(), "node_stats": stats, "wall_s": time.monotonic() - t_start,
    }
    notes = (
        f"Site a's local-mode training throughput (tokens/s) with the WAN path on vs a bare torch loop, same "
        f"process, torch.set_num_threads(1). Bare arm: {H} SiteTrainer.inner_step calls. WAN arm: the same {H} "
        f"inner steps on a second trainer + pseudo_gradient + a real allreduce_mean with sites b and c over "
        f"CURVE WanNodes through Toxiproxy proxies with no toxics + apply_outer (the site agent's outer sync). "
        f"b and c are threads doing only the all-reduce (no torch). Both arms use the same sample ids. Blocks "
        f"interleaved A B B A ... after one warm-up pair; ratio = median over {PAIRS} adjacent pairs of "
        f"bare_seconds / wan_seconds (= WAN tokens/s over bare tokens/s); aggregate_ratio in raw. The idle "
        f"background of the three I/O threads (poll wake-ups every <= 50 ms, ZMTP heartbeats) runs during both "
        f"arms, so it is NOT in the ratio; bare_block_before_cluster_s is one bare block timed before any WAN "
        f"node existed (not interleaved, informational). The per-pair ratio is noisy on this shared 2-core box "
        f"(single inner steps vary 2-3x under load from other jobs), hence the median.")
    return write_result(NAME, ratio=ratio, goal=f">= {GOAL:.2f}", passed=ratio >= GOAL, raw=raw,
                        env=env_info(version), notes=notes)


if __name__ == "__main__":
    r = run()
    sys.exit(0 if r["passed"] else 1)

"""The site agent: the training loop of one datacenter.

`python -m site_agent.agent --run-dir RUN --site a`

Reads top to bottom: config, setup (data, model, WAN endpoint, join), the round loop
(compute -> collective over the WAN -> apply -> report -> evaluate -> checkpoint), exit.
Every phase is a span in the site's JSON-lines log; the work of every round (canonical
sample ids, tokens, FLOPs) is logged as `work_attempted`, and the coordinator's `commit`
says which of it was retained.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import queue
import signal
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

from site_agent.collective import AllReduce, CollectiveAborted
from site_agent.data import batch_for, evaluate_nll, heldout_batch, load_corpus, sample_order
from site_agent.model import count_params, pick_device
from site_agent.schedule import rounds_for_target, site_samples, steps_per_round
from site_agent.trainer import SiteTrainer
from wan.frames import TrafficClass
from wan.node import WanNode
from xdc.config import config_from_json, to_dict
from xdc.eventlog import EventLog
from xdc.topology import COORD, STORE, Topology

CONTROL = TrafficClass.CONTROL.value
TELEMETRY = TrafficClass.TELEMETRY.value


class Stop(Exception):
    """SIGTERM/SIGINT arrived: leave the loop and exit cleanly."""


def main(argv: list[str] | None = None) -> int:
    # ------------------------------------------------------------------ config
    ap = argparse.ArgumentParser(prog="python -m site_agent.agent", description=__doc__)
    ap.add_argument("--run-dir", required=True, type=Path)
    ap.add_argument("--site", required=True)
    args = ap.parse_args(argv)
    run_dir: Path = args.run_dir
    cfg = config_from_json(run_dir / "config.json")
    topo = Topology.load(run_dir / "topology.json")
    me = args.site
    if me not in cfg.cluster.sites:
        print(f"error: site {me!r} is not in the cluster {list(cfg.cluster.sites)}", file=sys.stderr)
        return 2
    log = EventLog(run_dir / "logs" / f"{me}.jsonl", cfg.run_id, me)
    stopping = {"flag": False}

    def _on_signal(signum: int, _frame: Any) -> None:
        stopping["flag"] = True
        log.emit("signal", signal=signal.Signals(signum).name)

    signal.signal(signal.SIGTERM, _on_signal)
    signal.signal(signal.SIGINT, _on_signal)

    # ------------------------------------------------------------------- setup
    # Sites share the machine's cores: give each a slice so they do not oversubscribe.
    threads = cfg.train.threads_per_site or max(1, (os.cpu_count() or 1) // len(cfg.cluster.sites))
    torch.set_num_threads(threads)
    device = pick_device(cfg.train.device)
    corpus = load_corpus(cfg.data)
    order = sample_order(corpus, cfg.model.seq_len, cfg.data.shuffle_seed)
    hx, hy = heldout_batch(corpus, cfg.data, cfg.model.seq_len)
    trainer = SiteTrainer(cfg, device)
    log.emit("site_started", device=str(device), threads=threads, dataset_id=corpus.dataset_id,
             n_params=count_params(trainer.model), flops_per_token=trainer.flops_per_token,
             params_hash=trainer.params_hash(), torch=torch.__version__, pid=os.getpid())

    node = WanNode(name=me, run_id=cfg.run_id, wan=cfg.wan, log=log, routes=topo.routes_for(me),
                   bind=topo.bind_for(me), server_links=topo.server_links_for(me), members=topo.peers_of(me),
                   keys_dir=str(run_dir / "keys") if cfg.wan.curve else None)
    coll_q = node.inbox("coll")
    ctl_q = node.inbox("membership", "shutdown")
    store_q = None
    store = None
    if STORE in node.routes:
        from checkpoint_store.client import StoreClient
        store_q = node.inbox(*StoreClient.KINDS)
        store = StoreClient(node, store_q, log, cfg.wan.chunk_bytes)
    status = {"round": -1}
    node.every(cfg.wan.heartbeat_interval_ms, lambda: node.send(
        COORD, "heartbeat", CONTROL, {"sent_mono_ns": time.monotonic_ns(), "round": status["round"]},
        reliable=False))
    node.start()
    allreduce = AllReduce(node, coll_q, me, cfg.wan.chunk_bytes, cfg.train.compression)

    # Join: ask the coordinator for an epoch, wait for the membership that includes us.
    node.send(COORD, "join", CONTROL, {"pid": os.getpid()})
    epoch, members = 0, []
    with log.span("join_wait"):
        while not members:
            if stopping["flag"]:
                return _exit(log, node, 0, "signal before membership")
            node.check()
            try:
                msg = ctl_q.get(timeout=0.2)
            except queue.Empty:
                continue
            if msg.kind == "membership":
                epoch, members = int(msg.body["epoch"]), sorted(msg.body["members"])
            elif msg.kind == "shutdown":
                return _exit(log, node, 0, "shutdown before membership")
    node.set_fence(epoch)
    log.set_context(epoch=epoch)
    log.emit("membership", members=members)
    leader = members[0] == me
    n = len(members)
    idx = members.index(me)
    total_rounds = rounds_for_target(cfg, n)
    spr = steps_per_round(cfg)
    tokens_per_sample = cfg.model.seq_len
    parent_ckpt: str | None = None
    log.emit("training_plan", total_rounds=total_rounds, steps_per_round=spr, mode=cfg.train.mode,
             leader=leader, target_useful_tokens=cfg.train.target_useful_tokens)

    def checkpoint(rnd: int, step: int) -> None:
        nonlocal parent_ckpt
        if store is None:
            return
        ids = sorted({s for r in range(rnd + 1) for h in range(spr) for i in range(n)
                      for s in site_samples(order, cfg, r, h, i, n)})
        samples_sha = hashlib.sha256(np.asarray(ids, dtype=np.int64).tobytes()).hexdigest()
        with log.span("checkpoint_write", round=rnd) as sp:
            mhash, _manifest = store.save(trainer.state_tensors(), {
                "run_id": cfg.run_id, "ckpt_id": f"r{rnd}", "round": rnd, "step": step, "epoch": epoch,
                "parent": parent_ckpt, "samples": len(ids), "samples_sha256": samples_sha,
                "useful_tokens": len(ids) * tokens_per_sample, "rounds_covered": [0, rnd + 1],
                "params_hash": trainer.params_hash(), "dataset_id": corpus.dataset_id,
                "config": to_dict(cfg)}, timeout_s=120.0)
            sp.update(manifest_hash=mhash, samples_sha256=samples_sha, useful_tokens=len(ids) * tokens_per_sample)
        parent_ckpt = mhash

    if leader:  # the starting point of the learning curve: the initial weights on the held-out set
        with log.span("eval", round=-1) as sp:
            sp["heldout_nll"] = evaluate_nll(trainer.model, hx, hy, device)
            sp["useful_tokens_trained"] = 0

    # -------------------------------------------------------------------- loop
    exit_reason = "completed"
    rc = 0
    try:
        for rnd in range(total_rounds):
            if stopping["flag"]:
                raise Stop()
            status["round"] = rnd
            step = rnd * spr
            log.set_context(step=step)
            ids_round: list[int] = []
            # Compute: sync = one backward whose grads are averaged; local = H inner AdamW steps.
            with log.span("compute", round=rnd) as sp:
                losses = []
                if cfg.train.mode == "sync":
                    ids = site_samples(order, cfg, rnd, 0, idx, n)
                    ids_round += ids
                    loss, payload = trainer.compute_grads(*batch_for(corpus, ids, cfg.model.seq_len))
                    losses.append(loss)
                else:
                    for h in range(spr):
                        ids = site_samples(order, cfg, rnd, h, idx, n)
                        ids_round += ids
                        losses.append(trainer.inner_step(*batch_for(corpus, ids, cfg.model.seq_len)))
                    payload = trainer.pseudo_gradient()
                sp.update(loss=float(np.mean(losses)), samples=len(ids_round))
            tokens = len(ids_round) * tokens_per_sample
            flops = tokens * trainer.flops_per_token
            log.emit("work_attempted", round=rnd, samples=ids_round, tokens=tokens, flops=flops)
            # Collective over the WAN: mean of grads (sync) or pseudo-gradients (local).
            with log.span("collective", round=rnd, payload_values=int(payload.size)) as sp:
                avg, stats = allreduce.allreduce_mean(payload, rnd, members, cfg.wan.collective_timeout_ms / 1000)
                sp.update(payload_bytes_sent=stats.payload_bytes_sent, messages_sent=stats.messages_sent)
            if cfg.train.mode == "sync":
                trainer.apply_grads(avg)
            else:
                trainer.apply_outer(avg)
            phash = trainer.params_hash()
            node.send(COORD, "round_done", CONTROL, {"round": rnd, "step": step + spr, "param_hash": phash,
                                                     "samples": ids_round, "tokens": tokens, "flops": flops})
            node.send(COORD, "telemetry", TELEMETRY, {"round": rnd, "loss": float(np.mean(losses))}, reliable=False)
            log.emit("round_done", round=rnd, param_hash=phash)
            last = rnd == total_rounds - 1
            if leader and ((rnd + 1) % cfg.train.eval_every_rounds == 0 or last):
                with log.span("eval", round=rnd) as sp:
                    sp["heldout_nll"] = evaluate_nll(trainer.model, hx, hy, device)
                    sp["useful_tokens_trained"] = (rnd + 1) * n * spr * cfg.train.per_site_batch * tokens_per_sample
            if leader and ((rnd + 1) % cfg.train.checkpoint_every_rounds == 0 or last):
                checkpoint(rnd, step + spr)
            if rnd % 4 == 0 or last:
                log.emit("wan_counters", counters=node.counters.snapshot())
    except Stop:
        exit_reason, rc = "signal", 0
    except CollectiveAborted as e:
        exit_reason, rc = f"collective aborted: {e}", 3
        log.emit("collective_aborted", reason=str(e))

    # -------------------------------------------------------------------- exit
    if exit_reason == "completed":
        node.send(COORD, "site_done", CONTROL, {"round": status["round"]})
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and not stopping["flag"]:
            try:
                msg = ctl_q.get(timeout=0.2)
            except queue.Empty:
                continue
            if msg.kind == "shutdown":
                break
    return _exit(log, node, rc, exit_reason)


def _exit(log: EventLog, node: WanNode, rc: int, reason: str) -> int:
    node.wait_acked(3.0)
    log.emit("wan_counters", counters=node.counters.snapshot(), rejected=node.rejected,
             duplicates=node.duplicates, retransmits=node.retransmits, final=True)
    log.emit("site_stopped", reason=reason, rc=rc)
    node.close()
    log.close()
    return rc


if __name__ == "__main__":
    sys.exit(main())

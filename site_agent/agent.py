"""The site agent: the training loop of one datacenter.

`python -m site_agent.agent --run-dir RUN --site a`

Reads top to bottom: config, setup (data, model, WAN endpoint, join), the round loop
(compute -> collective over the WAN -> apply -> report -> evaluate -> checkpoint), exit.
Every phase is a span in the site's JSON-lines log; the work of every round (canonical
sample ids, tokens, FLOPs) is logged as `work_attempted`, and the coordinator's `commit`
says which of it was retained.

With `train.workers_per_site` W > 1 this process is rank 0 of the site's W worker processes
(see site_agent/worker.py): it spawns ranks 1..W-1, joins their gloo group, trains on its
1/W slice of every step's batch with grads averaged over the group, does the WAN collective
alone, broadcasts its result for every rank to apply and checks after every round that all
ranks hold the same parameters (`intra_site_check`). With W = 1 none of that runs.
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
from site_agent.trainer import IntraSiteError, SiteTrainer
from site_agent.worker import WorkerPool, check_workers, rank_slice, threads_per_worker
from wan.frames import TrafficClass
from wan.node import WanNode
from xdc.config import ConfigError, RunConfig, config_from_json, to_dict
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
    try:
        world = check_workers(cfg)  # W processes in this site; 1 = just this one
    except ConfigError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
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
    # Sites share the machine's cores: give each a slice so they do not oversubscribe; a site's
    # slice is divided among its W workers (W = 1: the whole slice).
    threads = threads_per_worker(cfg)
    torch.set_num_threads(threads)
    pool: WorkerPool | None = None
    if world > 1:  # start the other ranks first: they load data and build the model meanwhile
        pool = WorkerPool(run_dir, cfg, me, log)
        pool.start()
    try:
        return _run(args, cfg, topo, me, log, stopping, threads, pool)
    except BaseException:
        if pool is not None:  # a crash: never leave the workers behind (PR_SET_PDEATHSIG is the backstop)
            pool.close("site crashed")
        raise


def _run(args: argparse.Namespace, cfg: RunConfig, topo: Topology, me: str, log: EventLog, stopping: dict[str, bool],
         threads: int, pool: WorkerPool | None) -> int:
    run_dir: Path = args.run_dir
    world = cfg.train.workers_per_site
    device = pick_device(cfg.train.device)
    corpus = load_corpus(cfg.data)
    order = sample_order(corpus, cfg.model.seq_len, cfg.data.shuffle_seed)
    hx, hy = heldout_batch(corpus, cfg.data, cfg.model.seq_len)
    group = None
    if pool is not None:
        try:
            if not pool.connect(lambda: stopping["flag"]):
                return _exit_early(log, pool, 0, "signal before the intra-site group formed")
        except IntraSiteError as e:
            return _exit_early(log, pool, 4, f"intra-site group failed: {e}")
        group = torch.distributed.group.WORLD
    trainer = SiteTrainer(cfg, device, group=group)
    log.emit("site_started", device=str(device), threads=threads, dataset_id=corpus.dataset_id,
             n_params=count_params(trainer.model), flops_per_token=trainer.flops_per_token,
             params_hash=trainer.params_hash(), torch=torch.__version__, pid=os.getpid(), workers_per_site=world)
    if pool is not None:
        try:
            pool.check(-1, trainer.params_hash())  # every rank starts from the same weights
        except IntraSiteError as e:
            return _exit_early(log, pool, 4, f"intra-site check failed: {e}")

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
                return _exit(log, node, 0, "signal before membership", pool)
            node.check()
            try:
                msg = ctl_q.get(timeout=0.2)
            except queue.Empty:
                continue
            if msg.kind == "membership":
                epoch, members = int(msg.body["epoch"]), sorted(msg.body["members"])
            elif msg.kind == "shutdown":
                return _exit(log, node, 0, "shutdown before membership", pool)
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
            if pool is not None:  # the other ranks compute this round with us
                pool.begin_round(rnd, n, idx, epoch)
            # Compute: sync = one backward whose grads are averaged; local = H inner AdamW steps.
            with log.span("compute", round=rnd) as sp:
                losses = []
                if cfg.train.mode == "sync":
                    ids = site_samples(order, cfg, rnd, 0, idx, n)
                    ids_round += ids
                    mine = rank_slice(ids, 0, world)  # W = 1: all of ids
                    loss, payload = trainer.compute_grads(*batch_for(corpus, mine, cfg.model.seq_len))
                    losses.append(loss)
                else:
                    for h in range(spr):
                        ids = site_samples(order, cfg, rnd, h, idx, n)
                        ids_round += ids
                        mine = rank_slice(ids, 0, world)
                        losses.append(trainer.inner_step(*batch_for(corpus, mine, cfg.model.seq_len)))
                    payload = trainer.pseudo_gradient()
                sp.update(loss=float(np.mean(losses)), samples=len(ids_round))
            if pool is not None:
                pool.compute_done()
            tokens = len(ids_round) * tokens_per_sample
            flops = tokens * trainer.flops_per_token
            log.emit("work_attempted", round=rnd, samples=ids_round, tokens=tokens, flops=flops)
            # Collective over the WAN: mean of grads (sync) or pseudo-gradients (local).
            with log.span("collective", round=rnd, payload_values=int(payload.size)) as sp:
                avg, stats = allreduce.allreduce_mean(payload, rnd, members, cfg.wan.collective_timeout_ms / 1000)
                sp.update(payload_bytes_sent=stats.payload_bytes_sent, messages_sent=stats.messages_sent)
            if pool is not None:  # every rank applies the same vector
                pool.share(rnd, avg)
            if cfg.train.mode == "sync":
                trainer.apply_grads(avg)
            else:
                trainer.apply_outer(avg)
            phash = trainer.params_hash()
            if pool is not None:
                pool.check(rnd, phash)
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
    except IntraSiteError as e:  # a worker died, the group timed out, or the ranks disagree
        exit_reason, rc = f"intra-site failure: {e}", 4
        log.emit("intra_site_failure", reason=str(e))

    # -------------------------------------------------------------------- exit
    if pool is not None:  # the workers have nothing left to do
        pool.close(exit_reason)
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
    return _exit(log, node, rc, exit_reason, pool)


def _exit_early(log: EventLog, pool: WorkerPool, rc: int, reason: str) -> int:
    """Exit before the WAN endpoint exists (W > 1 only: the intra-site group did not form)."""
    pool.close(reason)
    log.emit("site_stopped", reason=reason, rc=rc)
    log.close()
    return rc


def _exit(log: EventLog, node: WanNode, rc: int, reason: str, pool: WorkerPool | None = None) -> int:
    if pool is not None:
        pool.close(reason)
    node.wait_acked(3.0)
    log.emit("wan_counters", counters=node.counters.snapshot(), rejected=node.rejected,
             duplicates=node.duplicates, retransmits=node.retransmits, final=True)
    log.emit("site_stopped", reason=reason, rc=rc)
    node.close()
    log.close()
    return rc


if __name__ == "__main__":
    sys.exit(main())

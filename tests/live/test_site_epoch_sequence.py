"""Two epochs announced back to back reach sites that are still finishing a round (issue 9).

Three real `Site`s (site_agent/agent.py: real model, real data, real WanNodes over CURVE sockets)
train in threads of this process; the coordinator's side is a script on a real WanNode, so the
moment the two epochs go out is exact: right after round 0 commits, while every site computes
round 1, it announces epoch 2 (b drained "from round 2") and at once epoch 3 (c drained "from
round 3"), as the oracle did in the reported run.

Before the fix site a jumped straight to epoch 3, failed with `restore_failed: no snapshot of
round 3 (holding round 2, snapshots [0, 1])` and the cluster restarted from the initial weights.
Now: a and c train round 2 in epoch 2, a continues alone in epoch 3 to the target, b skips
epoch 2 (it is no member) with the reason logged, and what a retained is exactly the
canonical prefix of the samples.
"""

from __future__ import annotations

import queue
from contextlib import contextmanager
import threading
import time
from pathlib import Path
from typing import Any, Iterator

import numpy as np
import torch

from site_agent.agent import Site
from site_agent.data import load_corpus, sample_order
from site_agent.model import pick_device
from ground.schedule import ids_at, samples_per_round, target_samples
from site_agent.state import samples_sha256
from site_agent.trainer import SiteTrainer
from wan.keys import generate_cluster_keys
from wan.node import Route, WanNode
from wan.toxiproxy import free_port
from ground.config import load_config
from ground.eventlog import EventLog, read_events

SITES = ["a", "b", "c"]
SEQ = 32
CFG = {"run_id": "seq-test", "cluster": {"sites": SITES},
       "model": {"d_model": 32, "n_layers": 1, "n_heads": 2, "seq_len": SEQ},
       "train": {"mode": "sync", "per_site_batch": 4, "target_useful_tokens": 40 * SEQ, "eval_every_rounds": 100,
                 "checkpoint_every_rounds": 100, "threads_per_site": 1, "device": "cpu"},
       "wan": {"chunk_bytes": 65536}}


def _nodes(tmp: Path, cfg: Any) -> dict[str, WanNode]:
    procs = ["coord", *SITES]
    generate_cluster_keys(tmp / "keys", procs)
    ports = {p: free_port() for p in procs}
    nodes = {}
    for p in procs:
        routes = [] if p == "coord" else [Route(t, f"{p}_to_{t}", f"tcp://127.0.0.1:{ports[t]}")
                                          for t in procs if t != p]
        servers = {s: f"{s}_to_{p}" for s in SITES if s != p}
        nodes[p] = WanNode(name=p, run_id=cfg.run_id, wan=cfg.wan, log=EventLog(tmp / f"{p}.jsonl", cfg.run_id, p),
                           routes=routes, bind=f"tcp://127.0.0.1:{ports[p]}", server_links=servers,
                           members=[t for t in procs if t != p], keys_dir=str(tmp / "keys"))
    return nodes


def _plan(epoch: int, members: list[str], start_round: int, start_cursor: int) -> dict[str, Any]:
    return {"epoch": epoch, "members": members, "paused": False, "start_round": start_round,
            "start_cursor": start_cursor, "restore": "none", "donor": None, "joiners": [], "manifest_hash": None,
            "parent_commit": None, "drain": None, "frontier_manifest": None, "checkpoint_first": False}


def _wait(q: queue.Queue, pred: Any, timeout_s: float, what: str) -> list[Any]:
    """Messages off q until pred(all so far) holds."""
    got: list[Any] = []
    deadline = time.monotonic() + timeout_s
    while not pred(got):
        assert time.monotonic() < deadline, f"timed out waiting for {what}; got {[(m.src, m.body) for m in got]}"
        try:
            got.append(q.get(timeout=0.5))
        except queue.Empty:
            pass
    return got


@contextmanager
def running_sites(tmp_path: Path, cfg: Any, stopping: dict[str, dict[str, Any]] | None = None
                  ) -> Iterator[dict[str, Any]]:
    """Three real Sites in threads and the scripted coordinator's node, started. Yields a dict: coord,
    its inboxes joins / reports / done, each site's stop flag (stopping), the sites' exit codes (rcs),
    the threads, the canonical sample order and the `Site`s themselves (sites). `stopping` gives some
    sites their own stop flag (a mapping whose "flag" turns True when the site must stop). On leaving, every site is told to stop and joined,
    and the coordinator's node is closed."""
    corpus = load_corpus(cfg.data)
    order = sample_order(corpus, SEQ, cfg.data.shuffle_seed)
    nodes = _nodes(tmp_path, cfg)
    coord = nodes["coord"]
    joins, reports, done = coord.inbox("join"), coord.inbox("round_done"), coord.inbox("site_done")
    coord.inbox("heartbeat", "telemetry", "peer_unreachable", "preempt_notice")
    stopping = {s: {"flag": False} for s in SITES} | (stopping or {})
    rcs: dict[str, Any] = {}
    sites = {s: Site(cfg, s, nodes[s].log, nodes[s], SiteTrainer(cfg, torch.device("cpu")), corpus, order,
                     pick_device("cpu"), stopping[s], None) for s in SITES}
    threads = [threading.Thread(target=lambda s=s: rcs.update({s: sites[s].run()}), name=f"site-{s}") for s in SITES]
    coord.start()
    for t in threads:
        t.start()
    try:
        yield {"coord": coord, "joins": joins, "reports": reports, "done": done, "stopping": stopping, "rcs": rcs,
               "threads": threads, "order": order,
               "sites": sites}
    finally:
        for s in SITES:
            stopping[s]["flag"] = True
        for t in threads:
            t.join(30)
        coord.close()


def test_back_to_back_epochs_reach_sites_mid_round_and_every_round_is_trained_in_its_epoch(tmp_path):
    torch.set_num_threads(1)
    cfg = load_config(CFG)
    with running_sites(tmp_path, cfg) as h:
        coord, joins, reports, done = h["coord"], h["joins"], h["reports"], h["done"]
        stopping, rcs, threads, order = h["stopping"], h["rcs"], h["threads"], h["order"]
        _wait(joins, lambda g: {m.src for m in g} >= set(SITES), 60, "joins")
        for s in SITES:
            coord.send(s, "membership", "control", _plan(1, SITES, 0, 0), epoch=1)
        _wait(reports, lambda g: {m.src for m in g if m.body["round"] == 0} == set(SITES), 120, "round 0")
        # Round 0 committed; every site is computing round 1. Two drains, back to back.
        c2 = 2 * samples_per_round(cfg, 3)  # after round 1 (3 members)
        c3 = c2 + samples_per_round(cfg, 2)  # after round 2 (a and c)
        for s in SITES:
            coord.send(s, "membership", "control", _plan(2, ["a", "c"], 2, c2), epoch=2)
            coord.send(s, "membership", "control", _plan(3, ["a"], 3, c3), epoch=3)
        _wait(done, lambda g: any(m.src == "a" for m in g), 180, "a's site_done")
        for s in SITES:
            coord.send(s, "shutdown", "control", {"reason": "test over"}, epoch=3)
        for t in threads:
            t.join(60)
    assert rcs == {s: 0 for s in SITES}, rcs
    ev = {s: read_events(tmp_path / f"{s}.jsonl") for s in SITES}
    for s in SITES:
        assert not [e for e in ev[s] if e["event"] in ("restore_failed", "message_rejected")], s

    def rounds(s: str) -> list[tuple[int, int]]:
        return [(e["epoch"], e["round"]) for e in ev[s] if e["event"] == "round_done"]

    # a: every round once, each in the epoch that governs it; then the target, alone.
    assert [e["epoch"] for e in ev["a"] if e["event"] == "membership"] == [1, 2, 3]
    assert rounds("a") == [(1, 0), (1, 1), (2, 2), (3, 3), (3, 4)]
    # c trains round 2 with a, then learns it is no member of epoch 3.
    assert rounds("c") == [(1, 0), (1, 1), (2, 2)]
    assert [e["epoch"] for e in ev["c"] if e["event"] == "not_a_member"] == [3]
    # b owes nothing after round 1: it skips epoch 2, saying why, and leaves in epoch 3.
    assert rounds("b") == [(1, 0), (1, 1)]
    skipped = [e for e in ev["b"] if e["event"] == "membership_skipped"]
    assert [(e["skipped_epoch"], e["reason"]) for e in skipped] == [
        (2, "not a member of epoch 2, and epoch 3 is already announced")]
    # a and c agree on round 2's parameters; a's retained samples are exactly the canonical prefix.
    r2 = {s: next(e["param_hash"] for e in ev[s] if e["event"] == "round_done" and e["round"] == 2) for s in "ac"}
    assert r2["a"] == r2["c"]
    last = [e for e in ev["a"] if e["event"] == "round_done"][-1]
    target = target_samples(cfg)
    assert last["cursor_end"] == target == 40
    canonical = np.asarray(ids_at(order, range(0, target)), dtype=np.int64)
    assert last["retained_samples"] == target and last["samples_sha256"] == samples_sha256(canonical)
    assert [e for e in ev["a"] if e["event"] == "target_reached"]

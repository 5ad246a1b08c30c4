"""The site's collective on real WanNodes over real sockets (CURVE, loopback, no proxy).

Scenarios: an insider (a cluster key holder) sends malformed parts in the middle of a round; a
peer floods parts of a future epoch; peers that adopted the next epoch first send their parts
while this site is still in the old one. Every bad part is rejected with its logged reason, the
early buffer stays within its bound, and the rounds complete with every member's sample ids.
"""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from site_agent.collective import AllReduce, CollectiveAborted, reduce_in_order
from wan.keys import generate_cluster_keys
from wan.node import Route, WanNode
from wan.toxiproxy import free_port
from ground.config import WanConfig
from ground.eventlog import EventLog, read_events

SITES = ["a", "b", "c"]  # the members of every round here
ALL = SITES + ["d"]  # d: a site of the cluster that takes no part in these rounds
P = 3001  # flat vector length (not divisible by 3)
WAN = WanConfig(chunk_bytes=4096)  # 1024 float32 values per part


def _mesh(tmp: Path, names: list[str]) -> dict[str, WanNode]:
    generate_cluster_keys(tmp / "keys", names)
    ports = {s: free_port() for s in names}
    nodes = {}
    for s in names:
        others = [t for t in names if t != s]
        nodes[s] = WanNode(name=s, run_id="r1", wan=WAN, log=EventLog(tmp / f"{s}.jsonl", "r1", s),
                           routes=[Route(t, f"{s}_to_{t}", f"tcp://127.0.0.1:{ports[t]}") for t in others],
                           bind=f"tcp://127.0.0.1:{ports[s]}", server_links={t: f"{t}_to_{s}" for t in others},
                           members=others, keys_dir=str(tmp / "keys"))
    return nodes


def _reducers(nodes: dict[str, WanNode], **kw: Any) -> dict[str, AllReduce]:
    out = {}
    for s in SITES:
        out[s] = AllReduce(nodes[s], nodes[s].inbox("coll"), s, WAN.chunk_bytes, "none", max_total=P, attest=True,
                           max_samples=16, sample_id_limit=1000, sites=frozenset(ALL), **kw)
    return out


def _round(reducers: dict[str, AllReduce], who: list[str], rnd: int, vecs: dict[str, np.ndarray],
           ids: dict[str, list[int]], timeout_s: float = 30) -> dict[str, Any]:
    """allreduce_mean on one thread per site in `who`; {site: (out, stats) or the exception}."""
    res: dict[str, Any] = {}

    def run(s: str) -> None:
        try:
            res[s] = reducers[s].allreduce_mean(vecs[s], rnd, SITES, timeout_s, ids[s])
        except Exception as e:  # reported to the test
            res[s] = e

    threads = [threading.Thread(target=run, args=(s,)) for s in who]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout_s + 30)
    return res


def _rejections(tmp: Path, site: str) -> list[dict]:
    return [e for e in read_events(tmp / f"{site}.jsonl") if e["event"] == "message_rejected"]


@pytest.fixture
def mesh(tmp_path: Path):
    nodes = _mesh(tmp_path, ALL + ["m"])  # m: an insider holding a cluster key, no site
    for n in nodes.values():
        n.start()
    try:
        yield nodes
    finally:
        for n in nodes.values():
            n.close()


def _vecs_ids(seed: int) -> tuple[dict[str, np.ndarray], dict[str, list[int]]]:
    rng = np.random.default_rng(seed)
    vecs = {s: rng.standard_normal(P).astype(np.float32) for s in SITES}
    ids = {s: [10 * k + i for i in range(4)] for k, s in enumerate(SITES)}
    return vecs, ids


def _wait_inbox(q: Any, n: int) -> None:
    deadline = time.monotonic() + 10
    while q.qsize() < n and time.monotonic() < deadline:
        time.sleep(0.02)
    assert q.qsize() >= n, f"only {q.qsize()} of {n} messages arrived"


def test_an_insiders_malformed_parts_are_rejected_and_the_round_completes_with_every_members_ids(tmp_path, mesh):
    reducers = _reducers(mesh)
    good = {"round": 0, "phase": "rs", "shard": 0, "offset": 0, "total": 1000, "scale": 1.0}
    ok_vals, ids = np.zeros(1000, dtype=np.float32), np.arange(4, dtype=np.int64)
    bad = [({**good, "round": "x"}, [ok_vals, ids]),
           ({**good, "round": float("inf")}, [ok_vals, ids]),
           ({**good, "scale": float("inf")}, [ok_vals, ids]),
           (good, [np.full(1000, np.nan, dtype=np.float32), ids]),
           (good, [ok_vals.astype(np.float16), ids]),
           (good, [ok_vals[:10], ids]),
           (good, [ok_vals]),
           (good, [ok_vals, ids])]  # well formed, but m is no site
    for body, arrays in bad:
        mesh["m"].send("a", "coll", "collective", body, arrays)
    _wait_inbox(reducers["a"].inbox, len(bad))
    vecs, sample_ids = _vecs_ids(0)
    res = _round(reducers, SITES, 0, vecs, sample_ids)
    want = reduce_in_order([vecs[s] for s in SITES])
    for s in SITES:
        out, stats = res[s]
        np.testing.assert_array_equal(out, want)
        assert {m: v.tolist() for m, v in stats.samples.items()} == sample_ids  # attested by each sender
    reasons = [(e["reason"], e["src"]) for e in _rejections(tmp_path, "a")]
    assert sorted(reasons) == sorted([("bad_field", "m"), ("bad_field", "m"), ("non_finite", "m"),
                                      ("non_finite", "m"), ("bad_payload", "m"), ("bad_payload", "m"),
                                      ("missing_samples", "m"), ("not_a_site", "m")]), reasons
    details = " | ".join(e["detail"] for e in _rejections(tmp_path, "a"))
    assert "'round' must be an integer, got float inf" in details
    assert "'scale' = inf is not a finite number" in details
    assert "payload holds 1000 infinite or NaN value(s)" in details
    assert res["a"][1].rejected == len(bad)


def test_parts_of_a_future_epoch_wait_within_a_bound_and_serve_the_round_when_the_epoch_comes(tmp_path, mesh):
    reducers = _reducers(mesh, early_max_parts=24, early_max_bytes=1 << 20)  # one sender may hold 12
    for s in SITES:
        reducers[s].reset(1)
        mesh[s].set_fence(1)
    # d floods a with 40 well-formed parts of a far-future epoch (distinct rounds).
    for r in range(40):
        mesh["d"].send("a", "coll", "collective", {"round": 100 + r, "phase": "ag", "shard": 1, "offset": 0,
                                                  "total": 1, "scale": 1.0}, [np.ones(1, dtype=np.float32)],
                       epoch=9)
    _wait_inbox(reducers["a"].inbox, 40)
    # b and c adopt epoch 2 first and start its round 0; a is still in epoch 1 and waits in vain.
    for s in ("b", "c"):
        reducers[s].reset(2)
        mesh[s].set_fence(2)
    vecs, ids = _vecs_ids(1)
    early: dict[str, Any] = {}
    t = threading.Thread(target=lambda: early.update(_round(reducers, ["b", "c"], 0, vecs, ids, timeout_s=60)))
    t.start()
    stale = _round(reducers, ["a"], 0, vecs, ids, timeout_s=3)  # epoch 1: b and c never answer it
    assert isinstance(stale["a"], CollectiveAborted)
    parts, nbytes = reducers["a"].early_held()
    assert parts <= 24 and nbytes <= 1 << 20
    full = [e for e in _rejections(tmp_path, "a") if e["reason"] == "early_buffer_full"]
    assert len(full) == 40 - 12, len(full)
    assert {e["src"] for e in full} == {"d"} and "one sender may hold 12 parts" in full[0]["detail"]
    # a adopts epoch 2: the parts b and c sent it meanwhile were kept and complete its round.
    reducers["a"].reset(2)
    mesh["a"].set_fence(2)
    res = _round(reducers, ["a"], 0, vecs, ids, timeout_s=30)
    t.join(90)
    want = reduce_in_order([vecs[s] for s in SITES])
    for s, (out, stats) in {**early, **res}.items():
        np.testing.assert_array_equal(out, want, err_msg=s)
        assert set(stats.samples) == set(SITES)
    assert reducers["a"].early_held()[0] == 12  # the future epoch's junk still waits, within its share

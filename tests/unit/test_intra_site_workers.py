"""Intra-site data parallelism without starting anything: a site's batch must split over its W
workers, and a rank that disagrees is a logged error. The real workers (gloo, site processes,
Toxiproxy): tests/live/test_intra_site_workers.py."""

from __future__ import annotations

import pytest

from site_agent import worker as worker_mod
from site_agent.worker import IntraSiteMismatch, WorkerPool, check_workers, rank_slice, threads_per_worker
from ground.config import ConfigError, load_config
from ground.eventlog import EventLog, read_events


def test_workers_per_site_must_divide_the_site_batch():
    with pytest.raises(ConfigError, match=r"workers_per_site=3 must divide train.per_site_batch=8"):
        check_workers(load_config({"train": {"per_site_batch": 8, "workers_per_site": 3}}))
    with pytest.raises(ConfigError, match=r"workers_per_site: must be >= 1"):
        check_workers(load_config({"train": {"workers_per_site": 0}}))
    assert check_workers(load_config({"train": {"per_site_batch": 8, "workers_per_site": 4}})) == 4
    assert check_workers(load_config({})) == 1  # the default: one process per site
    # Rank k trains on every W-th sample of the site's batch: the slices partition it.
    ids = list(range(100, 108))
    assert rank_slice(ids, 0, 2) == [100, 102, 104, 106] and rank_slice(ids, 1, 2) == [101, 103, 105, 107]
    assert rank_slice(ids, 0, 1) == ids
    # The site's thread budget is split among its workers, min 1 each.
    assert threads_per_worker(load_config({"train": {"threads_per_site": 4, "workers_per_site": 2}})) == 2
    assert threads_per_worker(load_config({"train": {"threads_per_site": 1, "workers_per_site": 2}})) == 1


def test_a_rank_that_disagrees_is_a_logged_error(tmp_path, monkeypatch):
    """WorkerPool.check compares every rank's params_hash with rank 0's (here the gathered
    hashes are faked: the real all_gather runs in the cluster tests)."""
    cfg = load_config({"train": {"workers_per_site": 2}})
    log = EventLog(tmp_path / "a.jsonl", "r", "a")
    pool = WorkerPool(tmp_path, cfg, "a", log)
    good, bad = "ab" * 32, "cd" * 32
    monkeypatch.setattr(worker_mod, "gather_hashes", lambda phash, world: [phash, phash])
    pool.check(0, good)
    assert pool.at_control
    monkeypatch.setattr(worker_mod, "gather_hashes", lambda phash, world: [phash, bad])
    with pytest.raises(IntraSiteMismatch, match="round 1"):
        pool.check(1, good)
    log.close()
    checks = [e for e in read_events(tmp_path / "a.jsonl") if e["event"] == "intra_site_check"]
    assert [(c["round"], c["passed"], c["mismatched_ranks"]) for c in checks] == [(0, True, []), (1, False, [1])]

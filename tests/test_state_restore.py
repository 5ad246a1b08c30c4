"""Snapshots and state loading: a site rolled back, or a joiner loaded from a donor, continues bit for bit."""

from __future__ import annotations

import torch

from site_agent.data import batch_for, load_corpus, sample_order
from site_agent.state import load_blobs, restore_snapshot, take_snapshot
from site_agent.state_transfer import pack_state, unpack_state
from site_agent.trainer import SiteTrainer
from xdc.config import load_config


def _cfg(mode: str):
    return load_config({"train": {"mode": mode, "per_site_batch": 4, "inner_steps_h": 2},
                        "model": {"d_model": 32, "n_layers": 1, "n_heads": 2, "seq_len": 32}})


def _train(t: SiteTrainer, corpus, order, start: int, steps: int) -> None:
    for s in range(steps):
        ids = [int(order[start + s * 4 + j]) for j in range(4)]
        x, y = batch_for(corpus, ids, t.cfg.model.seq_len)
        if t.cfg.train.mode == "local":
            t.inner_step(x, y)
        else:
            _, g = t.compute_grads(x, y)
            t.apply_grads(g)
    if t.cfg.train.mode == "local":
        t.apply_outer(t.pseudo_gradient())


def test_rollback_to_round_start_then_redo_gives_the_same_bits():
    torch.set_num_threads(1)
    for mode in ("local", "sync"):
        cfg = _cfg(mode)
        corpus = load_corpus(cfg.data)
        order = sample_order(corpus, cfg.model.seq_len, 0)
        t = SiteTrainer(cfg, torch.device("cpu"))
        _train(t, corpus, order, 0, 2)
        snap = take_snapshot(t, 1)
        _train(t, corpus, order, 8, 2)
        after_once = t.params_hash()
        restore_snapshot(t, snap)
        assert t.params_hash() == snap.params_hash
        _train(t, corpus, order, 8, 2)
        assert t.params_hash() == after_once, mode


def test_joiner_loaded_from_donor_state_trains_identically():
    torch.set_num_threads(1)
    cfg = _cfg("local")
    corpus = load_corpus(cfg.data)
    order = sample_order(corpus, cfg.model.seq_len, 0)
    donor = SiteTrainer(cfg, torch.device("cpu"))
    _train(donor, corpus, order, 0, 2)
    joiner = SiteTrainer(cfg, torch.device("cpu"))  # fresh initial weights
    assert joiner.params_hash() != donor.params_hash()
    load_blobs(joiner, unpack_state(pack_state(donor.state_tensors())))
    assert joiner.params_hash() == donor.params_hash()
    _train(donor, corpus, order, 8, 2)
    _train(joiner, corpus, order, 8, 2)
    assert joiner.params_hash() == donor.params_hash()

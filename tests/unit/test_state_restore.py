"""Snapshots and state loading: a site rolled back, or a joiner loaded from a donor, continues bit for bit,
and the samples its lineage retained roll back and travel with the state."""

from __future__ import annotations

import hashlib

import numpy as np
import pytest
import torch

from site_agent.data import batch_for, load_corpus, sample_order
from ground.schedule import ids_at
from site_agent.state import (load_blobs, merge_retained, restore_snapshot, retained_of, samples_sha256, take_snapshot,
                              with_lineage)
from site_agent.state_transfer import pack_state, unpack_state
from site_agent.trainer import SiteTrainer
from ground.config import load_config


def _cfg(mode: str):
    return load_config({"train": {"mode": mode, "per_site_batch": 4, "inner_steps_h": 2},
                        "model": {"d_model": 32, "n_layers": 1, "n_heads": 2, "seq_len": 32}})


def _train(t: SiteTrainer, corpus, order, start: int, steps: int) -> None:
    for s in range(steps):
        ids = [int(order[start + s * 4 + j]) for j in range(4)]
        x, y = batch_for(corpus, ids, t.cfg.model.seq_len)
        frontier = (start + s * 4) * t.cfg.model.seq_len  # the lr follows the sample position
        if t.cfg.train.mode == "local":
            t.inner_step(x, y, frontier_tokens=frontier)
        else:
            _, g = t.compute_grads(x, y)
            t.apply_grads(g, frontier_tokens=frontier)
    if t.cfg.train.mode == "local":
        t.apply_outer(t.pseudo_gradient(), frontier_tokens=start * t.cfg.model.seq_len)


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


def test_retained_samples_hash_like_the_canonical_prefix_and_travel_with_a_donors_state():
    torch.set_num_threads(1)
    cfg = _cfg("sync")
    corpus = load_corpus(cfg.data)
    order = sample_order(corpus, cfg.model.seq_len, 0)
    # Three members' ids of two rounds, merged round by round in any member order...
    retained = np.empty(0, dtype=np.int64)
    for rnd in range(2):
        per_site = [ids_at(order, range(rnd * 12 + k * 4, rnd * 12 + k * 4 + 4)) for k in (2, 0, 1)]
        retained = merge_retained(retained, np.concatenate([np.asarray(x) for x in per_site]))
    # ...hash exactly as the canonical prefix always did (sorted int64, little-endian).
    canonical = hashlib.sha256(np.asarray(sorted(ids_at(order, range(0, 24))), dtype=np.int64).tobytes()).hexdigest()
    assert samples_sha256(retained) == canonical
    donor = SiteTrainer(cfg, torch.device("cpu"))
    blobs = unpack_state(pack_state(with_lineage(donor.state_tensors(), retained)))
    got = retained_of(blobs, "state from a", canonical)
    assert got.tolist() == sorted(retained.tolist())
    load_blobs(SiteTrainer(cfg, torch.device("cpu")), blobs)  # the lineage blob does not disturb loading


def test_state_whose_retained_samples_are_missing_or_disagree_with_the_announced_hash_is_refused():
    cfg = _cfg("sync")
    blobs = SiteTrainer(cfg, torch.device("cpu")).state_tensors()
    with pytest.raises(ValueError, match=r"checkpoint x carries no retained sample ids \(blob 'lineage'"):
        retained_of(blobs, "checkpoint x", None)
    ids = np.array([3, 1, 2], dtype=np.int64)
    with pytest.raises(ValueError, match="retained sample ids hash to .* the announced samples_sha256 is 00"):
        retained_of(with_lineage(blobs, ids), "checkpoint x", "00" * 32)
    bad = with_lineage(blobs, ids)
    bad["lineage"]["retained_ids"] = bad["lineage"]["retained_ids"].float()
    with pytest.raises(ValueError, match=r"are torch.float32 \[3\], expected int64"):
        retained_of(bad, "checkpoint x", None)


def test_rolling_back_to_a_round_start_snapshot_rolls_back_the_retained_samples():
    cfg = _cfg("sync")
    t = SiteTrainer(cfg, torch.device("cpu"))
    before = np.array([5, 9], dtype=np.int64)
    snap = take_snapshot(t, 3, before)
    before[0] = 77  # the snapshot holds its own copy
    assert snap.retained.tolist() == [5, 9]
    assert take_snapshot(t, 0).retained.size == 0


def test_a_donor_state_that_is_not_a_packed_state_is_refused_with_a_value_error():
    import safetensors.torch as st

    good = pack_state({"model": {"w": torch.zeros(3)}})
    for data, words in [(b"garbage", "not a valid safetensors blob"),
                        (good[:-2], "not a valid safetensors blob"),
                        (st.save({"noslash": torch.zeros(1)}), "'noslash' is not '<group>/<name>'")]:
        with pytest.raises(ValueError, match=words):
            unpack_state(data)

"""The learning-rate schedule keyed to useful tokens (pure arithmetic) and how the trainer uses it."""

from __future__ import annotations

import math

import numpy as np
import torch

from site_agent.data import batch_for, load_corpus, sample_order
from site_agent.lr_schedule import inner_lr_at, lr_factor, outer_lr_at, step_frontier_tokens
from ground.schedule import site_positions
from site_agent.trainer import SiteTrainer
from ground.config import load_config

TINY_MODEL = {"d_model": 32, "n_layers": 1, "n_heads": 2, "seq_len": 32}


def _cfg(**train):
    return load_config({"train": {"target_useful_tokens": 100_000, "lr_warmup_tokens": 10_000,
                                  "lr_floor_fraction": 0.1, **train}, "model": TINY_MODEL})


def test_warmup_is_linear_then_cosine_reaches_the_floor_at_the_target_and_stays():
    t = _cfg().train
    assert 0 < lr_factor(0, t) < 1e-3  # the first step is small but not zero
    assert lr_factor(4_999, t) == 5_000 / 10_000
    assert lr_factor(10_000, t) == 1.0  # the peak at the end of the warm-up
    mid = 10_000 + 45_000  # half-way through the decay: floor + (1 - floor) / 2
    assert math.isclose(lr_factor(mid, t), 0.1 + 0.9 * 0.5, rel_tol=1e-12)
    assert lr_factor(100_000, t) == 0.1 and lr_factor(250_000, t) == 0.1
    values = [lr_factor(k, t) for k in range(10_000, 100_001, 997)]
    assert all(a >= b for a, b in zip(values, values[1:]))  # decay never goes back up


def test_decay_length_and_constant_schedule():
    t = _cfg(lr_decay_tokens=50_000).train
    assert lr_factor(50_000, t) == 0.1 and lr_factor(30_000, t) > 0.1
    assert all(lr_factor(k, _cfg(lr_schedule="constant").train) == 1.0 for k in (0, 5, 10_000, 10**7))


def test_outer_lr_follows_the_schedule_only_when_asked():
    plain, sched = _cfg(outer_lr=0.8), _cfg(outer_lr=0.8, outer_lr_scheduled=True)
    assert outer_lr_at(plain, 0) == outer_lr_at(plain, 90_000) == 0.8
    assert outer_lr_at(sched, 90_000) == 0.8 * lr_factor(90_000, sched.train) < 0.8
    assert inner_lr_at(plain, 90_000) == plain.train.inner_lr * lr_factor(90_000, plain.train)


def test_step_frontier_counts_every_members_batch_and_is_cut_at_the_round_end():
    cfg = _cfg(per_site_batch=4, inner_steps_h=3)
    seq = cfg.model.seq_len
    # Round starting at sample 120 with 3 members: step h starts at 120 + h * 12 samples.
    assert [step_frontier_tokens(cfg, 3, 120, h, 156) for h in range(3)] == [120 * seq, 132 * seq, 144 * seq]
    # The same data position with 2 members (elastic) is the same frontier: same lr.
    assert step_frontier_tokens(cfg, 2, 120, 3, 200) == step_frontier_tokens(cfg, 3, 120, 2, 200)
    # The step's frontier is where the cluster's batch of that step begins (site 0's first sample).
    assert step_frontier_tokens(cfg, 3, 120, 2, 156) == site_positions(cfg, 3, 120, 2, 0, 156).start * seq
    assert step_frontier_tokens(cfg, 3, 120, 2, 130) == 130 * seq  # cut last round


def test_the_trainer_steps_with_the_scheduled_lr_and_a_rollback_repeats_it_bitwise():
    """Two trainers fed the same batches at the same frontiers end bitwise equal; feeding a
    different frontier (another lr) gives different weights: the frontier, not the call count,
    sets the lr."""
    torch.set_num_threads(1)
    cfg = _cfg(mode="local", per_site_batch=4, inner_steps_h=2)
    corpus = load_corpus(cfg.data)
    order = sample_order(corpus, cfg.model.seq_len, 0)
    xy = batch_for(corpus, [int(i) for i in order[:4]], cfg.model.seq_len)
    a, b, c = (SiteTrainer(cfg, torch.device("cpu")) for _ in range(3))
    for t, frontier in ((a, 20_000), (b, 20_000), (c, 0)):
        t.inner_step(*xy, frontier_tokens=frontier)
        assert t.inner_opt.param_groups[0]["lr"] == inner_lr_at(cfg, frontier)
    assert a.params_hash() == b.params_hash() != c.params_hash()
    pseudo = a.pseudo_gradient()
    a.apply_outer(pseudo, frontier_tokens=20_000)
    b.apply_outer(np.array(pseudo), frontier_tokens=20_000)
    assert a.params_hash() == b.params_hash()


def test_outer_momentum_zero_is_plain_sgd():
    cfg = load_config({"train": {"outer_momentum": 0.0, "outer_lr": 1.0}, "model": TINY_MODEL})
    t = SiteTrainer(cfg, torch.device("cpu"))
    before = t.global_params.detach().clone()
    d = torch.full_like(before, 0.5).numpy()
    t.apply_outer(d, frontier_tokens=0)
    assert torch.equal(t.global_params.detach(), before - 0.5)

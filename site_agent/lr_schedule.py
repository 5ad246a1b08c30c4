"""The learning-rate schedule, keyed to useful tokens: pure arithmetic, no torch.

Every process that steps an optimizer (a site's rank 0, its intra-site workers, the one-process
reference, the equivalence tests, the DiLoCo simulation) asks `inner_lr_at` / `outer_lr_at` for
the lr of a step at a given *frontier*: the number of useful tokens the cluster has trained on
before that step (canonical sample position x seq_len). The lr is therefore a function of the
data position alone, never of wall time, round count or membership: every recovery policy sees
the same lr at the same frontier, and a rollback takes the lr back with the frontier.

Shape (lr_schedule = "cosine"): a linear warm-up over `lr_warmup_tokens`, then a half cosine from
the peak down to `lr_floor_fraction` x peak at `lr_decay_tokens` (0: the run's
target_useful_tokens), flat at the floor afterwards. "constant" keeps the peak throughout.
Python float arithmetic on integers: every process computes the same bits.
"""

from __future__ import annotations

import math

from ground.config import RunConfig, TrainConfig


def lr_factor(frontier_tokens: int, t: TrainConfig) -> float:
    """Multiplier in (0, 1] of the peak lr for a step taken at `frontier_tokens` useful tokens."""
    if t.lr_schedule == "constant":
        return 1.0
    tok = max(0, int(frontier_tokens))
    warm = max(0, t.lr_warmup_tokens)
    if tok < warm:
        # (tok + 1): the first step (tok = 0) gets a small positive lr, not exactly zero.
        return (tok + 1) / warm
    total = t.lr_decay_tokens or t.target_useful_tokens
    floor = t.lr_floor_fraction
    if total <= warm:
        return 1.0
    progress = min(1.0, (tok - warm) / (total - warm))
    return floor + (1.0 - floor) * 0.5 * (1.0 + math.cos(math.pi * progress))


def inner_lr_at(cfg: RunConfig, frontier_tokens: int) -> float:
    """AdamW lr of an inner step (sync: of the step) taken at `frontier_tokens`."""
    return cfg.train.inner_lr * lr_factor(frontier_tokens, cfg.train)


def outer_lr_at(cfg: RunConfig, frontier_tokens: int) -> float:
    """Outer SGD lr of a round starting at `frontier_tokens`: scheduled only when
    train.outer_lr_scheduled (see bench/results/recipe_sweep.json for why the default is not)."""
    if not cfg.train.outer_lr_scheduled:
        return cfg.train.outer_lr
    return cfg.train.outer_lr * lr_factor(frontier_tokens, cfg.train)


def step_frontier_tokens(cfg: RunConfig, n_members: int, cursor_start: int, step_in_round: int,
                         cursor_end: int) -> int:
    """Useful tokens before inner step `step_in_round` of a round covering sample positions
    [cursor_start, cursor_end) with n_members sites: every member takes per_site_batch positions
    per step, so the cluster's frontier at that step is cursor_start + h * n * b (cut at the end)."""
    pos = min(cursor_start + step_in_round * n_members * cfg.train.per_site_batch, cursor_end)
    return pos * cfg.model.seq_len

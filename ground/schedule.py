"""Which canonical samples each site trains on: pure bookkeeping over integers.

The one place where tokens, samples, rounds and steps convert into each other. One rounding
rule: a count of tokens becomes samples rounded UP (a sample is trained whole, so a token
target or a fault's token trigger is reached by the first sample that covers it).

The cluster consumes `sample_order` position by position. Round r has `steps_per_round`
inner steps (1 in sync mode, H in local mode); in each step every member, taken in sorted
order, takes the next `per_site_batch` positions. A site's samples therefore depend only on
(round, step in round, its index among the members, the number of members), so any
process (a site, a reference run, the analysis) can recompute them.
"""

from __future__ import annotations

import numpy as np

from ground.config import RunConfig


def samples_for_tokens(cfg: RunConfig, tokens: int) -> int:
    """Samples (windows of seq_len tokens) needed to cover `tokens`: rounded up."""
    return -(-int(tokens) // cfg.model.seq_len)


def tokens_of_samples(cfg: RunConfig, samples: int) -> int:
    """Tokens in `samples` whole sample windows (a sample cursor as useful tokens)."""
    return int(samples) * cfg.model.seq_len


def steps_per_round(cfg: RunConfig) -> int:
    return 1 if cfg.train.mode == "sync" else cfg.train.inner_steps_h


def samples_per_round(cfg: RunConfig, n_members: int) -> int:
    return n_members * cfg.train.per_site_batch * steps_per_round(cfg)


def rounds_for_target(cfg: RunConfig, n_members: int) -> int:
    """Rounds needed until at least target_useful_tokens distinct tokens are trained on."""
    return -(-target_samples(cfg) // samples_per_round(cfg, n_members))


# ---------------------------------------------------------------------------------------------
# Cursor-based schedule: rounds resume from any (round, cursor) a membership epoch names, with
# any number of members, and the last round is cut at the target so every policy ends at the
# same samples.


def round_span(cfg: RunConfig, n_members: int, start_round: int, start_cursor: int, rnd: int,
               target: int) -> tuple[int, int]:
    """Sample positions [cursor_start, cursor_end) that round `rnd` covers (cut at target)."""
    begin = start_cursor + (rnd - start_round) * samples_per_round(cfg, n_members)
    return min(begin, target), min(begin + samples_per_round(cfg, n_members), target)


def site_positions(cfg: RunConfig, n_members: int, cursor_start: int, step_in_round: int, site_index: int,
                   cursor_end: int) -> range:
    """Positions one site trains on in one inner step of a round starting at cursor_start."""
    b = cfg.train.per_site_batch
    lo = cursor_start + step_in_round * n_members * b + site_index * b
    return range(min(lo, cursor_end), min(lo + b, cursor_end))


def ids_at(order: np.ndarray, positions: range) -> list[int]:
    n = order.size
    return [int(order[p % n]) for p in positions]


def target_samples(cfg: RunConfig) -> int:
    """The useful-sample target, rounded up to whole site batches, so a site's batch is never cut:
    in the last round each site's batch is either full or empty."""
    b = cfg.train.per_site_batch
    return -(-samples_for_tokens(cfg, cfg.train.target_useful_tokens) // b) * b


def target_tokens(cfg: RunConfig) -> int:
    """The useful-token target as the run reaches it: `target_samples` whole windows."""
    return tokens_of_samples(cfg, target_samples(cfg))

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


def site_round_layout(cfg: RunConfig, n_members: int, cursor_start: int, cursor_end: int, site_index: int,
                      steps: int) -> list[tuple[range, int]]:
    """One site's inner steps of a round: (its `site_positions`, the cluster's frontier in samples
    before the step, cursor_start + h x n x b cut at cursor_end) for h in 0..steps-1. One call per
    site and round: the simulator asks it of a thousand sites a round."""
    b = cfg.train.per_site_batch
    nb = n_members * b
    lo = cursor_start + site_index * b
    if round_is_whole(cfg, n_members, cursor_start, cursor_end, site_index, steps):
        # Every step whole (all rounds but a run's last): nothing to cut, frontiers included (a
        # step's frontier is its first position less the site's offset in the step, site_index x b).
        off = lo - cursor_start
        return [(range(f, f + b), f - off) for f in range(lo, lo + steps * nb, nb)]
    out = []
    for h in range(steps):
        first = lo + h * nb
        frontier = cursor_start + h * nb
        out.append((range(first if first < cursor_end else cursor_end, first + b if first + b < cursor_end else cursor_end),
                    frontier if frontier < cursor_end else cursor_end))
    return out


def round_is_whole(cfg: RunConfig, n_members: int, cursor_start: int, cursor_end: int, site_index: int,
                   steps: int) -> bool:
    """Whether every step of the site's `site_round_layout` is a whole batch (nothing cut at the target)."""
    b = cfg.train.per_site_batch
    nb = n_members * b
    return nb > 0 and steps > 0 and cursor_start + site_index * b + (steps - 1) * nb + b <= cursor_end


def site_round_positions(cfg: RunConfig, n_members: int, cursor_start: int, site_index: int, first: int,
                         last: int) -> list[int]:
    """The positions of steps first..last-1 of a whole round's `site_round_layout`, in order (what
    iterating those steps' ranges gives, without making the steps: the simulator's every round)."""
    b = cfg.train.per_site_batch
    nb = n_members * b
    lo = cursor_start + site_index * b
    out: list[int] = []
    for f in range(lo + first * nb, lo + last * nb, nb):
        out += range(f, f + b)
    return out


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


# ---------------------------------------------------------------------------------------------
# The carried layout: a survivor keeps the inner steps it already took in the round in flight.


def carried_steps(cfg: RunConfig, old_members: tuple[str, ...], members: tuple[str, ...], cursor_start: int,
                  cursor_end: int, target: int) -> dict[str, list[tuple[range, int]]]:
    """Each member's inner steps of a round that was in flight under `old_members` when a new epoch
    with `members` (a subset: the survivors) took it over at the same cursor: for every step, the
    positions it trains on and the cluster frontier (sample positions) its lr is taken at.

    A survivor keeps its positions of the old layout, in step order, up to the first that falls
    outside the new round [cursor_start, cursor_end); those steps keep the old layout's frontier
    too, so the steps it already took are exactly the steps this layout asks of it. The positions
    nobody kept are then dealt out in ascending order, step by step, member by member (in sorted
    order), at the new layout's frontier. Together the members cover [cursor_start, cursor_end)
    exactly once, batch by batch, so the retained set stays the canonical prefix. A pure function
    of the plan: every member computes the same layout. Local mode only (H inner steps)."""
    b, steps = cfg.train.per_site_batch, steps_per_round(cfg)
    n_old, n_new = len(old_members), len(members)
    old_end = min(cursor_start + n_old * b * steps, target)
    layout: dict[str, list[tuple[range, int]]] = {}
    claimed: set[int] = set()
    old_index = {s: i for i, s in enumerate(old_members)}  # (a dict: `tuple.index` per member is O(N^2) at scale)
    for s in members:
        seq: list[tuple[range, int]] = []
        i = old_index.get(s, -1)
        if i >= 0:
            for h in range(steps):
                lo = cursor_start + h * n_old * b + i * b
                if lo + b > cursor_end:
                    break
                seq.append((range(lo, lo + b), min(cursor_start + h * n_old * b, old_end)))
                claimed.add(lo)
        layout[s] = seq
    free = iter([lo for lo in range(cursor_start, cursor_end, b) if lo not in claimed])
    for h in range(steps):
        for s in members:
            if h < len(layout[s]):
                continue
            lo = next(free, cursor_end)
            layout[s].append((range(lo, min(lo + b, cursor_end)), min(cursor_start + h * n_new * b, cursor_end)))
    return layout


def common_prefix(done: list[tuple[tuple[int, ...], int]], wanted: list[tuple[tuple[int, ...], int]]) -> int:
    """How many leading steps taken are exactly the steps the new layout asks for (each step a
    (sample ids or positions, lr frontier) pair)."""
    p = 0
    while p < len(done) and p < len(wanted) and done[p] == wanted[p]:
        p += 1
    return p


def steps_to_keep(done: list[tuple[tuple[int, ...], int]], wanted: list[tuple[tuple[int, ...], int]],
                  copy_steps: int | None) -> tuple[int, bool]:
    """(steps to keep, whether that needs the mid-round copy) when a carried epoch asks for `wanted`
    and `done` were taken: all the matching steps when the trainer holds the state right after them
    (every step taken matches), else as many as the mid-round copy holds (`copy_steps`; None: no
    copy), if the copy lies within the matching prefix; 0 means roll back. The one rule of the site
    agent (site_agent/carry.py) and the simulator (sim/rounds.py)."""
    p = common_prefix(done, wanted)
    if p == len(done):
        return p, False
    if copy_steps is not None and 0 < copy_steps <= p:
        return copy_steps, True
    return 0, False


def kept_steps(cfg: RunConfig, n_members: int, site_index: int, cursor_start: int, cursor_end: int) -> int:
    """How many of its inner steps a member keeps (`carried_steps`) if one other member of a round
    laid out for `n_members` fails while it is in flight: where the site saves its mid-round state."""
    b, steps = cfg.train.per_site_batch, steps_per_round(cfg)
    end = min(cursor_end, cursor_start + (n_members - 1) * b * steps)
    # Step k is kept while cursor_start + k n b + site_index b + b <= end: k <= room / (n b). In closed
    # form (a thousand sites a round in the simulator); tests/unit/test_carry.py checks it against the count.
    room, nb = end - cursor_start - site_index * b - b, n_members * b
    if steps <= 0 or room < 0:
        return 0
    return steps if nb <= 0 else min(steps, room // nb + 1)

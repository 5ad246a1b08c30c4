"""The one place tokens, samples, rounds and steps convert (ground/schedule.py): one rounding rule."""

from __future__ import annotations

from ground.config import load_config
from ground.schedule import (rounds_for_target, samples_for_tokens, samples_per_round, steps_per_round, target_samples,
                             target_tokens, tokens_of_samples)


def cfg(tokens: int, mode: str = "local"):
    return load_config({"cluster": {"sites": ["a", "b", "c"]},
                        "train": {"mode": mode, "per_site_batch": 8, "inner_steps_h": 4, "target_useful_tokens": tokens}})


def test_tokens_become_samples_rounded_up_and_back_exactly() -> None:
    c = cfg(98_304)
    seq = c.model.seq_len
    assert samples_for_tokens(c, 0) == 0 and samples_for_tokens(c, 1) == 1 and samples_for_tokens(c, seq) == 1
    assert samples_for_tokens(c, seq + 1) == 2 and tokens_of_samples(c, 3) == 3 * seq
    assert all(tokens_of_samples(c, samples_for_tokens(c, t)) >= t for t in range(0, 5 * seq, 7))


def test_the_target_is_whole_site_batches_and_the_rounds_reach_it() -> None:
    for tokens in (1, 98_304, 98_305, 200_000):
        c = cfg(tokens)
        b = c.train.per_site_batch
        assert target_samples(c) % b == 0 and target_tokens(c) >= tokens
        assert target_samples(c) - samples_for_tokens(c, tokens) < b
        for n in (1, 2, 3):
            r = rounds_for_target(c, n)
            assert (r - 1) * samples_per_round(c, n) < target_samples(c) <= r * samples_per_round(c, n)


def test_a_round_is_one_step_in_sync_mode_and_h_steps_in_local_mode() -> None:
    assert steps_per_round(cfg(98_304, "sync")) == 1 and steps_per_round(cfg(98_304)) == 4
    assert samples_per_round(cfg(98_304), 3) == 3 * 8 * 4


def test_a_sites_round_layout_is_its_positions_and_the_frontier_of_every_step() -> None:
    """ground.schedule.site_round_layout (one call per site and round) against the per-step rules,
    full rounds and rounds cut at the target, for every member."""
    from ground.config import load_config
    from ground.schedule import site_positions, site_round_layout
    from site_agent.lr_schedule import step_frontier_tokens

    for b, n, steps in ((8, 3, 8), (4, 5, 3), (2, 1, 1)):
        cfg = load_config({"cluster": {"sites": [f"s{i}" for i in range(n)]},
                           "train": {"per_site_batch": b, "inner_steps_h": steps}})
        full = n * b * steps
        for cs, ce in ((0, full), (96, 96 + full), (40, 40 + full // 2 + 1), (7, 7)):
            for idx in range(n):
                got = site_round_layout(cfg, n, cs, ce, idx, steps)
                assert [r for r, _f in got] == [site_positions(cfg, n, cs, h, idx, ce) for h in range(steps)]
                assert [f * cfg.model.seq_len for _r, f in got] == [step_frontier_tokens(cfg, n, cs, h, ce)
                                                                    for h in range(steps)]


def test_a_whole_rounds_positions_are_its_layouts_ranges_in_order() -> None:
    """ground.schedule.round_is_whole and site_round_positions against site_round_layout: the
    simulator takes a whole round's positions without making its steps."""
    from ground.schedule import round_is_whole, site_round_layout, site_round_positions

    for b, n, steps in ((8, 3, 8), (4, 5, 3), (2, 1, 1)):
        c = load_config({"cluster": {"sites": [f"s{i}" for i in range(n)]},
                         "train": {"per_site_batch": b, "inner_steps_h": steps}})
        full = n * b * steps
        for cs, ce in ((0, full), (96, 96 + full), (40, 40 + full // 2 + 1), (7, 7), (0, full - 1)):
            for idx in range(n):
                layout = site_round_layout(c, n, cs, ce, idx, steps)
                whole = all(len(r) == b for r, _f in layout)
                assert round_is_whole(c, n, cs, ce, idx, steps) == whole
                if not whole:
                    continue
                for first in range(steps + 1):
                    for last in range(first, steps + 1):
                        assert site_round_positions(c, n, cs, idx, first, last) == \
                            [i for r, _f in layout[first:last] for i in r]

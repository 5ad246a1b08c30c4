"""The small run of tests/unit/test_scenario_reachability.py and tests/live/test_scenario_reachability.py:
three 12,288-token rounds."""

from __future__ import annotations


ROUND = 12_288  # 3 sites x 8 samples x 4 inner steps x 128 tokens
SMALL = {"train": {"mode": "local", "per_site_batch": 8, "inner_steps_h": 4, "target_useful_tokens": 3 * ROUND,
                   "eval_every_rounds": 3, "checkpoint_every_rounds": 2, "threads_per_site": 1, "device": "cpu"},
         "wan": {"site_link": {"up": {"latency_ms": 5}, "down": {"latency_ms": 5}}}}

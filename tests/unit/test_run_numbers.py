"""One matched frontier for `xdc compare` and the artifact (analysis/run_numbers.py). The summary
against the artifact on a real run: tests/live/test_run_numbers.py."""

from __future__ import annotations

from analysis.run_numbers import matched_frontier


def test_one_matched_frontier_for_compare_and_the_artifact() -> None:
    h = "ab" * 32
    assert matched_frontier([h, h, h]) and not matched_frontier([h, None]) and not matched_frontier([])
    assert not matched_frontier([h, "cd" * 32])
    assert matched_frontier([h, h], [h, h]) and not matched_frontier([h, h], [h, None])
    assert not matched_frontier([h, h], [h, h], proof_ok=False)

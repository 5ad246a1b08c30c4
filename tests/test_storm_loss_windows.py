"""The storm benchmark's split of lost time by fault window (bench/storm_goodput.py): pure logic."""

from __future__ import annotations

import pytest

from bench.storm_goodput import loss_windows

S = 1_000_000_000  # ns


def test_the_windows_sum_to_the_arms_lost_time_and_each_fault_gets_its_own_stall() -> None:
    # Fault-free rate: 100 tokens/s. Commits every second, 100 tokens each, except that the crash
    # at 3 s stalls progress for 2 s and the hang at 8 s for 1 s; the run ends at 13 s with 1,000.
    commits, u, t = [], 0, 1
    stalled = {4, 5, 9}
    while u < 1000:
        if t not in stalled:
            u += 100
        commits.append((t * S, u))
        t += 1
    end = commits[-1][0]
    w = loss_windows(0, end, commits, [(3 * S, "site_crash b"), (8 * S, "site_hang c")], 100.0)
    assert [x["window"] for x in w] == ["before the first fault", "site_crash b", "site_hang c"]
    assert [x["lost_s"] for x in w] == pytest.approx([0.0, 2.0, 1.0])
    assert sum(x["lost_s"] for x in w) == pytest.approx(end / S - 1000 / 100.0)  # T_storm - T_fault_free


def test_a_rollback_is_negative_progress_in_its_faults_window() -> None:
    commits = [(1 * S, 100), (2 * S, 200), (3 * S, 100), (4 * S, 200), (5 * S, 300)]  # restart rolled back 100
    w = loss_windows(0, 5 * S, commits, [(2 * S, "site_crash b")], 100.0)
    assert w[1]["progress_tokens"] == 100 and w[1]["lost_s"] == pytest.approx(2.0)
    assert sum(x["lost_s"] for x in w) == pytest.approx(5 - 3)


def test_a_fault_after_the_end_gets_an_empty_window() -> None:
    w = loss_windows(0, 2 * S, [(1 * S, 100), (2 * S, 200)], [(9 * S, "site_hang c")], 100.0)
    assert w[-1] == {"window": "site_hang c", "length_s": 0.0, "progress_tokens": 0, "lost_s": 0.0}

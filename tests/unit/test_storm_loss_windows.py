"""The storm benchmark's split of lost time by fault window (bench/storm_goodput.py): pure logic."""

from __future__ import annotations

import pytest

from bench.storm_goodput import loss_windows, time_to_reach

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
    w = loss_windows(0, end, commits, [(3 * S, "site_crash b"), (8 * S, "site_hang c")], lambda u: u / 100.0)
    assert [x["window"] for x in w] == ["before the first fault", "site_crash b", "site_hang c"]
    assert [x["lost_s"] for x in w] == pytest.approx([0.0, 2.0, 1.0])
    assert sum(x["lost_s"] for x in w) == pytest.approx(end / S - 1000 / 100.0)  # T_storm - T_fault_free


def test_a_rollback_is_negative_progress_in_its_faults_window() -> None:
    commits = [(1 * S, 100), (2 * S, 200), (3 * S, 100), (4 * S, 200), (5 * S, 300)]  # restart rolled back 100
    w = loss_windows(0, 5 * S, commits, [(2 * S, "site_crash b")], lambda u: u / 100.0)
    assert w[1]["progress_tokens"] == 100 and w[1]["lost_s"] == pytest.approx(2.0)
    assert sum(x["lost_s"] for x in w) == pytest.approx(5 - 3)


def test_a_fault_after_the_end_gets_an_empty_window() -> None:
    w = loss_windows(0, 2 * S, [(1 * S, 100), (2 * S, 200)], [(9 * S, "site_hang c")], lambda u: u / 100.0)
    assert w[-1] == {"window": "site_hang c", "length_s": 0.0, "progress_tokens": 0, "lost_s": 0.0}


def test_start_up_costs_nothing_when_the_reference_is_the_fault_free_arms_own_curve() -> None:
    """The fault-free arm starts up for 8 s, then makes 100 tokens/s; a storm arm that does exactly the
    same until a crash at 30 s and then stalls 5 s lost 0 s before the fault and 5 s in its window.
    (Against the fault-free arm's mean rate the start-up showed as loss before the first fault and was
    credited back in the fault windows.)"""
    ff = [((8 + k) * S, 100 * k) for k in range(1, 41)]  # first commit at 9 s, 4,000 tokens at 48 s
    storm = [(n, u) for n, u in ff if n <= 30 * S] + [(n + 5 * S, u) for n, u in ff if n > 30 * S]
    w = loss_windows(0, storm[-1][0], storm, [(30 * S, "site_crash b")], time_to_reach(0, ff))
    assert [x["lost_s"] for x in w] == pytest.approx([0.0, 5.0])
    mean_rate = 4000 / 48.0
    old = loss_windows(0, storm[-1][0], storm, [(30 * S, "site_crash b")], lambda u: u / mean_rate)
    assert old[0]["lost_s"] > 3.0  # the artifact this reference removes


def test_time_to_reach_inverts_the_progress_curve() -> None:
    at = time_to_reach(0, [(2 * S, 100), (3 * S, 200), (5 * S, 300)])
    assert [at(u) for u in (0, 50, 100, 150, 200, 250, 300, 999)] == pytest.approx([0, 2, 2, 2.5, 3, 4, 5, 5])

"""A run's clean exit counts every incarnation: a site that died of an error of its own (exit 70, a dead
I/O thread) and was then restarted by a chaos script is not hidden by its successor's exit 0 (issue 54);
a kill by the scenario (a negative status: the signal) is the fault, not an unclean exit."""

from __future__ import annotations

from analysis.summary import clean_exit

SITES = ["a", "b", "c"]
ALL_ZERO = {p: 0 for p in ("a", "b", "c", "coord", "store")}


def test_a_restarted_site_whose_earlier_incarnation_exited_70_is_not_a_clean_exit():
    assert not clean_exit(SITES, ALL_ZERO, {"b": [70]}, interrupted=False)


def test_a_site_killed_by_the_scenario_and_restarted_is_a_clean_exit():
    assert clean_exit(SITES, ALL_ZERO, {"b": [-9], "c": [-15, None]}, interrupted=False)
    assert clean_exit(SITES, ALL_ZERO, None, interrupted=False)


def test_the_last_incarnations_and_an_interruption_still_count():
    assert not clean_exit(SITES, {**ALL_ZERO, "coord": 1}, {}, interrupted=False)
    assert not clean_exit(SITES, ALL_ZERO, {}, interrupted=True)

"""tests/live_marking.py: which tests start something real (the classification follows the test's own
source, its fixtures and the helpers they call), and the folder guard built on it: a live test in
tests/unit, or a test file directly in tests/, is a collection error that says where it goes."""

from __future__ import annotations

from tests import live_marking_samples as samples
from tests.live_marking import is_live, misplaced


def test_a_pure_test_is_not_live() -> None:
    assert not is_live(samples.a_pure_test, [], has_integration_marker=False)


def test_a_process_started_two_helpers_down_is_live() -> None:
    assert is_live(samples.a_test_through_two_helpers, [], has_integration_marker=False)


def test_a_live_fixture_makes_its_test_live_and_the_integration_marker_does_too() -> None:
    assert is_live(samples.a_pure_test, [samples.a_fixture_that_starts_a_process], has_integration_marker=False)
    assert is_live(samples.a_pure_test, [], has_integration_marker=True)


def test_a_live_test_in_unit_is_refused_naming_it_and_tests_live() -> None:
    problem = misplaced("tests/unit/test_x.py::test_y", "unit", live=True)
    assert problem is not None and problem.startswith("tests/unit/test_x.py::test_y: ")
    assert "move it to tests/live/" in problem
    assert misplaced("tests/unit/test_x.py::test_y", "unit", live=False) is None
    assert misplaced("tests/live/test_x.py::test_y", "live", live=True) is None
    assert misplaced("tests/live/test_x.py::test_y", "live", live=False) is None  # a pure test may sit beside live ones


def test_a_test_file_directly_in_tests_is_refused_whatever_it_starts() -> None:
    for live in (False, True):
        problem = misplaced("tests/test_x.py::test_y", None, live=live)
        assert problem is not None and "tests/unit/" in problem and "tests/live/" in problem

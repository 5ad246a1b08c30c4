"""`make test-fast` deselects the tests that start something real (tests/live_marking.py): the
classification follows the test's own source, its fixtures and the helpers they call."""

from __future__ import annotations

import subprocess
from contextlib import contextmanager
from typing import Iterator

from tests.live_marking import is_live


def _starts_a_process() -> None:
    subprocess.run(["true"], check=True)


@contextmanager
def _a_wrapped_helper() -> Iterator[None]:
    _starts_a_process()
    yield


def _pure_helper(x: int) -> int:
    return x + 1


def a_pure_test() -> None:
    assert _pure_helper(1) == 2


def a_test_through_two_helpers() -> None:
    with _a_wrapped_helper():
        pass


def a_fixture_that_starts_a_process() -> None:
    _starts_a_process()


def test_a_pure_test_is_not_live() -> None:
    assert not is_live(a_pure_test, [], has_integration_marker=False)


def test_a_process_started_two_helpers_down_is_live() -> None:
    assert is_live(a_test_through_two_helpers, [], has_integration_marker=False)


def test_a_live_fixture_makes_its_test_live_and_the_integration_marker_does_too() -> None:
    assert is_live(a_pure_test, [a_fixture_that_starts_a_process], has_integration_marker=False)
    assert is_live(a_pure_test, [], has_integration_marker=True)
